//! A request handler that locks one entity per request, and answers "busy,
//! retry later" instead of piling up requests behind a slow one.
//!
//! Shows `acquire_timeout` with a short budget taken from the request's own
//! deadline, and how to map holdfast's errors to responses:
//! `Error::Timeout` (someone else holds the entity) is a 409 "busy, retry
//! later" with `Retry-After`, a store failure a 503, anything else a 500. No web
//! framework is needed to see it: `handle` is the function an axum or
//! actix route would call.
//!
//! ```text
//! cargo run -p holdfast-examples --example web_handler
//! ```

use std::time::Duration;

use holdfast::{Client, Error};

/// The parts of an HTTP request the handler needs.
struct Request {
    order_id: u64,
    /// How long the work takes (a stand-in for real work on the order).
    work: Duration,
}

/// The parts of an HTTP response the handler sets.
#[derive(Debug)]
struct Response {
    status: u16,
    retry_after_secs: Option<u64>,
    body: String,
}

/// `POST /orders/{id}/confirm`: one request at a time per order.
async fn handle(locks: &Client, req: Request) -> Response {
    let lock = locks.mutex(format!("order:{}", req.order_id)).ttl(Duration::from_secs(15));
    // Wait briefly: a user is waiting too, and a second click on "confirm"
    // should be told to retry rather than queue behind the first.
    let guard = match lock.acquire_timeout(Duration::from_millis(200)).await {
        Ok(guard) => guard,
        Err(Error::Timeout { .. }) => {
            return Response {
                status: 409,
                retry_after_secs: Some(1),
                body: format!("order {} is busy, retry later", req.order_id),
            };
        }
        // The lock store is down or unreachable: the service is degraded.
        Err(e) if e.is_retryable() => {
            return Response { status: 503, retry_after_secs: Some(5), body: format!("try again soon: {e}") };
        }
        Err(e) => return Response { status: 500, retry_after_secs: None, body: e.to_string() },
    };
    // The work on the order (write it with `guard.fence()` if the database
    // can check fences: see the flash_sale example).
    tokio::time::sleep(req.work).await;
    let fence = guard.fence();
    match guard.release().await {
        Ok(()) => Response {
            status: 200,
            retry_after_secs: None,
            body: format!("order {} confirmed (fence {fence})", req.order_id),
        },
        // The lease ran out before the work finished: another request may
        // have worked on the order at the same time. Say so, do not claim success.
        Err(e) => Response { status: 500, retry_after_secs: None, body: format!("order {}: {e}", req.order_id) },
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let locks = Client::connect(&format!("sqlite://{}", dir.path().join("locks.db").display())).await?;

    // A slow confirm of order 7, a double click on it 50 ms later, and a
    // confirm of order 8 meanwhile.
    let slow = handle(&locks, Request { order_id: 7, work: Duration::from_millis(600) });
    let double_click = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        handle(&locks, Request { order_id: 7, work: Duration::from_millis(10) }).await
    };
    let other = handle(&locks, Request { order_id: 8, work: Duration::from_millis(10) });
    let (slow, double_click, other) = tokio::join!(slow, double_click, other);
    for r in [&slow, &double_click, &other] {
        println!("{} {:?} {}", r.status, r.retry_after_secs, r.body);
    }
    assert_eq!((slow.status, double_click.status, other.status), (200, 409, 200));

    // The client retries after the slow request is done.
    let retry = handle(&locks, Request { order_id: 7, work: Duration::from_millis(10) }).await;
    println!("retry: {} {}", retry.status, retry.body);
    assert_eq!(retry.status, 200);
    Ok(())
}
