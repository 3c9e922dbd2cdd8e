//! The init binary as a runner drives it, with `sh` as the agent: what it passes on, and when it
//! stops the agent by itself. No test waits on a clock for its verdict: each reads what the init
//! and the agent did (exit codes, output, whether a process still exists).

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};
use turnpike_agent_init::{beat, header, EXIT_NOT_FOUND, EXIT_WATCHDOG};

fn init(first_ms: u64, script: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_turnpike-agent-init"))
        .arg(first_ms.to_string())
        .args(["sh", "-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the init")
}

fn send(stdin: &mut ChildStdin, bytes: &[u8]) {
    stdin.write_all(bytes).expect("write to the init");
    stdin.flush().expect("flush");
}

fn document(stdin: &mut ChildStdin, doc: &[u8]) {
    send(stdin, &header(doc.len()));
    send(stdin, doc);
}

/// The exit code, waiting at most a minute (a hung init fails the test instead of hanging it).
fn exit_code(child: &mut Child) -> i32 {
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        if let Some(status) = child.try_wait().expect("wait") {
            return status.code().expect("the init exits, it is not killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    panic!("the init did not exit within a minute");
}

fn stderr(child: &mut Child) -> String {
    let mut s = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut s)
        .expect("read stderr");
    s
}

/// The pid the agent script printed first (`echo $!` of a background `sleep`).
fn first_line(child: &mut Child) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().expect("stdout"))
        .read_line(&mut line)
        .expect("read the agent's first line");
    line.trim().to_owned()
}

/// Gone or a zombie: the process no longer runs. Waits up to a minute for the kernel to finish
/// the kill.
fn dead(pid: &str) -> bool {
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(stat)
                if stat
                    .rsplit(')')
                    .next()
                    .is_some_and(|s| s.trim_start().starts_with('Z')) =>
            {
                return true
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    false
}

#[test]
fn the_agent_gets_the_document_then_end_of_input_and_its_exit_code_is_the_inits() {
    let mut child = init(60_000, "cat; exit 7");
    let mut stdin = child.stdin.take().expect("stdin");
    document(&mut stdin, b"{\"text\":\"hello\"}\nsecond line");
    send(&mut stdin, &beat(Duration::from_secs(60)));
    assert_eq!(exit_code(&mut child), 7);
    assert_eq!(stdout(&mut child), "{\"text\":\"hello\"}\nsecond line");
    drop(stdin);
}

#[test]
fn an_agent_that_never_reads_its_input_still_gets_its_heartbeats_read() {
    // A document far larger than a pipe holds, to an agent that reads none of it: the init must
    // still read the heartbeat after it (a later, longer deadline), so the agent's own exit
    // code comes back, not the watchdog's.
    let mut child = init(60_000, "sleep 1; exit 3");
    let mut stdin = child.stdin.take().expect("stdin");
    document(&mut stdin, &vec![b'x'; 1 << 20]);
    send(&mut stdin, &beat(Duration::from_secs(60)));
    assert_eq!(exit_code(&mut child), 3);
    drop(stdin);
}

#[test]
fn a_later_heartbeat_replaces_the_deadline() {
    let mut child = init(60_000, "sleep 2; exit 3");
    let mut stdin = child.stdin.take().expect("stdin");
    document(&mut stdin, b"{}");
    send(&mut stdin, &beat(Duration::from_secs(1)));
    send(&mut stdin, &beat(Duration::from_secs(60)));
    assert_eq!(exit_code(&mut child), 3, "{}", stderr(&mut child));
    drop(stdin);
}

#[test]
fn without_heartbeats_the_agent_and_its_children_are_killed_no_sooner_than_the_deadline() {
    let mut child = init(60_000, "sleep 1000 & echo $!; wait");
    let mut stdin = child.stdin.take().expect("stdin");
    document(&mut stdin, b"{}");
    let sent = Instant::now();
    send(&mut stdin, &beat(Duration::from_millis(500)));
    let grandchild = first_line(&mut child);
    assert_eq!(exit_code(&mut child), EXIT_WATCHDOG);
    assert!(
        sent.elapsed() >= Duration::from_millis(500),
        "stopped before its deadline"
    );
    assert!(
        dead(&grandchild),
        "the agent's child {grandchild} still runs"
    );
    assert!(stderr(&mut child).contains("no heartbeat from the runner in time"));
    drop(stdin);
}

/// Everything the agent printed (read after the init exited).
fn stdout(child: &mut Child) -> String {
    let mut s = String::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut s)
        .expect("read stdout");
    s
}

#[test]
fn a_runner_that_never_speaks_never_has_its_agent_started() {
    let mut child = init(300, "echo started");
    let stdin = child.stdin.take().expect("stdin");
    assert_eq!(exit_code(&mut child), EXIT_WATCHDOG);
    assert_eq!(stdout(&mut child), "", "the agent ran");
    assert!(stderr(&mut child).contains("no word from the runner in time; not starting the agent"));
    drop(stdin);
}

#[test]
fn a_runner_whose_time_is_up_when_it_speaks_never_has_its_agent_started() {
    let mut child = init(600_000, "echo started");
    let mut stdin = child.stdin.take().expect("stdin");
    document(&mut stdin, b"{}");
    send(&mut stdin, &beat(Duration::ZERO));
    assert_eq!(exit_code(&mut child), EXIT_WATCHDOG);
    assert_eq!(stdout(&mut child), "", "the agent ran");
    drop(stdin);
}

#[test]
fn the_runner_letting_go_stops_the_agent_at_once() {
    let mut child = init(600_000, "sleep 1000 & echo $!; wait");
    let mut stdin = child.stdin.take().expect("stdin");
    document(&mut stdin, b"{}");
    send(&mut stdin, &beat(Duration::from_secs(600)));
    let grandchild = first_line(&mut child);
    drop(stdin);
    assert_eq!(exit_code(&mut child), EXIT_WATCHDOG);
    assert!(dead(&grandchild));
    assert!(stderr(&mut child).contains("the runner let go"));
}

#[test]
fn a_runner_that_breaks_the_protocol_stops_the_agent() {
    for garbage in [&b"hello\n"[..], b"turnpike-agent-init/1 2\n{}soon\n"] {
        let mut child = init(600_000, "sleep 1000");
        let mut stdin = child.stdin.take().expect("stdin");
        send(&mut stdin, garbage);
        assert_eq!(exit_code(&mut child), EXIT_WATCHDOG);
        assert!(stderr(&mut child).contains("from the runner"));
        drop(stdin);
    }
}

#[test]
fn sigterm_reaches_the_agent() {
    let mut child = init(
        600_000,
        "trap 'exit 42' TERM; echo ready; while :; do sleep 0.05; done",
    );
    let mut stdin = child.stdin.take().expect("stdin");
    document(&mut stdin, b"{}");
    send(&mut stdin, &beat(Duration::from_secs(600)));
    assert_eq!(first_line(&mut child), "ready");
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("signal the init");
    assert_eq!(exit_code(&mut child), 42);
    drop(stdin);
}

#[test]
fn a_missing_program_is_a_failed_start() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_turnpike-agent-init"))
        .args(["60000", "/no/such/agent"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the init");
    let mut stdin = child.stdin.take().expect("stdin");
    document(&mut stdin, b"{}");
    send(&mut stdin, &beat(Duration::from_secs(60)));
    assert_eq!(exit_code(&mut child), EXIT_NOT_FOUND);
    assert!(stderr(&mut child).contains("cannot start /no/such/agent"));
}
