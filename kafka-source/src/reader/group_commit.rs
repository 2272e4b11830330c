//! The commit of a completed checkpoint's offsets to the consumer group (for monitoring: the
//! checkpoint holds the offsets).
//!
//! # Design notes
//!
//! Why this part is built as it is, with the measurements and failures that shaped it.
//!
//! The group commit is asynchronous, one on its way at a time (offsets of checkpoints completed
//! meanwhile are merged and sent when its result is served from the consumer's queue, so the
//! group's offsets never go back); it was synchronous on the source's task, and a group coordinator
//! that stopped answering (its node SIGSTOPped on the three-node cluster) held every record and
//! barrier of the subtask for librdkafka's 60 s request timeout: every checkpoint timed out
//! meanwhile. A commit still waiting when the source is dropped (a stop right after the final
//! checkpoint) is sent then, and closing the consumer waits for both. Periodic commits (no
//! checkpointing) are not merged: one is sent only right after the topic-ID check it follows, and
//! while the last is on its way the next turn checks again.

use super::*;

/// The group commit: needs nothing of the records' type (the source's `Drop` sends too).
impl<T, D> KafkaSource<T, D> {
    /// Commits `offsets` to the group, in the background: the commit's round trip to the group
    /// coordinator never holds the records and barriers behind it (a coordinator that stops
    /// answering would hold them for the whole request timeout, a minute: every checkpoint of
    /// the job timed out meanwhile). A commit still on its way defers this one, merged with any
    /// deferred before it, until its result is served (`send_deferred_commit`).
    pub(super) fn commit_to_group(&mut self, offsets: &BTreeMap<TopicPartition, i64>) {
        self.deferred_commit
            .extend(offsets.iter().map(|(tp, o)| (tp.clone(), *o)));
        self.send_deferred_commit();
    }

    /// Whether a commit is on its way (its result not served yet).
    pub(super) fn commit_on_its_way(&self) -> bool {
        self.consumer
            .as_ref()
            .is_some_and(|c| c.context().committing.load(Ordering::Acquire))
    }

    /// Sends the deferred commit, unless one is on its way.
    pub(super) fn send_deferred_commit(&mut self) {
        if !self.commit_on_its_way() {
            self.send_commit();
        }
    }

    /// Sends the deferred commit, if any.
    pub(super) fn send_commit(&mut self) {
        let Some(consumer) = self.consumer.as_ref() else {
            return;
        };
        if self.deferred_commit.is_empty() {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        for (tp, o) in std::mem::take(&mut self.deferred_commit) {
            if tpl
                .add_partition_offset(&tp.topic, tp.partition, Offset::Offset(o))
                .is_err()
            {
                return;
            }
        }
        consumer.context().committing.store(true, Ordering::Release);
        if let Err(code) = crate::fetch::commit_without_waiting(consumer, &tpl) {
            consumer.context().committing.store(false, Ordering::Release);
            let error = rdkafka::error::KafkaError::ConsumerCommit(code);
            self.metrics.commits_failed.fetch_add(1, Ordering::Relaxed);
            warn!(%error, "Committing offsets to the consumer group failed (monitoring only; the checkpoint holds the offsets).");
        }
    }
}

impl<T, D> Drop for KafkaSource<T, D> {
    fn drop(&mut self) {
        // Offsets of a completed checkpoint still waiting for the commit on its way (the job
        // stopping right after its final checkpoint): sent now, after it. The consumer, closed
        // next, waits for both, so a stopped job's group holds its last checkpoint's offsets.
        self.send_commit();
    }
}
