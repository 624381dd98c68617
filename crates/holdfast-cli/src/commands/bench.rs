//! `holdfast bench`: runs the workloads of `holdfast-bench` on a store and its
//! raw floor, with a progress bar, and prints the table or JSON.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cli::BenchArgs;
use crate::exit::{Failure, INTERNAL, OK};

/// Runs the bench; exit 0 with the report on stdout.
pub async fn bench(args: BenchArgs) -> Result<u8, Failure> {
    let opts = args.bench.options();
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{spinner} {elapsed:>4} {msg}") {
        bar.set_style(style);
    }
    let report = holdfast_bench::run(&opts, |event| bar.set_message(event.to_string())).await;
    bar.finish_and_clear();
    let report = report.map_err(|e| {
        let mut failure = Failure::from(e);
        failure.message = failure.message.replace(&opts.url, &holdfast::redact_url(&opts.url));
        failure
    })?;
    if args.bench.json {
        let json = serde_json::to_string_pretty(&report)
            .map_err(|e| Failure::new(INTERNAL, format!("cannot encode the report as JSON: {e}")))?;
        crate::say!("{json}");
    } else {
        crate::say!("{}", report.to_string().trim_end());
    }
    Ok(OK)
}
