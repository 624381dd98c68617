//! Hot-key worker processes: the program re-executes itself (for
//! `holdfast bench`, `holdfast __bench-worker`) and the two sides talk in
//! JSON lines. The parent writes a [`PartSpec`]; the worker connects, spawns
//! its tasks and answers `Ready`; once every worker is ready the parent
//! writes a [`Go`] to each; the worker runs for its duration and answers
//! `Done` with its [`HotPart`] (or `Failed` at any point).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use holdfast::{Error, Result};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use super::part::{HotPart, PartSpec, Prepared};

/// How to start a worker process: a program and its arguments, for example
/// the running binary (`std::env::current_exe()`) and a hidden subcommand
/// that calls [`serve_hot_worker`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerCommand {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
}

/// The parent's start signal, with how long to run.
#[derive(Debug, Serialize, Deserialize)]
struct Go {
    duration_ms: u64,
}

/// A worker's answers.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Reply {
    Ready,
    Done(HotPart),
    Failed(String),
}

/// Runs one hot-key worker on `input`/`output` (a worker process's stdin and
/// stdout): reads its part, prepares, answers ready, waits for the start,
/// runs, answers with its figures. A failure is answered too, then returned.
///
/// # Cancel safety
///
/// Not cancel-safe: dropped while running, the parent gets no answer (and
/// the tasks' locks are released in the background or expire).
pub async fn serve_hot_worker<R, W>(input: R, mut output: W) -> Result<()>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut lines = input.lines();
    let outcome = async {
        let spec: PartSpec = read_json(&mut lines, "the part spec").await?;
        let prepared = Prepared::new(&spec).await?;
        write_json(&mut output, &Reply::Ready).await?;
        let go: Go = read_json(&mut lines, "the start signal").await?;
        prepared.run(Duration::from_millis(go.duration_ms)).await
    }
    .await;
    match outcome {
        Ok(part) => write_json(&mut output, &Reply::Done(part)).await,
        Err(e) => {
            let _ = write_json(&mut output, &Reply::Failed(e.to_string())).await;
            Err(e)
        }
    }
}

/// A started worker process, seen from the parent.
pub(crate) struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    index: usize,
}

impl Worker {
    /// Starts worker `index` and hands it `spec`. The process is killed if this is dropped.
    pub(crate) async fn spawn(command: &WorkerCommand, index: usize, spec: &PartSpec) -> Result<Self> {
        let mut child = tokio::process::Command::new(&command.program)
            .args(&command.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| bench_error(format!("cannot start bench worker {}: {e}", command.program.display())))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(bench_error("bench worker without stdin/stdout pipes"));
        };
        let mut worker = Worker { child, stdin, stdout: BufReader::new(stdout).lines(), index };
        write_json(&mut worker.stdin, spec).await?;
        Ok(worker)
    }

    /// Waits for the worker's `Ready`.
    pub(crate) async fn ready(&mut self) -> Result<()> {
        match self.reply().await? {
            Reply::Ready => Ok(()),
            other => Err(self.unexpected(other)),
        }
    }

    /// Tells the worker to start and run for `duration`.
    pub(crate) async fn go(&mut self, duration: Duration) -> Result<()> {
        write_json(&mut self.stdin, &Go { duration_ms: duration.as_millis() as u64 }).await
    }

    /// Waits for the worker's figures and for it to exit.
    pub(crate) async fn done(mut self) -> Result<HotPart> {
        let part = match self.reply().await? {
            Reply::Done(part) => part,
            other => return Err(self.unexpected(other)),
        };
        let _ = self.child.wait().await;
        Ok(part)
    }

    async fn reply(&mut self) -> Result<Reply> {
        let what = format!("bench worker {}", self.index);
        read_json(&mut self.stdout, &what).await
    }

    fn unexpected(&self, reply: Reply) -> Error {
        match reply {
            Reply::Failed(message) => bench_error(format!("bench worker {} failed: {message}", self.index)),
            other => bench_error(format!("bench worker {} answered out of turn: {other:?}", self.index)),
        }
    }
}

async fn read_json<T: for<'de> Deserialize<'de>, R: AsyncBufRead + Unpin>(
    lines: &mut Lines<R>,
    what: &str,
) -> Result<T> {
    let line = lines
        .next_line()
        .await
        .map_err(|e| bench_error(format!("reading {what}: {e}")))?
        .ok_or_else(|| bench_error(format!("{what}: the other side closed the pipe")))?;
    serde_json::from_str(&line).map_err(|e| bench_error(format!("{what}: {e}: {line:?}")))
}

async fn write_json<T: Serialize, W: AsyncWrite + Unpin>(output: &mut W, value: &T) -> Result<()> {
    let mut line = serde_json::to_string(value).map_err(|e| bench_error(format!("encoding a message: {e}")))?;
    line.push('\n');
    output.write_all(line.as_bytes()).await.map_err(|e| bench_error(format!("writing to a bench worker: {e}")))?;
    output.flush().await.map_err(|e| bench_error(format!("writing to a bench worker: {e}")))
}

fn bench_error(message: impl Into<String>) -> Error {
    Error::backend("holdfast-bench", false, message.into())
}
