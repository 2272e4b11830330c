//! The exactly-once sink as the two-phase driver drives it: pre-commit, commit, recovery and
//! the sink's record of its commits.

use super::*;

impl TwoPhaseCommitSink<ProducerRecord> for TransactionalKafkaSink {
    type Transaction = KafkaTransaction;
    type Committable = KafkaCommittable;

    async fn open(&mut self, info: &SubtaskInfo) -> exactly_core::Result<()> {
        // The metadata request waits for the cluster (a broker restarting); the version check
        // then finds it up.
        let facts = broker_facts(&self.config, info.starting).await?;
        self.wire.check_versions().await?;
        if let Some(max) = facts.max_transaction_timeout {
            if self.transaction_timeout > max {
                return Err(SinkError::Config(format!(
                    "delivery.transaction_timeout ({}) exceeds the broker's transaction.max.timeout.ms ({}): lower it, or raise the broker setting",
                    humantime::format_duration(self.transaction_timeout),
                    humantime::format_duration(max)
                ))
                .into());
            }
        }
        self.partitions = facts.partitions;
        self.brokers = facts.brokers;
        self.partitioner.open(info.index, info.parallelism);
        let n = self.partitions.len();
        self.hold_limit = queue_cap(
            &self.config.client,
            queue_partitions(self.partitioner.partitions_written(n), n, info.parallelism),
        );
        self.progress = progress::group(&self.prefix, info.index);
        self.info = Some(info.clone());
        Ok(())
    }

    async fn begin(&mut self, _checkpoint_id: CheckpointId) -> exactly_core::Result<KafkaTransaction> {
        self.settle_commits(false).await;
        let n = self.slots.len();
        let slot = (0..n)
            .map(|i| (self.next_slot + i) % n)
            .find(|i| self.slots[*i].state == SlotState::Free)
            .ok_or_else(|| SinkError::Protocol("no free transactional producer (all pending or broken)".into()))?;
        self.next_slot = (slot + 1) % n;
        if self
            .draining
            .as_ref()
            .is_some_and(|d| Arc::ptr_eq(d, &self.slots[slot].producer))
        {
            // Free again means committed, which its flush preceded.
            self.draining = None;
        }
        let s = &mut self.slots[slot];
        s.deliveries.reset();
        s.producer
            .begin_transaction()
            .map_err(|e| SinkError::kafka(format!("begin_transaction on {}", s.id), e))?;
        s.state = SlotState::Open;
        Ok(KafkaTransaction {
            slot,
            records: 0,
            queue_full: Duration::ZERO,
            longest_queue_full: Duration::ZERO,
        })
    }

    async fn write(&mut self, txn: &mut KafkaTransaction, records: Vec<ProducerRecord>) -> exactly_core::Result<()> {
        txn.records += records.len() as u64;
        Ok(self.send(txn, records).await?)
    }

    async fn pre_commit(
        &mut self,
        txn: KafkaTransaction,
        checkpoint_id: CheckpointId,
    ) -> exactly_core::Result<PreCommitted<KafkaCommittable, KafkaTransaction>> {
        if txn.records == 0 {
            let s = &mut self.slots[txn.slot];
            tokio::task::block_in_place(|| s.producer.abort_transaction(TIMEOUT))
                .map_err(|e| SinkError::kafka("aborting an empty transaction", e))?;
            s.state = SlotState::Free;
            return Ok(PreCommitted::Empty);
        }
        // The previous transaction's producer drains first (one drains at a time), and the
        // records held for it are this transaction's: they go out before its flush.
        let mut txn = txn;
        self.drained(true)?;
        if !self.held.is_empty() {
            self.send(&mut txn, Vec::new()).await?;
        }
        // A failed delivery (e.g. fenced by a newer instance) fails now, not after a decline.
        check_deliveries(&self.slots[txn.slot].deliveries, &self.config.topic)?;
        if self.free_slots() == 0 {
            // A commit still completing frees its producer within a round trip.
            self.settle_commits(true).await;
        }
        if self.free_slots() == 0 {
            // Every producer holds a transaction waiting for a checkpoint. When those belong to
            // checkpoints that were aborted (the checkpoint storage unreachable, say), only a
            // completed checkpoint frees them, and this one cannot complete without a producer
            // for what follows: grow the pool (up to `max_pool_size`) rather than decline — a
            // decline fails this attempt, and a restart cannot succeed while the storage is gone.
            // Beyond that, decline: the subtask restarts from the latest completed checkpoint.
            if self.slots.len() < self.max_pool_size {
                self.add_slot()?;
            } else {
                return Ok(PreCommitted::Declined {
                    reason: format!(
                        "all {} transactional producers of this subtask wait for their checkpoints to complete",
                        self.slots.len()
                    ),
                    txn,
                });
            }
        }
        // The flush and then the check with the transaction coordinator (DescribeTransactions)
        // complete in the background; the checkpoint is acknowledged only when both are done
        // (prepared means durable: every record acknowledged by the broker, the transaction
        // Ongoing under this producer's id and epoch). The records after the barrier are held
        // meanwhile (see `draining`): sent at once from the next pooled producer they could land
        // before this transaction's last batches (a flush in the background without the hold
        // broke the order per key: `kafka_sink_transactions` shows it).
        tracing::debug!(
            checkpoint_id,
            records = txn.records,
            queue_full_ms = txn.queue_full.as_millis() as u64,
            longest_queue_full_ms = txn.longest_queue_full.as_millis() as u64,
            "Pre-committing a transaction."
        );
        let s = &mut self.slots[txn.slot];
        s.state = SlotState::Prepared(checkpoint_id);
        self.draining = Some(s.producer.clone());
        let (producer, deliveries) = (s.producer.clone(), s.deliveries.clone());
        let (topic, timeout) = (self.config.topic.clone(), self.config.flush_timeout);
        // On the blocking pool at once, not when the checkpoint's deferred part is first polled.
        let flushed = tokio::task::spawn_blocking(move || {
            flush_blocking(&producer, &deliveries, &topic, timeout)?;
            Ok::<_, SinkError>(deliveries.probe().map(|(partition, offset)| Probe {
                topic,
                partition,
                offset,
            }))
        });
        let (wire, id) = (self.wire.clone(), s.id.clone());
        let (group, topic) = (self.progress.clone(), self.config.topic.clone());
        let previous = self.recorded.take();
        let (recorded, next) = tokio::sync::oneshot::channel::<()>();
        self.recorded = Some(next);
        Ok(PreCommitted::InBackground(PreCommitting::new(async move {
            let probe = flushed
                .await
                .map_err(|e| SinkError::Protocol(format!("flushing {id}: {e}")))??;
            let desc = wire.describe_open(&id).await?;
            // Ongoing under this producer, or nothing is written into it.
            let prepared = committable(id.clone(), desc.clone(), checkpoint_id, probe)?;
            // The checkpoint's id goes into the transaction too: committed with its records, it
            // is the sink's record of what it committed (see `progress`). Of two committed
            // records the broker keeps the one written last: after the previous pre-commit's.
            if let Some(previous) = previous {
                let _ = previous.await;
            }
            let written = wire
                .commit_offset_in_transaction(&TxnOffset {
                    transactional_id: &id,
                    producer_id: desc.producer_id,
                    producer_epoch: desc.producer_epoch,
                    group: &group,
                    topic: &topic,
                    partition: 0,
                    offset: i64::try_from(checkpoint_id)
                        .map_err(|_| SinkError::Protocol(format!("checkpoint id {checkpoint_id} out of range")))?,
                })
                .await;
            drop(recorded);
            written?;
            Ok(prepared)
        })))
    }

    async fn commit(&mut self, c: &KafkaCommittable) -> Result<(), CommitError> {
        // A background commit that failed retriably left its slot prepared again: take that first.
        self.settle_commits(false).await;
        let Some(i) = self.own_slot(c) else {
            // Pre-committed by an earlier run: finish it through the protocol.
            return commit_recovered_in_process(&self.wire, c, self.accept_unknown_outcome_up_to).await;
        };
        let s = &mut self.slots[i];
        if s.commit_failed == Some(c.checkpoint_id) {
            // librdkafka already failed to commit it: the coordinator it found may be a node cut
            // off from the others, answering from its old view (its EndTxn never completes there)
            // while the real coordinator aborts the transaction when it times out. Committed
            // through the protocol instead, at the coordinator most bootstrap servers name (the
            // restart's way); the producer is not used again in this run.
            warn!(
                transactional_id = %c.transactional_id,
                checkpoint_id = c.checkpoint_id,
                "The producer failed to commit; committing its transaction through the coordinator most brokers name."
            );
            s.state = SlotState::Broken;
            let result = commit_recovered_in_process(&self.wire, c, self.accept_unknown_outcome_up_to).await;
            match &result {
                Ok(()) => self.renew(i),
                // Still this slot's to commit (the protocol's way) on the driver's next try.
                Err(CommitError::Retriable(_)) => self.slots[i].state = SlotState::Prepared(c.checkpoint_id),
                Err(_) => {}
            }
            return result;
        }
        let (next, result) =
            tokio::task::block_in_place(|| commit_blocking(&s.producer, c.checkpoint_id, c.to_string()));
        if matches!(result, Err(CommitError::Retriable(_))) {
            s.commit_failed = Some(c.checkpoint_id);
        }
        s.state = next;
        if result.is_ok() {
            self.shrink();
        }
        result
    }

    async fn start_commit(&mut self, c: &KafkaCommittable) -> Result<Committed, CommitError> {
        let Some(i) = self.own_slot(c) else {
            return commit_recovered_in_process(&self.wire, c, self.accept_unknown_outcome_up_to)
                .await
                .map(|()| Committed::Done);
        };
        if self.slots[i].commit_failed == Some(c.checkpoint_id) {
            // Not given to librdkafka again (see `commit`).
            return self.commit(c).await.map(|()| Committed::Done);
        }
        // The commit's round trips (EndTxn, the markers written) go on beside the records that
        // follow; the slot is nobody else's until it ends.
        let s = &mut self.slots[i];
        let (tx, rx) = tokio::sync::oneshot::channel();
        s.state = SlotState::Committing(c.checkpoint_id);
        s.committed = Some(rx);
        let (producer, checkpoint_id, what) = (s.producer.clone(), c.checkpoint_id, c.to_string());
        Ok(Committed::InBackground(Committing::new(async move {
            let (next, result) = tokio::task::spawn_blocking(move || commit_blocking(&producer, checkpoint_id, what))
                .await
                .unwrap_or_else(|e| {
                    (
                        SlotState::Prepared(checkpoint_id),
                        Err(CommitError::Retriable(format!("committing: {e}").into())),
                    )
                });
            let _ = tx.send((next, matches!(result, Err(CommitError::Retriable(_)))));
            result
        })))
    }

    async fn abort(&mut self, txn: KafkaTransaction) -> exactly_core::Result<()> {
        // Held records are this transaction's.
        self.held.clear();
        self.held_bytes = 0;
        let s = &mut self.slots[txn.slot];
        tokio::task::block_in_place(|| s.producer.abort_transaction(TIMEOUT))
            .map_err(|e| SinkError::kafka(format!("abort_transaction on {}", s.id), e))?;
        s.state = SlotState::Free;
        Ok(())
    }

    async fn abort_unneeded(&mut self, ctx: &RecoveryContext<'_, KafkaCommittable>) -> exactly_core::Result<()> {
        // An open transaction of ours that no restored committable is would pin the last stable
        // offset of its partitions, and the read_committed check of a restored transaction would
        // wait on it until the broker's timeout aborts it.
        let me = ctx.info.index;
        let parallelism = ctx.info.parallelism;
        for t in self.wire.list(&self.brokers).await? {
            let Some((subtask, _)) = parse(&self.prefix, &t.transactional_id) else {
                continue;
            };
            let mine = subtask == me || (me == 0 && subtask >= parallelism);
            if !mine || t.state != "Ongoing" {
                continue;
            }
            let Some(d) = self.wire.describe_known(&t.transactional_id).await? else {
                continue;
            };
            let needed = ctx.all_restored.iter().any(|(_, c)| {
                c.transactional_id == t.transactional_id
                    && c.is_same_transaction(d.producer_id, d.producer_epoch, d.start_time_ms)
            });
            if !needed {
                ctx.check_still_owner().await?;
                warn!(transactional_id = %t.transactional_id, "Aborting an open transaction no checkpoint needs before recovering.");
                self.fence_and_abort(&t.transactional_id)?;
            }
        }
        Ok(())
    }

    async fn abort_lingering(&mut self, ctx: &RecoveryContext<'_, KafkaCommittable>) -> exactly_core::Result<()> {
        let me = ctx.info.index;
        let parallelism = ctx.info.parallelism;
        // Transactions others are committing right now (restored committables that are still the
        // open transaction of their id) must be left alone.
        let pending: BTreeMap<&str, &KafkaCommittable> = ctx
            .all_restored
            .iter()
            .map(|(_, c)| (c.transactional_id.as_str(), c))
            .collect();
        let listed = self.wire.list(&self.brokers).await?;
        let mut aborted = BTreeSet::new();
        for t in listed {
            let Some((subtask, slot)) = parse(&self.prefix, &t.transactional_id) else {
                continue;
            };
            let mine = subtask == me || (me == 0 && subtask >= parallelism);
            if !mine || (subtask == me && slot < self.pool_size) {
                continue; // not ours, or handled by initialising our pool below
            }
            // Any state: initialising the id also fences a zombie that might still use it.
            if matches!(t.state.as_str(), "Dead" | "PrepareEpochFence") {
                continue;
            }
            if let Some(c) = pending.get(t.transactional_id.as_str()) {
                let d = self.wire.describe_known(&t.transactional_id).await?;
                if d.is_some_and(|d| c.is_same_transaction(d.producer_id, d.producer_epoch, d.start_time_ms)) {
                    continue;
                }
            }
            ctx.check_still_owner().await?;
            if t.state == "Ongoing" {
                warn!(transactional_id = %t.transactional_id, "Aborting a lingering transaction.");
            }
            self.fence_and_abort(&t.transactional_id)?;
            aborted.insert(t.transactional_id);
        }
        // Our own pool: initialising each id fences older producers (zombies) and aborts what
        // they left open. Restored committables of these ids were committed before this. The ids
        // are independent: initialised side by side (each waits for its own round trips, and for
        // the abort of what its predecessor left open).
        let ids: Vec<String> = (0..self.pool_size)
            .map(|slot| transactional_id(&self.prefix, me, slot))
            .collect();
        ctx.check_still_owner().await?;
        let this = &*self;
        let inited: Vec<Result<(Producer_, Arc<Deliveries>)>> = tokio::task::block_in_place(|| {
            std::thread::scope(|scope| {
                let handles: Vec<_> = ids
                    .iter()
                    .map(|id| scope.spawn(move || this.init_producer_blocking(id)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err(SinkError::Protocol("initialising a producer panicked".into())))
                    })
                    .collect()
            })
        });
        let mut slots = Vec::with_capacity(self.pool_size);
        for (id, r) in ids.into_iter().zip(inited) {
            let (producer, deliveries) = r?;
            slots.push(Slot::new(id, producer, deliveries));
        }
        self.slots = slots;
        // Every id of the subtask is fenced now: no offset of an earlier session can land after
        // this one. Asked again first (an earlier attempt may have written it).
        if let Some(restored) = self.start_record.take() {
            self.record(ctx.info)
                .start_record(restored, ctx.check_still_owner())
                .await?;
        }
        info!(
            subtask = me,
            pool = self.pool_size,
            lingering_aborted = aborted.len(),
            "Transactional producers ready."
        );
        Ok(())
    }

    /// Each transaction records its checkpoint in a consumer group's offset (see `progress`).
    fn records_commits(&self) -> bool {
        true
    }

    async fn committed_through(
        &mut self,
        ctx: &RecoveryContext<'_, KafkaCommittable>,
    ) -> exactly_core::Result<Option<CheckpointId>> {
        let record = self.record(ctx.info);
        let (through, empty) = record
            .committed_through(TIMEOUT, ctx.unreadable_newer.is_some())
            .await?;
        match ctx.unreadable_newer {
            // Nothing recorded is no proof that nothing committed.
            Some(unreadable) if !empty.is_empty() => {
                return Err(SinkError::Config(format!(
                    "checkpoint {unreadable} cannot be read, and the sink's record of commits holds nothing in consumer group {}: that subtask may never have committed, or committed under a version that kept no record, or the record expired (offsets.retention.minutes) or was deleted — it cannot show that none of checkpoint {unreadable}'s transactions committed, so checkpoint {} is not restored in its place",
                    empty.join(", "),
                    ctx.restored_checkpoint.unwrap_or(0)
                ))
                .into());
            }
            None if empty.contains(&progress::group(&self.prefix, ctx.info.index)) => {
                self.start_record = Some(ctx.restored_checkpoint.unwrap_or(0));
            }
            _ => {}
        }
        Ok(through)
    }

    async fn forget_commits_after(
        &mut self,
        ctx: &RecoveryContext<'_, KafkaCommittable>,
        id: CheckpointId,
    ) -> exactly_core::Result<()> {
        self.record(ctx.info).forget_after(id, ctx.check_still_owner()).await
    }

    fn transaction_timeout(&self) -> Option<Duration> {
        Some(self.transaction_timeout)
    }
}
