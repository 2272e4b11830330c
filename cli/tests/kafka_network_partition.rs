//! A Kafka-to-Kafka exactly-once job through a network partition, made real with Docker: three
//! Kafka nodes (the `exactly-kafka` image of `scripts/images`, each broker and controller) on two
//! networks — one their clients reach them on (the job, the feeder and the checks run on this
//! host and reach each node at its own address there), one they reach each other on (replication,
//! the controllers' quorum). `docker network disconnect` takes the node that coordinates the
//! job's transactions off the second: it can no longer reach its peers nor they it, while it
//! still runs and still answers the job's clients — with its stale view of what it leads, as a
//! node on the wrong side of a real partition does (unlike a SIGSTOPped node, which answers
//! nothing, or a killed one, whose connections are refused). The others fence it and take over
//! its partitions and the transaction log; the job must commit through them while the cut-off
//! node still answers, and go on once it rejoins. Every record exactly once, in order per key
//! (`drain_and_verify`, then `exactly verify`).
//!
//! Needs a Docker engine and the Kafka image: `scripts/images build kafka && eval "$(scripts/images env)"`
//! (`scripts/test` does both).

mod docker;
mod k2k;

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use docker::docker;
use exactly_integration_tests::{transactional_producer, unique, TestEnv};
use k2k::{committed_count, leader_of, wait_for_more_output, Job, Running, TRANSACTION_LOG};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

const NODES: u8 = 3;

/// Three Kafka nodes in containers, removed (with their networks) when dropped.
struct Cluster {
    /// Container names, node 1 first.
    nodes: Vec<String>,
    /// The network the nodes reach each other on.
    peers: String,
    /// The network their clients reach them on (from this host).
    clients: String,
    /// Each node's address on the clients' network (port 9092).
    addresses: Vec<String>,
}

impl Cluster {
    fn start(image: &str) -> Result<Cluster> {
        let id = unique("part");
        let label = docker::run_label();
        let mut cluster = Cluster {
            nodes: Vec::new(),
            peers: format!("{id}-peers"),
            clients: String::new(),
            addresses: Vec::new(),
        };
        // Fixed addresses need a subnet of the test's choosing: one no other network of the
        // engine's (or this host's) takes, tried until one is free.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .subsec_nanos();
        let seed = std::process::id() as usize ^ nanos as usize;
        let name = format!("{id}-clients");
        let mut prefix = None;
        for attempt in 0..20 {
            let candidate = format!(
                "10.{}.{}",
                200 + (seed + attempt * 7) % 50,
                (seed / 50 + attempt * 13) % 256
            );
            let subnet = format!("{candidate}.0/24");
            match docker(&["network", "create", "--label", &label, "--subnet", &subnet, &name]) {
                Ok(_) => {
                    prefix = Some(candidate);
                    break;
                }
                Err(e) => eprintln!("subnet {subnet}: {e:#}; trying another"),
            }
        }
        let prefix = prefix.context("no free subnet for the clients' network in 20 tries")?;
        cluster.clients = name;
        docker(&["network", "create", "--label", &label, "--internal", &cluster.peers])?;
        let cluster_id = docker(&[
            "run",
            "--rm",
            "--label",
            &label,
            "--entrypoint",
            "java",
            image,
            "-cp",
            "/opt/kafka/libs/*",
            "kafka.tools.StorageTool",
            "random-uuid",
        ])?
        .lines()
        .last()
        .unwrap_or_default()
        .to_owned();
        // Peers know each other by names that resolve on the peers' network only: cut off from
        // it, a node cannot reach them through the clients' network either.
        let peer = |n: u8| format!("{id}-peer-{n}");
        let voters: Vec<String> = (1..=NODES).map(|n| format!("{n}@{}:9093", peer(n))).collect();
        let voters = voters.join(",");
        // As production clusters run (and scripts/services' cluster): three replicas, two in sync;
        // one partition for the group offsets and one for the transaction log, so that one node
        // coordinates every transactional id; a node fenced 6 s after its last heartbeat.
        let properties = [
            "offsets.topic.num.partitions=1",
            "transaction.state.log.num.partitions=1",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms=1000",
            "broker.session.timeout.ms=6000",
            "broker.heartbeat.interval.ms=1000",
        ]
        .join("\n");
        for n in 1..=NODES {
            let container = format!("{id}-kafka-{n}");
            let address = format!("{prefix}.{}", 10 + n);
            docker(&[
                "create",
                "--name",
                &container,
                "--label",
                &label,
                "--network",
                &cluster.clients,
                "--ip",
                &address,
                "-e",
                &format!("KAFKA_NODE_ID={n}"),
                "-e",
                &format!("KAFKA_ADVERTISED_HOST={address}"),
                "-e",
                &format!("KAFKA_INTERNAL_HOST={}", peer(n)),
                "-e",
                &format!("KAFKA_VOTERS={voters}"),
                "-e",
                &format!("KAFKA_CLUSTER_ID={cluster_id}"),
                "-e",
                "KAFKA_REPLICATION=3",
                "-e",
                &format!("KAFKA_PROPERTIES={properties}"),
                image,
            ])?;
            cluster.nodes.push(container.clone());
            cluster.addresses.push(format!("{address}:9092"));
            docker(&["network", "connect", "--alias", &peer(n), &cluster.peers, &container])?;
        }
        for container in &cluster.nodes {
            docker(&["start", container])?;
        }
        cluster.wait_until_formed()?;
        Ok(cluster)
    }

    /// Every node's address on the clients' network, as a bootstrap list.
    fn bootstrap(&self) -> String {
        self.addresses.join(",")
    }

    /// The addresses of every node but `node`.
    fn bootstrap_without(&self, node: i32) -> String {
        let others: Vec<&str> = (1..=NODES as i32)
            .filter(|n| *n != node)
            .map(|n| self.addresses[n as usize - 1].as_str())
            .collect();
        others.join(",")
    }

    /// Waits (120 s at most) until each node is healthy (its image's check: it answers requests)
    /// and the metadata lists all three brokers.
    fn wait_until_formed(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .create()
            .context("creating a metadata client")?;
        loop {
            let healthy = self
                .nodes
                .iter()
                .filter(|c| docker(&["inspect", "-f", "{{.State.Health.Status}}", c]).is_ok_and(|s| s == "healthy"))
                .count();
            let brokers = consumer
                .fetch_metadata(None, Duration::from_secs(5))
                .map(|m| m.brokers().len())
                .unwrap_or(0);
            if healthy == NODES as usize && brokers == NODES as usize {
                return Ok(());
            }
            if Instant::now() > deadline {
                let logs: Vec<String> = self
                    .nodes
                    .iter()
                    .map(|c| format!("{c}:\n{}", docker::logs(c, 20)))
                    .collect();
                bail!(
                    "the cluster did not form within 120 s ({healthy} nodes healthy, {brokers} brokers listed):\n{}",
                    logs.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Takes node `node` off the peers' network until the returned guard is dropped.
    fn cut_off(&self, node: i32) -> Result<CutOff<'_>> {
        let container = &self.nodes[node as usize - 1];
        docker(&["network", "disconnect", &self.peers, container])?;
        Ok(CutOff { cluster: self, node })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for container in &self.nodes {
            let _ = docker(&["rm", "-f", container]);
        }
        for network in [&self.peers, &self.clients] {
            if !network.is_empty() {
                let _ = docker(&["network", "rm", network]);
            }
        }
    }
}

/// A node cut off from its peers; reconnected (under its peer name) when dropped, also when the
/// test fails.
struct CutOff<'a> {
    cluster: &'a Cluster,
    node: i32,
}

impl Drop for CutOff<'_> {
    fn drop(&mut self) {
        let container = &self.cluster.nodes[self.node as usize - 1];
        let alias = container.replace("-kafka-", "-peer-");
        if let Err(e) = docker(&["network", "connect", "--alias", &alias, &self.cluster.peers, container]) {
            eprintln!("reconnecting node {}: {e:#}", self.node);
        }
    }
}

/// Whether the node at `address` itself answers a request from this host (an ApiVersions request,
/// v0, correlation id 1, within 10 s; a metadata client would ask whichever node it learns of).
fn answers(address: &str) -> Result<()> {
    use std::io::{Read, Write};
    let addr: std::net::SocketAddr = address.parse()?;
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .with_context(|| format!("connecting to {address}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    // Size 10; API key 18 (ApiVersions), version 0, correlation id 1, no client id.
    stream.write_all(&[0, 0, 0, 10, 0, 18, 0, 0, 0, 0, 0, 1, 0xff, 0xff])?;
    let mut answer = [0u8; 8];
    stream
        .read_exact(&mut answer)
        .with_context(|| format!("no answer from {address}"))?;
    if answer[4..8] != [0, 0, 0, 1] {
        bail!("{address} answered {answer:?}, not to correlation id 1");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_its_peers_but_not_from_the_job_loses_and_doubles_nothing() -> Result<()> {
    let image = docker::image("EXACTLY_IMAGE_KAFKA")?;
    let local = TestEnv::get().await?;
    let cluster = Cluster::start(&image)?;
    let outcome = cut_off_coordinator(local, &cluster).await;
    if outcome.is_err() {
        // The nodes' logs, kept: the containers go with the cluster.
        let dir = std::env::temp_dir().join(&cluster.peers);
        std::fs::create_dir_all(&dir)?;
        for node in &cluster.nodes {
            std::fs::write(dir.join(format!("{node}.log")), docker::logs(node, 1_000_000))?;
        }
        eprintln!("the Kafka nodes' logs are in {}", dir.display());
    }
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
    let mut run = Running::on_new_topics(env, "np", |i, o, d| {
        // Checkpoints every 500 ms that may take 20 s (a failover stalls writes for seconds).
        Job {
            interval: "500ms",
            checkpoint_timeout: "20s",
            bootstrap: Some(bootstrap),
            ..Job::new(i, o)
        }
        .write(env, d, "k2k")
    })
    .await?;
    assert_eq!(
        leader_of(env, TRANSACTION_LOG)?,
        coordinator,
        "the transaction log's leader moved before the partition"
    );
    let zombie = cluster.addresses[coordinator as usize - 1].clone();
    let (fenced, n, took, now) = {
        let _cut = cluster.cut_off(coordinator)?;
        // Past the session (6 s): the others have fenced it and moved its leaderships.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let others = TestEnv {
            kafka_bootstrap: cluster.bootstrap_without(coordinator),
            ..env.clone()
        };
        let now = leader_of(&others, TRANSACTION_LOG)?;
        assert_ne!(
            now, coordinator,
            "the transaction log's leader did not move off the cut-off node"
        );
        // The cut-off node still runs and answers this host, as a node beyond a real partition.
        answers(&zombie).context("the cut-off node does not answer clients: the partition was not the one meant")?;
        let fenced = committed_count(env, &run.output, Instant::now() + Duration::from_secs(60)).await?;
        // Committed from here on without the cut-off node, through the node that took over.
        eprintln!("node {coordinator} cut off; node {now} leads the transaction log; {fenced} records out");
        let (n, took) = wait_for_more_output(env, &run.output, fenced, &mut run.job, Duration::from_secs(180)).await?;
        answers(&zombie).context("the cut-off node stopped answering clients: the partition was not the one meant")?;
        (fenced, n, took, now)
    };
    eprintln!(
        "node {coordinator} cut off (node {now} took the transaction log): output {fenced} → {n} within {took:?}"
    );
    let (grown, _) = wait_for_more_output(env, &run.output, n, &mut run.job, Duration::from_secs(90)).await?;
    eprintln!("node {coordinator} back among its peers: output grew to {grown}");
    let (fed, out, restarts) = run.finish(env).await?;
    eprintln!("{fed} records fed, {out} out, 0 duplicates, 0 missing; {restarts} attempt restarts");
    Ok(())
}
