//! `Election::lead`, Curator's `LeaderSelector` with auto-requeue: on a real
//! SQLite file and a real Redis server, work of two candidates never
//! overlaps, work is dropped when leadership is lost, and an error from the
//! work ends `lead` and frees the election.
#![cfg(all(feature = "sqlite", feature = "redis"))]

use std::sync::Arc;
use std::sync::Mutex as StdMutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use holdfast::{Client, ClientOptions, Error};
use holdfast_testkit::servers::redis::RedisServer;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

async fn client(url: &str, label: &str) -> Client {
    Client::connect_with(url, ClientOptions::default().with_label(label)).await.expect("connect")
}

/// What the candidates' work saw.
#[derive(Default)]
struct Witness {
    active: AtomicU64,
    overlaps: AtomicU64,
    /// (candidate, term) in the order the work started.
    terms: StdMutex<Vec<(usize, u64)>>,
}

async fn two_candidates_take_turns(url: &str, both_must_lead: bool) {
    let witness = Arc::new(Witness::default());
    let name = format!("selector-{}", std::process::id());
    let mut tasks = Vec::new();
    for candidate in 0..2 {
        let client = client(url, &format!("c{candidate}")).await;
        let witness = witness.clone();
        let name = name.clone();
        tasks.push(tokio::spawn(async move {
            let election = client.election(&name).ttl(Duration::from_secs(5));
            election
                .lead(format!("c{candidate}"), |term| {
                    let witness = witness.clone();
                    async move {
                        if witness.active.fetch_add(1, Ordering::SeqCst) != 0 {
                            witness.overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        witness.terms.lock().unwrap().push((candidate, term));
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        witness.active.fetch_sub(1, Ordering::SeqCst);
                        Ok(())
                    }
                })
                .await
        }));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        let _ = task.await;
    }
    let terms = witness.terms.lock().unwrap().clone();
    assert_eq!(witness.overlaps.load(Ordering::SeqCst), 0, "two candidates' work overlapped: {terms:?}");
    assert!(terms.len() >= 6, "leadership was not taken again after each resignation: {terms:?}");
    assert!(terms.windows(2).all(|w| w[0].1 < w[1].1), "terms did not increase: {terms:?}");
    if both_must_lead {
        for candidate in 0..2 {
            assert!(terms.iter().any(|(c, _)| *c == candidate), "candidate {candidate} never led: {terms:?}");
        }
    }
}

/// Sets its flag when dropped: the work future was dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

async fn lost_leadership_drops_the_work_and_campaigns_again(url: &str) {
    let name = format!("selector-lost-{}", std::process::id());
    let leader = client(url, "leader").await;
    let admin = client(url, "admin").await;
    let dropped = Arc::new(AtomicBool::new(false));
    let (terms_tx, mut terms) = tokio::sync::mpsc::unbounded_channel();
    let lead = {
        let (name, dropped) = (name.clone(), dropped.clone());
        tokio::spawn(async move {
            leader
                .election(&name)
                // Renewed every second: the loss is seen at the next renewal.
                .ttl(Duration::from_secs(3))
                .lead("leader", |term| {
                    let flag = DropFlag(dropped.clone());
                    let _ = terms_tx.send(term);
                    async move {
                        let _flag = flag;
                        std::future::pending::<()>().await;
                        Ok(())
                    }
                })
                .await
        })
    };
    let within = Duration::from_secs(10);
    let first = tokio::time::timeout(within, terms.recv()).await.expect("led").expect("term");
    assert!(!dropped.load(Ordering::SeqCst));
    // Another party takes the grant away: the work must stop, then lead again.
    admin.force_release(&name).await.expect("force release");
    let second = tokio::time::timeout(within, terms.recv()).await.expect("led again after the loss").expect("term");
    assert!(dropped.load(Ordering::SeqCst), "the work of a lost term was not dropped");
    assert!(second > first, "term {second} after {first}");
    lead.abort();
    let _ = lead.await;
}

async fn an_error_from_the_work_ends_lead_and_frees_the_election(url: &str) {
    let name = format!("selector-err-{}", std::process::id());
    let leader = client(url, "leader").await;
    let election = leader.election(&name).ttl(Duration::from_secs(30));
    let outcome = tokio::time::timeout(
        Duration::from_secs(10),
        election.lead("leader", |_| async { Err(Error::invalid("work", "the leader's work failed")) }),
    )
    .await
    .expect("lead returned");
    assert!(matches!(outcome, Err(Error::InvalidInput { .. })), "{outcome:?}");
    let other = client(url, "other").await;
    let free = other.mutex(&name).try_acquire().await.expect("try_acquire");
    assert!(free.is_some(), "the election was not freed when lead returned its error");
}

async fn every_case(url: &str, fair: bool) {
    two_candidates_take_turns(url, fair).await;
    lost_leadership_drops_the_work_and_campaigns_again(url).await;
    an_error_from_the_work_ends_lead_and_frees_the_election(url).await;
}

#[test]
fn lead_on_sqlite() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    rt().block_on(every_case(&url, false));
}

#[test]
fn lead_on_redis_fair() {
    let server = RedisServer::start();
    let url = format!("{}?fair=default", server.url());
    rt().block_on(every_case(&url, true));
}
