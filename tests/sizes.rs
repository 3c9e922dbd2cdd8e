//! Issue 32: no message, name or agent output can wedge a chat. Each test first does what used to
//! silence a chat for good (a record, notice or report past NATS's `max_payload`, retried
//! forever), then checks that the same chat answers its next message within seconds. And an
//! error no retry can change (NATS refusing a payload as too large) ends the turn, or refuses the
//! message, with a notice: never an endless retry.

use std::time::Duration;
use turnpike_core::record::OutcomeReason;
use turnpike_core::record::TurnState;
use turnpike_core::sizes;
use turnpike_core::wire::{Attachment, ChatErrorCause, OutboundKind};
use turnpike_core::{texts, TurnId};
use turnpike_tests::*;

const AGENT: &str = env!("CARGO_BIN_EXE_test-agent");
/// "Within seconds": the chat's next message is answered in this time, or the chat is wedged.
const SECONDS: Duration = Duration::from_secs(30);

/// The chat's next message is answered: the proof that what came before did not wedge it.
async fn answers_next(p: &Pipeline, chat: &str, id: &str) {
    let next = send(&p.bus, chat, id, "reply:still here").await;
    let r = wait_ended(&p.bus, &next, SECONDS).await;
    assert_eq!(r.state, TurnState::Done, "{r:?}");
    assert_eq!(r.attempts.len(), 1);
    let items = visible_items(&p.bus, chat).await;
    assert!(
        items
            .iter()
            .any(|i| i.turn == next && i.kind == OutboundKind::Message && i.text == "still here"),
        "{items:?}"
    );
}

/// The notice a turn's chat got (waiting for it).
async fn notice_of(p: &Pipeline, chat: &str, turn: &TurnId) -> String {
    turnpike_testkit::eventually(SECONDS, &format!("a notice for {turn}"), || async {
        visible_items(&p.bus, chat)
            .await
            .into_iter()
            .find(|i| &i.turn == turn && i.kind == OutboundKind::Notice)
            .map(|i| i.text)
    })
    .await
}

/// Case 1: text that JSON escapes six-fold (U+0001). Messages that fit the budget in encoded
/// bytes are answered, and their history stays in its encoded budget; one past it is refused
/// with a notice saying so; the chat answers on.
#[tokio::test]
async fn text_that_json_escapes_is_budgeted_encoded_and_never_wedges_its_chat() {
    init_logs();
    let p = Pipeline::start(AGENT, |c| c.runner_slots = 1).await;
    let fits = "\u{1}".repeat(10_000); // 60,000 bytes in JSON, under 64 KiB
    let mut last = None;
    for i in 0..6 {
        last = Some(send(&p.bus, "escapes", &format!("f{i}"), &fits).await);
    }
    let too_big = send(&p.bus, "escapes", "big", &"\u{1}".repeat(60_000)).await;
    let r = wait_ended(&p.bus, &last.expect("sent"), Duration::from_secs(60)).await;
    assert_eq!(r.state, TurnState::Done, "{r:?}");
    let history = sizes::encoded_len(&r.history);
    assert!(
        history <= 256 * 1024 + sizes::HISTORY_NOTE_MAX + 2,
        "{history}"
    );
    assert!(
        sizes::encoded_len(&r) <= p.config.budgets().record_max(),
        "{}",
        sizes::encoded_len(&r)
    );
    let notice = notice_of(&p, "escapes", &too_big).await;
    assert!(
        notice.contains("bytes encoded; the limit is 65536"),
        "{notice}"
    );
    answers_next(&p, "escapes", "after").await;
    p.stop().await;
}

/// Case 2: an attachment whose name is 300 KB of `"`. Refused, with a notice that quotes the
/// name cut short (it was quoted whole, escaped twice, past max_payload, and retried forever);
/// every later message of the chat goes.
#[tokio::test]
async fn a_huge_attachment_name_is_refused_with_a_short_notice() {
    init_logs();
    let p = Pipeline::start(AGENT, |_| {}).await;
    let name = "\"".repeat(300_000);
    let refused = send_message(
        &p.bus,
        "names",
        "n1",
        "reply:never",
        vec![Attachment {
            name: name.clone(),
            object: "names/missing".into(),
        }],
    )
    .await;
    let notice = notice_of(&p, "names", &refused).await;
    assert!(notice.len() <= 512, "{} bytes: {notice}", notice.len());
    assert!(
        notice.contains("attachment name \"\\\"\\\"") && notice.contains("the limit is 255"),
        "{notice}"
    );
    // The dead letter is stored after the notice.
    let reason = turnpike_testkit::eventually(SECONDS, "a dead letter", || async {
        dead_letters(&p.bus)
            .await
            .into_iter()
            .map(|(_, r)| r)
            .find(|r| r.contains("attachment name"))
    })
    .await;
    assert!(reason.len() <= sizes::REASON_MAX, "{}", reason.len());
    answers_next(&p, "names", "n2").await;
    p.stop().await;
}

/// Case 3: an agent that prints 150,000 bot messages. The first `attempt_messages_max` land, the
/// chat is told once that the reply was cut, the turn counts as replied; its record and exit
/// report say where the replies are in a bounded span, not one entry per message.
#[tokio::test]
async fn an_agent_that_talks_too_much_is_cut_and_its_chat_answers_on() {
    init_logs();
    let p = Pipeline::start(AGENT, |_| {}).await;
    let turn = send(&p.bus, "chatty", "c1", "flood:150000").await;
    let r = wait_ended(&p.bus, &turn, Duration::from_secs(120)).await;
    assert_eq!(r.state, TurnState::Done, "{r:?}");
    let outcome = r.outcome.as_ref().expect("outcome");
    assert_eq!(outcome.reason, OutcomeReason::Replied);
    let a = &r.attempts[0];
    assert_eq!(a.messages_landed, 1000);
    let exit = a.exit.as_ref().expect("exit");
    assert!(exit.output_cut, "{exit:?}");
    let span = a.reply_span.expect("where the replies are");
    assert!(span.last - span.first >= 999, "{span:?}");
    assert!(
        sizes::encoded_len(&r) < 16 * 1024,
        "{}",
        sizes::encoded_len(&r)
    );
    let items = visible_items(&p.bus, "chatty").await;
    let messages = items
        .iter()
        .filter(|i| i.turn == turn && i.kind == OutboundKind::Message)
        .count();
    assert_eq!(messages, 1000);
    let cut_notice = texts::output_cut_notice(1000, 8 << 20);
    let markers: Vec<_> = items
        .iter()
        .filter(|i| i.turn == turn && i.kind == OutboundKind::Notice)
        .collect();
    assert_eq!(markers.len(), 1, "{markers:?}");
    assert_eq!(markers[0].text, cut_notice);
    // The history holds the newest replies its budget allows, and says how many were left out.
    answers_next(&p, "chatty", "c2").await;
    let c = chat_record(&p.bus, "chatty").await;
    assert!(c.history.len() <= 51, "{}", c.history.len());
    assert!(c.history_dropped >= 950, "{}", c.history_dropped);
    p.stop().await;
}

/// Lower a stream's largest message, as an operator might: what Turnpike then builds past it is
/// refused by NATS for good.
async fn limit_stream(p: &Pipeline, stream: &str, max: i32) {
    let mut s = p.bus.js.get_stream(stream).await.expect("stream");
    let mut config = s.info().await.expect("info").config.clone();
    config.max_message_size = max;
    p.bus.js.update_stream(config).await.expect("update stream");
}

/// The turn ended failed for a permanent error: the plain notice, the chat flagged with the
/// reason, the reason in the record, a dead letter.
async fn ended_for_good(p: &Pipeline, chat: &str, turn: &TurnId, reason_has: &str) {
    let r = wait_ended(&p.bus, turn, SECONDS).await;
    assert_eq!(r.state, TurnState::Failed, "{r:?}");
    let outcome = r.outcome.clone().expect("outcome");
    assert_eq!(outcome.reason, OutcomeReason::PermanentError);
    let error = outcome.error.expect("the reason is kept");
    assert!(error.contains(reason_has), "{error}");
    assert_eq!(
        notice_of(p, chat, turn).await,
        texts::PLAIN_FAILURE_NOTICE,
        "the plain notice"
    );
    let c = chat_record(&p.bus, chat).await;
    let flag = c.errored.expect("flagged");
    assert_eq!(flag.cause, Some(ChatErrorCause::PermanentError));
    assert!(dead_letters(&p.bus)
        .await
        .iter()
        .any(|(subject, r)| subject == "turnpike.dead.turn" && r == &error));
}

/// A work item NATS refuses as too large (its stream's limit lowered): the turn ends failed at
/// once instead of its dispatch being retried forever; a small next message still runs.
#[tokio::test]
async fn a_work_item_nats_refuses_for_good_ends_its_turn() {
    init_logs();
    let p = Pipeline::start(AGENT, |_| {}).await;
    limit_stream(&p, "TURNPIKE_WORK", 8 * 1024).await;
    let turn = send(
        &p.bus,
        "work",
        "w1",
        &format!("reply:{}", "x".repeat(10_000)),
    )
    .await;
    ended_for_good(&p, "work", &turn, "cannot be dispatched").await;
    answers_next(&p, "work", "w2").await;
    p.stop().await;
}

/// A turn record that outgrows what its bucket takes mid-life (every attempt's error joins it,
/// the bucket's limit was lowered): the exit that cannot be written ends the turn; the chat
/// answers on.
#[tokio::test]
async fn a_turn_record_nats_refuses_mid_life_ends_the_turn() {
    init_logs();
    let p = Pipeline::start(AGENT, |c| c.max_turn_retry = 5).await;
    limit_stream(&p, "KV_turnpike_turns", 16 * 1024).await;
    // Each attempt's error is cut to 4 KiB encoded: the fourth no longer fits 16 KiB.
    let turn = send(&p.bus, "grows", "g1", "error-and-die:2000").await;
    ended_for_good(&p, "grows", &turn, "update turn").await;
    let r = wait_ended(&p.bus, &turn, SECONDS).await;
    assert!(r.attempts.len() < 5, "ended before its budget: {r:?}");
    answers_next(&p, "grows", "g2").await;
    p.stop().await;
}

/// A record that no longer fits at all (the limit lowered while its attempt ran): it is stored
/// compacted (history left out, texts and errors cut), and ended.
#[tokio::test]
async fn a_record_that_no_longer_fits_at_all_is_stored_compacted_and_ended() {
    init_logs();
    let p = Pipeline::start(AGENT, |_| {}).await;
    let go = std::env::temp_dir().join(format!("turnpike-compact-{}", std::process::id()));
    let _ = std::fs::remove_file(&go);
    let text = format!("die-when-file:{} {}", go.display(), "z".repeat(8_000));
    let turn = send(&p.bus, "shrinks", "s1", &text).await;
    wait_state(&p.bus, &turn, TurnState::Running).await;
    limit_stream(&p, "KV_turnpike_turns", 4 * 1024).await;
    std::fs::write(&go, b"").expect("tell the agent");
    ended_for_good(&p, "shrinks", &turn, "update turn").await;
    let r = wait_ended(&p.bus, &turn, SECONDS).await;
    assert!(
        sizes::str_len(&r.message.text) <= turnpike_core::record::COMPACT_TEXT_MAX,
        "stored compacted"
    );
    let _ = std::fs::remove_file(&go);
    answers_next(&p, "shrinks", "s2").await;
    p.stop().await;
}

/// A message whose turn record NATS refuses for good at its creation: refused with a notice and
/// a dead letter, never redelivered; the chat's next message goes.
#[tokio::test]
async fn a_message_whose_record_nats_refuses_is_refused_with_a_notice() {
    init_logs();
    let p = Pipeline::start(AGENT, |_| {}).await;
    limit_stream(&p, "KV_turnpike_turns", 4 * 1024).await;
    let turn = send(
        &p.bus,
        "norecord",
        "r1",
        &format!("reply:{}", "y".repeat(6_000)),
    )
    .await;
    let notice = notice_of(&p, "norecord", &turn).await;
    assert!(
        notice.starts_with("Could not take that message:"),
        "{notice}"
    );
    answers_next(&p, "norecord", "r2").await;
    p.stop().await;
}
