//! `--metrics-addr`: `run` serves the library's metrics in Prometheus text
//! format while the command runs; the command itself reads the endpoint.

use crate::Env;

/// A loopback port free a moment ago, from below the ephemeral range (so
/// no outgoing connection takes it before `run` binds it).
fn free_port() -> u16 {
    holdfast_verify::servers::free_port()
}

#[test]
fn run_serves_prometheus_metrics_to_the_command() {
    let env = Env::new();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    // bash's /dev/tcp: no HTTP client needed on the machine.
    let fetch = format!(
        "exec 3<>/dev/tcp/127.0.0.1/{port} && printf 'GET /metrics HTTP/1.1\\r\\nhost: x\\r\\n\\r\\n' >&3 && cat <&3"
    );
    let out = env.run("orders:42", &["--metrics-addr", &addr], &["bash", "-c", &fetch]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.starts_with("HTTP/1.1 200 OK"), "{stdout}");
    assert!(
        stdout.contains(r#"holdfast_acquire_total{store="sqlite",prefix="orders",outcome="granted"} 1"#),
        "{stdout}"
    );
    assert!(stdout.contains("# TYPE holdfast_acquire_seconds summary"), "{stdout}");
    assert!(stdout.contains(r#"holdfast_leases_held{store="sqlite",prefix="orders"} 1"#), "{stdout}");
    assert!(!stdout.contains("orders:42"), "the key itself is never a label: {stdout}");
}

#[test]
fn a_busy_metrics_address_is_a_clear_error() {
    let env = Env::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = env.run("k", &["--metrics-addr", &addr], &["true"]).output().unwrap();
    // The caller's choice of address, not a bug in holdfast: usage (64), not internal (70).
    assert_eq!(out.status.code(), Some(i32::from(holdfast_cli::exit::USAGE)), "{out:?}");
    crate::assert_one_line(&out.stderr, &format!("--metrics-addr {addr}: cannot listen there"));
    crate::assert_one_line(&out.stderr, "pick a free port");
    assert!(env.client().is_free("k"), "nothing was taken");
}
