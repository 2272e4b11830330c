//! What user code implements: sources, sinks, process functions, and the checkpoint hooks they
//! share (Flink's `CheckpointedFunction` and `CheckpointListener`, with no-op defaults).

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use super::output::{DeferredSnapshot, DeferredState};
use crate::error::Result;
use crate::message::{CheckpointId, SnapshotKind, Watermark};
use crate::state::{KeyedContext, RestoredState};

/// Where a subtask stands in the job. Made by the runtime; a connector's tests make one with
/// [`SubtaskInfo::new`] and set the fields they need (fields may be added in a minor version).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SubtaskInfo {
    /// The operator's uid.
    pub uid: String,
    /// This subtask's index.
    pub index: u32,
    /// The operator's parallelism.
    pub parallelism: u32,
    /// The job's max parallelism (number of key groups).
    pub max_parallelism: u32,
    /// Restart attempt (0 for the first run).
    pub attempt: u32,
    /// The job is starting: no checkpoint has completed in this process yet (nor has a run
    /// lasted a minute). A connector that cannot reach its service now should fail at once,
    /// naming the address — start-up attempts are bounded (`JobConfig::startup_attempts`) — rather
    /// than wait as it would for an outage of a service the running job used.
    pub starting: bool,
    /// The longest a checkpoint this subtask snapshots may take to complete plus the longest
    /// wait before a restart after it (checkpoint timeout + the restart strategy's longest
    /// delay); `None` without checkpointing. A sink whose transactions time out uses it to know
    /// how long a pre-committed transaction may still have to wait for its commit.
    pub commit_window: Option<Duration>,
    /// The checkpoint or savepoint this attempt restores (the whole job's), `None` for a fresh
    /// start. A sink whose external system records what it committed checks that it is not
    /// behind that record: output newer checkpoints committed would be written again.
    pub restored_checkpoint: Option<CheckpointId>,
    /// The operator accepted replay for this run (`--accept-replay`): a restore older than what
    /// a sink's external system shows committed goes ahead (that output may be written again).
    pub accept_replay: bool,
}

impl SubtaskInfo {
    /// Subtask `index` of `parallelism` of operator `uid` on its first run of a fresh start: the
    /// default max parallelism, attempt 0, starting, no commit window, nothing restored.
    pub fn new(uid: impl Into<String>, index: u32, parallelism: u32) -> Self {
        SubtaskInfo {
            uid: uid.into(),
            index,
            parallelism,
            max_parallelism: crate::state::DEFAULT_MAX_PARALLELISM,
            attempt: 0,
            starting: true,
            commit_window: None,
            restored_checkpoint: None,
            accept_replay: false,
        }
    }
}

/// Given to `initialize_state`: the restored state of this subtask, if any.
pub struct InitContext<'a> {
    /// This subtask.
    pub info: &'a SubtaskInfo,
    pub(crate) restored: Option<&'a RestoredState>,
    /// For a sink, when the job restores past checkpoints it cannot read.
    pub(crate) proof: Option<&'a RestoreProof>,
    /// This sink subtask proved it (see [`InitContext::prove_nothing_newer_committed`]).
    pub(crate) proved_here: std::sync::atomic::AtomicBool,
    /// The job's checkpoint storage (see [`InitContext::check_still_owner`]).
    pub(crate) owner: Option<&'a std::sync::Arc<dyn crate::storage::CheckpointStorage>>,
}

impl std::fmt::Debug for InitContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InitContext")
            .field("info", &self.info)
            .field("restored", &self.restored)
            .field("proof", &self.proof)
            .field("proved_here", &self.proved_here)
            .field("owner", &self.owner.is_some())
            .finish()
    }
}

/// A restore that went back past checkpoints it cannot read: safe only if every sink proves that
/// none of its transactions after the restored checkpoint committed. Counted per sink subtask
/// (`expected` as each opens, `proved` as each proves); the run checks once every task opened.
#[derive(Debug)]
pub(crate) struct RestoreProof {
    /// The newest checkpoint, which cannot be read.
    pub(crate) unusable: CheckpointId,
    /// Why (the error a restore without proofs reports).
    pub(crate) reason: String,
    /// Sink subtasks of the run (counted as they are made, before any opens).
    pub(crate) expected: std::sync::atomic::AtomicUsize,
    pub(crate) proved: std::sync::atomic::AtomicUsize,
    pub(crate) declined: std::sync::atomic::AtomicUsize,
    /// Every task of the run is made (`expected` is final).
    pub(crate) made: std::sync::atomic::AtomicBool,
    /// Sink subtasks whose initialisation failed otherwise (an outage): the attempt restarts.
    pub(crate) aborted: std::sync::atomic::AtomicUsize,
    /// `Some(Settled::…)` once decided.
    pub(crate) settled: tokio::sync::watch::Sender<Option<Settled>>,
}

impl RestoreProof {
    pub(crate) fn new(unusable: CheckpointId, reason: String) -> Self {
        RestoreProof {
            unusable,
            reason,
            expected: Default::default(),
            proved: Default::default(),
            declined: Default::default(),
            aborted: Default::default(),
            made: Default::default(),
            settled: tokio::sync::watch::channel(None).0,
        }
    }

    /// Every task of the run is made: settles if every sink subtask already proved it.
    pub(crate) fn all_made(&self) {
        self.made.store(true, std::sync::atomic::Ordering::SeqCst);
        self.evaluate();
    }

    fn evaluate(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        if self.declined.load(SeqCst) > 0 {
            self.settled.send_replace(Some(Settled::Declined));
        } else if self.aborted.load(SeqCst) > 0 {
            self.settled.send_replace(Some(Settled::Aborted));
        } else if self.made.load(SeqCst) && self.proved.load(SeqCst) >= self.expected.load(SeqCst) {
            self.settled.send_replace(Some(Settled::Proved));
        }
    }

    /// A sink subtask's initialisation failed before it proved anything, for a reason that is not
    /// a refusal (an outage): the others stop too, and the attempt restarts (proving again).
    pub(crate) fn abort(&self) {
        self.aborted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.evaluate();
    }

    /// One sink subtask proved it, or could not.
    pub(crate) fn record(&self, proved: bool) {
        use std::sync::atomic::Ordering::SeqCst;
        if proved {
            self.proved.fetch_add(1, SeqCst);
        } else {
            self.declined.fetch_add(1, SeqCst);
        }
        self.evaluate();
    }

    /// Whether every sink subtask proved it (false: one could not, or none was asked).
    pub(crate) fn all_proved(&self) -> bool {
        *self.settled.borrow() == Some(Settled::Proved)
    }
}

/// How a restore past unreadable checkpoints was settled by the sinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Every sink subtask proved it safe.
    Proved,
    /// A sink subtask could not (it committed past the restored checkpoint, or cannot tell).
    Declined,
    /// A sink subtask failed otherwise (an outage): this attempt ends and the next proves again.
    Aborted,
}

impl<'a> InitContext<'a> {
    /// A context for `info` with `restored` state (the runtime builds these; public so that user
    /// functions can be tested on their own).
    pub fn new(info: &'a SubtaskInfo, restored: Option<&'a RestoredState>) -> Self {
        InitContext {
            info,
            restored,
            proof: None,
            proved_here: Default::default(),
            owner: None,
        }
    }

    /// This context with the job's checkpoint storage, whose owner
    /// [`InitContext::check_still_owner`] checks (the runtime sets it; public so that a sink can
    /// be tested with it).
    pub fn with_checkpoint_storage(
        mut self,
        storage: &'a std::sync::Arc<dyn crate::storage::CheckpointStorage>,
    ) -> Self {
        self.owner = Some(storage);
        self
    }

    /// (Sinks) Checks that this run still owns its checkpoint location. A sink calls it on
    /// restore right before it changes anything in its external system (commits the restored
    /// checkpoint's transactions, aborts lingering ones, fences producers): a run that stalled
    /// past its claim's lease while it restored — another run took the location over meanwhile —
    /// stops here ([`CoreError::LocationOwned`](crate::CoreError), fatal), before it could abort
    /// or fence the new owner's transactions. `Ok` for a job without checkpoint storage.
    /// The two-phase driver calls it again before each further step that changes the external
    /// system (aborting, fencing, forgetting): a recovery may take long, and the location be
    /// lost meanwhile (a partition from the checkpoint store while the external system stays
    /// reachable: the claim then goes unrenewed, and the check fails).
    pub async fn check_still_owner(&self) -> crate::Result<()> {
        crate::storage::check_still_owner(self.owner).await
    }

    /// The job's checkpoint storage, for a sink's recovery to check its owner before each
    /// request that changes the external system ([`crate::storage::check_still_owner`]).
    pub fn checkpoint_storage(&self) -> Option<&'a std::sync::Arc<dyn crate::storage::CheckpointStorage>> {
        self.owner
    }

    /// (Sinks) When the job restores `info.restored_checkpoint` although newer checkpoints exist
    /// that cannot be read: the newest of those. Restoring is safe only if no sink committed a
    /// transaction of a checkpoint after the restored one; a sink whose external system records
    /// what it committed checks that and says so with
    /// [`InitContext::prove_nothing_newer_committed`]. The job goes on only if every sink subtask
    /// does; otherwise it stops, reporting the unreadable checkpoint.
    pub fn unreadable_newer(&self) -> Option<CheckpointId> {
        self.proof.map(|p| p.unusable)
    }

    /// (Sinks) This sink subtask shows that none of its transactions of a checkpoint after the
    /// restored one committed (see [`InitContext::unreadable_newer`]).
    pub fn prove_nothing_newer_committed(&self) {
        if let Some(p) = self.proof {
            if !self.proved_here.swap(true, std::sync::atomic::Ordering::SeqCst) {
                p.record(true);
            }
        }
    }

    /// (Sinks) After [`InitContext::prove_nothing_newer_committed`]: waits until every sink
    /// subtask of the run proved it (`Ok`), or one could not (an error: the job stops, and this
    /// sink must change nothing in its external system). Without a restore past unreadable
    /// checkpoints: `Ok` at once.
    pub async fn proofs_settled(&self) -> Result<()> {
        let Some(p) = self.proof else {
            return Ok(());
        };
        let mut rx = p.settled.subscribe();
        let settled = rx.wait_for(Option::is_some).await.map(|v| *v).unwrap_or(None);
        match settled {
            Some(Settled::Proved) => Ok(()),
            // Another sink could not reach its system: an outage, as that one's error says.
            Some(Settled::Aborted) => Err(crate::CoreError::operator(
                self.info.uid.clone(),
                crate::ErrorClass::Retriable,
                "another sink failed while the restore past an unreadable checkpoint was being proved safe: this attempt ends, the next one proves it again",
            )),
            _ => Err(crate::CoreError::operator(
                self.info.uid.clone(),
                crate::ErrorClass::Fatal,
                format!(
                    "checkpoint {} cannot be read, and another sink of the job cannot show that none of its transactions after checkpoint {} committed (see its error): nothing is restored",
                    p.unusable,
                    self.info.restored_checkpoint.unwrap_or(0)
                ),
            )),
        }
    }

    /// Whether the job restores from a checkpoint or savepoint that has state for this operator.
    pub fn is_restored(&self) -> bool {
        self.restored.is_some()
    }

    /// This subtask's share of list state `name` (empty when fresh).
    pub fn list_state(&self, name: &str) -> Vec<Vec<u8>> {
        self.restored
            .and_then(|r| r.list_state.get(name).cloned())
            .unwrap_or_default()
    }

    /// Every subtask's entries of union list state `name` (empty when fresh).
    pub fn union_state(&self, name: &str) -> Vec<Vec<u8>> {
        self.restored
            .and_then(|r| r.union_state.get(name).cloned())
            .unwrap_or_default()
    }
}

/// Given to `snapshot_state`: the checkpoint, and where to put operator state.
pub struct SnapshotContext {
    /// The checkpoint being taken.
    pub checkpoint_id: CheckpointId,
    /// Checkpoint or savepoint.
    pub kind: SnapshotKind,
    /// When it was triggered (ms since the Unix epoch).
    pub timestamp_ms: u64,
    pub(crate) list_state: BTreeMap<String, Vec<Vec<u8>>>,
    pub(crate) union_state: BTreeMap<String, Vec<Vec<u8>>>,
    pub(crate) deferred: Vec<DeferredSnapshot>,
}

impl std::fmt::Debug for SnapshotContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotContext")
            .field("checkpoint_id", &self.checkpoint_id)
            .field("kind", &self.kind)
            .field("timestamp_ms", &self.timestamp_ms)
            .field("list_state", &self.list_state)
            .field("union_state", &self.union_state)
            .field("deferred", &self.deferred.len())
            .finish()
    }
}

impl SnapshotContext {
    /// A context for checkpoint `checkpoint_id` (the runtime builds these; public for tests of
    /// user functions).
    pub fn new(checkpoint_id: CheckpointId, kind: SnapshotKind, timestamp_ms: u64) -> Self {
        SnapshotContext {
            checkpoint_id,
            kind,
            timestamp_ms,
            list_state: BTreeMap::new(),
            union_state: BTreeMap::new(),
            deferred: Vec::new(),
        }
    }

    /// Finishes this operator's part of the checkpoint in the background (Flink's asynchronous
    /// snapshot phase): `snapshot_state` returns at once and the task goes on with the records
    /// after the barrier, while `part` runs on its own (the runtime spawns it). The task
    /// acknowledges the checkpoint only when every deferred part of it has ended, and strictly in
    /// checkpoint order (checkpoint n+1's acknowledgement never overtakes n's), so the checkpoint
    /// cannot complete, and nobody is told it did, before `part` ended. State `part` returns is
    /// added to what `snapshot_state` put; an error fails the task, as an error of
    /// `snapshot_state` would.
    ///
    /// `part` must own what it uses: the operator keeps running beside it. If the run fails or
    /// stops first, `part` is cancelled (dropped at its next await).
    ///
    /// Honoured for sinks and for chained functions; a source's snapshot cannot be deferred (its
    /// position is what the barrier marks).
    pub fn defer(&mut self, part: impl Future<Output = Result<DeferredState>> + Send + 'static) {
        self.deferred.push(Box::pin(part));
    }

    /// Stores list state `name`: on restore with another parallelism its entries are dealt among
    /// the subtasks.
    pub fn put_list_state(&mut self, name: impl Into<String>, entries: Vec<Vec<u8>>) {
        self.list_state.insert(name.into(), entries);
    }

    /// Stores union list state `name`: on restore every subtask receives every subtask's entries.
    pub fn put_union_state(&mut self, name: impl Into<String>, entries: Vec<Vec<u8>>) {
        self.union_state.insert(name.into(), entries);
    }

    /// Runs the deferred parts (in the order they were deferred) and adds their state: what the
    /// runtime does before it acknowledges the checkpoint (for tests of user functions).
    pub async fn finish_deferred(&mut self) -> Result<()> {
        for part in std::mem::take(&mut self.deferred) {
            let state = part.await?;
            state.add_to(&mut self.list_state, &mut self.union_state);
        }
        Ok(())
    }

    /// What a restore with unchanged parallelism would hand this subtask back (for tests).
    ///
    /// # Panics
    /// If a deferred part has not been run: call [`SnapshotContext::finish_deferred`] first.
    pub fn into_restored(self) -> RestoredState {
        assert!(
            self.deferred.is_empty(),
            "deferred snapshot parts not run: call finish_deferred first"
        );
        RestoredState {
            list_state: self.list_state,
            union_state: self.union_state,
            keyed: Vec::new(),
        }
    }
}

/// State that takes part in checkpoints.
pub trait CheckpointedFunction {
    /// Called once before any record, with restored state if the job restores.
    fn initialize_state(&mut self, _ctx: &InitContext<'_>) -> Result<()> {
        Ok(())
    }
    /// Called when the barrier of a checkpoint reaches this operator.
    fn snapshot_state(&mut self, _ctx: &mut SnapshotContext) -> Result<()> {
        Ok(())
    }
}

/// Told when checkpoints complete or abort. Completion of `id` implies every earlier checkpoint is
/// complete too: a listener that missed a notification must act on everything up to `id`.
pub trait CheckpointListener {
    /// Checkpoint `id` is durable.
    fn notify_checkpoint_complete(&mut self, _id: CheckpointId) -> Result<()> {
        Ok(())
    }
    /// Checkpoint `id` was aborted.
    fn notify_checkpoint_aborted(&mut self, _id: CheckpointId) -> Result<()> {
        Ok(())
    }
}

/// Where an operator emits its output.
pub struct Collector<'a, T> {
    pub(crate) out: &'a mut dyn super::output::Output<T>,
}

impl<T> Collector<'_, T> {
    /// Emits a record downstream.
    pub fn emit(&mut self, record: T) -> Result<()> {
        self.out.record(record)
    }
}

/// A stateful operator on a (non-keyed) stream.
pub trait ProcessFunction<I, O>: CheckpointedFunction + CheckpointListener + Send + 'static {
    /// Handles one record.
    fn process(&mut self, record: I, out: &mut Collector<'_, O>) -> Result<()>;
    /// Called before the barrier is forwarded (Flink's `prepareSnapshotPreBarrier`): emit what
    /// must belong to this checkpoint.
    fn prepare_snapshot_pre_barrier(&mut self, _id: CheckpointId, _out: &mut Collector<'_, O>) -> Result<()> {
        Ok(())
    }
    /// Called when the event-time watermark advances.
    fn on_watermark(&mut self, _watermark: Watermark, _out: &mut Collector<'_, O>) -> Result<()> {
        Ok(())
    }
    /// Called at end of input.
    fn finish(&mut self, _out: &mut Collector<'_, O>) -> Result<()> {
        Ok(())
    }
}

/// A stateful operator on a keyed stream: keyed state is scoped to the current record's key.
pub trait KeyedProcessFunction<I, O>: CheckpointedFunction + CheckpointListener + Send + 'static {
    /// Handles one record; `state` accesses the current key's state.
    fn process(&mut self, record: I, state: &mut KeyedContext<'_>, out: &mut Collector<'_, O>) -> Result<()>;
}

/// What a source poll produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceStatus {
    /// Records may follow.
    More,
    /// Nothing now; poll again (the source waited briefly before returning, in this poll or in
    /// [`Source::available`] before it).
    Idle,
    /// Records, and with them the source has read all its input so far: it found nothing left
    /// to read, waited, and took what arrived (the Kafka source: less than a batch). Poll again.
    /// Like `Idle` this counts as caught up for `CheckpointConfig::when_caught_up`: under steady
    /// traffic a source may never find nothing for the whole of its brief wait.
    CaughtUp,
    /// Records, a full batch: the source is behind, reading a backlog (the Kafka source: it took
    /// a whole `poll_batch` from what was fetched). Otherwise as `More`. A backlog read — from a
    /// poll saying `Backlog` until the next saying `Idle` or `CaughtUp` — that lasted a tenth of
    /// the checkpoint interval makes the time every source has caught up a checkpoint
    /// (`WhenCaughtUp::AfterBacklog`, the default); a source that never says `Backlog` is
    /// checkpointed at the interval.
    Backlog,
    /// The source is exhausted (bounded input).
    End,
}

/// What a source says about event time after a poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceWatermark {
    /// No record with a smaller timestamp follows from this subtask.
    At(Watermark),
    /// This subtask has nothing to read for now: downstream leaves it out of the watermark.
    Idle,
}

/// A parallel source. The runtime calls `poll_next` in a loop and injects barriers between calls,
/// so `snapshot_state` sees the position right after the records it returned last.
pub trait Source<T>: Send + 'static {
    /// Called once before polling, with restored state if the job restores.
    fn initialize_state(&mut self, _ctx: &InitContext<'_>) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }
    /// Asked once after `initialize_state`: whether this subtask reads only once a checkpoint
    /// has recorded where it starts. True for a start position that is a moment rather than a
    /// place — the end of a log *now* — which a run restarted before its first checkpoint
    /// completed would resolve again, later, skipping what the failed run read and never
    /// committed (also when the restart is a new process, which no memory of the first one
    /// reaches). With checkpointing on, the runtime then takes a checkpoint at once (not after
    /// the interval), serves it, and polls only once a checkpoint has completed. Default: false.
    fn reads_after_first_checkpoint(&self) -> bool {
        false
    }
    /// Appends records to `out` and returns promptly (within a few tens of milliseconds when there
    /// is no data, so barriers are not delayed). Where there is no data it waits briefly, here or
    /// in [`Source::available`]: a source that waits in neither is polled again at once and spins
    /// a core (the runtime still yields to the rest of the job between polls).
    fn poll_next(&mut self, out: &mut Vec<T>) -> impl Future<Output = Result<SourceStatus>> + Send;
    /// Waits until `poll_next` may find records, or at most a few tens of milliseconds (Flink's
    /// `SourceReader::isAvailable`). After a poll that said `Idle` or `CaughtUp` the runtime
    /// waits here, not in `poll_next`, and meanwhile injects barriers, sends acknowledgements and
    /// delivers checkpoint notifications (so a sink chained to the source commits) without waiting
    /// for the source: the future may be dropped before it completes and must lose nothing then
    /// (cancel-safe). A source that waits here need not wait in `poll_next` when it follows.
    ///
    /// The default completes at once: `poll_next` does the waiting, and whatever the runtime has
    /// to do for a checkpoint waits for that poll to return.
    fn available(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }
    /// Snapshots the read position.
    fn snapshot_state(&mut self, _ctx: &mut SnapshotContext) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }
    /// Checkpoint `id` (and all before it) is durable.
    fn notify_checkpoint_complete(&mut self, _id: CheckpointId) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }
    /// Checkpoint `id` was aborted.
    fn notify_checkpoint_aborted(&mut self, _id: CheckpointId) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }
    /// Asked after every poll: the event-time watermark (or idleness) of this subtask, if the
    /// source generates watermarks. Advances are forwarded downstream; idleness once per change.
    fn watermark(&mut self) -> Option<SourceWatermark> {
        None
    }
    /// How many bytes one of this source's records occupies, heap included, for the byte limit
    /// of the alignment buffer (`max_alignment_buffer_bytes`) wherever the records are held back
    /// before `key_by`, `rebalance` or `union`. The default counts `size_of::<T>()` only: a source
    /// whose records own heap data (payload bytes, strings) says what they weigh, or a record of
    /// a megabyte counts as a few dozen bytes and the limit never acts.
    /// [`Stream::record_size`](crate::runtime::Stream::record_size) overrides it for one stream.
    fn record_size(record: &T) -> usize
    where
        Self: Sized,
    {
        std::mem::size_of_val(record)
    }
}

/// A parallel sink.
pub trait Sink<T>: Send + 'static {
    /// Called once before any record, with restored state if the job restores. A transactional
    /// sink commits what the restored checkpoint pre-committed here.
    fn initialize_state(&mut self, _ctx: &InitContext<'_>) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }
    /// Writes a batch of records.
    fn write(&mut self, records: Vec<T>) -> impl Future<Output = Result<()>> + Send;
    /// The barrier of checkpoint `ctx.checkpoint_id` arrived: flush or pre-commit, and record in
    /// `ctx` what a restore needs.
    fn snapshot_state(&mut self, _ctx: &mut SnapshotContext) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }
    /// Checkpoint `id` (and all before it) is durable: commit.
    fn notify_checkpoint_complete(&mut self, _id: CheckpointId) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }
    /// Checkpoint `id` was aborted.
    fn notify_checkpoint_aborted(&mut self, _id: CheckpointId) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }
    /// Whether this sink can show, in [`Sink::initialize_state`], that none of its transactions
    /// after a restored checkpoint committed ([`InitContext::prove_nothing_newer_committed`]).
    /// Asked before `initialize_state` when the job would restore past checkpoints it cannot
    /// read: a sink that cannot is not initialised at all (it might otherwise change its external
    /// system) and the job stops. Default: false (a sink that wraps another forwards it).
    fn can_prove_restores(&self) -> bool {
        false
    }
    /// End of input: flush what is buffered (a final checkpoint follows when checkpointing is on).
    fn finish(&mut self) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }
    /// The job is shutting down gracefully (after its last checkpoint completed and was
    /// notified): release what is still open.
    fn close(&mut self) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }
}
