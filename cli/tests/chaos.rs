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
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use common::{checkpoints_completed, committed_records, spawn_run, wait_exit, Examples, OrderFeeder};
use exactly_integration_tests::{connect_mysql, query_i64, query_pairs, read_committed, signal, ChildJob, TestEnv};

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
        checkpoints_completed(self.port).unwrap_or(0)
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

    // Orders arrive throughout; the checks below compare the output with the input as it is in
    // Kafka (see `OrderFeeder`).
    let feeder = OrderFeeder::start(env, &ex.orders, 100, Duration::from_millis(100));

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

    let ids = feeder.finish()?;
    // The input as it is in Kafka: how many times each order id is there (once, unless the
    // feeder had to send a batch again).
    let mut input: BTreeMap<u64, usize> = BTreeMap::new();
    let input_records = read_committed(env, &ex.orders, Duration::from_secs(120))?;
    for r in &input_records {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap_or_default())?;
        *input.entry(v["id"].as_u64().context("id")?).or_default() += 1;
    }
    let total = input_records.len() as u64;
    let resent = input.values().filter(|n| **n > 1).count();

    // Both jobs catch up with the whole input.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let k2k_done = committed_records(ex.k2k_port).is_some_and(|n| n >= total);
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

    // Independent checks: a read_committed consumer and SQL. Each paid order is in paid-orders,
    // and each order a row, exactly as many times as it is in the input.
    let records = read_committed(env, &ex.paid, Duration::from_secs(60))?;
    let mut out: BTreeMap<u64, usize> = BTreeMap::new();
    for r in &records {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap_or_default())?;
        *out.entry(v["id"].as_u64().context("id")?).or_default() += 1;
    }
    let paid_in: BTreeMap<u64, usize> = input
        .iter()
        .filter(|(id, _)| *id % 3 != 0)
        .map(|(i, n)| (*i, *n))
        .collect();
    let mut sql = connect_mysql(env).await?;
    let table: BTreeMap<u64, usize> =
        query_pairs(&mut sql, &format!("SELECT id, COUNT(*) FROM {} GROUP BY id", ex.table))
            .await?
            .into_iter()
            .map(|(id, n)| (id as u64, n as usize))
            .collect();
    let rows: usize = table.values().sum();
    eprintln!(
        "chaos: {} faults, {total} orders in ({ids} ids, {resent} sent twice by the feeder); paid-orders: {} records \
         ({} ids); table: {rows} rows ({} ids)",
        plan.len(),
        records.len(),
        out.len(),
        table.len()
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
    assert_exactly(&paid_in, &out, "paid-orders", seed);
    assert_exactly(&input, &table, "the table", seed);
    Ok(())
}

/// Fails with examples unless `got` holds every id of `want` exactly as many times.
fn assert_exactly(want: &BTreeMap<u64, usize>, got: &BTreeMap<u64, usize>, what: &str, seed: u64) {
    let wrong: Vec<(u64, usize, usize)> = want
        .keys()
        .chain(got.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter_map(|id| {
            let (w, g) = (want.get(id).copied().unwrap_or(0), got.get(id).copied().unwrap_or(0));
            (w != g).then_some((*id, w, g))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{what} is not exactly once (seed {seed}): {} ids wrong; (id, times in input, times out): {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(20)]
    );
}
