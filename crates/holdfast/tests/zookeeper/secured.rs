//! A server that demands SASL: `zk://user:pw@...?auth=sasl`; and `zks://`
//! (TLS), refused with a typed error.

use std::time::Duration;

use holdfast::{Client, Error};
use holdfast_testkit::servers::zookeeper::ZkServer;

use super::{client, runtime};

/// Planted in the password: any output that shows it is caught.
const PASSWORD: &str = "zk-PLANTED/pw";

/// Connecting and one request, within a bound: an error must come, and fast.
async fn outcome(url: &str) -> holdfast::Result<()> {
    tokio::time::timeout(Duration::from_secs(30), async {
        let c = Client::connect(url).await?;
        c.mutex("secured/k").try_acquire().await.map(|_| ())
    })
    .await
    .unwrap_or_else(|_| panic!("{} hung", holdfast::stores::redact_url(url)))
}

fn typed_without_password(what: &str, r: holdfast::Result<()>) -> Error {
    let e = r.expect_err(what);
    let text = format!("{e} {e:?}");
    assert!(
        matches!(e, Error::Backend { .. } | Error::InvalidInput { .. } | Error::Unsupported { .. }),
        "{what}: {text}"
    );
    assert!(!text.contains("PLANTED"), "{what}: the error shows the password: {text}");
    e
}

/// Locks and watch wake-ups as a SASL user; a wrong password and no
/// credentials (the server enforces SASL) are each a typed error that does
/// not show the password; `zks://` is refused as unsupported.
#[test]
fn sasl_and_tls() {
    let server = ZkServer::start_secured("locker", PASSWORD);
    let url = server.secured_url();
    runtime().block_on(async {
        let (a, b) = (client(&url, "zk-a").await, client(&url, "zk-b").await);
        assert!(!format!("{a:?}").contains("PLANTED"), "Debug shows the password");
        let g = a.mutex("secured/m").acquire().await.expect("acquire as a SASL user");
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move {
                let g = b.mutex("secured/m").acquire_timeout(Duration::from_secs(20)).await.expect("wait");
                let fence = g.fence();
                g.release().await.expect("release");
                fence
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(b.status("secured/m").await.expect("status").holder.map(|h| h.label), Some("zk-a".to_owned()));
        let first = g.fence();
        g.release().await.expect("release");
        let second = tokio::time::timeout(Duration::from_secs(20), waiter).await.expect("waiter stuck").expect("task");
        assert!(second > first, "fences {first} then {second}");

        let e = typed_without_password("a wrong password", outcome(&url.replace("PLANTED", "WRONG")).await);
        assert!(!e.is_retryable(), "a wrong password is not retryable: {e}");
        let anonymous = url.replace("locker:zk%2DPLANTED%2Fpw@", "").replace("?auth=sasl", "");
        assert!(!anonymous.contains('@'), "{anonymous}");
        typed_without_password("no credentials on a server that enforces SASL", outcome(&anonymous).await);
        // TLS: refused with a typed error (see the store's docs).
        let ca = server.tls_dir().join("ca.pem").display().to_string();
        let zks = format!("zks://locker:x@127.0.0.1:{}?auth=sasl&ca_file={ca}", server.secure_port());
        let e = typed_without_password("zks://", outcome(&zks).await);
        assert!(matches!(e, Error::Unsupported { .. }), "{e}");
        let no_ca = format!("zks://127.0.0.1:{}", server.secure_port());
        let e = typed_without_password("zks:// without ca_file", outcome(&no_ca).await);
        assert!(matches!(e, Error::InvalidInput { .. }), "{e}");
    });
}
