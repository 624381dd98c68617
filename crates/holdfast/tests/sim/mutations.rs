//! Mutation tests: the simulation catches real bugs. Each test puts back one
//! bug the client core had, or could easily have, in a copy of the sources,
//! and shows that seeded fault runs find it within 1,000 seeds: the
//! cancelled cleanup found in review, a renewer that ignores a failed
//! renewal, a deadline counted from the reply instead of the request, no
//! drift margin, RedLock without its fence write-back or counting itself
//! granted before the write-back landed, and a fallback chain whose new
//! epoch is usable at once (the models' variants); the bugs of shared
//! leases are in [`share_mutations`](super::share_mutations).
//!
//! # Why source patches
//!
//! The library has no switches for bugs, and must not grow any: a bug behind
//! a flag is code that ships. So each mutation is a textual patch to one
//! source file of a copy of the workspace in a temporary directory
//! (the sources and manifests of holdfast, the testkit and the verify
//! engine the testkit re-exports, the lockfile, and a
//! root manifest derived from the real one), plus a small runner crate
//! ([`mutant_runner`]) that runs the seeds against the mutated copy. The
//! patch asserts that its original text occurs exactly once, so a test fails
//! loudly, rather than pass on unmutated code, when the code it patches
//! moves or changes.
//!
//! Builds share `<target dir>/mutants` (the dev profile, whose overrides
//! optimise tokio): dependencies compile once, and each mutant recompiles
//! only holdfast, the testkit, the verify engine and the runner, unoptimised
//! ([`UNOPTIMISED`]: about 10 s each on 2 cores, against 30-60 s at the
//! workspace's opt-level 2; the seeds, which stop at the first failing one,
//! still run in under 2 s). They are `--offline`, with the versions of the
//! repository's lockfile; not `--locked`, which refuses the lockfile's
//! pruning of the crates left out. The tests take turns (one lock): they
//! share that build directory, and the runner uses every core.
//!
//! The clean baseline of the `default` config is `seeds.rs` (`many_seeds`);
//! `unmutated_copy_is_clean` (ignored: one more build and 2,000 seeds)
//! checks that the copy itself, unmutated, passes every seed of every config
//! used here, the runner's own `cleanup` config included.
//!
//! # Adding a mutation
//!
//! Add a `#[test]` that calls [`catch`] with a [`Mutation`]: the file, its
//! exact original text (enough of it to be unique) and the mutated text,
//! the runner's config to run (see [`mutant_runner`]), and the guarantees
//! whose breach counts as catching it. If the seeds do not find the bug,
//! find out why (`MUTANTS_KEEP=1` keeps the mutant's workspace; its runner's
//! `all` mode counts the failing seeds) before tuning a config: a new config
//! is a new arm in the runner's `config`, added to [`CONFIGS`], and must
//! pass `unmutated_copy_is_clean`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[allow(dead_code, reason = "the runner's main runs in the mutant's own binary; here it is only checked")]
#[path = "mutant_runner.rs"]
mod mutant_runner;

/// Seeds each mutant runs: the bar is finding the bug within these.
const SEEDS: u64 = 1000;

/// The guarantees of the history checker: any breach catches a safety bug.
pub(super) const SAFETY: &[&str] = &["exclusion", "fencing", "stale write", "lost first"];

/// The runner's configs the mutations use (`unmutated_copy_is_clean` runs each).
const CONFIGS: &[&str] = &["default", "cleanup", "redlock", "fallback", "shares"];

/// The crates copied into the mutant's workspace, from the repository root.
const COPIED: &[&str] = &["crates/holdfast", "crates/holdfast-testkit", "crates/holdfast-verify"];

/// One bug to put back.
pub(super) struct Mutation {
    pub(super) name: &'static str,
    /// The file to patch, from the repository root.
    pub(super) file: &'static str,
    /// Text that must occur exactly once in `file`.
    pub(super) original: &'static str,
    pub(super) mutated: &'static str,
    /// The runner's config, one of [`CONFIGS`].
    pub(super) config: &'static str,
    /// The guarantees whose breach counts as finding this bug.
    pub(super) expect: &'static [&'static str],
}

/// What the runner reported for a mutant.
#[derive(Debug)]
struct Found {
    seed: u64,
    guarantee: String,
    what: String,
}

/// The mutation tests take turns: they share one build directory and the
/// runner uses every core.
static TURN: Mutex<()> = Mutex::new(());

fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.ancestors().nth(2).expect("crates/holdfast is two levels below the repository root").to_path_buf()
}

/// `<target dir>/mutants`: the target directory of this build (where
/// CARGO_TARGET_DIR, a config's `target-dir` or `<repo>/target` put it),
/// found from `CARGO_TARGET_TMPDIR` (`<target dir>/tmp`), so the mutants'
/// dependencies stay built between runs of the same checkout.
fn mutants_target() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().expect("CARGO_TARGET_TMPDIR is <target dir>/tmp").join("mutants")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn write(path: &Path, text: &str) {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    }
    std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("creating {}: {e}", to.display()));
    let entries = std::fs::read_dir(from).unwrap_or_else(|e| panic!("listing {}: {e}", from.display()));
    for entry in entries {
        let entry = entry.unwrap_or_else(|e| panic!("listing {}: {e}", from.display()));
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type().unwrap_or_else(|e| panic!("reading {}: {e}", src.display()));
        if kind.is_dir() {
            copy_dir(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap_or_else(|e| panic!("copying {}: {e}", src.display()));
        }
    }
}

/// The dependency names and the package name a manifest mentions.
fn manifest_names(manifest: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut section = "";
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
            continue;
        }
        let Some((key, value)) = line.split_once('=') else { continue };
        if section.contains("dependencies") {
            names.push(key.split('.').next().unwrap_or(key).trim().to_owned());
        } else if section == "[package]" && key.trim() == "name" {
            names.push(value.trim().trim_matches('"').to_owned());
        }
    }
    names
}

/// The root manifest of the mutant's workspace: the real one with
/// `members` = the copied crates and the runner, and without the profile
/// overrides of packages only the crates left out use (cargo warns about
/// overrides that match nothing). Everything else (`[workspace.package]`,
/// `[workspace.dependencies]`, lints, profiles) is kept as written.
fn workspace_manifest(root: &Path) -> String {
    let text = read(&root.join("Cargo.toml"));
    // Sections, each with the comment lines just above its header.
    let mut sections: Vec<Vec<&str>> = vec![Vec::new()];
    for line in text.lines() {
        if line.starts_with('[') {
            let current = sections.last_mut().expect("there is always a section");
            let comments = current.iter().rev().take_while(|l| l.starts_with('#')).count();
            let moved = current.split_off(current.len() - comments);
            sections.push(moved);
        }
        sections.last_mut().expect("there is always a section").push(line);
    }
    let members_line = |l: &&str| l.trim_start().starts_with("members");
    let members: Vec<&str> = text.lines().filter(members_line).collect();
    assert_eq!(members.len(), 1, "the root Cargo.toml should have one `members` line, found {members:?}");
    let left_out: Vec<String> = members[0]
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|m| !COPIED.contains(m))
        .flat_map(|m| manifest_names(&read(&root.join(m).join("Cargo.toml"))))
        .collect();
    let kept: Vec<String> =
        COPIED.iter().flat_map(|m| manifest_names(&read(&root.join(m).join("Cargo.toml")))).collect();
    let only_left_out = |name: &str| left_out.iter().any(|n| n == name) && !kept.iter().any(|n| n == name);
    let mut out = String::new();
    for section in sections {
        let header = section.iter().find(|l| l.starts_with('[')).copied().unwrap_or("");
        let package = header.strip_prefix("[profile.").and_then(|h| h.split(".package.").nth(1));
        if package.is_some_and(|p| only_left_out(p.trim_end_matches(']').trim_matches('"'))) {
            continue;
        }
        for line in section {
            if members_line(&line) {
                let list: Vec<String> = COPIED.iter().map(|m| format!("{m:?}")).collect();
                out.push_str(&format!("members = [{}, \"crates/mutant-runner\"]\n", list.join(", ")));
            } else {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

const RUNNER_MANIFEST: &str = r#"[package]
name = "mutant-runner"
version = "0.0.0"
edition.workspace = true
publish = false

[dependencies]
# Both by path, holdfast without default features (the simulation needs no store).
holdfast.workspace = true
holdfast-testkit.workspace = true
"#;

/// Copies the workspace into `dir`, with `mutation` applied (none: unmutated).
fn make_workspace(root: &Path, dir: &Path, mutation: Option<&Mutation>) {
    for krate in COPIED {
        for part in ["src", "examples"] {
            let from = root.join(krate).join(part);
            if from.is_dir() {
                copy_dir(&from, &dir.join(krate).join(part));
            }
        }
        write(&dir.join(krate).join("Cargo.toml"), &read(&root.join(krate).join("Cargo.toml")));
    }
    write(&dir.join("Cargo.lock"), &read(&root.join("Cargo.lock")));
    write(&dir.join("Cargo.toml"), &workspace_manifest(root));
    write(&dir.join("crates/mutant-runner/Cargo.toml"), RUNNER_MANIFEST);
    write(&dir.join("crates/mutant-runner/src/main.rs"), include_str!("mutant_runner.rs"));
    if let Some(m) = mutation {
        assert!(COPIED.iter().any(|c| m.file.starts_with(c)), "{}: {} is not in a copied crate", m.name, m.file);
        let path = dir.join(m.file);
        let source = read(&path);
        let times = source.matches(m.original).count();
        assert_eq!(
            times, 1,
            "{}: the original text occurs {times} times in {} (expected once): the code moved or changed; \
             update the mutation to the new code\n--- original ---\n{}",
            m.name, m.file, m.original
        );
        write(&path, &source.replacen(m.original, m.mutated, 1));
    }
}

/// The crates each mutant recompiles, built unoptimised: a mutant's seeds
/// stop at the first failing one, so they run in a second even so, while
/// the workspace's opt-level 2 for these crates (what the real simulation
/// tests need) doubled each mutant's build.
const UNOPTIMISED: &[&str] = &["holdfast-lock", "holdfast-testkit", "holdfast-verify"];

/// Builds the runner of the workspace in `dir`; its binary.
fn build(dir: &Path, target: &Path) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["build", "--offline", "--bin", "mutant-runner"])
        .args(UNOPTIMISED.iter().flat_map(|p| ["--config".to_owned(), format!("profile.dev.package.{p}.opt-level=0")]))
        .arg("--manifest-path")
        .arg(dir.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", target)
        .env("CARGO_INCREMENTAL", "0")
        .output()
        .expect("running cargo build for the mutant");
    assert!(
        out.status.success(),
        "building the mutant failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    target.join("debug").join(format!("mutant-runner{}", std::env::consts::EXE_SUFFIX))
}

/// Runs seeds `0..SEEDS` with `config`; the first failing seed, if any.
fn run(runner: &Path, config: &str) -> Option<Found> {
    let out = Command::new(runner)
        .args([config, &SEEDS.to_string()])
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", runner.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or("");
    let fields: Vec<&str> = line.splitn(4, '\t').collect();
    match (out.status.code(), fields.as_slice()) {
        (Some(0), ["clean", n]) if n.parse() == Ok(SEEDS) => None,
        (Some(1), ["found", seed, guarantee, what]) => Some(Found {
            seed: seed.parse().unwrap_or_else(|e| panic!("the runner's seed {seed:?}: {e}")),
            guarantee: guarantee.to_string(),
            what: what.to_string(),
        }),
        _ => panic!(
            "the runner did not report (exit {}): stdout {stdout:?}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// Builds a workspace with `mutation` applied and runs its seeds; the first
/// failing seed, the build time and the run time.
fn build_and_run(mutation: Option<&Mutation>, configs: &[&str]) -> (Vec<Option<Found>>, Duration, Duration) {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let root = repo_root();
    let dir = tempfile::Builder::new().prefix("holdfast-mutant-").tempdir().expect("a temporary directory");
    make_workspace(&root, dir.path(), mutation);
    // MUTANTS_KEEP=1: keep the workspace, to look at the mutant or run its
    // runner again (`<target dir>/mutants/debug/mutant-runner`).
    let (dir, _removed_on_drop) = match std::env::var_os("MUTANTS_KEEP") {
        Some(_) => (dir.keep(), None),
        None => (dir.path().to_owned(), Some(dir)),
    };
    eprintln!("mutant workspace: {}", dir.display());
    let started = Instant::now();
    let runner = build(&dir, &mutants_target());
    let built = started.elapsed();
    let found = configs.iter().map(|c| run(&runner, c)).collect();
    (found, built, started.elapsed() - built)
}

/// Puts `m` back and asserts the seeds find it by a breach of one of the
/// guarantees it expects.
pub(super) fn catch(m: &Mutation) {
    assert!(CONFIGS.contains(&m.config), "{}: config {:?} is not one of {CONFIGS:?}", m.name, m.config);
    let (found, built, ran) = build_and_run(Some(m), &[m.config]);
    let found = found.into_iter().next().flatten();
    let took = format!("built in {:.1?}, seeds run in {:.1?}", built, ran);
    let Some(f) = found else {
        panic!("{}: not found within {SEEDS} seeds of the `{}` config ({took})", m.name, m.config);
    };
    eprintln!("{}: found at seed {} ({} config): {} broke: {} ({took})", m.name, f.seed, m.config, f.guarantee, f.what);
    assert!(
        m.expect.contains(&f.guarantee.as_str()),
        "{}: seed {} broke {:?} ({}), not one of the guarantees expected of this bug {:?}",
        m.name,
        f.seed,
        f.guarantee,
        f.what,
        m.expect
    );
}

/// The fault found in review: an attempt abandoned by dropping its future
/// must still be released (on a task of its own). Mutant: the cleanup's
/// drop forgets the attempt, so a grant the store made for it stays until
/// its TTL, and the stores still hold it after the cleanup window. The
/// runner's `cleanup` config fails about 1 seed in 100 of this mutant;
/// `RunConfig::long_leases()` only about 1 in 600 (too few to count on
/// within 1,000 seeds; see the runner's `config`).
#[test]
fn cancelled_cleanup() {
    catch(&Mutation {
        name: "cancelled cleanup",
        file: "crates/holdfast/src/lock.rs",
        original: "        if let Some(release) = self.take() {
            if release.spawn().is_none() {
                tracing::debug!(\"no runtime to release an abandoned attempt in; its lease will expire\");
            }
        }",
        mutated: "        // MUTANT: the abandoned attempt is forgotten, not released.
        self.armed.take();",
        config: "cleanup",
        expect: &["held after cleanup"],
    });
}

/// A renewer that ignores a failed renewal: a renew call that fails (an
/// error, or no reply before the earliest deadline in the slice) counts as
/// renewed, so a client cut off from its store goes on believing it holds
/// the key after the store let it go.
///
/// The other failure, the store answering that a lease is gone, cannot be
/// mutated usefully here: with the store keeping its promise (its data and
/// its clock within the margin), that answer never arrives before the
/// client's own deadline has passed (a probe on that branch saw it taken in
/// none of 1,000 default seeds, 300 long-lease and 300 RedLock seeds); it is
/// taken only when a store loses leases early (a restart without its data),
/// which breaks exclusion for the correct client too.
#[test]
fn renewer_ignores_failed_renewal() {
    catch(&Mutation {
        name: "renewer ignores a failed renewal",
        file: "crates/holdfast/src/lease/renewer.rs",
        original: "            let retry = entries.epoch.tick(Instant::now());
            for (id, lease) in &due {",
        mutated: "            let retry = entries.epoch.tick(Instant::now());
            for (id, lease) in &due {
                // MUTANT: the failed renewal counts as renewed.
                lease.extended(sent);",
        config: "default",
        expect: SAFETY,
    });
}

/// The client's deadline counted from the reply instead of the request: it
/// ends up to a reply's delay after the store's.
#[test]
fn deadline_from_reply() {
    catch(&Mutation {
        name: "deadline from the reply",
        file: "crates/holdfast/src/lease/state.rs",
        original: "valid_until: Instant::from_std(grant.attempt_started) + valid_for",
        mutated: "valid_until: Instant::now() /* MUTANT: from the reply */ + valid_for",
        config: "default",
        expect: SAFETY,
    });
}

/// RedLock without the fence write-back (the model's variant (a)): the fence
/// is the highest of the granting majority, but the members that issued
/// less are not raised to it, so a later majority through such a member
/// issues a fence that repeats or goes back.
#[test]
fn redlock_without_fence_write_back() {
    catch(&Mutation {
        name: "RedLock without the fence write-back",
        file: "crates/holdfast/src/composites/redlock/quorum.rs",
        original: "            if v.grant.fence >= fence {",
        mutated: "            if true /* MUTANT: no write-back */ {",
        config: "redlock",
        expect: SAFETY,
    });
}

/// RedLock counting itself granted before its write-back landed (the
/// model's variant (c)): the raise goes out in the background, so a later
/// majority can form through a member it has not reached yet.
#[test]
fn redlock_validity_before_write_back() {
    catch(&Mutation {
        name: "RedLock granted before its write-back landed",
        file: "crates/holdfast/src/composites/redlock/quorum.rs",
        original: "            let raise = self.stores[v.member].raise_fence(&req.key, req.token, fence);
            matches!(self.call(v.member, \"raise_fence\", raise, self.call_timeout).await, Ok(true))",
        mutated: "            // MUTANT: the write-back is sent, not waited for.
            let (store, key, token) = (self.stores[v.member].clone(), req.key.clone(), req.token);
            tokio::spawn(async move { let _ = store.raise_fence(&key, token, fence).await; });
            true",
        config: "redlock",
        expect: SAFETY,
    });
}

/// No drift margin (the model's variant (f)): the client counts its lease
/// to the full TTL, and a store clock running fast (within 1%) ends it
/// first.
#[test]
fn no_drift_margin() {
    catch(&Mutation {
        name: "no drift margin",
        file: "crates/holdfast/src/lease/state.rs",
        original: "    ttl / 100 + Duration::from_millis(1)\n}",
        mutated: "    let _ = ttl;\n    Duration::ZERO // MUTANT: no margin\n}",
        config: "default",
        expect: SAFETY,
    });
}

/// The copy itself, unmutated, passes every seed of every config the
/// mutations use (else a mutant's failure could be the copy's):
/// `cargo test -p holdfast-lock --test sim unmutated -- --ignored --nocapture`.
#[test]
#[ignore = "a check of the harness: one more build and 2,000 seeds"]
fn unmutated_copy_is_clean() {
    let (found, built, ran) = build_and_run(None, CONFIGS);
    eprintln!("unmutated copy: built in {built:.1?}, seeds run in {ran:.1?}");
    for (config, f) in CONFIGS.iter().zip(found) {
        assert!(f.is_none(), "the unmutated copy failed with the `{config}` config: {f:?}");
    }
}

/// The fallback chain with a new epoch usable at once (the model's
/// `EpochWithoutWait`): a client lets its mode lease go on the arbiter as
/// soon as it has read the mode, while it goes on granting under it, so a
/// switch's writer lease does not wait for it: the switch writes the new
/// epoch while clients still believe in the old one, and a client of the
/// new epoch grants from the new store while a holder of the old epoch
/// still believes.
#[test]
fn fallback_epoch_usable_at_once() {
    catch(&Mutation {
        name: "fallback chain: new epoch usable at once",
        file: "crates/holdfast/src/composites/fallback/mode.rs",
        original: "        let lease = ModeLease { token: req.token, mode, until };",
        mutated: "        let _ = self.arbiter.release(&self.key, req.token).await; // MUTANT: no wait\n        let lease = ModeLease { token: req.token, mode, until };",
        config: "fallback",
        expect: SAFETY,
    });
}
