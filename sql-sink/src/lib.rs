//! What exactly's SQL sinks share, written once against the public core and two-phase API: the
//! progress tables that prove which checkpoints committed ([`progress`]) and how a database error
//! is classified ([`error`]). Each sink keeps its dialect — quoting, placeholders, column types,
//! upsert syntax, XA versus `PREPARE TRANSACTION` — in a [`progress::Dialect`] of its own.

pub mod config;
pub mod error;
pub mod progress;

pub use progress::{Arg, BoxFut, DbError, Dialect, Progress, Set, Statement};
