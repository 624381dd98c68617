//! One module per subcommand; each is a thin layer over the `holdfast` library.
//!
//! Adding a command: a variant in [`crate::cli::Command`], a module here, an
//! arm in [`dispatch`].

pub mod bench;
pub mod demo;
pub mod elect;
pub mod list;
pub mod release;
pub mod run;
pub mod status;
pub mod verify;

use crate::cli::{BackendArg, Command, ENV_BACKEND};
use crate::exit::Failure;

/// Runs one subcommand to its exit code.
pub async fn dispatch(command: Command) -> Result<u8, Failure> {
    match command {
        Command::Demo(args) => demo::demo(args).await,
        Command::Run(args) => run::run(args).await,
        Command::Elect(args) => elect::elect(args).await,
        Command::Status(args) => status::status(args).await,
        Command::List(args) => list::list(args).await,
        Command::Release(args) => release::release(args).await,
        Command::Bench(args) => bench::bench(args).await,
        Command::DemoWorker(args) => demo::worker(args).await,
        Command::BenchWorker => bench::worker().await,
        Command::Verify(args) => verify::verify(args).await,
        Command::VerifyWorker(args) => verify::worker(args).await,
    }
}

/// Connects to the store `url` names, with an optional holder label.
pub(crate) async fn connect(url: &str, label: Option<String>) -> Result<holdfast::Client, Failure> {
    let mut options = holdfast::ClientOptions::default();
    if let Some(label) = label {
        options = options.with_label(label);
    }
    holdfast::Client::connect_with(url, options).await.map_err(|e| {
        // Never echo a password from the URL, whatever the store's error says.
        let mut failure = Failure::from(e);
        failure.message = failure.message.replace(url, &holdfast::stores::redact_url(url));
        failure
    })
}

/// Connects for a command that only reads or frees locks: an `sqlite://`
/// file must already exist (see [`BackendArg::url_read_only`]); when it is
/// the implicit default file, the error says so and how to name a store.
pub(crate) async fn connect_read_only(backend: &BackendArg) -> Result<holdfast::Client, Failure> {
    connect(&backend.url_read_only()?, None).await.map_err(|mut failure| {
        let missing = failure.message.contains("no such database file") || failure.message.contains("does not exist");
        if backend.is_implicit() && missing {
            failure.message.push_str(&format!(
                " (the default local store, used when neither --backend nor {ENV_BACKEND} names one; \
                 no lock has been taken in it on this machine yet)"
            ));
        }
        failure
    })
}
