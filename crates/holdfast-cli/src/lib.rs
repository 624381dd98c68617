//! The `holdfast` command, as a library: parse with [`cli::Cli`], run with
//! [`run`], exit with the code from [`exit`]. `main.rs` is only the glue.

pub mod cli;
pub mod commands;
pub mod duration;
pub mod exit;
pub mod metrics_http;

use std::process::ExitCode;

use clap::Parser;

use crate::exit::Failure;

/// `println!` that ignores a closed stdout (`holdfast status | head -1`)
/// instead of panicking on the broken pipe.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// Runs a parsed command line to its exit code.
pub async fn run(cli: cli::Cli) -> Result<u8, Failure> {
    commands::dispatch(cli.command).await
}

/// The whole program: parse, log setup, run, map to an exit code. Never panics
/// on bad input; every failure is one line on stderr and a code from [`exit`].
pub fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version print as clap lays them out, to stdout.
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::from(exit::OK);
        }
        Err(e) => {
            eprintln!("{}", exit::clap_error(&e));
            return ExitCode::from(exit::USAGE);
        }
    };
    init_tracing();
    keep_writing_from_the_background();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("holdfast: cannot start the async runtime: {e}");
            return ExitCode::from(exit::INTERNAL);
        }
    };
    let code = match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(failure) => {
            // An empty message is a failure asked to be quiet (`run --quiet` on a busy lock).
            if !failure.message.is_empty() {
                eprintln!("holdfast: {}", exit::one_line(&failure.message));
            }
            failure.code
        }
    };
    // Commands release their locks before returning; do not hang on a
    // blocking store call stuck on a dead server.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    ExitCode::from(code)
}

/// Blocks SIGTTOU on this thread before the runtime starts its threads, so
/// that they all inherit the mask. `run` hands the terminal to CMD's process
/// group; with `stty tostop`, holdfast writing to the terminal from the
/// background would then be stopped by SIGTTOU, and a stopped holdfast would
/// stop nobody when the lease runs out. A blocked SIGTTOU lets the write
/// through, as shells do for themselves. CMD starts with an empty mask.
fn keep_writing_from_the_background() {
    use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    if let Err(e) = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), None) {
        tracing::debug!(%e, "could not block SIGTTOU");
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // Errors only by default: what went wrong is the one `holdfast: ...`
        // line; the library's warnings (a lost lease, a failed renewal) would
        // say it twice, timestamped. RUST_LOG=warn shows them.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error"));
    // Colour codes only for a person at a terminal, never into a log file or a pipe.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).try_init();
}
