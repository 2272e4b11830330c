//! A node cut off from its peers but not from the job, the transaction coordinator among them.

use super::*;

/// One request to the node at `address` itself (not to whichever node a client learns of), over a
/// connection of its own: `body` after a request header (API `key`, `version`, correlation id 1,
/// no client id); the answer's body (after the correlation id), read within 10 s.
fn request(address: &str, key: i16, version: i16, body: &[u8]) -> Result<Vec<u8>> {
    use std::io::{Read, Write};
    let addr: std::net::SocketAddr = address.parse()?;
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .with_context(|| format!("connecting to {address}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut message = Vec::new();
    message.extend_from_slice(&key.to_be_bytes());
    message.extend_from_slice(&version.to_be_bytes());
    message.extend_from_slice(&1i32.to_be_bytes());
    message.extend_from_slice(&(-1i16).to_be_bytes());
    message.extend_from_slice(body);
    stream.write_all(&(message.len() as i32).to_be_bytes())?;
    stream.write_all(&message)?;
    let mut size = [0u8; 4];
    stream
        .read_exact(&mut size)
        .with_context(|| format!("no answer from {address}"))?;
    let mut answer = vec![0u8; i32::from_be_bytes(size).max(0) as usize];
    stream
        .read_exact(&mut answer)
        .with_context(|| format!("a short answer from {address}"))?;
    ensure!(
        answer.len() >= 4 && answer[..4] == [0, 0, 0, 1],
        "{address} answered another correlation id"
    );
    Ok(answer.split_off(4))
}

/// The node that the node at `address` itself names as the transaction coordinator (every
/// transactional id has the one: the transaction log has one partition): FindCoordinator v1.
fn coordinator_named_by(address: &str) -> Result<i32> {
    let key = b"exactly-probe";
    let mut body = (key.len() as i16).to_be_bytes().to_vec();
    body.extend_from_slice(key);
    body.push(1); // key type: a transactional id
    let answer = request(address, 10, 1, &body)?;
    // throttle_time_ms (4), error_code (2), error_message (nullable string), node_id (4), ...
    let at = |i: usize, n: usize| answer.get(i..i + n).context("FindCoordinator: a short answer");
    let error = i16::from_be_bytes(at(4, 2)?.try_into()?);
    ensure!(error == 0, "{address}: FindCoordinator error code {error}");
    let message = i16::from_be_bytes(at(6, 2)?.try_into()?);
    let node = 8 + message.max(0) as usize;
    Ok(i32::from_be_bytes(at(node, 4)?.try_into()?))
}

/// Waits (60 s at most) until every node but `cut` names another node than `cut` as the
/// transaction coordinator; returns it.
async fn coordinator_moved_off(cluster: &Cluster, cut: i32) -> Result<i32> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let named: Vec<Result<i32>> = (1..=NODES as i32)
            .filter(|n| *n != cut)
            .map(|n| coordinator_named_by(&cluster.addresses[n as usize - 1]))
            .collect();
        if let [Ok(a), Ok(b)] = named.as_slice() {
            if a == b && *a != cut {
                return Ok(*a);
            }
        }
        if Instant::now() > deadline {
            bail!("60 s after node {cut} was cut off, the others name as the transaction coordinator: {named:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_its_peers_but_not_from_the_job_loses_and_doubles_nothing() -> Result<()> {
    let image = docker::image("EXACTLY_IMAGE_KAFKA")?;
    let local = TestEnv::get().await?;
    let cluster = Cluster::start(&image)?;
    let outcome = cut_off_coordinator(local, &cluster).await;
    keep_logs(&cluster, &outcome)?;
    outcome
}

/// The scenario of the test above, on `cluster`.
async fn cut_off_coordinator(local: &TestEnv, cluster: &Cluster) -> Result<()> {
    let env = &TestEnv {
        kafka_bootstrap: cluster.bootstrap(),
        kafka_log: None,
        kafka_proxied: None,
        ..local.clone()
    };
    // The node that will coordinate the job's transactions (the transaction log's one leader,
    // made by a first transactional producer) first in the job's bootstrap list: the server its
    // clients ask first, for their view of the cluster too.
    transactional_producer(env, &unique("np-first"))?;
    let coordinator = leader_of(env, TRANSACTION_LOG)?;
    let bootstrap = format!(
        "{},{}",
        cluster.addresses[coordinator as usize - 1],
        cluster.bootstrap_without(coordinator)
    );
    let (input, output) = (unique("np-in"), unique("np-out"));
    create_led_by(env, &input, &[1, 2, 3]).await?;
    create_led_by(env, &output, &[1, 2, 3]).await?;
    cluster.wait_until_every_node_lists(&[&input, &output]).await?;
    let dir = tempfile::tempdir()?;
    // Checkpoints every 500 ms that may take 20 s (a failover stalls writes for seconds).
    let args = Job {
        interval: "500ms",
        checkpoint_timeout: "20s",
        bootstrap: Some(bootstrap),
        ..Job::new(&input, &output)
    }
    .write(env, dir.path(), "k2k");
    let mut run = Running::spawn(env, &input, &output, args, &[]).await?;
    ensure!(
        leader_of(env, TRANSACTION_LOG)? == coordinator,
        "the transaction log's leader moved before the partition"
    );
    let zombie = cluster.addresses[coordinator as usize - 1].clone();
    let (fenced, n, took, now) = {
        let _cut = cluster.cut_off(coordinator)?;
        // The others fence it (6 s after its last heartbeat; longer when it was the active
        // controller: they elect another first) and move its leaderships.
        let now = coordinator_moved_off(cluster, coordinator).await?;
        // The cut-off node still runs and answers this host, from its old view: it names itself.
        let stale = coordinator_named_by(&zombie)
            .context("the cut-off node does not answer clients: the partition was not the one meant")?;
        ensure!(
            stale == coordinator,
            "the cut-off node names node {stale} as the coordinator, not itself: the stale view this test is about is not there"
        );
        // Read through the others only (the cut-off node's metadata is stale).
        let others = TestEnv {
            kafka_bootstrap: cluster.bootstrap_without(coordinator),
            ..env.clone()
        };
        let fenced = committed_count(&others, &run.output, Instant::now() + Duration::from_secs(60)).await?;
        eprintln!("node {coordinator} cut off, naming itself; the others name node {now}; {fenced} records out");
        // Committed from here on through the node that took over, twice: at least one
        // checkpoint's transactions opened, pre-committed and committed during the partition.
        let (first, took) =
            wait_for_more_output(&others, &run.output, fenced, &mut run.job, Duration::from_secs(180)).await?;
        let (n, _) = wait_for_more_output(&others, &run.output, first, &mut run.job, Duration::from_secs(180)).await?;
        // Still answering clients (what it names by now is logged: seen itself, and others).
        let named = coordinator_named_by(&zombie)
            .context("the cut-off node stopped answering clients: the partition was not the one meant")?;
        eprintln!("the cut-off node, after the job committed through the others, names node {named}");
        (fenced, n, took, now)
    };
    eprintln!(
        "node {coordinator} cut off from its peers, answering clients (node {now} took the transaction log): output {fenced} → {n}, first growth within {took:?}"
    );
    let (grown, _) = wait_for_more_output(env, &run.output, n, &mut run.job, Duration::from_secs(90)).await?;
    eprintln!("node {coordinator} back among its peers: output grew to {grown}");
    // Every replica of the job's topics in sync again before the drain and `exactly verify`:
    // right after the node rejoins, verify has been seen to misread (records reported lost and
    // others "not in input" that the test's own read_committed reader had found once each, in
    // order) — a fault of the audit's reader while the cluster settles, not yet understood; the
    // records themselves were there. Waited out here so that this test checks the partition.
    in_sync(env, &[run.input(), &run.output]).await?;
    let log = run.job.tail(10_000_000);
    eprintln!(
        "commits the producer failed, then made through the coordinator most brokers name: {}; restored transactions committed: {}",
        log.matches("committing its transaction through the coordinator most brokers name").count(),
        log.matches("Committed a restored transaction").count()
    );
    let (fed, out, restarts) = run.finish(env).await?;
    eprintln!("{fed} records fed, {out} out, 0 duplicates, 0 missing; {restarts} attempt restarts");
    Ok(())
}
