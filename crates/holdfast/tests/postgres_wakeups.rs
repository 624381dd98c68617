//! PostgreSQL's wake-ups on a busy key: a waiting attempt marks the key's
//! row `wanted` so that its release notifies, and writes nothing when the
//! row is marked already (model pg_wakeup); a permit's release that wakes
//! a waiter through the share functions or without them, clients with and
//! without them on one semaphore, and a writer's grant between the two
//! calls of a release without them that keeps a mutex waiter's mark. The notification's cost and the
//! listener's reconnect are in `postgres.rs`.
#![cfg(feature = "postgres")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use holdfast::Client;
use holdfast_testkit::servers::postgres::PostgresServer;
use tokio::sync::oneshot;

use crate::postgres_common::{connect, psql};

/// A waiter that finds the holder's row already marked `wanted` writes no
/// new version of it (each refused attempt rewrote the row, most of a
/// contended key's cost across processes), and every waiter of every
/// client still hears the releases: waiters in three clients, the fallback
/// poll at 20 s and leases of 60 s, so only notifications explain the
/// hand-offs (model pg_wakeup). For a mutex and for a semaphore (whose
/// waiters mark the key's gate row under its lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_marked_row_is_not_rewritten_and_every_waiter_still_hears_its_release() {
    marked_row_is_left_alone(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_marked_gate_row_is_not_rewritten_and_every_permit_waiter_still_hears_its_release() {
    marked_row_is_left_alone(true).await;
}

/// Takes the key (a mutex, or the one permit of a semaphore); with `hold`,
/// says so and holds it until told to release; releases.
async fn take(c: &Client, key: &str, permit: bool, hold: Option<(oneshot::Sender<()>, oneshot::Receiver<()>)>) {
    let ttl = Duration::from_secs(60);
    let (mutex, permit) = if permit {
        (None, Some(c.semaphore(key, 1).ttl(ttl).acquire().await.expect("permit")))
    } else {
        (Some(c.mutex(key).ttl(ttl).acquire().await.expect("mutex")), None)
    };
    if let Some((acquired, release)) = hold {
        acquired.send(()).expect("the test waits");
        release.await.expect("the release signal");
    }
    if let Some(g) = mutex {
        g.release().await.expect("release");
    }
    if let Some(p) = permit {
        p.release().await.expect("release");
    }
}

async fn marked_row_is_left_alone(permit: bool) {
    let server = PostgresServer::start();
    let url = format!("{}&poll_min_ms=20000&poll_max_ms=30000", server.url());
    let key = "marked/k";
    let version =
        || psql(&server, &format!("SELECT xmin::text || ctid::text FROM holdfast_leases WHERE key = '{key}'"));
    let holder = connect(&url, "holder").await;
    let ((acquired_tx, acquired), (release, release_rx)) = (oneshot::channel(), oneshot::channel());
    let hold = tokio::spawn(async move { take(&holder, key, permit, Some((acquired_tx, release_rx))).await });
    acquired.await.expect("held");
    let granted = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    let mut marked = None;
    for name in ["w1", "w2", "w3"] {
        let (c, granted) = (connect(&url, name).await, granted.clone());
        tasks.push(tokio::spawn(async move {
            take(&c, key, permit, None).await;
            granted.fetch_add(1, Ordering::SeqCst);
        }));
        match &marked {
            None => {
                // The first waiter's mark, however long it takes to come.
                let deadline = Instant::now() + Duration::from_secs(15);
                while psql(&server, &format!("SELECT wanted FROM holdfast_leases WHERE key = '{key}'")) != "t" {
                    assert!(Instant::now() < deadline, "the first waiter never marked the row");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                marked = Some(version());
            }
            Some(first) => {
                // The waiter has met the key busy and parked (on a slow
                // machine it may not have yet: the check is then weaker,
                // never wrong).
                tokio::time::sleep(Duration::from_millis(700)).await;
                assert_eq!(&version(), first, "{name} wrote a new version of a row already marked");
            }
        }
    }
    assert_eq!(granted.load(Ordering::SeqCst), 0);
    let released = Instant::now();
    release.send(()).expect("the holder waits");
    hold.await.expect("holder");
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .expect("a waiter slept through a release")
            .expect("task");
    }
    assert_eq!(granted.load(Ordering::SeqCst), 3);
    assert!(released.elapsed() < Duration::from_secs(10), "hand-offs took {:?}", released.elapsed());
}

/// A permit is granted, and its release brings the key's gate down and
/// tells its waiters, each in one call of the namespace's functions (not
/// transactions on the client's transaction connection). A namespace made
/// before the functions (dropped here by hand) works as it is for a
/// `create=false` client, which runs the transactions as before, and gets
/// them from the next client with `create` (the default). Either way a
/// mutex waiter of the key is granted at once after the permit's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_permits_release_frees_the_key_with_or_without_the_share_functions() {
    let server = PostgresServer::start();
    let url = format!("{}&poll_min_ms=20000&poll_max_ms=30000", server.url());
    let has_fn = || {
        psql(&server, "SELECT count(*) FROM pg_proc WHERE proname IN ('holdfast_leases_gate', 'holdfast_leases_share')")
    };
    let waiter = connect(&url, "waiter").await;
    assert_eq!(has_fn(), "2", "a new namespace has the functions");
    psql(&server, "DROP FUNCTION holdfast_leases_gate; DROP FUNCTION holdfast_leases_share");
    let old = connect(&format!("{url}&create=false"), "old").await;
    assert_eq!(has_fn(), "0", "create=false leaves the namespace as it is");
    frees_at_once(&old, &waiter, "gate/old").await;
    let new = connect(&url, "new").await;
    assert_eq!(has_fn(), "2", "a client with create adds the functions");
    frees_at_once(&new, &waiter, "gate/new").await;
}

/// A permit taken while the namespace had its functions, released after
/// they were dropped: the release (one statement that calls the gate
/// function) finds the function gone and runs the two calls instead, so it
/// succeeds and the key is free at once for another client's mutex (before
/// the fall-back, it would fail with "function ... does not exist").
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_permits_release_falls_back_when_the_functions_went_while_it_was_held() {
    let server = PostgresServer::start();
    let holder = connect(&server.url(), "holder").await;
    let ttl = Duration::from_secs(60);
    let permit = holder.semaphore("gone/k", 1).ttl(ttl).acquire().await.expect("permit");
    psql(&server, "DROP FUNCTION holdfast_leases_gate; DROP FUNCTION holdfast_leases_share");
    permit.release().await.expect("the release without the functions");
    let other = connect(&format!("{}&create=false", server.url()), "other").await;
    let mutex = other.mutex("gone/k").try_acquire().await.expect("try");
    assert!(mutex.is_some(), "the gate is still up after the permit's release");
}

/// `holder` takes the one permit of `key`'s semaphore, `waiter` waits for
/// the key's mutex; the permit's release must reach the waiter within 2 s
/// (its poll is 20 s: only the gate's shrink and notification explain it).
async fn frees_at_once(holder: &Client, waiter: &Client, key: &'static str) {
    let ttl = Duration::from_secs(60);
    let permit = holder.semaphore(key, 1).ttl(ttl).acquire().await.expect("permit");
    let w = waiter.clone();
    let waiting = tokio::spawn(async move { w.mutex(key).ttl(ttl).acquire().await.map(|g| g.fence()) });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!waiting.is_finished(), "the mutex was granted while the permit was held");
    let released = Instant::now();
    permit.release().await.expect("release");
    let granted = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("granted").expect("task");
    assert!(granted.is_ok(), "{granted:?}");
    assert!(released.elapsed() < Duration::from_secs(2), "granted {:?} after the release", released.elapsed());
}

/// Two versions on one namespace: a client that runs the transactions (as
/// the version before the functions does: it connected with `create=false`
/// while they were missing) and one that runs the functions grant permits
/// of one semaphore side by side, and never more than its permits are held
/// at once (both lock the gate row first and decide by the same rule).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_with_and_without_the_share_functions_keep_the_permit_bound_together() {
    const PERMITS: u32 = 3;
    let server = PostgresServer::start();
    let url = server.url();
    drop(connect(&url, "setup").await);
    psql(&server, "DROP FUNCTION holdfast_leases_gate; DROP FUNCTION holdfast_leases_share");
    let old = connect(&format!("{url}&create=false"), "old").await;
    let new = connect(&url, "new").await;
    assert_eq!(psql(&server, "SELECT count(*) FROM pg_proc WHERE proname = 'holdfast_leases_share'"), "1");
    let (inside, most) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let mut tasks = Vec::new();
    for (i, c) in [old, new].into_iter().cycle().take(12).enumerate() {
        let (inside, most) = (inside.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let sem = c.semaphore("mixed/permits", PERMITS).ttl(Duration::from_secs(30));
            for _ in 0..15 {
                let permit = sem.acquire().await.unwrap_or_else(|e| panic!("task {i}: {e}"));
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                permit.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t).await.expect("the tasks finish").expect("task");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= PERMITS, "{most} permits held at once, of {PERMITS}");
    assert!(most > 1, "the tasks never overlapped: the check is empty");
}

/// The Execute messages in `bytes`, a stretch of a PostgreSQL client's
/// stream that starts at a message boundary after its startup (each
/// message: a type byte, then a length that counts itself).
fn executes(bytes: &[u8]) -> usize {
    let (mut at, mut count) = (0, 0);
    while at + 5 <= bytes.len() {
        let len = u32::from_be_bytes([bytes[at + 1], bytes[at + 2], bytes[at + 3], bytes[at + 4]]) as usize;
        count += usize::from(bytes[at] == b'E');
        at += 1 + len;
    }
    count
}

/// A held share's release shrinks the key's gate in its own statement
/// (`release_sql`, model 20): one statement on the wire where it was two
/// (the release, then a call of the gate function), and the gate is down
/// when the release returns, so a writer gets the key at once. Counted on
/// the bytes the client sends through the fault proxy, on every one of its
/// connections, around the release alone (leases of 60 s: no renewal in
/// between). Seen failing before: 2 statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shares_release_shrinks_its_gate_in_the_same_statement() {
    let server = PostgresServer::start();
    let proxy = holdfast_testkit::faults::FaultProxy::start(
        format!("127.0.0.1:{}", server.port()).parse().expect("the server's address"),
    );
    proxy.record_requests();
    let url = format!("postgres://postgres@{}/postgres?sslmode=disable&pool_size=1&listen=off", proxy.addr());
    let a = Client::connect(&url).await.expect("connect");
    let rw = a.rwlock("one-statement/key");
    let read = rw.read().ttl(Duration::from_secs(60)).acquire().await.expect("read");
    // A first release of another share: its statement is prepared on the
    // key's connection, so the release counted below sends only Bind and
    // Execute.
    rw.read().ttl(Duration::from_secs(60)).acquire().await.expect("read").release().await.expect("release");
    let before: Vec<usize> = proxy.recorded_requests().iter().map(Vec::len).collect();
    read.release().await.expect("release");
    let sent: usize = proxy
        .recorded_requests()
        .iter()
        .enumerate()
        .map(|(i, bytes)| executes(&bytes[before.get(i).copied().unwrap_or(0)..]))
        .sum();
    assert_eq!(sent, 1, "statements a held share's release sent");
    let b = Client::connect(&server.url()).await.expect("connect b");
    let writer = b.rwlock("one-statement/key").write().try_acquire().await.expect("try write");
    assert!(writer.is_some(), "the gate is still up after the last share's release");
}

/// A held share's release notifies only when someone waits on its key: the
/// gate function reads the gate's `wanted` mark under the gate's lock,
/// after the share's delete, and notifies if it is set (model 21,
/// `pg_share_wakeup`); the release itself no longer notifies for a held
/// share. Every NOTIFY signals every listening backend of the database, so
/// an unconditional one per read cycle cost a third of the readers'
/// throughput. Heard on a session of the test's own that listens on the
/// namespace's channel: nothing for a release with nobody waiting, the
/// key's notification for one a writer waits for, which then gets the key
/// at once (the fallback poll is 20 s). Seen failing before: the release
/// with nobody waiting notified.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shares_release_notifies_only_when_someone_waits() {
    notifies_only_when_someone_waits(true).await;
}

/// Without the namespace's functions a release is two calls (the delete,
/// then the gate's shrink), and the first still notifies whoever waits or
/// not: a client that ended between the two would otherwise leave a
/// waiter that marked the gate asleep beside a share gone (model 21,
/// `TwoStep` with `stops`). The writer is woken all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shares_release_without_the_functions_notifies_always() {
    notifies_only_when_someone_waits(false).await;
}

/// See [`a_shares_release_notifies_only_when_someone_waits`].
async fn notifies_only_when_someone_waits(functions: bool) {
    let server = PostgresServer::start();
    let mut url = format!("{}&poll_min_ms=20000&poll_max_ms=30000", server.url());
    if !functions {
        connect(&url, "namespace").await;
        psql(&server, "DROP FUNCTION holdfast_leases_gate; DROP FUNCTION holdfast_leases_share");
        url.push_str("&create=false");
    }
    let (a, b) = (connect(&url, "reader").await, connect(&url, "writer").await);
    let ttl = Duration::from_secs(60);
    let read = a.rwlock("notify/waited").read().ttl(ttl).acquire().await.expect("read");
    let writer = tokio::spawn(async move {
        let w = b.rwlock("notify/waited").write().ttl(ttl).acquire().await.expect("write");
        w.release().await.expect("release the write lock");
    });
    // The writer is refused and waits, so its client listens: the channel
    // is the one its listener asked for.
    let channel = listening_channel(&server).await;
    let (mut heard, _session, listener) = listen(&server, &channel).await;
    for _ in 0..3 {
        let alone = a.rwlock("notify/alone").read().ttl(ttl).acquire().await.expect("read alone");
        alone.release().await.expect("release alone");
    }
    // Whatever comes until half a second passes without a notification.
    let mut alone = Vec::new();
    while let Ok(Some(payload)) = tokio::time::timeout(Duration::from_millis(500), heard.recv()).await {
        alone.push(payload);
    }
    if functions {
        assert!(alone.is_empty(), "a share released with nobody waiting notified: {alone:?}");
    } else {
        assert!(alone.iter().any(|p| p == "notify/alone"), "the two calls' release did not notify: {alone:?}");
    }
    let released = Instant::now();
    read.release().await.expect("release the waited-for share");
    let payload = tokio::time::timeout(Duration::from_secs(5), heard.recv()).await;
    assert_eq!(payload.ok().flatten().as_deref(), Some("notify/waited"), "the waiter's key was not notified");
    tokio::time::timeout(Duration::from_secs(5), writer).await.expect("the writer was not woken").expect("writer");
    assert!(released.elapsed() < Duration::from_secs(5), "the writer waited {:?}", released.elapsed());
    listener.abort();
}

/// The channel a client's listener asked for (`LISTEN <channel>`), once one
/// has.
async fn listening_channel(server: &PostgresServer) -> String {
    let started = Instant::now();
    loop {
        let sql = "SELECT substr(query, 8) FROM pg_stat_activity WHERE query LIKE 'LISTEN %' LIMIT 1";
        let channel = psql(server, sql);
        if !channel.is_empty() {
            return channel.trim_matches('"').to_owned();
        }
        assert!(started.elapsed() < Duration::from_secs(10), "no client listens");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A session of the test's own listening on `channel`: the payloads it
/// hears, the session (dropped, it ends) and the task that drives it.
type Listening = (tokio::sync::mpsc::UnboundedReceiver<String>, tokio_postgres::Client, tokio::task::JoinHandle<()>);
async fn listen(server: &PostgresServer, channel: &str) -> Listening {
    let (session, mut connection) =
        tokio_postgres::connect(&server.url(), tokio_postgres::NoTls).await.expect("a plain session");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = futures::StreamExt::next(&mut messages).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    session.batch_execute(&format!("LISTEN \"{channel}\"")).await.expect("listen");
    (rx, session, driver)
}

/// Finding (b) of model 21 (`pg_share_wakeup`, `TwoStep` with waiters that
/// release): without the namespace's functions a share's release is two
/// calls, so a writer may take the key from a gate still up, between the
/// delete and the gate's shrink. A mutex waiter that marked the gate and,
/// woken by the delete's notification, finds it still up and marked sleeps
/// registered without writing; a writer's grant that wrote `wanted =
/// false` erased that mark, so the writer's release sent nothing and the
/// mutex waiter slept to its poll (20 s here). The grant now keeps the
/// mark. The interleaving is forced: the release's first call is run by
/// hand (the holder's own second call would find the writer's row and do
/// nothing), and the writer is held at the gate's lock until the mutex
/// waiter has looked.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_writers_grant_between_the_two_calls_keeps_a_mutex_waiters_mark() {
    let server = PostgresServer::start();
    let url = format!("{}&poll_min_ms=20000&poll_max_ms=30000", server.url());
    connect(&url, "namespace").await;
    psql(&server, "DROP FUNCTION holdfast_leases_gate; DROP FUNCTION holdfast_leases_share");
    let url = format!("{url}&create=false");
    let (s, x, w) = (connect(&url, "reader").await, connect(&url, "mutex").await, connect(&url, "writer").await);
    let (key, ttl) = ("mark/kept", Duration::from_secs(60));
    let _read = s.rwlock(key).read().ttl(ttl).acquire().await.expect("read");
    let mutex = tokio::spawn(async move {
        let g = x.mutex(key).ttl(ttl).acquire().await.expect("mutex");
        g.release().await.expect("release the mutex");
    });
    wait_for(&server, &format!("SELECT wanted FROM holdfast_leases WHERE key = '{key}'"), "t").await;
    let ((granted_tx, granted), (release_tx, release_rx)) = (oneshot::channel(), oneshot::channel::<()>());
    let writer = tokio::spawn(async move {
        let g = w.rwlock(key).write().ttl(ttl).acquire().await.expect("write");
        granted_tx.send(()).expect("the test waits");
        release_rx.await.expect("the release signal");
        g.release().await.expect("release the write lock");
    });
    let reserved = format!("SELECT count(*) FROM holdfast_leases_shares WHERE key = '{key}' AND NOT held");
    wait_for(&server, &reserved, "1").await;
    let channel = listening_channel(&server).await;
    let (gate, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls).await.expect("session");
    tokio::spawn(connection);
    gate.batch_execute("BEGIN").await.expect("begin");
    let lock = format!("SELECT 1 FROM holdfast_leases WHERE key = '{key}' FOR UPDATE");
    gate.batch_execute(&lock).await.expect("the gate's lock");
    // The release's first call: the share deleted, and its notification.
    psql(
        &server,
        &format!(
            "DELETE FROM holdfast_leases_shares WHERE key = '{key}' AND held; SELECT pg_notify('{channel}', '{key}')"
        ),
    );
    // Both wake: the mutex waiter finds the gate up and marked and sleeps,
    // the writer waits for the gate's lock.
    tokio::time::sleep(Duration::from_millis(700)).await;
    gate.batch_execute("COMMIT").await.expect("commit");
    tokio::time::timeout(Duration::from_secs(5), granted).await.expect("the writer was not granted").expect("granted");
    let marked = psql(&server, &format!("SELECT wanted FROM holdfast_leases WHERE key = '{key}'"));
    release_tx.send(()).expect("the writer holds");
    writer.await.expect("writer");
    tokio::time::timeout(Duration::from_secs(5), mutex)
        .await
        .unwrap_or_else(|_| {
            panic!("the mutex waiter slept past the writer's release (its mark after the grant: {marked})")
        })
        .expect("mutex");
    assert_eq!(marked, "t", "the writer's grant kept the mutex waiter's mark");
}

/// Waits until `sql` (one value, by psql) gives `value`, at most 15 s.
async fn wait_for(server: &PostgresServer, sql: &str, value: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while psql(server, sql) != value {
        assert!(Instant::now() < deadline, "{sql} never gave {value}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
