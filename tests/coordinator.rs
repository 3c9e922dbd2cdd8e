//! The coordinator against a real nats-server 2.15.1 with process-backend runners and the test
//! agent: retries, give-ups, notices, operator actions, restarts inside the retry delay (of the
//! coordinator and of nats-server), duplicated events, and two coordinators at once.

use futures::StreamExt;
use std::time::Duration;
use turnpike_config::Config;
use turnpike_core::record::TurnState;
use turnpike_core::subjects;
use turnpike_core::texts;
use turnpike_core::wire::{ChatRecord, ExitClass, OutboundItem, OutboundKind};
use turnpike_core::{ChatId, TurnId};
use turnpike_jetstream::decode_kv;
use turnpike_store::Bus;
use turnpike_testkit::NatsServer;
use turnpike_tests::*;

const AGENT: &str = env!("CARGO_BIN_EXE_test-agent");

const ROLE: &str = env!("CARGO_BIN_EXE_test-role");

const T: Duration = Duration::from_secs(60);

fn of_turn<'a>(items: &'a [OutboundItem], turn: &TurnId) -> Vec<&'a OutboundItem> {
    items.iter().filter(|i| &i.turn == turn).collect()
}

// The cases live in coordinator/.
#[path = "coordinator/due.rs"]
mod due;
#[path = "coordinator/outbox.rs"]
mod outbox;
#[path = "coordinator/restarts.rs"]
mod restarts;
#[path = "coordinator/revisions.rs"]
mod revisions;
#[path = "coordinator/table.rs"]
mod table;
