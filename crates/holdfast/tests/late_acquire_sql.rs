//! An attempt's acquire statement applied by the SQL server AFTER the
//! cleanup's release of that attempt ran on another connection (the etcd
//! defect "a write whose copy arrives late", asked of PostgreSQL and MySQL).
//! A mutex lease of these stores lives with its client's session row, which
//! the client renews while it holds any lease of the same TTL: a late grant
//! that nobody tracks would be held for as long as the client lives.
//!
//! The fix, on both stores: a connection lost with a statement in flight
//! has its server backend ended, and the client waits until the server
//! reports it gone, before the statements that could depend on it run
//! (model 18, `holdfast-models`). These tests failed before it (PostgreSQL
//! 15 and MariaDB 10.11, 2026-12-02: the key still held after 4 TTLs).

/// How soon another client (connecting to `url`) gets `key` with `ttl`,
/// looking every 200 ms for `within`; `None` if it never did.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn freed_within(
    url: &str,
    key: &str,
    ttl: std::time::Duration,
    within: std::time::Duration,
) -> Option<std::time::Duration> {
    let b = holdfast::Client::connect(url).await.expect("connect b");
    let looked = std::time::Instant::now();
    while looked.elapsed() < within {
        if let Some(g) = b.mutex(key).ttl(ttl).try_acquire().await.expect("b try_acquire") {
            let freed = looked.elapsed();
            g.release().await.expect("b release");
            return Some(freed);
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    None
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::time::{Duration, Instant};

    use holdfast::Client;
    use holdfast_testkit::faults::FaultProxy;
    use holdfast_testkit::servers::postgres::PostgresServer;
    use tokio_postgres::NoTls;

    /// The key's lease row with its session's expiry, and the server's clock.
    const ROW_OF_KEY: &str = "SELECT encode(l.token, 'hex'), l.fence, encode(l.session, 'hex'), l.expires_at::text,
            (SELECT s.expires_at::text FROM public.holdfast_leases_sess s WHERE s.id = l.session),
            clock_timestamp()::text
         FROM public.holdfast_leases l WHERE key = $1";

    /// The leases' TTL (the session row's too): short, so that "held much
    /// longer than its TTL" shows within seconds.
    const TTL: Duration = Duration::from_secs(3);

    /// The acquire statement of an attempt reaches the server and waits
    /// there for the key's row lock (held here by a session of the test;
    /// in production any statement or transaction on that row, or a slow
    /// server). Then the client's connection breaks (a reset by a
    /// middlebox, a proxy restart: `cut`); the server side does not notice
    /// while the backend waits for a lock. The attempt fails with
    /// "connection closed"; its cleanup releases the token at once, on the
    /// slot's replaced connection. Then the lock is freed at once. Before
    /// the fix the abandoned backend then ran its acquire and committed a
    /// grant under the client's live session, which the client renews for
    /// its other lease: nobody tracked it, nobody released it (seen failing
    /// on PostgreSQL 15: "key still held 12s"). Now the slot's new
    /// connection ends the old backend, and waits for it to be gone, before
    /// the release runs (`stores/postgres/lost.rs`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_acquire_of_a_lost_connection_is_ended_before_its_release() {
        late_acquire(Duration::ZERO).await;
    }

    /// The same, with the row lock freed 1 s after the connection broke.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_acquire_of_a_lost_connection_still_waiting_a_second_later_is_not_applied() {
        late_acquire(Duration::from_secs(1)).await;
    }

    async fn late_acquire(free_after: Duration) {
        let server = PostgresServer::start();
        let upstream = format!("127.0.0.1:{}", server.port()).parse().expect("addr");
        let proxy = FaultProxy::start(upstream);
        let url = format!(
            "postgres://postgres@{}/postgres?sslmode=disable&pool_size=1&listen=off&timeout_ms=2000",
            proxy.addr()
        );
        let a = Client::connect(&url).await.expect("connect a");
        let key = "late/pg";
        // A's other lease of the same TTL: its renewals keep A's session row
        // alive, as any client holding locks does.
        let keeper = a.mutex("late/keeper").ttl(TTL).try_acquire().await.expect("keeper").expect("free");
        // The key has a row (a released marker): the acquire takes it over
        // under the row's lock.
        a.mutex(key).ttl(TTL).try_acquire().await.expect("first").expect("free").release().await.expect("release");

        let (blocker, connection) = tokio_postgres::connect(&server.url(), NoTls).await.expect("blocker");
        tokio::spawn(connection);
        blocker.batch_execute("BEGIN").await.expect("begin");
        blocker
            .query("SELECT 1 FROM public.holdfast_leases WHERE key = $1 FOR UPDATE", &[&key])
            .await
            .expect("lock the key's row");

        let attempt = tokio::spawn({
            let a = a.clone();
            async move { a.mutex(key).ttl(TTL).try_acquire().await.map(|g| g.map(|g| g.fence())) }
        });
        // Until A's acquire waits for the row lock on the server.
        let waiting =
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()";
        let since = Instant::now();
        loop {
            let n: i64 = blocker.query_one(waiting, &[]).await.expect("activity").get(0);
            if n > 0 {
                break;
            }
            assert!(since.elapsed() < Duration::from_secs(2), "A's acquire never waited for the row lock");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        proxy.cut();
        let outcome = attempt.await.expect("attempt task");
        eprintln!("attempt outcome after the cut: {outcome:?}");
        assert!(outcome.is_err(), "the attempt was answered: {outcome:?}");
        // The attempt's cleanup released the token before the error came
        // back (on a new connection): the key is free as far as A knows.
        let before = blocker
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'", &[])
            .await
            .expect("activity")
            .get::<_, i64>(0);
        eprintln!("backends still waiting for the row lock after the cleanup's release: {before}");
        tokio::time::sleep(free_after).await;
        blocker.batch_execute("COMMIT").await.expect("commit");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let dump = blocker.query(ROW_OF_KEY, &[&key]).await.expect("dump");
        let show = |rows: &[tokio_postgres::Row]| {
            rows.iter()
                .map(|r| {
                    format!(
                        "token {:?} fence {} session {:?} expires_at {} session expires {:?} now {}",
                        r.get::<_, Option<String>>(0),
                        r.get::<_, i64>(1),
                        r.get::<_, Option<String>>(2),
                        r.get::<_, String>(3),
                        r.get::<_, Option<String>>(4),
                        r.get::<_, String>(5)
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        };
        eprintln!("the key's row once the lock was freed: {}", show(&dump));

        // Another client must get the key within seconds (conformance F6
        // asks 1 s + 4 s after the network is back); look for 4 TTLs.
        let freed = super::freed_within(&server.url(), key, TTL, TTL * 4).await;
        let after = blocker.query(ROW_OF_KEY, &[&key]).await.expect("dump");
        assert!(
            freed.is_some(),
            "key still held {:?} (4 TTLs of {TTL:?}) after A's abandoned attempt was released; the late grant lives \
             on A's renewed session: {}",
            TTL * 4,
            show(&after)
        );
        // Ending the lost connection's backend ended nothing else of A's:
        // its other lease held on, and its slot's new connection works.
        assert!(!keeper.is_lost(), "A's other lease was lost: {:?}", keeper.lost_reason());
        let again = a.mutex(key).ttl(TTL).try_acquire().await.expect("A again").expect("the key is free");
        again.release().await.expect("A's release");
        keeper.release().await.expect("A's other lease");
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use holdfast::Client;
    use holdfast_testkit::servers::mysql::MysqlServer;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::watch;

    const TTL: Duration = Duration::from_secs(4);

    /// A TCP proxy that can freeze the connections open now (their bytes,
    /// both ways, wait in the network; a FIN waits behind them) while new
    /// connections flow: a partition of one path (a stuck middlebox, a NAT
    /// entry, a failed route) that a fresh connection does not take.
    /// `FaultProxy::blackhole` holds new connections too.
    struct Freezer {
        addr: SocketAddr,
        next: Arc<AtomicU64>,
        below: Arc<watch::Sender<u64>>,
    }

    impl Freezer {
        async fn start(upstream: SocketAddr) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("addr");
            let next = Arc::new(AtomicU64::new(0));
            let below = Arc::new(watch::Sender::new(0u64));
            let (n, b) = (next.clone(), below.clone());
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let id = n.fetch_add(1, Ordering::SeqCst);
                    let Ok(server) = TcpStream::connect(upstream).await else { continue };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::spawn(pump(cr, sw, id, b.subscribe()));
                    tokio::spawn(pump(sr, cw, id, b.subscribe()));
                }
            });
            Freezer { addr, next, below }
        }

        /// Freezes every connection open now.
        fn freeze_open(&self) {
            self.below.send_replace(self.next.load(Ordering::SeqCst));
        }

        /// Delivers what the frozen connections held, in order, then their FIN.
        fn thaw(&self) {
            self.below.send_replace(0);
        }
    }

    async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, id: u64, mut frozen: watch::Receiver<u64>) {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = from.read(&mut buf).await.unwrap_or(0);
            // Held while this connection is frozen (what follows stays in
            // the kernel's buffers meanwhile).
            let _ = frozen.wait_for(|&below| id >= below).await;
            if n == 0 {
                let _ = to.shutdown().await;
                return;
            }
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }

    fn dump(server: &MysqlServer, key: &str) -> String {
        tokio::task::block_in_place(|| {
            server.sql(&format!(
                "SELECT HEX(l.token), l.fence, HEX(l.session), l.live_until, s.expires_at, UTC_TIMESTAMP(6)
                 FROM holdfast.holdfast_leases l LEFT JOIN holdfast.holdfast_sessions s ON s.id = l.session
                 WHERE l.lock_key = '{key}'"
            ))
        })
    }

    /// The attempt's grant statement goes out on its pooled connection and
    /// waits in the network (that connection's path is partitioned). The
    /// caller gives up (200 ms); the grant's task gives up at the store
    /// timeout and discards the connection (closed with the statement still
    /// in the network); the cleanup's release runs on a new connection and
    /// finds nothing. Then the partition heals. Before the fix the server
    /// then read the grant statement (bytes that arrived before the FIN)
    /// and committed it under A's session, which A renews for its other
    /// lease: nobody tracked it, nobody released it (seen failing on
    /// MariaDB 10.11: the key still held after 4 TTLs). Now the lost
    /// connection is ended on the server (`KILL CONNECTION`, waited for)
    /// before A sends anything else, and the abandoned attempt's task
    /// releases its token once more after that (`stores/mysql/lost.rs`):
    /// the late statement finds its connection ended.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_acquire_delivered_after_its_release_finds_its_connection_ended() {
        let server = MysqlServer::start();
        let freezer = Freezer::start(format!("127.0.0.1:{}", server.port()).parse().expect("addr")).await;
        let url = server
            .url_with("timeout_ms=1000&pool_size=1")
            .replace(&format!(":{}/", server.port()), &format!(":{}/", freezer.addr.port()));
        let a = Client::connect(&url).await.expect("connect a");
        let key = "late-mysql";
        let keeper = a.mutex("late-keeper").ttl(TTL).try_acquire().await.expect("keeper").expect("free");
        a.mutex(key).ttl(TTL).try_acquire().await.expect("first").expect("free").release().await.expect("release");
        eprintln!("row before: {}", dump(&server, key));

        freezer.freeze_open();
        let answered = tokio::time::timeout(Duration::from_millis(200), a.mutex(key).ttl(TTL).try_acquire()).await;
        assert!(
            answered.is_err(),
            "answered through a frozen connection (traffic not through the proxy?): {answered:?}"
        );
        // The grant's task times out at 1 s and discards its connection; the
        // cleanup's release then gets a new one.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        eprintln!("row after the cleanup's release, before the heal: {}", dump(&server, key));
        freezer.thaw();
        tokio::time::sleep(Duration::from_millis(1000)).await;
        eprintln!("row after the heal: {}", dump(&server, key));

        let freed = super::freed_within(&server.url(), key, TTL, TTL * 4).await;
        let after = dump(&server, key);
        drop(keeper);
        assert!(
            freed.is_some(),
            "key still held {:?} (4 TTLs of {TTL:?}) after A's abandoned attempt was released; the late grant lives \
             on A's renewed session: {after}",
            TTL * 4
        );
    }

    /// The processlist ids of the test user's connections (the store's),
    /// not counting those the server is ending.
    fn store_connections(server: &MysqlServer) -> Vec<u64> {
        let listed = tokio::task::block_in_place(|| {
            server.sql(
                "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = 'holdfast' AND COMMAND <> 'Killed' ORDER BY ID",
            )
        });
        listed.lines().map(|l| l.trim().parse().expect("an id")).collect()
    }

    /// Waits up to `within` until `done` holds for the store's connections.
    async fn until_connections(
        server: &MysqlServer,
        within: Duration,
        done: impl Fn(&[u64]) -> bool,
    ) -> Result<Vec<u64>, Vec<u64>> {
        let since = std::time::Instant::now();
        loop {
            let now = store_connections(server);
            if done(&now) {
                return Ok(now);
            }
            if since.elapsed() > within {
                return Err(now);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The end of a lost connection takes only that one: a pooled
    /// connection opened beside it, idle meanwhile, serves the end and
    /// the calls after it, which all succeed. The lost connection (its
    /// path frozen, a grant statement in it) is ended on the server about
    /// when the abandoned attempt times out, not when the partition heals,
    /// and its token holds nothing afterwards.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn ending_a_lost_connection_ends_no_other_and_the_next_calls_succeed() {
        use holdfast::backend::{AcquireRequest, Backend};
        use holdfast::stores::mysql::MysqlBackend;
        use holdfast::{LockKey, OwnerToken};

        let server = MysqlServer::start();
        let freezer = Freezer::start(format!("127.0.0.1:{}", server.port()).parse().expect("addr")).await;
        let url = server
            .url_with("timeout_ms=1000&pool_size=2")
            .replace(&format!(":{}/", server.port()), &format!(":{}/", freezer.addr.port()));
        let backend = MysqlBackend::open_url(&url).await.expect("open");
        let request = |key: &str| AcquireRequest::new(LockKey::new(key).expect("key"), OwnerToken::random(), TTL);
        let cycle = |key: &'static str| {
            let backend = backend.clone();
            async move {
                let req = request(key);
                let granted = backend.try_acquire(&req).await.expect("try_acquire").expect("free");
                assert!(granted.fence > 0);
                assert!(backend.release(&req.key, req.token).await.expect("release"), "released");
            }
        };
        // One pooled connection, the one whose path is frozen next (one
        // read: a release would start a sweep, and a status read makes two
        // calls, each of which may open another).
        backend.read_record(&LockKey::new("lost-key").expect("key")).await.expect("read");
        let lost = until_connections(&server, Duration::from_secs(5), |c| c.len() == 1)
            .await
            .expect("one pooled connection before the partition")[0];

        freezer.freeze_open();
        let abandoned = request("lost-key");
        let answered = tokio::time::timeout(Duration::from_millis(200), backend.try_acquire(&abandoned)).await;
        assert!(answered.is_err(), "answered through a frozen connection: {answered:?}");
        // The grant's task holds the frozen connection until the store
        // timeout: this cycle opens another pooled connection (its release's
        // sweep maybe one more).
        cycle("other-key").await;
        let others: Vec<u64> = store_connections(&server).into_iter().filter(|&id| id != lost).collect();
        assert!(!others.is_empty(), "no other pooled connection");
        eprintln!("lost connection {lost}, other pooled connections {others:?}");

        // The task times out at 1 s and releases its token after the end
        // of the lost connection, on an idle one.
        let ended = until_connections(&server, Duration::from_secs(3), |c| !c.contains(&lost)).await;
        freezer.thaw();
        let ended = ended.unwrap_or_else(|listed| {
            panic!("lost connection {lost} still on the server 3 s after its attempt timed out: {listed:?}")
        });
        assert!(
            others.iter().all(|id| ended.contains(id)),
            "another pooled connection was ended: {others:?} -> {ended:?}"
        );

        // The calls right after: the key is free (the late statement was
        // never applied), and the same connections serve them.
        tokio::time::sleep(Duration::from_millis(300)).await;
        cycle("lost-key").await;
        cycle("other-key").await;
        let status = backend.status(&LockKey::new("lost-key").expect("key")).await.expect("status");
        assert!(status.holder.is_none(), "lost-key held after the cycles: {status:?}");
        let after = store_connections(&server);
        assert!(others.iter().all(|id| after.contains(id)), "a pooled connection is gone: {others:?} -> {after:?}");
        assert!(!after.contains(&lost), "the lost connection {lost} is back: {after:?}");
    }
}
