//! The nemesis's checker: the whole history of a run, judged turn by turn from what a user and an
//! operator see (the chat output stream, the turn records, the Docker engine's container events),
//! never from Turnpike's logs. Pure: the history is read first, then judged, so the rules are
//! unit-tested on histories made by hand.

use std::collections::HashMap;
use std::time::Duration;
use turnpike_core::wire::{ExitClass, OutboundItem, OutboundKind};
use turnpike_core::{TurnId, TurnRecord, TurnState};

/// A test-agent script of the workload, and what it does when nothing disturbs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Script {
    /// `reply:<text>`: one message, a clean exit.
    Reply,
    /// `sleep:<s>`: runs a while, then one message.
    Slow,
    /// `big-reply:<n>`: one long message.
    Long,
    /// `attachments` with one attachment: one message.
    Attachment,
    /// `die-until:2`: dies with no reply on attempt 1, replies from attempt 2.
    DieThenReply,
    /// `die-until:99`: always dies with no reply.
    AlwaysDie,
    /// `crash-after-reply`: replies, then exits 1 (a partial reply: never retried).
    PartialThenDie,
    /// `fail`: reports a failure and exits 0 (never retried).
    AgentFailure,
    /// `hang`, then an operator kill.
    HangThenKill,
}

impl Script {
    /// Messages a turn of this script lands in all, whatever the faults: one for a script that
    /// replies (on the attempt that did), none for the rest. A turn every attempt of which was
    /// lost to faults lands none.
    fn replies(self) -> usize {
        match self {
            Script::Reply
            | Script::Slow
            | Script::Long
            | Script::Attachment
            | Script::DieThenReply
            | Script::PartialThenDie => 1,
            Script::AlwaysDie | Script::AgentFailure | Script::HangThenKill => 0,
        }
    }

    /// How attempt `n` ends when no fault touches it.
    fn natural_exit(self, n: u32) -> ExitClass {
        match self {
            Script::Reply | Script::Slow | Script::Long | Script::Attachment => ExitClass::Clean,
            Script::DieThenReply if n >= 2 => ExitClass::Clean,
            Script::DieThenReply | Script::AlwaysDie | Script::PartialThenDie => ExitClass::Crashed,
            Script::AgentFailure => ExitClass::AgentFailed,
            Script::HangThenKill => ExitClass::OperatorKilled,
        }
    }
}

/// One inbound message of the workload.
#[derive(Clone, Debug)]
pub struct Sent {
    pub chat: String,
    /// Its place among the chat's messages.
    pub index: usize,
    pub turn: TurnId,
    pub script: Script,
}

/// An agent container's life, from the engine's events (unix milliseconds; `died` none while it
/// still ran when the history was read).
#[derive(Clone, Debug)]
pub struct AgentLife {
    pub turn: String,
    pub attempt: u32,
    pub started: i64,
    pub died: Option<i64>,
}

/// What the checker judges.
pub struct History {
    pub sent: Vec<Sent>,
    /// Each turn's record once the run settled (none: never created).
    pub records: HashMap<TurnId, TurnRecord>,
    /// Turns still in the live index when the run settled.
    pub listed: Vec<TurnId>,
    /// Every chat's output, in stream order.
    pub output: Vec<OutboundItem>,
    pub agents: Vec<AgentLife>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub turn: TurnId,
    pub chat: String,
    pub what: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (chat {}): {}", self.turn, self.chat, self.what)
    }
}

/// Every rule, every turn.
pub fn check(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut by_turn: HashMap<&str, Vec<&OutboundItem>> = HashMap::new();
    for item in &h.output {
        by_turn.entry(item.turn.as_str()).or_default().push(item);
    }
    let mut agents: HashMap<&str, Vec<&AgentLife>> = HashMap::new();
    for a in &h.agents {
        agents.entry(a.turn.as_str()).or_default().push(a);
    }
    for s in &h.sent {
        let items = by_turn.remove(s.turn.as_str()).unwrap_or_default();
        let lives = agents.remove(s.turn.as_str()).unwrap_or_default();
        let mut v = |what: String| {
            out.push(Violation {
                turn: s.turn.clone(),
                chat: s.chat.clone(),
                what,
            })
        };
        let Some(r) = h.records.get(&s.turn) else {
            v("never created".into());
            continue;
        };
        for what in turn_rules(s, r, &items, &lives) {
            v(what);
        }
        if h.listed.contains(&s.turn) {
            v(format!("still live ({}) after the cluster healed", r.state));
        }
    }
    out.extend(chat_order(&h.sent, &h.output));
    out
}

/// The rules about one turn.
fn turn_rules(
    s: &Sent,
    r: &TurnRecord,
    items: &[&OutboundItem],
    lives: &[&AgentLife],
) -> Vec<String> {
    let mut out = Vec::new();
    if !r.state.is_terminal() {
        out.push(format!("never ended: {} on attempt {}", r.state, r.attempt));
        return out;
    }
    // The lifecycle table's rules on the record (budget, numbering, retries only after a death
    // with no reply, the preamble, the give-up notice).
    out.extend(turnpike_tests::cluster::inconsistencies(r));

    // Each attempt ends as its script says, or lost to a fault; and what the stream holds of it
    // is what the record counts: nothing from an attempt after it was fenced out.
    for a in &r.attempts {
        let class = a.exit.as_ref().map(|x| x.class);
        let want = s.script.natural_exit(a.n);
        match class {
            Some(c) if c == want => {}
            Some(ExitClass::RunnerLost) => {}
            // A kill can end an attempt lost to a fault before its runner reported.
            Some(ExitClass::OperatorKilled) if s.script == Script::HangThenKill => {}
            // Killed between its claim and its start: no exit of its own.
            None if r.state == TurnState::Killed => {}
            other => out.push(format!(
                "attempt {} ended {other:?}; its script ends {want:?} (or runner_lost)",
                a.n
            )),
        }
        let landed = items
            .iter()
            .filter(|i| i.kind == OutboundKind::Message && i.attempt == a.n)
            .count();
        if landed != a.messages_landed as usize {
            out.push(format!(
                "attempt {}: {landed} bot messages on the stream, the record counts {}",
                a.n, a.messages_landed
            ));
        }
    }
    let stray: Vec<u32> = items
        .iter()
        .filter(|i| i.kind == OutboundKind::Message && i.attempt as usize > r.attempts.len())
        .map(|i| i.attempt)
        .collect();
    if !stray.is_empty() {
        out.push(format!(
            "bot messages from attempts never recorded: {stray:?}"
        ));
    }

    // How it ended, by the rules applied to the last attempt: a clean exit is done; a
    // reported failure failed; a death after a reply failed (never retried); a death with no
    // reply, on the last attempt, gave up; a kill ends it killed.
    let messages = items
        .iter()
        .filter(|i| i.kind == OutboundKind::Message)
        .count();
    let last = r
        .attempts
        .last()
        .and_then(|a| a.exit.as_ref())
        .map(|x| x.class);
    let allowed: &[TurnState] = match last {
        _ if r.kill.is_some() && s.script == Script::HangThenKill => {
            // A kill that came after faults spent the budget finds the turn given up.
            &[TurnState::Killed, TurnState::GaveUp]
        }
        None => &[],
        Some(ExitClass::OperatorKilled) => &[TurnState::Killed],
        Some(ExitClass::Clean) => &[TurnState::Done],
        Some(ExitClass::AgentFailed) => &[TurnState::Failed],
        Some(_) if messages > 0 => &[TurnState::Failed],
        Some(_) => &[TurnState::GaveUp],
    };
    if !allowed.contains(&r.state) {
        out.push(format!(
            "ended {} (want {allowed:?}); attempts {:?}",
            r.state,
            r.attempts
                .iter()
                .map(|a| a.exit.as_ref().map(|x| x.class))
                .collect::<Vec<_>>()
        ));
    }
    let want = match r.state {
        TurnState::Done => s.script.replies(),
        TurnState::Failed if last != Some(ExitClass::AgentFailed) => 1,
        _ => 0,
    };
    if messages != want {
        out.push(format!("{messages} bot messages (want {want})"));
    }
    let notices = items
        .iter()
        .filter(|i| i.kind == OutboundKind::Notice)
        .count();
    if notices > 1 {
        out.push(format!("{notices} notices"));
    }

    // A retry only after the delay: its work item was stored, and its agent started, no sooner
    // than its due time (the death time the coordinator recorded, plus the delay).
    for a in r.attempts.iter().skip(1) {
        let Some(due) = a.due_at else {
            out.push(format!("attempt {} has no due time", a.n));
            continue;
        };
        let due = due.millis() as i64;
        if let Some(p) = a.published_at {
            if (p.millis() as i64) < due {
                out.push(format!(
                    "attempt {} published {} ms before it was due",
                    a.n,
                    due - p.millis() as i64
                ));
            }
        }
        for life in lives.iter().filter(|l| l.attempt == a.n) {
            // The engine's clock and the servers' are this host's; a millisecond for rounding.
            if life.started + 1 < due {
                out.push(format!(
                    "attempt {}'s agent started {} ms before it was due",
                    a.n,
                    due - life.started
                ));
            }
        }
    }

    // Never two agents of one turn alive at once.
    for (i, x) in lives.iter().enumerate() {
        for y in &lives[i + 1..] {
            if x.attempt == y.attempt {
                out.push(format!("attempt {} ran in two containers", x.attempt));
                continue;
            }
            let x_end = x.died.unwrap_or(i64::MAX);
            let y_end = y.died.unwrap_or(i64::MAX);
            if x.started < y_end && y.started < x_end {
                let overlap = x_end.min(y_end) - x.started.max(y.started);
                out.push(format!(
                    "the agents of attempts {} and {} were alive together for {} ms",
                    x.attempt,
                    y.attempt,
                    if overlap > 1 << 40 { -1 } else { overlap }
                ));
            }
        }
    }
    out
}

/// A chat's replies come in the order its messages were sent.
fn chat_order(sent: &[Sent], output: &[OutboundItem]) -> Vec<Violation> {
    let place: HashMap<&str, &Sent> = sent.iter().map(|s| (s.turn.as_str(), s)).collect();
    let mut last: HashMap<&str, &Sent> = HashMap::new();
    let mut out = Vec::new();
    for item in output.iter().filter(|i| i.kind == OutboundKind::Message) {
        let Some(s) = place.get(item.turn.as_str()) else {
            continue;
        };
        if let Some(prev) = last.get(s.chat.as_str()) {
            if prev.index > s.index {
                out.push(Violation {
                    turn: s.turn.clone(),
                    chat: s.chat.clone(),
                    what: format!(
                        "replied after message {} of its chat, sent later (it is message {})",
                        prev.index, s.index
                    ),
                });
            }
        }
        last.insert(s.chat.as_str(), s);
    }
    out
}

#[cfg(test)]
mod tests {
    //! Histories made by hand through the real lifecycle: one that keeps every rule passes, and
    //! each broken rule is caught.
    use super::*;
    use turnpike_core::lifecycle::{self, Event, NewTurn, Step};
    use turnpike_core::wire::{ExitReport, InboundMessage};
    use turnpike_core::{ChatId, RunnerId, Timestamp};

    const DELAY: Duration = Duration::from_secs(2);

    fn ts(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    /// A turn of chat `c` through the given events, each at its time.
    fn turn(id: &str, events: &[(Event, u64)]) -> TurnRecord {
        let (mut r, _) = lifecycle::create(
            NewTurn {
                turn: TurnId::new(id).expect("turn id"),
                message: InboundMessage::new(ChatId::new("c").expect("chat"), id, "x", None),
                history: Vec::new(),
                max_turn_retry: 3,
                retry_delay: DELAY,
                rerun_of: None,
                created_by: None,
                admit_now: true,
            },
            ts(0),
        );
        for (e, at) in events {
            if let Ok(Step::Changed { record, .. }) = lifecycle::apply(&r, e, ts(*at)) {
                r = *record;
            }
        }
        r
    }

    fn started(n: u32, at: u64) -> (Event, u64) {
        let runner = RunnerId::new("r1").expect("runner");
        (
            Event::Started {
                attempt: n,
                runner,
                published_at: ts(at),
            },
            at,
        )
    }
    fn landed(n: u32, at: u64) -> (Event, u64) {
        (
            Event::MessageLanded {
                attempt: n,
                seq: 1,
                stream_seq: None,
            },
            at,
        )
    }
    fn exited(n: u32, class: ExitClass, at: u64) -> (Event, u64) {
        (
            Event::Exited {
                attempt: n,
                report: ExitReport::without_output(class, "", ts(at)),
            },
            at,
        )
    }
    fn message(id: &str, attempt: u32) -> OutboundItem {
        OutboundItem {
            v: 1,
            kind: OutboundKind::Message,
            chat: ChatId::new("c").expect("chat"),
            turn: TurnId::new(id).expect("turn"),
            attempt,
            text: "hi".into(),
            status_id: None,
            r#final: false,
        }
    }
    fn life(id: &str, attempt: u32, started: i64, died: i64) -> AgentLife {
        AgentLife {
            turn: id.into(),
            attempt,
            started,
            died: Some(died),
        }
    }

    /// Attempt 1 dies at 1000 ms, attempt 2 is due at 3000 ms and replies.
    fn die_then_reply() -> History {
        let r = turn(
            "t-a",
            &[
                started(1, 100),
                exited(1, ExitClass::Crashed, 1000),
                started(2, 3100),
                landed(2, 3200),
                exited(2, ExitClass::Clean, 3300),
            ],
        );
        History {
            sent: vec![Sent {
                chat: "c".into(),
                index: 0,
                turn: r.turn.clone(),
                script: Script::DieThenReply,
            }],
            records: HashMap::from([(r.turn.clone(), r)]),
            listed: vec![],
            output: vec![message("t-a", 2)],
            agents: vec![life("t-a", 1, 100, 1000), life("t-a", 2, 3050, 3300)],
        }
    }

    fn whats(h: &History) -> Vec<String> {
        check(h).into_iter().map(|v| v.what).collect()
    }

    #[test]
    fn a_history_that_keeps_every_rule_passes() {
        assert_eq!(whats(&die_then_reply()), Vec::<String>::new());
    }

    #[test]
    fn a_retry_whose_agent_started_before_it_was_due_is_caught() {
        let mut h = die_then_reply();
        h.agents[1].started = 2500;
        let w = whats(&h);
        assert!(w.iter().any(|w| w.contains("before it was due")), "{w:?}");
    }

    #[test]
    fn two_agents_of_one_turn_alive_at_once_are_caught() {
        let mut h = die_then_reply();
        h.agents[0].died = Some(3100);
        let w = whats(&h);
        assert!(w.iter().any(|w| w.contains("alive together")), "{w:?}");
        h.agents[0].died = None;
        let w = whats(&h);
        assert!(w.iter().any(|w| w.contains("alive together")), "{w:?}");
    }

    #[test]
    fn a_message_the_record_does_not_count_is_caught() {
        let mut h = die_then_reply();
        // A message of the fenced-out attempt 1, or a second one of attempt 2.
        h.output.push(message("t-a", 1));
        let w = whats(&h);
        assert!(
            w.iter().any(|w| w.contains("attempt 1: 1 bot messages")),
            "{w:?}"
        );
        let mut h = die_then_reply();
        h.output.push(message("t-a", 2));
        let w = whats(&h);
        assert!(
            w.iter().any(|w| w.contains("2 bot messages (want 1)")),
            "{w:?}"
        );
    }

    #[test]
    fn an_end_the_script_cannot_have_is_caught() {
        let mut h = die_then_reply();
        h.sent[0].script = Script::AgentFailure;
        let w = whats(&h);
        assert!(
            w.iter().any(|w| w.contains("its script ends AgentFailed")),
            "{w:?}"
        );
        // Given up although an attempt replied cleanly: decided by the table, so only the
        // record's own rules can show it; a turn that never ended is caught outright.
        let r = turn("t-b", &[started(1, 100)]);
        let h = History {
            sent: vec![Sent {
                chat: "c".into(),
                index: 0,
                turn: r.turn.clone(),
                script: Script::Reply,
            }],
            listed: vec![r.turn.clone()],
            records: HashMap::from([(r.turn.clone(), r)]),
            output: vec![],
            agents: vec![],
        };
        let w = whats(&h);
        assert!(w.iter().any(|w| w.starts_with("never ended")), "{w:?}");
        assert!(w.iter().any(|w| w.starts_with("still live")), "{w:?}");
    }

    #[test]
    fn replies_out_of_their_chats_order_are_caught() {
        let first = turn(
            "t-1",
            &[
                started(1, 100),
                landed(1, 200),
                exited(1, ExitClass::Clean, 300),
            ],
        );
        let second = turn(
            "t-2",
            &[
                started(1, 400),
                landed(1, 500),
                exited(1, ExitClass::Clean, 600),
            ],
        );
        let sent = |id: &TurnId, index| Sent {
            chat: "c".into(),
            index,
            turn: id.clone(),
            script: Script::Reply,
        };
        let mut h = History {
            sent: vec![sent(&first.turn, 0), sent(&second.turn, 1)],
            records: HashMap::from([(first.turn.clone(), first), (second.turn.clone(), second)]),
            listed: vec![],
            output: vec![message("t-1", 1), message("t-2", 1)],
            agents: vec![],
        };
        assert_eq!(whats(&h), Vec::<String>::new());
        h.output.reverse();
        let w = whats(&h);
        assert!(w.iter().any(|w| w.contains("sent later")), "{w:?}");
    }
}
