//! The driver's decisions against an in-memory transactional system (a unit test of the state
//! machine; the exactly-once claims are proven against Kafka and MariaDB in integration-tests).

use std::sync::{Arc, Mutex};

use exactly_core::runtime::{InitContext, Sink, SnapshotContext, SubtaskInfo};
use exactly_core::state::RestoredState;
use exactly_core::{CheckpointId, CoreError, ErrorClass, SnapshotKind};

use super::*;
use crate::sink::RecoveryContext;

#[derive(Default)]
struct System {
    next_txn: u64,
    open: Vec<u64>,
    prepared: BTreeMap<u64, Vec<u32>>,
    committed: Vec<(u64, Vec<u32>)>,
    aborted: Vec<u64>,
    log: Vec<String>,
    fail_commits: u32,
    lost: bool,
    decline: bool,
    timeout: Option<Duration>,
    /// Pre-commit in the background: each waits for a permit of `gate`, or fails when `fail_background`.
    background: Option<Arc<tokio::sync::Semaphore>>,
    fail_background: bool,
    /// Commits of this run in the background: each waits for a permit of this gate.
    commit_gate: Option<Arc<tokio::sync::Semaphore>>,
    /// The newest checkpoint the system shows committed (as a progress table would).
    committed_through: Option<CheckpointId>,
}

#[derive(Clone, Default)]
struct Fake(Arc<Mutex<System>>);

impl TwoPhaseCommitSink<u32> for Fake {
    type Transaction = (u64, Vec<u32>);
    type Committable = u64;

    async fn begin(&mut self, id: CheckpointId) -> exactly_core::Result<Self::Transaction> {
        let mut s = self.0.lock().unwrap();
        s.next_txn += 1;
        let t = s.next_txn;
        s.open.push(t);
        s.log.push(format!("begin {t} for {id}"));
        Ok((t, Vec::new()))
    }
    async fn write(&mut self, txn: &mut Self::Transaction, records: Vec<u32>) -> exactly_core::Result<()> {
        txn.1.extend(records);
        Ok(())
    }
    async fn pre_commit(
        &mut self,
        txn: Self::Transaction,
        id: CheckpointId,
    ) -> exactly_core::Result<PreCommitted<u64, Self::Transaction>> {
        let mut s = self.0.lock().unwrap();
        if s.decline {
            return Ok(PreCommitted::Declined {
                txn,
                reason: "pool exhausted".into(),
            });
        }
        s.open.retain(|t| *t != txn.0);
        s.log.push(format!("prepare {} at {id}", txn.0));
        if txn.1.is_empty() {
            return Ok(PreCommitted::Empty);
        }
        if let Some(gate) = s.background.clone() {
            let (fake, fail) = (self.0.clone(), s.fail_background);
            return Ok(PreCommitted::InBackground(PreCommitting::new(async move {
                gate.acquire().await.expect("open").forget();
                if fail {
                    return Err(CoreError::operator("fake", ErrorClass::Restart, "flush failed"));
                }
                let mut s = fake.lock().unwrap();
                s.log.push(format!("prepared {} in the background", txn.0));
                s.prepared.insert(txn.0, txn.1);
                Ok(txn.0)
            })));
        }
        s.prepared.insert(txn.0, txn.1);
        Ok(PreCommitted::Committable(txn.0))
    }
    async fn commit(&mut self, c: &u64) -> Result<(), CommitError> {
        let mut s = self.0.lock().unwrap();
        if s.lost {
            return Err(CommitError::Lost {
                what: format!("txn {c}"),
                source: "aborted on timeout".into(),
            });
        }
        if s.fail_commits > 0 {
            s.fail_commits -= 1;
            return Err(CommitError::Retriable("coordinator moved".into()));
        }
        s.log.push(format!("commit {c}"));
        if let Some(rows) = s.prepared.remove(c) {
            s.committed.push((*c, rows));
        }
        Ok(())
    }
    async fn start_commit(&mut self, c: &u64) -> Result<Committed, CommitError> {
        let gate = self.0.lock().unwrap().commit_gate.clone();
        let Some(gate) = gate else {
            return self.commit(c).await.map(|()| Committed::Done);
        };
        let (mut fake, c) = (self.clone(), *c);
        self.0.lock().unwrap().log.push(format!("committing {c}"));
        Ok(Committed::InBackground(Committing::new(async move {
            gate.acquire().await.expect("open").forget();
            fake.commit(&c).await
        })))
    }
    async fn abort(&mut self, txn: Self::Transaction) -> exactly_core::Result<()> {
        let mut s = self.0.lock().unwrap();
        s.open.retain(|t| *t != txn.0);
        s.aborted.push(txn.0);
        Ok(())
    }
    async fn abort_unneeded(&mut self, ctx: &RecoveryContext<'_, u64>) -> exactly_core::Result<()> {
        self.0
            .lock()
            .unwrap()
            .log
            .push(format!("abort unneeded (restored {:?})", ctx.all_restored));
        Ok(())
    }
    fn transaction_timeout(&self) -> Option<Duration> {
        self.0.lock().unwrap().timeout
    }
    async fn committed_through(
        &mut self,
        _ctx: &RecoveryContext<'_, u64>,
    ) -> exactly_core::Result<Option<CheckpointId>> {
        Ok(self.0.lock().unwrap().committed_through)
    }
    async fn forget_commits_after(
        &mut self,
        _ctx: &RecoveryContext<'_, u64>,
        id: CheckpointId,
    ) -> exactly_core::Result<()> {
        let mut s = self.0.lock().unwrap();
        s.log.push(format!("forget after {id}"));
        s.committed_through = s.committed_through.map(|c| c.min(id)).filter(|c| *c > 0);
        Ok(())
    }
    async fn abort_lingering(&mut self, ctx: &RecoveryContext<'_, u64>) -> exactly_core::Result<()> {
        let mut s = self.0.lock().unwrap();
        s.log.push(format!("abort lingering (restored {:?})", ctx.restored));
        let open = std::mem::take(&mut s.open);
        s.aborted.extend(open);
        Ok(())
    }
}

fn info() -> SubtaskInfo {
    SubtaskInfo::new("sink", 0, 1)
}

fn retry() -> CommitRetry {
    CommitRetry {
        attempts: 3,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(2),
    }
}

async fn open(fake: &Fake, restored: Option<RestoredState>) -> TwoPhaseSink<u32, Fake> {
    let mut d = TwoPhaseSink::with_retry(fake.clone(), retry());
    let info = info();
    let ctx = InitContext::new(&info, restored.as_ref());
    d.initialize_state(&ctx).await.unwrap();
    d
}

async fn barrier(d: &mut TwoPhaseSink<u32, Fake>, id: CheckpointId) -> RestoredState {
    let mut ctx = SnapshotContext::new(id, SnapshotKind::Checkpoint, 0);
    d.snapshot_state(&mut ctx).await.unwrap();
    ctx.into_restored()
}

#[tokio::test]
async fn commits_only_after_completion_and_in_order() {
    let fake = Fake::default();
    let mut d = open(&fake, None).await;
    d.write(vec![1, 2]).await.unwrap();
    barrier(&mut d, 1).await;
    d.write(vec![3]).await.unwrap();
    barrier(&mut d, 2).await;
    assert!(
        fake.0.lock().unwrap().committed.is_empty(),
        "nothing committed before completion"
    );
    // 2 completes (1's notification was missed): both commit, 1 first.
    d.notify_checkpoint_complete(2).await.unwrap();
    let s = fake.0.lock().unwrap();
    assert_eq!(s.committed, vec![(1, vec![1, 2]), (2, vec![3])]);
}

#[tokio::test]
async fn aborted_checkpoint_keeps_its_transaction_for_the_next_one() {
    let fake = Fake::default();
    let mut d = open(&fake, None).await;
    d.write(vec![1]).await.unwrap();
    barrier(&mut d, 1).await;
    d.notify_checkpoint_aborted(1).await.unwrap();
    d.write(vec![2]).await.unwrap();
    let state = barrier(&mut d, 2).await;
    assert_eq!(
        state.union_state[STATE].len(),
        2,
        "checkpoint 2 carries both committables"
    );
    d.notify_checkpoint_complete(2).await.unwrap();
    assert_eq!(fake.0.lock().unwrap().committed.len(), 2);
}

#[tokio::test]
async fn restore_commits_restored_before_cleaning_up() {
    let fake = Fake::default();
    let mut d = open(&fake, None).await;
    d.write(vec![7]).await.unwrap();
    let state = barrier(&mut d, 5).await;
    d.write(vec![8]).await.unwrap(); // open transaction after the barrier: lingering after a crash
    std::mem::forget(d); // crash: no notification, no close
    let _restarted = open(&fake, Some(state)).await;
    let s = fake.0.lock().unwrap();
    assert_eq!(s.committed, vec![(1, vec![7])]);
    let commit = s.log.iter().position(|l| l == "commit 1").unwrap();
    let cleanup = s.log.iter().rposition(|l| l.starts_with("abort lingering")).unwrap();
    let unneeded = s.log.iter().rposition(|l| l.starts_with("abort unneeded")).unwrap();
    assert!(unneeded < commit && commit < cleanup, "{:?}", s.log);
    assert_eq!(s.aborted, vec![2]);
}

#[tokio::test]
async fn retriable_commit_failures_are_retried_then_fail_the_attempt() {
    let fake = Fake::default();
    let mut d = open(&fake, None).await;
    d.write(vec![1]).await.unwrap();
    barrier(&mut d, 1).await;
    fake.0.lock().unwrap().fail_commits = 2;
    d.notify_checkpoint_complete(1).await.unwrap();
    assert_eq!(
        fake.0.lock().unwrap().committed.len(),
        1,
        "succeeded on the third attempt"
    );

    d.write(vec![2]).await.unwrap();
    barrier(&mut d, 2).await;
    fake.0.lock().unwrap().fail_commits = 3;
    let err = d.notify_checkpoint_complete(2).await.unwrap_err();
    // Still failing after the retries: the attempt restarts (an outage only when the cause is
    // one the connector classed so, which this fake's is not).
    assert_eq!(err.class(), ErrorClass::Restart, "{err}");
    // Still pending: a later completion commits it.
    d.notify_checkpoint_complete(2).await.unwrap();
    assert_eq!(fake.0.lock().unwrap().committed.len(), 2);
}

#[tokio::test]
async fn a_lost_transaction_is_a_loud_fatal_error() {
    let fake = Fake::default();
    let mut d = open(&fake, None).await;
    d.write(vec![1]).await.unwrap();
    barrier(&mut d, 3).await;
    fake.0.lock().unwrap().lost = true;
    let err: CoreError = d.notify_checkpoint_complete(3).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::Fatal);
    let text = format!("{err} / {:?}", std::error::Error::source(&err));
    assert!(text.contains("DATA LOST") && text.contains("checkpoint 3"), "{text}");
}

#[tokio::test]
async fn empty_transactions_are_not_committed() {
    let fake = Fake::default();
    let mut d = open(&fake, None).await;
    let state = barrier(&mut d, 1).await;
    assert!(state.union_state[STATE].is_empty());
    d.notify_checkpoint_complete(1).await.unwrap();
    assert!(fake.0.lock().unwrap().log.iter().all(|l| !l.starts_with("commit")));
}

#[tokio::test]
async fn close_aborts_the_open_transaction() {
    let fake = Fake::default();
    let mut d = open(&fake, None).await;
    d.write(vec![1]).await.unwrap();
    d.close().await.unwrap();
    assert_eq!(fake.0.lock().unwrap().aborted, vec![1]);
}

#[tokio::test]
async fn a_declined_pre_commit_keeps_the_transaction_open_into_the_next_checkpoint() {
    let fake = Fake::default();
    let mut d = open(&fake, None).await;
    d.write(vec![1]).await.unwrap();
    fake.0.lock().unwrap().decline = true;
    let mut ctx = SnapshotContext::new(1, SnapshotKind::Checkpoint, 0);
    let err = d.snapshot_state(&mut ctx).await.unwrap_err();
    assert!(matches!(err, CoreError::CheckpointAborted { id: 1, .. }), "{err}");
    fake.0.lock().unwrap().decline = false;
    d.write(vec![2]).await.unwrap();
    barrier(&mut d, 2).await;
    d.notify_checkpoint_complete(2).await.unwrap();
    assert_eq!(
        fake.0.lock().unwrap().committed,
        vec![(1, vec![1, 2])],
        "one transaction spanning both"
    );
}

#[tokio::test]
async fn a_failed_checkpoints_transaction_too_old_to_carry_fails_the_attempt() {
    let fake = Fake::default();
    // Committing within a 200 ms window + the 5 s restart allowance: 5.2 s of a 5.4 s timeout.
    fake.0.lock().unwrap().timeout = Some(Duration::from_millis(5_400));
    let mut d = TwoPhaseSink::with_retry(fake.clone(), retry());
    let mut info = info();
    info.commit_window = Some(Duration::from_millis(200));
    d.initialize_state(&InitContext::new(&info, None)).await.unwrap();
    d.write(vec![1]).await.unwrap();
    barrier(&mut d, 1).await;
    d.notify_checkpoint_aborted(1).await.unwrap();
    // Young enough: carried into checkpoint 2.
    d.write(vec![2]).await.unwrap();
    barrier(&mut d, 2).await;
    d.notify_checkpoint_aborted(2).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Too old now: checkpoint 3 could complete after the system aborted it.
    d.write(vec![3]).await.unwrap();
    let mut ctx = SnapshotContext::new(3, SnapshotKind::Checkpoint, 0);
    let err = d.snapshot_state(&mut ctx).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::Restart, "{err}");
    assert!(err.to_string().contains("failed checkpoint 1"), "{err}");
    assert!(fake.0.lock().unwrap().committed.is_empty(), "nothing committed");
}

/// Runs a snapshot's deferred parts on their own, as the runtime does.
fn finish(mut ctx: SnapshotContext) -> tokio::task::JoinHandle<exactly_core::Result<RestoredState>> {
    tokio::spawn(async move {
        ctx.finish_deferred().await?;
        Ok(ctx.into_restored())
    })
}

fn background(fake: &Fake) -> Arc<tokio::sync::Semaphore> {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    fake.0.lock().unwrap().background = Some(gate.clone());
    gate
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_pre_commit_lets_records_flow_and_each_checkpoint_names_all_before_it() {
    let fake = Fake::default();
    let gate = background(&fake);
    let mut d = open(&fake, None).await;
    d.write(vec![1, 2]).await.unwrap();
    let mut ctx1 = SnapshotContext::new(1, SnapshotKind::Checkpoint, 0);
    d.snapshot_state(&mut ctx1).await.unwrap();
    // Checkpoint 1 is still preparing: the records after its barrier go into the next transaction.
    d.write(vec![3]).await.unwrap();
    let mut ctx2 = SnapshotContext::new(2, SnapshotKind::Checkpoint, 0);
    d.snapshot_state(&mut ctx2).await.unwrap();
    // Nothing has prepared yet; an empty checkpoint 3 must still wait for (and name) both.
    let mut ctx3 = SnapshotContext::new(3, SnapshotKind::Checkpoint, 0);
    d.snapshot_state(&mut ctx3).await.unwrap();
    {
        let s = fake.0.lock().unwrap();
        assert!(s.prepared.is_empty(), "{:?}", s.log);
        assert_eq!(
            s.log.iter().filter(|l| l.starts_with("begin")).count(),
            2,
            "{:?}",
            s.log
        );
    }
    let (p3, p2, p1) = (finish(ctx3), finish(ctx2), finish(ctx1));
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!p1.is_finished() && !p2.is_finished() && !p3.is_finished());
    gate.add_permits(2);
    let (s1, s2, s3) = (
        p1.await.unwrap().unwrap(),
        p2.await.unwrap().unwrap(),
        p3.await.unwrap().unwrap(),
    );
    assert_eq!(s1.union_state[STATE].len(), 1, "checkpoint 1 names its own");
    assert_eq!(s2.union_state[STATE].len(), 2, "checkpoint 2 names 1's and its own");
    assert_eq!(s3.union_state[STATE].len(), 2, "the empty checkpoint 3 names both");
    assert!(
        fake.0.lock().unwrap().committed.is_empty(),
        "nothing committed before completion"
    );
    d.notify_checkpoint_complete(3).await.unwrap();
    assert_eq!(fake.0.lock().unwrap().committed, vec![(1, vec![1, 2]), (2, vec![3])]);

    // A restart from checkpoint 2's state commits both (they are named there).
    let fresh = Fake::default();
    {
        let mut s = fresh.0.lock().unwrap();
        s.prepared.insert(1, vec![1, 2]);
        s.prepared.insert(2, vec![3]);
    }
    let _restarted = open(&fresh, Some(s2)).await;
    assert_eq!(fresh.0.lock().unwrap().committed, vec![(1, vec![1, 2]), (2, vec![3])]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_background_pre_commit_fails_its_checkpoint_and_the_next() {
    let fake = Fake::default();
    let gate = background(&fake);
    fake.0.lock().unwrap().fail_background = true;
    let mut d = open(&fake, None).await;
    d.write(vec![1]).await.unwrap();
    let mut ctx1 = SnapshotContext::new(1, SnapshotKind::Checkpoint, 0);
    d.snapshot_state(&mut ctx1).await.unwrap();
    let mut ctx2 = SnapshotContext::new(2, SnapshotKind::Checkpoint, 0);
    d.snapshot_state(&mut ctx2).await.unwrap();
    gate.add_permits(1);
    let err = finish(ctx1).await.unwrap().unwrap_err();
    assert!(
        err.to_string().contains("flush failed") || format!("{err:?}").contains("flush failed"),
        "{err:?}"
    );
    let err = finish(ctx2).await.unwrap().unwrap_err();
    assert!(
        err.to_string().contains("checkpoint 1") || format!("{err:?}").contains("checkpoint 1"),
        "{err:?}"
    );
    assert_eq!(err.class(), ErrorClass::Restart);
    assert!(
        d.notify_checkpoint_complete(1).await.is_err(),
        "nothing to commit for a failed pre-commit"
    );
    assert!(fake.0.lock().unwrap().committed.is_empty());
}

fn background_commits(fake: &Fake) -> Arc<tokio::sync::Semaphore> {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    fake.0.lock().unwrap().commit_gate = Some(gate.clone());
    gate
}

/// Waits until every background commit of `d` has ended (not yet taken by the driver).
async fn commits_ended(d: &TwoPhaseSink<u32, Fake>) {
    while d.committing.values().flatten().any(|c| !c.done.is_finished()) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn named(state: &RestoredState) -> Vec<CheckpointId> {
    let mut ids: Vec<CheckpointId> = state.union_state[STATE]
        .iter()
        .map(|e| decode::<u64>(e).unwrap().0)
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_commit_lets_records_flow_and_stays_in_checkpoints_until_confirmed() {
    let fake = Fake::default();
    let gate = background_commits(&fake);
    let mut d = open(&fake, None).await;
    d.write(vec![1]).await.unwrap();
    barrier(&mut d, 1).await;
    // The completion starts the commit and returns: the records that follow do not wait for it.
    d.notify_checkpoint_complete(1).await.unwrap();
    d.write(vec![2]).await.unwrap();
    assert!(fake.0.lock().unwrap().committed.is_empty());
    // Not confirmed yet: checkpoint 2 still names it (a restart from 2 commits it again).
    let s2 = barrier(&mut d, 2).await;
    assert_eq!(named(&s2), vec![1, 2]);
    assert_eq!(d.metrics().pending(), 2);
    gate.add_permits(1);
    commits_ended(&d).await;
    assert_eq!(fake.0.lock().unwrap().committed, vec![(1, vec![1])]);
    assert_eq!(d.metrics().committed(), 1);
    d.write(vec![3]).await.unwrap();
    // Confirmed: checkpoint 3 names only what is not committed.
    let s3 = barrier(&mut d, 3).await;
    assert_eq!(named(&s3), vec![2, 3]);
    d.notify_checkpoint_complete(3).await.unwrap();
    assert_eq!(
        fake.0.lock().unwrap().committed.len(),
        1,
        "2 and 3 commit in the background"
    );
    // Closing waits for the last completed checkpoint's commits.
    let closing = tokio::spawn(async move {
        d.close().await.unwrap();
        d
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!closing.is_finished(), "close returned before its commits ended");
    gate.add_permits(2);
    let d = closing.await.unwrap();
    // 2 and 3 committed side by side: in either order.
    let mut all = fake.0.lock().unwrap().committed.clone();
    all.sort();
    assert_eq!(all, vec![(1, vec![1]), (2, vec![2]), (3, vec![3])]);
    assert_eq!((d.metrics().committed(), d.metrics().pending()), (3, 0));

    // A restart from checkpoint 2's state finds 1 committed already (idempotent) and commits 2.
    let fresh = Fake::default();
    fresh.0.lock().unwrap().prepared.insert(2, vec![2]);
    let _restarted = open(&fresh, Some(s2)).await;
    assert_eq!(fresh.0.lock().unwrap().committed, vec![(2, vec![2])]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_commit_that_fails_is_retried_here_or_fails_the_task_loudly() {
    let fake = Fake::default();
    let gate = background_commits(&fake);
    let mut d = open(&fake, None).await;
    d.write(vec![1]).await.unwrap();
    barrier(&mut d, 1).await;
    fake.0.lock().unwrap().fail_commits = 1;
    d.notify_checkpoint_complete(1).await.unwrap();
    gate.add_permits(1);
    // The retriable failure is taken at the next barrier and retried there (through `commit`).
    commits_ended(&d).await;
    assert!(fake.0.lock().unwrap().committed.is_empty());
    d.write(vec![2]).await.unwrap();
    let s2 = barrier(&mut d, 2).await;
    assert_eq!(fake.0.lock().unwrap().committed, vec![(1, vec![1])]);
    assert_eq!(named(&s2), vec![2]);
    assert_eq!((d.metrics().commit_retries(), d.metrics().committed()), (1, 1));

    // Lost in the background: the next barrier fails the task, loudly, and keeps the committable.
    fake.0.lock().unwrap().lost = true;
    d.notify_checkpoint_complete(2).await.unwrap();
    gate.add_permits(1);
    commits_ended(&d).await;
    let mut ctx = SnapshotContext::new(3, SnapshotKind::Checkpoint, 0);
    let err = d.snapshot_state(&mut ctx).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::Fatal);
    let text = format!("{err} / {:?}", std::error::Error::source(&err));
    assert!(text.contains("DATA LOST") && text.contains("checkpoint 2"), "{text}");
    assert_eq!(d.metrics().commit_failures(), 1);
    assert_eq!(
        d.pending.get(&2).map(Vec::len),
        Some(1),
        "kept for the restart to find lost"
    );
}

/// A restore behind what the system shows committed (a stale listing, a checkpoint directory
/// pointed somewhere new, removed and started afresh) is refused before anything is touched; with
/// replay accepted it goes ahead, and the system forgets the newer commits once its lingering
/// transactions are gone.
#[tokio::test]
async fn a_restore_behind_what_the_sink_committed_is_refused_unless_replay_is_accepted() {
    let start = |restored: Option<CheckpointId>, accept_replay: bool, fake: &Fake| {
        let mut info = info();
        info.restored_checkpoint = restored;
        info.accept_replay = accept_replay;
        let mut d = TwoPhaseSink::with_retry(fake.clone(), retry());
        async move { d.initialize_state(&InitContext::new(&info, None)).await.map(|()| d) }
    };
    let fake = Fake::default();
    fake.0.lock().unwrap().committed_through = Some(7);
    for restored in [None, Some(3)] {
        let err = start(restored, false, &fake).await.err().expect("refused");
        assert_eq!(err.class(), ErrorClass::Fatal);
        let text = err.to_string();
        assert!(
            text.contains("shows checkpoint 7 committed") && text.contains("--accept-replay"),
            "{text}"
        );
        assert!(
            fake.0.lock().unwrap().log.is_empty(),
            "nothing touched: {:?}",
            fake.0.lock().unwrap().log
        );
    }
    start(Some(7), false, &fake)
        .await
        .expect("the newest committed one itself");
    start(Some(9), false, &fake).await.expect("a newer one");
    fake.0.lock().unwrap().log.clear();
    start(Some(3), true, &fake).await.expect("replay accepted");
    let log = fake.0.lock().unwrap().log.clone();
    let lingering = log
        .iter()
        .position(|l| l.starts_with("abort lingering"))
        .expect("{log:?}");
    let forget = log.iter().position(|l| l == "forget after 3").expect("forgotten");
    assert!(lingering < forget, "{log:?}");
    assert_eq!(fake.0.lock().unwrap().committed_through, Some(3));
}
