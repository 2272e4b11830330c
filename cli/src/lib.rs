//! The `exactly` command as a library: job files, the job runner with its admin endpoint and
//! progress line, checkpoint inspection, the transaction tool and the benchmarks.

pub mod admin;
#[cfg(feature = "bench")]
pub use exactly_bench as bench;
pub mod checkpoints;
pub mod credential_cache;
pub mod datagen;
pub use exactly_jobs as jobfile;
pub mod logging;
pub mod metrics;
use exactly_jobs::records;
pub mod run;
pub mod txn;
pub use exactly_verify as verify;
