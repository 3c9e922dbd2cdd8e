//! What a process costs, read from `/proc`: CPU time (its own and its reaped children's) and
//! memory (resident now and at peak).

use std::time::Duration;

/// CPU time of a process from `/proc/<pid>/stat`: its own, and that of its reaped children.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu {
    pub own: Duration,
    pub children: Duration,
}

impl Cpu {
    pub fn of(pid: &str) -> Cpu {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Fields after the command name; utime, stime, cutime, cstime are 14-17 of stat(5), in
        // clock ticks (100 Hz on Linux).
        let after = stat.rsplit(')').next().unwrap_or("");
        let f: Vec<u64> = after
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        let at = |i: usize| Duration::from_millis(f.get(i).copied().unwrap_or(0) * 10);
        Cpu {
            own: at(11) + at(12),
            children: at(13) + at(14),
        }
    }
}

/// A process's resident set now and at its peak, in MiB, from `/proc/<pid>/status`.
pub(crate) fn rss_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|k| k.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}
