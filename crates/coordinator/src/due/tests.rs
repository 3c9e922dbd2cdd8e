use super::*;
use proptest::prelude::*;

const PASS: Duration = Duration::from_secs(5);
const LEASE: Duration = Duration::from_secs(15);

fn timing() -> Timing {
    Timing::new(PASS, LEASE)
}

fn turn(n: usize) -> TurnId {
    TurnId::new(format!("t-{n}")).expect("id")
}

fn seen(revision: u64, state: TurnState, attempt: u32) -> Seen {
    Seen {
        revision,
        state,
        attempt,
        due: None,
        updated_at: Timestamp::from_millis(1_000),
        owes: false,
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
fn a_fresh_change_is_looked_at_every_pass_then_only_as_its_state_asks() {
    let mut clock = Clock::new();
    let mut index = DueIndex::new(timing());
    listed_as(&mut index, 1, seen(1, TurnState::Waiting, 1), &clock);
    // Fresh for lease + heartbeat: four passes at 0, 5, 10, 15 s.
    let fresh: Vec<bool> = (0..6)
        .map(|_| clock.pass(&mut index).full.contains(&turn(1)))
        .collect();
    assert_eq!(fresh, [true, true, true, true, false, false]);
    // A waiting turn owing nothing is never looked at again.
    for _ in 0..100 {
        assert_eq!(clock.pass(&mut index), Due::default());
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
        Seen {
            due: Some(wall(due_at)),
            ..seen(1, TurnState::PendingRetry, 2)
        },
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
        Seen {
            owes: true,
            ..seen(1, TurnState::Waiting, 1)
        },
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
        Seen {
            owes: true,
            ..seen(2, TurnState::Waiting, 1)
        },
        clock.now(),
    );
    let fresh: usize = (0..8).map(|_| clock.pass(&mut index).full.len()).sum();
    assert_eq!(fresh, 4, "fresh for lease + heartbeat, then owing nothing");
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
    /// every pass; every other turn that may need anything is looked at (in full, or in the work
    /// queue) at least once a round and a pass (once its retry is due); a waiting turn owing
    /// nothing, once no longer fresh, never; no turn both ways in one pass.
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
            let s = Seen {
                due: p.due_in.map(|d| wall(Duration::from_secs(d))),
                owes: p.owes,
                ..seen(1, p.state, p.attempt)
            };
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
                let fresh = !p.loaded && at < timing().fresh;
                if !every_pass && !fresh && !owed && !p.owes {
                    prop_assert!(!full && !queued, "turn {n} ({p:?}) looked at at {at:?}");
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
