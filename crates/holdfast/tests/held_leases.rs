//! What the session-row tests of every SQL store share: a client holding
//! many mutexes at once.

use std::time::Duration;

/// Takes `n` mutexes `{prefix}/0` .. `{prefix}/{n-1}` with `ttl` on `client`,
/// one after another, and returns their guards.
pub async fn hold_mutexes(
    client: &holdfast::Client,
    prefix: &str,
    n: usize,
    ttl: Duration,
) -> Vec<holdfast::MutexGuard> {
    let mut guards = Vec::with_capacity(n);
    for i in 0..n {
        let lock = client.mutex_with_options(format!("{prefix}/{i}"), holdfast::LockOptions::with_ttl(ttl));
        guards.push(lock.acquire().await.expect("acquire"));
    }
    guards
}
