//! The metrics match what happened: one scenario (acquires, a busy try, a
//! timeout, a hand-off, releases, renewals of a held lease, a lease deleted
//! behind the client's back) on a real store, with a per-thread recorder so
//! that tests running at once do not see each other's numbers.

use std::collections::HashMap;
use std::time::Duration;

use holdfast::metrics as m;
use holdfast::{Client, Error, LockKey};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// Every series seen, by name and sorted labels; histograms as their count
/// of samples. A snapshot resets every value to zero (counters, gauges and
/// histograms alike), so values are summed over snapshots (holdfast only
/// increments and decrements its gauge).
#[derive(Default)]
struct Seen {
    values: HashMap<(String, Vec<(String, String)>), f64>,
}

impl Seen {
    fn take(&mut self, snap: &Snapshotter) {
        for (key, _, _, value) in snap.snapshot().into_vec() {
            let key = key.key();
            let mut labels: Vec<_> = key.labels().map(|l| (l.key().to_owned(), l.value().to_owned())).collect();
            labels.sort();
            let slot = self.values.entry((key.name().to_owned(), labels)).or_default();
            match value {
                DebugValue::Counter(n) => *slot += n as f64,
                DebugValue::Gauge(g) => *slot += g.into_inner(),
                DebugValue::Histogram(h) => *slot += h.len() as f64,
            }
        }
    }

    /// The value of the series `name` whose labels include `labels`, summed
    /// over the series that match.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.values
            .iter()
            .filter(|((n, ls), _)| {
                n == name && labels.iter().all(|(k, v)| ls.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, v)| v)
            .sum()
    }
}

/// Runs the scenario against `url` on a current-thread runtime with a
/// recorder for this thread only, and checks every number.
pub fn scenario_counts_what_happened(url: &str, store: &'static str) {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut seen = Seen::default();
    rt.block_on(async {
        let client = Client::connect(url).await.expect("connect");
        let ttl = Duration::from_secs(2);
        // Three acquires and releases.
        for _ in 0..3 {
            let g = client.mutex("m:a").ttl(ttl).acquire_timeout(Duration::from_secs(5)).await.expect("acquire");
            g.release().await.expect("release");
        }
        // A busy try and a timeout while another guard holds the key.
        let held = client.mutex("m:b").ttl(ttl).acquire().await.expect("acquire m:b");
        seen.take(&snap);
        assert_eq!(seen.get(m::LEASES_HELD, &[("store", store), ("prefix", "m")]), 1.0);
        let other = Client::connect(url).await.expect("second client");
        assert!(other.mutex("m:b").try_acquire().await.expect("try").is_none(), "m:b should be busy");
        let timeout = other.mutex("m:b").acquire_timeout(Duration::from_millis(300)).await;
        assert!(matches!(timeout, Err(Error::Timeout { .. })), "{timeout:?}");
        held.release().await.expect("release m:b");
        // A hand-off inside one client: the waiter is woken by the release.
        let holder = client.mutex("m:e").ttl(ttl).acquire().await.expect("acquire m:e");
        let waiter = {
            let client = client.clone();
            tokio::spawn(async move { client.mutex("m:e").acquire_timeout(Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        holder.release().await.expect("release m:e");
        waiter.await.expect("waiter task").expect("waiter granted").release().await.expect("release waiter");
        // A held lease renewed several times.
        let renewed = client
            .mutex("m:c")
            .ttl(Duration::from_millis(900))
            .renew_every(Duration::from_millis(150))
            .acquire()
            .await
            .expect("acquire m:c");
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert!(!renewed.is_lost());
        renewed.release().await.expect("release m:c");
        seen.take(&snap);
        let renewals = seen.get(m::RENEW_TOTAL, &[("outcome", "renewed")]);
        assert!(renewals >= 4.0, "renewals of m:c: {renewals}");
        assert_eq!(seen.get(m::RENEW_SECONDS, &[("store", store)]), renewals, "one round trip per renewal");
        assert_eq!(seen.get(m::RENEW_LAG_SECONDS, &[("prefix", "m")]), renewals, "one lag sample per renewal");
        // A lease deleted behind the client's back: the next renewal finds it gone.
        let doomed = client
            .mutex("m:d")
            .ttl(Duration::from_millis(900))
            .renew_every(Duration::from_millis(100))
            .acquire()
            .await
            .expect("acquire m:d");
        let raw = holdfast::stores::connect(url).await.expect("raw backend");
        assert!(raw.release(&LockKey::new("m:d").expect("key"), doomed.token()).await.expect("kill"));
        tokio::time::timeout(Duration::from_secs(3), doomed.lost()).await.expect("lost() fired");
        assert!(matches!(doomed.release().await, Err(Error::Lost { .. })));
    });
    drop(rt);
    seen.take(&snap);
    let s = |rest: &[(&'static str, &'static str)]| {
        let mut v = vec![("store", store), ("prefix", "m")];
        v.extend_from_slice(rest);
        v
    };
    let acq = |outcome| seen.get(m::ACQUIRE_TOTAL, &s(&[("outcome", outcome)]));
    // m:a x3, m:b, m:e holder and waiter, m:c, m:d.
    assert_eq!((acq("granted"), acq("busy"), acq("timeout"), acq("error")), (8.0, 1.0, 1.0, 0.0));
    for outcome in ["granted", "busy", "timeout", "error"] {
        assert_eq!(seen.get(m::ACQUIRE_SECONDS, &s(&[("outcome", outcome)])), acq(outcome), "{outcome}");
    }
    let attempts = seen.get(m::ACQUIRE_ATTEMPTS_TOTAL, &s(&[]));
    // The woken waiter of m:e attempts again, unless its store hands it the
    // key in the holder's release (Redis: both are tasks of one client).
    let least = if store == "redis" { 10.0 } else { 11.0 };
    assert!(attempts >= least, "attempts: {attempts}");
    // The timed-out waiter and the woken one found the key busy; only the
    // woken one was handed the key.
    assert_eq!(seen.get(m::WAIT_SECONDS, &s(&[])), 2.0);
    // A key handed over in the holder's release (Redis, both tasks of one
    // client) has no wake-up to measure a hand-off from.
    let handoffs = if store == "redis" { 0.0 } else { 1.0 };
    assert_eq!(seen.get(m::HANDOFF_SECONDS, &s(&[])), handoffs);
    let rel = |outcome| seen.get(m::RELEASE_TOTAL, &s(&[("outcome", outcome)]));
    assert_eq!((rel("released"), rel("not_held"), rel("error")), (7.0, 1.0, 0.0));
    assert_eq!(seen.get(m::RENEW_TOTAL, &s(&[("outcome", "gone")])), 1.0);
    assert_eq!(seen.get(m::RENEW_TOTAL, &s(&[("outcome", "error")])), 0.0);
    let lost = |cause| seen.get(m::LOST_TOTAL, &s(&[("cause", cause)]));
    assert_eq!((lost("renewal"), lost("release"), lost("deadline"), lost("session")), (1.0, 0.0, 0.0, 0.0));
    assert_eq!(seen.get(m::LEASES_HELD, &s(&[])), 0.0);
    assert_eq!(seen.get(m::STORE_ERRORS_TOTAL, &[("store", store)]), 0.0);
    // Never the key itself as a label.
    assert!(seen.values.keys().all(|(_, ls)| ls.iter().all(|(_, v)| !v.starts_with("m:"))));
}

/// A lease whose renewal is off runs out while its guard lives: lost by
/// deadline, once; a guard released in time counts no loss, even when its
/// `lost()` future is awaited after the deadline.
pub fn deadline_losses_count_once(url: &str, store: &'static str) {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let client = Client::connect(url).await.expect("connect");
        let ttl = Duration::from_millis(300);
        let g = client.mutex("dl:a").ttl(ttl).no_renew().acquire().await.expect("acquire");
        g.lost().await;
        assert!(g.is_lost());
        let _ = g.release().await;
        let h = client.mutex("dl:b").ttl(ttl).no_renew().acquire().await.expect("acquire");
        let after = h.lost();
        h.release().await.expect("release in time");
        after.await;
    });
    let mut seen = Seen::default();
    seen.take(&snap);
    let lost = |cause| seen.get(m::LOST_TOTAL, &[("store", store), ("prefix", "dl"), ("cause", cause)]);
    assert_eq!((lost("deadline"), lost("release"), lost("renewal")), (1.0, 0.0, 0.0));
}

/// No recorder at all: every handle is a no-op, nothing fails.
pub fn no_recorder_is_fine(url: &str) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let client = Client::connect(url).await.expect("connect");
        let g = client.mutex("none:a").acquire().await.expect("acquire");
        g.release().await.expect("release");
    });
}
