//! The trait a transactional sink implements.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use exactly_core::runtime::SubtaskInfo;
use exactly_core::CheckpointId;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{CommitError, Result};

/// The outcome of a pre-commit.
#[derive(Debug)]
pub enum PreCommitted<C, X> {
    /// Prepared: commit this once the checkpoint completes.
    Committable(C),
    /// Preparing goes on in the background (a flush, a check with the external system): the
    /// driver lets the records after the barrier flow into the next transaction meanwhile, and
    /// the checkpoint is acknowledged only when this resolves to the committable (an error fails
    /// the task, as a failed pre-commit does). The future must own what it needs: the sink keeps
    /// running beside it, so the transaction's resources (the Kafka sink: its pooled producer)
    /// must stay out of `begin`'s reach until it is committed or aborted.
    InBackground(PreCommitting<C>),
    /// Nothing was written: nothing to commit (the transaction was released).
    Empty,
    /// Cannot prepare now (e.g. no free transaction for the records that follow): the checkpoint
    /// is declined and the transaction stays open into the next one. This is backpressure, not
    /// a failure.
    Declined {
        /// The still open transaction.
        txn: X,
        /// Why, for the log.
        reason: String,
    },
}

/// A pre-commit completing in the background (see [`PreCommitted::InBackground`]).
pub struct PreCommitting<C>(Pin<Box<dyn Future<Output = Result<C>> + Send + 'static>>);

impl<C> PreCommitting<C> {
    /// Wraps the rest of a pre-commit.
    pub fn new(rest: impl Future<Output = Result<C>> + Send + 'static) -> Self {
        PreCommitting(Box::pin(rest))
    }
}

impl<C> Future for PreCommitting<C> {
    type Output = Result<C>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<C>> {
        self.0.as_mut().poll(cx)
    }
}

impl<C> Debug for PreCommitting<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PreCommitting(..)")
    }
}

/// How [`TwoPhaseCommitSink::start_commit`] went.
#[derive(Debug)]
pub enum Committed {
    /// Committed (now or by an earlier attempt).
    Done,
    /// The commit completes in the background (a round trip to the external system): the driver
    /// lets records flow meanwhile and keeps naming the committable in its checkpoints until this
    /// resolves, so a restart commits it again (commit is idempotent). A retriable error is
    /// retried through [`TwoPhaseCommitSink::commit`]; the sink must have the transaction ready
    /// for that call once this future has resolved. Commits of successive checkpoints may overlap.
    InBackground(Committing),
}

/// A commit completing in the background (see [`Committed::InBackground`]).
pub struct Committing(Pin<Box<dyn Future<Output = Result<(), CommitError>> + Send + 'static>>);

impl Committing {
    /// Wraps the rest of a commit.
    pub fn new(rest: impl Future<Output = Result<(), CommitError>> + Send + 'static) -> Self {
        Committing(Box::pin(rest))
    }
}

impl Future for Committing {
    type Output = Result<(), CommitError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), CommitError>> {
        self.0.as_mut().poll(cx)
    }
}

impl Debug for Committing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Committing(..)")
    }
}

/// What a sink learns at start, to recover and to clean up.
pub struct RecoveryContext<'a, C> {
    /// This subtask.
    pub info: &'a SubtaskInfo,
    /// Committables this subtask restored (already committed by the driver when
    /// `abort_lingering` is called).
    pub restored: &'a [(CheckpointId, C)],
    /// Committables every subtask restored (others may still be committing theirs: a lingering
    /// cleanup must leave their transactions alone).
    pub all_restored: &'a [(CheckpointId, C)],
    /// Whether the job restores from a checkpoint or savepoint.
    pub is_restored: bool,
    /// The checkpoint or savepoint the job restores (`None`: a fresh start).
    pub restored_checkpoint: Option<CheckpointId>,
    /// The newest checkpoint, which cannot be read, when the job restores an older one in its
    /// place (see `InitContext::unreadable_newer`): then [`TwoPhaseCommitSink::committed_through`]
    /// is the proof that none of this subtask's transactions after the restored one committed,
    /// and a record that cannot tell must say so (an error), not answer `None`.
    pub unreadable_newer: Option<CheckpointId>,
    /// The job's checkpoint storage (`None`: none, or a test): see
    /// [`RecoveryContext::check_still_owner`].
    pub owner: Option<&'a std::sync::Arc<dyn exactly_core::storage::CheckpointStorage>>,
}

impl<C: Debug> Debug for RecoveryContext<'_, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecoveryContext")
            .field("info", &self.info)
            .field("restored", &self.restored)
            .field("all_restored", &self.all_restored)
            .field("is_restored", &self.is_restored)
            .field("restored_checkpoint", &self.restored_checkpoint)
            .field("unreadable_newer", &self.unreadable_newer)
            .field("owner", &self.owner.is_some())
            .finish()
    }
}

impl<C> RecoveryContext<'_, C> {
    /// Checks that this run still owns its checkpoint location. A sink calls it before each
    /// request of its recovery that changes the external system (fencing a producer, aborting a
    /// transaction, rolling back a prepared one): a recovery may take long, and a run that lost
    /// its location meanwhile (stalled past its claim's lease, or cut off from the checkpoint
    /// store) must not abort or fence the new owner's transactions.
    pub async fn check_still_owner(&self) -> exactly_core::Result<()> {
        exactly_core::storage::check_still_owner(self.owner).await
    }
}

/// A sink that writes into transactions of an external system and commits them in two phases.
///
/// Implementations hold their connections; the driver ([`crate::TwoPhaseSink`]) decides when each
/// method runs. Commit must be idempotent: committing an already committed committable succeeds.
///
/// A sketch against a store with transactions of its own (the `file_transactions` example is a
/// complete, runnable one; `docs/writing-a-connector.md` says what each method must guarantee):
///
/// ```no_run
/// use exactly_core::CheckpointId;
/// use exactly_twophase::{CommitError, PreCommitted, TwoPhaseCommitSink, TwoPhaseSink};
///
/// /// Stands in for a client of a transactional store.
/// struct Store;
/// impl Store {
///     fn prepare(&self, rows: &[String], name: &str) -> std::io::Result<()> { Ok(()) }
///     /// Ok(true): committed now or before; Ok(false): the store no longer has it.
///     fn commit(&self, name: &str) -> std::io::Result<bool> { Ok(true) }
///     fn rollback(&self, name: &str) -> std::io::Result<()> { Ok(()) }
/// }
///
/// struct StoreSink {
///     store: Store,
///     subtask: u32,
/// }
///
/// impl TwoPhaseCommitSink<String> for StoreSink {
///     /// Rows of the open transaction (buffered here; a real client writes as they come).
///     type Transaction = Vec<String>;
///     /// The prepared transaction's name: enough to commit it after a restart.
///     type Committable = String;
///
///     async fn begin(&mut self, _id: CheckpointId) -> exactly_twophase::Result<Vec<String>> {
///         Ok(Vec::new())
///     }
///
///     async fn write(&mut self, txn: &mut Vec<String>, rows: Vec<String>) -> exactly_twophase::Result<()> {
///         txn.extend(rows);
///         Ok(())
///     }
///
///     async fn pre_commit(
///         &mut self,
///         txn: Vec<String>,
///         id: CheckpointId,
///     ) -> exactly_twophase::Result<PreCommitted<String, Vec<String>>> {
///         if txn.is_empty() {
///             return Ok(PreCommitted::Empty);
///         }
///         let name = format!("{}-{id}", self.subtask);
///         self.store
///             .prepare(&txn, &name)
///             .map_err(|e| exactly_core::CoreError::operator("store", exactly_core::ErrorClass::Restart, e))?;
///         Ok(PreCommitted::Committable(name))
///     }
///
///     async fn commit(&mut self, name: &String) -> Result<(), CommitError> {
///         match self.store.commit(name) {
///             Ok(true) => Ok(()), // committed, now or by an earlier attempt
///             Ok(false) => Err(CommitError::Lost {
///                 what: format!("prepared transaction {name}"),
///                 source: "the store no longer has it".into(),
///             }),
///             Err(e) => Err(CommitError::Retriable(Box::new(e))),
///         }
///     }
///
///     async fn abort(&mut self, _txn: Vec<String>) -> exactly_twophase::Result<()> {
///         Ok(()) // nothing reached the store before pre-commit
///     }
/// }
///
/// // In a job: the one generic driver binds it to checkpoints.
/// # let mut job = exactly_core::runtime::JobBuilder::new(exactly_core::runtime::JobConfig::new("j"));
/// # let stream: exactly_core::runtime::Stream<String> = unimplemented!();
/// stream.sink("store", |info| TwoPhaseSink::new(StoreSink { store: Store, subtask: info.index }));
/// ```
pub trait TwoPhaseCommitSink<T>: Send + 'static {
    /// An open transaction.
    type Transaction: Send;
    /// What pre-commit returns and the checkpoint stores: enough to commit after a restart.
    type Committable: Serialize + DeserializeOwned + Clone + Debug + Send + Sync + 'static;

    /// Connects and validates configuration against the external system. Runs before recovery.
    fn open(&mut self, _info: &SubtaskInfo) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }

    /// Opens a transaction for the records after the barrier of `checkpoint_id - 1`.
    fn begin(&mut self, checkpoint_id: CheckpointId) -> impl Future<Output = Result<Self::Transaction>> + Send;

    /// Writes records into the open transaction.
    fn write(&mut self, txn: &mut Self::Transaction, records: Vec<T>) -> impl Future<Output = Result<()>> + Send;

    /// Flushes and prepares the transaction at barrier `checkpoint_id`, here or, returning
    /// [`PreCommitted::InBackground`], while the next transaction takes the records that follow.
    fn pre_commit(
        &mut self,
        txn: Self::Transaction,
        checkpoint_id: CheckpointId,
    ) -> impl Future<Output = Result<PreCommitted<Self::Committable, Self::Transaction>>> + Send;

    /// Commits a pre-committed transaction. Already committed is success.
    fn commit(&mut self, committable: &Self::Committable) -> impl Future<Output = Result<(), CommitError>> + Send;

    /// Commits a pre-committed transaction of this run when its checkpoint completes, here or,
    /// returning [`Committed::InBackground`], while the records that follow flow on. The default
    /// commits here ([`commit`](Self::commit)). Restored committables are always committed with
    /// `commit`, before anything else runs.
    fn start_commit(
        &mut self,
        committable: &Self::Committable,
    ) -> impl Future<Output = Result<Committed, CommitError>> + Send {
        async move { self.commit(committable).await.map(|()| Committed::Done) }
    }

    /// Aborts an open transaction (the job is stopping without committing it).
    fn abort(&mut self, txn: Self::Transaction) -> impl Future<Output = Result<()>> + Send;

    /// Before restored committables are committed: aborts open transactions of this subtask that
    /// no restored committable is (`ctx.all_restored`), when they could hold up those commits
    /// (Kafka: an open transaction pins the last stable offset a read_committed check of a
    /// restored transaction waits on). Must leave every restored committable's transaction alone.
    /// The default does nothing; `abort_lingering` still runs after the commits.
    fn abort_unneeded(
        &mut self,
        _ctx: &RecoveryContext<'_, Self::Committable>,
    ) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }

    /// After restored committables are committed: aborts transactions this sink owns that no
    /// checkpoint needs (left by a crash), so readers are not blocked.
    fn abort_lingering(
        &mut self,
        _ctx: &RecoveryContext<'_, Self::Committable>,
    ) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }

    /// The newest checkpoint whose transactions the external system shows committed for this
    /// subtask of the sink (a progress table's rows; subtask 0 also answers for subtasks at or
    /// above the parallelism, as after a rescale down), `None` when it keeps no such record or
    /// holds none. Per subtask: the ranges of a job split over processes number their
    /// checkpoints each on its own. Runs after `open`, before recovery. The driver refuses a restore
    /// of an older checkpoint, and a fresh start when this is `Some`: the input after the
    /// restored position would be written again over output the sink already holds (a
    /// checkpoint directory that lost its newest checkpoints, a stale listing, a directory
    /// pointed somewhere new, a directory removed and started afresh).
    fn committed_through(
        &mut self,
        _ctx: &RecoveryContext<'_, Self::Committable>,
    ) -> impl Future<Output = Result<Option<CheckpointId>>> + Send {
        async { Ok(None) }
    }

    /// Whether [`committed_through`](Self::committed_through) reads a record of this sink's
    /// commits (the database sinks' progress rows). Asked, before [`open`](Self::open), when the
    /// job would restore an older checkpoint because the newest cannot be read: only a sink that
    /// keeps such a record can show that restoring it is safe; any other stops the job at once,
    /// having changed nothing (an `open` may abort open transactions the unreadable checkpoint
    /// still needs).
    fn records_commits(&self) -> bool {
        false
    }

    /// Forgets the record of commits of checkpoints after `id` (the operator accepted replay
    /// from `id`, or from the start for 0): the checkpoints that follow may get ids that the
    /// record would otherwise show committed already. Runs before recovery when
    /// [`committed_through`](Self::committed_through) is past `id` and replay was accepted.
    fn forget_commits_after(
        &mut self,
        _ctx: &RecoveryContext<'_, Self::Committable>,
        _id: CheckpointId,
    ) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }

    /// How long the external system keeps a prepared transaction before aborting it (the driver
    /// warns when a pending one gets close). `None`: no such limit.
    fn transaction_timeout(&self) -> Option<Duration> {
        None
    }
}
