//! The long `--help` texts of the subcommands (after the options).

pub(super) const VERIFY_HELP: &str = "\
Each worker loops: acquire, a critical section of writes to a fenced register (each write
first checks that the lease is still believed held), release. The register (in this process)
accepts a write whose fence is at least the highest it accepted (equal only from the same
grant) and refuses the rest: a refused write is a stale write that fencing stopped.

Faults (--faults, comma-separated, injected one at a time, round robin, on the current holder):
    kill    SIGKILL the holder; a new worker takes its lane. Measures the time the key stood
            free after the death (must be at most TTL + 1s).
    pause   SIGSTOP the holder for 1.5 x TTL + 200ms, then SIGCONT (a GC pause; on etcd, whose
            leases are whole seconds and at least 2s, 1.5 x that lease). Every other pause
            stops the holder right after it checked its lease and before its write reaches
            the register, so the write arrives late and the fence must refuse it.
    slow    SIGSTOP the holder for 0.6 x TTL: its renewal runs late (the lease may survive).
With --spawn STORE (verify starts the server on loopback), server faults too:
    restart SIGKILL the server, start it again on its data. Without persistence (--spawn redis)
            the locks and fence counters are gone: what breaks then is reported as that
            store's documented weakness and does not fail the run.
    leader  SIGKILL the leader of a 3-member ensemble (--spawn etcd3 | zookeeper3); an etcd
            member is started again after one TTL; ZooKeeper's leader is killed once per run
            (verify cannot start a ZooKeeper member again; two members keep the quorum).
    partition  the holder keeps running but its traffic to the store stops (each worker
            reaches the server through a fault proxy of its own; this one blackholes for
            1.5 x the store's lease + 200ms, then drops the stuck connections and heals).
            --spawn of a one-server store (redis, redis-durable, postgres, mysql, etcd,
            zookeeper). Not network namespaces: the proxy cuts one client, not a host.

All times are CLOCK_MONOTONIC, one clock for every process on the machine: each event is
timed by the process that saw it (a worker for its grants, lost() and releases; the parent
for faults and the register's decisions), so a paused worker's events keep their true times.

Primitives (--primitive): mutex (never two holders); semaphore (--permits N, default 2; grants
of 1 or 2 permits; never more than N permits' weight held at once); rwlock (a third of the grants
write, the rest read; a writer holds alone, readers share); election (campaign, resign, lose;
at most one leader at a time, terms increasing). Exclusive holders (mutex, writers, leaders) write
to the register; shared ones (readers, permits) check their lease instead.

While it runs, a progress line on stderr when stderr is a terminal (nothing otherwise).
Findings within a documented weakness of the store (a restart without persistence) are counted
apart, named in each row, and do not fail the run.

Output (--out DIR, default a new temp dir, kept): history.jsonl, report.txt, report.html.
Exit: 0 every guarantee held; 1 a guarantee broke (the report says which, with the events
around it); 64 usage; 69 the store is unreachable.

Examples:
    holdfast verify --backend redis://127.0.0.1:6379 --workers 4 --duration 60s --ttl 2s --faults kill,pause
    holdfast verify --backend sqlite:///tmp/v.db --duration 10s --ttl 1s --faults kill,pause,slow --out ./v
    holdfast verify --backend redis://127.0.0.1:6379 --primitive semaphore --permits 3";

pub(super) const RUN_HELP: &str = "\
CMD runs with HOLDFAST_KEY (the key) and HOLDFAST_FENCE (the grant's fencing token) set.
holdfast renews the lease while CMD runs and exits with CMD's status. SIGINT, SIGTERM and
SIGHUP sent to holdfast are forwarded to CMD; the lock is released once CMD has exited.
The lock still busy when --wait runs out: exit 75 (--busy-exit CODE to choose another, as
flock -E does); the message names the holder (label, fence, TTL left), and --quiet drops it so
that a skipped cron run mails nothing. On a terminal, a line shows who holds the lock while
holdfast waits. The store failing: exit 69.

With neither --backend nor HOLDFAST_BACKEND, the lock is kept in a local SQLite file
($XDG_STATE_HOME/holdfast/locks.db): it keeps out only processes on this machine, and run says so
in one line on stderr. Name a shared store (redis://, etcd://, postgres://, ...) to lock across
machines; an explicit --backend sqlite://PATH (or --quiet) silences the note. holdfast never
creates a directory named in a URL: a missing one is an error naming it (exit 69).

A lease that runs out stops CMD before anyone else can get the lock: once renewal has failed
and the lease has --kill-after plus a margin left, CMD gets SIGTERM; --kill-after later CMD
and its process group get SIGKILL, the margin before the lease ends (margin: min(25ms, ttl/10)
+ ttl/50). holdfast then exits 74. --kill-after defaults to min(5s, ttl/4) and, plus the
margin, must be at most half of --ttl (renewal runs every ttl/3; more would stop CMD between
renewals). A store may vouch for less than --ttl at a time (a fallback chain: at most half its
mode TTL; ZooKeeper: 3/4 of its session): the same rule then applies to that lease, read when
it is granted, so the default --kill-after is min(5s, lease/4), and a --kill-after that does not
fit the lease is a usage error (64) naming the value that fits, before CMD starts. If holdfast
itself is killed, the kernel kills CMD (SIGKILL; Linux).

Without CMD, holdfast holds the lock until SIGINT, SIGTERM or SIGHUP (as `etcdctl lock` does):
it prints `holding \"KEY\" with fence F` on stdout, then releases the lock and exits 0 on the
signal (74 if the lease is lost first).

CMD runs in a process group of its own; signals go to the whole group, so a script's children
are stopped too. On a terminal CMD's group becomes the foreground group, as a shell runs a job:
CMD can read the terminal and gets Ctrl-C and Ctrl-Z. Exception: when holdfast shares its
process group with other processes (a pipeline such as `holdfast run ... | less`), CMD stays in
that group and signals from holdfast go to CMD alone.

ZooKeeper frees a dead holder's lock when its session expires: on zk:// URLs without a
session_timeout option, holdfast asks for a session timeout of --ttl. The server clamps it to
[2, 20] x its tickTime (4s to 40s by default): the lock of a killed holdfast is freed after
2 x tickTime when --ttl is shorter than that, and after 20 x tickTime when it is longer.

Examples:
    holdfast run --key nightly-report --ttl 30s -- ./report.sh
    holdfast run --backend redis://locks:6379 --key deploy --wait 0 -- make deploy   # skip if busy
    */5 * * * * holdfast run -q --busy-exit 0 --backend redis://locks:6379 --key sync --wait 0 -- ./sync.sh
    holdfast run --backend redis://127.0.0.1:6379 --key k --wait 10s -- sh -c 'echo $HOLDFAST_FENCE'";

pub(super) const BENCH_HELP: &str = "\
Scale workloads (instead of the default ones unless --workloads is given too):
    --held N    one client holds N leases (--lease-ttl, default 6s) for --duration (default five
                renewal periods) while a probe on the same client takes and frees another key every
                20 ms; --churn adds 16 tasks acquiring and releasing other keys at full speed.
                Reports acquisition cost at the first and last 1,000 leases, the probe's p50/p99/max
                against an idle client, leases lost, renew calls and their size and length, store
                commands per period, memory per held lease, and releasing them all.
    --hot W     W tasks loop acquire, hold --hold-ms (default 0.2), release on one key for --duration
                (default 20s), split over --procs P processes (this binary, re-executed); --fair for
                FIFO locks, --hot-permits N for a semaphore of N permits, one a task. Reports acquisitions/s, library calls, store requests and server commands
                per acquisition, tasks that never acquired, the longest wait, busiest/least busy task,
                and how often the releasing task takes the key again.

Examples:
    holdfast bench --backend redis://127.0.0.1:6379 --held 100000 --churn
    holdfast bench --backend sqlite:///tmp/bench.db --hot 1024 --procs 4 --json";

pub(super) const RELEASE_HELP: &str = "\
Removes every lease of each KEY (a mutex's holder, a semaphore's permits, readers), whoever
holds them, and prints the fences removed (or that the key was free). The key can be taken
again at once, with a higher fence; waiters are woken. A holder that is still alive is not
stopped: its next renewal fails and its lost() fires (`holdfast run` then stops its command),
and a resource that checks fences refuses its writes. Without --force: exit 64.

Examples:
    holdfast list jobs/
    holdfast release --force jobs/nightly-report";

pub(super) const ELECT_HELP: &str = "\
An election is a lock: NAME is its key, the leader's value its holder label, the term its fence
(strictly increasing across leaders), so `holdfast status NAME` shows the leader too. Candidates
lead in campaign order where the store queues waiters (Redis in fair mode, etcd, ZooKeeper).

With CMD, CMD runs while this candidate leads, supervised as by `run` (HOLDFAST_KEY, and
HOLDFAST_FENCE = the term; leadership lost: CMD is stopped, exit 74). Without CMD, holdfast prints
`leading \"NAME\" in term T` and leads until SIGINT, SIGTERM or SIGHUP, then resigns (exit 0).

--observe campaigns for nothing: it prints `term T: VALUE` for each new leader, until a signal.
It reads the leader every 100ms: a term that begins and ends between two reads is not shown.

Examples:
    holdfast elect --backend etcd://127.0.0.1:2379 scheduler --value $(hostname) -- ./schedule.sh
    holdfast elect --backend etcd://127.0.0.1:2379 --observe scheduler";
