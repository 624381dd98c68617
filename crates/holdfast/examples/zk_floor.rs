//! Uncontended lock cycles per second: holdfast on ZooKeeper versus the raw
//! floor (create + delete of an ephemeral sequential node with a plain
//! zookeeper-client session).
//!
//! ```text
//! cargo run --release -p holdfast --features zookeeper --example zk_floor [-- zk://127.0.0.1:2181|- [seconds]]
//! ```
//! Without a `zk://` URL (`-`) it starts a standalone server on loopback (testkit).

use std::time::{Duration, Instant};

use zookeeper_client as zk;

async fn raw_cycles(hosts: &str, secs: f64) -> f64 {
    let client = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(hosts)
        .await
        .expect("raw connect");
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let _ = client.mkdir("/floor/raw", &persistent).await;
    let node = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let (start, mut n) = (Instant::now(), 0u64);
    while start.elapsed().as_secs_f64() < secs {
        let (_, seq) = client.create("/floor/raw/lk-", b"", &node).await.expect("create");
        client.delete(&format!("/floor/raw/lk-{seq}"), None).await.expect("delete");
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

async fn holdfast_cycles(url: &str, secs: f64) -> f64 {
    let client = holdfast::Client::connect(url).await.expect("holdfast connect");
    let (start, mut n) = (Instant::now(), 0u64);
    while start.elapsed().as_secs_f64() < secs {
        let g = client.mutex("floor/holdfast").acquire().await.expect("acquire");
        g.release().await.expect("release");
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let given = args.get(1).filter(|u| u.starts_with("zk://"));
    let server = if given.is_some() { None } else { Some(holdfast_testkit::servers::zookeeper::ZkServer::start()) };
    let url = match (&server, given) {
        (Some(s), _) => s.url(),
        (None, Some(u)) => u.clone(),
        (None, None) => unreachable!("a server is started when no URL is given"),
    };
    let hosts = url.trim_start_matches("zk://").split(['/', '?']).next().unwrap_or_default().to_owned();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
    rt.block_on(async {
        // Warm up both paths, then alternate four rounds each (the box may be shared).
        raw_cycles(&hosts, 0.5).await;
        holdfast_cycles(&url, 0.5).await;
        let (mut raw, mut hf) = (Vec::new(), Vec::new());
        for _ in 0..4 {
            raw.push(raw_cycles(&hosts, secs / 4.0).await);
            hf.push(holdfast_cycles(&url, secs / 4.0).await);
        }
        let raw = raw.iter().sum::<f64>() / raw.len() as f64;
        let hf = hf.iter().sum::<f64>() / hf.len() as f64;
        println!("zookeeper uncontended: raw create+delete {raw:.0} cycles/s, holdfast acquire+release {hf:.0} cycles/s, ratio {:.2}", hf / raw);
    });
    drop(server);
}
