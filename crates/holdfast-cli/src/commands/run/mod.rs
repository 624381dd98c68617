//! `holdfast run --key K -- CMD [ARGS]`: run a command while holding a lock.
//!
//! The lock is taken first; CMD then runs with `HOLDFAST_KEY` and
//! `HOLDFAST_FENCE` set, while the library renews the lease. Three things can
//! end the run:
//!
//! - CMD exits: the lock is released and CMD's status is passed through
//!   (128 + signal number if a signal killed it).
//! - The lease runs out: CMD is stopped before the store could grant the key
//!   to anyone else, and holdfast exits [`LEASE_LOST`]. Once renewal has not
//!   succeeded and the lease has `--kill-after` plus a margin left (or the
//!   lease is known lost), CMD gets SIGTERM; `--kill-after` later, SIGKILL
//!   goes to CMD and anything left of its process group, landing the margin
//!   before the lease's local deadline. [`timing`] has the rule and the
//!   limits on `--kill-after`.
//! - holdfast gets SIGINT, SIGTERM or SIGHUP: the signal is forwarded to CMD,
//!   holdfast keeps holding (and renewing) the lock until CMD has exited, then
//!   releases it and passes CMD's status through.
//!
//! CMD runs in a process group of its own and signals go to the whole group,
//! so a lost lease stops a script's children too. On a terminal, CMD's group
//! becomes the terminal's foreground group while it runs, as a shell runs a
//! job ([`terminal`] has the details and the one exception, pipelines). If
//! holdfast itself is killed, the kernel kills CMD ([`child`]).

mod busy;
mod child;
mod hold;
mod procfs;
mod terminal;
pub(crate) mod timing;

use std::time::Duration;

use holdfast::{Guard, GuardKind, Lock};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};

use self::child::{Setup, Target};
pub(crate) use self::hold::Role;
use self::terminal::Placement;
use self::timing::StopTiming;
use crate::cli::{ENV_BACKEND, ENV_FENCE, ENV_KEY, RunArgs};
use crate::duration;
use crate::exit::{BUSY, Failure, INTERNAL, LEASE_LOST, NOT_EXECUTABLE, NOT_FOUND};

/// Runs `args.command` under the lock `args.key` (without one, holds the
/// lock until a signal); returns the exit code.
pub async fn run(args: RunArgs) -> Result<u8, Failure> {
    run_as(args, Role::Lock).await
}

/// [`run`] for a lock or for an election's campaign (`role`).
pub(crate) async fn run_as(args: RunArgs, role: Role) -> Result<u8, Failure> {
    let program = args.command.split_first();
    // Everything that can be checked without I/O, before any I/O.
    holdfast::LockKey::new(args.key.as_str())?;
    holdfast::LockOptions::check_ttl(args.ttl)?;
    let max_hold = args.max_hold.map(|d| duration::non_zero("--max-hold", d)).transpose()?;
    // A --kill-after that cannot fit --ttl is refused before any I/O; the
    // timing used is fitted to the lease the store gives, once granted.
    StopTiming::new(args.ttl, args.kill_after)?;
    let url = timing::zk_session_fitting(&args.backend.url_for_locking()?, args.ttl);
    if args.backend.is_implicit() && !args.quiet {
        // The same command on two machines would exclude nothing between
        // them: say so, once, before anything runs.
        eprintln!("{}", implicit_store_note(&url));
    }

    if let Some(addr) = args.metrics_addr {
        crate::metrics_http::serve(addr).await?;
    }
    // Connecting holds nothing yet: until here SIGINT/SIGTERM simply end holdfast.
    let client = super::connect(&url, args.label.clone()).await?;
    let signals = Signals::new()?;
    let job = JobSignals::new()?;
    // A campaign asks for grants in campaign order where the store can queue.
    let fair = args.fair || (matches!(role, Role::Leader { .. }) && client.capabilities().fair);
    let under = Under { args: &args, client: &client, signals, job, program, role: &role };
    // The same supervision whatever the grant: a mutex, permits or a read lock.
    match (args.permits, args.shared) {
        (Some(permits), _) => under.run(limits(client.semaphore(args.key.as_str(), permits), &args, max_hold)).await,
        (None, true) => under.run(limits(client.rwlock(args.key.as_str()).read(), &args, max_hold)).await,
        (None, false) => under.run(limits(client.mutex(args.key.as_str()).fair(fair), &args, max_hold)).await,
    }
}

/// The lock with the run's TTL and hold cap.
fn limits<K: GuardKind>(lock: Lock<K>, args: &RunArgs, max_hold: Option<Duration>) -> Lock<K> {
    let lock = lock.ttl(args.ttl);
    match max_hold {
        Some(max_hold) => lock.max_hold(max_hold),
        None => lock,
    }
}

/// What running CMD under a grant needs.
struct Under<'a> {
    args: &'a RunArgs,
    client: &'a holdfast::Client,
    signals: Signals,
    job: JobSignals,
    /// CMD and its arguments; `None`: hold until a signal.
    program: Option<(&'a String, &'a [String])>,
    role: &'a Role,
}

impl Under<'_> {
    /// Waits for the grant of `mutex`, then runs CMD under it.
    async fn run<K: GuardKind>(self, mutex: Lock<K>) -> Result<u8, Failure> {
        let Under { args, client, mut signals, mut job, program, role } = self;
        tracing::debug!(key = %args.key, "waiting for the lock");
        let acquire = async {
            Ok::<_, Failure>(match args.wait {
                Some(wait) if wait.is_zero() => match mutex.try_acquire().await? {
                    Some(guard) => Waited::Granted(guard),
                    None => Waited::Busy(None),
                },
                Some(wait) => match mutex.acquire_timeout(wait).await {
                    Ok(guard) => Waited::Granted(guard),
                    Err(holdfast::Error::Timeout { waited, .. }) => Waited::Busy(Some(waited)),
                    Err(other) => return Err(other.into()),
                },
                None => Waited::Granted(mutex.acquire().await?),
            })
        };
        let mut waiting = busy::Waiting::new(args.quiet);
        let waited = tokio::select! {
            waited = acquire => waited?,
            () = waiting.show(client, &args.key) => unreachable!("the waiting line never ends"),
            signo = signals.recv() => Waited::Signal(signo),
        };
        waiting.clear();
        let guard = match waited {
            Waited::Granted(guard) => guard,
            Waited::Busy(waited) => {
                let code = args.busy_exit.unwrap_or(BUSY);
                return Err(busy::failure(client, &args.key, waited, code, args.quiet).await);
            }
            Waited::Signal(signo) => {
                eprintln!("holdfast: got signal {signo} while waiting for lock {:?}; giving up", args.key);
                // The dropped acquire releases an attempt that raced the signal in the
                // background; give that a moment before the runtime stops (past it, such
                // a grant expires after --ttl).
                tokio::time::sleep(Duration::from_millis(200)).await;
                return Ok(128 + signo);
            }
        };
        tracing::info!(key = %args.key, fence = guard.fence(), "lock acquired");
        if guard.is_lost() {
            // Lost between the grant and here (a stalled process): do not start CMD unprotected.
            eprintln!("holdfast: lease on lock {:?} was lost before the command could start", args.key);
            let _ = tokio::time::timeout(RELEASE_AFTER_LOSS, guard.release()).await;
            return Ok(LEASE_LOST);
        }
        // The store may vouch for less than --ttl (a fallback chain, ZooKeeper):
        // fit the stop timing to that lease, or refuse before CMD starts.
        let left = guard.valid_until().saturating_duration_since(std::time::Instant::now());
        let timing = match StopTiming::fit_lease(args.ttl, args.kill_after, left) {
            Ok(fitted) => fitted,
            Err(failure) => {
                release(guard, &args.key).await;
                return Err(failure);
            }
        };
        tracing::debug!(?timing, ?left, "stop timing for the lease");
        let Some((program, program_args)) = program else {
            return hold::hold(guard, &mut signals, &args.key, role).await;
        };

        let mut placement = Placement::choose();
        let setup = match &placement {
            Placement::OwnGroup => Setup { own_group: true, terminal: None },
            Placement::Foreground(terminal) => match terminal.for_command() {
                Ok(tty) => Setup { own_group: true, terminal: Some(tty) },
                // No descriptor to hand over: CMD stays where it can still read the terminal.
                Err(_) => {
                    placement = Placement::SharedGroup;
                    Setup { own_group: false, terminal: None }
                }
            },
            Placement::SharedGroup => Setup { own_group: false, terminal: None },
        };
        let mut command = Command::new(program);
        command
            .args(program_args)
            .env(ENV_KEY, &args.key)
            .env(ENV_FENCE, guard.fence().to_string())
            .kill_on_drop(false);
        let mut child = match child::spawn(command, setup).await {
            Ok(child) => child,
            Err(e) => {
                release(guard, &args.key).await;
                // As shells do: 127 when not found, 126 when found but not executable.
                return Err(if e.kind() == std::io::ErrorKind::NotFound {
                    Failure::new(NOT_FOUND, format!("{program}: command not found"))
                } else {
                    Failure::new(NOT_EXECUTABLE, format!("{program}: {e}"))
                });
            }
        };
        let pid = match child.id() {
            Some(pid) => Pid::from_raw(pid as i32),
            None => return Err(Failure::new(INTERNAL, "the command's process id is unknown")),
        };
        let target = match &mut placement {
            Placement::SharedGroup => Target::Process(pid),
            Placement::OwnGroup => Target::Group(pid),
            Placement::Foreground(terminal) => {
                terminal.started(pid);
                Target::Group(pid)
            }
        };

        let expiring = guard.expiring(timing.warning());
        tokio::pin!(expiring);
        // holdfast stopped itself with CMD's job (Ctrl-Z) and waits to be continued.
        let mut suspended = false;
        // A stop in CMD's group that its leader survives sends holdfast no SIGCHLD.
        let mut stop_poll = tokio::time::interval(terminal::STOP_POLL);
        stop_poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let on_terminal = matches!(placement, Placement::Foreground(_));
        let status = loop {
            tokio::select! {
                biased;
                status = child.wait() => break status,
                _ = &mut expiring => {
                    if guard.is_lost() {
                        let why = guard.lost_reason().map(|r| format!(" ({r})")).unwrap_or_default();
                        eprintln!(
                            "holdfast: lease on lock {:?} lost while the command ran{why}; stopping it (SIGTERM, \
                             SIGKILL after {})",
                            args.key,
                            duration::show(timing.kill_after)
                        );
                    } else {
                        eprintln!(
                            "holdfast: lease on lock {:?} could not be renewed and will be lost within {}; stopping the \
                             command (SIGTERM, SIGKILL after {})",
                            args.key,
                            duration::show(timing.warning()),
                            duration::show(timing.kill_after)
                        );
                    }
                    child::stop(&mut child, target, timing.kill_after, timing.margin).await;
                    drop(placement);
                    // Tidy up if the store still has the grant; never hang on a store that is down.
                    let _ = tokio::time::timeout(RELEASE_AFTER_LOSS, guard.release()).await;
                    return Ok(LEASE_LOST);
                }
                signo = signals.recv() => {
                    let sig = Signal::try_from(i32::from(signo)).unwrap_or(Signal::SIGTERM);
                    if matches!(target, Target::Process(_)) && sig == Signal::SIGINT {
                        tracing::debug!("SIGINT not forwarded: the terminal delivers it to the command's group");
                    } else {
                        tracing::info!(signo, "forwarding signal to the command");
                        target.send(sig);
                    }
                }
                _ = job.child.recv(), if !suspended => {
                    if let Placement::Foreground(terminal) = &placement
                        && terminal::is_stopped(pid)
                    {
                        suspended = terminal.command_stopped(pid);
                    }
                }
                _ = stop_poll.tick(), if on_terminal && !suspended => {
                    if let Placement::Foreground(terminal) = &placement
                        && terminal.command_group_stopped()
                    {
                        tracing::debug!("a member of the command's group is stopped");
                        suspended = terminal.command_stopped(pid);
                    }
                }
                _ = job.cont.recv(), if suspended => {
                    if let Placement::Foreground(terminal) = &placement {
                        terminal.resumed(pid);
                    }
                    suspended = false;
                }
            }
        };
        drop(placement);
        let status = status.map_err(|e| Failure::new(INTERNAL, format!("waiting for the command: {e}")))?;
        // A release that finds the grant gone, with no loss seen before, means
        // the store dropped it (a forced release) before its deadline.
        let lost_before = guard.lost_reason();
        match guard.release().await {
            Ok(()) => Ok(child::exit_code(status)),
            Err(holdfast::Error::Lost { .. }) => {
                let why = lost_before.unwrap_or(holdfast::LostReason::Removed);
                eprintln!("holdfast: lease on lock {:?} was lost before the command finished: {why}", args.key);
                Ok(LEASE_LOST)
            }
            Err(e) => {
                // The command ran under the lock; only the release failed, and the lease will expire.
                eprintln!("holdfast: warning: could not release lock {:?} (it expires within its TTL): {e}", args.key);
                Ok(child::exit_code(status))
            }
        }
    }
}

/// How long to try releasing a lost lease before exiting anyway.
const RELEASE_AFTER_LOSS: Duration = Duration::from_secs(1);

/// The note `run` prints when no store was named (see `run --help`).
fn implicit_store_note(url: &str) -> String {
    let path = url.strip_prefix("sqlite://").unwrap_or(url);
    format!(
        "holdfast: note: no --backend given, so the lock is kept in {path}, which excludes only processes on this \
         machine; to lock across machines pass --backend URL or set {ENV_BACKEND} (an explicit --backend sqlite://PATH, \
         or --quiet, silences this note)"
    )
}

/// How waiting for the lock ended.
enum Waited<G> {
    Granted(G),
    /// Still busy when `--wait` ran out, after this long (`None`: one try).
    Busy(Option<Duration>),
    /// holdfast got this signal.
    Signal(u8),
}

async fn release<K: GuardKind>(guard: Guard<K>, key: &str) {
    if let Err(e) = guard.release().await {
        eprintln!("holdfast: warning: could not release lock {key:?}: {e}");
    }
}

fn listen(kind: SignalKind) -> Result<tokio::signal::unix::Signal, Failure> {
    signal(kind).map_err(|e| Failure::new(INTERNAL, format!("cannot listen for signals: {e}")))
}

/// SIGINT, SIGTERM and SIGHUP: they end a wait for the lock, and are
/// forwarded to CMD once it runs.
pub(crate) struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

/// SIGCHLD (CMD stopped?) and SIGCONT (holdfast continued), for job control on a terminal.
struct JobSignals {
    child: tokio::signal::unix::Signal,
    cont: tokio::signal::unix::Signal,
}

impl JobSignals {
    fn new() -> Result<Self, Failure> {
        Ok(JobSignals {
            child: listen(SignalKind::child())?,
            cont: listen(SignalKind::from_raw(Signal::SIGCONT as i32))?,
        })
    }
}

impl Signals {
    pub(crate) fn new() -> Result<Self, Failure> {
        Ok(Signals {
            int: listen(SignalKind::interrupt())?,
            term: listen(SignalKind::terminate())?,
            hup: listen(SignalKind::hangup())?,
        })
    }

    /// The next SIGINT, SIGTERM or SIGHUP, as its number.
    pub(crate) async fn recv(&mut self) -> u8 {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT as u8,
            _ = self.term.recv() => Signal::SIGTERM as u8,
            _ = self.hup.recv() => Signal::SIGHUP as u8,
        }
    }
}
