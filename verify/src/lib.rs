//! `exactly verify`: an audit of an exactly-once pipeline, independent of the job's own code
//! paths. It reads a range of the input topic and the whole output (a topic with its own
//! read_committed consumer, or a table with its own SQL) and reports the records lost,
//! duplicated and (optionally) out of order per key, with examples of each.
//!
//! Bounded memory: every record is reduced to a 128-bit hash of its id (xxh3) and where it was
//! read (24 bytes); runs of at most [`RUN`] entries are sorted and spilled to temporary files,
//! then merged — input and output side by side — so tens of millions of records take a few tens
//! of MB of memory and 24 bytes per record of temporary disk. The order check sorts its records
//! on disk the same way (by partition, key and offset: `order.rs`).

mod args;
mod order;
mod read;
mod report;
mod sorted;

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde_json::Value;

pub use args::{parse_output, Database, Output, VerifyArgs};
use exactly_jobs::{Job, SinkKind, Transform};
use order::OrderCheck;
pub use read::{parse_source, Bound, SourceRange};
pub use report::{print, Example, Report};
use sorted::{Entry, Sorter};

/// Entries per sorted run (24 bytes each on disk, 32 in memory: ~32 MB).
pub const RUN: usize = 1 << 20;

/// The memory of one sorted run of the order check (records with their order values): ~64 MB.
const ORDER_RUN_BYTES: usize = 64 << 20;

/// The canonical text of an id: strings as they are, anything else as JSON.
pub fn id_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn hash(id: &str) -> u128 {
    xxhash_rust::xxh3::xxh3_128(id.as_bytes())
}

/// The value of `path` (dots for nested fields).
fn field<'v>(v: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

/// The transforms that decide which input records reach the output, and the output's settings
/// from the job when the flags do not give them.
struct FromJob {
    transforms: Vec<Transform>,
    /// A MySQL sink whose records are delimited text: its mapping, to read the id column from
    /// the input as the sink does.
    columns: Option<exactly_mysql_sink::Mapping>,
    bootstrap: Option<String>,
    /// The job's consumer group: its ACLs let the verifier read (it commits nothing).
    group: Option<String>,
    /// The database, URL and password file of the job's table sink.
    database: Option<(Database, String, Option<PathBuf>)>,
    /// The input's field that fills the id column, when the sink maps a field of another name
    /// to it (a PostgreSQL column's `field`).
    input_field: Option<String>,
}

fn from_job(args: &VerifyArgs) -> Result<FromJob> {
    let Some(job) = &args.job else {
        return Ok(FromJob {
            transforms: Vec::new(),
            columns: None,
            bootstrap: None,
            group: None,
            database: None,
            input_field: None,
        });
    };
    let sink = match &args.sink {
        Some(name) => job.sinks.iter().find(|s| &s.name == name).with_context(|| {
            format!(
                "--sink {name}: the job has no such sink (its sinks: {})",
                job.sinks.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")
            )
        })?,
        None => {
            let matching: Vec<_> = job
                .sinks
                .iter()
                .filter(|s| match (&s.kind, &args.output) {
                    (SinkKind::Kafka(k), Output::Topic(t)) => &k.topic == t,
                    (SinkKind::Mysql(m), Output::Table(Database::Mysql, t)) => &m.table == t,
                    (SinkKind::Postgres(p), Output::Table(Database::Postgres, t)) => &p.table == t,
                    _ => false,
                })
                .collect();
            match (matching.as_slice(), job.sinks.as_slice()) {
                ([one], _) => *one,
                (_, [one]) => one,
                _ => bail!(
                    "the job has several sinks and none writes to {}: name one with --sink ({})",
                    args.output,
                    job.sinks.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")
                ),
            }
        }
    };
    let mut transforms = job.file.transforms.clone();
    transforms.extend(sink.transforms.iter().cloned());
    Ok(FromJob {
        transforms,
        columns: match &sink.kind {
            SinkKind::Mysql(m) if m.mapping.format != exactly_mysql_sink::Format::Json => Some(m.mapping.clone()),
            _ => None,
        },
        bootstrap: Some(job.file.source.bootstrap_servers.clone()),
        group: Some(job.file.source.group_id.clone()),
        database: match &sink.kind {
            SinkKind::Mysql(m) => Some((Database::Mysql, m.url.clone(), m.password_file.clone())),
            SinkKind::Postgres(p) => Some((Database::Postgres, p.url.clone(), p.password_file.clone())),
            SinkKind::Kafka(_) => None,
        },
        input_field: match &sink.kind {
            SinkKind::Postgres(p) => p
                .columns
                .iter()
                .find(|c| c.name == args.id)
                .and_then(|c| c.field.clone()),
            _ => None,
        },
    })
}

/// The security settings the audit reaches Kafka with: `--kafka-config`'s; plaintext (none) for
/// servers named by `--bootstrap-servers` without it — not the job's credentials, meant for its
/// own servers; else the job source's.
pub fn kafka_security<'a>(
    kafka_config: Option<&'a exactly_kafka_client::KafkaSecurity>,
    bootstrap: Option<&str>,
    job: Option<&'a Job>,
) -> Option<&'a exactly_kafka_client::KafkaSecurity> {
    match (kafka_config, bootstrap) {
        (Some(s), _) => Some(s),
        (None, Some(_)) => None,
        (None, None) => job.map(|j| &j.file.source.security),
    }
}

/// Runs the audit.
pub async fn verify(args: VerifyArgs) -> Result<Report> {
    if args.key.is_some() != args.order.is_some() {
        bail!("--key and --order go together: the order field is checked per key");
    }
    if args.key.is_some() && matches!(args.output, Output::Table(..)) {
        bail!("--key/--order check the order of a topic's records; rows of a table have no order");
    }
    let job = from_job(&args)?;
    if args.id.starts_with('@') {
        if args.id != "@key" && args.id != "@value" {
            bail!(
                "--id {}: a field name, or @key / @value (the record's key or value as it is)",
                args.id
            );
        }
        if matches!(args.output, Output::Table(..)) {
            bail!("--id {}: a table's id is a column", args.id);
        }
        if !job.transforms.is_empty() {
            bail!(
                "--id {}: the job's transforms change records; give the id field instead",
                args.id
            );
        }
    }
    let bootstrap = args
        .bootstrap
        .clone()
        .or(job.bootstrap.clone())
        .context("--bootstrap-servers is required (or --job, whose source names them)")?;
    let cluster = exactly_kafka_client::Cluster::with_security(
        &bootstrap,
        kafka_security(args.kafka_config.as_ref(), args.bootstrap.as_deref(), args.job.as_ref()),
    );
    let group = job
        .group
        .clone()
        .unwrap_or_else(|| format!("exactly-verify-{}", uuid::Uuid::new_v4()));
    let spill = args.spill_dir.clone().unwrap_or_else(std::env::temp_dir);
    let mut report = Report {
        source: args.source.to_string(),
        output: args.output.to_string(),
        input_records: 0,
        expected: 0,
        filtered: 0,
        input_unreadable: 0,
        input_repeated_ids: 0,
        output_records: 0,
        output_unreadable: 0,
        lost: 0,
        duplicated: 0,
        outside_input: 0,
        out_of_order: args.key.as_ref().map(|_| 0),
        spilled_runs: 0,
        exactly_once: false,
        lost_examples: Vec::new(),
        duplicated_examples: Vec::new(),
        outside_examples: Vec::new(),
        out_of_order_examples: Vec::new(),
    };

    // The input: which ids should appear, and how often (read from the field the sink fills the
    // id column from).
    let input_id = job.input_field.clone().unwrap_or_else(|| args.id.clone());
    let mut input = Sorter::new(&spill, RUN)?;
    {
        let (c, range, id) = (cluster.clone(), args.source.clone(), input_id.clone());
        let g = group.clone();
        let transforms = job.transforms.clone();
        // Delimited input mapped to columns: the id is the column of that name.
        let column = match &job.columns {
            Some(m) => Some((
                m.clone(),
                m.columns
                    .iter()
                    .position(|c| c.name == args.id)
                    .with_context(|| format!("--id {}: the job's MySQL mapping has no such column", args.id))?,
            )),
            None => None,
        };
        let stall = args.stall_timeout;
        let (sorter, counts) = tokio::task::spawn_blocking(move || -> Result<(Sorter, [u64; 3])> {
            let mut counts = [0u64; 3]; // read, filtered, unreadable
            read::read_topic(&c, &g, &range.topic, &range, "input", stall, |loc, key, value| {
                counts[0] += 1;
                let read = match &column {
                    Some((mapping, i)) => column_id(mapping, *i, value),
                    None => read_id(&id, key, value, &transforms),
                };
                match read {
                    Read::Id(text, _) => input.push(Entry { hash: hash(&text), loc }),
                    Read::Filtered => {
                        counts[1] += 1;
                        Ok(())
                    }
                    Read::Unreadable => {
                        counts[2] += 1;
                        Ok(())
                    }
                }
            })?;
            Ok((input, counts))
        })
        .await??;
        input = sorter;
        report.input_records = counts[0];
        report.filtered = counts[1];
        report.input_unreadable = counts[2];
        report.expected = counts[0] - counts[1] - counts[2];
    }

    // The output.
    let mut output = Sorter::new(&spill, RUN)?;
    let mut order_examples = Vec::new();
    let mut order_runs = 0;
    match &args.output {
        Output::Topic(topic) => {
            let topic_name = topic.clone();
            let (c, topic, id) = (cluster.clone(), topic.clone(), args.id.clone());
            let g = group.clone();
            let (key_field, order_field) = (args.key.clone(), args.order.clone());
            let (stall, max_examples) = (args.stall_timeout, args.examples);
            let all = SourceRange {
                topic: topic.clone(),
                from: Bound::Start,
                to: Bound::End,
            };
            let mut order = match args.key {
                Some(_) => Some(OrderCheck::new(&spill, RUN, ORDER_RUN_BYTES)?),
                None => None,
            };
            let (sorter, order, counts) =
                tokio::task::spawn_blocking(move || -> Result<(Sorter, Option<OrderCheck>, [u64; 2])> {
                    let mut counts = [0u64; 2]; // read, unreadable
                    read::read_topic(&c, &g, &topic, &all, "output", stall, |loc, key, value| {
                        counts[0] += 1;
                        let (record_id, v) = match read_id(&id, key, value, &[]) {
                            Read::Id(text, v) => (text, v),
                            Read::Filtered | Read::Unreadable => {
                                counts[1] += 1;
                                return Ok(());
                            }
                        };
                        let v = match (v, &key_field) {
                            (None, Some(_)) => value.and_then(|b| serde_json::from_slice::<Value>(b).ok()),
                            (v, _) => v,
                        };
                        if let (Some(order), Some(kf), Some(of), Some(v)) = (&mut order, &key_field, &order_field, &v) {
                            if let (Some(k), Some(o)) = (field(v, kf), field(v, of).and_then(OrderValue::of)) {
                                order.push(loc, &id_text(k), o)?;
                            }
                        }
                        output.push(Entry {
                            hash: hash(&record_id),
                            loc,
                        })
                    })?;
                    Ok((output, order, counts))
                })
                .await??;
            output = sorter;
            report.output_records = counts[0];
            report.output_unreadable = counts[1];
            if let Some(order) = order {
                order_runs = order.spilled();
                let found = tokio::task::spawn_blocking(move || order.finish(max_examples)).await??;
                report.out_of_order = Some(found.count);
                // Each example's id read again at its place; then the key's record before it.
                let list = found.examples.iter().map(|(_, this)| (0, vec![*this])).collect();
                order_examples = read::resolve(&cluster, &group, &topic_name, &args.id, &[], list).await?;
                for (e, (before, _)) in order_examples.iter_mut().zip(&found.examples) {
                    e.at.insert(0, read::place(&topic_name, *before));
                }
            }
        }
        Output::Table(db, table) => {
            let (url, password_file) = db_server(&args, &job, *db)?;
            let (n, unreadable) = read::read_table(*db, &url, password_file.as_deref(), table, &args.id, |row, id| {
                output.push(Entry {
                    hash: hash(id),
                    loc: row,
                })
            })
            .await?;
            report.output_records = n;
            report.output_unreadable = unreadable;
        }
    }

    // Input and output side by side, id by id.
    report.spilled_runs = input.spilled() + output.spilled() + order_runs;
    let mut lost = Vec::new();
    let mut duplicated = Vec::new();
    let mut outside = Vec::new();
    let mut ins = input.finish()?.peekable();
    let mut outs = output.finish()?.peekable();
    loop {
        let next = match (ins.peek(), outs.peek()) {
            (Some(Err(_)), _) => return Err(ins.next().expect("peeked").unwrap_err()),
            (_, Some(Err(_))) => return Err(outs.next().expect("peeked").unwrap_err()),
            (Some(Ok(a)), Some(Ok(b))) => a.hash.min(b.hash),
            (Some(Ok(a)), None) => a.hash,
            (None, Some(Ok(b))) => b.hash,
            (None, None) => break,
        };
        let take = |it: &mut std::iter::Peekable<sorted::Merged>| -> Result<Vec<u64>> {
            let mut locs = Vec::new();
            while let Some(Ok(e)) = it.peek() {
                if e.hash != next {
                    break;
                }
                locs.push(e.loc);
                it.next();
            }
            Ok(locs)
        };
        let in_locs = take(&mut ins)?;
        let out_locs = take(&mut outs)?;
        let (n_in, n_out) = (in_locs.len() as u64, out_locs.len() as u64);
        if n_in > 1 {
            report.input_repeated_ids += 1;
        }
        if n_in == 0 {
            report.outside_input += n_out;
            if outside.len() < args.examples {
                outside.push((next, out_locs));
            }
        } else if n_out < n_in {
            report.lost += n_in - n_out;
            if lost.len() < args.examples {
                lost.push((next, in_locs));
            }
        } else if n_out > n_in {
            report.duplicated += n_out - n_in;
            if duplicated.len() < args.examples {
                duplicated.push((next, out_locs));
            }
        }
    }

    // Examples: the ids behind the hashes, and where they were read.
    let input_topic = args.source.topic.clone();
    report.lost_examples = read::resolve(&cluster, &group, &input_topic, &input_id, &job.transforms, lost).await?;
    match &args.output {
        Output::Topic(t) => {
            report.duplicated_examples = read::resolve(&cluster, &group, t, &args.id, &[], duplicated).await?;
            report.outside_examples = read::resolve(&cluster, &group, t, &args.id, &[], outside).await?;
        }
        Output::Table(db, table) => {
            let (url, password_file) = db_server(&args, &job, *db)?;
            let mut wanted: BTreeMap<u128, (bool, u64)> = BTreeMap::new();
            for (h, locs) in &duplicated {
                wanted.insert(*h, (true, locs.len() as u64));
            }
            for (h, locs) in &outside {
                wanted.insert(*h, (false, locs.len() as u64));
            }
            if !wanted.is_empty() {
                let mut found: BTreeMap<u128, String> = BTreeMap::new();
                read::read_table(*db, &url, password_file.as_deref(), table, &args.id, |_, id| {
                    let h = hash(id);
                    if wanted.contains_key(&h) {
                        found.entry(h).or_insert_with(|| id.to_owned());
                    }
                    Ok(())
                })
                .await?;
                for (h, (dup, rows)) in wanted {
                    let e = Example {
                        id: found.get(&h).cloned().unwrap_or_else(|| format!("(hash {h:032x})")),
                        at: vec![format!("{rows} rows of {table}")],
                    };
                    if dup {
                        report.duplicated_examples.push(e);
                    } else {
                        report.outside_examples.push(e);
                    }
                }
            }
        }
    }
    report.out_of_order_examples = order_examples;
    let whole_input = args.source.from == Bound::Start && args.source.to == Bound::End;
    report.exactly_once = report.lost == 0
        && report.duplicated == 0
        && report.output_unreadable == 0
        && (!whole_input || report.outside_input == 0)
        && report.out_of_order.unwrap_or(0) == 0;
    Ok(report)
}

/// What a record says about its id.
enum Read {
    /// Its id, and its value as JSON when it was parsed.
    Id(String, Option<Value>),
    /// A transform dropped it.
    Filtered,
    /// No value, not JSON, or no id field.
    Unreadable,
}

/// The id of a record: `@key` and `@value` take the key or value bytes as they are; a field name
/// is looked up in the value (JSON) after `transforms`.
fn read_id(id: &str, key: Option<&[u8]>, value: Option<&[u8]>, transforms: &[Transform]) -> Read {
    let raw = |b: Option<&[u8]>| {
        b.map_or(Read::Unreadable, |b| {
            Read::Id(String::from_utf8_lossy(b).into_owned(), None)
        })
    };
    match id {
        "@key" => return raw(key),
        "@value" => return raw(value),
        _ => {}
    }
    let Some(Ok(mut v)) = value.map(serde_json::from_slice::<Value>) else {
        return Read::Unreadable;
    };
    let mut key = key.map(<[u8]>::to_vec);
    for t in transforms {
        match t.apply(&mut v, &mut key) {
            Ok(exactly_jobs::Change::Keep) => {}
            // A deletion carries no row to read an id from.
            Ok(_) => return Read::Filtered,
            Err(_) => return Read::Unreadable,
        }
    }
    match field(&v, id).map(id_text) {
        Some(text) => Read::Id(text, Some(v)),
        None => Read::Unreadable,
    }
}

/// The id of a delimited record: column `i` of `mapping`'s row, as MySQL would print it.
fn column_id(mapping: &exactly_mysql_sink::Mapping, i: usize, value: Option<&[u8]>) -> Read {
    use exactly_mysql_sink::SqlValue;
    let Some(Ok(row)) = value.map(|v| mapping.row(v)) else {
        return Read::Unreadable;
    };
    match row.get(i) {
        Some(SqlValue::Int(n)) => Read::Id(n.to_string(), None),
        Some(SqlValue::Float(f)) => Read::Id(f.to_string(), None),
        Some(SqlValue::Bool(b)) => Read::Id(u8::from(*b).to_string(), None),
        Some(SqlValue::Text(t)) => Read::Id(t.clone(), None),
        Some(SqlValue::Null) | None => Read::Unreadable,
    }
}

/// The server of a table output: `--mysql-url` / `--postgres-url` (`${NAME}` taken from the
/// environment, with `--db-password-file`), or the job's sink of that database (with its password
/// file).
fn db_server(args: &VerifyArgs, job: &FromJob, db: Database) -> Result<(String, Option<PathBuf>)> {
    let (flag, given, name) = match db {
        Database::Mysql => ("--mysql-url", &args.mysql_url, "MySQL"),
        Database::Postgres => ("--postgres-url", &args.postgres_url, "PostgreSQL"),
    };
    match (given, &job.database) {
        (Some(url), _) => Ok((
            exactly_core::secret::expand_env(url).map_err(|e| anyhow::anyhow!("{flag}: {e}"))?,
            args.db_password_file.clone(),
        )),
        (None, _) if args.db_password_file.is_some() => {
            bail!("--db-password-file is for the URL of --mysql-url / --postgres-url (a job's sink names its own password file)")
        }
        (None, Some((d, url, password_file))) if *d == db => Ok((url.clone(), password_file.clone())),
        _ => bail!("{flag} is required (or --job, whose {name} sink names it)"),
    }
}

/// An order field's value: numbers compare as numbers, strings as strings.
#[derive(Debug, Clone, PartialEq, PartialOrd)]
enum OrderValue {
    Number(f64),
    Text(String),
}

impl OrderValue {
    fn of(v: &Value) -> Option<OrderValue> {
        match v {
            Value::Number(n) => n.as_f64().map(OrderValue::Number),
            Value::String(s) => Some(OrderValue::Text(s.clone())),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
