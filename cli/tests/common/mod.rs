//! Helpers of the CLI tests: job files written for one test's topics, free ports, the binary.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use exactly_integration_tests::{ChildJob, TestEnv};

/// The `exactly` binary under test.
pub fn exactly() -> &'static str {
    env!("CARGO_BIN_EXE_exactly")
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// Settings of a Kafka-to-Kafka job file.
pub struct K2k<'a> {
    pub env: &'a TestEnv,
    pub name: &'a str,
    pub input: &'a str,
    pub output: &'a str,
    pub prefix: &'a str,
    pub dir: &'a Path,
    pub parallelism: u32,
    pub admin: Option<u16>,
    /// Extra `[[transform]]` tables.
    pub transforms: &'a str,
}

impl K2k<'_> {
    /// Writes the job file into `dir` and returns its path.
    pub fn write(&self) -> PathBuf {
        let admin = self
            .admin
            .map_or(String::new(), |p| format!("admin = \"127.0.0.1:{p}\""));
        let text = format!(
            r#"
[job]
name = "{name}"
parallelism = {parallelism}
{admin}

[checkpoints]
dir = "{dir}"
interval = "500ms"
timeout = "20s"
retained = 2
tolerable_failures = 100

[restart]
type = "fixed_delay"
attempts = 20
delay = "200ms"

[source]
bootstrap_servers = "{bootstrap}"
topics = ["{input}"]
group_id = "{name}"

{transforms}

[sink.kafka]
bootstrap_servers = "{bootstrap}"
topic = "{output}"
delivery = {{ type = "exactly_once", transactional_id_prefix = "{prefix}", pool_size = 3, transaction_timeout = "2m" }}
"#,
            name = self.name,
            parallelism = self.parallelism,
            dir = self.dir.join("checkpoints").display(),
            bootstrap = self.env.kafka_bootstrap,
            input = self.input,
            output = self.output,
            prefix = self.prefix,
            transforms = self.transforms,
        );
        let path = self.dir.join(format!("{}.toml", self.name));
        std::fs::write(&path, text).expect("write job file");
        path
    }
}

/// `exactly run FILE ARGS...` as a child process (stderr collected, SIGKILL on drop).
pub fn spawn_run(file: &Path, args: &[&str], failpoints: &str) -> Result<ChildJob> {
    let mut all = vec!["run".to_owned(), file.display().to_string()];
    all.extend(args.iter().map(|s| (*s).to_owned()));
    ChildJob::spawn(exactly(), &all, failpoints)
}

/// The JSON status of the job behind `port`, once it answers.
pub fn status(port: u16) -> Result<serde_json::Value> {
    exactly_cli::admin::get(&format!("127.0.0.1:{port}"), "/status")
}

/// Waits until `f(status)` holds.
pub fn wait_status(
    job: &mut ChildJob,
    port: u16,
    what: &str,
    timeout: Duration,
    f: impl Fn(&serde_json::Value) -> bool,
) -> Result<serde_json::Value> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(s) = status(port) {
            if f(&s) {
                return Ok(s);
            }
        }
        if !job.running() {
            bail!("the job exited while waiting for {what}:\n{}", job.tail(40));
        }
        if Instant::now() > deadline {
            bail!(
                "timed out after {timeout:?} waiting for {what}; status {:?}\n{}",
                status(port).ok(),
                job.tail(40)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits for the child to exit on its own.
pub fn wait_exit(job: &mut ChildJob, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while job.running() {
        if Instant::now() > deadline {
            bail!("the job did not exit within {timeout:?}:\n{}", job.tail(40));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Orders `range` as (key, JSON value) records keyed by id.
pub fn orders(range: std::ops::Range<u64>) -> Vec<(String, String)> {
    range
        .map(|i| (i.to_string(), exactly_cli::datagen::order(i).to_string()))
        .collect()
}

/// An example job file of `examples/` rewritten for one run: the services of `env`, and each
/// `(from, to)` replacement (which must occur in the file). Written into `dir`.
pub fn example(name: &str, dir: &Path, env: &TestEnv, replace: &[(&str, String)]) -> Result<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples").join(name);
    let mut text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text = text.replace("127.0.0.1:19092", &env.kafka_bootstrap);
    text = text.replace("mysql://exactly:exactly@127.0.0.1:13306/exactly", &env.mysql_url);
    for (from, to) in replace {
        assert!(text.contains(from), "{from} not in {name}");
        text = text.replace(from, to);
    }
    let out = dir.join(name);
    std::fs::write(&out, text)?;
    Ok(out)
}

/// `exactly verify ARGS` (text report on stdout); returns its exit code and the report.
pub fn verify_report(args: &[&str]) -> Result<(i32, String)> {
    let out = std::process::Command::new(exactly())
        .arg("verify")
        .args(args)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.code() == Some(2) {
        bail!(
            "exactly verify {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok((out.status.code().unwrap_or(-1), text))
}

/// Polls `f` every 200 ms until it holds; fails after `timeout` naming `what`.
pub fn wait(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !f()? {
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// The example job files (`examples/orders-k2k.toml`, `examples/orders-k2m.toml`,
/// `examples/orders-fan-out.toml`) rewritten for one run: its own topics (created), tables,
/// directories, admin ports and ids.
#[derive(Clone)]
pub struct Examples {
    pub k2k: PathBuf,
    pub k2m: PathBuf,
    pub k2k_port: u16,
    pub k2m_port: u16,
    /// The input topic, `paid-orders` and the dead-letter topic of this run.
    pub orders: String,
    pub paid: String,
    pub dlq: String,
    /// The Kafka-to-MySQL job's table (made here without a primary key).
    pub table: String,
    /// The fan-out job (`examples/orders-fan-out.toml`): paid orders to `fan_paid`, every order
    /// to `fan_table` (made here without a primary key).
    pub fan_out: PathBuf,
    pub fan_out_port: u16,
    pub fan_paid: String,
    pub fan_table: String,
}

impl Examples {
    /// Creates the topics (3 partitions each) and writes both job files into `dir`.
    pub async fn prepare(env: &TestEnv, dir: &Path, prefix: &str) -> Result<Examples> {
        let run = exactly_integration_tests::unique(prefix);
        let (orders, paid, dlq) = (format!("{run}-orders"), format!("{run}-paid"), format!("{run}-dlq"));
        for t in [&orders, &paid, &dlq] {
            exactly_integration_tests::create_topic(env, t, 3).await?;
        }
        let fan_paid = format!("{run}-fan-paid");
        exactly_integration_tests::create_topic(env, &fan_paid, 3).await?;
        let table = run.replace('-', "_");
        let fan_table = format!("{table}_fan");
        // The job would create the table with its key column `id` as primary key; created here
        // without one, a duplicate shows as a second row instead of an insert error.
        let mut sql = exactly_integration_tests::connect_mysql(env).await?;
        for t in [&table, &fan_table] {
            exactly_integration_tests::execute(
                &mut sql,
                &format!(
                    "CREATE TABLE `{t}` (`id` BIGINT NOT NULL, `customer` VARCHAR(64) NOT NULL, \
                     `amount` DOUBLE NOT NULL, `status` VARCHAR(16) NOT NULL) ENGINE=InnoDB"
                ),
            )
            .await?;
        }
        let (k2k_port, k2m_port, fan_out_port) = (free_port(), free_port(), free_port());
        let k2k = example(
            "orders-k2k.toml",
            dir,
            env,
            &[
                ("topics = [\"orders\"]", format!("topics = [\"{orders}\"]")),
                ("topic = \"paid-orders\"", format!("topic = \"{paid}\"")),
                ("topic = \"orders-dlq\"", format!("topic = \"{dlq}\"")),
                ("/tmp/exactly/orders-k2k", dir.join("k2k").display().to_string()),
                ("127.0.0.1:9249", format!("127.0.0.1:{k2k_port}")),
                (
                    "transactional_id_prefix = \"orders-k2k\"",
                    format!("transactional_id_prefix = \"{run}-k2k\""),
                ),
                ("group_id = \"orders-k2k\"", format!("group_id = \"{run}-k2k\"")),
            ],
        )?;
        let k2m = example(
            "orders-k2m.toml",
            dir,
            env,
            &[
                ("topics = [\"orders\"]", format!("topics = [\"{orders}\"]")),
                ("table = \"orders\"", format!("table = \"{table}\"")),
                ("/tmp/exactly/orders-k2m", dir.join("k2m").display().to_string()),
                ("127.0.0.1:9250", format!("127.0.0.1:{k2m_port}")),
                ("job_id = \"orders-k2m\"", format!("job_id = \"{run}\"")),
                ("group_id = \"orders-k2m\"", format!("group_id = \"{run}-k2m\"")),
            ],
        )?;
        let fan_out = example(
            "orders-fan-out.toml",
            dir,
            env,
            &[
                ("topics = [\"orders\"]", format!("topics = [\"{orders}\"]")),
                ("topic = \"paid-orders\"", format!("topic = \"{fan_paid}\"")),
                ("table = \"orders_all\"", format!("table = \"{fan_table}\"")),
                ("/tmp/exactly/orders-fan-out", dir.join("fan-out").display().to_string()),
                ("127.0.0.1:9251", format!("127.0.0.1:{fan_out_port}")),
                (
                    "transactional_id_prefix = \"orders-fan-out\"",
                    format!("transactional_id_prefix = \"{run}-fan\""),
                ),
                ("job_id = \"orders-fan-out\"", format!("job_id = \"{run}-fan\"")),
                ("group_id = \"orders-fan-out\"", format!("group_id = \"{run}-fan\"")),
            ],
        )?;
        Ok(Examples {
            k2k,
            k2m,
            k2k_port,
            k2m_port,
            orders,
            paid,
            dlq,
            table,
            fan_out,
            fan_out_port,
            fan_paid,
            fan_table,
        })
    }
}

/// Checkpoints the job behind `port` has completed (`None` while it does not answer).
pub fn checkpoints_completed(port: u16) -> Option<u64> {
    status(port).ok()?["checkpoints"]["completed"].as_u64()
}

/// Input records the job behind `port` has committed, over all its partitions (`None` while it
/// does not answer).
pub fn committed_records(port: u16) -> Option<u64> {
    let s = status(port).ok()?;
    let partitions = s["partitions"].as_array()?;
    Some(partitions.iter().map(|p| p["committed"].as_u64().unwrap_or(0)).sum())
}

/// Orders `0, 1, 2, …` produced in batches of `batch` every `pause` until finished, by one
/// idempotent producer. A batch that still fails (e.g. across a broker restart) is sent again by a
/// new producer, up to 5 times, and may then be in the input twice: checks that must hold across
/// that compare the output with the input as it is in Kafka.
pub struct OrderFeeder {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    produced: std::sync::Arc<std::sync::atomic::AtomicU64>,
    handle: std::thread::JoinHandle<Result<()>>,
}

impl OrderFeeder {
    /// Starts feeding `topic`.
    pub fn start(env: &TestEnv, topic: &str, batch: u64, pause: Duration) -> OrderFeeder {
        Self::start_at(env, topic, 0, batch, pause)
    }

    /// Starts feeding `topic` with order `first` (`finish` then returns the next id to feed).
    pub fn start_at(env: &TestEnv, topic: &str, first: u64, batch: u64, pause: Duration) -> OrderFeeder {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let produced = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(first));
        let (env, topic, flag, count) = (env.clone(), topic.to_owned(), stop.clone(), produced.clone());
        let handle = std::thread::spawn(move || -> Result<()> {
            let mut feed = exactly_integration_tests::Feed::new(&env)?;
            while !flag.load(Ordering::SeqCst) {
                let first = count.load(Ordering::SeqCst);
                let records = orders(first..first + batch);
                let mut tries = 0;
                while let Err(e) = feed.send(&topic, &records) {
                    tries += 1;
                    if tries == 5 {
                        return Err(e);
                    }
                    eprintln!("feeder: {e:#}; sending the batch again with a new producer");
                    feed = exactly_integration_tests::Feed::new(&env)?;
                }
                count.store(first + batch, Ordering::SeqCst);
                std::thread::sleep(pause);
            }
            Ok(())
        });
        OrderFeeder { stop, produced, handle }
    }

    /// Stops feeding; returns the next order id (how many were produced when started at 0).
    pub fn finish(self) -> Result<u64> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.handle.join().map_err(|_| anyhow::anyhow!("feeder panicked"))??;
        Ok(self.produced.load(std::sync::atomic::Ordering::SeqCst))
    }
}
