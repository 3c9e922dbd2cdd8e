//! What a turn's page reads of its replies: from the chat's output, up to the turn's own final
//! status, within a bound per view.

use super::*;
use turnpike_core::wire::OutboundKind;

/// An ended turn's replies are read up to its final status, not on through the chat's later
/// turns: a bound of exactly its own items is enough. A smaller bound says the list is cut short
/// instead of failing the page.
#[tokio::test]
async fn a_turns_replies_are_read_up_to_its_end_within_a_bound() {
    init_logs();
    let p = Pipeline::start(AGENT, |_| {}).await;
    let first = send(&p.bus, "talky", "m-1", "flood:4").await;
    wait_ended(&p.bus, &first, WAIT).await;
    let second = send(&p.bus, "talky", "m-2", "flood:3").await;
    wait_ended(&p.bus, &second, WAIT).await;
    let record = turnpike_store::turns::load(&p.bus, &first)
        .await
        .expect("load")
        .expect("record")
        .record;
    let items = turnpike_tests::chat_items(&p.bus, "talky").await;
    let own = items.iter().filter(|i| i.turn == first).count();
    assert!(
        items.iter().skip(own).any(|i| i.turn == second),
        "the second turn's output follows the first's: {items:?}"
    );

    let read = |max| turnpike_store::fence::turn_output(&p.bus, &record.chat, &first, max);
    let all = read(own).await.expect("read");
    assert!(all.complete, "stopped at the turn's final status");
    assert_eq!(all.messages.len(), 4, "{all:?}");
    assert!(all
        .messages
        .iter()
        .all(|m| m.turn == first && m.kind == OutboundKind::Message));

    let cut = read(2).await.expect("read");
    assert!(!cut.complete);
    assert_eq!(cut.messages.len(), 2, "{cut:?}");

    let later = turnpike_store::fence::turn_output(&p.bus, &record.chat, &second, 100)
        .await
        .expect("read");
    assert!(later.complete);
    assert_eq!(later.messages.len(), 3, "{later:?}");
    assert!(later.messages.iter().all(|m| m.turn == second));
    p.stop().await;
}
