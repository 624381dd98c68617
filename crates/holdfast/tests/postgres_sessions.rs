//! PostgreSQL mutex leases that live with their client's session row (issue
//! 33 item 4; `holdfast-models` model 10, `pg_session`): renewal writes one
//! row per client and TTL, and each rule the model found necessary under
//! `READ COMMITTED` holds on a real server.
#![cfg(feature = "postgres")]

use std::time::{Duration, Instant};

use holdfast::backend::{AcquireRequest, Backend, LeaseMode, RenewRequest};
use holdfast::{LockKey, OwnerToken};
use holdfast_testkit::servers::postgres::PostgresServer;

use crate::postgres_common::psql;

async fn store(server: &PostgresServer) -> std::sync::Arc<dyn Backend> {
    holdfast::stores::connect(&server.url()).await.expect("raw store connection")
}

fn request(key: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(LockKey::new(key).expect("key"), OwnerToken::random(), ttl)
}

fn renewal(req: &AcquireRequest) -> RenewRequest {
    RenewRequest { key: req.key.clone(), token: req.token, ttl: req.ttl }
}

/// Renewal of many leases extends one session row and writes no lease row
/// (the rows keep the transaction id that wrote them), and a client of an
/// earlier version, which reads a row's own `expires_at`, sees them held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renewal_writes_the_session_row_not_the_lease_rows() {
    let server = PostgresServer::start();
    let client = holdfast::Client::connect(&server.url()).await.expect("client");
    let ttl = Duration::from_millis(900);
    let guards = crate::held_leases::hold_mutexes(&client, "many", 300, ttl).await;
    let rows = "SELECT string_agg(xmin::text, ',' ORDER BY key) FROM holdfast_leases WHERE key LIKE 'many/%'";
    let before = psql(&server, rows);
    let session_before = psql(&server, "SELECT expires_at FROM holdfast_leases_sess");
    tokio::time::sleep(ttl * 3).await;
    for g in &guards {
        assert!(!g.is_lost(), "a lease was lost while its session was renewed");
    }
    assert_eq!(psql(&server, rows), before, "renewal wrote lease rows");
    assert_eq!(psql(&server, "SELECT count(*) FROM holdfast_leases_sess"), "1", "one session per client and TTL");
    assert_ne!(psql(&server, "SELECT expires_at FROM holdfast_leases_sess"), session_before, "the session moved");
    let old_view = "SELECT count(*) FROM holdfast_leases WHERE key LIKE 'many/%' AND expires_at > clock_timestamp()";
    assert_eq!(psql(&server, old_view), "300", "a client reading the row's own expiry sees every lease held");
    for g in guards {
        g.release().await.expect("release");
    }
}

/// A takeover of a row whose session lapsed waits for a renewal of that
/// session in flight, re-checks it and takes nothing (model 10,
/// `SnapshotTakeover`): here the renewal is a transaction that extends the
/// session row and commits 2 s later.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_takeover_waits_for_a_renewal_in_flight_and_takes_nothing() {
    let server = PostgresServer::start();
    let (a, b) = (store(&server).await, store(&server).await);
    let held = request("inflight", Duration::from_millis(800));
    a.try_acquire(&held).await.expect("acquire").expect("free");
    let port = server.port();
    let in_flight = std::thread::spawn(move || {
        std::process::Command::new("psql")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres", "-d", "postgres", "-X", "-c"])
            .arg(
                "BEGIN; UPDATE holdfast_leases_sess SET expires_at = clock_timestamp() + interval '30 seconds';
                 SELECT pg_sleep(2); COMMIT;",
            )
            .output()
            .expect("psql")
    });
    // The committed session row lapses while the renewal waits to commit.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let started = Instant::now();
    let taken = b.try_acquire(&request("inflight", Duration::from_secs(5))).await.expect("try");
    let waited = started.elapsed();
    assert!(in_flight.join().expect("psql").status.success());
    assert!(taken.is_none(), "the key was taken from a session a renewal in flight extended");
    assert!(waited > Duration::from_millis(300), "the takeover did not wait for the renewal: {waited:?}");
    assert_eq!(a.renew(&[renewal(&held)]).await.expect("renew"), vec![true], "the holder keeps its lease");
}

/// A forced release counts the removal in the holder's session row, and the
/// holder's next renewal reads its rows and drops the lease (model 9,
/// `ForceWithoutCount`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forced_release_is_heard_by_the_holders_next_renewal() {
    let server = PostgresServer::start();
    let (a, admin) = (store(&server).await, store(&server).await);
    let (kept, freed) =
        (request("force/kept", Duration::from_secs(30)), request("force/freed", Duration::from_secs(30)));
    a.try_acquire(&kept).await.expect("acquire").expect("free");
    a.try_acquire(&freed).await.expect("acquire").expect("free");
    admin.force_release(&freed.key).await.expect("force");
    let renewed = a.renew(&[renewal(&kept), renewal(&freed)]).await.expect("renew");
    assert_eq!(renewed, vec![true, false], "the freed lease was renewed");
}

/// A release by another client that knows the token counts the removal in
/// the holder's session row (model 9's rule for any foreign removal).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_by_another_client_is_heard_by_the_holder() {
    let server = PostgresServer::start();
    let (a, other) = (store(&server).await, store(&server).await);
    let held = request("foreign", Duration::from_secs(30));
    a.try_acquire(&held).await.expect("acquire").expect("free");
    assert!(other.release(&held.key, held.token).await.expect("release"));
    assert_eq!(a.renew(&[renewal(&held)]).await.expect("renew"), vec![false]);
}

/// A lease of a lapsed session stays lost after the client's next grant
/// starts a new session (model 9, `NoIncarnation`), and the key is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_of_a_lapsed_session_stays_lost_beside_a_new_session() {
    let server = PostgresServer::start();
    let (a, b) = (store(&server).await, store(&server).await);
    // A TTL the new session outlives until its renewal even on a loaded
    // machine (300 ms once lapsed before it: [false, false]).
    let ttl = Duration::from_millis(1_000);
    let old = request("lapsed/old", ttl);
    a.try_acquire(&old).await.expect("acquire").expect("free");
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    let new = request("lapsed/new", ttl);
    a.try_acquire(&new).await.expect("acquire").expect("free");
    assert_eq!(a.renew(&[renewal(&old), renewal(&new)]).await.expect("renew"), vec![false, true]);
    assert_eq!(psql(&server, "SELECT count(*) FROM holdfast_leases_sess"), "2", "a new session, not the old extended");
    assert!(b.try_acquire(&request("lapsed/old", Duration::from_secs(5))).await.expect("try").is_some());
}

/// A crashed client's rows are released by a later client's sweep once its
/// session lapsed over a minute ago (the fence stays with the key), and
/// lapsed sessions without rows are deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crashed_clients_rows_and_lapsed_sessions_are_swept() {
    let server = PostgresServer::start();
    let crashed = store(&server).await;
    let held = request("crashed/k", Duration::from_secs(30));
    let fence = crashed.try_acquire(&held).await.expect("acquire").expect("free").fence;
    let gone = request("crashed/gone", Duration::from_secs(60));
    crashed.try_acquire(&gone).await.expect("acquire").expect("free");
    assert!(crashed.release(&gone.key, gone.token).await.expect("release"));
    drop(crashed);
    // Both sessions (TTL 30 s, with a row; TTL 60 s, without) lapsed long ago.
    psql(&server, "UPDATE holdfast_leases_sess SET expires_at = clock_timestamp() - interval '2 minutes'");
    let sweeper = store(&server).await;
    let other = request("crashed/other", Duration::from_secs(5));
    sweeper.try_acquire(&other).await.expect("acquire").expect("free");
    // A client's first release sweeps.
    assert!(sweeper.release(&other.key, other.token).await.expect("release"));
    assert_eq!(
        psql(
            &server,
            "SELECT count(*) FROM holdfast_leases WHERE (session IS NOT NULL AND token <> '\\x') OR key = 'crashed/k'"
        ),
        "0",
        "the crashed client's row was neither released nor swept"
    );
    assert_eq!(
        psql(&server, "SELECT count(*) FROM holdfast_leases_sess WHERE expires_at < clock_timestamp()"),
        "0",
        "lapsed sessions without rows were kept"
    );
    let next = sweeper.try_acquire(&request("crashed/k", Duration::from_secs(5))).await.expect("try").expect("free");
    assert!(next.fence > fence, "the swept key's fence went back: {} after {fence}", next.fence);
}

/// A lease row deleted by hand (an operator, a restore) is counted in its
/// session by the delete trigger, and its holder's next renewal drops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_row_deleted_by_hand_is_heard_by_the_holder() {
    let server = PostgresServer::start();
    let a = store(&server).await;
    let (kept, deleted) =
        (request("hand/kept", Duration::from_secs(30)), request("hand/gone", Duration::from_secs(30)));
    a.try_acquire(&kept).await.expect("acquire").expect("free");
    a.try_acquire(&deleted).await.expect("acquire").expect("free");
    psql(&server, "DELETE FROM holdfast_leases WHERE key = 'hand/gone'");
    assert_eq!(a.renew(&[renewal(&kept), renewal(&deleted)]).await.expect("renew"), vec![true, false]);
}

/// An acquire its caller gave up on after the statement committed (the
/// client never read the answer, so its book does not know the lease) is
/// cleaned up by a release that counts no removal in the client's own
/// session: no spurious read of every row of the session follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_after_a_given_up_acquire_counts_no_removal() {
    let server = PostgresServer::start();
    let a = store(&server).await;
    // The client's session exists (its current one) before the given-up acquire.
    a.try_acquire(&request("given-up/first", Duration::from_secs(30))).await.expect("acquire").expect("free");
    let mut given_up = None;
    for n in 0..400u64 {
        let req = request(&format!("given-up/{n}"), Duration::from_secs(30));
        let wait = Duration::from_micros(100 + 25 * n);
        if tokio::time::timeout(wait, a.try_acquire(&req)).await.is_err() {
            // Dropped: did its statement commit anyway?
            tokio::time::sleep(Duration::from_millis(50)).await;
            let token: String = req.token.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
            let sql = format!("SELECT count(*) FROM holdfast_leases WHERE token = '\\x{token}'::bytea");
            if psql(&server, &sql) == "1" {
                given_up = Some(req);
                break;
            }
        }
    }
    let req = given_up.expect("no acquire was given up after its statement committed");
    assert!(a.release(&req.key, req.token).await.expect("release"), "the given-up grant was held");
    assert_eq!(psql(&server, "SELECT sum(removed) FROM holdfast_leases_sess"), "0", "a removal was counted");
}

/// A released row keeps the session it was held under, so that a key taken
/// and freed again and again by one session changes no indexed column (the
/// `session` index's): every grant and release is a HOT update, which adds
/// no index entry. Setting the session to NULL at release made each of them
/// a non-HOT update, three times the server time of the uncontended cycle.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sessions_grants_and_releases_of_a_key_are_hot_updates() {
    let server = PostgresServer::start();
    let a = store(&server).await;
    let cycles = 40;
    for _ in 0..=cycles {
        let req = request("hot/k", Duration::from_secs(30));
        a.try_acquire(&req).await.expect("acquire").expect("free");
        assert!(a.release(&req.key, req.token).await.expect("release"));
    }
    drop(a);
    // A backend's counts reach the view when it flushes them, at the latest
    // when it exits (the store's connections close on drop). The first
    // grant inserts the row; the other grants and every release update it.
    let updates = 2 * cycles + 1;
    let stats = "SELECT n_tup_upd || ',' || n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'holdfast_leases'";
    let deadline = Instant::now() + Duration::from_secs(20);
    let (upd, hot) = loop {
        let out = psql(&server, stats);
        let (upd, hot) = out.split_once(',').expect("two counts");
        let (upd, hot): (u64, u64) = (upd.parse().expect("count"), hot.parse().expect("count"));
        if upd >= updates || Instant::now() > deadline {
            break (upd, hot);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(upd >= updates, "only {upd} of {updates} updates were counted in 20 s");
    assert!(hot * 10 >= upd * 9, "{hot} of {upd} updates of the lease row were HOT");
}

/// The client counts its session from the send of the statement that made
/// or extended it, never from the reply (model 10, `LeanCountedFromReply`):
/// with every reply 300 ms late, no grant (the first, which makes the
/// session, or a lean one on the client's own count, before and after a
/// renewal) is valid past the session row's expiry on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_grant_outlives_its_session_when_replies_are_late() {
    let server = PostgresServer::start();
    let proxy =
        holdfast_testkit::faults::FaultProxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], server.port())));
    let url = format!("postgres://postgres@{}/postgres?sslmode=disable", proxy.addr());
    let a = holdfast::stores::connect(&url).await.expect("store behind the proxy");
    let ttl = Duration::from_secs(3);
    a.status(&LockKey::new("late/warm").expect("key")).await.expect("namespace made");
    proxy.delay_replies(Duration::from_millis(300));
    let check = |what: &str, started: Instant, valid_for: Duration| {
        let before = Instant::now();
        let left = psql(
            &server,
            "SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::int8 FROM holdfast_leases_sess",
        );
        let left = Duration::from_millis(left.parse().expect("one session"));
        // The row's expiry, on this process's clock, is no later than this.
        let expiry = Instant::now() + left;
        assert!(before > started, "{what}");
        assert!(
            started + valid_for <= expiry + Duration::from_millis(20),
            "{what}: valid {:?} past the session row's expiry",
            (started + valid_for) - expiry
        );
    };
    let mut held = Vec::new();
    for (n, renew_first) in [(0, false), (1, false), (2, true)] {
        if renew_first {
            let renewals: Vec<RenewRequest> = held.iter().map(renewal).collect();
            assert!(a.renew(&renewals).await.expect("renew").iter().all(|h| *h), "a lease was lost");
        }
        let req = request(&format!("late/{n}"), ttl);
        let started = Instant::now();
        let grant = a.try_acquire(&req).await.expect("acquire").expect("free");
        assert!(grant.valid_for >= ttl / 2, "grant {n} valid for only {:?}", grant.valid_for);
        check(&format!("grant {n}"), started, grant.valid_for);
        held.push(req);
    }
}

/// A permit asked for on a key whose lease row a mutex holds under its
/// session: refused while the session lives; granted once the session
/// lapsed, the removal counted in the session row. With the functions of
/// shared leases (which read the gate's session as the mutex's statements
/// do), without them (a `create=false` namespace of an earlier version:
/// transactions), and by a client that found them at connect and sees them
/// dropped since (it falls back to the transactions; before, every permit
/// call failed with "function ... does not exist").
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_permit_waits_for_a_mutex_held_under_a_session_until_it_lapses() {
    let server = PostgresServer::start();
    let with_fns = store(&server).await;
    permit_beside_a_session(&server, &*with_fns, &server.url(), "sess/functions").await;
    psql(&server, "DROP FUNCTION holdfast_leases_gate; DROP FUNCTION holdfast_leases_share");
    // Clients that leave the namespace as it is.
    let url = format!("{}&create=false", server.url());
    let without_fns = holdfast::stores::connect(&url).await.expect("raw store connection");
    permit_beside_a_session(&server, &*without_fns, &url, "sess/transactions").await;
    permit_beside_a_session(&server, &*with_fns, &url, "sess/dropped").await;
    assert_eq!(psql(&server, "SELECT count(*) FROM pg_proc WHERE proname = 'holdfast_leases_share'"), "0");
}

/// A mutex of `key` held by a new client of `url` (its session is lapsed by
/// hand below, behind that client's own count of it), and `b`'s permit.
async fn permit_beside_a_session(server: &PostgresServer, b: &dyn Backend, url: &str, key: &str) {
    let a = holdfast::stores::connect(url).await.expect("raw store connection");
    let permit = request(key, Duration::from_secs(5)).with_mode(LeaseMode::Shared { weight: 1, limit: 2 });
    a.try_acquire(&request(key, Duration::from_secs(30))).await.expect("acquire").expect("free");
    let session = psql(server, &format!("SELECT encode(session, 'hex') FROM holdfast_leases WHERE key = '{key}'"));
    assert_eq!(session.len(), 32, "{key}: the mutex lives with a session");
    assert!(b.try_acquire(&permit).await.expect("try").is_none(), "{key}: a permit beside a live mutex");
    let removed = || psql(server, &format!("SELECT removed FROM holdfast_leases_sess WHERE id = '\\x{session}'"));
    assert_eq!(removed(), "0");
    psql(
        server,
        &format!("UPDATE holdfast_leases_sess SET expires_at = now() - interval '1 s' WHERE id = '\\x{session}'"),
    );
    assert!(b.try_acquire(&permit).await.expect("try").is_some(), "{key}: the session lapsed");
    assert_eq!(removed(), "1", "{key}: the lapsed lease's removal counted in its session");
}
