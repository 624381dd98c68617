//! Seeded fault runs: several clients lock keys on several simulated stores
//! through the real client core while links lose, delay and partition, and
//! stores restart and run their clocks at their own rate; the history is
//! then [checked](crate::history::check). One seed is one run, replayed bit
//! for bit on a single-threaded runtime with a paused clock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use holdfast::backend::{LeaseMode, UNLIMITED};
use holdfast::{Client, ClientOptions, Guard, GuardKind, Lock, PermitKind, Semaphore};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{CounterScope, Link, LinkFaults, LinkState, SimConfig, SimStore};
use crate::history::{EndCause, Event, GrantId, Recorder, Verdict, check};

/// The shape of a seeded run.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Stores, each independent.
    pub stores: u32,
    /// Clients; each has a connection to every store.
    pub clients: u32,
    /// Keys per store.
    pub keys: u32,
    /// Operations per client.
    pub ops: u32,
    /// Tasks per client, each running `ops` operations at once with the
    /// others (so that a client's own waiters on a key take turns).
    pub tasks: u32,
    /// The lease TTL.
    pub ttl: Duration,
    /// Chance that a request, or a reply, is lost.
    pub loss: f64,
    /// Longest one-way delay of most messages.
    pub max_delay: Duration,
    /// Chance that a message is slow, delayed up to twice the TTL.
    pub slow: f64,
    /// How far each store's clock rate may differ from real time (0.009:
    /// within the client's 1% margin).
    pub clock_drift: f64,
    /// Partitions and store restarts over the run.
    pub faults: u32,
    /// Whether a restarted store keeps its data (leases and fence
    /// counters), as a durable store does. Without it, what the checker
    /// finds is the documented limit of a store without persistence.
    pub restarts_keep_state: bool,
    /// How long a restarted store stays down; `None`: a random while, up to
    /// one TTL.
    pub restart_down_for: Option<Duration>,
    /// If set, how soon after the last worker stops and every link heals
    /// the stores must hold nothing (counted in
    /// [`RunOutcome::held_after_cleanup`]): abandoned attempts and dropped
    /// guards are released by the client, not left to expire. Meaningful
    /// only when it is well under the TTL.
    pub cleanup_within: Option<Duration>,
    /// Each client locks through one RedLock over all the stores (its
    /// grants recorded under store id `stores`), instead of on one store
    /// at a time.
    pub redlock: bool,
    /// Each client locks through one fallback chain over all the stores in
    /// order (the last is the arbiter; grants recorded under store id
    /// `stores`), with a mode lease of two TTLs, so that partitions make
    /// clients disagree about which store is down and switch.
    pub fallback: bool,
    /// With [`fallback`](Self::fallback): tenants share the arbiter (the
    /// last store) instead. Each client has two chains with other record
    /// names, chain `a` over the first and the last store and chain `b`
    /// over the second and the last (grants recorded under store ids
    /// `stores` and `stores + 1`), and locks plainly on the arbiter too.
    pub tenants: bool,
    /// Operations also take semaphore permits (2 permits, 1 or 2 at a
    /// time) and read and write locks, each primitive on keys of its own,
    /// so that the store's one admission rule, its reservations and the
    /// waiting policy's turns for shared requests run under the same faults. On plain
    /// stores only (not with [`redlock`](Self::redlock) or
    /// [`fallback`](Self::fallback), which grant exclusive leases only).
    pub shares: bool,
    /// The fence counter scope of store `s` is `counter_scopes[s % len]`:
    /// by default the first store keeps a counter per key (as Redis), the
    /// second one for the store (as a SQLite file) and the third per key
    /// over one for the store (as a PostgreSQL or MySQL namespace).
    pub counter_scopes: Vec<CounterScope>,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            stores: 3,
            clients: 4,
            keys: 2,
            ops: 200,
            tasks: 1,
            ttl: Duration::from_millis(1000),
            loss: 0.03,
            max_delay: Duration::from_millis(40),
            slow: 0.01,
            clock_drift: 0.009,
            faults: 12,
            restarts_keep_state: true,
            restart_down_for: None,
            cleanup_within: None,
            redlock: false,
            fallback: false,
            tenants: false,
            shares: false,
            counter_scopes: vec![CounterScope::PerKey, CounterScope::PerStore, CounterScope::KeyRows],
        }
    }
}

impl RunConfig {
    /// Long leases (30 s) that only a release frees within the run: the
    /// stores must be empty 5 s after the network heals, so an attempt or
    /// guard whose release never ran shows up as a lease left behind.
    pub fn long_leases() -> Self {
        RunConfig {
            ops: 60,
            ttl: Duration::from_secs(30),
            slow: 0.0,
            faults: 6,
            cleanup_within: Some(Duration::from_secs(5)),
            ..RunConfig::default()
        }
    }

    /// Permits and read-write locks beside mutexes ([`shares`](Self::shares)),
    /// three tasks a client (so that a client's own shared and exclusive
    /// waiters on a key take turns), each with half the operations, under
    /// the same faults.
    pub fn with_shares(self) -> Self {
        RunConfig { shares: true, tasks: 3, ops: self.ops.div_ceil(2), ..self }
    }
}

/// What one run did.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// The seed.
    pub seed: u64,
    /// The checker's verdict.
    pub verdict: Verdict,
    /// Every event, in the order recorded (equal for equal seeds).
    pub events: Vec<Event>,
    /// Leases and reservations the stores still held after quiescence.
    pub left_behind: usize,
    /// Leases and reservations the stores held
    /// [`cleanup_within`](RunConfig::cleanup_within) after the run, when set.
    pub held_after_cleanup: Option<usize>,
}

/// A fenced register per store and key: it remembers the highest fence it
/// accepted and refuses lower ones.
#[derive(Debug, Default, Clone)]
struct Register {
    highest: Arc<Mutex<HashMap<(u32, String), u64>>>,
}

impl Register {
    fn write(&self, store: u32, key: &str, fence: u64) -> bool {
        let mut h = self.highest.lock().unwrap_or_else(|p| p.into_inner());
        let top = h.entry((store, key.to_owned())).or_insert(0);
        let accepted = fence >= *top;
        *top = (*top).max(fence);
        accepted
    }
}

/// Runs one seed on a fresh single-threaded runtime with a paused clock.
pub fn run_seed(seed: u64, config: &RunConfig) -> RunOutcome {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let _seeded = holdfast::entropy::seed_this_thread(seed);
    rt.block_on(run(seed, config.clone()))
}

async fn run(seed: u64, config: RunConfig) -> RunOutcome {
    let mut rng = StdRng::seed_from_u64(seed);
    let recorder = Recorder::new();
    let faults = LinkFaults {
        lose_request: config.loss,
        lose_reply: config.loss,
        min_delay: Duration::from_micros(200),
        max_delay: config.max_delay,
        slow: config.slow,
        slow_delay: config.ttl * 2,
        reorder: false,
    };
    let stores: Vec<SimStore> = (0..config.stores)
        .map(|s| {
            let rate = 1.0 + rng.random_range(-config.clock_drift..=config.clock_drift);
            let scopes = &config.counter_scopes;
            let counter_scope = scopes.get(s as usize % scopes.len().max(1)).copied().unwrap_or_default();
            let sim = SimConfig { store: s, clock_rate: rate, counter_scope, ..SimConfig::default() };
            SimStore::new(sim, Some(recorder.clone()))
        })
        .collect();
    let mut links: Vec<Link> = Vec::new();
    let mut workers = Vec::new();
    let register = Register::default();
    for c in 0..config.clients {
        let opts = ClientOptions::default().with_label(format!("client-{c}")).with_store_retry(config.ttl * 3);
        let mut clients = Vec::new();
        let mut members = Vec::new();
        for (s, store) in stores.iter().enumerate() {
            let (backend, link) = store.connect(rng.random(), faults.clone());
            links.push(link);
            if config.redlock || config.fallback {
                members.push(backend);
            } else {
                clients.push((s as u32, Client::with_backend(backend, opts.clone())));
            }
        }
        if config.redlock {
            let redlock = holdfast::redlock::RedLock::new(members).expect("simulated stores raise fences");
            clients.push((config.stores, Client::with_backend(Arc::new(redlock), opts)));
        } else if config.fallback && config.tenants {
            let arbiter = members.len() - 1;
            for (id, (name, first)) in [("a", 0), ("b", 1)].into_iter().enumerate() {
                let chain = chain(vec![members[first].clone(), members[arbiter].clone()], name, &config);
                clients.push((config.stores + id as u32, Client::with_backend(Arc::new(chain), opts.clone())));
            }
            clients.push((arbiter as u32, Client::with_backend(members[arbiter].clone(), opts)));
        } else if config.fallback {
            clients.push((config.stores, Client::with_backend(Arc::new(chain(members, "default", &config)), opts)));
        }
        for _ in 0..config.tasks.max(1) {
            let worker = Worker {
                id: c,
                clients: clients.clone(),
                rng: StdRng::seed_from_u64(rng.random()),
                recorder: recorder.clone(),
                register: register.clone(),
                config: config.clone(),
            };
            workers.push(tokio::spawn(worker.run()));
        }
    }
    let chaos = tokio::spawn(chaos(StdRng::seed_from_u64(rng.random()), stores.clone(), links.clone(), config.clone()));
    for w in workers {
        w.await.expect("a worker panicked");
    }
    chaos.abort();
    for link in &links {
        link.set_state(LinkState::Up);
    }
    let end = recorder.now();
    let held_after_cleanup = match config.cleanup_within {
        Some(within) => {
            tokio::time::sleep(within).await;
            Some(stores.iter().map(|s| s.live_rows().len()).sum())
        }
        None => None,
    };
    // Quiescence: releases retried in the background finish, and whatever
    // an abandoned attempt left expires.
    tokio::time::sleep(config.ttl * 8).await;
    let left_behind = stores.iter().map(|s| s.live_rows().len()).sum();
    let events = recorder.events();
    let verdict = check(&events, end);
    RunOutcome { seed, verdict, events, left_behind, held_after_cleanup }
}

/// A fallback chain over `stores` named `name`, with a mode lease of two
/// TTLs.
fn chain(
    stores: Vec<Arc<dyn holdfast::backend::Backend>>,
    name: &str,
    config: &RunConfig,
) -> holdfast::fallback::Fallback {
    holdfast::fallback::Fallback::new(stores)
        .and_then(|c| c.with_name(name))
        .and_then(|c| c.with_mode_ttl(config.ttl * 2))
        .expect("simulated stores can arbitrate")
        .with_switch_after(config.ttl / 4)
        .with_fail_back_after(Some(config.ttl * 4))
}

/// Cuts links and restarts stores at random moments.
async fn chaos(mut rng: StdRng, stores: Vec<SimStore>, links: Vec<Link>, config: RunConfig) {
    let span = config.ttl * config.ops / 2;
    for _ in 0..config.faults {
        tokio::time::sleep(span / config.faults.max(1) * rng.random_range(50..150) / 100).await;
        let out_for = config.ttl.mul_f64(rng.random_range(0.1..2.0));
        if rng.random_bool(0.3) {
            let store = &stores[rng.random_range(0..stores.len())];
            store.restart(config.restarts_keep_state, config.restart_down_for.unwrap_or(out_for / 2));
        } else {
            let link = links[rng.random_range(0..links.len())].clone();
            link.set_state(LinkState::Partitioned);
            tokio::spawn(async move {
                tokio::time::sleep(out_for).await;
                link.set_state(LinkState::Up);
            });
        }
    }
}

struct Worker {
    id: u32,
    /// Each client with the store id its grants are recorded under.
    clients: Vec<(u32, Client)>,
    rng: StdRng,
    recorder: Recorder,
    register: Register,
    config: RunConfig,
}

impl Worker {
    async fn run(mut self) {
        for _ in 0..self.config.ops {
            let (store, client) = self.clients[self.rng.random_range(0..self.clients.len())].clone();
            let k = self.rng.random_range(0..self.config.keys);
            let wait = self.config.ttl.mul_f64(self.rng.random_range(0.0..2.0));
            let how = self.rng.random_range(0..10);
            let ttl = self.config.ttl;
            let primitive = if self.config.shares { self.rng.random_range(0..4) } else { 0 };
            // Each primitive on keys of its own: one key's leases have one
            // kind of limit (a mutex key asked for as a semaphore is a
            // conflict, not a grant).
            match primitive {
                0 => {
                    let key = format!("k{k}");
                    let guard = attempt(how, wait, client.mutex(&key).ttl(ttl)).await;
                    self.hold_or_rest(store, &key, LeaseMode::Exclusive, guard).await;
                }
                1 => {
                    let (key, n) = (format!("s{k}"), self.rng.random_range(1..=2));
                    let guard = attempt_permits(how, wait, n, client.semaphore(&key, 2).ttl(ttl)).await;
                    self.hold_or_rest(store, &key, LeaseMode::Shared { weight: n, limit: 2 }, guard).await;
                }
                2 => {
                    let key = format!("rw{k}");
                    let guard = attempt(how, wait, client.rwlock(&key).read().ttl(ttl)).await;
                    self.hold_or_rest(store, &key, LeaseMode::Shared { weight: 1, limit: UNLIMITED }, guard).await;
                }
                _ => {
                    let key = format!("rw{k}");
                    let guard = attempt(how, wait, client.rwlock(&key).write().ttl(ttl)).await;
                    self.hold_or_rest(store, &key, LeaseMode::Writer, guard).await;
                }
            }
        }
    }

    /// Holds a grant (see [`hold`](Self::hold)), or rests a little after
    /// an attempt that got none.
    async fn hold_or_rest<K: GuardKind>(&mut self, store: u32, key: &str, mode: LeaseMode, guard: Option<Guard<K>>) {
        match guard {
            Some(g) => self.hold(store, key, mode, g).await,
            None => tokio::time::sleep(self.config.ttl / 20).await,
        }
    }

    /// The critical section: writes under the fence, for a while that may
    /// outlast the lease, then a release or a drop.
    async fn hold<K: GuardKind>(&mut self, store: u32, key: &str, mode: LeaseMode, guard: Guard<K>) {
        let id = GrantId { store, token: guard_token(&guard) };
        let fence = guard.fence();
        self.recorder.record(Event::Granted {
            id,
            key: key.to_owned(),
            fence,
            mode,
            client: self.id,
            at: self.recorder.now(),
        });
        let lost = guard.lost();
        tokio::pin!(lost);
        let steps = self.rng.random_range(1..4);
        for _ in 0..steps {
            let think = self.config.ttl.mul_f64(self.rng.random_range(0.0..0.8));
            tokio::select! {
                biased;
                _ = &mut lost => {
                    self.recorder.record(Event::Ended { id, cause: EndCause::Lost, at: self.recorder.now() });
                    return;
                }
                _ = tokio::time::sleep(think) => {}
            }
            if guard.is_lost() {
                self.recorder.record(Event::Ended { id, cause: EndCause::Lost, at: self.recorder.now() });
                return;
            }
            self.write(id, key, fence);
        }
        self.recorder.record(Event::Ended { id, cause: EndCause::Released, at: self.recorder.now() });
        if self.rng.random_bool(0.8) {
            let _ = guard.release().await;
        } else {
            drop(guard);
        }
    }

    /// Sends a write under `fence`; it reaches the register after a delay.
    fn write(&mut self, id: GrantId, key: &str, fence: u64) {
        let issued = self.recorder.now();
        // Most writes land at once; some are slow enough to arrive after a
        // newer holder wrote (the fence must refuse them).
        let slow = self.rng.random_bool(0.1);
        let most = if slow { self.config.ttl * 2 } else { self.config.max_delay };
        let delay = most.mul_f64(self.rng.random_range(0.0..1.0));
        let (recorder, register, key) = (self.recorder.clone(), self.register.clone(), key.to_owned());
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let accepted = register.write(id.store, &key, fence);
            recorder.record(Event::Write { id, key, fence, issued, applied: recorder.now(), accepted });
        });
    }
}

/// One acquire of `lock`, the way `how` (0 to 9) picks: a try (2 in 10),
/// a wait dropped at a random moment (1 in 10: the cleanup must leave
/// nothing, a reservation included), or a wait of at most `wait`.
async fn attempt<K: GuardKind>(how: u32, wait: Duration, lock: Lock<K>) -> Option<Guard<K>> {
    match how {
        0..=1 => lock.try_acquire().await.ok().flatten(),
        2 => tokio::time::timeout(wait / 4, lock.acquire()).await.ok().and_then(|r| r.ok()),
        _ => lock.acquire_timeout(wait).await.ok(),
    }
}

/// [`attempt`] for `n` permits of a semaphore.
async fn attempt_permits(how: u32, wait: Duration, n: u32, lock: Semaphore) -> Option<Guard<PermitKind>> {
    match how {
        0..=1 => lock.try_acquire_many(n).await.ok().flatten(),
        2 => tokio::time::timeout(wait / 4, lock.acquire_many(n)).await.ok().and_then(|r| r.ok()),
        _ => lock.acquire_many_timeout(n, wait).await.ok(),
    }
}

/// The owner token of a guard, as the store knows it.
fn guard_token<K: GuardKind>(guard: &Guard<K>) -> u128 {
    guard.token().as_u128()
}
