//! `Election::observe` fed by the store's own watch (etcd, ZooKeeper):
//! terms far shorter than the observer's polling period are all seen, and
//! a watch whose connection was cut resumes without losing a term, or says
//! that it may have (an error item) before the leader of that moment.
#![cfg(any(feature = "etcd", feature = "zookeeper"))]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use holdfast::{Client, ClientOptions, Leadership};
use holdfast_testkit::faults::FaultProxy;

/// Far longer than the whole run of short terms: a polling observer reads
/// once at the start and then not again before the test ends.
const POLL: Duration = Duration::from_secs(2);
const SHORT_TERMS: usize = 12;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

async fn client(url: &str, label: &str) -> Client {
    Client::connect_with(url, ClientOptions::default().with_label(label)).await.expect("connect")
}

/// What an observer yielded: a leader's term, or an error's text.
type Seen = Arc<StdMutex<Vec<Result<u64, String>>>>;

/// Observes `name` through `url` on a task of its own.
async fn observe(url: &str, name: &str) -> (Seen, tokio::task::JoinHandle<()>) {
    let election = client(url, "observer").await.election(name).observe_every(POLL);
    let seen: Seen = Arc::default();
    let out = seen.clone();
    let task = tokio::spawn(async move {
        let mut leaders = std::pin::pin!(election.observe());
        while let Some(item) = leaders.next().await {
            out.lock().unwrap().push(item.map(|l| l.term).map_err(|e| e.to_string()));
        }
    });
    (seen, task)
}

/// Waits until the observer yielded `term`; panics after 10 s.
async fn until_seen(seen: &Seen, term: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !seen.lock().unwrap().contains(&Ok(term)) {
        assert!(Instant::now() < deadline, "term {term} never observed: {:?}", seen.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Leads, and returns once the observer has seen it: the watch is up.
async fn first_term(candidate: &Client, name: &str, seen: &Seen) -> u64 {
    let lead = candidate.election(name).campaign("first").await.expect("campaign");
    let term = lead.term();
    until_seen(seen, term).await;
    lead.resign().await.expect("resign");
    term
}

/// `SHORT_TERMS` terms of a few milliseconds each, alternating between
/// two candidates; their terms.
async fn short_terms(candidates: &[Client; 2], name: &str) -> Vec<u64> {
    let mut terms = Vec::new();
    for i in 0..SHORT_TERMS {
        let lead = candidates[i % 2].election(name).campaign(format!("short-{i}")).await.expect("campaign");
        terms.push(lead.term());
        tokio::time::sleep(Duration::from_millis(3)).await;
        lead.resign().await.expect("resign");
    }
    terms
}

/// Every short term is observed, once, in order, with no error between.
async fn every_short_term_is_seen(url: &str) {
    let name = format!("observe-short-{}", holdfast::OwnerToken::random().to_hex());
    let (seen, task) = observe(url, &name).await;
    let candidates = [client(url, "c0").await, client(url, "c1").await];
    let mut expected = vec![first_term(&candidates[0], &name, &seen).await];
    expected.extend(short_terms(&candidates, &name).await);
    until_seen(&seen, *expected.last().unwrap()).await;
    task.abort();
    let seen: Vec<_> = seen.lock().unwrap().clone();
    assert_eq!(seen, expected.into_iter().map(Ok).collect::<Vec<_>>(), "the observer missed a term");
}

/// The address a `scheme://host:port` URL names.
fn addr_of(url: &str) -> SocketAddr {
    url.split("://").nth(1).and_then(|h| h.split([',', '/', '?']).next()).unwrap().parse().expect("addr")
}

/// The observer's connection is cut and refused while short terms come
/// and go; `meanwhile` runs before it is let through again, while one
/// candidate leads. Returns what the observer saw, the terms, and the
/// term of the leader at the reconnection.
async fn terms_while_cut<F, Fut>(url: &str, meanwhile: F) -> (Vec<Result<u64, String>>, Vec<u64>, u64)
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let name = format!("observe-cut-{}", holdfast::OwnerToken::random().to_hex());
    let proxy = FaultProxy::start(addr_of(url));
    let through = url.replacen(&addr_of(url).to_string(), &proxy.addr().to_string(), 1);
    let (seen, task) = observe(&through, &name).await;
    let candidates = [client(url, "c0").await, client(url, "c1").await];
    let mut terms = vec![first_term(&candidates[0], &name, &seen).await];
    proxy.refuse();
    proxy.cut();
    terms.extend(short_terms(&candidates, &name).await);
    let holding: Leadership = candidates[1].election(&name).campaign("holding").await.expect("campaign");
    meanwhile().await;
    proxy.forward();
    until_seen(&seen, holding.term()).await;
    task.abort();
    let seen: Vec<_> = seen.lock().unwrap().clone();
    (seen, terms, holding.term())
}

#[cfg(feature = "etcd")]
mod etcd {
    use holdfast_testkit::servers::etcd::EtcdCluster;

    use super::*;

    #[test]
    fn election_observer_sees_every_short_term() {
        let server = EtcdCluster::start();
        rt().block_on(every_short_term_is_seen(&server.url()));
    }

    /// A cut watch stream resumes from the last revision it saw: the terms
    /// that came and went while it was cut are all seen, without an error.
    #[test]
    fn election_observer_resumes_after_a_cut_without_losing_a_term() {
        let server = EtcdCluster::start();
        rt().block_on(async {
            let (seen, mut terms, holding) = terms_while_cut(&server.url(), || async {}).await;
            terms.push(holding);
            assert_eq!(seen, terms.into_iter().map(Ok).collect::<Vec<_>>(), "a term lost across the cut");
        });
    }

    /// The history a cut watch needed was compacted meanwhile: the observer
    /// says so (an error item) and goes on from a fresh read, which sees
    /// the leader of that moment.
    #[test]
    fn election_observer_after_compaction_reports_the_gap_and_the_leader() {
        let server = EtcdCluster::start();
        let url = server.url();
        rt().block_on(async {
            let compact = || async {
                let host = format!("http://{}", addr_of(&url));
                let mut raw = etcd_client::Client::connect([host], None).await.expect("raw client");
                let revision = raw.get("x", None).await.expect("get").header().expect("header").revision();
                raw.compact(revision, None).await.expect("compact");
            };
            let (seen, terms, holding) = terms_while_cut(&url, compact).await;
            assert_eq!(seen.first(), Some(&Ok(terms[0])), "{seen:?}");
            assert_eq!(seen.last(), Some(&Ok(holding)), "{seen:?}");
            let gap = seen.iter().position(|s| s.as_ref().is_err_and(|e| e.contains("compacted")));
            assert!(gap.is_some_and(|at| at < seen.len() - 1), "no error said terms may be missed: {seen:?}");
            let leaders: Vec<u64> = seen.iter().filter_map(|s| s.as_ref().ok().copied()).collect();
            assert!(leaders.windows(2).all(|w| w[0] < w[1]), "terms out of order: {seen:?}");
        });
    }
}

#[cfg(feature = "zookeeper")]
mod zookeeper {
    use holdfast_testkit::servers::zookeeper::ZkServer;

    use super::*;

    #[test]
    fn election_observer_sees_every_short_term() {
        let server = ZkServer::start();
        rt().block_on(every_short_term_is_seen(&server.url()));
    }

    /// ZooKeeper may drop a persistent watch's events across a
    /// disconnection: the observer lists the queue again and, the leader
    /// it knew being gone, says that terms may have been missed before it
    /// yields the leader of that moment.
    #[test]
    fn election_observer_after_a_cut_reports_the_gap_and_the_leader() {
        let server = ZkServer::start();
        rt().block_on(async {
            let (seen, terms, holding) = terms_while_cut(&server.url(), || async {}).await;
            assert_eq!(seen.first(), Some(&Ok(terms[0])), "{seen:?}");
            assert_eq!(seen.last(), Some(&Ok(holding)), "{seen:?}");
            assert!(seen[seen.len() - 2].is_err(), "no error said terms may be missed: {seen:?}");
            let leaders: Vec<u64> = seen.iter().filter_map(|s| s.as_ref().ok().copied()).collect();
            assert!(leaders.windows(2).all(|w| w[0] < w[1]), "terms out of order: {seen:?}");
        });
    }

    /// Every join writes the lock parent's (empty) data to learn its child
    /// count; the observer's recursive watch hears that write and does not
    /// list the queue for it: it reads each new leader once, no more.
    #[test]
    fn election_observer_does_not_list_the_queue_for_each_join() {
        let server = ZkServer::start();
        let received = || {
            holdfast_testkit::servers::zookeeper::requests_received(server.client_port(0)).expect("srvr's Received:")
        };
        rt().block_on(async {
            let name = "observe-joins";
            let (seen, task) = observe(&server.url(), name).await;
            let candidate = client(&server.url(), "candidate").await;
            first_term(&candidate, name, &seen).await;
            const TERMS: u64 = 30;
            let before = received();
            for i in 0..TERMS {
                let lead = candidate.election(name).campaign(format!("term-{i}")).await.expect("campaign");
                until_seen(&seen, lead.term()).await;
                lead.resign().await.expect("resign");
            }
            let per_term = (received() - before) as f64 / TERMS as f64;
            assert!(seen.lock().unwrap().iter().all(Result::is_ok), "{:?}", seen.lock().unwrap());
            // The candidate's join and delete, the observer's read of the
            // new leader: 3; a listing for each join would make it 4.
            assert!(per_term < 3.5, "{per_term:.2} requests per term");
            task.abort();
        });
    }
}
