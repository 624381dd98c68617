//! Keys, TTLs and options at volume: arbitrary values through every
//! builder a user can feed (mutex, semaphore, read-write lock, election;
//! TTL, renewal period, hold cap, wait timeout, fair, reentrant owner,
//! permits and weights, resize, labels, election values), on a live store.
//! Each case is refused with a typed error naming a field that is wrong
//! (`InvalidInput`, or `Unsupported` for a capability the store lacks), or
//! accepted and then behaves: granted at once (the key is free), shown by
//! `status` with its fence and label, released, and shown free again. No
//! case panics or outlives [`CASE_BOUND`].

use std::time::Duration;

use std::sync::Arc;

use holdfast::backend::Backend;
use holdfast::{Client, ClientOptions, Error, GuardKind, LockKey, LockOptions};

const MIN_TTL: Duration = LockOptions::MIN_TTL;
const MAX_TTL: Duration = LockOptions::MAX_TTL;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

/// The longest one case may take (it does a handful of store calls).
const CASE_BOUND: Duration = Duration::from_secs(20);

/// Durations a user might pass: zero, sub-millisecond, everyday, the TTL
/// limits and one past them, and absurd ones up to `Duration::MAX` (which
/// overflow when added to an `Instant`).
pub fn duration() -> impl Strategy<Value = Duration> {
    let nano = Duration::from_nanos(1);
    prop_oneof![
        1 => Just(Duration::ZERO),
        1 => Just(Duration::MAX),
        1 => prop::sample::select(vec![MIN_TTL, MIN_TTL - nano, MAX_TTL, MAX_TTL + nano, Duration::from_secs(u64::MAX)]),
        1 => (0u64..1_000_000).prop_map(Duration::from_nanos),
        3 => (0u64..120_000).prop_map(Duration::from_millis),
        1 => (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
    ]
}

/// Key text: valid-looking, empty, oversized (around 256 bytes, and far
/// beyond), with NUL and other control characters, path and SQL syntax,
/// any Unicode.
pub fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z0-9/:._-]{1,24}",
        1 => Just(String::new()),
        1 => "[a-zé€😀]{60,140}",
        1 => "[a-z]{250,260}",
        1 => (1usize..100_000).prop_map(|n| "k".repeat(n)),
        1 => "[\\x00-\\x20\\x7e-\\xa0a]{0,8}",
        1 => prop::sample::select(vec![".", "..", "/", "//a", "a/../b", "%00", "*", "'; DROP TABLE x; --", "{a}", "\\"])
            .prop_map(str::to_owned),
        1 => ".{0,40}",
        1 => prop::collection::vec(any::<char>(), 1..40).prop_map(|c| c.into_iter().collect()),
    ]
}

/// Labels and election values: short and arbitrary (control characters,
/// NUL), around the limits, and megabytes.
pub fn label() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z0-9:.-]{0,24}",
        1 => ".{0,40}",
        1 => "[\\x00-\\x1f]{1,4}",
        1 => (4090usize..4100).prop_map(|n| "v".repeat(n)),
        1 => (200usize..300).prop_map(|n| "é".repeat(n)),
        1 => (1usize << 20..3 << 20).prop_map(|n| "m".repeat(n)),
    ]
}

/// How an acquire waits.
#[derive(Debug, Clone)]
pub enum Wait {
    /// `try_acquire`.
    Try,
    /// `acquire_timeout(d)`.
    Timeout(Duration),
    /// `wait_timeout(d)` as an option, then `acquire()`.
    Option(Duration),
    /// `acquire()` without limit.
    Forever,
}

/// Which primitive, with its own inputs.
#[derive(Clone)]
pub enum Kind {
    /// A mutex, maybe fair, maybe reentrant for an owner.
    Mutex { fair: bool, owner: Option<String> },
    /// A semaphore of `permits`, asked for `weight` of them, then resized.
    Semaphore { permits: u32, weight: u32, resize: u32 },
    /// One side of a read-write lock.
    Read,
    /// The other side.
    Write,
    /// An election campaign with this value.
    Election { value: String },
}

/// One case: everything a user feeds the builders.
#[derive(Clone)]
pub struct Input {
    pub key: String,
    pub ttl: Duration,
    /// A renewal period: absolute, or a fraction of the TTL (which lands
    /// near the accepted range more often).
    pub renew_every: Option<Result<Duration, f64>>,
    pub max_hold: Option<Duration>,
    pub no_renew: bool,
    pub wait: Wait,
    pub label: String,
    /// The client's `store_retry`.
    pub store_retry: Duration,
    pub kind: Kind,
}

/// Text as `Debug` shows it, at most 60 characters of it (a failing case
/// may hold megabytes).
struct Short<'a>(&'a str);

impl std::fmt::Debug for Short<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.char_indices().nth(60) {
            Some((end, _)) => write!(f, "{:?}.. ({} bytes)", &self.0[..end], self.0.len()),
            None => write!(f, "{:?}", self.0),
        }
    }
}

impl std::fmt::Debug for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kind::Mutex { fair, owner } => {
                f.debug_struct("Mutex").field("fair", fair).field("owner", &owner.as_deref().map(Short)).finish()
            }
            Kind::Semaphore { permits, weight, resize } => f
                .debug_struct("Semaphore")
                .field("permits", permits)
                .field("weight", weight)
                .field("resize", resize)
                .finish(),
            Kind::Read => f.write_str("Read"),
            Kind::Write => f.write_str("Write"),
            Kind::Election { value } => f.debug_struct("Election").field("value", &Short(value)).finish(),
        }
    }
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Input")
            .field("key", &Short(&self.key))
            .field("ttl", &self.ttl)
            .field("renew_every", &self.renew_every)
            .field("max_hold", &self.max_hold)
            .field("no_renew", &self.no_renew)
            .field("wait", &self.wait)
            .field("label", &Short(&self.label))
            .field("store_retry", &self.store_retry)
            .field("kind", &self.kind)
            .finish()
    }
}

fn permits() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0u32), Just(1), Just(u32::MAX), Just(u32::MAX - 1), 1u32..10, any::<u32>()]
}

/// Half the cases valid by construction (so that a few dozen cases still
/// exercise many grants on a store), half arbitrary.
pub fn input() -> impl Strategy<Value = Input> {
    prop_oneof![valid_input(), any_input()]
}

/// Valid keys (any Unicode, path and SQL syntax, up to the limit), TTLs
/// and renewal periods; labels, waits and kinds as arbitrary as ever.
fn valid_input() -> impl Strategy<Value = Input> {
    let key = prop_oneof![
        "[a-z0-9/:._-]{1,24}",
        "[a-zé€😀]{1,64}",
        "[a-z]{256}",
        "[ -~]{1,40}",
        prop::sample::select(vec![".", "..", "/", "//a", "a/../b", "%00", "*", "'; DROP TABLE x; --", "{a}", "\\"])
            .prop_map(str::to_owned),
    ];
    let ttl = (50u64..60_000).prop_map(Duration::from_millis);
    let renew = prop_oneof![Just(None), (0.02f64..0.33).prop_map(|f| Some(Err(f)))];
    (any_input(), key, ttl, renew).prop_map(|(mut input, key, ttl, renew_every)| {
        input.key = key;
        input.ttl = ttl;
        input.renew_every = renew_every;
        if let Kind::Semaphore { permits, weight, .. } = &mut input.kind {
            *permits = (*permits).max(1);
            *weight = (*weight).clamp(1, *permits);
        }
        input
    })
}

fn any_input() -> impl Strategy<Value = Input> {
    let ttl = prop_oneof![3 => (50u64..60_000).prop_map(Duration::from_millis), 2 => duration()];
    let renew = prop_oneof![
        2 => Just(None),
        1 => duration().prop_map(|d| Some(Ok(d))),
        1 => (0.0f64..0.7).prop_map(|f| Some(Err(f))),
    ];
    let wait = prop_oneof![
        2 => Just(Wait::Try),
        1 => duration().prop_map(Wait::Timeout),
        1 => duration().prop_map(Wait::Option),
        1 => Just(Wait::Forever),
    ];
    let kind = prop_oneof![
        3 => (any::<bool>(), prop::option::of(".{0,12}")).prop_map(|(fair, owner)| Kind::Mutex { fair, owner }),
        2 => (permits(), permits(), permits()).prop_map(|(permits, weight, resize)| Kind::Semaphore { permits, weight, resize }),
        1 => Just(Kind::Read),
        1 => Just(Kind::Write),
        1 => label().prop_map(|value| Kind::Election { value }),
    ];
    let options = (prop::option::of(duration()), prop::bool::weighted(0.2), duration());
    (key(), ttl, renew, options, wait, label(), kind).prop_map(
        |(key, ttl, renew_every, (max_hold, no_renew, store_retry), wait, label, kind)| Input {
            key,
            ttl,
            renew_every,
            max_hold,
            no_renew,
            wait,
            label,
            store_retry,
            kind,
        },
    )
}

impl Input {
    /// The renewal period as given to the builder.
    fn renew(&self) -> Option<Duration> {
        self.renew_every.as_ref().map(|r| match r {
            Ok(d) => *d,
            Err(f) => Duration::try_from_secs_f64(self.ttl.as_secs_f64() * f).unwrap_or(Duration::MAX),
        })
    }

    /// The fields that are wrong by the documented rules: empty means the
    /// input must be accepted.
    fn wrong(&self, caps: &holdfast::Capabilities) -> Vec<&'static str> {
        let mut wrong = Vec::new();
        if LockKey::new(self.key.clone()).is_err() {
            wrong.push("key");
        }
        if !(MIN_TTL..=MAX_TTL).contains(&self.ttl) {
            wrong.push("ttl");
        }
        // `LockOptions::renew_every`'s documented range.
        let every = self.renew().unwrap_or(self.ttl / 3);
        let floor = holdfast::LockOptions::MIN_RENEW_EVERY.max(self.ttl / 100);
        let ceiling = (self.ttl / 2).saturating_sub(self.ttl / 100 + Duration::from_millis(1)).max(self.ttl / 3);
        if every < floor || every > ceiling {
            wrong.push("renew_every");
        }
        // An election stores its value as the label, not the client's.
        if !matches!(self.kind, Kind::Election { .. }) && !label_ok(&self.label) {
            wrong.push("label");
        }
        match &self.kind {
            Kind::Semaphore { permits, weight, .. } if *permits == 0 || *weight == 0 || weight > permits => {
                wrong.push("permits")
            }
            Kind::Election { value } if !label_ok(value) => wrong.push("value"),
            Kind::Mutex { fair: true, .. } if !caps.fair => wrong.push("fair"),
            Kind::Semaphore { .. } | Kind::Read | Kind::Write if !caps.shared_leases => wrong.push("shared"),
            _ => {}
        }
        wrong
    }

    fn options(&self) -> holdfast::LockOptions {
        let mut o = holdfast::LockOptions::with_ttl(self.ttl);
        o.renew_every = self.renew();
        o.max_hold = self.max_hold;
        o.auto_renew = !self.no_renew;
        if let Wait::Option(d) = self.wait {
            o.wait_timeout = Some(d);
        }
        o
    }
}

/// The documented rule of labels (`ClientOptions::label`) and election
/// values: at most 4096 bytes, no NUL.
fn label_ok(label: &str) -> bool {
    label.len() <= holdfast::Election::MAX_VALUE_BYTES && !label.contains('\0')
}

/// How long a wait may legitimately time out on a free key: a zero or
/// tiny wait may end before the store's first reply.
fn may_time_out(wait: &Wait) -> bool {
    match wait {
        Wait::Timeout(d) | Wait::Option(d) => *d < Duration::from_secs(2),
        Wait::Try | Wait::Forever => false,
    }
}

/// Acquires through `lock` as `wait` says; `None`: busy (try only).
async fn acquire<K: GuardKind>(lock: &holdfast::Lock<K>, wait: &Wait) -> holdfast::Result<Option<holdfast::Guard<K>>> {
    match wait {
        Wait::Try => lock.try_acquire().await,
        Wait::Timeout(d) => lock.acquire_timeout(*d).await.map(Some),
        Wait::Option(_) | Wait::Forever => lock.acquire().await.map(Some),
    }
}

/// How a case ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Granted, shown by `status`, released.
    Granted,
    /// Refused with a typed error naming a wrong field.
    Refused,
    /// A short wait ran out before the store's first reply.
    TimedOut,
}

/// Checks a refusal: a typed error naming one of the wrong fields.
fn refused(input: &Input, wrong: &[&str], e: &Error) -> Result<Outcome, String> {
    let named = match e {
        Error::InvalidInput { what, .. } => *what,
        Error::Unsupported { .. } if wrong.contains(&"fair") => "fair",
        Error::Unsupported { .. } if wrong.contains(&"shared") => "shared",
        Error::Timeout { .. } if wrong.is_empty() && may_time_out(&input.wait) => return Ok(Outcome::TimedOut),
        _ => return Err(format!("untyped refusal {e:?} (wrong: {wrong:?})")),
    };
    if wrong.contains(&named) {
        Ok(Outcome::Refused)
    } else {
        Err(format!("refused for {named:?}, but wrong are {wrong:?}: {e}"))
    }
}

/// What a granted lease must look like in `status`, then after release.
async fn held<K: GuardKind>(
    client: &Client,
    input: &Input,
    guard: holdfast::Guard<K>,
    label: &str,
) -> Result<Outcome, String> {
    let status = client.status(&input.key).await.map_err(|e| format!("status: {e:?}"))?;
    let fence = guard.fence();
    let shown = status.holder.iter().chain(&status.shared).find(|h| h.fence == fence);
    match shown {
        // MySQL keeps the first 255 characters of a label.
        Some(h) if label.starts_with(&h.label) && h.label.chars().count() >= label.chars().count().min(255) => {}
        Some(h) => return Err(format!("status shows label {:?} for {:?}", h.label, label)),
        // A 50 ms lease on a busy machine may be gone already.
        None if guard.is_lost() => {}
        None => return Err(format!("granted fence {fence} not in status {status:?}")),
    }
    match guard.release().await {
        Ok(()) | Err(Error::Lost { .. }) => {}
        Err(e) => return Err(format!("release: {e:?}")),
    }
    let after = client.status(&input.key).await.map_err(|e| format!("status after release: {e:?}"))?;
    if after.holder.iter().chain(&after.shared).any(|h| h.fence == fence) {
        return Err(format!("still held after release: {after:?}"));
    }
    Ok(Outcome::Granted)
}

/// One case against `client`: refused with a typed error naming a wrong
/// field, or granted and behaving.
pub async fn check(backend: &Arc<dyn Backend>, input: &Input) -> Result<Outcome, String> {
    let options = ClientOptions::default().with_label(input.label.clone()).with_store_retry(input.store_retry);
    let client = &Client::with_backend(backend.clone(), options);
    let wrong = input.wrong(&client.capabilities());
    let label = &input.label;
    macro_rules! outcome {
        ($result:expr, $label:expr) => {
            match $result {
                Err(e) => return refused(input, &wrong, &e),
                Ok(_) if !wrong.is_empty() => return Err(format!("accepted, but wrong are {wrong:?}")),
                Ok(None) => return Err("a free key was busy".to_owned()),
                Ok(Some(guard)) => held(client, input, guard, $label).await,
            }
        };
    }
    let opts = input.options();
    match &input.kind {
        Kind::Mutex { fair, owner } => {
            let mut lock = client.mutex_with_options(&input.key, opts).fair(*fair);
            if let Some(owner) = owner {
                lock = lock.reentrant(owner.clone());
            }
            let first = acquire(&lock, &input.wait).await;
            if let (Some(_), Ok(Some(g))) = (owner, &first) {
                // The same owner nests at once, with the same fence.
                let again = lock.try_acquire().await.map_err(|e| format!("reentry: {e:?}"))?;
                let again = again.ok_or("reentry found the key busy")?;
                if again.fence() != g.fence() {
                    return Err(format!("reentry fence {} != {}", again.fence(), g.fence()));
                }
                again.release().await.map_err(|e| format!("release reentry: {e:?}"))?;
            }
            outcome!(first, label)
        }
        Kind::Semaphore { permits, weight, resize } => {
            let mut sem = client.semaphore(&input.key, *permits);
            sem = sem.ttl(input.ttl);
            if let Some(d) = input.renew() {
                sem = sem.renew_every(d);
            }
            if let Some(d) = input.max_hold {
                sem = sem.max_hold(d);
            }
            if input.no_renew {
                sem = sem.no_renew();
            }
            let got = match input.wait {
                Wait::Try => sem.try_acquire_many(*weight).await,
                Wait::Timeout(d) => sem.acquire_many_timeout(*weight, d).await.map(Some),
                Wait::Option(d) => sem.clone().wait_timeout(d).acquire_many(*weight).await.map(Some),
                Wait::Forever => sem.acquire_many(*weight).await.map(Some),
            };
            if let Ok(Some(_)) = &got {
                match (sem.resize(*resize).await, *resize) {
                    (Err(Error::InvalidInput { what: "permits", .. }), 0) => {}
                    // Held now: this permit's weight, or less if a 50 ms lease ran out.
                    (Ok(n), r) if r > 0 && n <= u64::from(*weight) => {}
                    (Err(Error::Unsupported { .. }), r) if r > 0 => {}
                    (other, r) => return Err(format!("resize to {r}: {other:?}")),
                }
            }
            outcome!(got, label)
        }
        Kind::Read => {
            let lock = client.rwlock_with_options(&input.key, opts).read();
            outcome!(acquire(&lock, &input.wait).await, label)
        }
        Kind::Write => {
            let lock = client.rwlock_with_options(&input.key, opts).write();
            outcome!(acquire(&lock, &input.wait).await, label)
        }
        Kind::Election { value } => {
            let election = client.election_with_options(&input.key, opts);
            match election.campaign(value.clone()).await {
                Err(e) => refused(input, &wrong, &e),
                Ok(_) if !wrong.is_empty() => Err(format!("leadership granted, but wrong are {wrong:?}")),
                Ok(leadership) => {
                    let leader = election.leader().await.map_err(|e| format!("leader: {e:?}"))?;
                    match leader {
                        Some(l) if l.term == leadership.term() && value.starts_with(&l.value) => {}
                        None if leadership.is_lost() => {}
                        other => return Err(format!("leader {other:?}, term {}", leadership.term())),
                    }
                    match leadership.resign().await {
                        Ok(()) | Err(Error::Lost { .. }) => Ok(Outcome::Granted),
                        Err(e) => Err(format!("resign: {e:?}")),
                    }
                }
            }
        }
    }
}

/// Runs `cases` cases of [`input`] against `backend` on `rt`, each bounded
/// by [`CASE_BOUND`]; a panic, a hang or a wrong outcome fails with the
/// (shrunk) input.
pub fn run(rt: &tokio::runtime::Runtime, backend: &Arc<dyn Backend>, cases: u32, store: &str) {
    // Shrinking re-runs cases that may each wait out CASE_BOUND: cap it.
    let config = Config { cases, failure_persistence: None, max_shrink_time: 60_000, ..Config::default() };
    // Seeded, as the garbage cases are: a run is repeatable, and
    // BADINPUT_SEED=n explores others.
    let seed: u64 = std::env::var("BADINPUT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x1b_ad1e);
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    for (i, b) in store.bytes().enumerate().take(24) {
        seed_bytes[8 + i] = b;
    }
    eprintln!("{store}: input cases from seed {seed} (BADINPUT_SEED)");
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes));
    let tally = std::sync::Mutex::new([0u32; 3]);
    let result = runner.run(&input(), |input| {
        rt.block_on(async {
            match tokio::time::timeout(CASE_BOUND, check(backend, &input)).await {
                Ok(Ok(outcome)) => {
                    tally.lock().expect("tally")[outcome as usize] += 1;
                    Ok(())
                }
                Ok(Err(why)) => {
                    eprintln!("{store}: failing case (before shrinking): {why}\n  {input:?}");
                    Err(TestCaseError::fail(why))
                }
                Err(_) => {
                    eprintln!("{store}: case hung for {CASE_BOUND:?}: {input:?}");
                    Err(TestCaseError::fail(format!("hung for {CASE_BOUND:?}")))
                }
            }
        })
    });
    if let Err(e) = result {
        panic!("{store}: {e}");
    }
    let [granted, refused, timed_out] = *tally.lock().expect("tally");
    eprintln!(
        "{store}: {cases} cases of keys, TTLs and options passed: {granted} granted and released, \
         {refused} refused with a typed error, {timed_out} short waits timed out"
    );
}
