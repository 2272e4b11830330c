//! The Kafka source as the engine drives it: the `Source` operator's calls.

use super::*;

impl<T: Send + 'static, D: Deserializer<T>> Source<T> for KafkaSource<T, D> {
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> exactly_core::Result<()> {
        Ok(self.init(ctx).await?)
    }

    /// A start at the end as it is now (`latest`, a `latest` reset, a timestamp past the last
    /// record) is checkpointed before the first record is read: a restart before the job's first
    /// checkpoint — a new process included — then restores it instead of resolving `latest`
    /// again, later, which would skip the records the failed run read and never committed.
    fn reads_after_first_checkpoint(&self) -> bool {
        self.start_is_a_moment
    }

    /// As the deserializer weighs its records (the payload bytes, for [`crate::RawBytes`]).
    fn record_size(record: &T) -> usize {
        D::record_size(record)
    }

    async fn poll_next(&mut self, out: &mut Vec<T>) -> exactly_core::Result<SourceStatus> {
        let now = Instant::now();
        if let (Some(at), Some(interval)) = (self.next_discovery, self.config.discovery_interval) {
            if now >= at {
                self.discover().await?;
                self.next_discovery = Some(now + interval);
            }
        }
        let commit_every = match self.config.offset_commit {
            OffsetCommitMode::Periodic { interval } => {
                self.next_periodic_commit.filter(|at| now >= *at).map(|_| interval)
            }
            _ => None,
        };
        // Without checkpoints no snapshot asks: a topic recreated under the job would be read on
        // from the old position (`check_topic_ids`). The attempt fails instead, and the next
        // starts where the start position says (the group's offsets went with the old topic).
        // Before a periodic commit too: positions of a recreated topic must not go to the group
        // as the old one's, so a commit whose check got no answer waits for the next turn's. One
        // check when both are due.
        let mut checked = false;
        if commit_every.is_some() || self.next_id_check.is_some_and(|at| now >= at) {
            checked = self.check_topic_ids(false).await?;
            if self.next_id_check.is_some() {
                self.next_id_check = Some(Instant::now() + start::ID_CHECK_EVERY);
            }
        }
        if let Some(interval) = commit_every {
            // Sent only right after the check it follows (a topic recreated since would be
            // committed as the old one's): while the last commit is on its way, the next turn
            // checks again.
            if checked && !self.commit_on_its_way() {
                let offsets = self.position_map();
                self.commit_to_group(&offsets);
                self.next_periodic_commit = Some(now + interval);
            } else {
                self.next_periodic_commit = Some(now + start::ID_CHECK_EVERY.min(interval));
            }
        }
        if self.positions.is_empty() {
            self.serve_consumer_queue()?;
            if !std::mem::take(&mut self.waited) {
                tokio::time::sleep(IDLE_WAIT).await;
            }
            return Ok(SourceStatus::Idle);
        }
        let status = self.poll_batch(out).await?;
        Ok(if out.is_empty() { SourceStatus::Idle } else { status })
    }

    /// Waits until librdkafka has queued fetched records, at most `IDLE_WAIT` (cancel-safe: a
    /// notification that came while nobody waited is kept for the next wait).
    async fn available(&mut self) {
        match &self.fetch {
            Some(fetch) if !self.positions.is_empty() => {
                let _ = tokio::time::timeout(IDLE_WAIT, fetch.readable()).await;
            }
            _ => tokio::time::sleep(IDLE_WAIT).await,
        }
        self.waited = true;
    }

    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> exactly_core::Result<()> {
        self.check_topic_ids(true).await?;
        ctx.put_union_state(
            STATE,
            self.positions
                .iter()
                .map(|p| OffsetEntry::encode(&p.tp, p.next, self.topic_ids.get(&p.tp.topic).map(String::as_str)))
                .chain(
                    self.unseen
                        .values()
                        .map(|e| OffsetEntry::encode(&e.tp, e.next_offset, e.topic_id.as_deref())),
                )
                .collect(),
        );
        let positions = self.position_map();
        self.pending.insert(ctx.checkpoint_id, positions.clone());
        self.metrics.with_partitions(|parts| {
            for (tp, o) in positions {
                parts.entry(tp).or_default().position = o;
            }
        });
        if let (Some(d), PoisonPolicy::DeadLetter { topic }) =
            (&self.dead_letters, &self.config.on_deserialization_error)
        {
            // Dead letters before this barrier must be durable before the checkpoint is.
            d.flush(topic, TIMEOUT)?;
        }
        Ok(())
    }

    fn watermark(&mut self) -> Option<SourceWatermark> {
        if self.positions.is_empty() {
            // No partition: idle (downstream does not wait for this subtask's watermark).
            return Some(SourceWatermark::Idle);
        }
        let config = self.config.watermarks.as_ref()?;
        let w = combine(config, Instant::now(), self.positions.iter().map(|p| &p.clock));
        if let Some(SourceWatermark::At(w)) = w {
            self.metrics.watermark.store(w.0, Ordering::Relaxed);
        }
        w
    }

    async fn notify_checkpoint_complete(&mut self, id: CheckpointId) -> exactly_core::Result<()> {
        if let Some(offsets) = self.pending.complete(id) {
            if self.config.offset_commit == OffsetCommitMode::OnCheckpoints {
                self.commit_to_group(&offsets);
            }
        }
        Ok(())
    }
}
