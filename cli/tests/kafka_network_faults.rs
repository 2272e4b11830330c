//! The network between a running Kafka-to-Kafka job and the broker fails: partitioned (bytes
//! held, connections open) shorter and longer than the clients' request timeouts, and reset
//! (every connection closed, new ones refused). The job reaches the broker only through a TCP
//! proxy (the broker's `PROXIED` listener advertises it); the test feeds and checks directly.
//! After each fault heals, commits resume (the time is printed) and the read_committed output
//! ends with every record exactly once, in order per key.
//!
//! Also: a job started while the broker's group coordinator is still loading or moving (as right
//! after a broker restart) waits for it instead of failing its start.
//!
//! Also: the job itself paused (SIGSTOP) longer than its transaction timeout — the broker aborts
//! its open transactions and fences their producers — ends, after SIGCONT, checkpointing again
//! with the output exactly once, or with a loud "DATA LOST" naming what the broker aborted; never
//! a job that restarts without end.

mod k2k;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use exactly_integration_tests::{create_topic, read_committed, signal, unique, ChildJob, TestEnv};
use k2k::{drain_and_verify, exactly, feed, wait_for_more_output, Job, Running, KEYS};

/// One proxy at a time: the broker's proxied listener advertises one address.
static PROXY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_partitions_and_resets_lose_and_double_nothing() -> Result<()> {
    let env = TestEnv::get().await?;
    let _one = PROXY.lock().await;
    let (proxy, via_proxy) = env.kafka_proxy().await?;
    let mut run = Running::on_new_topics(env, "net", |input, output, dir| {
        Job {
            bootstrap: Some(via_proxy),
            // Checkpoints may wait out a partition instead of failing after 500 ms.
            checkpoint_timeout: "10s",
            ..Job::new(input, output)
        }
        .write(env, dir, "k2k")
    })
    .await?;
    let mut seen = run.committed;

    let faults: [(&str, Duration); 3] = [
        ("partition", Duration::from_secs(8)),
        ("reset", Duration::from_secs(5)),
        // Longer than librdkafka's request timeouts (30 s): requests fail, the job restarts.
        ("partition", Duration::from_secs(40)),
    ];
    for (fault, length) in faults {
        match fault {
            "partition" => proxy.partition(),
            _ => proxy.reset(),
        }
        tokio::time::sleep(length).await;
        let before = read_committed(env, &run.output, Duration::from_secs(30))?.len();
        proxy.heal();
        let (n, after) = wait_for_more_output(env, &run.output, before, &mut run.job, Duration::from_secs(120)).await?;
        eprintln!("{fault} of {length:?}: commits resumed {after:?} after it healed ({n} records)");
        seen = n;
    }
    let (_, out, _) = run.finish(env).await?;
    assert!(out >= seen);
    eprintln!("{out} records out, 0 duplicates, 0 missing");
    proxy.stop().await;
    Ok(())
}

/// Right after a broker restarts, its group coordinator loads the groups' offsets (seconds with big
/// logs) and answers a group's offsets with COORDINATOR_LOAD_IN_PROGRESS, or, while it is being
/// elected or moves, COORDINATOR_NOT_AVAILABLE or NOT_COORDINATOR; librdkafka hands these to the
/// caller after two tries of its own. A job started then reads two kinds of group offsets at its
/// start: the sink's record of its commits (first) and the source's group offsets
/// (`start = group_offsets`). Here the proxy answers such reads with those errors in turn for 20 s,
/// longer than the job's five start attempts take to fail on them: first only the source's group,
/// then every group. Each time the job waits for the coordinator, says so in its log, starts, and
/// its output is every record once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_started_while_the_group_coordinator_loads_waits_for_it() -> Result<()> {
    let env = TestEnv::get().await?;
    let _one = PROXY.lock().await;
    let (proxy, via_proxy) = env.kafka_proxy().await?;
    for only_the_source in [true, false] {
        let group = unique("coordinator-group");
        let before = proxy.rewritten();
        let mut started = Instant::now();
        let run = Running::on_new_topics(env, "coordinator", |input, output, dir| {
            // From the job's start (its topics exist by now).
            proxy.coordinator_moving(Duration::from_secs(20), if only_the_source { &group } else { "" });
            started = Instant::now();
            Job {
                bootstrap: Some(via_proxy.clone()),
                group: group.clone(),
                start: Some(r#"{ type = "group_offsets", reset = "earliest" }"#),
                ..Job::new(input, output)
            }
            .write(env, dir, "k2k")
        })
        .await?;
        let (rewritten, first_commit) = (proxy.rewritten() - before, started.elapsed());
        let which = if only_the_source {
            "the source's group"
        } else {
            "every group"
        };
        eprintln!("{which}: first commit {first_commit:?} after the start; {rewritten} answers rewritten");
        // The fault was there: reads of group offsets were answered with the coordinator's errors.
        assert!(
            rewritten >= 3,
            "{which}: only {rewritten} OffsetFetch answers rewritten"
        );
        let log = run.job.tail(1_000_000);
        let waited: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("coordinator is loading or moving") && l.contains("asking again"))
            .collect();
        assert!(
            !waited.is_empty(),
            "{which}: the job's log does not say it waited for the group coordinator:\n{}",
            run.job.log(40)
        );
        // Each read that waited says which.
        let source = waited
            .iter()
            .any(|l| l.contains("the source's start offsets") && l.contains(&group));
        let sink = waited
            .iter()
            .any(|l| l.contains("the Kafka sink's record of its commits"));
        // (With every group answered so, the sink reads first and waits the 20 s out.)
        assert_eq!(
            (source, sink),
            (only_the_source, !only_the_source),
            "{which}: {waited:?}"
        );
        let (_, out, _) = run.finish(env).await?;
        eprintln!("{which}: {out} records out, 0 duplicates, 0 missing");
    }
    proxy.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_paused_longer_than_its_transaction_timeout_checkpoints_again_or_fails_loudly() -> Result<()> {
    let env = TestEnv::get().await?;
    let input = unique("pause-in");
    let output = unique("pause-out");
    create_topic(env, &input, 2).await?;
    create_topic(env, &output, 2).await?;
    let dir = tempfile::tempdir()?;
    // A transaction timeout the guardrail accepts for checkpoints that time out after 2 s and
    // 200 ms restart delays (+ 5 s for the restart itself). (With 500 ms checkpoint timeouts and
    // 7 s transactions, a busy machine failed checkpoints at start, each carrying a transaction
    // too old to carry, until the job's start attempts ran out.)
    let args = Job {
        transaction_timeout: "10s",
        checkpoint_timeout: "2s",
        ..Job::new(&input, &output)
    }
    .write(env, dir.path(), "k2k");
    let next = Arc::new(std::sync::Mutex::new(vec![0usize; KEYS]));
    let feeder = feed(env, &input, next.clone());
    let mut job = ChildJob::spawn(exactly(), &args, "")?;
    wait_for_more_output(env, &output, 0, &mut job, Duration::from_secs(60)).await?;

    signal(job.pid(), "STOP")?;
    // The broker aborts transactions open longer than their timeout (checked every second).
    tokio::time::sleep(Duration::from_secs(15)).await;
    let before = read_committed(env, &output, Duration::from_secs(30))?.len();
    signal(job.pid(), "CONT")?;
    let resumed = Instant::now();
    let deadline = resumed + Duration::from_secs(90);
    loop {
        let n = read_committed(env, &output, Duration::from_secs(30))?.len();
        if n > before {
            eprintln!(
                "checkpointing again {:?} after SIGCONT ({n} records)",
                resumed.elapsed()
            );
            break;
        }
        if !job.running() {
            let log = job.log(40);
            if log.contains("DATA LOST") {
                eprintln!("the job ended loudly:\n{log}");
                feeder.finish()?;
                return Ok(());
            }
            bail!("the job exited without checkpointing again and without DATA LOST:\n{log}");
        }
        if Instant::now() > deadline {
            bail!("no checkpoint within 90 s of SIGCONT:\n{}", job.log(40));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    feeder.finish()?;
    job.kill();
    let out = drain_and_verify(env, &args, &output, &next).await?;
    eprintln!("{out} records out, 0 duplicates, 0 missing");
    Ok(())
}
