//! The lease model's property-test strategies, for the stores' property
//! tests.

use proptest::prelude::*;

use crate::backend::LeaseMode;

/// Any lease mode: exclusive, writer, or a share of any weight and limit.
#[cfg_attr(not(any(feature = "zookeeper", feature = "etcd")), allow(dead_code))]
pub(crate) fn any_mode() -> impl Strategy<Value = LeaseMode> {
    prop_oneof![
        Just(LeaseMode::Exclusive),
        Just(LeaseMode::Writer),
        (1u32.., 1u32..).prop_map(|(weight, limit)| LeaseMode::Shared { weight, limit }),
    ]
}
