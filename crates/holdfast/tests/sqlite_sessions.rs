//! SQLite leases that live with their client's session row (issue 33 item
//! 4; `holdfast-models` model 9): renewal writes one row per client and
//! TTL, and each rule the model found necessary holds on a real file.
#![cfg(feature = "sqlite")]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use holdfast::backend::{AcquireRequest, Backend, RenewRequest};
use holdfast::stores::sqlite::SqliteBackend;
use holdfast::{Client, LockKey, OwnerToken};
use rusqlite::{Connection, params};

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_millis() as i64
}

struct File {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
}

impl File {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("locks.db");
        File { _dir: dir, path }
    }

    fn url(&self) -> String {
        format!("sqlite://{}", self.path.display())
    }

    async fn store(&self) -> SqliteBackend {
        SqliteBackend::open_url(&self.url()).await.expect("open the store")
    }

    /// A connection of its own, as another process (or a person with the
    /// `sqlite3` shell) would open.
    fn raw(&self) -> Connection {
        Connection::open(&self.path).expect("open the file")
    }
}

fn request(key: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(LockKey::new(key).expect("key"), OwnerToken::random(), ttl).with_label("test")
}

fn renewal(req: &AcquireRequest) -> RenewRequest {
    RenewRequest { key: req.key.clone(), token: req.token, ttl: req.ttl }
}

/// Grants `req` on `store`, which must be free.
async fn grant(store: &SqliteBackend, req: &AcquireRequest) {
    assert!(store.try_acquire(req).await.expect("try_acquire").is_some(), "{} was not free", req.key);
}

/// Renewing 2,000 leases writes the client's one session row: no lease row
/// changes, and the leases outlive their TTL several times over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_writes_the_session_row_not_the_lease_rows() {
    let file = File::new();
    let client = Client::connect(&file.url()).await.expect("connect");
    let ttl = Duration::from_millis(600);
    let guards = crate::held_leases::hold_mutexes(&client, "held", 2_000, ttl).await;
    let raw = file.raw();
    let rows = |raw: &Connection| -> Vec<(String, i64)> {
        let mut stmt = raw.prepare("SELECT key, until_ms FROM holdfast_grants ORDER BY key").expect("prepare");
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).expect("query").map(|r| r.expect("row")).collect()
    };
    let before = rows(&raw);
    let sessions: i64 = raw.query_row("SELECT count(*) FROM holdfast_sessions", [], |r| r.get(0)).expect("count");
    assert_eq!(sessions, 1, "one session row for one client and one TTL");
    tokio::time::sleep(ttl * 3).await;
    assert_eq!(rows(&raw), before, "renewal wrote lease rows");
    let session_until: i64 =
        raw.query_row("SELECT expires_at_ms FROM holdfast_sessions", [], |r| r.get(0)).expect("session");
    assert!(session_until > now_ms(), "the session row was not renewed");
    let other = Client::connect(&file.url()).await.expect("connect");
    assert!(other.mutex("held/1999").try_acquire().await.expect("try").is_none(), "a renewed lease was free");
    assert!(guards.iter().all(|g| !g.is_lost()), "a lease was lost");
    for g in guards {
        g.release().await.expect("release");
    }
}

/// An operator frees one of two leases of one session: the holder's
/// renewal of the other lease sees the session's count move, and its later
/// renewal of the freed one says it is gone (a renewal that read only the
/// rows it renews would have confirmed it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_is_heard_by_a_later_renewal_of_that_lease() {
    let file = File::new();
    let (holder, admin) = (file.store().await, file.store().await);
    let ttl = Duration::from_secs(30);
    let (kept, freed) = (request("kept", ttl), request("freed", ttl));
    grant(&holder, &kept).await;
    grant(&holder, &freed).await;
    let removed = admin.force_release(&freed.key).await.expect("force_release");
    assert!(removed.exclusive.is_some(), "{removed:?}");
    assert_eq!(holder.renew(&[renewal(&kept)]).await.expect("renew"), [true]);
    assert_eq!(holder.renew(&[renewal(&freed)]).await.expect("renew"), [false], "a freed lease was renewed");
    assert_eq!(holder.renew(&[renewal(&kept)]).await.expect("renew"), [true]);
}

/// A release by another client that knows the token is a removal too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_by_another_client_is_heard_by_the_holder() {
    let file = File::new();
    let (holder, other) = (file.store().await, file.store().await);
    let req = request("k", Duration::from_secs(30));
    grant(&holder, &req).await;
    assert!(other.release(&req.key, req.token).await.expect("release"));
    assert_eq!(holder.renew(&[renewal(&req)]).await.expect("renew"), [false]);
}

/// A session that lapsed is never extended again: its lease is lost even
/// while the client's next session (started by a later grant) lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_of_a_lapsed_session_stays_lost_beside_a_new_session() {
    let file = File::new();
    let holder = file.store().await;
    let ttl = Duration::from_millis(300);
    let old = request("old", ttl);
    grant(&holder, &old).await;
    tokio::time::sleep(ttl + Duration::from_millis(150)).await;
    let new = request("new", ttl);
    grant(&holder, &new).await;
    assert_eq!(holder.renew(&[renewal(&old), renewal(&new)]).await.expect("renew"), [false, true]);
    let sessions: i64 = file.raw().query_row("SELECT count(*) FROM holdfast_sessions", [], |r| r.get(0)).expect("n");
    assert_eq!(sessions, 2, "the lapsed session was extended instead of replaced");
}

/// A grant that takes over a lapsed session's row counts the removal in
/// that session: when the session looks live again (here its row is moved
/// forward by hand, as a host clock stepped back would make it look), the
/// old holder's renewal still says the lease is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_is_heard_by_the_old_holder_after_a_clock_step_back() {
    let file = File::new();
    let (old_holder, new_holder) = (file.store().await, file.store().await);
    let ttl = Duration::from_millis(300);
    let old = request("k", ttl);
    grant(&old_holder, &old).await;
    tokio::time::sleep(ttl + Duration::from_millis(150)).await;
    let new = request("k", Duration::from_secs(30));
    grant(&new_holder, &new).await;
    let raw = file.raw();
    let stepped = raw
        .execute(
            "UPDATE holdfast_sessions SET expires_at_ms = ?1 WHERE expires_at_ms < ?2",
            params![now_ms() + 10_000, now_ms()],
        )
        .expect("move the lapsed session forward");
    assert_eq!(stepped, 1, "one lapsed session");
    assert_eq!(old_holder.renew(&[renewal(&old)]).await.expect("renew"), [false], "the taken lease was renewed");
    assert!(new_holder.renew(&[renewal(&new)]).await.expect("renew")[0]);
}

/// A client that holds a renewed lease and an unrenewed one of the same TTL
/// frees the unrenewed one at its TTL: the store would keep it while the
/// session lives, so the client releases it when its deadline passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrenewed_lease_beside_renewed_ones_is_freed_at_its_ttl() {
    let file = File::new();
    let (holder, other) =
        (Client::connect(&file.url()).await.expect("a"), Client::connect(&file.url()).await.expect("b"));
    let ttl = Duration::from_millis(600);
    let renewed = holder.mutex("renewed").ttl(ttl).acquire().await.expect("acquire");
    let unrenewed = holder.mutex("unrenewed").ttl(ttl).no_renew().acquire().await.expect("acquire");
    let started = std::time::Instant::now();
    let taken = other.mutex("unrenewed").acquire_timeout(ttl * 5).await.expect("the unrenewed lease was never freed");
    assert!(started.elapsed() < ttl + Duration::from_millis(500), "freed only after {:?}", started.elapsed());
    assert!(unrenewed.is_lost());
    assert!(!renewed.is_lost());
    taken.release().await.expect("release");
    renewed.release().await.expect("release");
}

/// Writes a file of the layout before sessions (`expires_at_ms` on every
/// row), fence counter at 41, with an old client's live lease of `old`.
fn old_layout(file: &File) -> Connection {
    let raw = file.raw();
    raw.execute_batch(
        "CREATE TABLE holdfast_fence (id INTEGER PRIMARY KEY CHECK (id = 0), value INTEGER NOT NULL);
         INSERT INTO holdfast_fence (id, value) VALUES (0, 41);
         CREATE TABLE holdfast_grants (
             key TEXT NOT NULL, token BLOB NOT NULL, mode INTEGER NOT NULL, weight INTEGER NOT NULL,
             limit_n INTEGER NOT NULL, held INTEGER NOT NULL, fence INTEGER NOT NULL, label TEXT NOT NULL,
             acquired_at_ms INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL, PRIMARY KEY (key, token)
         ) WITHOUT ROWID;
         CREATE INDEX holdfast_grants_expiry ON holdfast_grants (expires_at_ms);
         CREATE TABLE holdfast_records (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;",
    )
    .expect("the old layout");
    raw.execute(
        "INSERT INTO holdfast_grants VALUES ('old', randomblob(16), 0, 1, 0, 1, 41, 'old client', ?1, ?2)",
        params![now_ms(), now_ms() + 60_000],
    )
    .expect("an old client's live lease");
    raw
}

/// A file of the layout before sessions: its live rows keep their expiry,
/// and an older client's statements fail on it instead of reading a
/// session-bound row's `until_ms` as its expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_of_the_row_expiry_layout_is_brought_up_and_older_clients_fail() {
    let file = File::new();
    let raw = old_layout(&file);
    let store = file.store().await;
    let req = request("old", Duration::from_secs(5));
    assert!(store.try_acquire(&req).await.expect("try").is_none(), "the old client's live lease was ignored");
    let fresh = request("fresh", Duration::from_secs(5));
    let g = store.try_acquire(&fresh).await.expect("try").expect("a free key");
    assert_eq!(g.fence, 42, "the fence counter was not kept");
    let old_renewal =
        raw.execute("UPDATE holdfast_grants SET expires_at_ms = ?1 WHERE key = 'old'", params![now_ms() + 60_000]);
    let e = old_renewal.expect_err("an old client's renewal ran on the new layout");
    assert!(e.to_string().contains("expires_at_ms"), "{e}");
    let old_open =
        raw.execute_batch("CREATE INDEX IF NOT EXISTS holdfast_grants_expiry ON holdfast_grants (expires_at_ms)");
    assert!(old_open.is_err(), "an old client could still open the file");
}

/// Several clients of this version that open an old file at the same moment
/// (processes started together after an upgrade) never fail: one brings the
/// file up, the others find it done, and the old lease still holds.
#[test]
fn clients_that_upgrade_one_file_at_once_never_fail() {
    const CLIENTS: usize = 6;
    for _ in 0..20 {
        let file = File::new();
        drop(old_layout(&file));
        let url = file.url();
        let start = std::sync::Barrier::new(CLIENTS);
        let outcomes: Vec<holdfast::Result<bool>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..CLIENTS)
                .map(|_| {
                    s.spawn(|| {
                        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                        start.wait();
                        rt.block_on(async {
                            let store = SqliteBackend::open_url(&url).await?;
                            Ok(store.try_acquire(&request("old", Duration::from_secs(5))).await?.is_some())
                        })
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        for outcome in outcomes {
            assert!(!outcome.expect("a client failed to open the old file"), "the old client's live lease was taken");
        }
        let sessions: i64 = file
            .raw()
            .query_row("SELECT count(*) FROM pragma_table_info('holdfast_grants') WHERE name = 'session'", [], |r| {
                r.get(0)
            })
            .expect("columns");
        assert_eq!(sessions, 1);
    }
}

/// Sessions of clients that came and went (a `holdfast run` leaves one) are
/// swept by a later release, many at a time, and so are the rows of a
/// client that crashed; a session that lapsed a second ago stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lapsed_sessions_and_their_rows_are_swept() {
    let file = File::new();
    let client = Client::connect(&file.url()).await.expect("connect");
    client.mutex("warm").try_acquire().await.expect("try").expect("free").release().await.expect("release");
    let raw = file.raw();
    let long_ago = now_ms() - 120_000;
    for _ in 0..300 {
        raw.execute("INSERT INTO holdfast_sessions VALUES (randomblob(16), ?1, 0)", params![long_ago]).expect("gone");
    }
    raw.execute("INSERT INTO holdfast_sessions VALUES (x'000000000000000000000000000000aa', ?1, 0)", params![long_ago])
        .expect("crashed");
    for i in 0..3 {
        raw.execute(
            "INSERT INTO holdfast_grants VALUES (?1, randomblob(16), 0, 1, 0, 1, 1, 'crashed', ?2, ?2, x'000000000000000000000000000000aa')",
            params![format!("crashed/{i}"), long_ago],
        )
        .expect("a crashed client's row");
    }
    raw.execute(
        "INSERT INTO holdfast_sessions VALUES (x'000000000000000000000000000000bb', ?1, 0)",
        params![now_ms() - 1_000],
    )
    .expect("recent");
    let count = |sql: &str| -> i64 { raw.query_row(sql, [], |r| r.get(0)).expect("count") };
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        client.mutex("other").try_acquire().await.expect("try").expect("free").release().await.expect("release");
    }
    let lapsed = format!("SELECT count(*) FROM holdfast_sessions WHERE expires_at_ms < {}", now_ms() - 60_000);
    assert_eq!(count(&lapsed), 0, "sessions that lapsed two minutes ago were not swept");
    assert_eq!(count("SELECT count(*) FROM holdfast_grants WHERE key LIKE 'crashed/%'"), 0, "rows were left");
    assert_eq!(
        count("SELECT count(*) FROM holdfast_sessions WHERE id = x'000000000000000000000000000000bb'"),
        1,
        "a recent session was swept"
    );
}
