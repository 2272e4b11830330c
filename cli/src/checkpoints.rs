//! `exactly checkpoints list|inspect`: what stored checkpoints and savepoints hold — ids, times,
//! sizes, the source offsets they restore and the transactions they still have to commit.

use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use exactly_core::checkpoint::CheckpointMetadata;
use exactly_core::storage::Storage;
use exactly_core::SnapshotKind;
use serde::Serialize;
use serde_json::Value;

/// Union state names the toolkit's connectors use.
const SOURCE_OFFSETS: &str = "kafka-source-offsets";
const COMMITTABLES: &str = "two-phase-committables";

/// One stored snapshot, as listed.
#[derive(Debug, Clone, Serialize)]
pub struct Listed {
    /// Its directory.
    pub path: PathBuf,
    /// Checkpoint id.
    pub id: u64,
    /// "checkpoint" or "savepoint".
    pub kind: String,
    /// Job name.
    pub job: String,
    /// When it completed (RFC 3339).
    pub completed: String,
    /// State size (bytes).
    pub size_bytes: u64,
    /// Operator uids with state.
    pub operators: Vec<String>,
}

/// A partition offset a snapshot restores.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Offset {
    /// Operator uid.
    pub operator: String,
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Next offset to read.
    pub next_offset: i64,
    /// The topic's ID when the offset was recorded (absent in checkpoints of earlier builds): a
    /// topic recreated since has another.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topic_id: Option<String>,
}

/// A transaction a snapshot still has to commit on restore.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PendingTransaction {
    /// Operator uid.
    pub operator: String,
    /// The checkpoint whose barrier closed it.
    pub checkpoint_id: u64,
    /// Subtask that pre-committed it.
    pub subtask: u32,
    /// The committable as stored (transactional id, producer id and epoch for Kafka; XA ids for
    /// MySQL).
    pub committable: Value,
}

/// Everything `inspect` shows.
#[derive(Debug, Clone, Serialize)]
pub struct Inspected {
    /// As listed.
    #[serde(flatten)]
    pub listed: Listed,
    /// When it was triggered (RFC 3339).
    pub triggered: String,
    /// Per operator: parallelism and state bytes per subtask.
    pub operators: Vec<OperatorSummary>,
    /// Source offsets.
    pub offsets: Vec<Offset>,
    /// Transactions to commit on restore.
    pub pending_transactions: Vec<PendingTransaction>,
}

/// An operator's state in a snapshot.
#[derive(Debug, Clone, Serialize)]
pub struct OperatorSummary {
    /// uid.
    pub uid: String,
    /// Parallelism when taken.
    pub parallelism: u32,
    /// Inline state entries.
    pub entries: usize,
    /// Keyed-state files.
    pub files: usize,
}

fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

fn kind(k: SnapshotKind) -> String {
    match k {
        SnapshotKind::Checkpoint => "checkpoint".into(),
        SnapshotKind::Savepoint => "savepoint".into(),
    }
}

fn listed(path: &Path, meta: &CheckpointMetadata) -> Listed {
    Listed {
        path: path.to_owned(),
        id: meta.id,
        kind: kind(meta.kind),
        job: meta.job.clone(),
        completed: rfc3339(meta.completed_ms),
        size_bytes: meta.state_size(),
        operators: meta.operators.keys().cloned().collect(),
    }
}

/// Every directory under `root` (itself included, six levels deep: a named savepoint of one
/// range of a split job sits at `checkpoints/savepoints/subtasks-…/NAME/savepoint-N`) that holds a
/// snapshot.
fn snapshot_dirs(root: &Path) -> Result<Vec<PathBuf>> {
    let is_snapshot = |p: &Path| Storage::is_snapshot(p).with_context(|| format!("reading {}", p.display()));
    if !Storage::is_url(root) && !root.is_dir() {
        bail!("{} is not a directory", root.display());
    }
    let mut out = Vec::new();
    let mut stack = vec![(root.to_owned(), 0)];
    while let Some((dir, depth)) = stack.pop() {
        if is_snapshot(&dir)? {
            out.push(dir);
            continue;
        }
        if depth == 6 {
            continue;
        }
        let names = Storage::list_dirs(&dir).with_context(|| format!("listing {}", dir.display()))?;
        for name in names {
            if name != "shared" && !name.starts_with("rocksdb") {
                stack.push((dir.join(name), depth + 1));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Snapshot directories that could not be read, with the reason.
pub type Unreadable = Vec<(PathBuf, String)>;

/// Lists every checkpoint and savepoint under `root`, oldest first within each directory.
/// Unreadable ones are reported in the second list.
pub fn list(root: &Path) -> Result<(Vec<Listed>, Unreadable)> {
    let mut ok = Vec::new();
    let mut bad = Vec::new();
    for dir in snapshot_dirs(root)? {
        match Storage::open_path(&dir) {
            Ok(s) => ok.push(listed(&dir, &s.meta)),
            Err(e) => bad.push((dir, e.to_string())),
        }
    }
    ok.sort_by(|a, b| (a.path.parent(), a.id).cmp(&(b.path.parent(), b.id)));
    Ok((ok, bad))
}

/// Offsets and pending transactions recorded in `meta`.
pub fn contents(meta: &CheckpointMetadata) -> (Vec<Offset>, Vec<PendingTransaction>) {
    let mut offsets = Vec::new();
    let mut pending = Vec::new();
    for (uid, op) in &meta.operators {
        for sub in &op.subtasks {
            for entry in sub.union_state.get(SOURCE_OFFSETS).into_iter().flatten() {
                if let Ok(v) = serde_json::from_slice::<Value>(entry) {
                    let tp = &v["tp"];
                    offsets.push(Offset {
                        operator: uid.clone(),
                        topic: tp["topic"].as_str().unwrap_or("?").to_owned(),
                        partition: tp["partition"].as_i64().unwrap_or(-1) as i32,
                        next_offset: v["next_offset"].as_i64().unwrap_or(-1),
                        topic_id: v["topic_id"].as_str().map(str::to_owned),
                    });
                }
            }
            for entry in sub.union_state.get(COMMITTABLES).into_iter().flatten() {
                if let Ok((_, id, origin, c)) = serde_json::from_slice::<(u32, u64, u32, Value)>(entry) {
                    pending.push(PendingTransaction {
                        operator: uid.clone(),
                        checkpoint_id: id,
                        subtask: origin,
                        committable: c,
                    });
                }
            }
        }
    }
    offsets.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    (offsets, pending)
}

/// Inspects one snapshot directory, or the latest snapshot under a checkpoint root.
pub fn inspect(path: &Path) -> Result<Inspected> {
    let dir = if Storage::is_snapshot(path).with_context(|| format!("reading {}", path.display()))? {
        path.to_owned()
    } else {
        let (all, _) = list(path)?;
        match all.iter().filter(|l| l.kind == "checkpoint").max_by_key(|l| l.id) {
            Some(l) => l.path.clone(),
            None => bail!("no checkpoint under {}", path.display()),
        }
    };
    let s = Storage::open_path(&dir).with_context(|| format!("reading {}", dir.display()))?;
    let meta = &s.meta;
    let (offsets, pending_transactions) = contents(meta);
    Ok(Inspected {
        listed: listed(&dir, meta),
        triggered: rfc3339(meta.timestamp_ms),
        operators: meta
            .operators
            .iter()
            .map(|(uid, op)| OperatorSummary {
                uid: uid.clone(),
                parallelism: op.parallelism,
                entries: op
                    .subtasks
                    .iter()
                    .map(|s| {
                        s.list_state
                            .values()
                            .chain(s.union_state.values())
                            .map(Vec::len)
                            .sum::<usize>()
                    })
                    .sum(),
                files: op
                    .subtasks
                    .iter()
                    .filter_map(|s| s.keyed.as_ref())
                    .map(|k| k.files.len())
                    .sum(),
            })
            .collect(),
        offsets,
        pending_transactions,
    })
}

/// Human-readable bytes.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Prints `list` as a table.
pub fn print_list(all: &[Listed], bad: &[(PathBuf, String)]) {
    println!(
        "{:<6} {:<10} {:<24} {:>10}  {:<20} PATH",
        "ID", "KIND", "COMPLETED", "SIZE", "JOB"
    );
    for l in all {
        println!(
            "{:<6} {:<10} {:<24} {:>10}  {:<20} {}",
            l.id,
            l.kind,
            l.completed,
            bytes(l.size_bytes),
            l.job,
            l.path.display()
        );
    }
    for (p, e) in bad {
        println!("{:<6} {:<10} {}: {e}", "?", "unreadable", p.display());
    }
}

/// Prints `inspect` for people.
pub fn print_inspected(i: &Inspected) {
    let l = &i.listed;
    println!("{} {} of job {:?}", l.kind, l.id, l.job);
    println!("  path:      {}", l.path.display());
    println!("  triggered: {}", i.triggered);
    println!("  completed: {}", l.completed);
    println!("  size:      {}", bytes(l.size_bytes));
    println!("operators:");
    for o in &i.operators {
        println!(
            "  {:<20} parallelism {:<3} entries {:<5} keyed files {}",
            o.uid, o.parallelism, o.entries, o.files
        );
    }
    println!("source offsets (next offset to read):");
    if i.offsets.is_empty() {
        println!("  none");
    }
    for o in &i.offsets {
        match &o.topic_id {
            Some(id) => println!("  {}-{:<4} {:<12} (topic ID {id})", o.topic, o.partition, o.next_offset),
            None => println!("  {}-{:<4} {}", o.topic, o.partition, o.next_offset),
        }
    }
    println!("transactions to commit on restore:");
    if i.pending_transactions.is_empty() {
        println!("  none");
    }
    for p in &i.pending_transactions {
        println!(
            "  {:<16} checkpoint {:<5} subtask {:<3} {}",
            p.operator, p.checkpoint_id, p.subtask, p.committable
        );
    }
}
