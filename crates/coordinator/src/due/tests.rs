use super::*;
use proptest::prelude::*;

const PASS: Duration = Duration::from_secs(5);
fn timing() -> Timing {
    Timing::new(PASS)
}

fn turn(n: usize) -> TurnId {
    TurnId::new(format!("t-{n}")).expect("id")
}

fn seen(revision: u64, state: TurnState, attempt: u32) -> Seen {
    seen_with(revision, state, attempt, None, false)
}

fn seen_with(
    revision: u64,
    state: TurnState,
    attempt: u32,
    due: Option<Timestamp>,
    owes: bool,
) -> Seen {
    Seen {
        revision,
        updated_at: Timestamp::from_millis(1_000),
        owes,
        live: LiveTurn {
            turn: turn(0),
            chat: turnpike_core::ChatId::new("c").expect("chat"),
            state,
            attempt,
            max_attempts: 4,
            runner: None,
            started_at: None,
            next_attempt_due: due,
            created_at: Timestamp::from_millis(revision),
        },
    }
}

/// Wall-clock time `at` past the start.
fn wall(at: Duration) -> Timestamp {
    Timestamp::from_millis(1_000 + millis(at))
}

struct Clock {
    start: Instant,
    at: Duration,
}

impl Clock {
    fn new() -> Self {
        Clock {
            start: Instant::now(),
            at: Duration::ZERO,
        }
    }
    fn now(&self) -> Instant {
        self.start + self.at
    }
    fn wall(&self) -> Timestamp {
        wall(self.at)
    }
    fn pass(&mut self, index: &mut DueIndex) -> Due {
        let due = index.due(self.now(), self.wall());
        index.looked_at(&due.full, self.now());
        self.at += PASS;
        due
    }
}

fn listed_as(index: &mut DueIndex, n: usize, s: Seen, clock: &Clock) {
    index.listed(turn(n), clock.now());
    index.record(turn(n), s, clock.now());
}

#[test]
fn a_change_is_looked_at_once_a_pass_later_then_as_its_state_asks() {
    let mut clock = Clock::new();
    let mut index = DueIndex::new(timing());
    listed_as(&mut index, 1, seen(1, TurnState::Waiting, 1), &clock);
    listed_as(&mut index, 2, seen(1, TurnState::Queued, 1), &clock);
    let passes: Vec<Due> = (0..4).map(|_| clock.pass(&mut index)).collect();
    // At 0 s too young; at 5 s looked at in full (was its work item published?); from then on
    // a queued first attempt is looked for in rounds, the first at once.
    assert_eq!(passes[0], Due::default());
    assert_eq!(passes[1].full, vec![turn(2)]);
    assert!(passes[1].queued.is_empty());
    assert!(passes[2].full.is_empty());
    assert_eq!(passes[2].queued.len(), 1);
    assert_eq!(passes[3], Due::default());
    // A waiting turn owing nothing is never looked at.
    for _ in 0..100 {
        assert!(clock.pass(&mut index).full.is_empty());
    }
}

#[test]
fn running_ended_and_unrecorded_turns_are_looked_at_every_pass() {
    let mut clock = Clock::new();
    let mut index = DueIndex::new(timing());
    listed_as(&mut index, 1, seen(1, TurnState::Running, 1), &clock);
    listed_as(&mut index, 2, seen(1, TurnState::Done, 1), &clock);
    index.listed(turn(3), clock.now());
    clock.at += Duration::from_secs(3600);
    for _ in 0..20 {
        let due = clock.pass(&mut index);
        assert_eq!(due.full, vec![turn(1), turn(2), turn(3)]);
    }
    // Unlisted, an ended turn is forgotten; its record seen again later is not kept.
    index.unlisted(&turn(2));
    index.record(turn(2), seen(2, TurnState::Done, 1), clock.now());
    assert_eq!(index.len(), 2);
}

#[test]
fn queued_first_attempts_are_looked_for_together_once_a_round() {
    let mut clock = Clock::new();
    let mut index = DueIndex::new(timing());
    for n in 0..3 {
        index.listed(turn(n), clock.now());
        index.loaded(turn(n), seen(1, TurnState::Queued, 1), clock.now());
    }
    let first = clock.pass(&mut index);
    assert!(first.full.is_empty(), "loaded turns are not fresh");
    assert_eq!(first.queued.len(), 3);
    assert!(first.queued.iter().all(|q| q.attempt == 1));
    let rounds: Vec<usize> = (0..24)
        .map(|_| clock.pass(&mut index).queued.len())
        .collect();
    // A round every minute: passes 12 and 24 after the first (every 5 s).
    let taken: Vec<usize> = rounds
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(taken, vec![12, 24]);
    assert!(index.still_queued(&turn(0), 1));
    assert!(!index.still_queued(&turn(0), 2));
}

#[test]
fn a_claimed_attempt_is_looked_at_every_pass_until_the_turn_moves_on() {
    let mut clock = Clock::new();
    let mut index = DueIndex::new(timing());
    index.listed(turn(1), clock.now());
    index.loaded(turn(1), seen(1, TurnState::Queued, 2), clock.now());
    // A claim of an earlier attempt says nothing of this one.
    index.claimed(turn(1), 1, clock.now());
    clock.at += Duration::from_secs(600);
    let looked: usize = (0..12).map(|_| clock.pass(&mut index).full.len()).sum();
    assert!(
        looked < 12,
        "a queued retry backs off: looked at {looked} times"
    );
    index.claimed(turn(1), 2, clock.now());
    for _ in 0..12 {
        assert_eq!(clock.pass(&mut index).full, vec![turn(1)]);
    }
}

#[test]
fn a_pending_retry_is_looked_at_from_a_pass_after_its_due_time_backing_off() {
    let mut clock = Clock::new();
    let mut index = DueIndex::new(timing());
    let due_at = Duration::from_secs(120);
    index.listed(turn(1), clock.now());
    index.loaded(
        turn(1),
        seen_with(1, TurnState::PendingRetry, 2, Some(wall(due_at)), false),
        clock.now(),
    );
    let mut looked = Vec::new();
    for _ in 0..120 {
        let at = clock.at;
        if clock.pass(&mut index).full.contains(&turn(1)) {
            looked.push(at.as_secs());
        }
    }
    // Not before its due time and a pass; then after 5, 10, 20, 40 s, then every minute.
    assert_eq!(looked[..6], [125, 130, 140, 160, 200, 260]);
    assert!(looked.windows(2).all(|w| w[1] - w[0] <= 60));
}

#[test]
fn a_turn_owing_effects_backs_off_and_a_change_starts_it_over() {
    let mut clock = Clock::new();
    let mut index = DueIndex::new(timing());
    index.listed(turn(1), clock.now());
    index.loaded(
        turn(1),
        seen_with(1, TurnState::Waiting, 1, None, true),
        clock.now(),
    );
    let mut looked = Vec::new();
    for _ in 0..20 {
        let at = clock.at;
        if !clock.pass(&mut index).full.is_empty() {
            looked.push(at.as_secs());
        }
    }
    assert_eq!(looked, [0, 5, 15, 35, 75]);
    // A newer revision is fresh: every pass again. An older one changes nothing.
    index.record(turn(1), seen(3, TurnState::Waiting, 1), clock.now());
    index.record(
        turn(1),
        seen_with(2, TurnState::Waiting, 1, None, true),
        clock.now(),
    );
    let after: usize = (0..8).map(|_| clock.pass(&mut index).full.len()).sum();
    assert_eq!(after, 0, "owing nothing now: never looked at");
}

#[test]
fn records_whose_listing_never_comes_are_let_go() {
    let mut clock = Clock::new();
    let mut index = DueIndex::new(timing());
    index.record(turn(1), seen(1, TurnState::Queued, 1), clock.now());
    assert_eq!(
        clock.pass(&mut index),
        Due::default(),
        "not listed: not looked at"
    );
    assert_eq!(index.len(), 1);
    clock.at += UNLISTED_KEPT;
    clock.pass(&mut index);
    assert!(index.is_empty());
}

#[test]
fn live_turns_are_counted_by_state_among_the_listed() {
    let clock = Clock::new();
    let mut index = DueIndex::new(timing());
    listed_as(&mut index, 1, seen(1, TurnState::Running, 1), &clock);
    listed_as(&mut index, 2, seen(1, TurnState::Queued, 1), &clock);
    listed_as(&mut index, 3, seen(1, TurnState::Running, 1), &clock);
    index.record(turn(4), seen(1, TurnState::Waiting, 1), clock.now());
    index.listed(turn(5), clock.now());
    assert_eq!(
        index.count_by_state(),
        vec![(TurnState::Queued, 1), (TurnState::Running, 2)]
    );
}

fn state() -> impl Strategy<Value = TurnState> {
    prop_oneof![
        Just(TurnState::Waiting),
        Just(TurnState::Queued),
        Just(TurnState::Running),
        Just(TurnState::PendingRetry),
        Just(TurnState::Done),
        Just(TurnState::GaveUp),
    ]
}

#[derive(Debug, Clone)]
struct Planted {
    state: TurnState,
    attempt: u32,
    owes: bool,
    claimed: Option<u32>,
    due_in: Option<u64>,
    loaded: bool,
    recorded: bool,
}

fn planted() -> impl Strategy<Value = Planted> {
    (
        state(),
        1u32..4,
        any::<bool>(),
        proptest::option::of(1u32..4),
        proptest::option::of(0u64..300),
        any::<bool>(),
        prop::bool::weighted(0.9),
    )
        .prop_map(
            |(state, attempt, owes, claimed, due_in, loaded, recorded)| Planted {
                state,
                attempt,
                owes,
                claimed,
                due_in,
                loaded,
                recorded,
            },
        )
}

proptest! {
    /// Whatever the live turns, over passes every heartbeat: a running attempt, a claimed owed
    /// one, an ended turn still listed and a listed turn with no record are looked at in full at
    /// every pass; a change seen happen to a turn owing something, in full a pass later; every
    /// other turn that may need anything is looked at (in full, or in the work queue) at least
    /// once a round and a pass (once its retry is due); a waiting turn owing nothing never; no
    /// turn both ways in one pass.
    #[test]
    fn every_turn_is_looked_at_as_often_as_its_state_needs(
        turns in proptest::collection::vec(planted(), 1..40)
    ) {
        let mut clock = Clock::new();
        let mut index = DueIndex::new(timing());
        for (n, p) in turns.iter().enumerate() {
            index.listed(turn(n), clock.now());
            if let Some(c) = p.claimed {
                index.claimed(turn(n), c, clock.now());
            }
            if !p.recorded {
                continue;
            }
            let s = seen_with(
                1,
                p.state,
                p.attempt,
                p.due_in.map(|d| wall(Duration::from_secs(d))),
                p.owes,
            );
            if p.loaded {
                index.loaded(turn(n), s, clock.now());
            } else {
                index.record(turn(n), s, clock.now());
            }
        }
        let horizon = Duration::from_secs(600);
        let mut last: Vec<Option<Duration>> = vec![None; turns.len()];
        let limit = timing().round + PASS;
        while clock.at < horizon {
            let at = clock.at;
            let due = clock.pass(&mut index);
            for (n, p) in turns.iter().enumerate() {
                let t = turn(n);
                let full = due.full.contains(&t);
                let queued = due.queued.iter().any(|q| q.turn == t);
                prop_assert!(!(full && queued));
                let owed = matches!(p.state, TurnState::Queued | TurnState::PendingRetry);
                let every_pass = !p.recorded
                    || p.state.is_terminal()
                    || p.state == TurnState::Running
                    || (owed && p.claimed.is_some_and(|c| c >= p.attempt));
                if every_pass {
                    prop_assert!(full, "turn {n} ({p:?}) not looked at at {at:?}");
                }
                if !every_pass && !owed && !p.owes {
                    prop_assert!(!full && !queued, "turn {n} ({p:?}) looked at at {at:?}");
                }
                // A change this coordinator saw is looked at in full a pass later.
                if p.recorded && !p.loaded && (owed || p.owes) && at == PASS {
                    prop_assert!(full, "turn {n} ({p:?}) not looked at a pass after its change");
                }
                if full || queued {
                    last[n] = Some(at);
                }
                let retry_from = match (p.state, p.due_in) {
                    (TurnState::PendingRetry, Some(d)) if !p.owes => Duration::from_secs(d) + PASS,
                    _ => Duration::ZERO,
                };
                if (owed || p.owes) && at >= retry_from + limit {
                    let since = last[n].map_or(Duration::MAX, |l| at - l);
                    prop_assert!(since <= limit, "turn {n} ({p:?}) unseen for {since:?} at {at:?}");
                }
            }
        }
    }
}

#[test]
fn a_dispatch_left_in_the_outbox_is_not_owed_another_effect_is() {
    use turnpike_core::lifecycle::{admitted_at_creation, create, Effect, NewTurn};
    use turnpike_core::ChatId;
    let chat = ChatId::new("c").expect("chat");
    let (waiting, _) = create(
        NewTurn {
            turn: turn(1),
            message: turnpike_core::wire::InboundMessage::new(chat, "m".to_owned(), "hi", None),
            history: Vec::new(),
            max_turn_retry: 3,
            retry_delay: Duration::from_secs(10),
            rerun_of: None,
            created_by: None,
            admit_now: false,
        },
        Timestamp::from_millis(0),
    );
    // Admitted as the store writes it: queued, its dispatch in the outbox (kept there once
    // carried out).
    let mut record = admitted_at_creation(&waiting, Vec::new());
    assert_eq!(record.state, TurnState::Queued);
    assert!(record
        .outbox
        .iter()
        .any(|e| matches!(e, Effect::DispatchAttempt { .. })));
    let seen = Seen::of(&record, 7);
    assert_eq!((seen.revision, seen.live.attempt, seen.owes), (7, 1, false));
    assert_eq!(seen.live, LiveTurn::of(&record));
    record.outbox.push(Effect::ForwardKill { attempt: 1 });
    assert!(Seen::of(&record, 8).owes);
}

#[test]
fn the_live_list_is_paged_newest_first_and_filtered() {
    let clock = Clock::new();
    let mut index = DueIndex::new(timing());
    for n in 1..=7 {
        let state = if n % 2 == 0 {
            TurnState::Running
        } else {
            TurnState::Waiting
        };
        let mut s = seen(n as u64, state, 1);
        s.live.turn = turn(n);
        index.listed(turn(n), clock.now());
        index.record(turn(n), s, clock.now());
    }
    // Not listed: not live.
    index.record(turn(8), seen(8, TurnState::Running, 1), clock.now());
    let query = |state, since, offset, limit| LiveQuery {
        v: 1,
        state,
        since,
        offset,
        limit,
    };
    let ids = |p: LivePage| -> (usize, Vec<String>) {
        (
            p.total,
            p.turns.iter().map(|t| t.turn.as_str().to_owned()).collect(),
        )
    };
    assert_eq!(
        ids(index.live_page(&query(None, None, 0, 3))),
        (7, vec!["t-7".into(), "t-6".into(), "t-5".into()])
    );
    assert_eq!(
        ids(index.live_page(&query(None, None, 6, 3))),
        (7, vec!["t-1".into()])
    );
    assert_eq!(
        ids(index.live_page(&query(Some(TurnState::Running), None, 0, 10))),
        (3, vec!["t-6".into(), "t-4".into(), "t-2".into()])
    );
    assert_eq!(
        ids(index.live_page(&query(None, Some(Timestamp::from_millis(5)), 0, 10))),
        (3, vec!["t-7".into(), "t-6".into(), "t-5".into()])
    );
}

#[test]
fn rounds_come_further_apart_as_the_queue_grows() {
    let mut clock = Clock::new();
    let mut index = DueIndex::new(timing());
    // 24,000 queued first attempts: a round every 24,000 × 5 ms = 2 minutes.
    for n in 0..24_000 {
        index.listed(turn(n), clock.now());
        index.loaded(turn(n), seen(1, TurnState::Queued, 1), clock.now());
    }
    let mut rounds = Vec::new();
    for _ in 0..60 {
        let at = clock.at;
        if !clock.pass(&mut index).queued.is_empty() {
            rounds.push(at.as_secs());
        }
    }
    assert_eq!(rounds, [0, 120, 240]);
}

#[test]
fn a_burst_is_looked_at_a_passs_worth_at_a_time_after_what_is_due_every_pass() {
    let mut clock = Clock::new();
    let mut index = DueIndex::new(timing());
    listed_as(&mut index, 0, seen(1, TurnState::Running, 1), &clock);
    for n in 1..=5_000 {
        listed_as(&mut index, n, seen(1, TurnState::Queued, 1), &clock);
    }
    let full: Vec<usize> = (0..5).map(|_| clock.pass(&mut index).full.len()).collect();
    // At 0 s only the running one; then 2,000 of the new ones a pass, and the running one.
    assert_eq!(full, [1, 1 + PER_PASS, 1 + PER_PASS, 1 + 1_000, 1]);
    // A round that did not find them in the queue: looked at in full again, the same way.
    let missing: Vec<TurnId> = (1..=3_000).map(turn).collect();
    index.look_again(&missing, clock.now());
    let full: Vec<usize> = (0..3).map(|_| clock.pass(&mut index).full.len()).collect();
    assert_eq!(full, [1 + PER_PASS, 1 + 1_000, 1]);
}
