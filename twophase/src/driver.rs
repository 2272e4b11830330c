//! The one generic driver: binds any [`TwoPhaseCommitSink`] to checkpoints as a core `Sink`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use exactly_core::runtime::{DeferredState, InitContext, Sink, SnapshotContext, SubtaskInfo};
use exactly_core::{failpoint, CheckpointId, CoreError, ErrorClass};
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::error::{CommitError, TwoPhaseError};
use crate::sink::{Committed, Committing, PreCommitted, PreCommitting, RecoveryContext, TwoPhaseCommitSink};

mod behind;
mod operator;

const STATE: &str = "two-phase-committables";

/// What a restart takes besides the restart strategy's delay (start-up, recovery commits): part
/// of the time a pre-committed transaction must outlive (the Kafka sink's guardrail uses it too).
pub const RESTART_ALLOWANCE: Duration = Duration::from_secs(5);

/// How failed commits are retried.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CommitRetry {
    /// Attempts before the failure fails the job (which restarts and commits from the checkpoint).
    pub attempts: u32,
    /// First backoff.
    pub initial_backoff: Duration,
    /// Largest backoff.
    pub max_backoff: Duration,
}

impl Default for CommitRetry {
    fn default() -> Self {
        CommitRetry {
            attempts: 8,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
        }
    }
}

/// What a two-phase sink subtask counts, readable while it runs.
#[derive(Debug, Default)]
pub struct TwoPhaseMetrics {
    pending: AtomicU64,
    committed: AtomicU64,
    commit_retries: AtomicU64,
    commit_failures: AtomicU64,
    oldest_pending_ms: AtomicU64,
}

impl TwoPhaseMetrics {
    /// Pre-committed transactions waiting for their checkpoint to complete.
    pub fn pending(&self) -> u64 {
        self.pending.load(Ordering::Relaxed)
    }
    /// Transactions committed.
    pub fn committed(&self) -> u64 {
        self.committed.load(Ordering::Relaxed)
    }
    /// Commit attempts retried after a retriable error.
    pub fn commit_retries(&self) -> u64 {
        self.commit_retries.load(Ordering::Relaxed)
    }
    /// Commits that failed for good (the job restarts and recovers them, or they were lost).
    pub fn commit_failures(&self) -> u64 {
        self.commit_failures.load(Ordering::Relaxed)
    }
    /// Age of the oldest pending transaction (ms) when last looked at.
    pub fn oldest_pending_ms(&self) -> u64 {
        self.oldest_pending_ms.load(Ordering::Relaxed)
    }
}

struct Pending<C> {
    committable: C,
    /// When the transaction began (its first record): what the external system's timeout counts.
    begun_at: Instant,
    warned: bool,
}

/// A commit completing in the background: its committable stays in every checkpoint until the
/// commit is confirmed (a restart commits it again; commit is idempotent).
struct InCommit<C> {
    pending: Pending<C>,
    done: tokio::task::JoinHandle<Result<(), CommitError>>,
}

/// Where a pre-commit completing in the background stands.
#[derive(Clone)]
enum Flight<C> {
    Running,
    Done(C),
    Failed,
}

/// A pre-commit completing in the background: its checkpoint is not acknowledged before it
/// resolves, so it has resolved before that checkpoint (or a later one) completes.
struct InFlight<C> {
    outcome: watch::Receiver<Flight<C>>,
    begun_at: Instant,
}

/// Runs a two-phase-commit sink as a core [`Sink`]: pre-commit at every barrier, commit on
/// completion (everything up to the completed id, started in order; commits a sink lets end in the
/// background may end in any order), recover before the first record.
///
/// A pre-committed transaction of a checkpoint that is later aborted stays pending and is
/// committed with the next completed checkpoint: its records precede that checkpoint's barrier,
/// so it is part of that checkpoint too. Aborting it would lose them.
pub struct TwoPhaseSink<T, S: TwoPhaseCommitSink<T>> {
    sink: S,
    info: Option<SubtaskInfo>,
    /// The sink's uid (fail points answer to `<uid>:<point>` too).
    uid: String,
    current: Option<S::Transaction>,
    /// When the open transaction began.
    current_begun: Instant,
    /// The checkpoint the open transaction belongs to (records before its barrier).
    current_id: CheckpointId,
    pending: BTreeMap<CheckpointId, Vec<Pending<S::Committable>>>,
    /// Pre-commits completing in the background, by checkpoint.
    in_flight: BTreeMap<CheckpointId, InFlight<S::Committable>>,
    /// Commits completing in the background, by checkpoint.
    committing: BTreeMap<CheckpointId, Vec<InCommit<S::Committable>>>,
    retry: CommitRetry,
    metrics: Arc<TwoPhaseMetrics>,
}

impl<T, S: TwoPhaseCommitSink<T>> TwoPhaseSink<T, S> {
    /// Drives `sink` with the default commit retry.
    pub fn new(sink: S) -> Self {
        Self::with_retry(sink, CommitRetry::default())
    }

    /// Drives `sink` with `retry`.
    pub fn with_retry(sink: S, retry: CommitRetry) -> Self {
        TwoPhaseSink {
            sink,
            info: None,
            uid: String::new(),
            current: None,
            current_begun: Instant::now(),
            current_id: 1,
            pending: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            committing: BTreeMap::new(),
            retry,
            metrics: Arc::default(),
        }
    }

    /// Live counters of this subtask.
    pub fn metrics(&self) -> Arc<TwoPhaseMetrics> {
        self.metrics.clone()
    }

    fn update_pending_metrics(&self) {
        let n: usize = self.pending.values().map(Vec::len).sum::<usize>()
            + self.committing.values().map(Vec::len).sum::<usize>()
            + self.in_flight.len();
        self.metrics.pending.store(n as u64, Ordering::Relaxed);
        let oldest = self
            .pending
            .values()
            .flatten()
            .map(|p| p.begun_at.elapsed().as_millis() as u64)
            .max()
            .unwrap_or(0);
        self.metrics.oldest_pending_ms.store(oldest, Ordering::Relaxed);
    }

    /// The wrapped sink.
    pub fn inner(&self) -> &S {
        &self.sink
    }

    /// Moves background pre-commits that resolved into `pending`; with `up_to`, first waits for
    /// those of checkpoints up to it (resolved already when that checkpoint completed: its
    /// acknowledgement waited for them).
    async fn settle(&mut self, up_to: Option<CheckpointId>) -> exactly_core::Result<()> {
        let ids: Vec<CheckpointId> = self.in_flight.keys().copied().collect();
        for id in ids {
            let flight = self.in_flight.get_mut(&id).expect("listed");
            let outcome = if up_to.is_some_and(|n| id <= n) {
                ended(&mut flight.outcome).await
            } else {
                flight.outcome.borrow().clone()
            };
            match outcome {
                Flight::Running => continue,
                Flight::Done(committable) => {
                    let flight = self.in_flight.remove(&id).expect("listed");
                    self.pending.entry(id).or_default().push(Pending {
                        committable,
                        begun_at: flight.begun_at,
                        warned: false,
                    });
                }
                Flight::Failed => {
                    return Err(CoreError::operator(
                        &self.uid,
                        exactly_core::ErrorClass::Restart,
                        format!("the background pre-commit of checkpoint {id} failed"),
                    ))
                }
            }
        }
        Ok(())
    }

    /// Commits `c` here, retrying retriable failures.
    async fn commit_one(&mut self, id: CheckpointId, c: &S::Committable) -> Result<(), TwoPhaseError> {
        match self.commit_or_start(id, c, false).await? {
            None => Ok(()),
            // Not asked for: the first attempt went through `commit` too.
            Some(rest) => rest.await.map_err(|e| self.commit_failed(id, c, e)),
        }
    }

    /// Commits `c`, retrying retriable failures; with `background`, the first attempt may leave
    /// the commit completing in the background (returned).
    async fn commit_or_start(
        &mut self,
        id: CheckpointId,
        c: &S::Committable,
        background: bool,
    ) -> Result<Option<Committing>, TwoPhaseError> {
        let mut backoff = self.retry.initial_backoff;
        let mut attempt = 1;
        loop {
            let result = if background && attempt == 1 {
                self.sink.start_commit(c).await
            } else {
                self.sink.commit(c).await.map(|()| Committed::Done)
            };
            match result {
                Ok(Committed::Done) => {
                    self.metrics.committed.fetch_add(1, Ordering::Relaxed);
                    return Ok(None);
                }
                Ok(Committed::InBackground(rest)) => return Ok(Some(rest)),
                Err(CommitError::Retriable(e)) if attempt < self.retry.attempts => {
                    self.metrics.commit_retries.fetch_add(1, Ordering::Relaxed);
                    warn!(checkpoint_id = id, attempt, error = %e, "Commit failed; retrying.");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.retry.max_backoff);
                    attempt += 1;
                }
                Err(e) => return Err(self.commit_failed(id, c, e)),
            }
        }
    }

    /// A commit that failed for good (the job restarts and commits from its checkpoint, or the
    /// transaction was lost).
    fn commit_failed(&self, id: CheckpointId, c: &S::Committable, e: CommitError) -> TwoPhaseError {
        self.metrics.commit_failures.fetch_add(1, Ordering::Relaxed);
        if matches!(e, CommitError::Lost { .. }) {
            error!(checkpoint_id = id, committable = ?c, error = %e, "Pre-committed transaction lost.");
        }
        TwoPhaseError::Commit {
            checkpoint_id: id,
            source: e,
        }
    }

    /// Takes the outcomes of background commits: those that ended (all of them with `wait`).
    /// A retriable failure is retried here; a failure for good fails the task, the committable
    /// back in `pending` (a later completion or the restart commits it, or finds it lost).
    async fn reap_commits(&mut self, wait: bool) -> Result<(), TwoPhaseError> {
        let ids: Vec<CheckpointId> = self.committing.keys().copied().collect();
        for id in ids {
            let list = self.committing.remove(&id).unwrap_or_default();
            let mut running = Vec::new();
            let mut failed = None;
            for c in list {
                if failed.is_some() || (!wait && !c.done.is_finished()) {
                    running.push(c);
                    continue;
                }
                let outcome = match c.done.await {
                    Ok(outcome) => outcome,
                    Err(e) => Err(CommitError::Retriable(
                        format!("the background commit ended: {e}").into(),
                    )),
                };
                let result = match outcome {
                    Ok(()) => Ok(()),
                    Err(CommitError::Retriable(e)) => {
                        self.metrics.commit_retries.fetch_add(1, Ordering::Relaxed);
                        warn!(checkpoint_id = id, error = %e, "Commit failed in the background; retrying.");
                        tokio::time::sleep(self.retry.initial_backoff).await;
                        self.commit_one(id, &c.pending.committable).await
                    }
                    Err(e) => Err(self.commit_failed(id, &c.pending.committable, e)),
                };
                if let Err(e) = result {
                    self.pending.entry(id).or_default().push(c.pending);
                    failed = Some(e);
                }
            }
            if !running.is_empty() {
                self.committing.insert(id, running);
            }
            if let Some(e) = failed {
                self.update_pending_metrics();
                return Err(e);
            }
        }
        self.update_pending_metrics();
        Ok(())
    }

    async fn commit_up_to(&mut self, id: CheckpointId) -> Result<(), TwoPhaseError> {
        let mut committed_any = false;
        while let Some((&first, _)) = self.pending.first_key_value() {
            if first > id {
                break;
            }
            let batch = self.pending.remove(&first).unwrap_or_default();
            tracing::debug!(
                checkpoint_id = first,
                completed = id,
                committables = batch.len(),
                "Committing."
            );
            let mut inline = false;
            let mut rest = batch.into_iter();
            while let Some(p) = rest.next() {
                if committed_any {
                    failpoint::hit_in(&self.uid, "sink.between_commits");
                }
                failpoint::hit_in(&self.uid, "sink.before_commit");
                let started = Instant::now();
                let result = self.commit_or_start(first, &p.committable, true).await;
                match result {
                    Ok(None) => {
                        tracing::debug!(
                            checkpoint_id = first,
                            commit_ms = started.elapsed().as_millis() as u64,
                            "Committed (the records after the completion waited for it)."
                        );
                        inline = true;
                    }
                    Ok(Some(committing)) => {
                        let done =
                            tokio::spawn(in_background(self.uid.clone(), first, committing, self.metrics.clone()));
                        self.committing
                            .entry(first)
                            .or_default()
                            .push(InCommit { pending: p, done });
                    }
                    Err(e) => {
                        // Keep what is not committed: a later completion or the restart retries it.
                        let mut kept = vec![p];
                        kept.extend(rest);
                        self.pending.insert(first, kept);
                        return Err(e);
                    }
                }
                committed_any = true;
            }
            if inline {
                failpoint::hit_in(&self.uid, "sink.after_commit");
            }
        }
        Ok(())
    }

    /// Refuses to carry a transaction of an earlier, failed checkpoint into checkpoint `id` when
    /// it could time out before that checkpoint completes and is committed (within the
    /// checkpoint timeout, a restart delay and [`RESTART_ALLOWANCE`]): the external system would
    /// abort a transaction the completed checkpoint needs — lost records. Failing the attempt
    /// instead restarts the job from the latest completed checkpoint, which does not hold the
    /// carried transactions: they are aborted and their records read again. Nothing lost, nothing
    /// twice.
    fn check_carried(&self, id: CheckpointId) -> exactly_core::Result<()> {
        let (Some(timeout), Some(window)) = (
            self.sink.transaction_timeout(),
            self.info.as_ref().and_then(|i| i.commit_window),
        ) else {
            return Ok(());
        };
        for (carried, list) in self.pending.range(..id) {
            for p in list {
                let age = p.begun_at.elapsed();
                if age + window + RESTART_ALLOWANCE >= timeout {
                    return Err(CoreError::operator(
                        "two-phase sink",
                        exactly_core::ErrorClass::Restart,
                        format!(
                            "the transaction pre-committed for failed checkpoint {carried} is {}s old: carried into checkpoint {id}, it could reach its {}s timeout before being committed (checkpoint timeout + restart delay + {}s); restarting from the latest completed checkpoint instead (its records are read again, nothing is lost)",
                            age.as_secs(),
                            timeout.as_secs(),
                            RESTART_ALLOWANCE.as_secs()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    fn warn_near_timeout(&mut self) {
        self.update_pending_metrics();
        let Some(timeout) = self.sink.transaction_timeout() else {
            return;
        };
        for (id, list) in &mut self.pending {
            for p in list.iter_mut() {
                let age = p.begun_at.elapsed();
                if !p.warned && age * 5 >= timeout * 4 {
                    p.warned = true;
                    warn!(
                        checkpoint_id = *id,
                        age_ms = age.as_millis() as u64,
                        timeout_ms = timeout.as_millis() as u64,
                        "A pre-committed transaction is close to its timeout and still waits for its checkpoint to complete; if the external system aborts it, its records are lost."
                    );
                }
            }
        }
    }
}

/// Runs a commit completing in the background (spawned: it goes on while the records flow).
async fn in_background(
    uid: String,
    id: CheckpointId,
    committing: Committing,
    metrics: Arc<TwoPhaseMetrics>,
) -> Result<(), CommitError> {
    failpoint::hit_in(&uid, "sink.in_background_commit");
    let started = Instant::now();
    let result = committing.await;
    tracing::debug!(
        checkpoint_id = id,
        commit_ms = started.elapsed().as_millis() as u64,
        ok = result.is_ok(),
        "Background commit ended."
    );
    if result.is_ok() {
        metrics.committed.fetch_add(1, Ordering::Relaxed);
        failpoint::hit_in(&uid, "sink.after_commit");
    }
    result
}

/// How a background pre-commit ended (waiting until it has); `Failed` when its part was dropped.
async fn ended<C: Clone>(outcome: &mut watch::Receiver<Flight<C>>) -> Flight<C> {
    outcome
        .wait_for(|f| !matches!(f, Flight::Running))
        .await
        .map(|f| f.clone())
        .unwrap_or(Flight::Failed)
}

/// The deferred part of a checkpoint's snapshot when a pre-commit completes in the background
/// (or an earlier one still does): waits for this checkpoint's pre-commit and every earlier one,
/// then gives the union state naming them all.
async fn finish_pre_commit<C: serde::Serialize + Clone + Send + Sync + 'static>(
    uid: String,
    id: CheckpointId,
    origin: u32,
    mut entries: Vec<Vec<u8>>,
    mine: Option<(PreCommitting<C>, watch::Sender<Flight<C>>)>,
    earlier: Vec<(CheckpointId, watch::Receiver<Flight<C>>)>,
) -> exactly_core::Result<DeferredState> {
    let mut prepared = None;
    if let Some((rest, outcome)) = mine {
        failpoint::hit_in(&uid, "sink.in_background_pre_commit");
        let started = Instant::now();
        let result = rest.await;
        tracing::debug!(
            checkpoint_id = id,
            background_ms = started.elapsed().as_millis() as u64,
            "Background pre-commit ended."
        );
        match result {
            Ok(c) => {
                outcome.send_replace(Flight::Done(c.clone()));
                prepared = Some(c);
            }
            Err(e) => {
                outcome.send_replace(Flight::Failed);
                return Err(e);
            }
        }
    }
    for (earlier_id, mut outcome) in earlier {
        match ended(&mut outcome).await {
            Flight::Done(c) => entries.push(encode(earlier_id, origin, &c)?),
            _ => {
                return Err(CoreError::operator(
                    &uid,
                    exactly_core::ErrorClass::Restart,
                    format!("the background pre-commit of checkpoint {earlier_id} failed"),
                ))
            }
        }
    }
    if let Some(c) = &prepared {
        entries.push(encode(id, origin, c)?);
    }
    let mut state = DeferredState::default();
    state.put_union_state(STATE, entries);
    if prepared.is_some() {
        failpoint::hit_in(&uid, "sink.after_pre_commit");
    }
    Ok(state)
}

/// One entry of the union state: (format version, checkpoint, subtask that pre-committed it,
/// committable).
fn encode<C: serde::Serialize>(id: CheckpointId, origin: u32, c: &C) -> Result<Vec<u8>, CoreError> {
    serde_json::to_vec(&(1u32, id, origin, c))
        .map_err(|e| CoreError::operator("two-phase sink", exactly_core::ErrorClass::Fatal, e))
}

fn decode<C: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<(CheckpointId, u32, C), TwoPhaseError> {
    let (version, id, origin, c): (u32, CheckpointId, u32, C) =
        serde_json::from_slice(bytes).map_err(|e| TwoPhaseError::Decode(e.to_string()))?;
    if version != 1 {
        return Err(TwoPhaseError::Decode(format!("unknown committable version {version}")));
    }
    Ok((id, origin, c))
}

#[cfg(test)]
mod tests;
