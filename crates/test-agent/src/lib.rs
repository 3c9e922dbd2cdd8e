//! The test agent: a scriptable agent for tests and demos. It reads the Turnpike input
//! document on stdin and behaves as the first directive in the message text says:
//!
//! | directive | behaviour |
//! |---|---|
//! | `reply:<text>` | replies `<text>` |
//! | `crash-after-reply` | replies, then exits 1 |
//! | `oom` | allocates until killed (capped at 1 GiB, then exits 86 so a missing limit never eats the host) |
//! | `hang` | sleeps forever |
//! | `sleep:<s>` | sleeps `<s>` seconds (fractions allowed), then replies |
//! | `hang-until:<k>` | hangs on attempts below k, replies from attempt k on |
//! | `fail` | reports `{"type":"result","status":"error"}` and exits 0 |
//! | `silent` | exits 0 saying nothing |
//! | `die-until:<k>` | exits 1 with no reply on attempts below k, replies from attempt k on |
//! | `status:<n>` | sends n status lines, then replies |
//! | `garbage` | prints invalid and oversize lines, then replies |
//! | `flood:<n>` | sends n messages |
//! | `big-reply:<n>` | replies one message of n bytes |
//! | `reply-then-hang` | replies, then hangs |
//! | `summary-before-deadline:<s>` | thinks (sleeps) until `<s>` seconds before its deadline, replies a summary naming the deadline (and whether `TURNPIKE_DEADLINE` says the same), and exits cleanly |
//! | `reply-when-file:<path>` | waits until `<path>` exists, replies, then hangs |
//! | `die-when-file:<path>` | waits until `<path>` exists, then exits 1 with no reply |
//! | `die-once-when-file:<path>` | on attempt 1 as `die-when-file`; later attempts as `run-info` |
//! | `run-info` | replies `profile <name or -> deadline <deadline>`: what the run was given |
//! | `alloc:<MiB>` | allocates and touches `<MiB>` MiB, then replies (an OOM kill below that limit) |
//! | `reply-then-exit:<s>` | replies, then exits cleanly `<s>` seconds later |
//! | `fail-huge` | reports a failure whose error line is over 1 MiB, and exits 0 |
//! | `error-and-die:<n>` | reports an error of n control characters, then exits 1 (a death) |
//! | `write-file:<path>` | tries to create `<path>`; replies `wrote <path>` or `refused <path>: <error>` |
//! | `attachments` | replies, per attachment, its path, size and FNV-1a hash (tests check bytes) |
//! | `secret:<name>[:<VAR>]` | replies the FNV-1a hash of secret `<name>`'s file (in `$TURNPIKE_SECRETS`) and of variable `<VAR>` |
//! | `leak:<name>` | prints secret `<name>` in a status line, on stderr and as a stray stdout line; on attempt 1 then reports it as its error and exits 1 (retried), later replies with it |
//! | `leak-fail:<name>` | reports secret `<name>` as its error and exits 0 (a failure, not retried) |
//! | `fetch:<item>,…` | replies one line per item, `<item> -> <outcome>`: an `http://host:port/path` URL is fetched through `HTTP_PROXY` by a CONNECT tunnel (directly without one), `plain=<url>` as a plain proxied request, `direct=<host:port>` is a bare TCP connection past any proxy |
//! | `workspace-note:<text>` | replies `notes: <a>|<b>…` (or `notes: (none)`), the lines of `notes.md` in `$TURNPIKE_WORKSPACE` before this turn, then appends `<text>` to it (`no workspace` without one) |
//! | `workspace-note-die-once:<text>` | as `workspace-note`, but on attempt 1 it appends and then dies (exit 1) without a reply |
//! | `workspace-fill:<bytes>` | writes a file of `<bytes>` bytes into the workspace, then replies |
//! | anything else | echoes the text back |
//!
//! The modifier `with-attachments` makes the agent send a status line describing its attachments
//! (path, size, FNV-1a) first and append the same to replies.
//!
//! The modifier `show-prompt` anywhere in the text makes the agent send its prompt as a status
//! line first and quote it in replies (tests read the retry preamble that way).

mod net;

use serde_json::json;
use std::io::{Read, Write};
use std::time::Duration;
use turnpike_core::wire::AgentInput;

/// Exit code when `oom` reached its cap without being killed: the memory limit is missing.
const OOM_CAP_EXIT: i32 = 86;
const OOM_CAP_BYTES: usize = 1 << 30;

fn emit(value: serde_json::Value) {
    let mut out = std::io::stdout().lock();
    // A closed stdout means the runner is gone; nothing useful is left to do.
    if writeln!(out, "{value}").and_then(|_| out.flush()).is_err() {
        std::process::exit(2);
    }
}

/// One diagnostic line on stderr, in a single write. Stderr is unbuffered, and `eprintln!` with
/// arguments writes each piece on its own: seven writes, and as many wake-ups of the runner's
/// reader, for the start-up line alone.
fn diag(line: std::fmt::Arguments) {
    let line = format!("test-agent: {line}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

fn raw_line(line: &str) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
        std::process::exit(2);
    }
}

fn message(text: &str) {
    emit(json!({"type": "message", "text": text}));
}

fn status(text: &str) {
    emit(json!({"type": "status", "text": text}));
}

fn result_ok() {
    emit(json!({"type": "result", "status": "ok"}));
}

/// FNV-1a, 64 bit, as hex: enough to tell bytes apart in a test.
pub fn fnv1a(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Secret `name`'s file, as the runner gave it (`$TURNPIKE_SECRETS/<name>`).
fn secret_file(name: &str) -> Option<Vec<u8>> {
    let dir = std::env::var_os("TURNPIKE_SECRETS")?;
    std::fs::read(std::path::Path::new(&dir).join(name)).ok()
}

fn hang() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Run the agent: read the input document from stdin, act, exit. Never returns.
pub fn run() -> ! {
    let mut raw = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut raw) {
        diag(format_args!("cannot read stdin: {e}"));
        std::process::exit(3);
    }
    let input: AgentInput = match serde_json::from_slice(&raw) {
        Ok(i) => i,
        Err(e) => {
            diag(format_args!("stdin is not a Turnpike input document: {e}"));
            std::process::exit(3);
        }
    };
    diag(format_args!(
        "turn {} attempt {} of {}",
        input.work.turn, input.work.attempt, input.work.max_attempts
    ));
    let text = input.work.message.text.trim().to_owned();
    let directive = text
        .split_whitespace()
        .find(|w| *w != "show-prompt" && *w != "with-attachments")
        .unwrap_or("")
        .to_owned();
    let (name, arg) = match directive.split_once(':') {
        Some((n, a)) => (n.to_owned(), Some(a.to_owned())),
        None => (directive.clone(), None),
    };
    let script = Script {
        show_prompt: text.split_whitespace().any(|w| w == "show-prompt"),
        with_attachments: text.split_whitespace().any(|w| w == "with-attachments"),
        arg: arg.as_deref(),
        text: &text,
        input: &input,
    };
    if script.show_prompt {
        // Visible even on attempts that then die: status lines never count as a reply.
        status(&format!("prompt: {}", input.prompt));
    }
    if script.with_attachments {
        status(&format!("attachments: {}", script.attachment_summary()));
    }
    if !(script.lifecycle(&name) || script.abuse(&name) || script.told(&name)) {
        // Anything else is echoed back.
        script.reply(&text);
        result_ok();
    }
    std::process::exit(0)
}

/// The message's directive and what it asks of the run.
struct Script<'a> {
    input: &'a AgentInput,
    /// The message text, trimmed.
    text: &'a str,
    /// The directive's argument (`name:arg`).
    arg: Option<&'a str>,
    /// Replies carry the prompt (`show-prompt`).
    show_prompt: bool,
    /// Replies carry a summary of the attachments (`with-attachments`).
    with_attachments: bool,
}

impl Script<'_> {
    /// Each attachment's path, length and hash.
    fn attachment_summary(&self) -> String {
        self.input
            .attachments
            .iter()
            .map(|path| match std::fs::read(path) {
                Ok(bytes) => format!("{path} {} {}", bytes.len(), fnv1a(&bytes)),
                Err(e) => format!("{path} unreadable: {e}"),
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// A bot message, with the prompt and attachments if the message asked for them.
    fn reply(&self, body: &str) {
        let mut body = body.to_owned();
        if self.with_attachments {
            body = format!("{body} | attachments: {}", self.attachment_summary());
        }
        if self.show_prompt {
            body = format!("{body} | prompt: {}", self.input.prompt);
        }
        message(&body);
    }

    /// Reply what the run was given: its profile and its deadline.
    fn run_info(&self) {
        self.reply(&format!(
            "profile {} deadline {}",
            self.input.work.profile.as_deref().unwrap_or("-"),
            self.input.deadline
        ));
        result_ok();
    }

    /// The directive's argument as a number; exit 4 if it is not one.
    fn number(&self, what: &str) -> u64 {
        self.arg.and_then(|a| a.parse().ok()).unwrap_or_else(|| {
            diag(format_args!("{what} needs a number, e.g. {what}:3"));
            std::process::exit(4);
        })
    }

    /// How the run ends: replies, deaths, hangs, verdicts, silence. `false` if `name` is none of these.
    fn lifecycle(&self, name: &str) -> bool {
        match name {
            "reply" => {
                let rest = self
                    .text
                    .split_once("reply:")
                    .map(|(_, r)| r.replace("show-prompt", ""))
                    .unwrap_or_default();
                self.reply(rest.trim());
                result_ok();
            }
            "crash-after-reply" => {
                // `crash-after-reply:2`: wait 2 s first (a test arranges a fault meanwhile).
                if let Some(secs) = self.arg.and_then(|a| a.parse::<f64>().ok()) {
                    std::thread::sleep(Duration::from_secs_f64(secs.max(0.0)));
                }
                self.reply("partial answer before crashing");
                std::process::exit(1);
            }
            "oom" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                let chunk = 16 << 20;
                while hoard.len() * chunk < OOM_CAP_BYTES {
                    // Touch every page so the memory is really committed.
                    hoard.push(vec![0xA5; chunk]);
                }
                diag(format_args!(
                    "allocated 1 GiB without being killed: no memory limit?"
                ));
                std::process::exit(OOM_CAP_EXIT);
            }
            "hang" => hang(),
            "sleep" => {
                let secs: f64 = self.arg.and_then(|a| a.parse().ok()).unwrap_or_else(|| {
                    diag(format_args!("sleep needs seconds, e.g. sleep:2"));
                    std::process::exit(4);
                });
                std::thread::sleep(Duration::from_secs_f64(secs.max(0.0)));
                self.reply(&format!("slept {secs}s"));
                result_ok();
            }
            "hang-until" => {
                if u64::from(self.input.work.attempt) < self.number("hang-until") {
                    hang();
                }
                self.reply(&format!("answered on attempt {}", self.input.work.attempt));
                result_ok();
            }
            "fail" => {
                emit(
                    json!({"type": "result", "status": "error", "error": "the test agent was told to fail"}),
                );
            }
            "silent" => {}
            "die-until" => {
                if u64::from(self.input.work.attempt) < self.number("die-until") {
                    diag(format_args!("dying on attempt {}", self.input.work.attempt));
                    std::process::exit(1);
                }
                self.reply(&format!("answered on attempt {}", self.input.work.attempt));
                result_ok();
            }
            "status" => {
                let n = self.number("status");
                for i in 1..=n {
                    status(&format!("working {i}/{n}"));
                    std::thread::sleep(Duration::from_millis(20));
                }
                self.reply(&format!("done after {n} status updates"));
                result_ok();
            }
            "reply-then-exit" => {
                // `reply-then-exit:2`: answer, then end cleanly 2 s later (a test cuts the runner
                // off meanwhile, so its exit report is late).
                self.reply("an answer, then a clean exit");
                let secs: f64 = self.arg.and_then(|a| a.parse().ok()).unwrap_or(0.0);
                std::thread::sleep(Duration::from_secs_f64(secs.max(0.0)));
                result_ok();
            }
            "reply-then-hang" => {
                self.reply("an answer, then silence");
                hang();
            }
            "summary-before-deadline" => {
                // What a real agent should do with its deadline: answer in time, in short.
                let margin: f64 = self.arg.and_then(|a| a.parse().ok()).unwrap_or(1.0);
                let deadline = self.input.deadline;
                let env = std::env::var("TURNPIKE_DEADLINE").unwrap_or_default();
                let left = deadline
                    .to_system_time()
                    .duration_since(std::time::SystemTime::now())
                    .unwrap_or_default();
                std::thread::sleep(left.saturating_sub(Duration::from_secs_f64(margin.max(0.0))));
                self.reply(&format!(
                    "summary before the deadline {deadline} (TURNPIKE_DEADLINE {})",
                    if env == deadline.to_string() {
                        "agrees"
                    } else {
                        "differs"
                    }
                ));
                result_ok();
            }
            _ => return false,
        }
        true
    }

    /// What a careless or hostile agent writes: garbage, floods, huge lines, files it may not write. `false` if `name` is none of these.
    fn abuse(&self, name: &str) -> bool {
        match name {
            "garbage" => {
                raw_line("this is not json");
                raw_line("{\"type\": \"message\", \"text\": ");
                raw_line("{\"type\":\"teleport\",\"text\":\"unknown type\"}");
                raw_line(&format!(
                    "{{\"type\":\"message\",\"text\":\"{}\"}}",
                    "x".repeat(2 << 20)
                ));
                raw_line("");
                self.reply("survived the garbage");
                result_ok();
            }
            "attachments" => {
                message(&self.attachment_summary());
                result_ok();
            }
            "secret" => {
                let (name, var) = match self.arg.unwrap_or_default().split_once(':') {
                    Some((n, v)) => (n, Some(v)),
                    None => (self.arg.unwrap_or_default(), None),
                };
                let file = secret_file(name).map(|v| fnv1a(&v));
                let env = var
                    .and_then(|v| std::env::var(v).ok())
                    .map(|v| fnv1a(v.as_bytes()));
                self.reply(&format!(
                    "secret {name} file {} env {}",
                    file.unwrap_or_else(|| "missing".into()),
                    env.unwrap_or_else(|| "missing".into())
                ));
                result_ok();
            }
            "leak" | "leak-fail" => {
                let fail = name == "leak-fail";
                let value = secret_file(self.arg.unwrap_or_default())
                    .map(|v| String::from_utf8_lossy(&v).trim_end().to_owned())
                    .unwrap_or_default();
                if fail {
                    emit(
                        json!({"type": "result", "status": "error", "error": format!("refused with key {value}")}),
                    );
                    std::process::exit(0);
                }
                status(&format!("calling the model with key {value}"));
                diag(format_args!("Authorization: Bearer {value}"));
                raw_line(&format!("debug: key={value}"));
                if self.input.work.attempt < 2 {
                    emit(
                        json!({"type": "result", "status": "error", "error": format!("401 for key {value}")}),
                    );
                    std::process::exit(1);
                }
                self.reply(&format!("my key is {value}"));
                result_ok();
            }
            "error-and-die" => {
                // `error-and-die:<n>`: reports an error of n control characters (six bytes each in
                // JSON), then dies (exit 1): retried, and each attempt's error joins the record.
                let n = self.number("error-and-die");
                emit(
                    json!({"type": "result", "status": "error", "error": "\u{1}".repeat(n as usize)}),
                );
                std::process::exit(1);
            }
            "fail-huge" => {
                raw_line(&format!(
                    "{{\"type\":\"result\",\"status\":\"error\",\"error\":\"{}\"}}",
                    "e".repeat(2 << 20)
                ));
            }
            "big-reply" => {
                let n = self.number("big-reply") as usize;
                self.reply(&"b".repeat(n));
                result_ok();
            }
            "flood" => {
                let n = self.number("flood");
                for i in 1..=n {
                    message(&format!("flood {i}/{n}"));
                }
                result_ok();
            }
            "workspace-note" | "workspace-note-die-once" | "workspace-fill" => {
                let Some(dir) = std::env::var_os("TURNPIKE_WORKSPACE") else {
                    self.reply("no workspace");
                    result_ok();
                    return true;
                };
                let dir = std::path::PathBuf::from(dir);
                let arg = self.arg.unwrap_or_default();
                if name == "workspace-fill" {
                    let n = self.number("workspace-fill") as usize;
                    let wrote = std::fs::write(dir.join("fill.bin"), vec![b'f'; n]);
                    self.reply(&format!("filled {n}: {wrote:?}"));
                    result_ok();
                    return true;
                }
                let notes = dir.join("notes.md");
                let before = std::fs::read_to_string(&notes).unwrap_or_default();
                let lines: Vec<&str> = before.lines().collect();
                let appended = std::fs::write(&notes, format!("{before}{arg}\n"));
                if name == "workspace-note-die-once" && self.input.work.attempt == 1 {
                    std::process::exit(1);
                }
                if lines.is_empty() {
                    self.reply(&format!("notes: (none) {appended:?}"));
                } else {
                    self.reply(&format!("notes: {} {appended:?}", lines.join("|")));
                }
                result_ok();
            }
            "fetch" => {
                let lines: Vec<String> = self
                    .arg
                    .unwrap_or_default()
                    .split(',')
                    .filter(|i| !i.is_empty())
                    .map(net::probe)
                    .collect();
                self.reply(&lines.join("\n"));
                result_ok();
            }
            "write-file" => {
                let path = self.arg.unwrap_or("/");
                match std::fs::write(path, b"x") {
                    Ok(()) => self.reply(&format!("wrote {path}")),
                    Err(e) => self.reply(&format!("refused {path}: {e}")),
                }
                result_ok();
            }
            _ => return false,
        }
        true
    }

    /// Runs that wait for a test to change the world (a file appearing). `false` if `name` is none of these.
    fn told(&self, name: &str) -> bool {
        match name {
            "die-once-when-file" if self.input.work.attempt > 1 => {
                self.run_info();
                true
            }
            "run-info" => {
                self.run_info();
                true
            }
            "alloc" => {
                let mib = self.number("alloc") as usize;
                let mut hoard: Vec<Vec<u8>> = Vec::with_capacity(mib);
                for _ in 0..mib {
                    // Every page touched, so the memory is really committed.
                    hoard.push(vec![0x5A; 1 << 20]);
                }
                self.reply(&format!("allocated {} MiB", hoard.len()));
                result_ok();
                true
            }
            "die-when-file" | "die-once-when-file" => {
                // `die-when-file:/tmp/x`: exit 1 (a death, no reply) once the file exists: a test
                // changes the world while the attempt runs, then lets it end.
                let Some(path) = self.arg else {
                    diag(format_args!("die-when-file needs a path"));
                    std::process::exit(4);
                };
                while !std::path::Path::new(path).exists() {
                    std::thread::sleep(Duration::from_millis(20));
                }
                std::process::exit(1);
            }
            "reply-when-file" => {
                // `reply-when-file:/tmp/x`: answer once the file exists, then hang; lets a test
                // watch a running turn before and after its reply lands, with no timing involved.
                let Some(path) = self.arg else {
                    diag(format_args!("reply-when-file needs a path"));
                    std::process::exit(4);
                };
                while !std::path::Path::new(path).exists() {
                    std::thread::sleep(Duration::from_millis(20));
                }
                self.reply("an answer, once told");
                hang();
            }
            // Both wait, then end the run: neither returns.
            _ => false,
        }
    }
}
