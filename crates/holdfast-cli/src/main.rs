//! The `holdfast` command. Everything lives in the `holdfast_cli` library;
//! see `holdfast --help` and `src/exit.rs` for the exit codes.

fn main() -> std::process::ExitCode {
    holdfast_cli::main()
}
