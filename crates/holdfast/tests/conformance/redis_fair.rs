//! Redis with every lock fair (`?fair=default`): the same suite through the
//! queue and hand-off scripts.

use holdfast_testkit::conformance::Store;

fn start() -> Store {
    super::redis::start_with("fair=default")
}

holdfast_testkit::conformance_suite!(start);
