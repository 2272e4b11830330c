//! `exactly`: run exactly-once Kafka jobs from TOML files, take savepoints, inspect checkpoints,
//! clean up hanging transactions, benchmark.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use exactly_cli::bench::{self, BenchOptions, Which};
use exactly_cli::jobfile::Job;
use exactly_cli::logging::{self, LogFormat};
use exactly_cli::run::{self, RunOptions};
use exactly_cli::{admin, checkpoints, txn};
use exactly_core::runtime::SubtaskRange;
use exactly_kafka_client::KafkaSecurity;

/// Records are small owned buffers allocated and freed at high rates; mimalloc handles that
/// better than the system allocator (measured with `exactly bench source`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "exactly",
    version,
    about = "Exactly-once Kafka-to-Kafka and Kafka-to-MySQL jobs"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the job a TOML file describes (SIGTERM/Ctrl-C: final checkpoint and commits; twice: abort).
    Run {
        /// The job file.
        job: PathBuf,
        /// Start from this savepoint or checkpoint directory (restored even if the job's checkpoint
        /// directory holds others; later restarts use the checkpoints taken after it).
        #[arg(long)]
        from: Option<PathBuf>,
        /// Restore --from even when it is older than the newest checkpoint of the job's checkpoint
        /// directory: output the newer checkpoints committed may be written again (duplicates).
        #[arg(long, requires = "from")]
        accept_replay: bool,
        /// Run only subtasks FIRST..LAST (inclusive) of the job, e.g. 0..1 (scale-out over processes).
        #[arg(long, value_parser = run::parse_subtasks)]
        subtasks: Option<SubtaskRange>,
        /// Parallelism (overrides job.parallelism; with --subtasks, the whole job's).
        #[arg(long)]
        parallelism: Option<u32>,
        /// Admin endpoint address (overrides job.admin), e.g. 127.0.0.1:9249.
        #[arg(long)]
        admin: Option<String>,
        /// No live progress line, even on a terminal.
        #[arg(long)]
        no_progress: bool,
    },
    /// Check a job file without running it.
    Check {
        /// The job file.
        job: PathBuf,
    },
    /// Take a savepoint of a running job (through its admin endpoint); prints its directory.
    Savepoint {
        /// The job's admin address: host:port, or https://host:port for an endpoint with TLS
        /// (trusting the CA file in $EXACTLY_ADMIN_CA, else the system's store; presenting
        /// $EXACTLY_ADMIN_CLIENT_CERT with $EXACTLY_ADMIN_CLIENT_KEY where it asks for one).
        #[arg(long)]
        admin: String,
        /// Where to write it: a directory under the job's savepoint root
        /// (<checkpoints.dir>/savepoints, the default), relative to it or absolute inside it. The
        /// token, when the job has one, comes from $EXACTLY_ADMIN_TOKEN.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Stop a running job gracefully: final checkpoint (or savepoint) and commits.
    Stop {
        /// The job's admin address: host:port, or https://host:port for an endpoint with TLS
        /// (trusting the CA file in $EXACTLY_ADMIN_CA, else the system's store; presenting
        /// $EXACTLY_ADMIN_CLIENT_CERT with $EXACTLY_ADMIN_CLIENT_KEY where it asks for one).
        #[arg(long)]
        admin: String,
        /// Stop with a savepoint written here (under the job's savepoint root, as for
        /// `savepoint --dir`).
        #[arg(long)]
        savepoint: Option<PathBuf>,
    },
    /// Print the JSON status of a running job.
    Status {
        /// The job's admin address: host:port, or https://host:port for an endpoint with TLS
        /// (trusting the CA file in $EXACTLY_ADMIN_CA, else the system's store; presenting
        /// $EXACTLY_ADMIN_CLIENT_CERT with $EXACTLY_ADMIN_CLIENT_KEY where it asks for one).
        #[arg(long)]
        admin: String,
    },
    /// Stored checkpoints and savepoints.
    Checkpoints {
        #[command(subcommand)]
        command: CheckpointsCommand,
    },
    /// Open Kafka transactions of a transactional-id prefix.
    Txn {
        #[command(subcommand)]
        command: TxnCommand,
    },
    /// Write sample orders (JSON, keyed by id) to a topic, for trying jobs out.
    Datagen {
        /// Topic (created if missing).
        #[arg(long, default_value = "orders")]
        topic: String,
        /// Partitions of a created topic.
        #[arg(long, default_value_t = 3)]
        partitions: i32,
        /// Number of orders.
        #[arg(long, default_value_t = 10_000)]
        count: u64,
        /// First order id.
        #[arg(long, default_value_t = 0)]
        first: u64,
        /// Orders per second at most (default: as fast as possible).
        #[arg(long)]
        rate: Option<u64>,
        /// Also create these topics (e.g. the job's output and dead-letter topics), comma-separated.
        #[arg(long, value_delimiter = ',')]
        create: Vec<String>,
        /// Kafka bootstrap servers.
        #[arg(long, env = "EXACTLY_KAFKA_BOOTSTRAP")]
        bootstrap: String,
        /// TLS/SASL settings: a TOML file with a [kafka] table, or a job file (plaintext without).
        #[arg(long)]
        kafka_config: Option<PathBuf>,
    },
    /// Check that an output holds every input record exactly once: reads a range of the input
    /// topic and the whole output (its own read_committed consumer, or SQL) and reports records
    /// lost, duplicated and out of order, with examples. Exit status 0: exactly once; 1: not;
    /// 2: bad arguments or unreachable services.
    Verify {
        /// The input: TOPIC, or TOPIC:FROM..TO with offsets of every partition (TO exclusive) or
        /// RFC 3339 times; either end may be left out.
        #[arg(long, value_parser = exactly_cli::verify::parse_source)]
        source: exactly_cli::verify::SourceRange,
        /// The output: topic:NAME, mysql:TABLE, postgres:TABLE (or postgres:SCHEMA.TABLE), or a
        /// topic name.
        #[arg(long, value_parser = exactly_cli::verify::parse_output)]
        output: exactly_cli::verify::Output,
        /// The field identifying a record (dots for nested fields; for a table, the column), or
        /// @key / @value: the record's key or value as it is.
        #[arg(long)]
        id: String,
        /// Check the order per key: the key field...
        #[arg(long, requires = "order")]
        key: Option<String>,
        /// ...and the field whose values must not decrease per key (numbers or strings).
        #[arg(long, requires = "key")]
        order: Option<String>,
        /// The job file: its transforms decide which input records should appear, and its
        /// source and sink give the servers when the flags do not.
        #[arg(long)]
        job: Option<PathBuf>,
        /// The job's sink the output belongs to (when the job has several).
        #[arg(long, requires = "job")]
        sink: Option<String>,
        /// Kafka bootstrap servers (default: the job's source, reached with the job's [kafka]
        /// settings; named here, they are reached in plaintext unless --kafka-config says more).
        #[arg(long)]
        bootstrap_servers: Option<String>,
        /// TLS/SASL settings: a TOML file with a [kafka] table, or a job file.
        #[arg(long)]
        kafka_config: Option<PathBuf>,
        /// MySQL URL of a table output (default: the job's MySQL sink).
        #[arg(long)]
        mysql_url: Option<String>,
        /// PostgreSQL URL of a table output, TLS as its sslmode says (default: the job's
        /// PostgreSQL sink).
        #[arg(long)]
        postgres_url: Option<String>,
        /// A file holding the password of --mysql-url / --postgres-url, so that it is not on the
        /// command line (`ps` shows that). The URLs may also take it from the environment:
        /// 'mysql://app:${DB_PASSWORD}@db/shop' (single quotes, so the shell leaves it).
        #[arg(long)]
        db_password_file: Option<PathBuf>,
        /// Examples shown per kind of problem.
        #[arg(long, default_value_t = 5)]
        examples: usize,
        /// Where sorted runs of ids are spilled (24 bytes per record; default: the temporary
        /// directory).
        #[arg(long)]
        spill_dir: Option<PathBuf>,
        /// Give up when a read makes no progress for this long.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
        stall_timeout: std::time::Duration,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Benchmarks, each against its baseline in the same run.
    Bench {
        /// Which benchmark.
        #[arg(value_enum)]
        which: Which,
        /// Records per run (default depends on the benchmark).
        #[arg(long)]
        records: Option<u64>,
        /// Record sizes in bytes (k2k; partitions and processes: the first).
        #[arg(long, value_delimiter = ',', default_value = "100,1024")]
        sizes: Vec<usize>,
        /// Rounds (core, k2k, partitions, processes: cases interleaved within each round; the median is printed).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Kafka bootstrap servers.
        #[arg(long, env = "EXACTLY_KAFKA_BOOTSTRAP")]
        bootstrap: Option<String>,
        /// TLS and SASL for --bootstrap: a file with a [kafka] table (as a job file's) or a job
        /// file; every client of the run uses it, the baselines' too (not `peers`).
        #[arg(long)]
        kafka_config: Option<PathBuf>,
        /// MySQL URL.
        #[arg(long, env = "EXACTLY_MYSQL_URL")]
        mysql: Option<String>,
        /// PostgreSQL URL (TLS as its sslmode says).
        #[arg(long, env = "EXACTLY_POSTGRES_URL")]
        postgres: Option<String>,
        /// Object store location for `bench storage`, `state` and `processes` (`s3://bucket/prefix`; credentials and
        /// endpoint from AWS_* variables).
        #[arg(long, env = "EXACTLY_BENCH_CHECKPOINTS")]
        checkpoints: Option<String>,
        /// Checkpoint (commit) intervals (k2k, peers; partitions, processes and state: the first).
        #[arg(long, value_delimiter = ',', default_value = "1s,100ms", value_parser = humantime::parse_duration)]
        intervals: Vec<std::time::Duration>,
        /// Parallelism: subtasks (k2k, peers, partitions; processes: of the whole job, 1 meaning the largest process count), stream threads (peers).
        #[arg(long, default_value_t = 1)]
        parallelism: u32,
        /// Modes measured after the plain loop, which always runs first as the baseline (k2k).
        #[arg(
            long,
            value_enum,
            value_delimiter = ',',
            default_value = "at-least-once,exactly-once,exactly-once-caught-up"
        )]
        modes: Vec<bench::K2kMode>,
        /// Systems measured, in this order; ratios are to the first (peers).
        #[arg(
            long,
            value_enum,
            value_delimiter = ',',
            default_value = "plain,exactly,exactly-caught-up,kafka-streams,flink"
        )]
        systems: Vec<bench::Peer>,
        /// The peer harnesses, built by scripts/peers (peers).
        #[arg(long, default_value = "bench/peers")]
        peers_dir: PathBuf,
        /// Partition counts of the input and output topics (partitions).
        #[arg(long, value_delimiter = ',', default_value = "6,60,600,3000")]
        partitions: Vec<i32>,
        /// Process counts, the baseline first (processes; each must divide --parallelism, which must divide 12).
        #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
        processes: Vec<u32>,
        /// Key counts (state).
        #[arg(long, value_delimiter = ',', default_value = "1000000,10000000,50000000")]
        keys: Vec<u64>,
        /// Records per second of the steady phase (state: default 100 000) or fed (soak: default 10 000).
        #[arg(long)]
        rate: Option<u64>,
        /// How long the soak runs.
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        duration: std::time::Duration,
        /// How often the soak SIGKILLs its job and restarts it ("0s": never).
        #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
        kill_every: std::time::Duration,
        /// RocksDB's memory in MiB (state; default as a job's `memory_mb`).
        #[arg(long)]
        rocksdb_memory_mb: Option<u64>,
        /// Which half of a key count the state-child runs.
        #[arg(long, hide = true, value_enum)]
        state_phase: Option<bench::StatePhase>,
        /// Input topic of the plain-loop child.
        #[arg(long, hide = true)]
        input: Option<String>,
        /// Output topic of the plain-loop child.
        #[arg(long, hide = true)]
        output: Option<String>,
        /// Also write the figures as JSON to this file (and the charts, where a benchmark draws
        /// them, as SVG files next to it).
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum CheckpointsCommand {
    /// List checkpoints and savepoints under DIR: ids, times, sizes.
    List {
        /// A checkpoint directory (or any directory above snapshots).
        dir: PathBuf,
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one snapshot (or the latest checkpoint under a directory): operators, source offsets,
    /// transactions it still has to commit.
    Inspect {
        /// A chk-N or savepoint directory, or a checkpoint directory.
        path: PathBuf,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum TxnCommand {
    /// List transactions of the prefix with state, age and partitions.
    List {
        /// Transactional-id prefix (the sink's transactional_id_prefix).
        #[arg(long)]
        prefix: String,
        /// Kafka bootstrap servers.
        #[arg(long, env = "EXACTLY_KAFKA_BOOTSTRAP")]
        bootstrap: String,
        /// Kafka security settings: a TOML file of `security.protocol`, `sasl.*`, `ssl.*`, or the
        /// job file (its `[kafka]` section).
        #[arg(long)]
        kafka_config: Option<PathBuf>,
        /// Mark the transactions checkpoints under DIR still have to commit.
        #[arg(long)]
        checkpoints: Option<PathBuf>,
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Abort open transactions of the prefix (fencing their producers), sparing those a stored
    /// checkpoint or savepoint still has to commit.
    Abort {
        /// Transactional-id prefix.
        #[arg(long)]
        prefix: String,
        /// Kafka bootstrap servers.
        #[arg(long, env = "EXACTLY_KAFKA_BOOTSTRAP")]
        bootstrap: String,
        /// Kafka security settings (as for `txn list`).
        #[arg(long)]
        kafka_config: Option<PathBuf>,
        /// The job's checkpoint directory (savepoints under it count too).
        #[arg(long)]
        checkpoints: Option<PathBuf>,
        /// Abort even transactions a checkpoint needs (their records are lost), or abort without
        /// --checkpoints.
        #[arg(long)]
        force: bool,
        /// Only say what would be aborted.
        #[arg(long)]
        dry_run: bool,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn print_json<T: serde::Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// What [`main`] read before any other thread started, to know where the Kerberos tickets of the
/// command's Kafka clients go: the job file of `run` and `verify --job`, a `--kafka-config` file.
/// Read once: the command runs with what decided its credential cache.
struct Loaded {
    job: Option<Result<Job, exactly_cli::jobfile::JobFileError>>,
    kafka_config: Option<anyhow::Result<KafkaSecurity>>,
}

impl Loaded {
    fn read(command: &Command) -> Self {
        let job = match command {
            Command::Run { job, .. } | Command::Verify { job: Some(job), .. } => Some(Job::load(job)),
            _ => None,
        };
        let kafka_config = match command {
            Command::Verify { kafka_config, .. }
            | Command::Datagen { kafka_config, .. }
            | Command::Bench { kafka_config, .. }
            | Command::Txn {
                command: TxnCommand::List { kafka_config, .. } | TxnCommand::Abort { kafka_config, .. },
            } => kafka_config.as_deref().map(txn::kafka_config),
            _ => None,
        };
        Loaded { job, kafka_config }
    }

    /// The security settings of the command's Kafka clients (of what was read without error).
    fn kafka_clients(&self, command: &Command) -> Vec<&KafkaSecurity> {
        let job = self.job.as_ref().and_then(|j| j.as_ref().ok());
        let file = self.kafka_config.as_ref().and_then(|f| f.as_ref().ok());
        match command {
            Command::Run { .. } => job
                .into_iter()
                .flat_map(|j| j.kafka_securities().map(|(_, s)| s))
                .collect(),
            Command::Verify { bootstrap_servers, .. } => {
                exactly_cli::verify::kafka_security(file, bootstrap_servers.as_deref(), job)
                    .into_iter()
                    .collect()
            }
            _ => file.into_iter().collect(),
        }
    }

    /// `--kafka-config`'s settings; its error as the command's.
    fn kafka_config(&mut self) -> anyhow::Result<Option<KafkaSecurity>> {
        self.kafka_config.take().transpose()
    }
}

async fn main_inner(cli: Cli, mut loaded: Loaded) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run {
            job: _,
            from,
            accept_replay,
            subtasks,
            parallelism,
            admin,
            no_progress,
        } => {
            let job = match loaded.job.take().expect("main reads run's job file") {
                Ok(j) => j,
                Err(e) => {
                    eprintln!("error: {e}");
                    return Ok(ExitCode::from(2));
                }
            };
            let opts = RunOptions {
                from,
                accept_replay,
                subtasks,
                parallelism,
                admin,
                progress: !no_progress && logging::stderr_is_terminal() && cli.log_format == LogFormat::Text,
            };
            let outcome = run::run(job, opts).await?;
            println!(
                "job ended: {} checkpoints, latest {}, {} restarts{}",
                outcome.checkpoints,
                outcome.latest_checkpoint.map_or("none".into(), |c| c.to_string()),
                outcome.restarts,
                if outcome.cancelled { ", cancelled" } else { "" }
            );
            if outcome.cancelled {
                // No final checkpoint: the next start replays what followed the latest one and
                // aborts the open transactions. Say so in the exit status, for supervisors.
                tracing::error!("The job was cancelled without a final checkpoint (exit status 3).");
                return Ok(ExitCode::from(3));
            }
        }
        Command::Check { job } => match Job::load(&job) {
            Ok(j) => {
                for w in j.warnings() {
                    eprintln!("warning: {w}");
                }
                println!(
                    "{}: ok ({} -> {}, parallelism {})",
                    job.display(),
                    j.file.source.topics.join(",") + j.file.source.topic_pattern.as_deref().unwrap_or(""),
                    j.sinks
                        .iter()
                        .map(|s| if j.sinks.len() > 1 {
                            format!("{} ({})", s.describe(), s.name)
                        } else {
                            s.describe()
                        })
                        .collect::<Vec<_>>()
                        .join(" + "),
                    j.file.job.parallelism
                )
            }
            Err(e) => {
                eprintln!("error: {e}");
                return Ok(ExitCode::from(2));
            }
        },
        Command::Verify {
            source,
            output,
            id,
            key,
            order,
            job,
            sink,
            bootstrap_servers,
            kafka_config: _,
            mysql_url,
            postgres_url,
            db_password_file,
            examples,
            spill_dir,
            stall_timeout,
            json,
        } => {
            let job = match (job, loaded.job.take()) {
                (Some(_), Some(Ok(j))) => Some(j),
                (Some(_), Some(Err(e))) => {
                    eprintln!("error: {e}");
                    return Ok(ExitCode::from(2));
                }
                _ => None,
            };
            let kafka_config = match loaded.kafka_config() {
                Ok(k) => k,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    return Ok(ExitCode::from(2));
                }
            };
            let args = exactly_cli::verify::VerifyArgs {
                source,
                output,
                id,
                key,
                order,
                job,
                sink,
                bootstrap: bootstrap_servers,
                kafka_config,
                mysql_url,
                postgres_url,
                db_password_file,
                examples,
                spill_dir,
                stall_timeout,
            };
            match exactly_cli::verify::verify(args).await {
                Ok(report) => {
                    if json {
                        print_json(&report)?;
                    } else {
                        exactly_cli::verify::print(&report);
                    }
                    if !report.exactly_once {
                        return Ok(ExitCode::from(1));
                    }
                }
                Err(e) => {
                    eprintln!("error: {e:#}");
                    return Ok(ExitCode::from(2));
                }
            }
        }
        Command::Savepoint { admin: a, dir } => println!("{}", post_for_path(a, "/savepoint", "dir", dir).await?),
        Command::Stop { admin: a, savepoint } => {
            println!("{}", post_for_path(a, "/stop", "savepoint", savepoint).await?)
        }
        Command::Status { admin: a } => {
            let v = tokio::task::spawn_blocking(move || admin::get(&a, "/status")).await??;
            print_json(&v)?;
        }
        Command::Checkpoints { command } => match command {
            CheckpointsCommand::List { dir, json } => {
                let (all, bad) = checkpoints::list(&dir)?;
                if json {
                    print_json(&all)?;
                } else {
                    checkpoints::print_list(&all, &bad);
                }
                if all.is_empty() && bad.is_empty() {
                    eprintln!("no checkpoint or savepoint under {}", dir.display());
                }
            }
            CheckpointsCommand::Inspect { path, json } => {
                let i = checkpoints::inspect(&path)?;
                if json {
                    print_json(&i)?;
                } else {
                    checkpoints::print_inspected(&i);
                }
            }
        },
        Command::Txn { command } => match command {
            TxnCommand::List {
                prefix,
                bootstrap,
                kafka_config: _,
                checkpoints,
                json,
            } => {
                let cluster = txn::cluster(&bootstrap, loaded.kafka_config()?.as_ref());
                let l = txn::list(&cluster, &prefix, checkpoints.as_deref()).await?;
                if json {
                    print_json(&l)?;
                } else {
                    txn::print(&l);
                }
            }
            TxnCommand::Abort {
                prefix,
                bootstrap,
                kafka_config: _,
                checkpoints,
                force,
                dry_run,
                json,
            } => {
                let cluster = txn::cluster(&bootstrap, loaded.kafka_config()?.as_ref());
                let results = txn::abort(&cluster, &prefix, checkpoints.as_deref(), force, dry_run).await?;
                if json {
                    print_json(&results)?;
                } else if results.is_empty() {
                    println!("no open transaction with prefix {prefix:?}");
                } else {
                    for r in &results {
                        println!("{:<40} {}", r.transactional_id, r.outcome);
                    }
                }
                if results.iter().any(|r| r.outcome.starts_with("failed")) {
                    return Ok(ExitCode::FAILURE);
                }
            }
        },
        Command::Datagen {
            topic,
            partitions,
            count,
            first,
            rate,
            create,
            bootstrap,
            kafka_config: _,
        } => {
            let cluster = txn::cluster(&bootstrap, loaded.kafka_config()?.as_ref());
            for t in &create {
                exactly_cli::datagen::ensure_topic(&cluster, t, partitions).await?;
            }
            exactly_cli::datagen::orders(&cluster, &topic, partitions, first, count, rate).await?;
            println!("{count} orders ({first}..{}) written to {topic}", first + count);
        }
        Command::Bench {
            which,
            records,
            sizes,
            rounds,
            bootstrap,
            kafka_config: _,
            mysql,
            postgres,
            checkpoints,
            intervals,
            parallelism,
            modes,
            systems,
            peers_dir,
            partitions,
            processes,
            keys,
            rate,
            duration,
            kill_every,
            state_phase,
            rocksdb_memory_mb,
            input,
            output,
            json,
        } => {
            let report = bench::run(
                which,
                &BenchOptions {
                    records,
                    sizes,
                    rounds,
                    bootstrap,
                    kafka_config: loaded.kafka_config()?,
                    mysql,
                    postgres,
                    checkpoints,
                    intervals,
                    parallelism,
                    modes,
                    systems,
                    peers_dir,
                    topics: input.zip(output),
                    partitions,
                    processes,
                    charts: json.clone(),
                    keys,
                    rate,
                    duration,
                    kill_every,
                    state_phase,
                    rocksdb_memory_mb,
                },
            )
            .await?;
            if let Some(p) = json {
                report.write_json(&p)?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// POSTs `endpoint[?param=dir]` to a running job's admin address; returns the directory it wrote.
async fn post_for_path(admin: String, endpoint: &str, param: &str, dir: Option<PathBuf>) -> anyhow::Result<String> {
    let path = match dir {
        Some(d) => format!("{endpoint}?{param}={}", encode(&d.to_string_lossy())),
        None => endpoint.to_owned(),
    };
    let v = tokio::task::spawn_blocking(move || admin::call(&admin, &path)).await??;
    Ok(v["path"].as_str().unwrap_or_default().to_owned())
}

/// The error and its causes, leaving out causes whose text the message already contains.
fn chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
    }
    out
}

/// Percent-encodes a query value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The command's job file and --kafka-config, read before any other thread starts: a
    // credential cache of the process's own sets KRB5CCNAME.
    let loaded = Loaded::read(&cli.command);
    let credential_cache = exactly_cli::credential_cache::own_credential_cache(loaded.kafka_clients(&cli.command));
    logging::init(cli.log_format);
    if let Some(value) = exactly_core::failpoint::ignored_setting() {
        tracing::error!(
            EXACTLY_FAILPOINTS = %value,
            "EXACTLY_FAILPOINTS is set, but this build has no fail points (they are for crash tests, compiled in with the feature `failpoints`): ignored. Unset it."
        );
    }
    let _credential_cache = match credential_cache {
        Ok(Some(cache)) => {
            tracing::info!(
                cache = %cache.name(),
                "Kerberos: the tickets from the keytab go to a credential cache of this process's own (set KRB5CCNAME to choose one)."
            );
            Some(cache)
        }
        Ok(None) => None,
        Err(e) => {
            eprintln!("error: cannot make a Kerberos credential cache in the temporary directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(main_inner(cli, loaded)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", chain(&e));
            ExitCode::FAILURE
        }
    }
}
