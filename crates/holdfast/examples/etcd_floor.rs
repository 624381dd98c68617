//! Uncontended lock cycles per second on etcd: holdfast against the raw floor
//! (the fewest requests for one cycle with a plain etcd-client: a
//! put-if-absent transaction on a kept-alive lease, then a delete).
//!
//! ```text
//! cargo run --release -p holdfast --features etcd --example etcd_floor [-- etcd://127.0.0.1:2379 [seconds]]
//! ```
//! Without a URL it starts a single etcd node on loopback (testkit).

#[cfg(not(feature = "etcd"))]
fn main() {
    eprintln!("build with --features etcd");
}

#[cfg(feature = "etcd")]
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
    });
    drop(server);
}
