//! C16, election safety: at most one leader at a time, terms strictly
//! increasing, `leader()` showing the leader's value and term, `proclaim`
//! changing the value without a new term, and `observe()` seeing each term
//! once, in order.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::StreamExt;
use holdfast::Error;

use super::{Store, client, fresh_key};

/// C16: three candidates on three clients campaign in turn while an
/// observer on a fourth watches.
pub async fn c16_election_safety(store: &Store) {
    let name = fresh_key("c16");
    let watcher = client(store, "c16-observer").await;
    let observed = Arc::new(std::sync::Mutex::new(Vec::new()));
    let observer = {
        let (election, observed) = (watcher.election(&name).observe_every(Duration::from_millis(10)), observed.clone());
        tokio::spawn(async move {
            let mut leaders = std::pin::pin!(election.observe());
            while let Some(leader) = leaders.next().await {
                observed.lock().expect("observed").push(leader.expect("observe"));
            }
        })
    };
    let leading = Arc::new(AtomicU32::new(0));
    let terms = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut candidates = Vec::new();
    for c in 0..3u32 {
        let cl = client(store, &format!("c16-{c}")).await;
        let (name, leading, terms) = (name.clone(), leading.clone(), terms.clone());
        candidates.push(tokio::spawn(async move {
            let election = cl.election(&name).ttl(Duration::from_secs(10));
            for round in 0..3u32 {
                let value = format!("candidate-{c}-{round}");
                let mut me = election.campaign(value.clone()).await.expect("campaign");
                assert_eq!(leading.fetch_add(1, Ordering::SeqCst), 0, "two leaders at once");
                terms.lock().expect("terms").push(me.term());
                let seen = election.leader().await.expect("leader").expect("a leader while leading");
                assert_eq!((seen.value.as_str(), seen.term), (value.as_str(), me.term()), "leader() disagrees");
                tokio::time::sleep(Duration::from_millis(150)).await;
                match me.proclaim(format!("{value}-proclaimed")).await {
                    Ok(()) => {
                        let seen = election.leader().await.expect("leader").expect("still leading");
                        assert_eq!(seen.term, me.term(), "proclaim started a new term");
                        assert_eq!(seen.value, format!("{value}-proclaimed"));
                    }
                    // Stores that cannot relabel a grant say so; leadership stays.
                    Err(Error::Unsupported { .. }) => {}
                    Err(e) => panic!("proclaim: {e}"),
                }
                assert!(!me.is_lost());
                leading.fetch_sub(1, Ordering::SeqCst);
                me.resign().await.expect("resign");
            }
        }));
    }
    for c in candidates {
        tokio::time::timeout(Duration::from_secs(120), c).await.expect("candidates stuck").expect("candidate");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    observer.abort();
    let terms = terms.lock().expect("terms").clone();
    assert_eq!(terms.len(), 9);
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "terms not strictly increasing in grant order: {terms:?}");
    let observed: Vec<u64> = observed.lock().expect("observed").iter().map(|l| l.term).collect();
    assert!(observed.windows(2).all(|w| w[0] < w[1]), "a term observed twice or out of order: {observed:?}");
    // Every term lasted over 150 ms, fifteen reads of the observer.
    assert_eq!(observed, terms, "the observer missed a term");
    assert!(watcher.election(&name).leader().await.expect("leader").is_none(), "a leader after all resigned");
}
