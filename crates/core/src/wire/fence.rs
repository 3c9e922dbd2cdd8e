//! The attempt fence's markers, on `turnpike.fence.<turn>.<writer>` (what they decide is in
//! [`crate::fence`]).

use super::*;

/// One marker on the fence subject.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FenceMarker {
    /// Format version (`v`) of this payload; absent means 1 (docs/protocol.md).
    #[serde(default = "v1")]
    pub v: u16,
    /// The turn.
    pub turn: TurnId,
    /// The attempt it is about.
    pub attempt: u32,
    /// Who holds the fence after it.
    pub holder: FenceHolder,
    /// Sequence of the marker this one replaced (0: the first). A reader of a lost or killed
    /// attempt finds that attempt's own marker there, and so where its output can begin.
    #[serde(default)]
    pub replaces: u64,
}

/// Who holds the fence after this marker.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FenceHolder {
    /// A runner runs `attempt` and may land its output.
    Runner {
        /// The runner.
        runner: RunnerId,
    },
    /// The coordinator declared `attempt` lost: nothing more of it lands.
    Lost,
    /// An operator killed the turn: no output of any attempt lands, no attempt starts.
    Killed {
        /// The operator.
        by: String,
    },
}
