//! A password planted in a store URL never shows: not in the `Debug` of the
//! client (which shows its backend and config), not in any error of a
//! failing connect (no server, wrong password against the real server), not
//! in anything logged at TRACE level during connect, acquire, status and
//! release, not in the status, and not in a panic message.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use holdfast::{Client, ClientOptions};

use super::spans::Recorder;

/// The password planted in URLs: distinctive, and with characters that need
/// %-encoding in a URL.
pub const PASSWORD: &str = "Canary-pw7:x@y";

/// `s` %-encoded for a URL's user info (every byte but letters and digits).
pub fn encode(s: &str) -> String {
    s.bytes().map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

/// The forms a password may show in: itself and %-encoded.
fn forms(secret: &str) -> [String; 2] {
    [secret.to_owned(), encode(secret)]
}

fn assert_hidden(what: &str, url: &str, text: &str, secrets: &[&str]) {
    for secret in secrets {
        for form in forms(secret) {
            assert!(
                !text.contains(&form),
                "{what} for {} shows the password {form:?}:\n{text}",
                holdfast::stores::redact_url(url)
            );
        }
    }
}

/// An error with its whole source chain, in `Display` and `Debug`.
fn error_text(e: &holdfast::Error) -> String {
    let mut text = format!("{e}\n{e:?}\n");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!("{s}\n{s:?}\n"));
        source = s.source();
    }
    text
}

/// Connects to `url` and, if that works, acquires, reads the status and
/// releases, all under a TRACE subscriber; then asserts that none of
/// `secrets` shows anywhere. Returns whether it connected.
pub fn exercise(url: &str, secrets: &[&str]) -> bool {
    let rec = Recorder::default();
    let _installed = rec.install();
    let run = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let opts = ClientOptions::default().with_store_retry(Duration::from_secs(1));
            let connect = tokio::time::timeout(Duration::from_secs(60), Client::connect_with(url, opts)).await;
            let client = match connect.expect("connect neither succeeded nor failed in 60 s") {
                Err(e) => return (false, error_text(&e)),
                Ok(client) => client,
            };
            let mut shown = format!("{client:?}\n{client:#?}\n{}\n", client.store_id());
            match client.mutex("sec:k").acquire_timeout(Duration::from_secs(10)).await {
                Ok(g) => {
                    shown.push_str(&format!("{g:?}\n"));
                    match client.status("sec:k").await {
                        Ok(s) => shown.push_str(&format!("{s:?}\n")),
                        Err(e) => shown.push_str(&error_text(&e)),
                    }
                    if let Err(e) = g.release().await {
                        shown.push_str(&error_text(&e));
                    }
                }
                Err(e) => shown.push_str(&error_text(&e)),
            }
            match holdfast::stores::connect(url).await {
                Ok(backend) => shown.push_str(&format!("{backend:?}\n{backend:#?}\n")),
                Err(e) => shown.push_str(&error_text(&e)),
            }
            (true, shown)
        })
    }));
    let (connected, shown) = match run {
        Ok(out) => out,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            assert_hidden("a panic message", url, &message, secrets);
            std::panic::resume_unwind(panic);
        }
    };
    assert_hidden("Debug, errors or status", url, &shown, secrets);
    let logged = rec.text();
    assert_hidden("the TRACE log", url, &logged, secrets);
    connected
}

/// A connect that must fail: checks the error and the log.
pub fn failing(url: &str, secrets: &[&str]) {
    assert!(!exercise(url, secrets), "{} should not connect", holdfast::stores::redact_url(url));
}

/// A connect that must succeed: checks everything a use of the lock shows.
pub fn working(url: &str, secrets: &[&str]) {
    assert!(exercise(url, secrets), "{} should connect", holdfast::stores::redact_url(url));
}
