//! The driver as the engine drives it: the `Sink` operator's calls (records, barriers,
//! checkpoint completion, restore) and what is left when it is dropped.

use super::*;

impl<T: Send + 'static, S: TwoPhaseCommitSink<T>> Sink<T> for TwoPhaseSink<T, S> {
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> exactly_core::Result<()> {
        self.info = Some(ctx.info.clone());
        self.uid = ctx.info.uid.clone();
        // Restoring an older checkpoint because the newest cannot be read: only a sink that
        // records its commits can show that safe, and nothing is opened (nothing changed in the
        // external system) before every sink has.
        if let Some(unreadable) = ctx.unreadable_newer() {
            if !self.sink.records_commits() {
                return Err(CoreError::operator(
                    &self.uid,
                    ErrorClass::Fatal,
                    format!(
                        "checkpoint {unreadable} cannot be read, and sink '{}' keeps no record of what it committed: it cannot show that none of its transactions after checkpoint {} committed, so that one is not restored",
                        self.uid,
                        ctx.info.restored_checkpoint.unwrap_or(0)
                    ),
                ));
            }
        }
        self.sink.open(ctx.info).await?;
        // Nothing in the external system changes before this run is known to still own its
        // checkpoint location: one that stalled past its claim's lease while it restored (and
        // was taken over) would abort or fence the new owner's transactions. (First, too, so that
        // such a run is told it lost the location rather than that the sink is behind.) Each
        // step below that changes anything checks again: the recovery may take long.
        ctx.check_still_owner().await?;
        // Union state: every subtask sees every committable (so a cleanup can spare the ones
        // others commit); each commits those whose origin maps to it, which with unchanged
        // parallelism are its own.
        let mut all = Vec::new();
        let mut restored = Vec::new();
        for entry in ctx.union_state(STATE) {
            let (id, origin, c) = decode::<S::Committable>(&entry)?;
            if origin % ctx.info.parallelism == ctx.info.index {
                restored.push((id, c.clone()));
            }
            all.push((id, c));
        }
        restored.sort_by_key(|(id, _)| *id);
        if !restored.is_empty() {
            info!(
                subtask = ctx.info.index,
                committables = restored.len(),
                "Committing transactions of the restored checkpoint."
            );
        }
        let info = ctx.info.clone();
        let recovery = RecoveryContext {
            info: &info,
            restored: &restored,
            all_restored: &all,
            is_restored: ctx.is_restored(),
            restored_checkpoint: info.restored_checkpoint,
            unreadable_newer: ctx.unreadable_newer(),
            owner: ctx.checkpoint_storage(),
        };
        // Refused here when behind (the sink committed past the restored checkpoint).
        let forget = self.check_not_behind(&recovery).await?;
        if let Some(unreadable) = ctx.unreadable_newer() {
            if forget.is_some() {
                // Behind, with replay accepted: that is no proof that nothing newer committed.
                return Err(CoreError::operator(
                    &self.uid,
                    ErrorClass::Fatal,
                    format!(
                        "checkpoint {unreadable} cannot be read, and sink '{}' committed after checkpoint {}: restoring that one would write output again",
                        self.uid,
                        ctx.info.restored_checkpoint.unwrap_or(0)
                    ),
                ));
            }
            // Not behind (a record that holds nothing of this subtask: it never committed).
            ctx.prove_nothing_newer_committed();
            ctx.proofs_settled().await?;
        }
        // Open transactions nobody needs go first, so that checking a restored one never waits
        // on them; the restored ones are committed before anything else may touch them (a
        // producer re-initialising an id would abort them).
        ctx.check_still_owner().await?;
        self.sink.abort_unneeded(&recovery).await?;
        if !restored.is_empty() {
            failpoint::hit_in(&self.uid, "sink.before_recovery_commit");
        }
        for (id, c) in &restored {
            self.commit_one(*id, c).await?;
        }
        ctx.check_still_owner().await?;
        self.sink.abort_lingering(&recovery).await?;
        if let Some(base) = forget {
            ctx.check_still_owner().await?;
            self.sink.forget_commits_after(&recovery, base).await?;
        }
        self.current_id = all.iter().map(|(id, _)| id + 1).max().unwrap_or(1);
        Ok(())
    }

    /// When its external system records what it committed ([`TwoPhaseCommitSink::records_commits`]).
    fn can_prove_restores(&self) -> bool {
        self.sink.records_commits()
    }

    async fn write(&mut self, records: Vec<T>) -> exactly_core::Result<()> {
        if self.current.is_none() {
            self.current = Some(self.sink.begin(self.current_id).await?);
            self.current_begun = Instant::now();
        }
        let txn = self.current.as_mut().expect("just opened");
        self.sink.write(txn, records).await
    }

    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> exactly_core::Result<()> {
        let id = ctx.checkpoint_id;
        let mut prepared = false;
        let mut background = None;
        if let Some(txn) = self.current.take() {
            failpoint::hit_in(&self.uid, "sink.before_pre_commit");
            let started = Instant::now();
            let outcome = self.sink.pre_commit(txn, id).await?;
            // What the records after the barrier waited for (a Kafka transaction's flush).
            tracing::debug!(
                checkpoint_id = id,
                pre_commit_ms = started.elapsed().as_millis() as u64,
                "Pre-commit returned."
            );
            match outcome {
                PreCommitted::Committable(c) => {
                    prepared = true;
                    self.pending.entry(id).or_default().push(Pending {
                        committable: c,
                        begun_at: self.current_begun,
                        warned: false,
                    })
                }
                PreCommitted::InBackground(rest) => background = Some(rest),
                PreCommitted::Empty => {}
                PreCommitted::Declined { txn, reason } => {
                    self.current = Some(txn);
                    self.warn_near_timeout();
                    return Err(CoreError::CheckpointAborted { id, reason });
                }
            }
        }
        self.current_id = id + 1;
        self.settle(None).await?;
        self.reap_commits(false).await?;
        self.warn_near_timeout();
        self.check_carried(id)?;
        let origin = self.info.as_ref().map_or(0, |i| i.index);
        // Commits still completing are not confirmed: still this checkpoint's to commit.
        let pending = self.pending.iter().flat_map(|(id, l)| l.iter().map(move |p| (*id, p)));
        let committing = self
            .committing
            .iter()
            .flat_map(|(id, l)| l.iter().map(move |c| (*id, &c.pending)));
        let entries = pending
            .chain(committing)
            .map(|(id, p)| encode(id, origin, &p.committable))
            .collect::<Result<Vec<_>, _>>()?;
        if background.is_none() && self.in_flight.is_empty() {
            ctx.put_union_state(STATE, entries);
            if prepared {
                failpoint::hit_in(&self.uid, "sink.after_pre_commit");
            }
            return Ok(());
        }
        // The checkpoint's state must name every committable up to it, including those of
        // earlier checkpoints still completing: the part waits for them too.
        let earlier: Vec<(CheckpointId, watch::Receiver<Flight<S::Committable>>)> =
            self.in_flight.iter().map(|(id, f)| (*id, f.outcome.clone())).collect();
        let mine = background.map(|rest| {
            let (tx, rx) = watch::channel(Flight::Running);
            self.in_flight.insert(
                id,
                InFlight {
                    outcome: rx,
                    begun_at: self.current_begun,
                },
            );
            (rest, tx)
        });
        ctx.defer(finish_pre_commit(self.uid.clone(), id, origin, entries, mine, earlier));
        Ok(())
    }

    async fn notify_checkpoint_complete(&mut self, id: CheckpointId) -> exactly_core::Result<()> {
        self.settle(Some(id)).await?;
        self.reap_commits(false).await?;
        self.commit_up_to(id).await?;
        self.warn_near_timeout();
        Ok(())
    }

    async fn notify_checkpoint_aborted(&mut self, _id: CheckpointId) -> exactly_core::Result<()> {
        // Pre-committed transactions stay pending: the next completed checkpoint covers them.
        self.reap_commits(false).await?;
        self.warn_near_timeout();
        Ok(())
    }

    async fn close(&mut self) -> exactly_core::Result<()> {
        // The last completed checkpoint's commits end before the job does.
        self.reap_commits(true).await?;
        // Records after the last completed checkpoint: nobody will commit them.
        if let Some(txn) = self.current.take() {
            self.sink.abort(txn).await?;
        }
        Ok(())
    }
}

impl<T, S: TwoPhaseCommitSink<T>> Drop for TwoPhaseSink<T, S> {
    fn drop(&mut self) {
        if self.current.is_some() {
            // The open transaction is abandoned; the next start aborts it as lingering.
            warn!("Two-phase sink dropped with an open transaction; the next start aborts it.");
        }
    }
}
