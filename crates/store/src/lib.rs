//! Turnpike's application layer, between the roles and the plumbing, and the one door to what
//! is stored in JetStream: every KV bucket and the object store are opened in [`Bus`] and read
//! or written only through this crate's modules.
//!
//! - State that decides: turn records ([`turns`]), chat records ([`chats`]), attempt claims
//!   ([`claims`]), the per-turn fence ([`fence`]) and the live index ([`live`]). Each reads a
//!   record, asks `turnpike-core` what changes, writes it back with compare-and-set (re-reading
//!   on a lost race), and carries out the effects core returned ([`outbox`]); a new turn joins
//!   its chat through [`admission`].
//! - State with a time-to-live, judged by the server's clock: leases ([`leases`]), runner
//!   presence ([`runners`]), ended dashboard sessions ([`sessions`]).
//! - Bytes: [`attachments`].
//! - What operators are shown, read once for the CLI, the dashboard and ops: [`views`].
//!
//! Decisions stay in core; connecting, topology, publishing to and consuming from the streams
//! stay in `turnpike-jetstream`.

#![warn(missing_docs)]

pub mod admission;
pub mod attachments;
mod bus;
pub mod chats;
pub mod claims;
pub mod fence;
pub mod leases;
pub mod live;
pub mod outbox;
pub mod profiles;
pub mod runners;
pub mod sessions;
pub mod turns;
pub mod views;
pub mod work;
pub mod workspaces;

pub use bus::Bus;
