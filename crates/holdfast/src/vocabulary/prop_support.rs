//! What every property test of the crate shares: its configuration. The
//! lease model's strategies are in `backend::prop_modes`.

use proptest::prelude::*;

/// 10,000 cases per property. Found cases are kept as regular tests, not in
/// regression files.
pub(crate) fn config() -> ProptestConfig {
    ProptestConfig { failure_persistence: None, ..ProptestConfig::with_cases(10_000) }
}
