//! `exactly`: run exactly-once Kafka jobs from TOML files, take savepoints, inspect checkpoints,
//! clean up hanging transactions, benchmark.

mod args;

use std::path::PathBuf;
use std::process::ExitCode;

use args::{CheckpointsCommand, Cli, Command, TxnCommand};
use clap::Parser;
#[cfg(feature = "bench")]
use exactly_cli::bench::{self, BenchOptions};
use exactly_cli::jobfile::Job;
use exactly_cli::logging::{self, LogFormat};
use exactly_cli::run::{self, RunOptions};
use exactly_cli::{admin, checkpoints, txn};
use exactly_kafka_client::{Cluster, KafkaSecurity};

/// Records are small owned buffers allocated and freed at high rates; mimalloc handles that
/// better than the system allocator (measured with `exactly bench source`). With its `override`
/// feature every C and C++ allocation of the process goes to mimalloc too — RocksDB's, librdkafka's
/// — and mimalloc gives freed memory back to the system where glibc's allocator kept much of it:
/// `exactly bench state` at 10 M keys peaked at 169 MiB against 236 MiB (64 MiB RocksDB budget);
/// Kafka-to-Kafka throughput was the same either way (docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
            | Command::Txn {
                command: TxnCommand::List { kafka_config, .. } | TxnCommand::Abort { kafka_config, .. },
            } => kafka_config.as_deref().map(txn::kafka_config),
            #[cfg(feature = "bench")]
            Command::Bench { kafka_config, .. } => kafka_config.as_deref().map(txn::kafka_config),
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
                let cluster = Cluster::with_security(&bootstrap, loaded.kafka_config()?.as_ref());
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
                let cluster = Cluster::with_security(&bootstrap, loaded.kafka_config()?.as_ref());
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
            let cluster = Cluster::with_security(&bootstrap, loaded.kafka_config()?.as_ref());
            for t in &create {
                exactly_cli::datagen::ensure_topic(&cluster, t, partitions).await?;
            }
            exactly_cli::datagen::orders(&cluster, &topic, partitions, first, count, rate).await?;
            println!("{count} orders ({first}..{}) written to {topic}", first + count);
        }
        #[cfg(feature = "bench")]
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
            judge,
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
                    judge,
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
