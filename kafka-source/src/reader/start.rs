//! Where each partition starts — the start position of a first run, or a restored offset — checked
//! against the log's range and the topic's ID before librdkafka gets it; and the topic-ID check
//! before each snapshot.
//!
//! # Design notes
//!
//! Why this part is built as it is, with the measurements and failures that shaped it.
//!
//! `auto.offset.reset` is the source's own, `error`: librdkafka never jumps on its own. A start
//! position that may be the end of a log as it is now (`StartPosition::may_resolve_to_the_end`:
//! `latest`, a `latest` reset, a timestamp) of a source that restored nothing is read only once a
//! checkpoint has recorded it (`Source::reads_after_first_checkpoint`, see the source task in
//! core): a restart before the first checkpoint completed — in a new process too — restores it
//! rather than resolving `latest` again, later, which would skip what the failed run read and never
//! committed (an in-process memory of the first attempt's start, before, covered neither a new
//! process nor jobs without checkpointing, where it replayed from the process's start). A restored
//! offset, and a group's or `specific` start offset, is checked when assigned against the log's
//! range and the topic's ID (`start::position`; the decision is `offsets::resume`, unit-tested case
//! by case). Checkpoints record each topic's ID (KIP-516, from a Metadata v10 request of the wire
//! client, `wire::topic_ids`) with its offsets. Another ID now → the topic was deleted and
//! recreated: the new one is read from its first offset, wherever the old offset falls (inside the
//! new log's range librdkafka would have read on, skipping records). Below the first offset
//! (retention deleted records the job had not read: after downtime, from an old checkpoint) the
//! source reads on from the first offset, logs an error naming the offsets lost and counts them
//! (`lost_to_retention`; `/metrics` `exactly_source_offsets_lost_to_retention_total`). Beyond the
//! end the first answer gives, the brokers' views are asked first (`end_most_brokers_agree_on`): a
//! broker cut off from its peers still leads in its own view, at the ends its partitions had when
//! it was cut off, and a client whose metadata came from it sees a "truncation" that is not one
//! (re-reading what was committed: duplicates). Every broker the metadata lists is asked, through a
//! client knowing only it, who leads the partition and where it ends; the leader a strict majority
//! names decides (not the largest end: a cut-off in-sync leader of a log the others truncated by an
//! unclean election is ahead, and the largest end would skip records); no majority →
//! `ViewsDisagree`, retriable. Beyond the majority leader's end of the same topic → the log was
//! truncated (unclean leader election): on from its end, with an error naming the offsets read that
//! the log no longer holds (what Kafka's consumers do on a detected truncation). Beyond the end
//! with no ID to tell (a checkpoint of an earlier build, a broker before 2.8) →
//! `SourceError::BeyondEnd` (fatal) unless `position_beyond_end` says `truncated` or `recreated`; a
//! group's offset beyond the end is a truncation (Kafka deletes a group's offsets with their
//! topic); a `specific` start offset beyond it is refused. A topic deleted and recreated *while*
//! the source reads it: librdkafka (2.12) reads the new topic on from the old position when the new
//! log has reached it (a FIXME in its metadata update), skipping the new topic's first records. So
//! each snapshot first asks for the topics' IDs (one Metadata round trip on a kept connection,
//! `wire::TopicIds`; `check_topic_ids`) and fails with `SourceError::Recreated` (restart) if one
//! changed: the last completed checkpoint recorded the old ID (its own snapshot checked it), so the
//! restore reads the new topic from its first offset and what the attempt read of it is never
//! committed. A broker that does not answer holds the snapshot (retrying each second, 10 s per
//! request) for up to 2 minutes before the attempt fails, as it would hold the sinks' pre-commit.
//! Without checkpointing (no snapshots) the source asks every 5 s while it reads and before each
//! periodic offset commit, asking once (a broker that does not answer is asked again at the next
//! turn, and a periodic commit whose check got no answer waits for a check that did, 5 s on); a
//! changed ID fails the attempt, whose successor starts where the start position says — the old
//! topic's group offsets went with it. (Left open: a bootstrap broker whose metadata lags the
//! partition leader's by the moment between a fetch and a snapshot; a topic recreated in the
//! milliseconds between a periodic check's answer and its commit, which only an OffsetCommit
//! carrying topic IDs (v10, still marked unstable in Kafka 4.1; sent by neither librdkafka nor
//! kafka-protocol) would refuse.) A position that leaves the range while the source runs (retention
//! overtaking a lagging job) comes back as a fetch error, `SourceError::OutOfRange`, which restarts
//! the attempt: librdkafka has stopped fetching the partition (a seek answers "erroneous state";
//! assigning it again raced with the stop, and lost the partition in 3 of 7 runs), and the restart
//! checks the restored offset as above.

use super::*;
use exactly_kafka_client::leader::{asking_again, asking_the_coordinator_again, coordinator_moving, leader_moving};

/// The longest one request for the topics' IDs may take before a snapshot (`check_topic_ids`),
/// and how long the snapshot retries before the attempt fails.
const ID_CHECK_TIMEOUT: Duration = Duration::from_secs(10);
const ID_CHECK_PATIENCE: Duration = Duration::from_secs(120);
/// Without checkpointing, how often the topics' IDs are checked while reading.
pub(super) const ID_CHECK_EVERY: Duration = Duration::from_secs(5);
/// How long each broker's own view may take to answer (`end_most_brokers_agree_on`): one that
/// does not answer is left out, not waited for.
const VIEW_TIMEOUT: Duration = Duration::from_secs(5);

impl<T: Send + 'static, D: Deserializer<T>> KafkaSource<T, D> {
    /// Every partition of the subscribed topics, as the broker lists them now.
    pub(super) fn list_partitions(&self) -> Result<BTreeSet<TopicPartition>> {
        let consumer = self.consumer();
        let metadata = if self.pattern.is_some() {
            consumer.fetch_metadata(None, TIMEOUT)
        } else if let [only] = self.config.topics.as_slice() {
            consumer.fetch_metadata(Some(only), TIMEOUT)
        } else {
            consumer.fetch_metadata(None, TIMEOUT)
        }
        .map_err(|e| {
            let bootstrap = &self.config.bootstrap_servers;
            let why = exactly_core::net::diagnose(bootstrap);
            SourceError::kafka(format!("fetching metadata from {bootstrap} ({why})"), e)
        })?;
        let mut out = BTreeSet::new();
        for t in metadata.topics() {
            let wanted = match &self.pattern {
                Some(p) => p.is_match(t.name()) && !t.name().starts_with("__"),
                None => self.config.topics.iter().any(|n| n == t.name()),
            };
            if !wanted || t.error().is_some() {
                continue;
            }
            for p in t.partitions() {
                out.insert(TopicPartition {
                    topic: t.name().to_owned(),
                    partition: p.id(),
                });
            }
        }
        if self.pattern.is_none() {
            for topic in &self.config.topics {
                if !out.iter().any(|tp| &tp.topic == topic) {
                    return Err(SourceError::UnknownTopic(topic.clone()));
                }
            }
        }
        Ok(out)
    }

    /// The partition's first and next offsets (`asking_again` while its leader moves).
    pub(super) fn watermarks(&self, tp: &TopicPartition) -> Result<(i64, i64)> {
        asking_again(&format!("{}/{}", tp.topic, tp.partition), TIMEOUT, || {
            self.consumer().fetch_watermarks(&tp.topic, tp.partition, TIMEOUT)
        })
        .map_err(|e| SourceError::kafka(format!("watermarks of {}/{}", tp.topic, tp.partition), e))
    }

    pub(super) fn reset(&self, tp: &TopicPartition, reset: ResetPosition) -> Result<i64> {
        match reset {
            ResetPosition::Earliest => Ok(self.watermarks(tp)?.0),
            ResetPosition::Latest => Ok(self.watermarks(tp)?.1),
            ResetPosition::None => Err(SourceError::Config(format!(
                "no start offset for {}/{} and the reset position is `none`",
                tp.topic, tp.partition
            ))),
        }
    }

    /// The concrete start offset of a partition without restored offset (a group's or a given
    /// offset checked against the log's range: `position`).
    pub(super) fn start_offset(&self, tp: &TopicPartition) -> Result<i64> {
        match &self.config.start {
            StartPosition::Earliest => Ok(self.watermarks(tp)?.0),
            StartPosition::Latest => Ok(self.watermarks(tp)?.1),
            StartPosition::Timestamp { ms } => {
                let found = asking_again(&format!("{}/{}", tp.topic, tp.partition), TIMEOUT, || {
                    let mut tpl = TopicPartitionList::new();
                    tpl.add_partition_offset(&tp.topic, tp.partition, Offset::Offset(*ms))?;
                    let found = self.consumer().offsets_for_times(tpl, TIMEOUT)?;
                    // The partition's own error, asked again like the call's (`answer` reports
                    // any other).
                    match found.find_partition(&tp.topic, tp.partition).map(|e| e.error()) {
                        Some(Err(e)) if leader_moving(&e) => Err(e),
                        _ => Ok(found),
                    }
                })
                .map_err(|e| SourceError::kafka("offsets for times", e))?;
                match answer(&found, tp, "the offset for the start timestamp")? {
                    Offset::Offset(o) => Ok(o),
                    // No record at or after the timestamp: start at the end.
                    _ => {
                        let end = self.watermarks(tp)?.1;
                        info!(topic = %tp.topic, partition = tp.partition, timestamp_ms = *ms, offset = end,
                            "No record at or after the start timestamp: starting at the end.");
                        Ok(end)
                    }
                }
            }
            StartPosition::GroupOffsets { reset } => {
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition(&tp.topic, tp.partition);
                // A coordinator loading or moving (after a broker restart) is waited for.
                let what = format!("the source's start offsets (consumer group {})", self.config.group_id);
                let deadline = std::time::Instant::now() + TIMEOUT;
                let committed = asking_the_coordinator_again(&what, TIMEOUT, || {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    let committed = self.consumer().committed_offsets(tpl.clone(), left)?;
                    // The partition's own error, asked again like the call's.
                    match committed.find_partition(&tp.topic, tp.partition).map(|e| e.error()) {
                        Some(Err(e)) if coordinator_moving(&e) => Err(e),
                        _ => Ok(committed),
                    }
                })
                .map_err(|e| SourceError::kafka("committed offsets of the group", e))?;
                match answer(&committed, tp, "the group's committed offset")? {
                    // Kept elsewhere: it may be out of the log's range by now.
                    Offset::Offset(o) => self.position(tp, o, Origin::Group),
                    _ => self.reset(tp, *reset),
                }
            }
            StartPosition::Specific { offsets, reset } => {
                match offsets.get(&format!("{}:{}", tp.topic, tp.partition)) {
                    Some(o) => self.position(tp, *o, Origin::Given),
                    None => self.reset(tp, *reset),
                }
            }
        }
    }

    /// The offset to read `tp` from, given `offset` (restored, or a group's or the job's start
    /// offset), checked against the log's range and the topic's ID (`resume`), so that librdkafka
    /// never jumps on its own and a restore never guesses:
    /// - below the log's first offset, retention deleted records the job had not read: they are
    ///   gone; on from the first offset, saying which offsets were lost (an error, and
    ///   `lost_to_retention`);
    /// - the topic has another ID than the checkpoint recorded: it was deleted and recreated; the
    ///   new one is read from its first offset (even where the old offset falls inside the new
    ///   log's range, which librdkafka would read on from, skipping records);
    /// - beyond the end of the same topic: the log was truncated; on from its end (what Kafka's
    ///   consumers do when they detect a truncation), with an error;
    /// - beyond the end with no ID to tell (checkpoints of earlier builds): `position_beyond_end`
    ///   decides, failing by default. A group's offset beyond the end means truncation (Kafka
    ///   deletes a group's offsets with their topic); a given start offset beyond it is refused.
    pub(super) fn position(&self, tp: &TopicPartition, offset: i64, origin: Origin<'_>) -> Result<i64> {
        let (low, mut high) = self.watermarks(tp)?;
        if offset > high {
            high = self.end_most_brokers_agree_on(tp, offset, high)?;
        }
        let now = self.topic_ids.get(&tp.topic).map(String::as_str);
        let then = match origin {
            Origin::Restored(id) => id,
            Origin::Group | Origin::Given => None,
        };
        let what = || format!("{}/{}", tp.topic, tp.partition);
        let r = match (resume(offset, (low, high), then, now), origin) {
            (Resume::Unclear { low, end }, Origin::Restored(_)) => match self.config.position_beyond_end {
                BeyondEnd::Truncated => Resume::Truncated { end },
                BeyondEnd::Recreated => Resume::Recreated { low },
                BeyondEnd::Fail => Resume::Unclear { low, end },
            },
            (Resume::Unclear { end, .. }, Origin::Group) => Resume::Truncated { end },
            (Resume::Unclear { end, .. }, Origin::Given) => {
                return Err(SourceError::Config(format!(
                    "start.offsets \"{}:{}\" = {offset} is beyond the partition's end {end}",
                    tp.topic, tp.partition
                )))
            }
            (r, _) => r,
        };
        match r {
            Resume::At(o) => Ok(o),
            Resume::LostToRetention { low } => {
                let lost = low - offset;
                self.metrics.lost_to_retention.fetch_add(lost as u64, Ordering::Relaxed);
                error!(
                    topic = %tp.topic,
                    partition = tp.partition,
                    from = offset,
                    to = low,
                    lost,
                    "Records deleted by retention before the job read them: offsets {offset} to {} of {} are lost. Reading on from {low}. Keep the topic's retention longer than the job's lag and downtime.",
                    low - 1,
                    what()
                );
                Ok(low)
            }
            Resume::Recreated { low } => {
                warn!(
                    topic = %tp.topic,
                    partition = tp.partition,
                    position = offset,
                    recorded_id = then.unwrap_or("none"),
                    topic_id = now.unwrap_or("none"),
                    "Topic {:?} was deleted and recreated since the position {offset} of {} was recorded: that position belongs to the old topic (its records the job had not read went with it). Reading the new topic from its first offset {low}.",
                    tp.topic,
                    what()
                );
                Ok(low)
            }
            Resume::Truncated { end } => {
                error!(
                    topic = %tp.topic,
                    partition = tp.partition,
                    position = offset,
                    end,
                    "The log of {} was truncated below the position {offset} (unclean leader election?): offsets {end} to {} that the job read are no longer in the log (their output stays). Reading on from its end {end}, where new records will be written.",
                    what(),
                    offset - 1
                );
                Ok(end)
            }
            Resume::Unclear { end, .. } => Err(SourceError::BeyondEnd {
                what: what(),
                offset,
                end,
            }),
        }
    }

    /// The end of `tp` to judge the position `offset` by, when the first answer (`first`) was below
    /// it: the end as the brokers' majority sees it. A broker cut off from the others (a network
    /// partition) still believes it leads the partitions it led, at the ends they had when it was
    /// cut off: a client whose metadata came from it is answered with an end behind the records
    /// the job already read, which would pass for a truncated log and have them read (and
    /// written) again. But a cut-off broker can also be ahead — the in-sync leader of a log the
    /// others truncated by an unclean election — so the largest answer is not the truth either.
    /// Every broker the metadata lists is asked, through a client that knows only it, which
    /// broker leads `tp` and where its log ends: the leader named by a strict majority of the
    /// brokers asked (not only of those that answered: the job may share a side of a split with
    /// the cut-off broker) decides, and its end is the one the position is judged by (beyond
    /// it, the log was truncated). No majority: the attempt fails, to be asked again, rather than
    /// guess.
    fn end_most_brokers_agree_on(&self, tp: &TopicPartition, offset: i64, first: i64) -> Result<i64> {
        let leader_in = |md: &rdkafka::metadata::Metadata| {
            md.topics()
                .iter()
                .find(|t| t.name() == tp.topic)
                .and_then(|t| t.partitions().iter().find(|p| p.id() == tp.partition))
                .map(|p| p.leader())
        };
        let mut servers = match self.consumer().fetch_metadata(Some(&tp.topic), TIMEOUT) {
            Ok(md) => {
                let brokers: BTreeMap<i32, String> = md
                    .brokers()
                    .iter()
                    .map(|b| (b.id(), format!("{}:{}", b.host(), b.port())))
                    .collect();
                brokers.into_values().collect::<Vec<_>>()
            }
            Err(e) => {
                debug!(topic = %tp.topic, error = %e, "No broker list to ask for the partition's end.");
                Vec::new()
            }
        };
        if servers.is_empty() {
            servers = self
                .config
                .bootstrap_servers
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
        }
        let mut views: Vec<(String, i32, i64)> = Vec::new();
        for server in &servers {
            let answer = consumer_config(&self.config).and_then(|mut c| {
                c.set("bootstrap.servers", server.as_str());
                let consumer: BaseConsumer = c
                    .create()
                    .map_err(|e| SourceError::kafka(format!("creating a consumer of {server}"), e))?;
                let md = consumer
                    .fetch_metadata(Some(&tp.topic), VIEW_TIMEOUT)
                    .map_err(|e| SourceError::kafka(format!("metadata of {} from {server}", tp.topic), e))?;
                let leader = leader_in(&md).unwrap_or(-1);
                let (_, end) = consumer
                    .fetch_watermarks(&tp.topic, tp.partition, VIEW_TIMEOUT)
                    .map_err(|e| {
                        SourceError::kafka(format!("watermarks of {}/{} from {server}", tp.topic, tp.partition), e)
                    })?;
                Ok((leader, end))
            });
            match answer {
                Ok((leader, end)) => views.push((server.clone(), leader, end)),
                Err(e) => {
                    debug!(topic = %tp.topic, partition = tp.partition, server = %server, error = %e, "No view from this server.")
                }
            }
        }
        let described = || {
            views
                .iter()
                .map(|(server, leader, end)| format!("{server}: leader {leader}, end {end}"))
                .collect::<Vec<_>>()
                .join("; ")
        };
        let mut named: BTreeMap<i32, usize> = BTreeMap::new();
        for (_, leader, _) in &views {
            *named.entry(*leader).or_default() += 1;
        }
        // A majority of every broker asked, not of those that answered: the job may be on the
        // side of a split with the cut-off broker, which alone answering would be "all of them".
        let asked = servers.len().max(views.len());
        let majority = named
            .iter()
            .find(|(leader, n)| **leader >= 0 && **n * 2 > asked)
            .map(|(leader, _)| *leader);
        let Some(leader) = majority else {
            return Err(SourceError::ViewsDisagree {
                what: format!("{}/{}", tp.topic, tp.partition),
                offset,
                views: described(),
            });
        };
        let end = views
            .iter()
            .filter(|(_, l, _)| *l == leader)
            .map(|(_, _, end)| *end)
            .max()
            .unwrap_or(first);
        if end <= first {
            // The first answer was not behind the majority's leader: judged by that leader's end.
            return Ok(end);
        }
        warn!(
            topic = %tp.topic,
            partition = tp.partition,
            position = offset,
            stale_end = first,
            end,
            leader,
            "The first answer put the end of {}/{} at {first}, behind the position {offset} the job resumes at; most brokers name node {leader} its leader, whose end is {end}: the first answer came from a stale view (a broker cut off from the others). Views: {}.",
            tp.topic,
            tp.partition,
            described()
        );
        Ok(end)
    }

    /// Learns the IDs of `topics` not yet known (recorded with their offsets).
    pub(super) async fn learn_topic_ids(&mut self, topics: BTreeSet<&str>) -> Result<()> {
        let missing: Vec<String> = topics
            .into_iter()
            .filter(|t| !self.topic_ids.contains_key(*t))
            .map(str::to_owned)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let ids = self
            .ids
            .get(&self.cluster, &missing, TIMEOUT)
            .await
            .map_err(wire_error)?;
        self.topic_ids.extend(ids);
        Ok(())
    }

    /// Before a snapshot records positions: are the topics read still those whose IDs the
    /// source knows? librdkafka reads a topic deleted and recreated under the same name on from
    /// the old position (skipping the new topic's first records, without a word); recorded under
    /// the old ID, that position would also be read again by a restore, which reads a recreated
    /// topic from its first offset. So the snapshot fails instead, and the attempt restarts from
    /// the last checkpoint, whose positions, checked when they were recorded, are the old topic's:
    /// the restore reads the new topic from its first offset, and the records the attempt read
    /// of it are never committed. One round trip on a kept connection per checkpoint. Without
    /// checkpointing it runs every `ID_CHECK_EVERY` and before each periodic offset commit: the
    /// failed attempt's successor starts where the start position says (a recreated topic's
    /// group offsets went with the old one) — at least once, as such a job is. A snapshot (`hold`)
    /// waits for a broker that does not answer; the periodic check asks once and leaves a
    /// failure to its next turn (the source waits for the broker as it did before the check).
    /// Returns whether the IDs were compared (false: the broker did not answer the periodic
    /// check — a periodic commit then waits, `poll_next`). Left open: a topic recreated between
    /// the answer and the commit's arrival (milliseconds) gets the old positions — only an
    /// OffsetCommit carrying topic IDs (v10, still marked unstable in Kafka 4.1) would refuse
    /// them, which neither librdkafka nor kafka-protocol sends.
    pub(super) async fn check_topic_ids(&mut self, hold: bool) -> Result<bool> {
        let mut topics: Vec<String> = self.positions.iter().map(|p| p.tp.topic.clone()).collect();
        topics.sort_unstable();
        topics.dedup();
        if topics.is_empty() {
            return Ok(true);
        }
        // A broker that does not answer holds the snapshot, as it holds the sinks' pre-commit,
        // for a while before the attempt fails (a restart is no better while it is away).
        let patience = Instant::now() + ID_CHECK_PATIENCE;
        let now = loop {
            match self.ids.get(&self.cluster, &topics, ID_CHECK_TIMEOUT).await {
                Ok(ids) => break ids,
                Err(e) if e.is_permanent() || (hold && Instant::now() >= patience) => return Err(wire_error(e)),
                Err(error) if !hold => {
                    ids_failed(&error, "asking again at the next check");
                    return Ok(false);
                }
                Err(error) => {
                    ids_failed(&error, "retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        for (topic, id) in now {
            match self.topic_ids.get(&topic) {
                Some(was) if *was != id => {
                    return Err(SourceError::Recreated {
                        topic,
                        was: was.clone(),
                        now: id,
                    })
                }
                Some(_) => {}
                None => {
                    self.topic_ids.insert(topic, id);
                }
            }
        }
        Ok(true)
    }
}

/// Where an offset to check against the log came from.
#[derive(Clone, Copy)]
pub(super) enum Origin<'a> {
    /// A checkpoint, with the topic's ID when it was recorded.
    Restored(Option<&'a str>),
    /// The group's committed offsets (`start = group_offsets`).
    Group,
    /// The job's `start.offsets`.
    Given,
}

/// A wire-client error: credentials, certificates and settings stop the job; the rest restarts
/// the attempt.
pub(super) fn wire_error(e: exactly_kafka_client::wire::WireError) -> SourceError {
    if e.is_permanent() {
        SourceError::Config(e.to_string())
    } else {
        SourceError::Unreachable(e.to_string())
    }
}

/// The broker's answer for `tp` in `list`. An error for the partition, or no answer, fails (the
/// job restarts; missing authorization stops it), so that a lookup that did not work is never
/// taken for "no offset" — which starts at the end or the reset position: records skipped or
/// replayed without a word.
pub(super) fn answer(list: &TopicPartitionList, tp: &TopicPartition, what: &str) -> Result<Offset> {
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode;
    let place = format!("{what} of {}/{}", tp.topic, tp.partition);
    let Some(e) = list.find_partition(&tp.topic, tp.partition) else {
        return Err(SourceError::kafka(
            format!("no answer from the broker for {place}"),
            KafkaError::OffsetFetch(RDKafkaErrorCode::UnknownPartition),
        ));
    };
    if let Err(err) = e.error() {
        if let Some(code) = err.rdkafka_error_code() {
            if let Some(fatal) = crate::error::unretried(code, place.clone()) {
                return Err(fatal);
            }
        }
        return Err(SourceError::kafka(place, err));
    }
    Ok(e.offset())
}

/// A failed request for the input topics' IDs: a broker whose TCP connection fails or times out
/// through the outage log (said once per outage, with the consumers' failures), anything else —
/// a TLS alert, a name that is no DNS name — at WARN.
fn ids_failed(error: &exactly_kafka_client::wire::WireError, then: &str) {
    use exactly_kafka_client::outage::{unreachable, ClientKind};
    match error {
        exactly_kafka_client::wire::WireError::Transport { addr, what }
            if !what.starts_with("TLS handshake") && (what.contains("(os error") || what.contains("timed out")) =>
        {
            unreachable(ClientKind::Source, addr, what);
            debug!(%error, "Asking for the input topics' IDs failed; {then}.");
        }
        _ => warn!(%error, "Asking for the input topics' IDs failed; {then}."),
    }
}
