//! `exactly-twophase`: the two-phase-commit sink trait and the one generic driver that binds any
//! implementation to the checkpoints of `exactly-core`.
