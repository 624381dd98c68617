//! A flash sale: several buyers sell the last items of one product, and the
//! stock never goes below zero.
//!
//! Shows the fencing pattern: every sale takes the product's lock, and the
//! write to the database carries the lock's fence. The stock row remembers
//! the highest fence that wrote it and refuses lower ones, so a buyer that
//! paused past its lease (a GC pause, a stopped VM) and writes late cannot
//! oversell: its fence is older than the next holder's.
//!
//! ```text
//! cargo run -p holdfast-examples --example flash_sale
//! ```
//!
//! Locks and "shop database" are SQLite files in a temporary directory; with
//! Redis, PostgreSQL, ... only the lock URL changes.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, params};

const ITEMS: i64 = 20;
const BUYERS: usize = 6;
const LOCK: &str = "stock:sku-42";

/// The shop's own database, which the lock protects.
#[derive(Clone)]
struct Shop(Arc<Mutex<Connection>>);

impl Shop {
    fn open(path: &Path) -> rusqlite::Result<Shop> {
        let db = Connection::open(path)?;
        db.execute_batch(
            "CREATE TABLE stock (sku TEXT PRIMARY KEY, left INTEGER NOT NULL, last_fence INTEGER NOT NULL);",
        )?;
        db.execute("INSERT INTO stock VALUES ('sku-42', ?1, 0)", [ITEMS])?;
        Ok(Shop(Arc::new(Mutex::new(db))))
    }

    /// Sells one item if any is left, unless a newer lock holder already
    /// wrote the row: `Ok(true)` if sold. The fence check is in the same
    /// statement as the write, so the database itself enforces it.
    async fn sell_one(&self, fence: u64) -> rusqlite::Result<bool> {
        let db = self.0.clone();
        // SQLite calls block; keep them off the async worker threads.
        tokio::task::spawn_blocking(move || {
            let db = db.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let changed = db.execute(
                "UPDATE stock SET left = left - 1, last_fence = ?1
                  WHERE sku = 'sku-42' AND left > 0 AND last_fence < ?1",
                params![fence as i64],
            )?;
            Ok(changed == 1)
        })
        .await
        .expect("the database task does not panic")
    }

    fn left(&self) -> rusqlite::Result<i64> {
        let db = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        db.query_row("SELECT left FROM stock WHERE sku = 'sku-42'", [], |row| row.get(0))
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One buyer (think: one instance of the shop service) selling until the stock is gone.
async fn buyer(locks_url: String, shop: Shop) -> Result<u32, BoxError> {
    let client = holdfast::Client::connect(&locks_url).await?;
    let lock = client.mutex(LOCK).ttl(Duration::from_secs(5));
    let mut sold = 0;
    loop {
        let guard = lock.acquire_timeout(Duration::from_secs(10)).await?;
        let sold_one = shop.sell_one(guard.fence()).await;
        guard.release().await?;
        if !sold_one? {
            // Sold out (or a newer holder wrote first): nothing left for us.
            return Ok(sold);
        }
        sold += 1;
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let locks_url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let shop = Shop::open(&dir.path().join("shop.db"))?;

    // A buyer takes the lock first, then stalls (a GC pause, a stopped VM)
    // until long after its lease is gone. Here: it lets go at once and
    // only writes at the end.
    let client = holdfast::Client::connect(&locks_url).await?;
    let stalled = client.mutex(LOCK).acquire().await?;
    let stale_fence = stalled.fence();
    stalled.release().await?;

    let buyers: Vec<_> = (0..BUYERS).map(|_| tokio::spawn(buyer(locks_url.clone(), shop.clone()))).collect();
    let mut total = 0;
    for (n, b) in buyers.into_iter().enumerate() {
        let sold = b.await??;
        println!("buyer {n} sold {sold}");
        total += sold;
    }
    println!("sold {total} of {ITEMS}; {} left", shop.left()?);
    assert_eq!((i64::from(total), shop.left()?), (ITEMS, 0), "oversold or undersold");

    // The stalled buyer wakes up and writes with its old fence, even after a
    // restock: the row refuses it, because newer holders have written since.
    shop.0.lock().unwrap_or_else(|p| p.into_inner()).execute("UPDATE stock SET left = 1", [])?;
    let accepted = shop.sell_one(stale_fence).await?;
    println!("the late write with stale fence {stale_fence} was {}", if accepted { "ACCEPTED" } else { "refused" });
    assert!(!accepted, "a stale fence must be refused");
    Ok(())
}
