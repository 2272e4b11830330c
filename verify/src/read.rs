//! What `exactly verify` reads: a range of a topic with its own read_committed consumer, a
//! table with its own SQL, and single records again for the examples.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use exactly_kafka_client::leader::asking_again;
use exactly_kafka_client::outage::{BrokerLog, ClientKind, STATISTICS_INTERVAL_MS};
use exactly_kafka_client::Cluster;
use futures_util::TryStreamExt;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use super::{Database, Example};
use exactly_jobs::Transform;

/// One end of an input range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// The first offset (from) — unbounded.
    Start,
    /// The end of the topic when the read starts (to) — unbounded.
    End,
    /// An offset of every partition (from: inclusive, to: exclusive).
    Offset(i64),
    /// A time in ms since the Unix epoch: the first record at or after it.
    Time(i64),
}

/// A topic and a range of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRange {
    /// The topic.
    pub topic: String,
    /// Where the range starts.
    pub from: Bound,
    /// Where it ends.
    pub to: Bound,
}

impl std::fmt::Display for SourceRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = |b: Bound| match b {
            Bound::Start | Bound::End => String::new(),
            Bound::Offset(o) => o.to_string(),
            Bound::Time(t) => {
                humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(t as u64)).to_string()
            }
        };
        write!(f, "{}", self.topic)?;
        if (self.from, self.to) != (Bound::Start, Bound::End) {
            write!(f, ":{}..{}", b(self.from), b(self.to))?;
        }
        Ok(())
    }
}

/// Parses `TOPIC`, `TOPIC:FROM..TO` with offsets (of every partition; TO exclusive) or RFC 3339
/// times, either end optional (`orders:..5000`, `orders:2026-12-01T10:00:00Z..`).
pub fn parse_source(s: &str) -> Result<SourceRange, String> {
    let (topic, range) = match s.split_once(':') {
        Some((t, r)) => (t, Some(r)),
        None => (s, None),
    };
    if topic.is_empty() {
        return Err(format!("{s:?}: the topic is empty"));
    }
    let mut out = SourceRange {
        topic: topic.to_owned(),
        from: Bound::Start,
        to: Bound::End,
    };
    let Some(range) = range else {
        return Ok(out);
    };
    let Some((a, b)) = range.split_once("..") else {
        return Err(format!(
            "{s:?}: expected TOPIC:FROM..TO with offsets or RFC 3339 times (either end may be left out)"
        ));
    };
    let bound = |x: &str, open: Bound| -> Result<Bound, String> {
        let x = x.trim();
        if x.is_empty() {
            return Ok(open);
        }
        if let Ok(o) = x.parse::<i64>() {
            if o < 0 {
                return Err(format!("{x:?}: offsets are not negative"));
            }
            return Ok(Bound::Offset(o));
        }
        let t = humantime::parse_rfc3339_weak(x)
            .map_err(|e| format!("{x:?} is neither an offset nor an RFC 3339 time ({e})"))?;
        let ms = t
            .duration_since(UNIX_EPOCH)
            .map_err(|_| format!("{x:?}: before 1970"))?;
        Ok(Bound::Time(ms.as_millis() as i64))
    };
    out.from = bound(a, Bound::Start)?;
    out.to = bound(b, Bound::End)?;
    Ok(out)
}

/// `topic-partition@offset` of an entry's place.
pub(super) fn place(topic: &str, loc: u64) -> String {
    format!("{topic}-{}@{}", loc >> 48, loc & ((1 << 48) - 1))
}

/// Logs librdkafka's errors through the outage log (a broker that cannot be reached said once),
/// except the end of a partition: the reader asks for it (`enable.partition.eof`), it is no
/// error here.
struct Quiet;

const BROKER_LOG: BrokerLog = BrokerLog::new(ClientKind::Verify);

impl ClientContext for Quiet {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        BROKER_LOG.log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() != Some(RDKafkaErrorCode::PartitionEOF) {
            BROKER_LOG.error(&error, reason);
        }
    }

    fn stats_raw(&self, statistics: &[u8]) {
        BROKER_LOG.statistics(statistics);
    }
}

impl ConsumerContext for Quiet {}

type Reader = BaseConsumer<Quiet>;

/// A read_committed consumer of `group` (librdkafka needs one even for assigned partitions; it
/// commits nothing).
fn consumer(cluster: &Cluster, group: &str) -> Result<Reader> {
    let mut c = cluster.client_config().map_err(anyhow::Error::msg)?;
    c.set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        // The end of a broker outage for the log (parsed only during one).
        .set("statistics.interval.ms", STATISTICS_INTERVAL_MS)
        // Bounded memory: librdkafka's prefetch queue would otherwise hold up to 64 MB per
        // partition.
        .set("queued.max.messages.kbytes", "16384")
        .set("fetch.max.bytes", "8388608")
        // A queue at its bound fetches again after this long (librdkafka's default, 1 s, held
        // the read to ~130 000 records a second at a fifth of a core), as the source's does.
        .set("fetch.queue.backoff.ms", "10");
    c.create_with_context(Quiet).context("creating the verifying consumer")
}

/// Offsets of `topic`'s partitions at or after `ms` (the end when none).
fn offsets_at(
    c: &Reader,
    topic: &str,
    parts: &[i32],
    ms: i64,
    ends: &BTreeMap<i32, i64>,
    stall: Duration,
) -> Result<BTreeMap<i32, i64>> {
    let found = asking_again(topic, stall, || {
        let mut tpl = TopicPartitionList::new();
        for p in parts {
            tpl.add_partition_offset(topic, *p, Offset::Offset(ms))?;
        }
        let found = c.offsets_for_times(tpl, Duration::from_secs(30))?;
        // A partition's own error, a moving leader's asked again like the call's.
        match found.elements().iter().find_map(|e| e.error().err()) {
            Some(e) => Err(e),
            None => Ok(found),
        }
    })
    .with_context(|| format!("looking up the offsets of {topic} at a time"))?;
    let mut out = BTreeMap::new();
    for e in found.elements() {
        let o = match e.offset() {
            Offset::Offset(o) => o,
            // No record at or after the time.
            _ => ends[&e.partition()],
        };
        out.insert(e.partition(), o);
    }
    Ok(out)
}

/// A view of `topic` to read it through instead of the first one (`md`, whose ends are `highs`),
/// when the first is not the view most brokers share: the address of a broker whose own view names,
/// for every partition, the leader a strict majority of the brokers' views names, and the ends it
/// gives. A broker cut off from the others (a network partition, or just back from one) still
/// answers for the partitions it led, with the ends they had when it was cut off, and a client
/// whose metadata came from it reads from it — too little. `None`: the first view is the
/// majority's, or there is no majority (the first view is kept).
fn fresher_view(
    cluster: &Cluster,
    group: &str,
    topic: &str,
    parts: &[i32],
    highs: &BTreeMap<i32, i64>,
    md: &rdkafka::metadata::Metadata,
) -> Option<(String, BTreeMap<i32, i64>)> {
    let leaders_in = |md: &rdkafka::metadata::Metadata| -> BTreeMap<i32, i32> {
        md.topics()
            .iter()
            .filter(|t| t.name() == topic)
            .flat_map(|t| t.partitions().iter().map(|p| (p.id(), p.leader())))
            .collect()
    };
    let first = leaders_in(md);
    // (address, leader of each partition, end of each partition)
    type View = (String, BTreeMap<i32, i32>, BTreeMap<i32, i64>);
    let mut views: Vec<View> = Vec::new();
    for broker in md.brokers() {
        let server = format!("{}:{}", broker.host(), broker.port());
        let one = Cluster {
            bootstrap: server.clone(),
            ..cluster.clone()
        };
        let Ok(c) = consumer(&one, group) else {
            continue;
        };
        let Ok(own) = c.fetch_metadata(Some(topic), Duration::from_secs(10)) else {
            continue;
        };
        let ends: Option<BTreeMap<i32, i64>> = parts
            .iter()
            .map(|p| {
                c.fetch_watermarks(topic, *p, Duration::from_secs(10))
                    .ok()
                    .map(|(_, hi)| (*p, hi))
            })
            .collect();
        if let Some(ends) = ends {
            views.push((server, leaders_in(&own), ends));
        }
    }
    let mut majority = BTreeMap::new();
    for p in parts {
        let mut named: BTreeMap<i32, usize> = BTreeMap::new();
        for (_, leaders, _) in &views {
            *named.entry(leaders.get(p).copied().unwrap_or(-1)).or_default() += 1;
        }
        let leader = named
            .iter()
            .find(|(l, n)| **l >= 0 && **n * 2 > views.len())
            .map(|(l, _)| *l)?;
        majority.insert(*p, leader);
    }
    let agrees = |leaders: &BTreeMap<i32, i32>| parts.iter().all(|p| leaders.get(p) == majority.get(p));
    if agrees(&first) {
        return None;
    }
    let (server, _, ends) = views
        .into_iter()
        .filter(|(_, leaders, _)| agrees(leaders))
        .max_by_key(|(_, _, ends)| ends.values().sum::<i64>())?;
    tracing::debug!(topic, first = ?highs, "The first view of the topic was not the majority's.");
    Some((server, ends))
}

fn progress_bar(what: &str, topic: &str, total: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} records ({per_sec}, {eta} left)")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(format!("reading {what} {topic}"));
    bar
}

/// Reads `range` of `topic` (read_committed), calling `f(place, key, value)` for each record in
/// offset order per partition. Progress on stderr (a bar on a terminal, a line every 10 s
/// otherwise).
pub(super) fn read_topic(
    cluster: &Cluster,
    group: &str,
    topic: &str,
    range: &SourceRange,
    what: &str,
    stall: Duration,
    mut f: impl FnMut(u64, Option<&[u8]>, Option<&[u8]>) -> Result<()>,
) -> Result<()> {
    let mut c = consumer(cluster, group)?;
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(30))
        .with_context(|| format!("reading the metadata of {topic} from {}", cluster.bootstrap))?;
    let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
        bail!("{topic}: no such topic");
    };
    if let Some(e) = t.error() {
        bail!("{topic}: {}", RDKafkaErrorCode::from(e));
    }
    let parts: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
    if parts.is_empty() {
        bail!("{topic}: no such topic (no partitions)");
    }
    let mut lows = BTreeMap::new();
    let mut highs = BTreeMap::new();
    for p in &parts {
        // A partition without a leader for a moment (a broker failing over) is asked again.
        let (lo, hi) = asking_again(&format!("{topic}/{p}"), stall, || {
            c.fetch_watermarks(topic, *p, Duration::from_secs(30))
        })
        .with_context(|| format!("reading the offsets of {topic}-{p}"))?;
        lows.insert(*p, lo);
        highs.insert(*p, hi);
    }
    if let Some((server, ends)) = fresher_view(cluster, group, topic, &parts, &highs, &md) {
        tracing::warn!(
            topic,
            server = %server,
            "The first view of {topic}'s partitions (ends {highs:?}) names other leaders than most brokers do; {server}'s view is theirs (ends {ends:?}): a broker answered for partitions it no longer leads (cut off from the others, or just back). Reading through {server}'s view."
        );
        highs = ends;
        c = consumer(
            &Cluster {
                bootstrap: server,
                ..cluster.clone()
            },
            group,
        )?;
    }
    let starts = match range.from {
        Bound::Start | Bound::End => lows.clone(),
        Bound::Offset(o) => lows.iter().map(|(p, lo)| (*p, o.max(*lo))).collect(),
        Bound::Time(ms) => offsets_at(&c, topic, &parts, ms, &highs, stall)?,
    };
    let ends = match range.to {
        Bound::Start | Bound::End => highs.clone(),
        Bound::Offset(o) => highs.iter().map(|(p, hi)| (*p, o.min(*hi))).collect(),
        Bound::Time(ms) => offsets_at(&c, topic, &parts, ms, &highs, stall)?,
    };
    let mut tpl = TopicPartitionList::new();
    let mut open = BTreeSet::new();
    let mut total = 0u64;
    for p in &parts {
        let (s, e) = (starts[p], ends[p]);
        if s < e {
            tpl.add_partition_offset(topic, *p, Offset::Offset(s))?;
            open.insert(*p);
            total += (e - s) as u64;
        }
    }
    if open.is_empty() {
        return Ok(());
    }
    c.assign(&tpl).with_context(|| format!("assigning {topic}"))?;
    let bar = progress_bar(what, topic, total);
    let terminal = !bar.is_hidden();
    let started = Instant::now();
    let mut last_line = Instant::now();
    let mut last_record = Instant::now();
    let mut read = 0u64;
    while !open.is_empty() {
        if last_record.elapsed() > stall {
            bail!(
                "reading {topic}: no record for {}s with partitions {open:?} not at their end (a transaction left open keeps read_committed readers waiting: `exactly txn list`)",
                stall.as_secs()
            );
        }
        if !terminal && last_line.elapsed() >= Duration::from_secs(10) {
            eprintln!(
                "exactly verify: reading {what} {topic}: {read} of at most {total} records, {}s",
                started.elapsed().as_secs()
            );
            last_line = Instant::now();
        }
        match c.poll(Duration::from_millis(200)) {
            None => {}
            Some(Ok(m)) => {
                let p = m.partition();
                if !open.contains(&p) {
                    continue;
                }
                // (Only partitions still read count: a closed one's records say nothing of a
                // partition held below its end by an open transaction.)
                last_record = Instant::now();
                let end = ends[&p];
                if m.offset() >= end {
                    open.remove(&p);
                    continue;
                }
                read += 1;
                bar.inc(1);
                f(((p as u64) << 48) | m.offset() as u64, m.key(), m.payload())?;
                if m.offset() + 1 >= end {
                    open.remove(&p);
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                if !open.contains(&p) {
                    continue;
                }
                last_record = Instant::now();
                // At the end as the partition's leader sees it now — which, for a moment, can be
                // below the end read at the start: a node back from a network partition, leader
                // again, whose high watermark has not caught up yet (seen: 410 of 1 880 records
                // reported lost that a read_committed reader found a moment before). Done only
                // once the reader's position is at the end read at the start (past the markers
                // and aborted records there); with none yet, it is where the read started.
                if position(&c, topic, p)?.unwrap_or(starts[&p]) >= ends[&p] {
                    open.remove(&p);
                }
            }
            Some(Err(e)) => return Err(e).with_context(|| format!("reading {topic}")),
        }
    }
    bar.finish_and_clear();
    Ok(())
}

/// The offset `c` reads next in `topic`-`p` (`None` when it has none).
fn position<C: ConsumerContext>(c: &BaseConsumer<C>, topic: &str, p: i32) -> Result<Option<i64>> {
    let at = c
        .position()
        .with_context(|| format!("the reader's position in {topic}-{p}"))?;
    Ok(at.find_partition(topic, p).and_then(|e| match e.offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    }))
}

/// The examples behind `(hash, places)`: each record read again at its first place, its id
/// taken after `transforms`.
pub(super) async fn resolve(
    cluster: &Cluster,
    group: &str,
    topic: &str,
    id: &str,
    transforms: &[Transform],
    list: Vec<(u128, Vec<u64>)>,
) -> Result<Vec<Example>> {
    if list.is_empty() {
        return Ok(Vec::new());
    }
    let (cluster, topic, id, transforms) = (cluster.clone(), topic.to_owned(), id.to_owned(), transforms.to_vec());
    let group = group.to_owned();
    tokio::task::spawn_blocking(move || -> Result<Vec<Example>> {
        let c = consumer(&cluster, &group)?;
        let mut out = Vec::new();
        for (_, locs) in list {
            let first = locs[0];
            let (p, offset) = ((first >> 48) as i32, (first & ((1 << 48) - 1)) as i64);
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(&topic, p, Offset::Offset(offset))?;
            c.assign(&tpl)?;
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut id_found = None;
            while Instant::now() < deadline {
                match c.poll(Duration::from_millis(200)) {
                    Some(Ok(m)) if m.partition() == p && m.offset() == offset => {
                        id_found = Some(match super::read_id(&id, m.key(), m.payload(), &transforms) {
                            super::Read::Id(text, _) => text,
                            // E.g. delimited text: show the record as it is.
                            _ => {
                                let raw = String::from_utf8_lossy(m.payload().unwrap_or_default());
                                format!("(record {:?})", raw.chars().take(80).collect::<String>())
                            }
                        });
                        break;
                    }
                    Some(Ok(m)) if m.offset() > offset => break,
                    _ => {}
                }
            }
            out.push(Example {
                id: id_found.unwrap_or_else(|| "(could not be read again)".into()),
                at: locs.iter().take(5).map(|l| place(&topic, *l)).collect(),
            });
        }
        Ok(out)
    })
    .await?
}

/// Reads column `id` of every row of `table` in `db`, calling `f(row number, id)` with the id as
/// text; returns the rows and those whose id is NULL.
pub(super) async fn read_table(
    db: Database,
    url: &str,
    password_file: Option<&std::path::Path>,
    table: &str,
    id: &str,
    f: impl FnMut(u64, &str) -> Result<()>,
) -> Result<(u64, u64)> {
    match db {
        Database::Mysql => {
            let plain = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$');
            if !plain(table) || !plain(id) {
                bail!("{table:?}.{id:?}: table and column names of letters, digits, '_' and '$' only");
            }
            let mut conn = exactly_mysql_sink::connect_url(url, password_file).await?;
            let sql = format!("SELECT CAST(`{id}` AS CHAR) FROM `{table}`");
            read_rows(sqlx::query(&sql).fetch(&mut conn), table, id, f).await
        }
        Database::Postgres => {
            // As the PostgreSQL sink names them: `table` or `schema.table`, quoted.
            let plain = |s: &str| {
                !s.is_empty()
                    && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && !s.starts_with(|c: char| c.is_ascii_digit())
            };
            let quoted = match table.split_once('.') {
                Some((schema, name)) if plain(schema) && plain(name) => format!("\"{schema}\".\"{name}\""),
                None if plain(table) => format!("\"{table}\""),
                _ => {
                    bail!("{table:?}: a table (or schema.table) of letters, digits and '_', not starting with a digit")
                }
            };
            if !plain(id) {
                bail!("--id {id:?}: a column of letters, digits and '_', not starting with a digit");
            }
            let mut conn = exactly_postgres_sink::connect_url(url, password_file).await?;
            let sql = format!("SELECT \"{id}\"::text FROM {quoted}");
            read_rows(sqlx::query(&sql).fetch(&mut conn), table, id, f).await
        }
    }
}

/// Streams the rows of a one-column query (the id as text), with a progress bar.
async fn read_rows<R: sqlx::Row>(
    mut rows: futures_util::stream::BoxStream<'_, Result<R, sqlx::Error>>,
    table: &str,
    id: &str,
    mut f: impl FnMut(u64, &str) -> Result<()>,
) -> Result<(u64, u64)>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("reading table {prefix}: {pos} rows ({per_sec})").expect("a valid template"),
    );
    bar.set_prefix(table.to_owned());
    let (mut n, mut null) = (0u64, 0u64);
    while let Some(row) = rows
        .try_next()
        .await
        .with_context(|| format!("reading table {table}"))?
    {
        let v: Option<String> = row
            .try_get(0)
            .with_context(|| format!("reading column {id} of {table}"))?;
        match v {
            Some(v) => f(n, &v)?,
            None => null += 1,
        }
        n += 1;
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok((n, null))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_print() {
        let r = parse_source("orders").unwrap();
        assert_eq!((r.from, r.to), (Bound::Start, Bound::End));
        assert_eq!(r.to_string(), "orders");
        let r = parse_source("orders:100..200").unwrap();
        assert_eq!((r.from, r.to), (Bound::Offset(100), Bound::Offset(200)));
        assert_eq!(r.to_string(), "orders:100..200");
        let r = parse_source("orders:..200").unwrap();
        assert_eq!((r.from, r.to), (Bound::Start, Bound::Offset(200)));
        let r = parse_source("orders:2026-12-01T10:00:00Z..").unwrap();
        assert_eq!(r.from, Bound::Time(1_796_119_200_000));
        assert_eq!(r.to, Bound::End);
        assert!(parse_source("orders:abc..").is_err());
        assert!(parse_source("orders:100").is_err());
        assert!(parse_source(":1..2").is_err());
        assert_eq!(place("t", (2 << 48) | 17), "t-2@17");
    }
}
