//! MySQL/MariaDB mutex leases that live with their client's session row
//! (issue 33 item 4; `holdfast-models` model 11, `mysql_session`): every
//! mutex grant is held under its client's session for its TTL, renewal
//! writes one row per client and TTL, and a lapsed session, a forced
//! release or a release by another client is heard by the holder's next
//! renewal. (How every statement reads such rows, with rows written by
//! hand: `mysql_session_rows`.)
#![cfg(feature = "mysql")]

use std::time::{Duration, Instant};

use holdfast::backend::{AcquireRequest, Backend, LeaseMode, RenewRequest, UNLIMITED};
use holdfast::stores::mysql::MysqlBackend;
use holdfast::{LockKey, OwnerToken};
use holdfast_testkit::servers::mysql::{DATABASE, MysqlServer};

async fn open(url: &str) -> MysqlBackend {
    MysqlBackend::open_url(url).await.expect("open")
}

fn request(key: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(LockKey::new(key).expect("key"), OwnerToken::random(), ttl)
}

fn renewal(req: &AcquireRequest) -> RenewRequest {
    RenewRequest { key: req.key.clone(), token: req.token, ttl: req.ttl }
}

fn sql(server: &MysqlServer, query: &str) -> String {
    server.sql(&query.replace("DB.", &format!("{DATABASE}."))).trim().to_owned()
}

/// Rows the server updated since it started (`Handler_update`).
fn rows_updated(server: &MysqlServer) -> u64 {
    let line = sql(server, "SHOW GLOBAL STATUS LIKE 'Handler_update'");
    let n = line.split_whitespace().last().and_then(|n| n.parse().ok());
    n.unwrap_or_else(|| panic!("Handler_update: {line:?}"))
}

/// Renewal of many leases writes one session row per renewal, not a row
/// per lease; every lease row names that session and keeps `live_until` far
/// ahead, so a client of a version before session rows, which reads
/// `live_until` alone, sees them held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renewal_writes_the_session_row_not_the_lease_rows() {
    let server = MysqlServer::start();
    let client = holdfast::Client::connect(&server.url()).await.expect("client");
    let ttl = Duration::from_millis(900);
    let guards = crate::held_leases::hold_mutexes(&client, "many", 200, ttl).await;
    let rows = "SELECT MD5(GROUP_CONCAT(HEX(token), live_until, HEX(session) ORDER BY lock_key)) \
                FROM DB.holdfast_leases WHERE lock_key LIKE 'many/%'";
    let before = sql(&server, rows);
    let session_before = sql(&server, "SELECT expires_at FROM DB.holdfast_sessions");
    let updated_before = rows_updated(&server);
    tokio::time::sleep(ttl * 3).await;
    let updated = rows_updated(&server) - updated_before;
    for g in &guards {
        assert!(!g.is_lost(), "a lease was lost while its session was renewed");
    }
    // About nine renewals (one a third of the TTL); per lease it would be 1,800.
    assert!(updated <= 40, "{updated} rows updated by renewal of 200 leases over 2.7 s");
    assert_eq!(sql(&server, rows), before, "renewal wrote lease rows");
    assert_eq!(sql(&server, "SELECT COUNT(*) FROM DB.holdfast_sessions"), "1", "one session per client and TTL");
    assert_ne!(sql(&server, "SELECT expires_at FROM DB.holdfast_sessions"), session_before, "the session moved");
    let bound = "SELECT COUNT(*) FROM DB.holdfast_leases l JOIN DB.holdfast_sessions x ON x.id = l.session \
                 WHERE l.lock_key LIKE 'many/%' AND l.live_until = '9999-12-31 00:00:00'";
    assert_eq!(sql(&server, bound), "200", "every lease row is held under the session");
    for g in guards {
        g.release().await.expect("release");
    }
    let free = "SELECT COUNT(*) FROM DB.holdfast_leases WHERE lock_key LIKE 'many/%' AND live_until > UTC_TIMESTAMP(6)";
    assert_eq!(sql(&server, free), "0", "released rows are read by their own expiry");
}

/// A client's own release counts nothing in its session, and the released
/// row keeps naming it, so that the same session's next grant of the key
/// changes no index entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_own_release_counts_nothing_and_keeps_the_session_in_the_row() {
    let server = MysqlServer::start();
    let a = open(&server.url()).await;
    let ttl = Duration::from_secs(30);
    let first = request("own/k", ttl);
    a.try_acquire(&first).await.expect("acquire").expect("free");
    assert!(a.release(&first.key, first.token).await.expect("release"));
    let row = "SELECT HEX(l.session) = HEX(x.id), x.removed FROM DB.holdfast_leases l, DB.holdfast_sessions x \
               WHERE l.lock_key = 'own/k'";
    assert_eq!(sql(&server, row), "1\t0", "the released row's session and the count");
    let second = request("own/k", ttl);
    a.try_acquire(&second).await.expect("acquire").expect("free again");
    assert_eq!(a.renew(&[renewal(&second)]).await.expect("renew"), vec![true]);
    assert_eq!(sql(&server, row), "1\t0", "the second grant's session and the count");
}

/// A grant whose answer the client never read (its reply lost, its caller
/// gone) is a row of the client's session under a token its book does not
/// know: the release of that token is counted, and the client's own next
/// renewal settles the count without losing its other leases. (The row is
/// written by hand as the grant statement writes it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_a_grant_never_read_is_counted_and_settled_by_the_same_client() {
    let server = MysqlServer::start();
    let a = open(&server.url()).await;
    let ttl = Duration::from_secs(30);
    let kept = request("unread/kept", ttl);
    a.try_acquire(&kept).await.expect("acquire").expect("free");
    let unread = request("unread/lost-reply", ttl);
    sql(
        &server,
        &format!(
            "INSERT INTO DB.holdfast_leases (lock_key, token, fence, label, live_until, session) \
             SELECT 'unread/lost-reply', X'{}', 7, '', '9999-12-31 00:00:00', id FROM DB.holdfast_sessions",
            unread.token.to_bytes().iter().map(|b| format!("{b:02X}")).collect::<String>()
        ),
    );
    assert!(a.release(&unread.key, unread.token).await.expect("release"), "the unread grant was not released");
    assert_eq!(sql(&server, "SELECT removed FROM DB.holdfast_sessions"), "1", "the release was not counted");
    assert_eq!(a.renew(&[renewal(&kept)]).await.expect("renew"), vec![true], "the settled count lost a lease");
    assert_eq!(a.renew(&[renewal(&kept)]).await.expect("renew"), vec![true]);
}

/// A forced release of one of a client's leases is counted in its session:
/// the holder's next renewal reports exactly that lease lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_is_heard_by_the_holders_next_renewal() {
    let server = MysqlServer::start();
    let (a, b) = (open(&server.url()).await, open(&server.url()).await);
    let ttl = Duration::from_secs(30);
    let (gone, kept) = (request("forced/gone", ttl), request("forced/kept", ttl));
    a.try_acquire(&gone).await.expect("acquire").expect("free");
    a.try_acquire(&kept).await.expect("acquire").expect("free");
    assert!(b.force_release(&gone.key).await.expect("force").exclusive.is_some(), "nothing was held");
    assert_eq!(a.renew(&[renewal(&gone), renewal(&kept)]).await.expect("renew"), vec![false, true]);
    // Heard once: the next renewal agrees.
    assert_eq!(a.renew(&[renewal(&kept)]).await.expect("renew"), vec![true]);
}

/// A release by the holder's token through another client (which does not
/// know the token's session) is counted: the holder's renewal hears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_by_another_client_is_heard_by_the_holder() {
    let server = MysqlServer::start();
    let (a, b) = (open(&server.url()).await, open(&server.url()).await);
    let ttl = Duration::from_secs(30);
    let (gone, kept) = (request("other/gone", ttl), request("other/kept", ttl));
    a.try_acquire(&gone).await.expect("acquire").expect("free");
    a.try_acquire(&kept).await.expect("acquire").expect("free");
    assert!(b.release(&gone.key, gone.token).await.expect("release"), "the row was not released");
    assert_eq!(sql(&server, "SELECT removed FROM DB.holdfast_sessions"), "1", "the removal was not counted");
    assert_eq!(a.renew(&[renewal(&gone), renewal(&kept)]).await.expect("renew"), vec![false, true]);
}

/// A session that lapsed is never extended again: its leases are lost
/// (another client takes them over), the same client's leases of another
/// session are not, and its next grant of that TTL makes a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_session_loses_exactly_its_leases() {
    let server = MysqlServer::start();
    let (a, b) = (open(&server.url()).await, open(&server.url()).await);
    let (short, long) = (Duration::from_millis(1_000), Duration::from_secs(30));
    let old = request("lapsed/old", short);
    let kept = request("lapsed/kept", long);
    a.try_acquire(&old).await.expect("acquire").expect("free");
    a.try_acquire(&kept).await.expect("acquire").expect("free");
    tokio::time::sleep(short + Duration::from_millis(300)).await;
    let new = request("lapsed/new", short);
    a.try_acquire(&new).await.expect("acquire").expect("free");
    // At once, while the new session (1 s) is surely unexpired.
    assert_eq!(a.renew(&[renewal(&old), renewal(&kept), renewal(&new)]).await.expect("renew"), vec![false, true, true]);
    assert_eq!(sql(&server, "SELECT COUNT(*) FROM DB.holdfast_sessions"), "3", "a new session, not the old extended");
    let taken = b.try_acquire(&request("lapsed/old", long)).await.expect("try").expect("the lapsed lease is free");
    assert!(taken.fence > 1, "fence {} above the lapsed grant's", taken.fence);
}

/// A shrunk mutex lease is a share of its own expiry: renewal extends the
/// share (not the session it was held under), so it stays held past its
/// first TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shrunk_lease_is_renewed_as_a_share() {
    let server = MysqlServer::start();
    let (a, b) = (open(&server.url()).await, open(&server.url()).await);
    let ttl = Duration::from_millis(1_000);
    let lease = request("shrunk/k", ttl);
    a.try_acquire(&lease).await.expect("acquire").expect("free");
    let reader = LeaseMode::Shared { weight: 1, limit: UNLIMITED };
    assert!(a.shrink(&lease.key, lease.token, reader).await.expect("shrink"));
    for _ in 0..6 {
        tokio::time::sleep(ttl / 3).await;
        assert_eq!(a.renew(&[renewal(&lease)]).await.expect("renew"), vec![true]);
    }
    let writer = request("shrunk/k", ttl).with_mode(LeaseMode::Writer);
    assert!(b.try_acquire(&writer).await.expect("try").is_none(), "the renewed share no longer holds the key");
}

/// No grant (a new session, an extended one, or a lean one on the client's
/// own count, before and after a renewal) is valid past the session row's
/// expiry on the server, with every reply 300 ms late.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_grant_outlives_its_session_when_replies_are_late() {
    let server = MysqlServer::start();
    let proxy =
        holdfast_testkit::faults::FaultProxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], server.port())));
    let url = server.url().replace(&format!("127.0.0.1:{}", server.port()), &proxy.addr().to_string());
    let a = open(&url).await;
    // Each statement takes 300 ms more: a TTL that leaves the client's
    // count two thirds of it after a grant or two.
    let ttl = Duration::from_secs(6);
    // Connected, with the statements prepared, before replies are late (a
    // new connection's handshake alone would take most of the TTL).
    let warm = request("late/warm", Duration::from_secs(60));
    a.try_acquire(&warm).await.expect("acquire").expect("free");
    assert_eq!(a.renew(&[renewal(&warm)]).await.expect("renew"), vec![true]);
    a.release(&warm.key, warm.token).await.expect("release");
    proxy.delay_replies(Duration::from_millis(300));
    let check = |key: &str, started: Instant, valid_for: Duration| {
        let left = sql(
            &server,
            &format!(
                "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), x.expires_at) FROM DB.holdfast_leases l \
                 JOIN DB.holdfast_sessions x ON x.id = l.session WHERE l.lock_key = '{key}'"
            ),
        );
        let what = format!("the grant of {key}");
        let left = Duration::from_micros(left.parse().unwrap_or_else(|_| panic!("{what}: session {left:?}")));
        // The row's expiry, on this process's clock, is no later than this.
        let expiry = Instant::now() + left;
        assert!(
            started + valid_for <= expiry + Duration::from_millis(20),
            "{what}: valid {:?} past the session row's expiry",
            (started + valid_for) - expiry
        );
    };
    let mut held = Vec::new();
    for (n, wait_first, renew_first) in [(0, false, false), (1, false, false), (2, true, false), (3, false, true)] {
        if wait_first {
            // Past a third of the TTL: the next grant extends the session.
            tokio::time::sleep(ttl / 3 + Duration::from_millis(100)).await;
        }
        if renew_first {
            let renewals: Vec<RenewRequest> = held.iter().map(renewal).collect();
            assert!(a.renew(&renewals).await.expect("renew").iter().all(|h| *h), "a lease was lost");
        }
        let req = request(&format!("late/{n}"), ttl);
        let started = Instant::now();
        let grant = a.try_acquire(&req).await.expect("acquire").expect("free");
        assert!(grant.valid_for >= ttl / 2, "grant {n} valid for only {:?}", grant.valid_for);
        check(req.key.as_str(), started, grant.valid_for);
        held.push(req);
    }
    // The lean grant, the extension and the renewal kept one session.
    let sessions = "SELECT COUNT(DISTINCT session) FROM DB.holdfast_leases WHERE lock_key LIKE 'late/_'";
    assert_eq!(sql(&server, sessions), "1", "the grants' sessions");
}
