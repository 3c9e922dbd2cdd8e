//! The model's state: what JetStream holds (turn and chat records, the live index, the work and
//! event streams, claims, leases, fences, chat output), what each process is doing, and a few
//! ghost facts the properties need (what an operator was told, how often an agent started).
//!
//! Turns, runners and processes are numbered; records are core's real types.

use std::collections::{BTreeMap, BTreeSet};
use turnpike_core::fence::{FenceHolder, FenceMarker, Last};
use turnpike_core::lifecycle::Effect;
use turnpike_core::record::{NoticeKind, TurnState};
use turnpike_core::wire::{ChatRecord, ExitClass, HistoryEntry};
use turnpike_core::TurnRecord;

pub type Turn = usize;
pub type Attempt = u32;
pub type RunnerIx = usize;
pub type ProcIx = usize;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct World {
    /// The chat's inbound messages, one per turn, in arrival order (stream sequence = index + 1).
    pub inbound: Vec<Delivery>,
    /// `turnpike_turns`: each turn's record (each write a compare-and-set step).
    pub turns: Vec<Option<Stored>>,
    /// `turnpike_chats`: the one chat's record, once it has one (each write is one
    /// compare-and-set step).
    pub chat: Option<ChatRecord>,
    /// `turnpike_live`: turns not yet ended.
    pub live: BTreeSet<Turn>,
    /// The work stream: attempts published and not yet acknowledged.
    pub work: Vec<WorkMsg>,
    pub next_work_id: u8,
    /// Message ids the work stream has seen (dedup window: the whole run).
    pub work_ids: BTreeSet<(Turn, Attempt)>,
    /// Scheduled retries not yet fired (one schedule subject per attempt).
    pub schedules: BTreeSet<(Turn, Attempt)>,
    /// `turnpike_claims`: created once per attempt.
    pub claims: BTreeMap<(Turn, Attempt), Claim>,
    /// Runner leases (absent: not written yet, or lapsed).
    pub leases: BTreeMap<(Turn, Attempt), RunnerIx>,
    /// Each turn's fence subject: markers in order (stream sequence = index + 1).
    pub fences: Vec<Vec<FenceMarker>>,
    /// The chat's outbound subject, in landing order.
    pub out: Vec<Out>,
    /// Bot messages published and not yet stored or refused by the server.
    pub inflight: BTreeSet<InFlight>,
    /// The events stream (kept after acknowledgement: the sweep reads it).
    pub events: Vec<EventMsg>,
    /// Plain-NATS kill messages sent (a runner of that attempt may hear them).
    pub kills: BTreeSet<(Turn, Attempt)>,
    pub runners: Vec<Runner>,
    /// Coordinators (events), then the sweep, the operator's ops request, the dispatcher.
    pub procs: Vec<Proc>,
    pub ghost: Ghost,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Stored {
    pub record: TurnRecord,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Delivery {
    Pending,
    Held,
    Acked,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WorkMsg {
    pub id: u8,
    pub turn: Turn,
    pub attempt: Attempt,
    pub held: Option<RunnerIx>,
    /// Given back (a NAK with a delay, or its holder died and `ack_wait` runs): it comes back
    /// by a timer.
    pub delayed: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Claim {
    Runner(RunnerIx),
    Cancelled,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Out {
    Message { turn: Turn, attempt: Attempt },
    Notice { turn: Turn, kind: NoticeKind },
    Final { turn: Turn, state: TurnState },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InFlight {
    pub turn: Turn,
    pub attempt: Attempt,
    pub runner: RunnerIx,
    /// The fence sequence the publish expects to be last.
    pub fence: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EventMsg {
    pub turn: Turn,
    pub attempt: Attempt,
    pub runner: RunnerIx,
    pub kind: EventKind,
    pub delivery: EventDelivery,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    Started,
    // No per-message event: the runner reports its bot messages with its exit (issue 19).
    Exited { class: ExitClass, landed: u32 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventDelivery {
    Pending,
    Held(ProcIx),
    Acked,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Runner {
    Idle,
    /// Took work message `msg`; about to claim the attempt.
    Claiming {
        msg: u8,
        turn: Turn,
        attempt: Attempt,
    },
    /// Wrote its claim and did not hear it stored (the acknowledgement was lost): about to read
    /// the claim to learn whose it is. The deadline runs from the claim already (`stop`).
    ClaimUnsure {
        msg: u8,
        turn: Turn,
        attempt: Attempt,
        stop: Option<turnpike_core::exit::StopReason>,
    },
    /// Claimed; about to take the fence. The run's lease deadline runs from the claim (its
    /// `stop`, requested before the agent exists, keeps the agent from ever starting).
    Fencing {
        msg: u8,
        turn: Turn,
        attempt: Attempt,
        stop: Option<turnpike_core::exit::StopReason>,
    },
    Running(Run),
    /// About to publish the exit report.
    Reporting {
        turn: Turn,
        attempt: Attempt,
        class: ExitClass,
        landed: u32,
        uncertain: bool,
    },
    /// Crashed; `orphan`: the attempt whose agent it left running (a leftover container).
    Down {
        orphan: Option<(Turn, Attempt)>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Run {
    pub turn: Turn,
    pub attempt: Attempt,
    pub fence: u64,
    pub started: bool,
    pub said: u32,
    /// A bot message published, its acknowledgement not yet seen.
    pub awaiting: bool,
    /// A publish whose outcome the runner never learned: it may have landed.
    pub uncertain: bool,
    pub stop: Option<turnpike_core::exit::StopReason>,
    /// Its lease is written: a heartbeat after the claim, unless the run ended first.
    pub leased: bool,
}

impl Runner {
    pub fn attempt(&self) -> Option<(Turn, Attempt)> {
        match self {
            Runner::Idle | Runner::Down { .. } => None,
            Runner::Claiming { turn, attempt, .. }
            | Runner::ClaimUnsure { turn, attempt, .. }
            | Runner::Fencing { turn, attempt, .. }
            | Runner::Reporting { turn, attempt, .. } => Some((*turn, *attempt)),
            Runner::Running(r) => Some((r.turn, r.attempt)),
        }
    }
    pub fn work_msg(&self) -> Option<u8> {
        match self {
            Runner::Claiming { msg, .. }
            | Runner::ClaimUnsure { msg, .. }
            | Runner::Fencing { msg, .. } => Some(*msg),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Proc {
    pub job: Option<Job>,
    /// Outbox executions and admissions under way, innermost last.
    pub stack: Vec<Frame>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[allow(clippy::large_enum_variant)] // snapshots of records: clones are the model's cost anyway
pub enum Job {
    /// A coordinator applies events `evs` (indexes into `events`) of one turn, in one write:
    /// the first it took, and one more of the turn it took before writing (a batch).
    Event {
        evs: Vec<usize>,
        applied: bool,
    },
    Sweep {
        turn: Turn,
        phase: SweepPhase,
    },
    /// The ops service kills a turn for an operator.
    Kill {
        turn: Turn,
        applied: bool,
    },
    /// The dispatcher takes inbound message `turn`.
    Inbound {
        turn: Turn,
        phase: InboundPhase,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SweepPhase {
    Read,
    Plan {
        snapshot: TurnRecord,
        stale: bool,
    },
    Judge {
        snapshot: TurnRecord,
    },
    Lose {
        attempt: Attempt,
        counted: Option<u32>,
    },
    Report {
        attempt: Attempt,
        runner_seq: Option<u64>,
        counted: Option<u32>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum InboundPhase {
    Create,
    /// The chat was idle and this turn joined it first: created admitted with `history`
    /// (`None`: only with the bug `join_before_create`, which joins a busy chat too).
    CreateAdmitted {
        history: Option<Vec<turnpike_core::wire::HistoryEntry>>,
        listed_here: bool,
    },
    Join,
    /// The message of an ended turn counted taken; `unlist`: this replay listed it again.
    Taken {
        unlist: bool,
    },
    Ack,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[allow(clippy::large_enum_variant)]
pub enum Frame {
    /// Carrying out `snapshot`'s outbox: effect `i`, its sub-step `sub`; then, for an ended
    /// turn, leaving the live index.
    Outbox {
        turn: Turn,
        snapshot: TurnRecord,
        i: usize,
        sub: u8,
    },
    /// Admit the chat's next turn with `history`.
    Admit {
        turn: Turn,
        history: Vec<HistoryEntry>,
    },
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// Turns whose kill the operator was told took effect.
    pub kill_acked: BTreeSet<Turn>,
    pub kill_requested: BTreeSet<Turn>,
    /// Times an agent started, per attempt.
    pub starts: BTreeMap<(Turn, Attempt), u8>,
    /// A bot message landed where it must not have; says why.
    pub bad_landing: Option<&'static str>,
    /// The first terminal state each turn reached.
    pub ended: BTreeMap<Turn, TurnState>,
    /// A runner let go of a delivery whose attempt it had just claimed itself (its claim's
    /// acknowledgement lost): an attempt nobody runs, which costs its turn an attempt.
    pub walked_away: bool,
    /// A turn was admitted while an earlier turn of its chat had not ended.
    pub out_of_order: bool,
    /// Attempts whose workspace became the chat's.
    pub saved: BTreeSet<(Turn, Attempt)>,
    /// A workspace was saved where it must not have been; says why.
    pub bad_save: Option<&'static str>,
    /// Faults still allowed on this path.
    pub faults_left: u8,
    /// Early timers still allowed on this path.
    pub early_timers_left: u8,
}

impl World {
    pub fn record(&self, t: Turn) -> Option<&TurnRecord> {
        self.turns[t].as_ref().map(|s| &s.record)
    }

    /// The fence's last marker as a reader sees it.
    pub fn fence_last(&self, t: Turn) -> Option<Last> {
        let f = &self.fences[t];
        f.last().map(|m| Last {
            seq: f.len() as u64,
            marker: Some(m.clone()),
        })
    }

    pub fn fence_at(&self, t: Turn, seq: u64) -> Option<Last> {
        if seq == 0 {
            return None;
        }
        self.fences[t].get(seq as usize - 1).map(|m| Last {
            seq,
            marker: Some(m.clone()),
        })
    }

    /// Append a marker on the condition that `expect` is the last sequence.
    pub fn fence_append(
        &mut self,
        t: Turn,
        turn: &turnpike_core::TurnId,
        attempt: Attempt,
        holder: FenceHolder,
        expect: u64,
    ) -> Option<u64> {
        if self.fences[t].len() as u64 != expect {
            return None;
        }
        self.fences[t].push(FenceMarker {
            v: turnpike_core::FORMAT_VERSION,
            turn: turn.clone(),
            attempt,
            holder,
            replaces: expect,
        });
        Some(self.fences[t].len() as u64)
    }

    pub fn messages_of(&self, t: Turn, k: Option<Attempt>) -> u32 {
        self.out
            .iter()
            .filter(|o| matches!(o, Out::Message { turn, attempt } if *turn == t && k.is_none_or(|k| k == *attempt)))
            .count() as u32
    }

    pub fn has_final(&self, t: Turn) -> bool {
        self.out
            .iter()
            .any(|o| matches!(o, Out::Final { turn, .. } if *turn == t))
    }

    /// Publish an event, deduplicated like the runner's message ids (turn, attempt, what).
    pub fn publish_event(
        &mut self,
        turn: Turn,
        attempt: Attempt,
        runner: RunnerIx,
        kind: EventKind,
    ) {
        let same = |e: &EventMsg| {
            e.turn == turn
                && e.attempt == attempt
                && matches!(
                    (e.kind, kind),
                    (EventKind::Started, EventKind::Started)
                        | (EventKind::Exited { .. }, EventKind::Exited { .. })
                )
        };
        if self.events.iter().any(same) {
            return;
        }
        self.events.push(EventMsg {
            turn,
            attempt,
            runner,
            kind,
            delivery: EventDelivery::Pending,
        });
    }

    pub fn publish_work(&mut self, turn: Turn, attempt: Attempt, dedup: bool) {
        if dedup && !self.work_ids.insert((turn, attempt)) {
            return;
        }
        let id = self.next_work_id;
        self.next_work_id = self.next_work_id.wrapping_add(1);
        self.work.push(WorkMsg {
            id,
            turn,
            attempt,
            held: None,
            delayed: false,
        });
    }

    pub fn ack_work(&mut self, id: u8) {
        self.work.retain(|m| m.id != id);
    }

    pub fn release_work(&mut self, id: u8) {
        for m in &mut self.work {
            if m.id == id {
                m.held = None;
                m.delayed = true;
            }
        }
    }

    /// Keep the ghost's record of terminal states.
    pub fn note_record(&mut self, t: Turn) {
        if let Some(r) = self.record(t) {
            if r.state.is_terminal() {
                let state = r.state;
                self.ghost.ended.entry(t).or_insert(state);
            }
        }
    }

    pub fn take_fault(&mut self) -> bool {
        if self.ghost.faults_left == 0 {
            return false;
        }
        self.ghost.faults_left -= 1;
        true
    }

    /// Effects still to carry out, for the properties (none of a turn that was never stored).
    pub fn outbox(&self, t: Turn) -> &[Effect] {
        self.record(t).map_or(&[], |r| r.outbox.as_slice())
    }
}
