//! `exactly txn list|abort --prefix P`: the hanging-transaction tool. Lists the open Kafka
//! transactions of a transactional-id prefix with their age and partitions, and aborts them —
//! sparing those a retained checkpoint or savepoint still has to commit, unless forced.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use exactly_core::storage::Storage;
use exactly_kafka_client::KafkaSecurity;
use exactly_kafka_sink::admin::{abort_transaction, list_transactions, Cluster, TransactionInfo};
use exactly_kafka_sink::KafkaCommittable;
use serde::Serialize;

use crate::checkpoints;

/// A transaction as listed.
#[derive(Debug, Clone, Serialize)]
pub struct Listed {
    /// Transactional id.
    pub transactional_id: String,
    /// Coordinator state (Ongoing, Empty, CompleteCommit, ...).
    pub state: String,
    /// Producer id.
    pub producer_id: i64,
    /// Producer epoch.
    pub producer_epoch: i16,
    /// Age of the open transaction (ms), when one is open.
    pub age_ms: Option<i64>,
    /// Transaction timeout (ms).
    pub timeout_ms: i32,
    /// Partitions of the open transaction ("topic-partition").
    pub partitions: Vec<String>,
    /// Whether a stored checkpoint or savepoint has to commit this very transaction.
    pub needed_by: Option<String>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A Kafka committable found in a stored snapshot.
struct Needed {
    committable: KafkaCommittable,
    snapshot: String,
}

/// Every Kafka committable stored under `dir`.
fn needed(dir: &Path) -> Result<Vec<Needed>> {
    let (all, bad) = checkpoints::list(dir)?;
    if let Some((p, e)) = bad.first() {
        bail!(
            "cannot read {} ({e}): without it, transactions it needs could be aborted; fix or move it, or use --force",
            p.display()
        );
    }
    let mut out = Vec::new();
    for l in all {
        let s = Storage::open_path(&l.path).with_context(|| format!("reading {}", l.path.display()))?;
        for p in checkpoints::contents(&s.meta).1 {
            // Committables of other sinks (MySQL xids) do not decode as Kafka ones.
            if let Ok(committable) = serde_json::from_value::<KafkaCommittable>(p.committable.clone()) {
                out.push(Needed {
                    committable,
                    snapshot: format!("{} {}", l.kind, l.path.display()),
                });
            }
        }
    }
    Ok(out)
}

fn is_needed(t: &TransactionInfo, needed: &[Needed]) -> Option<String> {
    if t.state != "Ongoing" {
        return None; // committed, aborted or finishing: nothing left to spare
    }
    needed
        .iter()
        .find(|n| {
            n.committable.transactional_id == t.transactional_id
                && n.committable
                    .is_same_transaction(t.producer_id, t.producer_epoch, t.start_time_ms)
        })
        .map(|n| n.snapshot.clone())
}

/// Kafka security settings from `path`: a TOML file of them (`security.protocol`, `sasl.*`,
/// `ssl.*`, at the top or in a `[kafka]` table), or a job file, whose `[kafka]` section is used
/// (none: plaintext). Checked as a job's are.
pub fn kafka_config(path: &Path) -> Result<KafkaSecurity> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let value: toml::Table = toml::from_str(&text).with_context(|| format!("{} is not TOML", path.display()))?;
    let section = match value.get("kafka") {
        Some(toml::Value::Table(t)) => t.clone(),
        Some(_) => bail!("{}: [kafka] must be a table", path.display()),
        None if value.contains_key("job") => toml::Table::new(),
        None => value,
    };
    let security: KafkaSecurity = toml::Value::Table(section)
        .try_into()
        .with_context(|| format!("{}: Kafka security settings", path.display()))?;
    security
        .validate()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(security)
}

/// Lists the transactions of `prefix`; `checkpoints` marks those a stored snapshot needs.
pub async fn list(cluster: &Cluster, prefix: &str, checkpoints: Option<&Path>) -> Result<Vec<Listed>> {
    if prefix.is_empty() {
        bail!("--prefix must not be empty");
    }
    let needed = match checkpoints {
        Some(d) => needed(d)?,
        None => Vec::new(),
    };
    let now = now_ms();
    let txns = list_transactions(cluster, prefix)
        .await
        .with_context(|| format!("listing transactions at {}", cluster.bootstrap))?;
    Ok(txns
        .into_iter()
        .map(|t| Listed {
            needed_by: is_needed(&t, &needed),
            transactional_id: t.transactional_id,
            state: t.state.clone(),
            producer_id: t.producer_id,
            producer_epoch: t.producer_epoch,
            age_ms: (t.state == "Ongoing" && t.start_time_ms > 0).then(|| now - t.start_time_ms),
            timeout_ms: t.timeout_ms,
            partitions: t.topic_partitions,
        })
        .collect())
}

/// Prints a list.
pub fn print(list: &[Listed]) {
    println!(
        "{:<36} {:<14} {:>10} {:>6} {:>9} {:>9}  PARTITIONS",
        "TRANSACTIONAL ID", "STATE", "PRODUCER", "EPOCH", "AGE", "TIMEOUT"
    );
    for t in list {
        let age = t.age_ms.map_or("-".into(), |a| {
            humantime::format_duration(Duration::from_millis(a.max(0) as u64 / 1000 * 1000)).to_string()
        });
        let timeout = humantime::format_duration(Duration::from_millis(t.timeout_ms.max(0) as u64)).to_string();
        let mut parts = t.partitions.join(",");
        if let Some(n) = &t.needed_by {
            parts.push_str(&format!("  (needed by {n})"));
        }
        println!(
            "{:<36} {:<14} {:>10} {:>6} {:>9} {:>9}  {}",
            t.transactional_id, t.state, t.producer_id, t.producer_epoch, age, timeout, parts
        );
    }
}

/// What `abort` did to one transaction.
#[derive(Debug, Clone, Serialize)]
pub struct AbortResult {
    /// Transactional id.
    pub transactional_id: String,
    /// "aborted", "spared (needed by ...)", "would abort" (dry run) or "failed: ...".
    pub outcome: String,
}

/// Aborts the open transactions of `prefix`. Those a snapshot under `checkpoints` still has to
/// commit are spared unless `force`; without `checkpoints`, only `force` allows aborting.
pub async fn abort(
    cluster: &Cluster,
    prefix: &str,
    checkpoints: Option<&Path>,
    force: bool,
    dry_run: bool,
) -> Result<Vec<AbortResult>> {
    if checkpoints.is_none() && !force {
        bail!(
            "give --checkpoints DIR (the job's checkpoint directory, savepoints included) so that transactions a checkpoint still has to commit are spared, or --force to abort them all"
        );
    }
    let mut out = Vec::new();
    for t in list(cluster, prefix, checkpoints).await? {
        if t.state != "Ongoing" {
            continue;
        }
        let outcome = match (&t.needed_by, force, dry_run) {
            (Some(n), false, _) => format!("spared (needed by {n}; --force aborts it and loses its records)"),
            (_, _, true) => "would abort".into(),
            _ => match abort_transaction(cluster, &t.transactional_id, Duration::from_secs(60)).await {
                Ok(()) => "aborted".into(),
                Err(e) => format!("failed: {e}"),
            },
        };
        out.push(AbortResult {
            transactional_id: t.transactional_id,
            outcome,
        });
    }
    Ok(out)
}
