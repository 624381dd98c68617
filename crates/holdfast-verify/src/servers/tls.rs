//! Throwaway certificates for TLS tests, made with the `openssl` command:
//! a CA and a server certificate for 127.0.0.1 only (not `localhost`, so a
//! test can check host-name verification), valid two days.

use std::path::Path;
use std::process::Command;

use super::require_binary;

fn openssl(dir: &Path, args: &[&str]) {
    let openssl = require_binary("openssl", &["/usr/bin"], "openssl");
    let out = Command::new(openssl)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run openssl: {e}"));
    assert!(out.status.success(), "openssl {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

const EC_KEY: [&str; 5] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];

/// Makes a CA in `dir`: `{name}.key` and `{name}.pem`.
pub fn make_ca(dir: &Path, name: &str) {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    let (key, pem, subject) = (format!("{name}.key"), format!("{name}.pem"), format!("/CN=holdfast test {name}"));
    let mut args = vec!["req", "-x509", "-days", "2", "-subj", &subject, "-keyout", &key, "-out", &pem];
    args.extend(EC_KEY);
    args.extend(["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
    openssl(dir, &args);
}

/// Makes a CA (`ca.pem`, `ca.key`) and a server certificate it signed
/// (`server.pem`, `server.key`) for IP 127.0.0.1, in `dir`.
pub fn make_server_certificate(dir: &Path) {
    make_ca(dir, "ca");
    let mut args = vec!["req", "-subj", "/CN=127.0.0.1", "-keyout", "server.key", "-out", "server.csr"];
    args.extend(EC_KEY);
    openssl(dir, &args);
    std::fs::write(
        dir.join("server.ext"),
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n\
         extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n",
    )
    .unwrap_or_else(|e| panic!("cannot write server.ext: {e}"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-extfile",
            "server.ext",
            "-out",
            "server.pem",
        ],
    );
}

/// Makes a client certificate for common name `name` (`{name}.pem`,
/// `{name}.key`), signed by the CA `ca.pem` that
/// [`make_server_certificate`] made in `dir`.
pub fn make_client_certificate(dir: &Path, name: &str) {
    let (key, csr, pem, ext) =
        (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"), format!("{name}.ext"));
    let subject = format!("/CN={name}");
    let mut args = vec!["req", "-subj", &subject, "-keyout", &key, "-out", &csr];
    args.extend(EC_KEY);
    openssl(dir, &args);
    std::fs::write(
        dir.join(&ext),
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
    )
    .unwrap_or_else(|e| panic!("cannot write {ext}: {e}"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-extfile",
            &ext,
            "-out",
            &pem,
        ],
    );
}
