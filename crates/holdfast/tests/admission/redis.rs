//! The admission table on Redis, twice: the Lua `decide_shares` of the shipped
//! `common.lua` called directly by a small harness script, and the store's
//! acquire (`acquire.lua` for a mutex, `shared_acquire.lua` otherwise, each
//! reading the keys through `read_lock`/`decide_shares`) on the case's rows
//! seeded into the lock's hash H and shares hash S as the scripts write them
//! (layout at the top of `common.lua`).

use std::collections::BTreeSet;

use holdfast::OwnerToken;
use holdfast::backend::admission::{self, Decision};
use holdfast::stores::redis::RedisBackend;
use holdfast_testkit::admission_cases::{Case, cases, token};
use holdfast_testkit::servers::redis::RedisServer;
use redis::aio::MultiplexedConnection;

use super::{LIVE_MS, Leeway, Live, ends_in_ms, number, run_table};

/// The helpers every script of the store starts with: the very file it ships.
const COMMON: &str = include_str!("../../src/stores/redis/scripts/common.lua");

/// Calls the Lua `decide_shares` with the request from ARGV (token, mode,
/// weight, limit) on the rows that follow (per row token, held, mode,
/// weight, limit, order), written as live entries into the scratch hash
/// KEYS[1] as the scripts write S. Returns {decision, value or ''}.
const HARNESS: &str = "
redis.call('DEL', KEYS[1])
local now = math.floor(now_us() / 1000)
for i = 5, #ARGV, 6 do
  redis.call('HSET', KEYS[1], ARGV[i], share_entry({ held = ARGV[i + 1] == '1', m = tonumber(ARGV[i + 2]),
    w = tonumber(ARGV[i + 3]), l = tonumber(ARGV[i + 4]), ord = tonumber(ARGV[i + 5]), x = now + 60000,
    label = 'harness' }))
end
local d, v = decide_shares(KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), now, nil, nil)
redis.call('DEL', KEYS[1])
if v == nil then v = '' else v = string.format('%d', v) end
return { d, v }
";

fn hex(n: u8) -> String {
    OwnerToken::from_bytes(token(n)).to_hex()
}

async fn raw(server: &RedisServer) -> MultiplexedConnection {
    let c = redis::Client::open(server.url()).expect("redis client");
    c.get_multiplexed_async_connection().await.expect("raw connection")
}

/// What the Lua `decide_shares` says of a case, as a [`Decision`].
async fn lua_decide(conn: &mut MultiplexedConnection, script: &redis::Script, case: &Case) -> Decision {
    let (m, w, l) = admission::encode(case.mode);
    let mut inv = script.prepare_invoke();
    inv.key("admission/harness-rows").arg(hex(case.token)).arg(m).arg(w).arg(l);
    for r in case.live_rows() {
        let (m, w, l) = admission::encode(r.mode);
        inv.arg(OwnerToken::from_bytes(r.token).to_hex()).arg(u8::from(r.held)).arg(m).arg(w).arg(l).arg(r.order);
    }
    let (d, v): (String, String) = inv.invoke_async(conn).await.expect("harness script");
    let place = || v.parse::<u64>().ok();
    match d.as_str() {
        "held" => Decision::AlreadyHeld { fence: place().expect("held: a fence") },
        "grant" => Decision::Grant,
        "refuse" => Decision::Refuse { reserve: case.mode.reserves(), keep_order: place() },
        "conflict" => Decision::Conflict(v),
        other => panic!("the harness returned {other:?}"),
    }
}

/// The Lua port of the rule, from the `common.lua` the store ships, agrees
/// with every case of the table (the one the Rust `decide` passes), on
/// rows read from a hash as the share and writer acquire reads S.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_decide_passes_the_admission_table() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let script = redis::Script::new(&format!("{COMMON}\n{HARNESS}"));
    let all = cases();
    let mut failed = Vec::new();
    for (i, case) in all.iter().enumerate() {
        let got = lua_decide(&mut conn, &script, case).await;
        if !case.accepts(&got) {
            failed.push(format!(
                "case {i} \"{}\": expected {:?}, Lua decide_shares said {got:?}",
                case.name, case.expect
            ));
        }
    }
    assert!(failed.is_empty(), "{} of {} cases failed:\n{}", failed.len(), all.len(), failed.join("\n"));
}

/// The server clock in ms, the scripts' only clock.
async fn server_ms(conn: &mut MultiplexedConnection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    s * 1000 + us / 1000
}

fn names(key: &str) -> (String, String) {
    (format!("{{holdfast:{key}}}"), format!("{{holdfast:{key}}}:s"))
}

/// Writes the case's rows as the scripts keep them: an exclusive or writer
/// lease in H (o, x, l; f the lock's last fence, the highest order, with hf
/// keeping the holder's own fence when a reservation moved f past it), shares
/// and reservations in S, and H's sx the latest expiry of a held share.
async fn seed(conn: &mut MultiplexedConnection, key: &str, case: &Case) {
    let (h, s) = names(key);
    let _: () = redis::cmd("DEL")
        .arg(&h)
        .arg(&s)
        .arg(format!("{h}:q"))
        .arg(format!("{h}:e"))
        .query_async(conn)
        .await
        .expect("DEL");
    if case.rows.is_empty() {
        return;
    }
    let now = server_ms(conn).await;
    let f = case.rows.iter().map(|r| r.order).max().unwrap_or(0);
    let e = now + 10 * LIVE_MS;
    let mut hset = redis::cmd("HSET");
    hset.arg(&h).arg("f").arg(f).arg("e").arg(e);
    let mut sx = None;
    for r in &case.rows {
        let until = now + ends_in_ms(r);
        if r.held && r.mode.is_exclusive() {
            hset.arg("o").arg(hex(r.token)).arg("x").arg(until).arg("l").arg("seed");
            if r.order != f {
                hset.arg("hf").arg(format!("{} {}", hex(r.token), r.order));
            }
            continue;
        }
        if r.held {
            sx = sx.max(Some(until));
        }
        let (m, w, l) = admission::encode(r.mode);
        let entry = format!("{} {m} {w} {l} {} {until} seed", u8::from(r.held), r.order);
        let _: () = redis::cmd("HSET").arg(&s).arg(hex(r.token)).arg(entry).query_async(conn).await.expect("HSET S");
    }
    if let Some(sx) = sx {
        hset.arg("sx").arg(sx);
    }
    let _: () = hset.query_async(conn).await.expect("HSET H");
    let _: () = redis::cmd("PEXPIREAT").arg(&h).arg(e).query_async(conn).await.expect("PEXPIREAT");
    let _: () = redis::cmd("PEXPIREAT").arg(&s).arg(e).query_async(conn).await.expect("PEXPIREAT S");
}

/// The key's live leases and reservations, read back from H and S.
async fn live(conn: &mut MultiplexedConnection, key: &str) -> BTreeSet<Live> {
    let (h, s) = names(key);
    let now = server_ms(conn).await;
    let num = |t: &str| OwnerToken::from_hex(t).map_or(0, |t| number(&t.to_bytes()));
    let mut out = BTreeSet::new();
    let (o, x, f, hf): (Option<String>, Option<i64>, Option<u64>, Option<String>) =
        redis::cmd("HMGET").arg(&h).arg("o").arg("x").arg("f").arg("hf").query_async(conn).await.expect("HMGET");
    if let (Some(o), Some(x)) = (o, x) {
        if x > now {
            // holder_fence: hf counts while it names the holder.
            let kept = hf.and_then(|v| v.strip_prefix(&format!("{o} ")).and_then(|n| n.parse().ok()));
            out.insert((num(&o), true, kept.or(f).unwrap_or(0)));
        }
    }
    let shares: Vec<(String, String)> = redis::cmd("HGETALL").arg(&s).query_async(conn).await.expect("HGETALL");
    for (t, v) in shares {
        let parts: Vec<&str> = v.split(' ').collect();
        let (held, order, until) = (parts[0] == "1", parts[4].parse().unwrap_or(0), parts[5].parse().unwrap_or(0i64));
        if until > now {
            out.insert((num(&t), held, order));
        }
    }
    out
}

/// Every case of the table through the store's own acquire on seeded keys:
/// covers the scripts' reading of H and S (expiry, the exclusive holder in
/// H, hf) as well as the Lua rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_passes_the_admission_table() {
    let server = RedisServer::start();
    let store = RedisBackend::open_url(&server.url()).await.expect("open");
    let seeder = std::sync::Mutex::new(raw(&server).await);
    let reader = std::sync::Mutex::new(raw(&server).await);
    let rt = tokio::runtime::Handle::current();
    run_table(
        &store,
        Leeway::default(),
        |key, case| rt.block_on(seed(&mut seeder.lock().expect("seeder"), key, case)),
        |key| rt.block_on(live(&mut reader.lock().expect("reader"), key)),
    )
    .await;
}
