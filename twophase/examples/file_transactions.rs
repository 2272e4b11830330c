//! A custom [`TwoPhaseCommitSink`] for an external system with transactions of its own — here a
//! directory, standing in for a database or object store:
//!
//! - a transaction is a file in `open/`, written as records arrive;
//! - pre-commit (at the checkpoint barrier) flushes it to disk and moves it to `prepared/`: it
//!   survives a crash from then on, and its name is the committable the checkpoint stores;
//! - commit (once the checkpoint is durable) moves it to `committed/`, where readers look. Already
//!   committed is success (commit must be idempotent); in neither place means the store lost it,
//!   which the driver reports as data loss rather than success;
//! - after a restart the driver commits the restored committables first; then this sink deletes
//!   what no checkpoint needs (files of this subtask left in `open/` or `prepared/` by the crash).
//!
//! The job runs numbers through a map that fails twice, as crashes would; the restart strategy
//! restarts it from the latest checkpoint each time. `committed/` must then hold every number
//! exactly once. The generic driver, [`TwoPhaseSink`], does the checkpoint bookkeeping.
//!
//! ```sh
//! cargo run -p exactly-twophase --example file_transactions
//! ```
//! (`cargo test` runs it too.) `docs/writing-a-connector.md` says what a real connector adds.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use exactly_core::coordinator::CheckpointConfig;
use exactly_core::restart::RestartStrategy;
use exactly_core::runtime::{InitContext, JobBuilder, JobConfig, SnapshotContext, Source, SourceStatus, SubtaskInfo};
use exactly_core::{CheckpointId, CoreError, ErrorClass};
use exactly_twophase::{CommitError, PreCommitted, RecoveryContext, TwoPhaseCommitSink, TwoPhaseSink};

/// The sink: one per subtask.
struct FileStore {
    root: PathBuf,
    subtask: u32,
}

/// An open transaction: its file.
struct OpenFile {
    name: String,
    file: std::io::BufWriter<std::fs::File>,
    records: usize,
}

fn io(action: &'static str, path: &Path, e: std::io::Error) -> CoreError {
    CoreError::io(action, path, e)
}

impl FileStore {
    fn dir(&self, state: &str) -> PathBuf {
        self.root.join(state)
    }

    /// Files of this subtask in `state` (names start with the subtask index).
    fn own_files(&self, state: &str) -> std::io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(self.dir(state))? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if name.starts_with(&format!("{}-", self.subtask)) {
                names.push(name);
            }
        }
        Ok(names)
    }
}

impl TwoPhaseCommitSink<u64> for FileStore {
    type Transaction = OpenFile;
    /// The file's name: enough to commit it after a restart.
    type Committable = String;

    async fn open(&mut self, info: &SubtaskInfo) -> exactly_twophase::Result<()> {
        self.subtask = info.index;
        for state in ["open", "prepared", "committed"] {
            let dir = self.dir(state);
            std::fs::create_dir_all(&dir).map_err(|e| io("creating", &dir, e))?;
        }
        Ok(())
    }

    async fn begin(&mut self, checkpoint_id: CheckpointId) -> exactly_twophase::Result<OpenFile> {
        // Unique per subtask and checkpoint; a uuid guards against a name reused after a restart
        // that goes back to an earlier checkpoint.
        let name = format!("{}-{checkpoint_id}-{}.txt", self.subtask, uuid::Uuid::new_v4().simple());
        let path = self.dir("open").join(&name);
        let file = std::fs::File::create(&path).map_err(|e| io("creating", &path, e))?;
        Ok(OpenFile {
            name,
            file: std::io::BufWriter::new(file),
            records: 0,
        })
    }

    async fn write(&mut self, txn: &mut OpenFile, records: Vec<u64>) -> exactly_twophase::Result<()> {
        for r in records {
            writeln!(txn.file, "{r}").map_err(|e| io("writing", Path::new(&txn.name), e))?;
            txn.records += 1;
        }
        Ok(())
    }

    async fn pre_commit(
        &mut self,
        txn: OpenFile,
        _checkpoint_id: CheckpointId,
    ) -> exactly_twophase::Result<PreCommitted<String, OpenFile>> {
        let from = self.dir("open").join(&txn.name);
        if txn.records == 0 {
            std::fs::remove_file(&from).map_err(|e| io("removing", &from, e))?;
            return Ok(PreCommitted::Empty);
        }
        // Durable before the checkpoint may complete: flushed, synced, then moved.
        let file = txn
            .file
            .into_inner()
            .map_err(|e| io("flushing", &from, e.into_error()))?;
        file.sync_all().map_err(|e| io("syncing", &from, e))?;
        let to = self.dir("prepared").join(&txn.name);
        std::fs::rename(&from, &to).map_err(|e| io("preparing", &to, e))?;
        Ok(PreCommitted::Committable(txn.name))
    }

    async fn commit(&mut self, name: &String) -> Result<(), CommitError> {
        let (from, to) = (self.dir("prepared").join(name), self.dir("committed").join(name));
        match std::fs::rename(&from, &to) {
            Ok(()) => Ok(()),
            // Committed before (a restart commits what the checkpoint holds, maybe again).
            Err(_) if to.exists() => Ok(()),
            // Neither prepared nor committed: the store lost it. Never report that as success.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(CommitError::Lost {
                what: format!("{name}, neither prepared nor committed"),
                source: Box::new(e),
            }),
            Err(e) => Err(CommitError::Retriable(Box::new(e))),
        }
    }

    async fn abort(&mut self, txn: OpenFile) -> exactly_twophase::Result<()> {
        let path = self.dir("open").join(&txn.name);
        drop(txn.file);
        std::fs::remove_file(&path).map_err(|e| io("removing", &path, e))
    }

    async fn abort_lingering(&mut self, ctx: &RecoveryContext<'_, String>) -> exactly_twophase::Result<()> {
        // Called after the restored committables were committed. Whatever this subtask left open
        // or prepared that no checkpoint holds is from a run that crashed: its records are read
        // again (they follow the restored checkpoint), so it must go. Committables other
        // subtasks restored are left to them.
        let needed: std::collections::BTreeSet<&String> = ctx.all_restored.iter().map(|(_, c)| c).collect();
        for state in ["open", "prepared"] {
            let dir = self.dir(state);
            for name in self.own_files(state).map_err(|e| io("listing", &dir, e))? {
                if !needed.contains(&name) {
                    let path = dir.join(&name);
                    std::fs::remove_file(&path).map_err(|e| io("removing", &path, e))?;
                }
            }
        }
        Ok(())
    }
}

/// Numbers `index, index + parallelism, …` below `total`; the next one is the state.
struct Numbers {
    next: u64,
    step: u64,
    total: u64,
}

impl Source<u64> for Numbers {
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> exactly_core::Result<()> {
        if let Some(b) = ctx.list_state("next").first() {
            self.next = serde_json::from_slice(b).map_err(|e| CoreError::Config(e.to_string()))?;
        }
        Ok(())
    }

    async fn poll_next(&mut self, out: &mut Vec<u64>) -> exactly_core::Result<SourceStatus> {
        if self.next >= self.total {
            return Ok(SourceStatus::End);
        }
        while out.len() < 50 && self.next < self.total {
            out.push(self.next);
            self.next += self.step;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        Ok(SourceStatus::More)
    }

    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> exactly_core::Result<()> {
        ctx.put_list_state("next", vec![serde_json::to_vec(&self.next).expect("a number")]);
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    let total = 20_000;
    let parallelism = 2;

    let mut checkpoints = CheckpointConfig::new(dir.path().join("checkpoints"));
    checkpoints.interval = Duration::from_millis(50);
    let mut config = JobConfig::new("file-transactions");
    config.checkpointing = Some(checkpoints);
    config.restart = RestartStrategy::FixedDelay {
        attempts: 5,
        delay: Duration::from_millis(100),
    };

    let failures = Arc::new(AtomicU32::new(2));
    let mut job = JobBuilder::new(config);
    job.source("numbers", parallelism, move |info| Numbers {
        next: u64::from(info.index),
        step: u64::from(info.parallelism),
        total,
    })
    .flat_map(move |n: u64, out| {
        // Two crashes, a third and two thirds of the way.
        if (n == total / 3 || n == 2 * total / 3)
            && failures
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| f.checked_sub(1))
                .is_ok()
        {
            return Err(CoreError::operator("crash", ErrorClass::Restart, "injected failure"));
        }
        out.emit(n)
    })
    .sink("files", move |_| {
        TwoPhaseSink::new(FileStore {
            root: store.clone(),
            subtask: 0,
        })
    });
    let outcome = job.build()?.run().await?;

    // What a reader of the store sees: the committed files only.
    let mut seen: BTreeMap<u64, u32> = BTreeMap::new();
    let committed = dir.path().join("store/committed");
    let mut files = 0;
    for entry in std::fs::read_dir(&committed)? {
        files += 1;
        for line in std::fs::read_to_string(entry?.path())?.lines() {
            *seen.entry(line.parse()?).or_default() += 1;
        }
    }
    let missing = (0..total).filter(|n| !seen.contains_key(n)).count();
    let duplicated = seen.values().filter(|c| **c > 1).count();
    let left = ["open", "prepared"]
        .iter()
        .map(|s| std::fs::read_dir(dir.path().join("store").join(s)).map(|d| d.count()))
        .sum::<std::io::Result<usize>>()?;
    println!(
        "{} numbers in {files} committed files: {missing} missing, {duplicated} duplicated; {left} files left open or prepared; {} checkpoints, {} restart(s)",
        seen.values().sum::<u32>(),
        outcome.checkpoints,
        outcome.restarts
    );
    anyhow::ensure!(outcome.restarts >= 1, "the injected failures restart the job");
    anyhow::ensure!(missing == 0 && duplicated == 0, "every number exactly once");
    anyhow::ensure!(seen.len() as u64 == total, "nothing but the numbers");
    anyhow::ensure!(left == 0, "nothing left behind");
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs() {
        super::main().expect("the example holds");
    }
}
