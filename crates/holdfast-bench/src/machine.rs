//! Where and when a bench ran, for the report's header (so a README table can
//! cite it), and the process's CPU time.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

/// The machine a bench ran on, and when.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    /// When the run started, RFC 3339 in UTC (`2025-01-31T12:00:00Z`).
    pub date: String,
    /// CPUs available to this process.
    pub cores: usize,
    /// Physical memory (`MemTotal` of /proc/meminfo), bytes, if readable.
    pub memory_bytes: Option<u64>,
    /// The CPU's model name (/proc/cpuinfo), if readable.
    pub cpu_model: Option<String>,
    /// The operating system's name and release (`Linux 6.8.0`), if readable.
    pub os: Option<String>,
}

impl Machine {
    /// This machine, now.
    pub fn here() -> Self {
        Machine {
            date: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            memory_bytes: meminfo_total(),
            cpu_model: cpu_model(),
            os: os_release(),
        }
    }

    /// One line: `2025-01-31T12:00:00Z, 2 cores (AMD EPYC ...), 7.8 GiB, Linux 6.8.0`.
    pub fn summary(&self) -> String {
        let mut s = format!("{}, {} cores", self.date, self.cores);
        if let Some(model) = &self.cpu_model {
            s.push_str(&format!(" ({model})"));
        }
        if let Some(mem) = self.memory_bytes {
            s.push_str(&format!(", {:.1} GiB", mem as f64 / (1u64 << 30) as f64));
        }
        if let Some(os) = &self.os {
            s.push_str(&format!(", {os}"));
        }
        s
    }
}

fn meminfo_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.trim_start_matches("MemTotal:").trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.split_whitespace().collect::<Vec<_>>().join(" "))
}

fn os_release() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/ostype").ok()?;
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    Some(format!("{} {}", name.trim(), release.trim()))
}

/// CPU time (user + system) this process has used so far, all threads,
/// from `getrusage(RUSAGE_SELF)`; zero if the call fails.
pub(crate) fn cpu_time() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let tv = |t: nix::sys::time::TimeVal| {
                Duration::from_secs(t.tv_sec().max(0) as u64) + Duration::from_micros(t.tv_usec().max(0) as u64)
            };
            tv(u.user_time()) + tv(u.system_time())
        }
        Err(_) => Duration::ZERO,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn machine_is_described() {
        let m = super::Machine::here();
        assert!(m.cores >= 1);
        assert!(m.date.ends_with('Z') && m.date.len() == 20, "{}", m.date);
        assert!(m.summary().contains("cores"));
        let before = super::cpu_time();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_add(std::hint::black_box(i));
        }
        std::hint::black_box(x);
        assert!(super::cpu_time() > before, "CPU time grows while spinning");
    }
}
