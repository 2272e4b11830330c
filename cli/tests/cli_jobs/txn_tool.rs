//! `exactly txn`: lists and aborts hanging transactions, sparing those a checkpoint still commits.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_tool_lists_and_aborts_hanging_transactions_but_spares_pending_commits() -> Result<()> {
    let env = TestEnv::get().await?;
    let (input, output, prefix) = (unique("txn-in"), unique("txn-out"), unique("txn"));
    create_topic(env, &input, 2).await?;
    create_topic(env, &output, 2).await?;
    let dir = tempfile::tempdir()?;
    let file = K2k {
        env,
        name: &unique("txn-job"),
        input: &input,
        output: &output,
        prefix: &prefix,
        dir: dir.path(),
        parallelism: 1,
        admin: None,
        transforms: "",
    }
    .write();
    // Input keeps arriving at a steady rate (one producer, a record every 2 ms), and checkpoints
    // are at least 400 ms apart, so every checkpoint's transaction holds records once the job
    // reads.
    let produced = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = {
        let (bootstrap, input, produced, stop) = (
            env.kafka_bootstrap.clone(),
            input.clone(),
            produced.clone(),
            stop.clone(),
        );
        std::thread::spawn(move || -> Result<()> {
            use rdkafka::producer::Producer as _;
            let p: rdkafka::producer::BaseProducer = rdkafka::ClientConfig::new()
                .set("bootstrap.servers", &bootstrap)
                .set("enable.idempotence", "true")
                .set("linger.ms", "1")
                .create()?;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for (k, v) in orders(n..n + 5) {
                    p.send(rdkafka::producer::BaseRecord::to(&input).key(&k).payload(&v))
                        .map_err(|(e, _)| e)?;
                }
                n += 5;
                p.poll(Duration::from_millis(10));
            }
            p.flush(Duration::from_secs(30))?;
            produced.store(n, Ordering::Relaxed);
            Ok(())
        })
    };
    let text =
        std::fs::read_to_string(&file)?.replace("interval = \"500ms\"", "interval = \"500ms\"\nmin_pause = \"400ms\"");
    std::fs::write(&file, text)?;
    // Freeze after the fifth checkpoint is durable (the job reads by then), before its
    // transaction is committed.
    let mut job = spawn_run(&file, &[], "checkpoint.after_durable=freeze@5")?;
    job.wait_for_failpoint("checkpoint.after_durable", Duration::from_secs(90))?;
    // Records after the barrier go into the next transaction, which nothing will commit.
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    feeder.join().expect("feeder")?;
    let total = produced.load(Ordering::Relaxed);
    job.kill();

    let bootstrap = env.kafka_bootstrap.as_str();
    let checkpoints = dir.path().join("checkpoints");
    let listed: serde_json::Value = serde_json::from_str(&stdout(
        cmd()
            .args([
                "txn",
                "list",
                "--json",
                "--bootstrap",
                bootstrap,
                "--prefix",
                &prefix,
                "--checkpoints",
            ])
            .arg(&checkpoints),
    ))?;
    let ongoing: Vec<&serde_json::Value> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["state"] == "Ongoing")
        .collect();
    let needed: Vec<_> = ongoing.iter().filter(|t| !t["needed_by"].is_null()).collect();
    let lingering: Vec<_> = ongoing.iter().filter(|t| t["needed_by"].is_null()).collect();
    assert_eq!(needed.len(), 1, "{listed:#}");
    assert!(!lingering.is_empty(), "{listed:#}");
    assert!(
        lingering
            .iter()
            .all(|t| !t["partitions"].as_array().unwrap().is_empty() && t["age_ms"].as_i64() > Some(0)),
        "{listed:#}"
    );
    let table = stdout(cmd().args(["txn", "list", "--bootstrap", bootstrap, "--prefix", &prefix]));
    assert!(
        table.contains("Ongoing") && table.contains(&format!("{output}-")),
        "{table}"
    );

    let dry = stdout(
        cmd()
            .args([
                "txn",
                "abort",
                "--dry-run",
                "--bootstrap",
                bootstrap,
                "--prefix",
                &prefix,
                "--checkpoints",
            ])
            .arg(&checkpoints),
    );
    assert!(dry.contains("would abort") && dry.contains("spared"), "{dry}");
    let aborted: serde_json::Value = serde_json::from_str(&stdout(
        cmd()
            .args([
                "txn",
                "abort",
                "--json",
                "--bootstrap",
                bootstrap,
                "--prefix",
                &prefix,
                "--checkpoints",
            ])
            .arg(&checkpoints),
    ))?;
    let outcomes: Vec<(String, String)> = aborted
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["transactional_id"].as_str().unwrap().to_owned(),
                r["outcome"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        outcomes.iter().filter(|(_, o)| o == "aborted").count(),
        lingering.len(),
        "{outcomes:?}"
    );
    assert!(
        outcomes
            .iter()
            .any(|(id, o)| id == needed[0]["transactional_id"].as_str().unwrap() && o.starts_with("spared")),
        "{outcomes:?}"
    );
    let after: serde_json::Value = serde_json::from_str(&stdout(
        cmd()
            .args([
                "txn",
                "list",
                "--json",
                "--bootstrap",
                bootstrap,
                "--prefix",
                &prefix,
                "--checkpoints",
            ])
            .arg(&checkpoints),
    ))?;
    let still: Vec<_> = after
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["state"] == "Ongoing")
        .collect();
    assert_eq!(still.len(), 1, "only the needed transaction stays open: {after:#}");
    assert!(!still[0]["needed_by"].is_null());

    // The restarted job commits what the checkpoint recorded and re-reads the rest.
    let mut job = spawn_run(&file, &[], "")?;
    let seen = wait_for_committed(env, &output, total as usize, Duration::from_secs(90))?;
    assert!(
        seen.len() >= total as usize,
        "{} of {total}:\n{}",
        seen.len(),
        job.tail(30)
    );
    signal(job.pid(), "TERM")?;
    wait_exit(&mut job, Duration::from_secs(30))?;
    let records = read_committed(env, &output, Duration::from_secs(60))?;
    let mut ids: Vec<u64> = records
        .iter()
        .map(|r| {
            serde_json::from_slice::<serde_json::Value>(r.value.as_deref().unwrap()).unwrap()["id"]
                .as_u64()
                .unwrap()
        })
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..total).collect::<Vec<_>>());
    Ok(())
}
