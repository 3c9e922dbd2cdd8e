//! `turnpike-agent-init <ms> <program> [args...]`: PID 1 of an agent's container. Starts the
//! agent, hands it the input document from the runner, passes signals on (PID 1 ignores any it
//! has no handler for, so `docker stop`'s SIGTERM would otherwise never reach the agent), reaps
//! orphans, exits as the agent exited; and stops the agent when the runner's heartbeats stop
//! (see the library for the protocol). As PID 1, its exit takes every process of the container
//! with it; outside a container it kills the agent's process group.

use signal_hook::consts::signal::{SIGCHLD, SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
use signal_hook::iterator::Signals;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use turnpike_agent_init::{
    parse_beat, parse_header, parse_secret_env, ProtocolError, EXIT_CANNOT_RUN, EXIT_NOT_FOUND,
    EXIT_WATCHDOG, MAX_LINE, SECRETS_DIR, SECRET_ENV,
};

/// Signals passed on to the agent as they come.
const FORWARDED: [i32; 6] = [SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2];

enum Event {
    Signal(i32),
    /// The input document, and the first heartbeat read at `at`: the agent may start, and live
    /// until `at + left`.
    Ready {
        document: Vec<u8>,
        at: Instant,
        left: Duration,
    },
    /// A heartbeat read at `at`: the agent may live until `at + left`.
    Beat {
        at: Instant,
        left: Duration,
    },
    /// Stop the agent now: the runner let go, or broke the protocol.
    Stop(String),
}

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let first = args
        .first()
        .and_then(|a| a.to_str())
        .and_then(|a| a.parse::<u64>().ok());
    let (Some(first), Some(program)) = (first, args.get(1)) else {
        eprintln!("usage: turnpike-agent-init <deadline-ms> <program> [args...]");
        std::process::exit(EXIT_CANNOT_RUN);
    };
    let deadline = Instant::now() + Duration::from_millis(first);
    let rx = listen();
    let (document, deadline) = wait_for_the_runner(&rx, deadline);
    let agent = start_agent(program, &args[2..], document);
    watch(&rx, agent, deadline)
}

/// Handle signals and read the runner's words, each on a thread of its own, into one channel.
/// Set up before the agent exists, so no SIGCHLD or SIGTERM is missed.
fn listen() -> mpsc::Receiver<Event> {
    let mut wanted = FORWARDED.to_vec();
    wanted.push(SIGCHLD);
    let mut signals = match Signals::new(&wanted) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("turnpike-agent-init: cannot handle signals: {e}");
            std::process::exit(EXIT_CANNOT_RUN);
        }
    };
    let (tx, rx) = mpsc::channel::<Event>();
    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for s in signals.forever() {
                if tx.send(Event::Signal(s)).is_err() {
                    return;
                }
            }
        });
    }
    std::thread::spawn(move || {
        let why = match read_runner(std::io::stdin().lock(), &tx) {
            Ok(()) => "the runner let go of the container".to_owned(),
            Err(e) => e,
        };
        let _ = tx.send(Event::Stop(why));
    });

    rx
}

/// The agent starts only once the runner has spoken since the container started, with time
/// left: a runner that froze before (or woke too late) never has its agent started at all.
/// Returns the input document and the deadline the runner set.
fn wait_for_the_runner(rx: &mpsc::Receiver<Event>, mut deadline: Instant) -> (Vec<u8>, Instant) {
    let document = loop {
        let Some(wait) = left(deadline) else {
            exit_before_start("no word from the runner in time");
        };
        match rx.recv_timeout(wait) {
            Ok(Event::Ready { document, at, left }) => {
                deadline = at + left;
                break document;
            }
            Ok(Event::Signal(SIGCHLD)) | Ok(Event::Beat { .. }) => {}
            // Stopped before it started: as the agent would have been, by that signal.
            Ok(Event::Signal(s)) => std::process::exit(128 + s),
            Ok(Event::Stop(why)) => exit_before_start(&why),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                exit_before_start("lost its own signal and input threads")
            }
        }
    };
    if left(deadline).is_none() {
        exit_before_start("the runner's deadline had passed before the agent could start");
    }

    (document, deadline)
}

/// Start the agent in its own process group and hand it `document` on its stdin.
fn start_agent(
    program: &std::ffi::OsStr,
    args: &[std::ffi::OsString],
    document: Vec<u8>,
) -> rustix::process::Pid {
    let mut command = Command::new(program);
    command.args(args).env_remove(SECRET_ENV);
    for (var, value) in secret_variables() {
        command.env(var, value);
    }
    let spawned = command
        .stdin(Stdio::piped())
        // Its own group, so that outside a container the whole tree can be killed.
        .process_group(0)
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "turnpike-agent-init: cannot start {}: {e}",
                program.to_string_lossy()
            );
            std::process::exit(if e.kind() == std::io::ErrorKind::NotFound {
                EXIT_NOT_FOUND
            } else {
                EXIT_CANNOT_RUN
            });
        }
    };
    let agent = rustix::process::Pid::from_child(&child);
    // Written from a thread of its own: an agent that never reads its input must not keep the
    // heartbeats unread. An agent that exits or closes its input early is no error here.
    if let Some(mut stdin) = child.stdin.take() {
        std::thread::spawn(move || {
            let _ = stdin.write_all(&document).and_then(|()| stdin.flush());
        });
    }

    agent
}

/// The variables the runner asked to be set from secret files ([`SECRET_ENV`]): each file
/// without its trailing newline. One that cannot be had means the agent cannot run; the message
/// names the secret, never its value.
fn secret_variables() -> Vec<(String, String)> {
    let Some(asked) = std::env::var_os(SECRET_ENV) else {
        return Vec::new();
    };
    let cannot = |why: String| -> ! {
        eprintln!("turnpike-agent-init: {why}");
        std::process::exit(EXIT_CANNOT_RUN);
    };
    let Some(pairs) = asked.to_str().and_then(parse_secret_env) else {
        cannot(format!("{SECRET_ENV} is malformed"));
    };
    pairs
        .into_iter()
        .map(|(var, name)| {
            let path = std::path::Path::new(SECRETS_DIR).join(&name);
            let value = match std::fs::read(&path) {
                Ok(v) => v,
                Err(e) => cannot(format!("cannot read secret {name}: {}", e.kind())),
            };
            match String::from_utf8(value) {
                Ok(v) if !v.contains('\0') => (var, v.trim_end_matches(['\n', '\r']).to_owned()),
                _ => cannot(format!("secret {name} cannot be a variable")),
            }
        })
        .collect()
}

/// Pass signals on to the agent and keep its deadline moving with the runner's heartbeats;
/// exit as the agent exits, or stop it when the heartbeats stop.
fn watch(rx: &mpsc::Receiver<Event>, agent: rustix::process::Pid, mut deadline: Instant) -> ! {
    loop {
        let Some(wait) = left(deadline) else {
            stop_agent(agent, "no heartbeat from the runner in time");
        };
        match rx.recv_timeout(wait) {
            Ok(Event::Signal(SIGCHLD)) => {
                if let Some(code) = reap(agent) {
                    std::process::exit(code);
                }
            }
            Ok(Event::Signal(s)) => {
                if let Some(sig) = rustix::process::Signal::from_named_raw(s) {
                    let _ = rustix::process::kill_process(agent, sig);
                }
            }
            Ok(Event::Beat { at, left } | Event::Ready { at, left, .. }) => deadline = at + left,
            Ok(Event::Stop(why)) => stop_agent(agent, &why),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                stop_agent(agent, "lost its own signal and input threads")
            }
        }
    }
}

/// Time left until `deadline`; `None` once it has come.
fn left(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|w| !w.is_zero())
}

/// Read what the runner writes: the document and the first heartbeat, then the heartbeats that
/// follow. Returns at end of stream; an error says how the runner broke the protocol.
fn read_runner(input: impl Read, tx: &mpsc::Sender<Event>) -> Result<(), String> {
    let mut input = BufReader::new(input);
    let Some(header) = line(&mut input)? else {
        return Ok(());
    };
    let len = parse_header(&header).map_err(|e| e.to_string())?;
    let mut document = Vec::new();
    (&mut input)
        .take(len)
        .read_to_end(&mut document)
        .map_err(|e| e.to_string())?;
    if (document.len() as u64) < len {
        return Ok(());
    }
    let mut document = Some(document);
    while let Some(l) = line(&mut input)? {
        let left = parse_beat(&l).map_err(|e: ProtocolError| e.to_string())?;
        let at = Instant::now();
        let event = match document.take() {
            Some(document) => Event::Ready { document, at, left },
            None => Event::Beat { at, left },
        };
        if tx.send(event).is_err() {
            return Ok(());
        }
    }
    Ok(())
}

/// One line without its newline; `None` at end of stream (a last line without a newline is
/// incomplete, and ignored).
fn line(input: &mut impl BufRead) -> Result<Option<Vec<u8>>, String> {
    let mut buf = Vec::new();
    let n = input
        .by_ref()
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', &mut buf)
        .map_err(|e| e.to_string())?;
    match buf.pop() {
        Some(b'\n') => Ok(Some(buf)),
        _ if n > MAX_LINE => Err(format!(
            "a line from the runner longer than {MAX_LINE} bytes"
        )),
        _ => Ok(None),
    }
}

/// Reap every child that exited (PID 1 inherits the agent's orphans); the agent's exit code, as
/// a shell reports it (128 + n for death by signal n), once it is gone.
fn reap(agent: rustix::process::Pid) -> Option<i32> {
    let mut code = None;
    while let Ok(Some((pid, status))) = rustix::process::wait(rustix::process::WaitOptions::NOHANG)
    {
        if pid == agent {
            code = status
                .exit_status()
                .or_else(|| status.terminating_signal().map(|s| 128 + s));
        }
    }
    code
}

/// Exit without ever starting the agent.
fn exit_before_start(why: &str) -> ! {
    eprintln!("turnpike-agent-init: {why}; not starting the agent");
    std::process::exit(EXIT_WATCHDOG)
}

/// Kill the agent and everything in its group, and exit.
fn stop_agent(agent: rustix::process::Pid, why: &str) -> ! {
    eprintln!("turnpike-agent-init: {why}; stopping the agent");
    let _ = rustix::process::kill_process_group(agent, rustix::process::Signal::KILL);
    let _ = rustix::process::kill_process(agent, rustix::process::Signal::KILL);
    std::process::exit(EXIT_WATCHDOG)
}
