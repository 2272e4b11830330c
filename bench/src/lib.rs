//! `exactly bench`: every benchmark, each measured side by side with its baseline in the same run
//! (machines are noisy: ratios hold, absolute numbers do not). Prints tables; `--json FILE`
//! writes the figures too.

mod chart;
mod core;
mod cpu;
mod k2k;
mod kafka;
mod mysql;
mod peers;
mod postgres;
mod processes;
mod scale;
mod soak;
mod source;
mod state;

pub use k2k::K2kMode;
pub use peers::Peer;
pub use state::StatePhase;

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use exactly_kafka_client::Cluster;
use serde::Serialize;

/// One measured case.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Which benchmark.
    pub bench: String,
    /// Which case of it.
    pub case: String,
    /// Named figures.
    pub figures: BTreeMap<String, f64>,
}

/// Everything one `exactly bench` run measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Rows in the order measured.
    pub rows: Vec<Row>,
}

impl Report {
    pub(crate) fn row(&mut self, bench: &str, case: &str, figures: &[(&str, f64)]) {
        self.rows.push(Row {
            bench: bench.into(),
            case: case.into(),
            figures: figures.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
        });
    }

    /// Writes the report as JSON.
    pub fn write_json(&self, path: &Path) -> Result<()> {
        let json = serde_json::to_vec_pretty(self)?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))
    }
}

/// Which benchmark to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Which {
    /// Checkpointing overhead of the engine (no services needed).
    Core,
    /// The Kafka source vs a plain rdkafka consumer loop.
    Source,
    /// Kafka-to-Kafka exactly-once vs at-least-once vs a plain consume-produce loop.
    K2k,
    /// Kafka-to-MySQL XA and upsert vs a plain batched INSERT loop.
    Mysql,
    /// Kafka-to-PostgreSQL two-phase and upsert vs a plain batched INSERT loop.
    Postgres,
    /// Checkpoints in an object store (`--checkpoints URL`) vs a local directory.
    Storage,
    /// The same pass-through by a plain loop, `exactly run`, Kafka Streams and Flink, each a
    /// process, timed from outside (`scripts/peers` builds the Java harnesses first).
    Peers,
    /// How cost grows with the partitions of the input and output (`--partitions`): the plain
    /// loop, Kafka's textbook transactional loop and `exactly run`, each its own process, per
    /// partition count; charts with `--json`.
    Partitions,
    /// One exactly-once job split over processes (`--processes`, `--subtasks` ranges of
    /// `--parallelism`): the whole's rate, each process's memory and CPU; checkpoints in
    /// `--checkpoints` (default a local directory); charts with `--json`.
    Processes,
    /// How keyed state's cost grows with its keys (`--keys`): RocksDB checkpoints' duration and
    /// bytes written while keys are updated, restore time, memory; each key count in its own
    /// processes; checkpoints in `--checkpoints` (default a local directory); charts with `--json`.
    State,
    /// An exactly-once job fed at a steady `--rate` for `--duration`, SIGKILLed every
    /// `--kill-every` and restarted: memory, file descriptors, threads, checkpoints, commit
    /// latency, transactional ids and the checkpoint directory sampled every 10 s; every record
    /// read back once at the end; charts with `--json`.
    Soak,
    /// One process of `state`, run as a child by it.
    #[value(hide = true)]
    StateChild,
    /// The baseline loop of `peers`, run as a child process by it.
    #[value(hide = true)]
    PlainLoop,
    /// The loop with a Kafka transaction per `--intervals` (Kafka's textbook exactly-once loop),
    /// run as a child process by `partitions`.
    #[value(hide = true)]
    PlainTransactionalLoop,
    /// core, source, k2k, mysql and postgres.
    All,
}

/// Settings of a run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Records (default per benchmark).
    pub records: Option<u64>,
    /// Record sizes of the k2k benchmark.
    pub sizes: Vec<usize>,
    /// Rounds of the core and k2k benchmarks.
    pub rounds: usize,
    /// Kafka bootstrap servers.
    pub bootstrap: Option<String>,
    /// TLS and SASL settings for them (a `[kafka]` table or a job file): every client of the run.
    pub kafka_config: Option<exactly_kafka_client::KafkaSecurity>,
    /// MySQL URL.
    pub mysql: Option<String>,
    /// PostgreSQL URL.
    pub postgres: Option<String>,
    /// Object store location of the storage benchmark (`s3://bucket/prefix`).
    pub checkpoints: Option<String>,
    /// Checkpoint (commit) intervals of the k2k and peers benchmarks.
    pub intervals: Vec<std::time::Duration>,
    /// Parallelism of the k2k and peers benchmarks (subtasks, stream threads).
    pub parallelism: u32,
    /// Modes of the k2k benchmark after its plain loop.
    pub modes: Vec<K2kMode>,
    /// Systems of the peers benchmark, measured in this order (ratios are to the first).
    pub systems: Vec<Peer>,
    /// Where the peer harnesses are (`bench/peers`).
    pub peers_dir: std::path::PathBuf,
    /// Input and output topics of the hidden `plain-loop` child.
    pub topics: Option<(String, String)>,
    /// Partition counts of the partitions benchmark.
    pub partitions: Vec<i32>,
    /// Process counts of the processes benchmark.
    pub processes: Vec<u32>,
    /// Where charts go (next to this file: the `--json` file), for the benchmarks that draw them.
    pub charts: Option<std::path::PathBuf>,
    /// Key counts of the state benchmark.
    pub keys: Vec<u64>,
    /// Records per second of the state benchmark's steady phase and of the soak.
    pub rate: Option<u64>,
    /// How long the soak runs.
    pub duration: std::time::Duration,
    /// How often the soak kills its job (zero: never).
    pub kill_every: std::time::Duration,
    /// An earlier soak's JSON whose samples are judged again instead of running one.
    pub judge: Option<std::path::PathBuf>,
    /// Which half a `state-child` runs.
    pub state_phase: Option<StatePhase>,
    /// RocksDB's memory of the state benchmark (MiB).
    pub rocksdb_memory_mb: Option<u64>,
}

impl BenchOptions {
    /// The first of `--intervals`, for the benchmarks that use one (1 s without any).
    fn first_interval(&self) -> std::time::Duration {
        self.intervals
            .first()
            .copied()
            .unwrap_or(std::time::Duration::from_secs(1))
    }
}

fn need<'a>(v: &'a Option<String>, what: &str, flag: &str, env: &str) -> Result<&'a str> {
    match v {
        Some(s) => Ok(s),
        None => bail!(
            "the {what} benchmark needs {flag} (or {env}; `eval \"$(scripts/services env)\"` after `scripts/services up`)"
        ),
    }
}

/// The cluster a benchmark needing Kafka runs against: `--bootstrap`, with `--kafka-config`'s
/// TLS and SASL settings when given.
fn cluster(o: &BenchOptions, what: &str) -> Result<Cluster> {
    let b = need(&o.bootstrap, what, "--bootstrap", "EXACTLY_KAFKA_BOOTSTRAP")?;
    Ok(Cluster::with_security(b, o.kafka_config.as_ref()))
}

/// Runs `which`, printing as it goes.
pub async fn run(which: Which, o: &BenchOptions) -> Result<Report> {
    let mut report = Report::default();
    let all = which == Which::All;
    if all || which == Which::Core {
        core::overhead(o.records.unwrap_or(5_000_000), o.rounds, &mut report).await?;
    }
    if all || which == Which::Source {
        source::bench_source(&cluster(o, "source")?, o.records.unwrap_or(1_000_000), &mut report).await?;
    }
    if all || which == Which::K2k {
        let b = cluster(o, "k2k")?;
        // Two rates: written (a read_uncommitted reader has the backlog) and committed (a
        // read_committed reader has it; exactly-once includes the last commit, up to one
        // checkpoint interval after the last record: use enough records).
        k2k::bench_k2k(&b, o.records.unwrap_or(1_000_000), o, &mut report).await?;
    }
    if all || which == Which::Mysql {
        let b = cluster(o, "mysql")?;
        let m = need(&o.mysql, "mysql", "--mysql", "EXACTLY_MYSQL_URL")?;
        mysql::bench_mysql(&b, m, o.records.unwrap_or(100_000), &mut report).await?;
    }
    if all || which == Which::Postgres {
        let b = cluster(o, "postgres")?;
        let p = need(&o.postgres, "postgres", "--postgres", "EXACTLY_POSTGRES_URL")?;
        postgres::bench_postgres(&b, p, o.records.unwrap_or(100_000), &mut report).await?;
    }
    if which == Which::Peers {
        if o.kafka_config.is_some() {
            // The Kafka Streams and Flink harnesses take bootstrap servers only.
            bail!("bench peers runs against a plaintext listener: its Kafka Streams and Flink harnesses do not take --kafka-config");
        }
        let b = cluster(o, "peers")?;
        let opts = peers::PeersOptions {
            cluster: &b,
            records: o.records.unwrap_or(2_000_000),
            size: o.sizes.first().copied().unwrap_or(100),
            rounds: o.rounds,
            intervals: &o.intervals,
            parallelism: o.parallelism,
            systems: &o.systems,
            peers_dir: &o.peers_dir,
        };
        peers::bench_peers(&opts, &mut report).await?;
    }
    if which == Which::Partitions {
        if o.kafka_config.is_some() {
            // Its children (the loops, `exactly run` on a generated job file) take bootstrap
            // servers only.
            bail!("bench partitions runs against a plaintext listener: its child processes do not take --kafka-config");
        }
        let b = cluster(o, "partitions")?;
        let opts = scale::ScaleOptions {
            cluster: &b,
            records: o.records.unwrap_or(1_000_000),
            size: o.sizes.first().copied().unwrap_or(100),
            counts: &o.partitions,
            interval: o.first_interval(),
            parallelism: o.parallelism,
            rounds: o.rounds,
            charts: o.charts.as_deref(),
        };
        scale::bench_partitions(&opts, &mut report).await?;
    }
    if which == Which::Processes {
        if o.kafka_config.is_some() {
            bail!("bench processes runs against a plaintext listener: its child processes do not take --kafka-config");
        }
        let b = cluster(o, "processes")?;
        let opts = processes::ProcessesOptions {
            cluster: &b,
            records: o.records.unwrap_or(2_000_000),
            size: o.sizes.first().copied().unwrap_or(100),
            counts: &o.processes,
            interval: o.first_interval(),
            // 1 (the flag's default) with more processes: the largest process count.
            parallelism: if o.parallelism == 1 {
                o.processes.iter().copied().max().unwrap_or(1)
            } else {
                o.parallelism
            },
            rounds: o.rounds,
            checkpoints: o.checkpoints.as_deref(),
            charts: o.charts.as_deref(),
        };
        processes::bench_processes(&opts, &mut report).await?;
    }
    if which == Which::Soak {
        if o.kafka_config.is_some() {
            bail!("bench soak runs against a plaintext listener: its job does not take --kafka-config");
        }
        // Judging an earlier run's samples needs no broker.
        let b = match &o.judge {
            Some(_) => exactly_kafka_client::Cluster::plaintext("unused:9092"),
            None => cluster(o, "soak")?,
        };
        let opts = soak::SoakOptions {
            cluster: &b,
            rate: o.rate.unwrap_or(10_000),
            size: o.sizes.first().copied().unwrap_or(100),
            duration: o.duration,
            kill_every: o.kill_every,
            interval: o.first_interval(),
            parallelism: o.parallelism,
            charts: o.charts.as_deref(),
            judge: o.judge.as_deref(),
        };
        soak::bench_soak(&opts, &mut report).await?;
    }
    if which == Which::State || which == Which::StateChild {
        let interval = o.first_interval();
        let updates = o.records.unwrap_or(3_000_000);
        if which == Which::StateChild {
            let (Some(phase), [keys], Some(at)) = (o.state_phase, o.keys.as_slice(), &o.checkpoints) else {
                bail!("state-child needs --state-phase, one --keys and --checkpoints");
            };
            state::child(
                phase,
                *keys,
                updates,
                o.rate.unwrap_or(100_000),
                interval,
                at,
                o.rocksdb_memory_mb,
            )
            .await?;
        } else {
            let opts = state::StateOptions {
                keys: &o.keys,
                updates,
                rate: o.rate.unwrap_or(100_000),
                interval,
                checkpoints: o.checkpoints.as_deref(),
                memory_mb: o.rocksdb_memory_mb,
                charts: o.charts.as_deref(),
            };
            state::bench_state(&opts, &mut report).await?;
        }
    }
    if which == Which::PlainLoop || which == Which::PlainTransactionalLoop {
        let b = cluster(o, "plain-loop")?;
        let Some((input, output)) = &o.topics else {
            bail!("plain-loop needs --input and --output");
        };
        let transactions = (which == Which::PlainTransactionalLoop).then(|| o.first_interval());
        k2k::plain_loop(&b, input, output, o.records.unwrap_or(1_000_000), transactions)?;
        // Like every system `bench peers` measures, the loop is stopped from outside (its peak
        // memory is read before that); should nobody stop it, it ends after 10 minutes.
        tokio::time::sleep(std::time::Duration::from_secs(600)).await;
    }
    if which == Which::Storage {
        let url = need(
            &o.checkpoints,
            "storage",
            "--checkpoints s3://BUCKET/PREFIX",
            "EXACTLY_BENCH_CHECKPOINTS",
        )?;
        core::storage(o.records.unwrap_or(3_000_000), o.rounds, url, &mut report).await?;
    }
    Ok(report)
}

/// The median of `v`: the middle value, or the mean of the two middle values of an even count
/// (0 for none). Every benchmark's printed medians come from here.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_two_middle_values() {
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![0.9]), 0.9);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        // The rounds of the loop against itself (2026-12-05): not 1.033, the upper middle one.
        let m = median(vec![1.033, 0.908, 1.276, 0.964]);
        assert!((m - 0.9985).abs() < 1e-9, "{m}");
        assert_eq!(median(vec![2.0, 1.0]), 1.5);
    }
}
