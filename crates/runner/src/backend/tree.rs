//! The process backend's runs as processes: every agent's environment carries a tag naming the
//! runner that started it and its attempt ([`RUN_TAG`]), which its children inherit. A
//! grandchild that leaves the agent's process group (`setsid`) is still found by it, so a run's
//! whole tree is killed when the run ends, and what a run or a crashed runner left behind is
//! found and killed by the reaper ([`crate::reaper`]).
//!
//! Linux's `/proc`; on other systems nothing is found, and only the process group is killed.

use rustix::process::{kill_process, Pid, Signal};

/// The environment variable that tags a run's processes: `<instance>/<turn>/<attempt>`.
pub const RUN_TAG: &str = "TURNPIKE_RUN";

/// Who started a tagged process, and for which attempt.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tag {
    /// The runner that started it ([`Instance`]'s text).
    pub instance: String,
    pub turn: String,
    pub attempt: u32,
}

impl Tag {
    /// The environment value for a run.
    pub fn value(instance: &Instance, turn: &str, attempt: u32) -> String {
        format!("{}/{turn}/{attempt}", instance.0)
    }

    fn parse(value: &str) -> Option<Tag> {
        let mut parts = value.rsplitn(3, '/');
        let attempt = parts.next()?.parse().ok()?;
        let turn = parts.next()?.to_owned();
        let instance = parts.next()?.to_owned();
        Some(Tag {
            instance,
            turn,
            attempt,
        })
    }
}

/// One runner, as its tags name it: its pid namespace, its process (pid and start time, which
/// no other process of the namespace shares while it lives), and which runner of that process
/// (tests run several in one): `<namespace>-<pid>-<start>-<n>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance(String);

impl Instance {
    /// A new runner of this process.
    pub fn new() -> Instance {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let started = start_time(pid).unwrap_or(0);
        Instance(format!("{}-{pid}-{started}-{n}", pid_namespace()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Is this tag's runner this one?
    pub fn started(&self, tag: &Tag) -> bool {
        tag.instance == self.0
    }
}

impl Default for Instance {
    fn default() -> Self {
        Instance::new()
    }
}

/// Is the process of the runner that wrote `tag` gone (no process of that pid with the start
/// time the tag gives)? Judged only for a runner of this pid namespace: another's pids mean
/// nothing here, so its processes are never taken for orphans.
pub fn runner_gone(tag: &Tag) -> bool {
    let mut parts = tag.instance.split('-');
    let (Some(ns), Some(pid), Some(started)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    if ns != pid_namespace() {
        return false;
    }
    let (Ok(pid), Ok(started)) = (pid.parse::<u32>(), started.parse::<u64>()) else {
        return false;
    };
    start_time(pid) != Some(started)
}

/// This process's pid namespace (the number in `/proc/self/ns/pid`'s `pid:[…]`).
fn pid_namespace() -> String {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .and_then(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.split_once('[')?.1.trim_end_matches(']').to_owned())
        })
        .unwrap_or_else(|| "0".to_owned())
}

/// A process's start time (clock ticks since boot, `/proc/<pid>/stat` field 22).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may hold spaces: count fields after its end.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The tag in a process's environment (`/proc/<pid>/environ`, NUL-separated), if any.
fn tag_in(environ: &[u8]) -> Option<Tag> {
    let prefix = format!("{RUN_TAG}=");
    environ
        .split(|b| *b == 0)
        .find_map(|var| var.strip_prefix(prefix.as_bytes()))
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(Tag::parse)
}

/// Every process this user may see whose environment carries a run tag.
pub fn tagged() -> Vec<(u32, Tag)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id();
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter_map(|pid| {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            Some((pid, tag_in(&environ)?))
        })
        .collect()
}

/// Kill (SIGKILL) every process tagged for `instance`'s `turn`/`attempt`; how many.
pub fn kill_run(instance: &Instance, turn: &str, attempt: u32) -> usize {
    kill_where(|t| instance.started(t) && t.turn == turn && t.attempt == attempt)
}

/// Kill (SIGKILL) every tagged process `doomed` picks; how many.
pub fn kill_where(doomed: impl Fn(&Tag) -> bool) -> usize {
    tagged()
        .into_iter()
        .filter(|(_, tag)| doomed(tag))
        .filter(|(pid, _)| {
            Pid::from_raw(*pid as i32).is_some_and(|p| kill_process(p, Signal::KILL).is_ok())
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_name_their_runner_and_attempt() {
        let me = Instance::new();
        let value = Tag::value(&me, "t-abc", 3);
        let environ = format!("PATH=/bin\0{RUN_TAG}={value}\0HOME=/tmp\0");
        let tag = tag_in(environ.as_bytes()).expect("a tag");
        assert_eq!(tag.turn, "t-abc");
        assert_eq!(tag.attempt, 3);
        assert!(me.started(&tag));
        assert!(!runner_gone(&tag), "this very process");
        assert!(
            !Instance::new().started(&tag),
            "another runner of this process"
        );
        assert_eq!(tag_in(b"PATH=/bin\0"), None);
        let dead = Tag {
            instance: format!("{}-{}-1-0", pid_namespace(), u32::MAX),
            ..tag.clone()
        };
        assert!(runner_gone(&dead));
        let elsewhere = Tag {
            instance: format!("1-{}-1-0", u32::MAX),
            ..tag
        };
        assert!(
            !runner_gone(&elsewhere),
            "another namespace's pids mean nothing here"
        );
    }
}
