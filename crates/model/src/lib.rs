//! The Turnpike protocol as a model for an exhaustive checker ([`stateright`]).
//!
//! Every process of a deployment is here as a small state machine whose steps are the
//! requests it makes to JetStream: the dispatcher, coordinators applying runner events, the
//! recovery sweep, the operator's kill, runners, and the server itself (a bot message landing
//! or being refused by its fence, a schedule firing, a lease lapsing). Each step that decides
//! anything calls the same function of `turnpike-core` the real shell calls: `lifecycle::apply`,
//! `create` and `admitted_at_creation`, `fence::take/lose/kill/check`, `chat::join/release/in_order`,
//! `recovery::plan/judge_attempt/judge_retry`, `exit::classify`. So the model checks the real
//! decisions, and the shells' order of requests as written down here (see ARCHITECTURE.md for
//! which function each step stands for).
//!
//! Faults, within a budget per path: a runner crashes (its agent may be left running), a
//! coordinator, the sweep, the ops service or the dispatcher crashes mid-way (its message comes
//! back), a work item is delivered twice, a runner is cut off (its lease lapses; it stops its
//! agent, as its lease deadline makes it), a publish's acknowledgement is lost (a bot message's,
//! or a claim's: the claim is stored, its runner reads it back), an exit report is lost. Not modelled: time (a schedule may fire, a lease of a dead or finished holder may
//! lapse, at any moment; a lease not written yet may be judged absent for a whole lease, and a
//! run without one has then stopped by its deadline), history text and attachments,
//! deduplication windows (infinite here), the marker the sweep leaves on a lost attempt's lease
//! key (defence in depth: a run that could still write its first lease stopped by then).
//!
//! Safety properties are [`stateright`] `always` properties ([`properties`]); liveness — from
//! every reachable state, the work can still be finished without further faults — is checked by
//! [`liveness::check`] over the same model.

mod actions;
pub mod liveness;
mod procs;
pub mod properties;
mod runner;
pub mod world;

use stateright::{Model, Property};
use std::collections::BTreeSet;
use turnpike_core::{ChatId, RunnerId, TurnId};
use world::*;

pub use actions::Action;

/// Deliberate bugs: each one is a mistake the real code once made or could make. The tests
/// check that the model finds each of them (so the properties are strong enough to matter).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Bugs {
    /// An operator kill only tells the runner (plain NATS) and does not move the fence.
    pub kill_without_fence: bool,
    /// The sweep takes any claim on a pending retry's next attempt as progress (issue 16 item 2).
    pub trust_any_retry_claim: bool,
    /// The dispatcher takes inbound messages in whatever order they come (item 9).
    pub ignore_chat_order: bool,
    /// Admitting a turn that ended before it joined its chat leaves it the live one (item 10).
    pub keep_ended_turn_live: bool,
    /// The sweep counts what a lost attempt landed before it moves the fence (items 5, 8).
    pub count_before_fence: bool,
    /// A runner reports its own count of landed messages even when a publish's outcome is unknown.
    pub trust_uncertain_count: bool,
    /// The dispatcher joins its chat first whether it is idle or busy (as a join that reads again
    /// after a failed compare-and-set would), and a turn that joined as waiting is then created
    /// waiting: the release of the turn before it may find no record to admit, and it waits for
    /// ever.
    pub join_before_create: bool,
    /// The sweep takes a claimed attempt with no lease yet for lost at once (the rule from when
    /// the lease came before the claim), though a run writes its lease a heartbeat after it.
    pub absent_lease_lost_at_once: bool,
    /// A coordinator judges each event of a batch on the record as it read it, not on the one
    /// the event before left, and writes the last change (an update lost inside one write).
    pub batch_judged_on_the_read_record: bool,
    /// A runner whose claim's acknowledgement was lost takes the claim it finds for another's
    /// and drops the delivery (issue 32: async-nats reads its own write back as "already
    /// exists").
    pub lost_claim_ack_is_anothers: bool,
    /// The outbox makes a clean exit's workspace the chat's without checking that its attempt
    /// still holds the fence.
    pub save_without_fence: bool,
}

/// One deployment to check.
#[derive(Clone, Debug)]
pub struct Protocol {
    /// Inbound messages of the one chat; turn `i` is message `i`.
    pub turns: usize,
    pub runners: usize,
    pub coordinators: usize,
    /// `MAX_TURN_RETRY`.
    pub max_turn_retry: u32,
    /// Faults allowed on one path.
    pub faults: u8,
    /// Turns an operator kills (at most once each, at any moment).
    pub killable: Vec<Turn>,
    /// Bot messages an agent may say.
    pub says: u32,
    /// Timers that may go off while other work is still under way, per path. The sweep's pass,
    /// a schedule firing and the lapse of a lease its holder no longer renews are timed (by
    /// seconds, where every other step takes milliseconds): when nothing else can happen they
    /// always may — that is how the sweep finds what was lost — and early, racing the other
    /// steps, a bounded number of times, like faults.
    pub early_timers: u8,
    /// Coordinators may apply two events of a turn in one write (as a start that waits for its
    /// attempt's exit does). Off by default: it adds states to every scenario, and the ones
    /// that turn it on check it.
    pub batches: bool,
    /// A runner reports its agent's start. Off: the coordinator first hears of an attempt at
    /// its exit report (issue 19's proposed removal of the Started event and its record write;
    /// the exit report names the runner, and the sweep judges a claimed attempt by its lease).
    pub started_events: bool,
    pub bugs: Bugs,
    pub(crate) ids: Ids,
}

#[derive(Clone, Debug)]
pub(crate) struct Ids {
    pub chat: ChatId,
    pub turns: Vec<TurnId>,
    pub runners: Vec<RunnerId>,
}

impl Protocol {
    pub fn new(turns: usize, runners: usize, coordinators: usize) -> Self {
        let ids = Ids {
            chat: ChatId::new("c").unwrap_or_else(|_| unreachable!("a valid id")),
            turns: (0..turns)
                .map(|i| TurnId::new(format!("t{i}")).unwrap_or_else(|_| unreachable!()))
                .collect(),
            runners: (0..runners)
                .map(|i| RunnerId::new(format!("r{i}")).unwrap_or_else(|_| unreachable!()))
                .collect(),
        };
        Protocol {
            turns,
            runners,
            coordinators,
            max_turn_retry: 2,
            faults: 2,
            killable: Vec::new(),
            says: 1,
            early_timers: 1,
            batches: false,
            started_events: true,
            bugs: Bugs::default(),
            ids,
        }
    }

    pub fn with(mut self, f: impl FnOnce(&mut Protocol)) -> Self {
        f(&mut self);
        self
    }

    pub(crate) fn sweep(&self) -> ProcIx {
        self.coordinators
    }
    pub(crate) fn operator(&self) -> ProcIx {
        self.coordinators + 1
    }
    pub(crate) fn dispatcher(&self) -> ProcIx {
        self.coordinators + 2
    }

    /// Is the work finished: every message taken, every turn ended and settled, the chat idle?
    pub fn settled(&self, w: &World) -> bool {
        w.inbound.iter().all(|d| *d == Delivery::Acked)
            && (0..self.turns)
                .all(|t| w.record(t).is_some_and(|r| r.state.is_terminal()) && w.has_final(t))
            && w.live.is_empty()
            && w.chat
                .as_ref()
                .is_none_or(|c| c.live.is_none() && c.waiting.is_empty())
    }
}

impl Model for Protocol {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        vec![World {
            inbound: vec![Delivery::Pending; self.turns],
            turns: vec![None; self.turns],
            chat: None,
            live: BTreeSet::new(),
            work: Vec::new(),
            next_work_id: 0,
            work_ids: BTreeSet::new(),
            schedules: BTreeSet::new(),
            claims: Default::default(),
            leases: Default::default(),
            fences: vec![Vec::new(); self.turns],
            out: Vec::new(),
            inflight: BTreeSet::new(),
            events: Vec::new(),
            kills: BTreeSet::new(),
            runners: vec![Runner::Idle; self.runners],
            procs: vec![Proc::default(); self.coordinators + 3],
            ghost: Ghost {
                faults_left: self.faults,
                early_timers_left: self.early_timers,
                ..Ghost::default()
            },
        }]
    }

    fn actions(&self, w: &World, out: &mut Vec<Action>) {
        let from = out.len();
        self.untimed(w, out);
        if w.ghost.early_timers_left > 0 || self.quiet(w, &out[from..]) {
            self.timers(w, out);
        }
    }

    fn next_state(&self, w: &World, a: Action) -> Option<World> {
        let mut w = w.clone();
        if self.is_fault(&w, &a) && !w.take_fault() {
            return None;
        }
        if self.is_timer(&w, &a) {
            let mut others = Vec::new();
            self.untimed(&w, &mut others);
            if !self.quiet(&w, &others) {
                w.ghost.early_timers_left = w.ghost.early_timers_left.checked_sub(1)?;
            }
        }
        self.apply(w, a)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all()
    }
}
