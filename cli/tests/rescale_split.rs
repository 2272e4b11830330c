//! Rescaling a job split over processes, as a user does it: `exactly stop --savepoint NAME` to
//! every process (each range writes its part under one job-level directory,
//! `<checkpoints.dir>/savepoints/NAME/subtasks-A-B-of-P/savepoint-N`), then every process of the
//! new layout starts with `--from` that directory. Parallelism 6 over 3 processes → 4 over 2 → 1
//! process, and 2 → 3, input arriving throughout: the read_committed output holds every input
//! record exactly once. Source offsets, state and the sinks' pending transactions all reach the
//! right new subtask.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use common::{checkpoints_completed, committed_records, exactly, free_port, spawn_run, wait_exit, K2k, OrderFeeder};
use exactly_integration_tests::{create_topic, read_committed, unique, ChildJob, TestEnv};

/// One layout: a process per range, each with its admin port.
struct Layout {
    jobs: Vec<(ChildJob, u16)>,
}

impl Layout {
    /// Starts `ranges` of a job of `parallelism` (one process without `--subtasks` when `ranges`
    /// is empty), from `from` if given.
    fn start(file: &Path, parallelism: u32, ranges: &[&str], from: Option<&Path>) -> Result<Layout> {
        let mut jobs = Vec::new();
        let runs: Vec<Option<&str>> = if ranges.is_empty() {
            vec![None]
        } else {
            ranges.iter().map(|r| Some(*r)).collect()
        };
        for r in runs {
            let port = free_port();
            let mut args = vec![
                "--parallelism".to_owned(),
                parallelism.to_string(),
                "--admin".to_owned(),
                format!("127.0.0.1:{port}"),
            ];
            if let Some(r) = r {
                args.extend(["--subtasks".to_owned(), r.to_owned()]);
            }
            if let Some(f) = from {
                args.extend(["--from".to_owned(), f.display().to_string()]);
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            jobs.push((spawn_run(file, &args, "")?, port));
        }
        Ok(Layout { jobs })
    }

    /// Waits until every process has completed `n` checkpoints.
    fn wait_checkpoints(&mut self, n: u64) -> Result<()> {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        for (job, port) in &mut self.jobs {
            loop {
                if checkpoints_completed(*port) >= Some(n) {
                    break;
                }
                if !job.running() {
                    bail!("a process exited:\n{}", job.log(40));
                }
                if std::time::Instant::now() > deadline {
                    bail!("no {n} checkpoints within 120 s:\n{}", job.log(40));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// `exactly stop --savepoint NAME` to every process, as a user would; all exit 0.
    fn stop_with_savepoint(mut self, name: &str) -> Result<()> {
        for (job, port) in &mut self.jobs {
            let out = std::process::Command::new(exactly())
                .args(["stop", "--admin", &format!("127.0.0.1:{port}"), "--savepoint", name])
                .output()?;
            if !out.status.success() {
                bail!(
                    "exactly stop --savepoint {name}: {}\n{}",
                    String::from_utf8_lossy(&out.stderr),
                    job.log(40)
                );
            }
            wait_exit(job, Duration::from_secs(60))?;
            if job.exit_code() != Some(0) {
                bail!(
                    "a process stopped with a savepoint exited {:?}:\n{}",
                    job.exit_code(),
                    job.log(40)
                );
            }
        }
        Ok(())
    }
}

/// Every id of `0..total` exactly once in the read_committed output.
fn verify(env: &TestEnv, output: &str, total: u64) -> Result<()> {
    let records = read_committed(env, output, Duration::from_secs(60))?;
    let mut count: BTreeMap<u64, usize> = BTreeMap::new();
    for r in &records {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap_or_default())?;
        *count.entry(v["id"].as_u64().context("id")?).or_default() += 1;
    }
    let duplicates: Vec<u64> = count.iter().filter(|(_, n)| **n > 1).map(|(i, _)| *i).collect();
    let missing: Vec<u64> = (0..total).filter(|i| !count.contains_key(i)).collect();
    assert!(
        duplicates.is_empty() && missing.is_empty(),
        "{} of {total} ids; duplicated {:?}, missing {:?}",
        count.len(),
        &duplicates[..duplicates.len().min(20)],
        &missing[..missing.len().min(20)]
    );
    assert_eq!(records.len() as u64, total);
    Ok(())
}

async fn scenario(name: &str, partitions: i32, layouts: &[(u32, &[&str])]) -> Result<()> {
    let env = TestEnv::get().await?;
    let (input, output) = (unique(&format!("{name}-in")), unique(&format!("{name}-out")));
    create_topic(env, &input, partitions).await?;
    create_topic(env, &output, partitions).await?;
    let dir = tempfile::tempdir()?;
    let file = K2k {
        env,
        name: &unique(name),
        input: &input,
        output: &output,
        prefix: &unique(&format!("{name}-txn")),
        dir: dir.path(),
        parallelism: layouts[0].0,
        admin: None,
        transforms: "",
    }
    .write();
    let savepoints = dir.path().join("checkpoints").join("savepoints");
    let feeder = OrderFeeder::start(env, &input, 50, Duration::from_millis(50));
    let (last, before) = layouts.split_last().expect("a layout");
    let mut from = None;
    for (i, (parallelism, ranges)) in before.iter().enumerate() {
        let mut layout = Layout::start(&file, *parallelism, ranges, from.as_deref())?;
        layout.wait_checkpoints(3)?;
        let name = format!("rescale-{i}");
        layout.stop_with_savepoint(&name)?;
        eprintln!(
            "{parallelism} subtasks over {} processes stopped with savepoint {name}",
            ranges.len().max(1)
        );
        from = Some(savepoints.join(&name));
    }
    let mut layout = Layout::start(&file, last.0, last.1, from.as_deref())?;
    layout.wait_checkpoints(3)?;
    let total = feeder.finish()?;
    drain(layout, total, env, &output).await
}

/// The last layout reads the rest of the input and stops; then the output is checked.
async fn drain(mut layout: Layout, total: u64, env: &TestEnv, output: &str) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let committed: u64 = layout
            .jobs
            .iter()
            .filter_map(|(_, port)| committed_records(*port))
            .sum();
        if committed >= total {
            break;
        }
        if std::time::Instant::now() > deadline {
            bail!("the last layout committed {committed} of {total} input records");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for (job, _) in &mut layout.jobs {
        exactly_integration_tests::signal(job.pid(), "TERM")?;
        wait_exit(job, Duration::from_secs(60))?;
    }
    verify(env, output, total)?;
    eprintln!("{total} records, each exactly once across the rescales");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_over_three_processes_to_four_over_two_to_one_process() -> Result<()> {
    scenario(
        "rs6",
        6,
        &[(6, &["0..1", "2..3", "4..5"]), (4, &["0..1", "2..3"]), (1, &[])],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_to_three() -> Result<()> {
    scenario("rs2", 6, &[(2, &["0..0", "1..1"]), (3, &["0..0", "1..1", "2..2"])]).await
}
