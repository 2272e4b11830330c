//! The chaos run: both example job files (`examples/orders-k2k.toml` and
//! `examples/orders-k2m.toml`, only their topics, table, directories and ports rewritten) run as
//! `exactly` processes on orders arriving throughout, while faults chosen at random hit them one
//! after another — SIGKILL of either job process (restarted), SIGKILL of the Kafka broker and of
//! MariaDB (restarted on their data). Before each fault both jobs must have completed two new
//! checkpoints, so every fault meets a job that has recovered from the last one. At the end the
//! feed stops, both jobs catch up and are stopped with SIGTERM (exit status 0), and an independent
//! read_committed consumer and SQL check that every paid order is in `paid-orders` once and every
//! order is one row (the XA table has no unique key on the id: a duplicate would show as a second
//! row). No job log may say "DATA LOST" or "Duplicate entry".
//!
//! `EXACTLY_CHAOS_FAULTS` (default 6; the first four are one of each kind in random order) and
//! `EXACTLY_CHAOS_SEED` (default: from the clock; printed) make longer or repeated runs:
//! `EXACTLY_CHAOS_FAULTS=40 cargo test -p exactly-cli --test chaos -- --nocapture`.
//! Alone in its test binary: no other test may use the broker or MariaDB while they are down.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use common::{orders, spawn_run, status, wait_exit, Examples};
use exactly_integration_tests::{connect_mysql, query_i64, read_committed, signal, ChildJob, Feed, TestEnv};

/// A small deterministic generator (splitmix64), so a seed replays the same schedule.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn millis(&mut self, max: u64) -> Duration {
        Duration::from_millis(self.below(max + 1))
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    KillK2k,
    KillK2m,
    KillBroker,
    KillMariadb,
}

const KINDS: [Fault; 4] = [Fault::KillK2k, Fault::KillK2m, Fault::KillBroker, Fault::KillMariadb];

/// The schedule: one fault of each kind in random order, then random kinds up to `n`.
fn schedule(rng: &mut Rng, n: usize) -> Vec<Fault> {
    let mut kinds = KINDS.to_vec();
    for i in (1..kinds.len()).rev() {
        kinds.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut faults: Vec<Fault> = kinds.into_iter().take(n).collect();
    while faults.len() < n {
        faults.push(KINDS[rng.below(4) as usize]);
    }
    faults
}

/// One example job as a process, restarted after each SIGKILL; keeps the log of every process it
/// ran.
struct Job {
    name: &'static str,
    file: PathBuf,
    port: u16,
    child: ChildJob,
    logs: Vec<String>,
}

impl Job {
    fn start(name: &'static str, file: PathBuf, port: u16) -> Result<Job> {
        let child = spawn_run(&file, &[], "")?;
        Ok(Job {
            name,
            file,
            port,
            child,
            logs: Vec::new(),
        })
    }

    fn kill_and_restart(&mut self, pause: Duration) -> Result<()> {
        self.child.kill();
        self.logs.push(self.child.tail(usize::MAX));
        std::thread::sleep(pause);
        self.child = spawn_run(&self.file, &[], "")?;
        Ok(())
    }

    /// Checkpoints completed by the current process (0 while it does not answer yet).
    fn completed(&self) -> u64 {
        status(self.port)
            .ok()
            .and_then(|s| s["checkpoints"]["completed"].as_u64())
            .unwrap_or(0)
    }

    fn all_logs(&self) -> String {
        let mut all = self.logs.join("\n");
        all.push('\n');
        all.push_str(&self.child.tail(usize::MAX));
        all
    }
}

/// Waits until each job's current process has completed `n` checkpoints more than when called.
fn wait_checkpoints(jobs: &mut [&mut Job], n: u64, timeout: Duration) -> Result<Duration> {
    let start = Instant::now();
    let base: Vec<u64> = jobs.iter().map(|j| j.completed()).collect();
    loop {
        let mut done = true;
        for (job, base) in jobs.iter_mut().zip(&base) {
            if !job.child.running() {
                bail!(
                    "{} exited (code {:?}):\n{}",
                    job.name,
                    job.child.exit_code(),
                    job.child.log(40)
                );
            }
            done &= job.completed() >= base + n;
        }
        if done {
            return Ok(start.elapsed());
        }
        if start.elapsed() > timeout {
            let names: Vec<String> = jobs
                .iter()
                .map(|j| format!("--- {}:\n{}", j.name, j.child.log(30)))
                .collect();
            bail!("no {n} new checkpoints within {timeout:?}\n{}", names.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_jobs_survive_random_kills_of_jobs_broker_and_database() -> Result<()> {
    let env = TestEnv::get().await?;
    let faults: usize = std::env::var("EXACTLY_CHAOS_FAULTS")
        .ok()
        .map(|v| v.parse().context("EXACTLY_CHAOS_FAULTS"))
        .transpose()?
        .unwrap_or(6);
    let seed: u64 = match std::env::var("EXACTLY_CHAOS_SEED") {
        Ok(v) => v.parse().context("EXACTLY_CHAOS_SEED")?,
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos() as u64,
    };
    let mut rng = Rng(seed);
    let plan = schedule(&mut rng, faults);
    eprintln!("chaos: seed {seed} (EXACTLY_CHAOS_SEED={seed} replays it), faults {plan:?}");

    let dir = tempfile::tempdir()?;
    let ex = Examples::prepare(env, dir.path(), "chaos").await?;

    // Orders arrive throughout, ~1,000 a second; a batch in flight while the broker is down waits
    // for it (the producer is idempotent, so its retries add no duplicate input).
    let produced = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = {
        let (env, topic, produced, stop) = (env.clone(), ex.orders.clone(), produced.clone(), stop.clone());
        std::thread::spawn(move || -> Result<()> {
            let feed = Feed::new(&env)?;
            while !stop.load(Ordering::SeqCst) {
                let first = produced.load(Ordering::SeqCst);
                feed.send(&topic, &orders(first..first + 100))?;
                produced.store(first + 100, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(())
        })
    };

    let mut k2k = Job::start("orders-k2k", ex.k2k.clone(), ex.k2k_port)?;
    let mut k2m = Job::start("orders-k2m", ex.k2m.clone(), ex.k2m_port)?;
    wait_checkpoints(&mut [&mut k2k, &mut k2m], 2, Duration::from_secs(180))?;

    for (i, fault) in plan.iter().enumerate() {
        std::thread::sleep(rng.millis(1500));
        let down = rng.millis(3000);
        match fault {
            Fault::KillK2k => k2k.kill_and_restart(down)?,
            Fault::KillK2m => k2m.kill_and_restart(down)?,
            Fault::KillBroker => {
                env.services("kill-kafka")?;
                std::thread::sleep(down);
                env.services("start-kafka")?;
            }
            Fault::KillMariadb => {
                env.services("kill-mysql")?;
                std::thread::sleep(down);
                env.services("start-mysql")?;
            }
        }
        // Back: both jobs must checkpoint twice more before the next fault.
        let took = wait_checkpoints(&mut [&mut k2k, &mut k2m], 2, Duration::from_secs(300))
            .with_context(|| format!("after fault {} ({fault:?})", i + 1))?;
        eprintln!(
            "chaos: fault {}/{} {fault:?} (down {down:?}): both jobs checkpointed twice {:.1} s after it was back",
            i + 1,
            plan.len(),
            took.as_secs_f64()
        );
    }

    stop.store(true, Ordering::SeqCst);
    feeder.join().map_err(|_| anyhow::anyhow!("feeder panicked"))??;
    let total = produced.load(Ordering::SeqCst);

    // Both jobs catch up with the whole input.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let k2k_done = status(ex.k2k_port).is_ok_and(|s| {
            s["partitions"]
                .as_array()
                .is_some_and(|p| p.iter().map(|p| p["committed"].as_u64().unwrap_or(0)).sum::<u64>() >= total)
        });
        let rows = match connect_mysql(env).await {
            Ok(mut sql) => query_i64(&mut sql, &format!("SELECT COUNT(*) FROM {}", ex.table))
                .await
                .unwrap_or(0) as u64,
            Err(_) => 0,
        };
        if k2k_done && rows >= total {
            break;
        }
        for job in [&mut k2k, &mut k2m] {
            if !job.child.running() {
                bail!("{} exited while catching up:\n{}", job.name, job.child.log(40));
            }
        }
        if Instant::now() > deadline {
            bail!(
                "the jobs did not catch up with {total} orders: {rows} rows\n--- k2k:\n{}\n--- k2m:\n{}",
                k2k.child.log(30),
                k2m.child.log(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for job in [&mut k2k, &mut k2m] {
        signal(job.child.pid(), "TERM")?;
        wait_exit(&mut job.child, Duration::from_secs(60))?;
        assert_eq!(
            job.child.exit_code(),
            Some(0),
            "{} after SIGTERM:\n{}",
            job.name,
            job.child.log(30)
        );
    }

    // Independent checks: a read_committed consumer and SQL.
    let records = read_committed(env, &ex.paid, Duration::from_secs(60))?;
    let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
    for r in &records {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap_or_default())?;
        *seen.entry(v["id"].as_u64().context("id")?).or_default() += 1;
    }
    let paid = |i: &u64| i % 3 != 0;
    let k2k_duplicates: Vec<u64> = seen.iter().filter(|(_, n)| **n > 1).map(|(id, _)| *id).collect();
    let k2k_missing: Vec<u64> = (0..total).filter(|i| paid(i) && !seen.contains_key(i)).collect();
    let k2k_unexpected: Vec<u64> = seen.keys().copied().filter(|i| !paid(i) || *i >= total).collect();
    let mut sql = connect_mysql(env).await?;
    let rows = query_i64(&mut sql, &format!("SELECT COUNT(*) FROM {}", ex.table)).await? as u64;
    let distinct = query_i64(&mut sql, &format!("SELECT COUNT(DISTINCT id) FROM {}", ex.table)).await? as u64;
    let in_range = query_i64(
        &mut sql,
        &format!(
            "SELECT COUNT(DISTINCT id) FROM {} WHERE id >= 0 AND id < {total}",
            ex.table
        ),
    )
    .await? as u64;
    eprintln!(
        "chaos: {} faults, {total} orders in; paid-orders: {} records, {} duplicated, {} missing; \
         table: {rows} rows, {distinct} distinct ids",
        plan.len(),
        records.len(),
        k2k_duplicates.len(),
        k2k_missing.len()
    );
    for job in [&k2k, &k2m] {
        let logs = job.all_logs();
        for bad in ["DATA LOST", "Duplicate entry"] {
            assert!(
                !logs.contains(bad),
                "{} logged {bad:?}:\n{}",
                job.name,
                job.child.log(40)
            );
        }
    }
    assert!(
        k2k_duplicates.is_empty() && k2k_missing.is_empty() && k2k_unexpected.is_empty(),
        "paid-orders not exactly once (seed {seed}): duplicated {:?}, missing {:?}, unexpected {:?}",
        &k2k_duplicates[..k2k_duplicates.len().min(20)],
        &k2k_missing[..k2k_missing.len().min(20)],
        &k2k_unexpected[..k2k_unexpected.len().min(20)]
    );
    assert_eq!(
        (rows, distinct, in_range),
        (total, total, total),
        "the table is not exactly once (seed {seed}): rows, distinct ids, distinct ids in 0..{total}"
    );
    Ok(())
}
