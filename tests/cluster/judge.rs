//! Load and verdicts: publishing inbound messages the way a chat would, waiting for turns to
//! end, and judging each turn against what its script should have produced (lost, duplicated,
//! wrong outcome), with the suite's summary.

use super::*;

/// Publish an inbound message until JetStream acknowledges it (a node may be down), trying for up
/// to `secs`; the same message id each time, so a retry is never a second message.
pub async fn send_acked(bus: &Bus, chat: &str, id: &str, text: &str, secs: u64) -> TurnId {
    try_send(bus, chat, id, text, secs)
        .await
        .unwrap_or_else(|| panic!("inbound {id} not acknowledged within {secs}s"))
}

/// `send_acked` that reports failure instead of panicking: `None` if never acknowledged.
pub async fn try_send(bus: &Bus, chat: &str, id: &str, text: &str, secs: u64) -> Option<TurnId> {
    let chat_id = turnpike_core::ChatId::new(chat).expect("chat id");
    let msg =
        turnpike_core::wire::InboundMessage::new(chat_id, id, text, Some("fault-suite".into()));
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if turnpike_jetstream::publish_inbound(&bus.js, bus.codec, &msg)
            .await
            .is_ok()
        {
            return Some(msg.turn());
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Wait until every turn is terminal with its effects done (or `timeout`); the records as they
/// are then (`None`: the turn does not exist).
pub async fn wait_all_ended(
    bus: &Bus,
    turns_: &[TurnId],
    timeout: Duration,
) -> Vec<Option<TurnRecord>> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut out = Vec::with_capacity(turns_.len());
        let mut done = true;
        for t in turns_ {
            let record = turns::load(bus, t).await.ok().flatten().map(|v| v.record);
            // Its effects are carried out once it has left the live index.
            done &= record.as_ref().is_some_and(|r| r.state.is_terminal())
                && matches!(turnpike_store::live::is_listed(bus, t).await, Ok(false));
            out.push(record);
        }
        if done || Instant::now() >= deadline {
            return out;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every outbound item of every chat, grouped by turn.
pub async fn outbound_by_turn(bus: &Bus) -> HashMap<String, Vec<OutboundItem>> {
    let mut out: HashMap<String, Vec<OutboundItem>> = HashMap::new();
    for item in crate::outbound(&bus.js, subjects::CHAT_OUT_ALL).await {
        out.entry(item.turn.to_string()).or_default().push(item);
    }
    out
}

/// What a turn must end as, by the lifecycle table.
#[derive(Clone, Debug)]
pub struct Expect {
    pub turn: TurnId,
    pub state: TurnState,
    /// Exactly this many attempts, when the faults cannot add any (else only the consistency).
    pub attempts: Option<usize>,
    /// Bot messages that must land (exactly).
    pub replies: usize,
}

/// The expectation for a test-agent script with budget `n`, when no fault can cost an attempt.
pub fn expect_script(turn: TurnId, text: &str, n: u32) -> Expect {
    let n = n.max(1) as usize;
    if let Some(k) = text
        .strip_prefix("die-until:")
        .and_then(|k| k.parse::<usize>().ok())
    {
        return if k <= n {
            Expect {
                turn,
                state: TurnState::Done,
                attempts: Some(k.max(1)),
                replies: 1,
            }
        } else {
            Expect {
                turn,
                state: TurnState::GaveUp,
                attempts: Some(n),
                replies: 0,
            }
        };
    }
    Expect {
        turn,
        state: TurnState::Done,
        attempts: Some(1),
        replies: 1,
    }
}

/// One row of the fault suite's summary.
#[derive(Debug, Default)]
pub struct Tally {
    pub case: String,
    pub turns: usize,
    pub lost: usize,
    pub duplicated: usize,
    pub wrong: usize,
    pub problems: Vec<String>,
    pub note: String,
}

/// Judge every turn against its expectation: lost (never ended), duplicated (a second bot
/// message or notice), wrong (state, attempt count, or an inconsistent record).
pub async fn judge(bus: &Bus, case: &str, expects: &[Expect], timeout: Duration) -> Tally {
    let ids: Vec<TurnId> = expects.iter().map(|e| e.turn.clone()).collect();
    let records = wait_all_ended(bus, &ids, timeout).await;
    let outbound = outbound_by_turn(bus).await;
    let mut t = Tally {
        case: case.to_owned(),
        turns: expects.len(),
        ..Tally::default()
    };
    for (e, r) in expects.iter().zip(records) {
        let Some(r) = r.filter(|r| r.state.is_terminal()) else {
            t.lost += 1;
            t.problems.push(format!("{}: never ended", e.turn));
            continue;
        };
        let items = outbound.get(e.turn.as_str()).cloned().unwrap_or_default();
        let messages = items
            .iter()
            .filter(|i| i.kind == OutboundKind::Message)
            .count();
        let notices = items
            .iter()
            .filter(|i| i.kind == OutboundKind::Notice)
            .count();
        if messages > e.replies || notices > 1 {
            t.duplicated += 1;
            t.problems.push(format!(
                "{}: {messages} bot messages (want {}), {notices} notices",
                e.turn, e.replies
            ));
        }
        let mut wrong = Vec::new();
        if r.state != e.state {
            wrong.push(format!("state {} (want {})", r.state, e.state));
        }
        if messages < e.replies {
            wrong.push(format!("{messages} bot messages (want {})", e.replies));
        }
        if let Some(n) = e.attempts {
            if r.attempts.len() != n {
                wrong.push(format!("{} attempts (want {n})", r.attempts.len()));
            }
        }
        wrong.extend(inconsistencies(&r));
        if !wrong.is_empty() {
            t.wrong += 1;
            t.problems.push(format!("{}: {}", e.turn, wrong.join("; ")));
        }
    }
    t
}

/// What the lifecycle table forbids in any ended record: more attempts than the budget, gaps in
/// attempt numbers, a retry after a reply or a clean exit, a retry without its preamble, a notice
/// on a turn that replied and ended well, a give-up without its notice.
pub fn inconsistencies(r: &TurnRecord) -> Vec<String> {
    let mut out = Vec::new();
    if r.attempts.len() > r.max_attempts as usize {
        out.push(format!(
            "{} attempts over a budget of {}",
            r.attempts.len(),
            r.max_attempts
        ));
    }
    for (i, a) in r.attempts.iter().enumerate() {
        if a.n as usize != i + 1 {
            out.push(format!("attempt #{} numbered {}", i + 1, a.n));
        }
        let last = i + 1 == r.attempts.len();
        if !last {
            let died = a.exit.as_ref().map(|x| x.class.is_death()).unwrap_or(false);
            if !died || a.messages_landed > 0 {
                out.push(format!(
                    "attempt {} was retried but it {}",
                    a.n,
                    if a.messages_landed > 0 {
                        "had replied"
                    } else {
                        "did not die"
                    }
                ));
            }
        }
        if a.n >= 2 {
            let want = turnpike_core::texts::retry_preamble(a.n, r.max_attempts);
            if a.preamble.as_deref() != Some(want.as_str()) {
                out.push(format!("attempt {} preamble {:?}", a.n, a.preamble));
            }
        }
    }
    if r.state == TurnState::GaveUp {
        let want = turnpike_core::texts::give_up_notice(r.max_attempts);
        if r.notice.as_ref().map(|n| n.text.as_str()) != Some(want.as_str()) {
            out.push(format!("give-up notice {:?}", r.notice));
        }
    }
    out
}

impl Tally {
    /// Print the row, add it to the suite's summary file, and fail the case unless every count
    /// of lost, duplicated and wrong turns is zero.
    pub fn report(self) {
        let row = format!(
            "{}\t{}\t{}\t{}\t{}\t{}",
            self.case, self.turns, self.lost, self.duplicated, self.wrong, self.note
        );
        eprintln!("case\tturns\tlost\tduplicated\twrong outcome\tnote\n{row}");
        let path = summary_path();
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            let _ = writeln!(f, "{row}");
        }
        assert!(
            self.lost == 0 && self.duplicated == 0 && self.wrong == 0 && self.turns > 0,
            "{}: {} lost, {} duplicated, {} wrong of {} turns:\n{}",
            self.case,
            self.lost,
            self.duplicated,
            self.wrong,
            self.turns,
            self.problems.join("\n")
        );
    }
}

/// Where the suite's rows go: `$TURNPIKE_FAULT_SUMMARY`, else target/fault-summary.tsv.
pub fn summary_path() -> std::path::PathBuf {
    std::env::var_os("TURNPIKE_FAULT_SUMMARY")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fault-summary.tsv")
        })
}

/// Scale of the load: 1 for CI, more for the soak (`TURNPIKE_SOAK=<factor>`).
pub fn soak() -> usize {
    std::env::var("TURNPIKE_SOAK")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|n| *n >= 1)
        .unwrap_or(1)
}
