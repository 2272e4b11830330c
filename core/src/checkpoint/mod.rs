//! Checkpoint barriers at multi-input subtasks, and the metadata of completed checkpoints.

pub mod alignment;
mod metadata;

pub use alignment::{AbortReason, AlignerEvent, AlignmentMode, BarrierAligner};
#[cfg(test)]
pub(crate) use metadata::tests;
pub use metadata::*;
