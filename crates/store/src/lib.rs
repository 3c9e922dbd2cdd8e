//! Turnpike's application layer, between the roles and the plumbing: the repositories of turn
//! records (`turns`) and chat records (`chats`) in their KV buckets, the claims of attempts
//! (`claims`) and the per-turn fence (`fence`). Each reads a record, asks `turnpike-core` what
//! changes, writes it back with compare-and-set (re-reading on a lost race), and carries out the
//! effects core returned (`outbox`); a new turn joins its chat through `admission`. Decisions stay in core; connecting, topology,
//! publishing and consuming stay in `turnpike-jetstream`.

pub mod admission;
pub mod chats;
pub mod claims;
pub mod fence;
pub mod outbox;
pub mod turns;
