//! `holdfast bench`: runs the workloads of `holdfast-bench` on a store and its
//! raw floor, with a progress bar, and prints the table or JSON.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cli::BenchArgs;
use crate::exit::{Failure, INTERNAL, OK};

/// Runs the bench; exit 0 with the report on stdout.
pub async fn bench(args: BenchArgs) -> Result<u8, Failure> {
    if let Some(addr) = args.metrics_addr {
        crate::metrics_http::serve(addr).await?;
    }
    let mut opts = args.bench.options();
    if let Some(hot) = opts.hot.as_mut().filter(|hot| hot.procs > 1) {
        let program = std::env::current_exe()
            .map_err(|e| Failure::new(INTERNAL, format!("cannot find this program to start bench workers: {e}")))?;
        hot.worker = Some(holdfast_bench::WorkerCommand { program, args: vec!["__bench-worker".to_owned()] });
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{spinner} {elapsed:>4} {msg}") {
        bar.set_style(style);
    }
    let report = holdfast_bench::run(&opts, |event| bar.set_message(event.to_string())).await;
    bar.finish_and_clear();
    let report = report.map_err(|e| {
        let mut failure = Failure::from(e);
        failure.message = failure.message.replace(&opts.url, &holdfast::stores::redact_url(&opts.url));
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

/// `holdfast __bench-worker`: one worker process of `bench --hot W --procs P`,
/// driven by its parent over stdin and stdout (JSON lines). Exit 0 when it
/// reported its figures; on failure (reported to the parent too) the code of the error.
pub async fn worker() -> Result<u8, Failure> {
    let input = tokio::io::BufReader::new(tokio::io::stdin());
    match holdfast_bench::serve_hot_worker(input, tokio::io::stdout()).await {
        Ok(()) => Ok(OK),
        Err(e) => Err(Failure::from(e)),
    }
}
