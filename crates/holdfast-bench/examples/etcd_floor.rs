//! Uncontended lock cycles per second on etcd: holdfast against the raw floor
//! (the fewest requests for one cycle with a plain etcd-client: a
//! put-if-absent transaction on a kept-alive lease, then a delete).
//!
//! ```text
//! cargo run --release -p holdfast-bench --features etcd --example etcd_floor [-- etcd://127.0.0.1:2379 [seconds]]
//! ```
//! Without a URL it starts a single etcd node on loopback (testkit).

fn main() {
    use std::time::{Duration, Instant};

    use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

    let args: Vec<String> = std::env::args().skip(1).collect();
    let server = args.is_empty().then(holdfast_testkit::servers::etcd::EtcdServer::start);
    let url = args.first().cloned().unwrap_or_else(|| server.as_ref().map(|s| s.url()).unwrap_or_default());
    let secs: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5);
    let run_for = Duration::from_secs(secs);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let endpoints: Vec<String> =
            url.trim_start_matches("etcd://").split(',').map(|h| format!("http://{h}")).collect();

        // Raw floor: one lease kept alive in the background, then per cycle
        // txn(create_revision(key) == 0 -> put with lease) + delete.
        let mut raw = etcd_client::Client::connect(&endpoints, None).await.expect("connect");
        let lease = raw.lease_grant(30, None).await.expect("lease").id();
        let (mut keeper, mut stream) = raw.lease_keep_alive(lease).await.expect("keep-alive");
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                if keeper.keep_alive().await.is_err() || stream.message().await.is_err() {
                    return;
                }
            }
        });
        let raw_cycle = |mut c: etcd_client::Client| async move {
            let key = "floor/raw-lock";
            let txn = Txn::new().when([Compare::create_revision(key, CompareOp::Equal, 0)]).and_then([TxnOp::put(
                key,
                "me",
                Some(PutOptions::new().with_lease(lease)),
            )]);
            let r = c.txn(txn).await.expect("txn");
            assert!(r.succeeded(), "raw lock busy");
            c.delete(key, None).await.expect("delete");
        };
        let hf = holdfast::Client::connect(&url).await.expect("holdfast connect");
        let m = hf.mutex("floor/holdfast-lock").ttl(Duration::from_secs(30));
        // Warm up both (connections, session lease).
        for _ in 0..50 {
            raw_cycle(raw.clone()).await;
            m.acquire().await.expect("acquire").release().await.expect("release");
        }
        let (mut raw_n, mut hf_n) = (0u64, 0u64);
        let (mut raw_t, mut hf_t) = (Duration::ZERO, Duration::ZERO);
        // Interleave one-second rounds so both see the same machine load.
        let started = Instant::now();
        while started.elapsed() < run_for * 2 {
            let t = Instant::now();
            while t.elapsed() < Duration::from_millis(500) {
                raw_cycle(raw.clone()).await;
                raw_n += 1;
            }
            raw_t += t.elapsed();
            let t = Instant::now();
            while t.elapsed() < Duration::from_millis(500) {
                m.acquire().await.expect("acquire").release().await.expect("release");
                hf_n += 1;
            }
            hf_t += t.elapsed();
        }
        let raw_rate = raw_n as f64 / raw_t.as_secs_f64();
        let hf_rate = hf_n as f64 / hf_t.as_secs_f64();
        println!("etcd raw floor (txn put-if-absent + delete): {raw_rate:.0} cycles/s ({raw_n} cycles)");
        println!("holdfast etcd acquire + release:             {hf_rate:.0} cycles/s ({hf_n} cycles)");
        println!("ratio holdfast / floor: {:.2}", hf_rate / raw_rate);

        // Contended: N clients cycle on one key. Hand-off = from the start of
        // a release to the next grant; compared with a raw put's latency.
        let mut puts = Vec::new();
        for _ in 0..200 {
            let t = Instant::now();
            raw.put("floor/write-latency", "x", None).await.expect("put");
            puts.push(t.elapsed());
        }
        puts.sort();
        let write_p50 = puts[puts.len() / 2];
        println!("raw put latency p50: {write_p50:?}");
        for n in [4usize, 16, 64] {
            let requests = || {
                server.as_ref().map_or(0.0, |s| {
                    s.members[0].metric(&["grpc_server_handled_total", "grpc_type=\"unary\""])
                        + s.members[0].metric(&["grpc_server_msg_received_total", "grpc_method=\"Watch\""])
                })
            };
            let mut clients = Vec::new();
            for _ in 0..n {
                clients.push(holdfast::Client::connect(&url).await.expect("connect"));
            }
            let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let before = requests();
            let stop = Instant::now() + run_for;
            let mut tasks = Vec::new();
            for c in &clients {
                let (c, events) = (c.clone(), events.clone());
                tasks.push(tokio::spawn(async move {
                    let m = c.mutex("floor/contended").ttl(Duration::from_secs(30));
                    let mut n = 0u64;
                    while Instant::now() < stop {
                        let g = m.acquire().await.expect("acquire");
                        let granted = Instant::now();
                        let releasing = Instant::now();
                        g.release().await.expect("release");
                        events.lock().expect("events").push((granted, releasing));
                        n += 1;
                    }
                    n
                }));
            }
            let mut total = 0;
            for t in tasks {
                total += t.await.expect("task");
            }
            let reqs = requests() - before;
            let mut ev = events.lock().expect("events").clone();
            ev.sort();
            let mut handoffs: Vec<Duration> = ev.windows(2).map(|w| w[1].0.saturating_duration_since(w[0].1)).collect();
            handoffs.sort();
            let p50 = handoffs.get(handoffs.len() / 2).copied().unwrap_or_default();
            let p99 = handoffs.get(handoffs.len() * 99 / 100).copied().unwrap_or_default();
            let max = handoffs.last().copied().unwrap_or_default();
            let per = if server.is_some() { format!("{:.2}", reqs / total as f64) } else { "n/a".into() };
            println!(
                "contended, {n:>2} clients: {:.0} acquisitions/s, hand-off p50 {p50:?} ({:.1} x put p50) p99 {p99:?} max {max:?}, etcd requests per acquisition {per}",
                total as f64 / run_for.as_secs_f64(),
                p50.as_secs_f64() / write_p50.as_secs_f64()
            );
            drop(clients);
        }
    });
    drop(server);
}
