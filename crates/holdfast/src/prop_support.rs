//! What every property test of the crate shares: its configuration and the
//! strategies of the lease model.

use proptest::prelude::*;

use crate::backend::LeaseMode;

/// 10,000 cases per property. Found cases are kept as regular tests, not in
/// regression files.
pub(crate) fn config() -> ProptestConfig {
    ProptestConfig { failure_persistence: None, ..ProptestConfig::with_cases(10_000) }
}

/// Any lease mode: exclusive, writer, or a share of any weight and limit.
#[cfg_attr(not(any(feature = "zookeeper", feature = "etcd")), allow(dead_code))]
pub(crate) fn any_mode() -> impl Strategy<Value = LeaseMode> {
    prop_oneof![
        Just(LeaseMode::Exclusive),
        Just(LeaseMode::Writer),
        (1u32.., 1u32..).prop_map(|(weight, limit)| LeaseMode::Shared { weight, limit }),
    ]
}
