use super::*;

#[test]
fn lost_rounds_wait_out_a_proposal_for_seconds_and_start_at_once() {
    let waits: Vec<Duration> = pauses().take(CAS_ROUNDS).collect();
    assert_eq!(waits[0], Duration::from_millis(2));
    assert!(waits.iter().all(|w| *w <= Duration::from_millis(250)));
    let total: Duration = waits.iter().sum();
    // Twenty rounds back to back lasted a few tens of milliseconds; a busy cluster's
    // proposal outlasted them.
    assert!(
        total >= Duration::from_secs(3) && total <= Duration::from_secs(5),
        "{total:?}"
    );
}
