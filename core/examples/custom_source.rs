//! A custom [`Source`]: the lines of a text file, read from a byte offset that every checkpoint
//! records, so that a restart reads on from the last completed checkpoint — not from the start
//! (duplicates) and not from where the crashed run was (losses).
//!
//! The job: lines → keep those not starting with `#` → a small sink that makes its output
//! visible only when the checkpoint covering it completes. A map fails once, half-way, as a crash
//! would; the restart strategy restarts the job from the latest checkpoint. The output must hold
//! every line exactly once.
//!
//! ```sh
//! cargo run -p exactly-core --example custom_source
//! ```
//! (`cargo test` runs it too.)

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use exactly_core::coordinator::CheckpointConfig;
use exactly_core::restart::RestartStrategy;
use exactly_core::runtime::{InitContext, JobBuilder, JobConfig, Sink, SnapshotContext, Source, SourceStatus};
use exactly_core::{CheckpointId, CoreError, ErrorClass};

/// Reads `path` line by line from `offset`. The offset is the source's whole state.
struct LineSource {
    path: PathBuf,
    offset: u64,
    reader: Option<BufReader<std::fs::File>>,
}

impl Source<String> for LineSource {
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> exactly_core::Result<()> {
        // On a restore, list state holds what `snapshot_state` put there at the checkpoint the
        // job restores; when fresh, nothing (start at 0).
        if let Some(bytes) = ctx.list_state("offset").first() {
            let raw: [u8; 8] = bytes
                .as_slice()
                .try_into()
                .map_err(|_| CoreError::Config("offset state is not 8 bytes".into()))?;
            self.offset = u64::from_be_bytes(raw);
        }
        let mut file = std::fs::File::open(&self.path).map_err(|e| CoreError::io("opening", &self.path, e))?;
        file.seek(SeekFrom::Start(self.offset))
            .map_err(|e| CoreError::io("seeking in", &self.path, e))?;
        self.reader = Some(BufReader::new(file));
        Ok(())
    }

    async fn poll_next(&mut self, out: &mut Vec<String>) -> exactly_core::Result<SourceStatus> {
        let reader = self.reader.as_mut().expect("initialized");
        // A batch at a time, and return promptly: barriers are taken between polls.
        for _ in 0..100 {
            let mut line = String::new();
            let n = reader
                .read_line(&mut line)
                .map_err(|e| CoreError::io("reading", &self.path, e))?;
            if n == 0 {
                return Ok(SourceStatus::End);
            }
            self.offset += n as u64;
            out.push(line.trim_end().to_owned());
        }
        // A slow source, so that the run spans several checkpoints.
        tokio::time::sleep(Duration::from_millis(2)).await;
        Ok(SourceStatus::More)
    }

    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> exactly_core::Result<()> {
        // The barrier comes after every record returned so far: the offset of the next one is
        // exactly where a restore must continue.
        ctx.put_list_state("offset", vec![self.offset.to_be_bytes().to_vec()]);
        Ok(())
    }
}

/// Output visible only once the checkpoint after it completes (a two-phase sink in miniature;
/// see exactly-twophase for the real thing). `visible` plays the external system.
struct VisibleOnCompletion {
    open: Vec<String>,
    staged: BTreeMap<CheckpointId, Vec<String>>,
    visible: Arc<Mutex<BTreeMap<CheckpointId, Vec<String>>>>,
}

impl Sink<String> for VisibleOnCompletion {
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> exactly_core::Result<()> {
        // Output staged by the restored checkpoint is part of it: make it visible (idempotently:
        // keyed by its checkpoint id).
        for entry in ctx.list_state("staged") {
            let (id, lines): (CheckpointId, Vec<String>) =
                serde_json::from_slice(&entry).map_err(|e| CoreError::Config(e.to_string()))?;
            self.visible.lock().unwrap().insert(id, lines);
        }
        Ok(())
    }

    async fn write(&mut self, records: Vec<String>) -> exactly_core::Result<()> {
        self.open.extend(records);
        Ok(())
    }

    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> exactly_core::Result<()> {
        self.staged.insert(ctx.checkpoint_id, std::mem::take(&mut self.open));
        let entries = self
            .staged
            .iter()
            .map(|entry| serde_json::to_vec(&entry).expect("serializable"))
            .collect();
        ctx.put_list_state("staged", entries);
        Ok(())
    }

    async fn notify_checkpoint_complete(&mut self, id: CheckpointId) -> exactly_core::Result<()> {
        let later = self.staged.split_off(&(id + 1));
        let done = std::mem::replace(&mut self.staged, later);
        self.visible.lock().unwrap().extend(done);
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.txt");
    let total = 5_000;
    let mut text = String::new();
    for i in 0..total {
        text += &format!("line {i}\n");
        if i % 10 == 0 {
            text += "# a comment, filtered out\n";
        }
    }
    std::fs::write(&input, text)?;

    let mut checkpoints = CheckpointConfig::new(dir.path().join("checkpoints"));
    checkpoints.interval = Duration::from_millis(50);
    let mut config = JobConfig::new("custom-source");
    config.checkpointing = Some(checkpoints);
    config.restart = RestartStrategy::FixedDelay {
        attempts: 3,
        delay: Duration::from_millis(100),
    };

    let visible: Arc<Mutex<BTreeMap<CheckpointId, Vec<String>>>> = Arc::default();
    let failed = Arc::new(AtomicBool::new(false));
    let mut job = JobBuilder::new(config);
    let path = input.clone();
    let v = visible.clone();
    job.source("lines", 1, move |_| LineSource {
        path: path.clone(),
        offset: 0,
        reader: None,
    })
    .filter(|line: &String| !line.starts_with('#'))
    .flat_map(move |line: String, out| {
        // The crash: once, half-way through.
        if line == "line 2500" && !failed.swap(true, Ordering::SeqCst) {
            return Err(CoreError::operator("crash", ErrorClass::Restart, "injected failure"));
        }
        out.emit(line)
    })
    .sink("visible", move |_| VisibleOnCompletion {
        open: Vec::new(),
        staged: BTreeMap::new(),
        visible: v.clone(),
    });
    let outcome = job.build()?.run().await?;

    let mut count: BTreeMap<String, u32> = BTreeMap::new();
    for line in visible.lock().unwrap().values().flatten() {
        *count.entry(line.clone()).or_default() += 1;
    }
    let missing = (0..total).filter(|i| !count.contains_key(&format!("line {i}"))).count();
    let duplicated = count.values().filter(|n| **n > 1).count();
    println!(
        "{} lines visible, {missing} missing, {duplicated} duplicated; {} checkpoints, {} restart(s)",
        count.values().sum::<u32>(),
        outcome.checkpoints,
        outcome.restarts
    );
    anyhow::ensure!(outcome.restarts == 1, "the injected failure restarts the job once");
    anyhow::ensure!(missing == 0 && duplicated == 0, "every line exactly once");
    anyhow::ensure!(count.len() == total, "nothing but the lines");
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs() {
        super::main().expect("the example holds");
    }
}
