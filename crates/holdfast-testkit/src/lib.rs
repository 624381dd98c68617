//! Real servers and the conformance suite.
