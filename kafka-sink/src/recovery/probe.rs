//! The probe: one record of a restored transaction, read back to learn how the transaction ended
//! when the coordinator can no longer say (it is not the id's transaction any more).
//!
//! A read_committed reader that sees the record: committed. One that goes past the record's
//! offset without it, while a read_uncommitted reader sees it: aborted (data lost). Gone from the
//! log: unknown. "Goes past" is decided from evidence only ([`ProbeReader`]): a record delivered
//! at a later offset, or the reader's position past the offset (the position counts control
//! records too, so the abort marker of the probe's own transaction moves it past). Reaching the
//! end of the partition decides nothing: for read_committed it is the last stable offset of
//! *that* fetch, and a watermark query after it may already show a later one — another
//! transaction completed in between, as happens in every recovery with several subtasks — while
//! the record was never read: taking that for "skipped" reported committed transactions as
//! aborted (a false DATA LOST). At the end without evidence the reader keeps polling until its
//! deadline; the watermarks decide only "removed" (below the partition's first offset).

use std::time::{Duration, Instant};

use exactly_kafka_client::leader::asking_again;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Message, Offset, TopicPartitionList};
use tracing::debug;

use crate::committable::Probe;
use crate::error::SinkError;

/// What the log says about a probe record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProbeOutcome {
    /// A read_committed reader sees it: the transaction committed.
    Committed,
    /// It is in the log, but read_committed readers skip it: the transaction aborted.
    Aborted,
    /// It is gone from the log (retention or compaction): nobody can tell any more.
    Unknown(String),
}

/// Reads the probe's record as a read_committed reader and, if that goes past it, as a
/// read_uncommitted one: present for both = committed, only for the second = aborted, for
/// neither = removed (unknown). Fails (to be retried) while nothing shows the reader past the
/// record before `timeout` (an open transaction pins the partition's last stable offset below it).
pub(crate) fn probe_outcome(
    cluster: &exactly_kafka_client::Cluster,
    probe: &Probe,
    timeout: Duration,
) -> Result<ProbeOutcome, SinkError> {
    let deadline = Instant::now() + timeout;
    match read_at(cluster, probe, true, deadline)? {
        Seen::Record => Ok(ProbeOutcome::Committed),
        Seen::Removed(why) => Ok(ProbeOutcome::Unknown(why)),
        Seen::Skipped => match read_at(cluster, probe, false, deadline)? {
            Seen::Record => Ok(ProbeOutcome::Aborted),
            Seen::Skipped => Ok(ProbeOutcome::Unknown(
                "the offset holds no record any more (removed by compaction)".into(),
            )),
            Seen::Removed(why) => Ok(ProbeOutcome::Unknown(why)),
        },
    }
}

/// What one reader saw at the probe's offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seen {
    /// The record at the probe's offset.
    Record,
    /// The reader went past the offset without it.
    Skipped,
    /// The offset is below the partition's start (retention or DeleteRecords removed it).
    Removed(String),
}

/// What a probe reader learned from one poll or query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadEvent {
    /// A record was delivered at this offset.
    Record(i64),
    /// The reader reached the end of what it may read for now (read_committed: the last stable
    /// offset of that fetch). No evidence either way.
    EndOfPartition,
    /// The reader's position: the offset after the last record or control record it consumed
    /// (`None`: nothing consumed yet).
    Position(Option<i64>),
    /// The partition's watermarks as a query answered them: its first offset, and its end (for
    /// read_committed the last stable offset *now*, not what the reader has read: no evidence).
    Watermarks {
        /// The first offset still in the log.
        low: i64,
        /// The end offset.
        end: i64,
    },
}

/// One reader's evidence about the record at the probe's offset: fed events until it decides.
#[derive(Debug)]
pub(crate) struct ProbeReader<'a> {
    /// The record looked for.
    probe: &'a Probe,
    /// Whether the reader has been at the end of the partition without deciding.
    at_end: bool,
    /// The end offset the last watermark query answered.
    end: Option<i64>,
}

impl<'a> ProbeReader<'a> {
    /// A reader of `probe`'s record that has learned nothing yet.
    pub(crate) fn new(probe: &'a Probe) -> Self {
        ProbeReader {
            probe,
            at_end: false,
            end: None,
        }
    }

    /// Takes `event`; what the reader saw once the evidence decides, `None` while it does not
    /// (poll on). Not to be fed after it decided.
    pub(crate) fn on(&mut self, event: ReadEvent) -> Option<Seen> {
        let offset = self.probe.offset;
        match event {
            ReadEvent::Record(o) if o == offset => Some(Seen::Record),
            ReadEvent::Record(o) if o > offset => Some(Seen::Skipped),
            ReadEvent::Record(_) => None,
            // Past the offset without the record at it (its delivery would have decided first).
            ReadEvent::Position(Some(p)) if p > offset => Some(Seen::Skipped),
            ReadEvent::Position(_) => None,
            ReadEvent::EndOfPartition => {
                self.at_end = true;
                None
            }
            ReadEvent::Watermarks { low, .. } if offset < low => Some(Seen::Removed(format!(
                "{}/{}@{offset} is below the partition's first offset {low} (removed by retention)",
                self.probe.topic, self.probe.partition
            ))),
            ReadEvent::Watermarks { end, .. } => {
                #[cfg(test)]
                if super::sim::mutant() == super::sim::Mutant::ProbeSecondWatermark && self.at_end && end > offset {
                    return Some(Seen::Skipped);
                }
                self.end = Some(end);
                None
            }
        }
    }

    /// Why nothing was decided (the deadline passed).
    pub(crate) fn undecided(&self) -> String {
        let Probe {
            topic,
            partition,
            offset,
        } = self.probe;
        let end = self
            .end
            .map_or(String::new(), |e| format!("; the partition's end was {e} when asked"));
        if self.at_end {
            format!(
                "could not decide before the deadline whether {topic}/{partition}@{offset} is committed: the reader reached the end of what it may read without reading past the offset (an open transaction holds the partition's last stable offset at or below it{end})"
            )
        } else {
            format!(
                "could not decide before the deadline whether {topic}/{partition}@{offset} is committed: nothing at or past the offset was read{end}"
            )
        }
    }
}

/// Reads from the probe's offset as a read_committed (`committed`) or read_uncommitted reader
/// until [`ProbeReader`] decides, or fails at `deadline`.
fn read_at(
    cluster: &exactly_kafka_client::Cluster,
    probe: &Probe,
    committed: bool,
    deadline: Instant,
) -> Result<Seen, SinkError> {
    let isolation = if committed {
        "read_committed"
    } else {
        "read_uncommitted"
    };
    let consumer: BaseConsumer = cluster
        .client_config()
        .map_err(SinkError::Config)?
        .set("group.id", "exactly-probe")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", isolation)
        // An offset out of range must be an error we see, never a silent jump to the end (which
        // would read as "absent", i.e. aborted).
        .set("auto.offset.reset", "error")
        .create()
        .map_err(|e| SinkError::kafka("creating the probe consumer", e))?;
    let watermarks = || {
        let what = format!("{}/{}", probe.topic, probe.partition);
        asking_again(&what, Duration::from_secs(10), || {
            consumer.fetch_watermarks(&probe.topic, probe.partition, Duration::from_secs(10))
        })
        .map(|(low, end)| ReadEvent::Watermarks { low, end })
        .map_err(|e| SinkError::kafka("probe watermarks", e))
    };
    let mut reader = ProbeReader::new(probe);
    if let Some(seen) = reader.on(watermarks()?) {
        return Ok(seen);
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&probe.topic, probe.partition, Offset::Offset(probe.offset))
        .map_err(|e| SinkError::kafka("probe assignment", e))?;
    consumer
        .assign(&tpl)
        .map_err(|e| SinkError::kafka("probe assignment", e))?;
    while Instant::now() < deadline {
        let event = match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => Some(ReadEvent::Record(m.offset())),
            None => None,
            Some(Err(KafkaError::PartitionEOF(_))) => Some(ReadEvent::EndOfPartition),
            // Out of range: below the first offset now (removed) or not; asked.
            Some(Err(KafkaError::MessageConsumption(
                RDKafkaErrorCode::AutoOffsetReset | RDKafkaErrorCode::OffsetOutOfRange,
            ))) => Some(watermarks()?),
            Some(Err(e)) => return Err(SinkError::kafka("probe read", e)),
        };
        if let Some(seen) = event.and_then(|e| reader.on(e)) {
            return Ok(seen);
        }
        // Control records (a transaction's marker) move the position without a delivery.
        if let Some(seen) = reader.on(ReadEvent::Position(position(&consumer, probe))) {
            return Ok(seen);
        }
    }
    Err(SinkError::Protocol(reader.undecided()))
}

/// The probe consumer's position in the probe's partition (librdkafka's application position:
/// after the last record or control record this consumer consumed); `None` when nothing was
/// consumed yet or the client cannot say (no evidence).
fn position(consumer: &BaseConsumer, probe: &Probe) -> Option<i64> {
    let tpl = consumer
        .position()
        .inspect_err(|e| debug!(error = %e, "The probe consumer's position is unknown."))
        .ok()?;
    match tpl.find_partition(&probe.topic, probe.partition)?.offset() {
        Offset::Offset(p) => Some(p),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(offset: i64) -> Probe {
        Probe {
            topic: "out".into(),
            partition: 2,
            offset,
        }
    }

    /// The race of the 2026-12-05 notes: the read_committed fetch ends below the record (another
    /// transaction still open), then that transaction completes and a watermark query shows the
    /// stable offset past the record — which the reader never read. The old check ("at the end
    /// and the end is past the offset: skipped") concluded aborted here, a false DATA LOST. Now
    /// nothing is decided until the record (or a later one) arrives.
    #[test]
    fn the_end_of_the_partition_then_a_stable_offset_past_the_probe_is_no_evidence() {
        let p = probe(100);
        let mut r = ProbeReader::new(&p);
        // At start: the record is in the log, the stable offset below it.
        assert_eq!(r.on(ReadEvent::Watermarks { low: 0, end: 100 }), None);
        assert_eq!(r.on(ReadEvent::Record(98)), None);
        assert_eq!(r.on(ReadEvent::Position(Some(99))), None);
        assert_eq!(r.on(ReadEvent::EndOfPartition), None);
        // The other subtask's transaction completes: asked now, the stable offset is past ours.
        assert_eq!(r.on(ReadEvent::Watermarks { low: 0, end: 130 }), None);
        assert_eq!(r.on(ReadEvent::Position(Some(99))), None);
        assert!(
            r.undecided().contains("without reading past the offset"),
            "{}",
            r.undecided()
        );
        // The next fetch delivers it: committed.
        assert_eq!(r.on(ReadEvent::Record(99)), None);
        assert_eq!(r.on(ReadEvent::Record(100)), Some(Seen::Record));
    }

    /// Skipped only from having read past the offset: a later record delivered, or the position
    /// past it (the transaction's abort marker consumed, nothing delivered after it).
    #[test]
    fn only_reading_past_the_offset_shows_the_record_skipped() {
        let p = probe(100);
        let mut r = ProbeReader::new(&p);
        assert_eq!(r.on(ReadEvent::EndOfPartition), None);
        assert_eq!(r.on(ReadEvent::Record(101)), Some(Seen::Skipped));

        let mut r = ProbeReader::new(&p);
        assert_eq!(r.on(ReadEvent::Position(None)), None);
        assert_eq!(r.on(ReadEvent::Position(Some(100))), None);
        assert_eq!(r.on(ReadEvent::EndOfPartition), None);
        assert_eq!(r.on(ReadEvent::Position(Some(101))), Some(Seen::Skipped));
        assert!(ProbeReader::new(&p)
            .undecided()
            .contains("nothing at or past the offset was read"));
    }

    /// Below the partition's first offset, at start or after an out-of-range fetch: removed
    /// (unknown), never skipped (aborted).
    #[test]
    fn a_record_below_the_first_offset_is_removed() {
        let p = probe(100);
        let mut r = ProbeReader::new(&p);
        assert_eq!(r.on(ReadEvent::Watermarks { low: 100, end: 120 }), None);
        match r.on(ReadEvent::Watermarks { low: 101, end: 120 }) {
            Some(Seen::Removed(why)) => assert!(why.contains("out/2@100") && why.contains("101"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
