//! `exactly-core`: the checkpointed dataflow engine.
//!
//! Records and checkpoint barriers flow through chains of operators; a coordinator injects
//! barriers at the sources, multi-input operators align them, every operator snapshots its state,
//! the checkpoint is made durable and only then is completion notified. This crate knows nothing
//! of Kafka or MySQL: connectors build on it.
