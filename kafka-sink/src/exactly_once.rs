//! The exactly-once sink: a pool of transactional producers driven by the two-phase driver
//! (pre-commit at the barrier, commit when the checkpoint completes, recovery of what a
//! restored checkpoint left to commit, clean-up of lingering transactions).
//!
//! # Design notes
//!
//! Why this part is built as it is, with the measurements and failures that shaped it.
//!
//! `exactly_once.rs` (its `TwoPhaseCommitSink` calls in `exactly_once/two_phase.rs`): `TransactionalKafkaSink` keeps a
//! pool of transactional producers (`{prefix}-{subtask}-{slot}`; each request given up after a
//! quarter of the transaction timeout, at most 10 s, just past the brokers' 9 s session —
//! `pool::request_timeout`, librdkafka's `socket.timeout.ms` unless the job sets it, and the
//! sink's protocol client's per-request timeout — not librdkafka's transactional default of the
//! transaction timeout less 100 ms, with which an EndTxn sent to a coordinator whose node stalled
//! was given up only after the new coordinator had aborted the transaction; nor the Java client's
//! 30 s, with which each producer paid two or three timeouts in a row to find the moved
//! coordinator, since librdkafka asks the silent node too, and no checkpoint completed for over
//! a minute); at pre-commit it flushes and reads
//! producer id, epoch and transaction start time from the broker (`protocol.rs`: DescribeTransactions).
//! At start (after the lingering-transaction clean-up) the pool's ids are initialised side by side,
//! each on a thread of its own (`init_transactions` blocks for its round trips and for the abort of
//! what a predecessor left open). When every producer waits (checkpoints keep failing: each failed
//! checkpoint's transaction waits for the next completed one) it grows the pool up to
//! `max_pool_size` (32; Flink's KafkaSink grows without a bound), then declines, which fails the
//! attempt; once commits free them, the producers beyond `pool_size` are closed again. A decline at
//! twice the pool size used to restart the job during a checkpoint-storage outage, when the restart
//! itself cannot list the storage: `object_store_outage` failed once that way in a full run. Producers
//! default to a queue of 200 messages per partition of the output — the job's, each subtask's
//! producer its share where every subtask writes every partition (`pool::queue_partitions`) — at
//! least 20 000 and at most 500 000 (every checkpoint flushes it; at-least-once's pipeline waits for that; with checkpoints a
//! second or more apart a larger one, set in the sink's `client`, waits less for room). librdkafka
//! batches per partition out of the queue and the broker pays per batch: a fixed 20 000 left
//! 600 partitions batches of ~30 records and cost the broker twice the CPU per record
//! (docs/benchmarks.md, "As the partitions grow");
//! delivery callbacks run per record on librdkafka's thread and take no lock.
//!
//! The records after the barrier wait for the previous transaction's flush in memory, not on the
//! record path: sent at once from the next pooled producer they could land before the previous
//! transaction's last batches, and read_committed readers see a partition in log order. A flush in
//! the background without a hold did that: a full run's `kafka_broker_restart` failed with "k0: 2
//! after 5", and `kafka_sink_transactions`' order test (a slow first flush, a second transaction
//! written at once) reproduces it ("log order broken 3 times"). So `pre_commit` marks the slot
//! `Prepared(checkpoint)`, starts the flush at once on tokio's blocking pool (`pool::flush_blocking`)
//! and returns `InBackground` with the flush's end and then the DescribeTransactions round trip (a
//! clone of the wire client). The sink keeps that producer as `draining`: `write` holds the next
//! transaction's records while it still has records without a handled delivery report (librdkafka's
//! out-queue length, checked at every write), then sends the held ones and the new ones in their
//! order; beyond a producer queue's worth (`queue.buffering.max.messages`: the job's, checked to be
//! a plain count librdkafka reads the same, or the default: its share of the output's partitions) or 64 MiB it
//! waits for the drain; the next `pre_commit` sends what is held before its own flush; `abort`
//! drops it. A first hold (2026-12-01) measured slower than flushing on the task (0.46, 0.61, 0.38
//! against 0.71, 0.70, 0.90 × the plain loop at 100 ms); it differed in its flush starting inside
//! the deferred part (a spawned task) instead of at once, in the hold ending when the flush's thread
//! reported back rather than at the last delivery report, and in holding up to 100 000 records.
//! This one measured faster than flushing on the task in 10 of 13 alternating pairs at 100 ms (9
//! of the 10 run while the machine was slow, 1 of 3 once it was fast: docs/benchmarks.md,
//! 2026-12-03) and no differently at 1 s (three pairs); peak RSS up to ≈20 MB higher (6 partitions,
//! a 20 000-record hold; the hold grows with the queue on more partitions). The
//! next transaction begins on the next free slot, so the pool size bounds the transactions waiting
//! for commits; a slot is free again only after its commit. `commit` and `start_commit` find their own slot by transactional id and
//! checkpoint id (ids never repeat within a run; restored committables are committed before the
//! pool exists). The flush is librdkafka's own (`pool::wait_delivered`), which waits on a condition
//! the producer's polling thread signals after the last delivery report; rdkafka's `flush` on a
//! `ThreadedProducer` polls the event queue itself in 100 ms waits while the polling thread takes
//! the reports, so every checkpoint cost at least 100 ms (measured; now a few ms). The commit at
//! completion runs in the background (`start_commit`): the slot is `Committing(checkpoint)` while
//! `commit_transaction` runs on a blocking thread (the producer is shared through an `Arc`), and a
//! oneshot channel tells the slot what it becomes (free; prepared again after a retriable error,
//! for the driver's retry through `commit`; free after aborting a lost transaction; broken when
//! fenced). A transaction whose librdkafka commit already failed retriably is not given to
//! librdkafka again: the retry commits it through the protocol (`recovery.rs`'s restart path:
//! describe, then EndTxn at the coordinator most bootstrap servers name) and the slot gets a
//! new producer of its id (whose epoch bump fences the old one's EndTxn) — librdkafka
//! keeps its coordinator, and one cut off from its
//! peers never completes the EndTxn while the real one aborts the transaction at its timeout (seen
//! on the partition test: "DATA LOST" reported and the job stopped, or checkpoints stalled for
//! minutes). A producer's `init_transactions` that times out or fails retriably is tried again
//! with a new producer (tries of 10, 20 and 30 s): librdkafka asks a random broker for the coordinator, and
//! the cut-off node names itself and answers CONCURRENT_TRANSACTIONS until the try times out (seen:
//! the task restarted over and over for minutes). On the task it cost the records after each completion p50 1 ms, p90 6 ms, p99 21 ms
//! (≈2 % of a backlog at 100 ms checkpoints). A pre-commit finding no free producer waits for
//! the commits still completing before it grows the pool.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use exactly_core::runtime::SubtaskInfo;
use exactly_core::CheckpointId;
use exactly_twophase::{
    CommitError, Committed, Committing, PreCommitted, PreCommitting, RecoveryContext, TwoPhaseCommitSink,
};
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use tracing::{info, warn};

use crate::broker::{broker_facts, TIMEOUT};
use crate::committable::{KafkaCommittable, Probe, COMMITTABLE_VERSION};
use crate::config::{DeliveryGuarantee, KafkaSinkConfig};
use crate::error::{Result, SinkError};
use crate::partitioner::Partitioner;
use crate::pool::{
    all_delivered, check_deliveries, create_producer, flush_blocking, queue_cap, queue_partitions, send_all,
    wait_all_delivered, Deliveries, Producer_,
};
use crate::progress;
use crate::protocol::{TxnDescription, TxnOffset, Wire};
use crate::recovery::commit_recovered_in_process;
use crate::transactional_id::{parse, transactional_id};

mod two_phase;
use crate::ProducerRecord;

/// The exactly-once sink: a pool of transactional producers driven by [`exactly_twophase::TwoPhaseSink`].
pub struct TransactionalKafkaSink {
    config: KafkaSinkConfig,
    prefix: String,
    pool_size: usize,
    max_pool_size: usize,
    transaction_timeout: Duration,
    /// Restored transactions of checkpoints up to this one whose outcome nobody can tell any
    /// more (their record is gone) pass as committed: the operator checked.
    accept_unknown_outcome_up_to: Option<CheckpointId>,
    partitioner: Box<dyn Partitioner>,
    partitions: Vec<i32>,
    brokers: Vec<String>,
    wire: Wire,
    info: Option<SubtaskInfo>,
    /// The group each transaction records its checkpoint in (see `progress`).
    progress: String,
    /// Ends when the latest pre-commit's record of its checkpoint was written (or failed): the
    /// next one waits for it, so that records are written in checkpoint order.
    recorded: Option<tokio::sync::oneshot::Receiver<()>>,
    /// This subtask's group held no record at this start: given one (the restored checkpoint)
    /// once every transactional id of the subtask is fenced (`abort_lingering`).
    start_record: Option<CheckpointId>,
    slots: Vec<Slot>,
    next_slot: usize,
    /// The producer of the latest pre-committed transaction while its flush goes on in the
    /// background, and the records after its barrier, held until it has delivered everything:
    /// sent at once from the next producer, they could land before its last batches of the same
    /// partition, and read_committed readers see a partition in log order.
    draining: Option<Arc<Producer_>>,
    held: Vec<ProducerRecord>,
    held_bytes: usize,
    /// The most records held; beyond it (or [`HOLD_BYTES`]) the record path waits for the flush
    /// (as many as a producer's queue takes: [`queue_cap`], set at `open`).
    hold_limit: usize,
}

/// The most bytes of records held while the previous transaction flushes.
const HOLD_BYTES: usize = 64 << 20;

fn record_bytes(r: &ProducerRecord) -> usize {
    // What the record's buffers take beside the vector's own slot.
    r.key.as_ref().map_or(0, Vec::len)
        + r.value.as_ref().map_or(0, Vec::len)
        + r.headers
            .iter()
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
            .sum::<usize>()
}

/// How long each try of a producer's transactions initialisation may take, each with a new
/// producer ([`TransactionalKafkaSink::init_producer_blocking`]): a first try as short as a
/// stale coordinator's answer needs, later ones as long as a slow start (a transaction log being
/// made, a coordinator loading, a slow login) may need.
const INIT_TRY_TIMEOUTS: [Duration; 3] = [
    Duration::from_secs(10),
    Duration::from_secs(20),
    Duration::from_secs(30),
];

struct Slot {
    id: String,
    /// Shared with a commit completing in the background.
    producer: Arc<Producer_>,
    deliveries: Arc<Deliveries>,
    state: SlotState,
    /// While `Committing`: the state the slot takes when the background commit ends, and whether
    /// it failed retriably.
    committed: Option<tokio::sync::oneshot::Receiver<(SlotState, bool)>>,
    /// The checkpoint whose transaction librdkafka failed to commit (retriably) on this slot.
    commit_failed: Option<CheckpointId>,
}

impl Slot {
    fn new(id: String, producer: Producer_, deliveries: Arc<Deliveries>) -> Self {
        Slot {
            id,
            producer: Arc::new(producer),
            deliveries,
            state: SlotState::Free,
            committed: None,
            commit_failed: None,
        }
    }

    /// Takes the outcome of a background commit if it has ended (waits for it with `wait`);
    /// whether it had.
    async fn settle(&mut self, wait: bool) -> bool {
        let SlotState::Committing(checkpoint_id) = self.state else {
            return false;
        };
        let next = match self.committed.as_mut() {
            None => None,
            Some(rx) if wait => rx.await.ok(),
            Some(rx) => match rx.try_recv() {
                Ok(next) => Some(next),
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => return false,
                Err(tokio::sync::oneshot::error::TryRecvError::Closed) => None,
            },
        };
        // Ended without a word (its task was dropped): still prepared, the driver commits again.
        let (state, failed) = next.unwrap_or((SlotState::Prepared(checkpoint_id), false));
        self.state = state;
        if failed {
            self.commit_failed = Some(checkpoint_id);
        }
        self.committed = None;
        true
    }
}

#[derive(Debug, Clone, PartialEq)]
enum SlotState {
    Free,
    Open,
    /// Pre-committed (or completing its pre-commit in the background) at this checkpoint: the
    /// slot is nobody else's until its transaction commits or the job restarts.
    Prepared(CheckpointId),
    /// Its transaction (of this checkpoint) commits in the background.
    Committing(CheckpointId),
    /// Fenced or failed fatally: unusable until the job restarts.
    Broken,
}

/// An open transaction: the pool slot holding it.
#[derive(Debug)]
pub struct KafkaTransaction {
    slot: usize,
    records: u64,
    /// Time the writes waited for room in librdkafka's queue: in all, and the longest write's.
    queue_full: Duration,
    longest_queue_full: Duration,
}

impl TransactionalKafkaSink {
    /// An exactly-once sink for `config` (whose delivery must be `exactly_once`).
    pub fn new(config: KafkaSinkConfig, partitioner: Box<dyn Partitioner>) -> Result<Self> {
        config.validate()?;
        let DeliveryGuarantee::ExactlyOnce {
            transactional_id_prefix,
            pool_size,
            max_pool_size,
            transaction_timeout,
            accept_unknown_outcome_up_to,
        } = config.delivery.clone()
        else {
            return Err(SinkError::Config(
                "TransactionalKafkaSink needs delivery.type = \"exactly_once\"".into(),
            ));
        };
        let wire = Wire::new(config.cluster(), crate::pool::request_timeout(transaction_timeout));
        Ok(TransactionalKafkaSink {
            config,
            prefix: transactional_id_prefix,
            pool_size,
            max_pool_size,
            transaction_timeout,
            accept_unknown_outcome_up_to,
            partitioner,
            partitions: Vec::new(),
            brokers: Vec::new(),
            wire,
            info: None,
            progress: String::new(),
            recorded: None,
            start_record: None,
            slots: Vec::new(),
            next_slot: 0,
            draining: None,
            held: Vec::new(),
            held_bytes: 0,
            // Set at `open`, once the output's partitions are known.
            hold_limit: 0,
        })
    }

    /// A producer for `id` with transactions initialised: fences older producers of the id
    /// (zombies) and aborts what they left open.
    fn init_producer(&self, id: &str) -> Result<(Producer_, Arc<Deliveries>)> {
        tokio::task::block_in_place(|| self.init_producer_blocking(id))
    }

    /// Creates the producer of `id` and initialises its transactions (blocks for the round trips).
    /// A try that times out or fails retriably is given up for a new producer
    /// ([`INIT_TRY_TIMEOUTS`]): librdkafka asks a broker picked at random for the id's coordinator and keeps the
    /// answer, and a node cut off from its peers but not from its clients names itself and
    /// answers CONCURRENT_TRANSACTIONS for as long as the partition lasts (seen: a task restarted
    /// over and over, each try ending at the timeout); a new producer asks again.
    fn init_producer_blocking(&self, id: &str) -> Result<(Producer_, Arc<Deliveries>)> {
        let mut tries = 0;
        loop {
            tries += 1;
            let (producer, deliveries) = create_producer(
                &self.config.cluster(),
                &self.config.client,
                self.hold_limit,
                Some((id, self.transaction_timeout)),
            )?;
            match producer.init_transactions(INIT_TRY_TIMEOUTS[tries - 1]) {
                Ok(()) => return Ok((producer, deliveries)),
                Err(KafkaError::Transaction(e)) if tries < INIT_TRY_TIMEOUTS.len() && !e.is_fatal() => {
                    warn!(transactional_id = id, tries, error = %e, "Initialising transactions failed; trying again with a new producer (it looks the coordinator up again).");
                }
                Err(e) => return Err(SinkError::kafka(format!("init_transactions for {id}"), e)),
            }
        }
    }

    /// Where this subtask's record of commits is (see `progress`).
    fn record<'a>(&'a self, info: &SubtaskInfo) -> progress::Record<'a> {
        progress::Record {
            cluster: self.config.cluster(),
            wire: &self.wire,
            brokers: &self.brokers,
            prefix: &self.prefix,
            topic: &self.config.topic,
            subtask: info.index,
            parallelism: info.parallelism,
        }
    }

    /// Producers in the pool now (`pool_size`, more while checkpoints fail).
    pub fn producers(&self) -> usize {
        self.slots.len()
    }

    /// The slot holding `c`'s transaction in this run. A slot holds one transaction at a time and
    /// a checkpoint id once per run; committables restored from a checkpoint were committed
    /// before this run's pool existed.
    fn own_slot(&self, c: &KafkaCommittable) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.id == c.transactional_id && s.state == SlotState::Prepared(c.checkpoint_id))
    }

    fn free_slots(&self) -> usize {
        self.slots.iter().filter(|s| s.state == SlotState::Free).count()
    }

    /// Adds a producer to the pool (an id past the configured pool size; the next start fences it
    /// like any id this subtask owns).
    fn add_slot(&mut self) -> Result<()> {
        let me = self.info.as_ref().map_or(0, |i| i.index);
        let id = transactional_id(&self.prefix, me, self.slots.len());
        warn!(transactional_id = %id, "All transactional producers wait for checkpoints; adding one to the pool.");
        let (producer, deliveries) = self.init_producer(&id)?;
        self.slots.push(Slot::new(id, producer, deliveries));
        Ok(())
    }

    /// Gives slot `i` (broken: its producer's commit failed and was made through the protocol) a
    /// new producer of its id, free: initialising it bumps the id's epoch, which fences whatever
    /// the old one still sends. A slot whose new producer fails to initialise stays broken.
    fn renew(&mut self, i: usize) {
        let id = self.slots[i].id.clone();
        match self.init_producer(&id) {
            Ok((producer, deliveries)) => {
                let old = std::mem::replace(&mut self.slots[i], Slot::new(id, producer, deliveries));
                // Closing a client waits for its threads: off the async workers.
                tokio::task::block_in_place(|| drop(old));
            }
            Err(e) => {
                warn!(transactional_id = %id, error = %e, "A new producer for a broken slot failed to initialise; the slot stays unused until the job restarts.")
            }
        }
    }

    /// Closes producers the pool grew beyond its size once they are free again (from the end:
    /// open and prepared transactions keep their slot numbers). Their ids are fenced and
    /// cleaned by the next start like any id of this subtask.
    fn shrink(&mut self) {
        let before = self.slots.len();
        // The last free producer stays: the next transaction may need it (a commit that ended
        // with a retriable error leaves its producer prepared, not free).
        while self.slots.len() > self.pool_size
            && self.free_slots() > 1
            && self.slots.last().is_some_and(|s| s.state == SlotState::Free)
        {
            let slot = self.slots.pop().expect("checked");
            // Closing a client waits for its threads: off the async workers.
            tokio::task::block_in_place(|| drop(slot));
        }
        if self.slots.len() < before {
            self.next_slot %= self.slots.len();
            info!(
                closed = before - self.slots.len(),
                pool = self.slots.len(),
                "Checkpoints complete again; closed the producers the pool grew by."
            );
        }
    }

    /// Takes the outcomes of the background commits that ended (all of them with `wait`); closes
    /// producers the pool grew by that they freed.
    async fn settle_commits(&mut self, wait: bool) {
        let mut ended = false;
        for s in &mut self.slots {
            ended |= s.settle(wait).await;
        }
        if ended {
            self.shrink();
        }
    }

    /// Whether the previous transaction's producer has delivered everything (waits for it with
    /// `wait`), so that records may go to the next one.
    fn drained(&mut self, wait: bool) -> Result<bool> {
        let Some(previous) = &self.draining else {
            return Ok(true);
        };
        if !all_delivered(previous) {
            if !wait {
                return Ok(false);
            }
            wait_all_delivered(previous, self.config.flush_timeout)?;
        }
        self.draining = None;
        Ok(true)
    }

    /// Sends the held records and then `records` into `txn` once the previous transaction's
    /// producer has delivered everything; holds them (or waits, beyond the hold limit) until then.
    async fn send(&mut self, txn: &mut KafkaTransaction, records: Vec<ProducerRecord>) -> Result<()> {
        if !self.drained(false)? {
            let bytes: usize = records.iter().map(record_bytes).sum();
            if self.held.len() + records.len() <= self.hold_limit && self.held_bytes + bytes <= HOLD_BYTES {
                self.held.extend(records);
                self.held_bytes += bytes;
                return Ok(());
            }
            self.drained(true)?;
        }
        self.held_bytes = 0;
        let s = &self.slots[txn.slot];
        let mut waited = Duration::ZERO;
        for batch in [std::mem::take(&mut self.held), records] {
            if !batch.is_empty() {
                waited += send_all(
                    &s.producer,
                    &self.config.topic,
                    &self.partitions,
                    self.partitioner.as_ref(),
                    batch,
                )
                .await?;
            }
        }
        txn.queue_full += waited;
        txn.longest_queue_full = txn.longest_queue_full.max(waited);
        Ok(())
    }

    /// Aborts whatever is open under `id` by initialising a producer with it (fences and aborts).
    fn fence_and_abort(&self, id: &str) -> Result<()> {
        self.init_producer(id).map(drop)
    }
}

/// The committable of a flushed transaction, if the coordinator still has it open.
fn committable(
    transactional_id: String,
    desc: TxnDescription,
    checkpoint_id: CheckpointId,
    probe: Option<Probe>,
) -> Result<KafkaCommittable> {
    if desc.state != "Ongoing" {
        return Err(SinkError::Protocol(format!(
            "transaction {transactional_id} is {} at pre-commit, expected Ongoing (fenced by another producer?)",
            desc.state
        )));
    }
    Ok(KafkaCommittable {
        version: COMMITTABLE_VERSION,
        transactional_id,
        producer_id: desc.producer_id,
        producer_epoch: desc.producer_epoch,
        txn_start_ms: desc.start_time_ms,
        checkpoint_id,
        probe,
    })
}

/// Commits the open transaction of `producer` (blocks for the round trips); returns the state its
/// slot takes and the outcome. A transaction that must be aborted is, here.
fn commit_blocking(
    producer: &Producer_,
    checkpoint_id: CheckpointId,
    what: String,
) -> (SlotState, Result<(), CommitError>) {
    let Err(e) = producer.commit_transaction(TIMEOUT) else {
        return (SlotState::Free, Ok(()));
    };
    let err = commit_error(e);
    match err {
        CommitError::Retriable(_) => (SlotState::Prepared(checkpoint_id), Err(err)),
        CommitError::Lost { .. } => {
            let _ = producer.abort_transaction(TIMEOUT);
            (
                SlotState::Free,
                Err(CommitError::Lost {
                    what,
                    source: err.into(),
                }),
            )
        }
        _ => (SlotState::Broken, Err(err)),
    }
}

pub(crate) fn commit_error(e: KafkaError) -> CommitError {
    match &e {
        KafkaError::Transaction(t) if t.is_retriable() => CommitError::Retriable(e.into()),
        KafkaError::Transaction(t) if t.txn_requires_abort() => CommitError::Lost {
            what: "the transaction".into(),
            source: e.into(),
        },
        _ => CommitError::Fenced(e.into()),
    }
}
