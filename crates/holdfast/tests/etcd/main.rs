//! etcd-specific tests: fairness across clients, status, session loss,
//! cleanup, and failover on a real three-member cluster.
#![cfg(feature = "etcd")]

mod failover;
mod queue;
mod session;

use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use holdfast::{Client, ClientOptions, Error};
use holdfast_testkit::conformance::Store;
use holdfast_testkit::servers::etcd::EtcdCluster;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime")
}

async fn client(url: &str, label: &str) -> Client {
    Client::connect_with(url, ClientOptions::default().with_label(label)).await.expect("connect")
}

async fn raw(url: &str) -> etcd_client::Client {
    let endpoints: Vec<String> = url.trim_start_matches("etcd://").split(',').map(|h| format!("http://{h}")).collect();
    etcd_client::Client::connect(endpoints, None).await.expect("raw etcd client")
}

/// Keys under holdfast's default prefix.
async fn holdfast_keys(url: &str) -> Vec<String> {
    let resp = raw(url)
        .await
        .get("holdfast/", Some(etcd_client::GetOptions::new().with_prefix().with_keys_only()))
        .await
        .expect("get");
    resp.kvs().iter().map(|kv| String::from_utf8_lossy(kv.key()).into_owned()).collect()
}
