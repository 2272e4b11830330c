//! What the job's log says while the Kafka broker is gone for 20 s: a person reading it must see
//! the outage (which broker, from which clients) and its end (how long it lasted), not thousands
//! of librdkafka's per-connection errors repeated by every client on every retry. Alone in its
//! test binary: no other test may use the broker while it is down.

mod k2k;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use exactly_integration_tests::{read_committed, TestEnv};
use k2k::{job_args, wait_for_more_output, Running};

/// The level of a text log line (`2026-12-06T19:34:15.123Z  WARN target: message`).
fn level(line: &str) -> Option<&str> {
    line.split_whitespace()
        .nth(1)
        .filter(|l| ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(l))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_20_second_broker_outage_is_logged_once_per_client_kind() -> Result<()> {
    let env = TestEnv::get().await?;
    let mut run = Running::on_new_topics(env, "bo", |i, o, d| job_args(env, i, o, d)).await?;
    // The feeder cannot produce while the broker is down: stop it first.
    run.stop_feeding()?;
    let before = read_committed(env, &run.output, Duration::from_secs(30))?.len();

    let from = run.job.line_count();
    env.services("kill-kafka")?;
    tokio::time::sleep(Duration::from_secs(20)).await;
    env.services("start-kafka")?;
    let back = Instant::now();
    run.feed_again(env)?;
    wait_for_more_output(env, &run.output, before, &mut run.job, Duration::from_secs(180)).await?;
    // Each kind that said the outage says its end once its clients' statistics (every 5 s) show
    // a connection to the broker again: waited for (60 s at most), not timed.
    let said = |lines: &[String], what: &str| -> Vec<String> {
        let mut kinds: Vec<String> = lines
            .iter()
            .filter(|l| l.contains(what))
            .filter_map(|l| l.split("client=").nth(1))
            .filter_map(|k| k.split_whitespace().next())
            .map(str::to_owned)
            .collect();
        kinds.sort();
        kinds
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let lines = run.job.lines_from(from);
        let down = said(&lines, "cannot reach the Kafka broker");
        if !down.is_empty() && said(&lines, "again after") == down || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("the log settled {:?} after the broker was back", back.elapsed());
    let lines = run.job.lines_from(from);

    let mut by_level = BTreeMap::<&str, usize>::new();
    for line in &lines {
        *by_level.entry(level(line).unwrap_or("other")).or_default() += 1;
    }
    eprintln!(
        "a 20 s broker outage: {} log lines ({by_level:?}):\n{}",
        lines.len(),
        lines.join("\n")
    );
    // librdkafka's per-connection stream stays at debug.
    let raw: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("Connect to ipv") || l.contains("brokers are down"))
        .collect();
    assert!(
        raw.is_empty(),
        "librdkafka's per-connection errors above debug: {raw:#?}"
    );
    // Said once per client kind at WARN, with the broker's address…
    let address = &env.kafka_bootstrap;
    let down: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("cannot reach the Kafka broker") && l.contains(address.as_str()))
        .collect();
    assert!(
        !down.is_empty(),
        "the outage is not said with the broker's address {address}"
    );
    for line in &down {
        assert_eq!(level(line), Some("WARN"), "{line}");
    }
    let down_kinds = said(&lines, "cannot reach the Kafka broker");
    let mut unique_kinds = down_kinds.clone();
    unique_kinds.dedup();
    assert_eq!(
        down_kinds, unique_kinds,
        "a client kind said the outage more than once: {down:#?}"
    );
    // …and once when it is back, with how long it was gone: the 20 s at least.
    let up: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("reaches the Kafka broker") && l.contains(address.as_str()) && l.contains("again after"))
        .collect();
    assert_eq!(
        said(&lines, "again after"),
        down_kinds,
        "each client kind that said the outage says its end:\n{up:#?}"
    );
    for line in &up {
        let gone: u64 = line
            .split("gone_s=")
            .nth(1)
            .and_then(|g| g.split_whitespace().next())
            .and_then(|g| g.parse().ok())
            .unwrap_or_else(|| panic!("no gone_s in {line}"));
        assert!(
            gone >= 19,
            "gone for {gone} s, but the broker was down for 20 s: {line}"
        );
    }
    // What is left besides the job's routine lines (each completed checkpoint, the progress
    // line) is its own account of the outage — an aborted checkpoint, how many aborted in a row,
    // attempt restarts and their causes if any: a few lines, not a flood (before the outage log:
    // 956 lines, 631 of them ERRORs, for the same 20 s).
    let routine = |l: &&String| l.contains("Checkpoint complete.") || l.contains(" Progress. ");
    let told: Vec<&String> = lines.iter().filter(|l| !routine(l)).collect();
    assert!(
        told.len() <= 30,
        "{} lines about one 20 s outage:\n{told:#?}",
        told.len()
    );
    // Every line of the run reads as words and numbers: no Rust debug text of a value not yet
    // known (the progress line said `lag=Some(18619)` before).
    let all = run.job.lines_from(0);
    let debug: Vec<&String> = all
        .iter()
        .filter(|l| l.contains("=Some(") || l.contains("=None"))
        .collect();
    assert!(debug.is_empty(), "log lines with Rust debug text: {debug:#?}");
    assert!(
        all.iter().any(|l| l.contains(" Progress. ") && l.contains(" lag=")),
        "no progress line with the lag to check"
    );
    let (_, out, restarts) = run.finish(env).await?;
    eprintln!("{out} records out, 0 duplicates, 0 missing; {restarts} attempt restarts");
    Ok(())
}
