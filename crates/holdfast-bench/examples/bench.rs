//! Runs `holdfast_bench::run` from the command line, as `holdfast bench` will:
//!
//! ```text
//! cargo run -p holdfast-bench --release --example bench -- --url sqlite:///tmp/bench.db --rounds 3
//! cargo run -p holdfast-bench --release --features redis --example bench -- --url redis://127.0.0.1:6379
//! ```

use std::io::Write;

use clap::Parser;

#[tokio::main]
async fn main() {
    let args = Cli::parse().args;
    let opts = args.options();
    let report = holdfast_bench::run(&opts, |e| {
        if !matches!(e, holdfast_bench::ProgressEvent::Tick { .. }) {
            eprintln!("{e}");
        }
    })
    .await;
    match report {
        Ok(report) if args.json => match serde_json::to_string_pretty(&report) {
            Ok(json) => println!("{json}"),
            Err(e) => fail(&e),
        },
        Ok(report) => {
            print!("{report}");
            let _ = std::io::stdout().flush();
        }
        Err(e) => fail(&e),
    }
}

fn fail(e: &dyn std::fmt::Display) -> ! {
    eprintln!("error: {e}");
    std::process::exit(1)
}

/// The command line: the flags of `holdfast bench`.
#[derive(Debug, clap::Parser)]
struct Cli {
    #[command(flatten)]
    args: holdfast_bench::args::Args,
}
