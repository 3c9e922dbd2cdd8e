//! From what a backend observed of a run to its [`ExitClass`]: the same rules for every backend,
//! and for the protocol model. Pure.

use crate::wire::{AgentStatus, ExitClass};

/// Why the runner itself stopped a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// The run time limit expired.
    Timeout,
    /// An operator asked to kill the turn.
    Operator,
    /// The attempt was superseded (its fence moved): another attempt owns the turn now.
    Superseded,
    /// The runner is shutting down and the drain grace ran out.
    Drain,
    /// The runner lost its lease (cut off from NATS): it must not keep a zombie attempt running.
    LeaseLost,
}

impl StopReason {
    /// Stop at once, without the grace period: another attempt may already own the turn.
    pub fn is_urgent(self) -> bool {
        matches!(self, StopReason::Superseded | StopReason::LeaseLost)
    }

    /// Why a run whose fence moved away from it stops: an operator's kill, or its attempt is
    /// not its own any more (declared lost, or the fence is gone).
    pub fn fenced(how: crate::fence::Fenced) -> StopReason {
        match how {
            crate::fence::Fenced::Killed => StopReason::Operator,
            crate::fence::Fenced::Lost => StopReason::Superseded,
        }
    }

    /// Which reason stands when `new` comes while the run is already stopping for `current`:
    /// an operator's kill over everything (a killed turn is never retried); then the loss of the
    /// attempt (its fence moved, its lease lapsed: it is not this runner's any more, and stops
    /// at once); between the time limit and a drain, whichever came first.
    pub fn stands(current: Option<StopReason>, new: StopReason) -> StopReason {
        fn rank(r: StopReason) -> u8 {
            match r {
                StopReason::Operator => 2,
                StopReason::Superseded | StopReason::LeaseLost => 1,
                StopReason::Timeout | StopReason::Drain => 0,
            }
        }
        match current {
            Some(c) if rank(c) >= rank(new) => c,
            _ => new,
        }
    }
}

/// What a backend saw of one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawExit {
    /// The process's exit code, if it exited.
    pub exit_code: Option<i64>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// Out of memory: the cgroup OOM killer fired (container `OOMKilled`, or the engine's `oom`
    /// event), or, under the process backend, the agent died of a failed allocation.
    pub oom_killed: bool,
    /// Set when the runner stopped the run; says why.
    pub stopped_by: Option<StopReason>,
    /// The agent never ran: image missing, create/start refused, command not found.
    pub start_error: Option<String>,
    /// The engine failed while the agent ran (API error, time-out): not the agent's fault.
    pub engine_error: Option<String>,
}

/// Decide the class. `verdict` is the agent's last `result` line, `any_output` whether it wrote
/// anything at all (exit 125–127 after output is the agent's own exit code, not a failed start).
pub fn classify(raw: &RawExit, verdict: Option<AgentStatus>, any_output: bool) -> ExitClass {
    if raw.start_error.is_some() {
        return ExitClass::CouldNotStart;
    }
    match raw.stopped_by {
        Some(StopReason::Operator) => return ExitClass::OperatorKilled,
        Some(StopReason::Timeout) => return ExitClass::TimedOut,
        Some(StopReason::Superseded | StopReason::Drain | StopReason::LeaseLost) => {
            return ExitClass::RunnerLost
        }
        None => {}
    }
    if raw.oom_killed {
        return ExitClass::OomKilled;
    }
    if raw.engine_error.is_some() {
        return ExitClass::EngineError;
    }
    match (raw.exit_code, raw.signal) {
        (_, Some(_)) => ExitClass::Signaled,
        (Some(0), None) => match verdict {
            Some(AgentStatus::Error) => ExitClass::AgentFailed,
            _ => ExitClass::Clean,
        },
        (Some(125..=127), None) if !any_output => ExitClass::CouldNotStart,
        // 128+n from a container is death by signal n (e.g. 137 = SIGKILL from someone else).
        (Some(129..=192), None) => ExitClass::Signaled,
        (Some(_), None) => ExitClass::Crashed,
        (None, None) => ExitClass::EngineError,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_precedence_table() {
        use StopReason::*;
        let all = [Timeout, Operator, Superseded, Drain, LeaseLost];
        for r in all {
            assert_eq!(StopReason::stands(None, r), r, "the first reason stands");
            assert_eq!(StopReason::stands(Some(Operator), r), Operator);
            assert_eq!(StopReason::stands(Some(r), Operator), Operator);
        }
        // The first of the lesser reasons stands.
        assert_eq!(StopReason::stands(Some(Timeout), Drain), Timeout);
        assert_eq!(StopReason::stands(Some(Drain), Timeout), Drain);
        assert_eq!(StopReason::stands(Some(Superseded), LeaseLost), Superseded);
        assert_eq!(StopReason::stands(Some(LeaseLost), Superseded), LeaseLost);
        // Losing the attempt overrides a time limit or drain: it must stop at once.
        assert_eq!(StopReason::stands(Some(Timeout), LeaseLost), LeaseLost);
        assert_eq!(StopReason::stands(Some(Drain), Superseded), Superseded);
        assert_eq!(StopReason::stands(Some(LeaseLost), Drain), LeaseLost);
    }

    fn code(c: i64) -> RawExit {
        RawExit {
            exit_code: Some(c),
            ..RawExit::default()
        }
    }

    #[test]
    fn table() {
        assert_eq!(classify(&code(0), None, true), ExitClass::Clean);
        assert_eq!(
            classify(&code(0), Some(AgentStatus::Ok), true),
            ExitClass::Clean
        );
        assert_eq!(
            classify(&code(0), Some(AgentStatus::Error), true),
            ExitClass::AgentFailed
        );
        assert_eq!(
            classify(&code(1), Some(AgentStatus::Error), true),
            ExitClass::Crashed
        );
        assert_eq!(classify(&code(127), None, false), ExitClass::CouldNotStart);
        assert_eq!(classify(&code(127), None, true), ExitClass::Crashed);
        assert_eq!(classify(&code(137), None, true), ExitClass::Signaled);
        let oom = RawExit {
            exit_code: Some(137),
            oom_killed: true,
            ..RawExit::default()
        };
        assert_eq!(classify(&oom, None, true), ExitClass::OomKilled);
        let ours = |why| RawExit {
            exit_code: Some(137),
            stopped_by: Some(why),
            ..RawExit::default()
        };
        assert_eq!(
            classify(&ours(StopReason::Timeout), None, true),
            ExitClass::TimedOut
        );
        assert_eq!(
            classify(&ours(StopReason::Operator), None, true),
            ExitClass::OperatorKilled
        );
        assert_eq!(
            classify(&ours(StopReason::LeaseLost), None, true),
            ExitClass::RunnerLost
        );
        let sig = RawExit {
            signal: Some(6),
            ..RawExit::default()
        };
        assert_eq!(classify(&sig, None, true), ExitClass::Signaled);
        let missing = RawExit {
            start_error: Some("no such image".into()),
            ..RawExit::default()
        };
        assert_eq!(classify(&missing, None, false), ExitClass::CouldNotStart);
        let engine = RawExit {
            engine_error: Some("timed out".into()),
            ..RawExit::default()
        };
        assert_eq!(classify(&engine, None, true), ExitClass::EngineError);
    }
}
