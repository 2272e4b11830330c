//! Region failover within a run: a failed task restarts its region (subtask i of every stage),
//! joined by regions failing meanwhile, as one restart of the restart strategy.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::task::JoinSet;
use tracing::{info, warn};

use super::coordination::Run;
use super::job::RunEnd;
use super::output::Notification;
use super::task::Control;
use crate::error::{CoreError, ErrorClass, Result};
use crate::message::CheckpointId;
use crate::restart::RestartDecision;
use crate::storage::CheckpointStorage;

impl Run<'_> {
    /// After task `task` failed with `error`: restarts its region (region failover), or returns
    /// how the run ends (full restart, or giving up). Regions whose tasks fail while this one
    /// stops or waits for its restart delay (an outage of a shared service fails them all) join
    /// it: they restart together, as one restart of the restart strategy, from one restore.
    pub(super) async fn restart_region(
        &mut self,
        set: &mut JoinSet<(usize, Result<()>)>,
        task: usize,
        error: CoreError,
    ) -> std::result::Result<(), RunEnd> {
        if !self.job.regions
            // A restore past unreadable checkpoints not proved yet: only the whole job restarts
            // (its restore goes back again, and proves again).
            || self.spawner.proof.is_some()
            || error.class() == ErrorClass::Fatal
            || self.shutting_down
            || self.shutdown_after.is_some()
            || !self.waiters.is_empty()
        {
            return Err(RunEnd::Failed(error));
        }
        let region = self.places[task].1;
        let delay = match self.tracker.on_failure(self.started.elapsed()) {
            RestartDecision::GiveUp => {
                return Err(RunEnd::Failed(CoreError::RestartsExhausted {
                    restarts: self.tracker.restarts(),
                    last: Box::new(error),
                }))
            }
            RestartDecision::StartupFailed(attempts) => {
                return Err(RunEnd::Failed(CoreError::StartupFailed {
                    attempts,
                    last: Box::new(error),
                }))
            }
            RestartDecision::Restart(delay) => delay,
        };
        self.job.metrics.restarts.fetch_add(1, Ordering::Relaxed);
        self.region_restarts += 1;
        warn!(
            job = %self.job.config.name,
            region,
            restart = self.tracker.restarts(),
            cause = %error,
            delay_ms = delay.as_millis() as u64,
            "Task failed; restarting its region (subtask {region} of every stage) from the latest completed checkpoint."
        );
        // Checkpoints in flight cannot complete without the region: abort them (not counted as
        // checkpoint failures).
        let declined: Vec<CheckpointId> = match self.coordinator.as_mut() {
            Some(c) => {
                let ids: Vec<CheckpointId> = c.pending().map(|p| p.barrier.id).collect();
                ids.into_iter().filter(|id| c.decline(*id).is_some()).collect()
            }
            None => Vec::new(),
        };
        for id in declined {
            self.broadcast(Control::Notify(Notification::Aborted(id)));
            if let Some(s) = self.storage.clone() {
                let _ = tokio::task::spawn_blocking(move || s.abort(id)).await;
            }
        }
        // Stop the failed regions' other tasks, wait for every one of them to be gone and for the
        // restart delay; a failure elsewhere meanwhile adds its region.
        let mut regions: BTreeSet<u32> = BTreeSet::new();
        let mut members: BTreeSet<usize> = BTreeSet::new();
        let mut gone: BTreeSet<usize> = BTreeSet::from([task]);
        self.add_region(region, &mut regions, &mut members);
        let deadline = tokio::time::sleep(self.job.config.shutdown_timeout);
        tokio::pin!(deadline);
        let waited = tokio::time::sleep(delay);
        tokio::pin!(waited);
        let mut delay_over = false;
        while gone.len() < members.len() || !delay_over {
            let failed: Option<(usize, CoreError)> = tokio::select! {
                joined = set.join_next(), if gone.len() < members.len() || !set.is_empty() => match joined {
                    None => { gone.extend(members.iter().copied()); None }
                    Some(Ok((t, _))) if members.contains(&t) => { gone.insert(t); None }
                    Some(Err(e)) if self.tokio_ids.get(&e.id()).is_some_and(|t| members.contains(t)) => {
                        gone.insert(self.tokio_ids[&e.id()]);
                        None
                    }
                    Some(Ok((t, Err(e)))) => Some((t, e)),
                    Some(Ok((_, Ok(())))) => {
                        return Err(RunEnd::Failed(CoreError::TaskLost { task: "a task".into(), reason: "ended during a region restart".into() }));
                    }
                    Some(Err(e)) => match self.tokio_ids.get(&e.id()).copied() {
                        Some(t) => Some((t, CoreError::TaskLost { task: "a task".into(), reason: e.to_string() })),
                        None => return Err(RunEnd::Failed(CoreError::TaskLost { task: "a task".into(), reason: e.to_string() })),
                    },
                },
                _ = &mut deadline, if gone.len() < members.len() => {
                    return Err(RunEnd::Failed(CoreError::TaskLost { task: format!("regions {regions:?}"), reason: "did not stop in time for their restart".into() }));
                }
                _ = &mut waited, if !delay_over => { delay_over = true; None }
            };
            if let Some((t, e)) = failed {
                if e.class() == ErrorClass::Fatal {
                    return Err(RunEnd::Failed(e));
                }
                let other = self.places[t].1;
                warn!(job = %self.job.config.name, region = other, cause = %e, "Task failed; its region restarts together with the others failing now.");
                self.add_region(other, &mut regions, &mut members);
                gone.insert(t);
            }
        }
        let restore = match self.plan.later_blocking(self.storage.clone()).await {
            Ok(r) => r.map(Arc::new),
            Err(e) => return Err(RunEnd::Failed(e)),
        };
        if let Some(r) = &restore {
            info!(regions = ?regions, checkpoint_id = r.meta.id, "Restoring the regions.");
            self.job.metrics.update(|s| s.restored += 1);
        }
        for region in &regions {
            for p in &self.job.inputs {
                p.prepare_one(self.job.config.channel_capacity, *region);
            }
        }
        // Upstream tasks before downstream ones, as at the start of a run (task ids follow the
        // stages' order).
        for t in members {
            let (vi, index) = self.places[t];
            match self.spawner.spawn(
                set,
                vi,
                index,
                t,
                (self.attempt + self.region_restarts, !self.tracker.has_started()),
                restore.clone(),
            ) {
                Ok((tx, tokio_id)) => {
                    self.controls[t] = tx;
                    self.tokio_ids.insert(tokio_id, t);
                    self.ended.remove(&t);
                }
                Err(e) => return Err(RunEnd::Failed(e)),
            }
        }
        Ok(())
    }

    /// Adds `region` to a restart: its tasks become members and are told to stop.
    pub(super) fn add_region(&self, region: u32, regions: &mut BTreeSet<u32>, members: &mut BTreeSet<usize>) {
        if !regions.insert(region) {
            return;
        }
        for t in (0..self.places.len()).filter(|t| self.places[*t].1 == region) {
            members.insert(t);
            let _ = self.controls[t].send(Control::Shutdown);
        }
    }
}
