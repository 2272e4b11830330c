//! The command line: every subcommand and flag of `exactly`, as clap parses them.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
#[cfg(feature = "bench")]
use exactly_cli::bench::{self, Which};
use exactly_cli::logging::LogFormat;
use exactly_cli::run;
use exactly_core::runtime::SubtaskRange;

#[derive(Parser)]
#[command(
    name = "exactly",
    version,
    about = "Exactly-once Kafka-to-Kafka and Kafka-to-MySQL jobs"
)]
pub(crate) struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value = "text")]
    pub(crate) log_format: LogFormat,
    #[command(subcommand)]
    pub(crate) command: Command,
}

// Parsed once per process: the size of its largest variant costs nothing (which variant is the
// largest depends on whether the `bench` feature compiled `Bench` in).
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub(crate) enum Command {
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
    #[cfg(feature = "bench")]
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
        /// Judge the samples of an earlier soak's --json file again instead of running one (give
        /// the flags it ran with; no services needed).
        #[arg(long)]
        judge: Option<PathBuf>,
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
pub(crate) enum CheckpointsCommand {
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
pub(crate) enum TxnCommand {
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
