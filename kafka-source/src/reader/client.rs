//! The source's librdkafka client: its context (statistics, broker log, commit results) and its
//! configuration.
//!
//! # Design notes
//!
//! Why this part is built as it is, with the measurements and failures that shaped it.
//!
//! It sets librdkafka's `fetch.queue.backoff.ms` to 10 ms unless configured: the 1 s default stalls
//! a batch-reading consumer whenever its prefetch queue is over the threshold (measured: 185 k
//! instead of 1.3 M records/s). And `queued.min.messages` to 50 000 (librdkafka's default is
//! 100 000 records, or 64 MiB, *per partition*): measured (`/proc/PID/smaps` of `exactly run`, 2 M ×
//! 100 B, three partitions), the consumer's prefetch was the largest single block of the process
//! (≈55 MB of glibc arena). Peak RSS of the pass-through job: 158–170 MB with 100 000, 131–137 with
//! 50 000, 117–125 with 20 000. With 20 000 the pipeline did not slow (100 B: written faster in 7
//! of the last 7 alternating pairs; 1 KB: better in 4 of 8), but the source alone did (`bench
//! source`: 0.90–1.22 × the plain consumer against 1.04–1.37 with 100 000; 50 000: 1.10–1.60), so
//! 50 000. A byte limit instead (`queued.max.messages.kbytes=4096`) cost a sixth to a half of the
//! pipeline's rate at 1 KB (4 of 4 pairs). These defaults (`consumer_config`, with `statistics.interval.ms`) give way to
//! the job's `client`; `auto.offset.reset=error` is set after it.

use super::*;

/// Receives librdkafka's statistics and commit results.
pub struct SourceContext {
    pub(super) metrics: Arc<KafkaSourceMetrics>,
    /// An offset commit is on its way (its result not served yet). One at a time: a later
    /// commit never overtakes an earlier one, so the group's offsets never go back.
    pub(super) committing: AtomicBool,
}

const BROKER_LOG: BrokerLog = BrokerLog::new(ClientKind::Source);

impl ClientContext for SourceContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        BROKER_LOG.log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        BROKER_LOG.error(&error, reason);
    }

    fn stats(&self, stats: Statistics) {
        BROKER_LOG.brokers(
            stats.time,
            stats
                .brokers
                .values()
                .map(|b| (b.nodename.as_str(), b.state.as_str(), b.stateage)),
        );
        self.metrics.with_partitions(|parts| {
            for (topic, t) in &stats.topics {
                for (p, ps) in &t.partitions {
                    let tp = TopicPartition {
                        topic: topic.clone(),
                        partition: *p,
                    };
                    if let Some(m) = parts.get_mut(&tp) {
                        m.lag = (ps.consumer_lag >= 0).then_some(ps.consumer_lag);
                    }
                }
            }
        });
    }
}

impl ConsumerContext for SourceContext {
    /// The result of `commit_to_group`'s commit, served on the source's task by
    /// `serve_consumer_queue`: counted, and the offsets the group now holds recorded.
    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        match result {
            Ok(()) => {
                self.metrics.commits_succeeded.fetch_add(1, Ordering::Relaxed);
                self.metrics.with_partitions(|parts| {
                    for e in offsets.elements() {
                        let (Ok(()), Offset::Offset(o)) = (e.error(), e.offset()) else {
                            continue;
                        };
                        let tp = TopicPartition {
                            topic: e.topic().to_owned(),
                            partition: e.partition(),
                        };
                        if let Some(m) = parts.get_mut(&tp) {
                            m.committed = Some(o);
                        }
                    }
                });
            }
            Err(error) => {
                self.metrics.commits_failed.fetch_add(1, Ordering::Relaxed);
                warn!(%error, "Committing offsets to the consumer group failed (monitoring only; the checkpoint holds the offsets).");
            }
        }
        self.committing.store(false, Ordering::Release);
    }
}

/// librdkafka properties the source sets unless `client` sets them, each for a measured reason.
pub(super) const CLIENT_DEFAULTS: &[(&str, &str)] = &[
    // Consumer lag and fetch figures for the metrics; the end of a broker outage for the log.
    (
        "statistics.interval.ms",
        exactly_kafka_client::outage::STATISTICS_INTERVAL_MS,
    ),
    // librdkafka's default (1 s) stalls a partition for a second whenever its prefetch queue is
    // over the threshold, which a batch-consuming reader hits all the time: measured: 185 k
    // instead of 1.3 M records/s.
    ("fetch.queue.backoff.ms", "10"),
    // librdkafka prefetches until each partition holds 100 000 records (or 64 MiB): at 100 B,
    // ≈ 30 MB more peak memory for a subtask of three partitions than 50 000, which measured no
    // slower in `bench source`; 20 000 saves ≈ 15 MB more and did not slow the pipeline, but
    // slowed the source alone by a fifth (measured: see this module's Design notes).
    ("queued.min.messages", "50000"),
];

/// The consumer's configuration: TLS/SASL, [`CLIENT_DEFAULTS`], the job's `client` properties
/// (which win over the defaults), then the keys the source owns.
pub(super) fn consumer_config(config: &KafkaSourceConfig) -> Result<ClientConfig> {
    let mut c = exactly_kafka_client::client_config(&config.bootstrap_servers, &config.security)
        .map_err(SourceError::Config)?;
    for (k, v) in CLIENT_DEFAULTS {
        c.set(*k, *v);
    }
    for (k, v) in &config.client {
        c.set(k, v);
    }
    c.set("bootstrap.servers", &config.bootstrap_servers)
        .set("group.id", &config.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        // Offsets are always concrete and checked against the log's range when assigned
        // (`position`); one that leaves it later (retention overtaking a lagging job) comes back
        // as an error that restarts the attempt, never as a silent jump.
        .set("auto.offset.reset", "error")
        .set(
            "isolation.level",
            match config.isolation_level {
                IsolationLevel::ReadCommitted => "read_committed",
                IsolationLevel::ReadUncommitted => "read_uncommitted",
            },
        );
    Ok(c)
}
