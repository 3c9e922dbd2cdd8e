//! Issue 32: one clock. Every death is dated by the servers' clock, from which its retry's due
//! time follows. A test binary of its own: it makes this whole process's clock run an hour fast,
//! as on a coordinator host whose clock is wrong.

use std::time::Duration;
use turnpike_core::record::TurnState;
use turnpike_core::wire::ExitClass;
use turnpike_tests::*;

const AGENT: &str = env!("CARGO_BIN_EXE_test-agent");

/// An attempt whose runner never wrote a lease is declared lost by the sweep. Its death was
/// dated by the coordinator's clock, and its retry scheduled from there: a clock an hour fast
/// held the chat for an hour. Dated by the marker that fences it out, the retry runs after the
/// retry delay. (Fails with the death dated by `now()`.)
#[tokio::test]
async fn a_lost_attempt_is_dated_by_the_servers_clock_not_a_fast_coordinators() {
    init_logs();
    let p = Pipeline::start(AGENT, |c| {
        // No lease is written within the test: the attempt has only its claim.
        c.heartbeat = Duration::from_secs(20);
        c.lease = Duration::from_secs(60);
        c.max_turn_retry = 2;
        c.retry_delay = Duration::from_secs(1);
    })
    .await;
    turnpike_jetstream::skew_clock_for_tests(Duration::from_secs(3600));
    let turn = send(&p.bus, "clock", "k1", "hang-until:2").await;
    wait_state(&p.bus, &turn, TurnState::Running).await;
    let sweep_config = turnpike_config::Config {
        lease: Duration::from_millis(300),
        ..p.config.clone()
    };
    let mut sweeper = turnpike_coordinator::sweep::Sweeper::default();
    sweeper
        .pass(&p.bus, &sweep_config, &Default::default())
        .await
        .expect("sweep");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let lost = sweeper
        .pass(&p.bus, &sweep_config, &Default::default())
        .await
        .expect("sweep");
    assert_eq!(lost.runner_lost, 1, "{lost:?}");
    // Attempt 2 runs a second after the loss by the servers' clock, not an hour later.
    let r = wait_ended(&p.bus, &turn, Duration::from_secs(60)).await;
    assert_eq!(r.state, TurnState::Done, "{r:#?}");
    assert_eq!(
        r.attempts[0].exit.as_ref().map(|e| e.class),
        Some(ExitClass::RunnerLost)
    );
    let due = r.attempts[1].due_at.expect("a due time");
    let published = r.attempts[1].published_at.expect("published");
    assert!(
        published.since(due) < Duration::from_secs(30)
            && due.since(published) < Duration::from_secs(30),
        "due {due:?}, published {published:?}"
    );
    p.stop().await;
}
