//! A job restarted against a leader cut off from its peers.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_restarted_against_a_cut_off_leader_reads_nothing_twice() -> Result<()> {
    let image = docker::image("EXACTLY_IMAGE_KAFKA")?;
    let local = TestEnv::get().await?;
    let cluster = Cluster::start(&image)?;
    let outcome = restart_against_a_stale_leader(local, &cluster).await;
    keep_logs(&cluster, &outcome)?;
    outcome
}

/// The leader of each partition of `topic` as the nodes of `env`'s bootstrap list see it.
fn leaders_of(env: &TestEnv, topic: &str) -> Result<Vec<i32>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .create()
        .context("creating a metadata client")?;
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let t = md.topics().first().context("no topic in the metadata")?;
    let mut leaders: Vec<(i32, i32)> = t.partitions().iter().map(|p| (p.id(), p.leader())).collect();
    leaders.sort_unstable();
    Ok(leaders.into_iter().map(|(_, l)| l).collect())
}

/// A job restarted while a node cut off from its peers still believes it leads the input's
/// partitions, and answers the job: the input's end it gives is where the partitions were when
/// it was cut off, behind the positions the job's last checkpoint restores (records read since
/// from the nodes that took over). Taken for a truncated log, the job would read those records
/// again and write them twice. The job's first run reads through all three nodes; cut off, the
/// node is fenced and the others lead the input; the job is restarted knowing only the others
/// and commits what is fed meanwhile; then restarted knowing only the cut-off node, which it asks
/// first for everything (its view of the cluster); the node rejoins; every record once.
async fn restart_against_a_stale_leader(local: &TestEnv, cluster: &Cluster) -> Result<()> {
    let env = &TestEnv {
        kafka_bootstrap: cluster.bootstrap(),
        kafka_log: None,
        kafka_proxied: None,
        ..local.clone()
    };
    // The node cut off: not the transaction coordinator (the job's commits go through it from any
    // view of the cluster), the first replica (leader) of every input partition and of no output
    // partition (its stale view of those is right).
    transactional_producer(env, &unique("sl-first"))?;
    let coordinator = leader_of(env, TRANSACTION_LOG)?;
    let stale = if coordinator == 1 { 2 } else { 1 };
    let others: Vec<i32> = (1..=NODES as i32).filter(|n| *n != stale).collect();
    let (input, output) = (unique("sl-in"), unique("sl-out"));
    create_led_by(env, &input, &[stale]).await?;
    create_led_by(env, &output, &others).await?;
    cluster.wait_until_every_node_lists(&[&input, &output]).await?;
    ensure!(
        leaders_of(env, &input)? == vec![stale; 3],
        "the input is not led by node {stale}"
    );
    let dir = tempfile::tempdir()?;
    let mut spec = Job {
        interval: "500ms",
        checkpoint_timeout: "20s",
        bootstrap: Some(cluster.bootstrap()),
        // A view of the cluster refreshed every 3 s (librdkafka's default is 5 minutes): the
        // restarted job moves off the cut-off node's view soon after it rejoins.
        source_client: Some(r#"{ "topic.metadata.refresh.interval.ms" = "3000" }"#),
        // Attempts that fail while the only node the job knows is cut off are not a job that
        // cannot start: it must wait for the partition to heal.
        restart_attempts: 1000,
        startup_attempts: Some(0),
        ..Job::new(&input, &output)
    };
    let all = spec.write(env, dir.path(), "all");
    let mut run = Running::spawn(env, &input, &output, all, &[]).await?;
    run.stop_feeding()?;
    let cut = cluster.cut_off(stale)?;
    let without = TestEnv {
        kafka_bootstrap: cluster.bootstrap_without(stale),
        ..env.clone()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let leaders = leaders_of(&without, &input);
        if leaders.as_ref().is_ok_and(|l| !l.contains(&stale)) {
            eprintln!("node {stale} cut off; the others lead the input: {leaders:?}");
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "60 s after node {stale} was cut off, the others say the input's leaders are {leaders:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The job again, knowing only the others: it reads what is fed now from the input's new
    // leaders, beyond where the cut-off node's log ends, and commits it.
    run.job.kill();
    spec.bootstrap = Some(cluster.bootstrap_without(stale));
    let through_others = spec.write(env, dir.path(), "others");
    run.job = ChildJob::spawn_env(k2k::exactly(), &through_others, "", &[])?;
    run.feed_again(&without)?;
    let start = committed_count(&without, &run.output, Instant::now() + Duration::from_secs(60)).await?;
    let (first, _) = wait_for_more_output(&without, &run.output, start, &mut run.job, Duration::from_secs(180)).await?;
    let (second, _) =
        wait_for_more_output(&without, &run.output, first, &mut run.job, Duration::from_secs(180)).await?;
    run.stop_feeding()?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut out = second;
    while out < run.fed() {
        ensure!(
            Instant::now() < deadline,
            "{out} of {} records out 120 s after the feeding stopped",
            run.fed()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        out = committed_count(&without, &run.output, Instant::now() + Duration::from_secs(30)).await?;
    }
    eprintln!("through the others: output {start} → {first} → {second} → {out}, all fed");
    run.job.kill();
    // The cut-off node's view, which the job is restarted with below, is the stale one this test
    // is about: it still leads the input, at the ends the partitions had when it was cut off.
    let ends = |bootstrap: &str| -> Result<Vec<i64>> {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("isolation.level", "read_committed")
            .create()?;
        (0..3)
            .map(|p| Ok(c.fetch_watermarks(&input, p, Duration::from_secs(10))?.1))
            .collect()
    };
    let zombie = TestEnv {
        kafka_bootstrap: cluster.addresses[stale as usize - 1].clone(),
        ..env.clone()
    };
    let (stale_ends, ends_now) = (ends(&zombie.kafka_bootstrap)?, ends(&without.kafka_bootstrap)?);
    ensure!(
        stale_ends.iter().zip(&ends_now).all(|(s, n)| s < n),
        "node {stale}'s view is not the stale one this test is about: ends {stale_ends:?} against the others' {ends_now:?}"
    );
    eprintln!("node {stale} answers the input's ends {stale_ends:?}; the others {ends_now:?}");
    // The audit knowing only the cut-off node: the input's ends it answers are where the
    // partitions were when it was cut off, and its view has it read the input there.
    spec.bootstrap = Some(cluster.addresses[stale as usize - 1].clone());
    let through_stale = spec.write(env, dir.path(), "stale");
    k2k::exactly_verify(&through_stale[1], &["--id", "@value"])
        .context("exactly verify through the cut-off node's view")?;
    // Restarted knowing only the cut-off node: the restored positions are beyond the end it
    // answers for the input.
    run.job = ChildJob::spawn_env(k2k::exactly(), &through_stale, "", &[])?;
    tokio::time::sleep(Duration::from_secs(20)).await;
    drop(cut);
    eprintln!("node {stale} back among its peers");
    run.feed_again(env)?;
    let now = committed_count(env, &run.output, Instant::now() + Duration::from_secs(60)).await?;
    let (grown, _) = wait_for_more_output(
        env,
        &run.output,
        now.max(second),
        &mut run.job,
        Duration::from_secs(180),
    )
    .await?;
    eprintln!("the job restarted through node {stale}: output grew to {grown}");
    let log = run.job.tail(10_000_000);
    eprintln!(
        "stale ends seen and passed over: {}; attempt restarts: {}",
        log.matches("a stale view").count(),
        log.matches("restarting").count()
    );
    ensure!(
        !log.contains("was truncated below the position"),
        "the job took the cut-off node's end of the input for a truncated log (it reads those records again):\n{}",
        log.lines()
            .filter(|l| l.contains("truncated"))
            .take(5)
            .collect::<Vec<_>>()
            .join("\n")
    );
    in_sync(env, &[run.input(), &run.output]).await?;
    let (fed, out, restarts) = run.finish(env).await?;
    eprintln!("{fed} records fed, {out} out, 0 duplicates, 0 missing; {restarts} attempt restarts");
    Ok(())
}
