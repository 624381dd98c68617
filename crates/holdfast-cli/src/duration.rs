//! Durations on the command line: `500ms`, `30s`, `5m`, `1h 30m` (humantime).

use std::time::Duration;

/// Parses a duration with a unit, for clap's `value_parser`.
pub fn parse(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{e}; expected a duration with a unit, like 500ms, 30s or 5m"))
}

/// Parses a lease TTL: a duration within the library's
/// [`MIN_TTL`](holdfast::LockOptions::MIN_TTL)..=[`MAX_TTL`](holdfast::LockOptions::MAX_TTL), refused in
/// human units (`between 50ms and 1day`) at parse time.
pub fn parse_ttl(s: &str) -> Result<Duration, String> {
    let d = parse(s)?;
    if d < holdfast::LockOptions::MIN_TTL || d > holdfast::LockOptions::MAX_TTL {
        return Err(format!(
            "a lease TTL must be between {} and {}",
            humantime::format_duration(holdfast::LockOptions::MIN_TTL),
            humantime::format_duration(holdfast::LockOptions::MAX_TTL)
        ));
    }
    Ok(d)
}

/// Checks that `d` is above zero, for options where zero makes no sense.
pub fn non_zero(flag: &str, d: Duration) -> Result<Duration, crate::exit::Failure> {
    if d.is_zero() {
        return Err(crate::exit::Failure::usage(format!("{flag} must be above zero")));
    }
    Ok(d)
}

/// A duration for humans: `850ms`, `12.5s`, `3m 20s`.
pub fn show(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else if d < Duration::from_secs(60) {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_rejects_bare_numbers() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert!(parse("5").is_err());
        assert!(parse("soon").is_err());
        assert!(non_zero("--ttl", Duration::ZERO).is_err());
        assert_eq!(parse_ttl("30s"), Ok(Duration::from_secs(30)));
        for bad in ["0s", "10ms", "100y"] {
            assert_eq!(parse_ttl(bad), Err("a lease TTL must be between 50ms and 1day".to_owned()), "{bad}");
        }
    }

    #[test]
    fn shows_durations() {
        assert_eq!(show(Duration::from_millis(850)), "850ms");
        assert_eq!(show(Duration::from_millis(12_500)), "12.5s");
        assert_eq!(show(Duration::from_secs(200)), "3m 20s");
    }
}
