//! A Kafka-to-Kafka exactly-once job through a network partition, made real with Docker: three
//! Kafka nodes (the `exactly-kafka` image of `scripts/images`, each broker and controller) on two
//! networks — one their clients reach them on (the job, the feeder and the checks run on this
//! host and reach each node at its own address there), one they reach each other on (replication,
//! the controllers' quorum). `docker network disconnect` takes the node that coordinates the
//! job's transactions off the second (and the host stops forwarding between the two networks,
//! which its connections opened before would otherwise still cross): it can no longer reach its
//! peers nor they it, while it
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

use anyhow::{bail, ensure, Context, Result};
use docker::docker;
use exactly_integration_tests::{transactional_producer, unique, ChildJob, TestEnv};
use k2k::{committed_count, leader_of, wait_for_more_output, Job, Running, TRANSACTION_LOG};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

#[path = "kafka_network_partition/coordinator.rs"]
mod coordinator;
#[path = "kafka_network_partition/stale_leader.rs"]
mod stale_leader;

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
    /// The host's bridge interfaces of the two networks (clients', peers').
    bridges: (String, String),
    /// Each node's address on the peers' network (its listeners for them are bound to it).
    peer_addresses: Vec<String>,
}

impl Cluster {
    fn start(image: &str) -> Result<Cluster> {
        let id = unique("part");
        let label = docker::run_label();
        // Bridge names of at most 15 characters, unique to this cluster.
        let short = &id[id.len().saturating_sub(8)..];
        let mut cluster = Cluster {
            nodes: Vec::new(),
            peers: format!("{id}-peers"),
            clients: String::new(),
            addresses: Vec::new(),
            bridges: (format!("exc-{short}"), format!("exp-{short}")),
            peer_addresses: Vec::new(),
        };
        // Fixed addresses need subnets of the test's choosing: ones no other network of the
        // engine's (or this host's) takes, tried until one is free.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .subsec_nanos();
        let seed = std::process::id() as usize ^ nanos as usize;
        let clients = format!("{id}-clients");
        let bridge = cluster.bridges.0.clone();
        let prefix = network(&clients, &bridge, false, seed)?;
        cluster.clients = clients;
        let bridge = cluster.bridges.1.clone();
        let peers_prefix = network(&cluster.peers, &bridge, true, seed + 1)?;
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
            let peer_address = format!("{peers_prefix}.{}", 10 + n);
            docker(&[
                "network",
                "connect",
                "--alias",
                &peer(n),
                "--ip",
                &peer_address,
                &cluster.peers,
                &container,
            ])?;
            cluster.peer_addresses.push(peer_address);
        }
        for container in &cluster.nodes {
            docker(&["start", container])?;
        }
        cluster.wait_until_formed()?;
        Ok(cluster)
    }

    /// Waits (60 s at most) until every node's own metadata lists every partition of `topics`
    /// with a leader: a topic just created is known to the nodes a moment later, and a job
    /// started before refuses a topic a node does not know yet.
    async fn wait_until_every_node_lists(&self, topics: &[&str]) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        for address in &self.addresses {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", address)
                .create()
                .context("creating a metadata client")?;
            for topic in topics {
                loop {
                    let listed = consumer
                        .fetch_metadata(Some(topic), Duration::from_secs(10))
                        .ok()
                        .and_then(|md| {
                            md.topics().first().map(|t| {
                                t.error().is_none()
                                    && t.partitions().len() == 3
                                    && t.partitions().iter().all(|p| p.leader() >= 0)
                            })
                        })
                        .unwrap_or(false);
                    if listed {
                        break;
                    }
                    ensure!(
                        Instant::now() < deadline,
                        "{address} does not list {topic} 60 s after its creation"
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        Ok(())
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

    /// Takes node `node` off the peers' network until the returned guard is dropped. Its
    /// connections to its peers made before stay open, though: their packets, sent from its old
    /// address on the peers' network, go out through the clients' network and the host forwards
    /// them to the peers' (seen: the cut-off node went on replicating the controllers' log and
    /// learnt it was fenced). So the host also drops what it would forward between the two
    /// networks (iptables, in Docker's DOCKER-USER chain, for as long as the cut lasts).
    fn cut_off(&self, node: i32) -> Result<CutOff<'_>> {
        let container = &self.nodes[node as usize - 1];
        let cut = CutOff { cluster: self, node };
        cut.forwarding("-I")?;
        docker(&["network", "disconnect", &self.peers, container])?;
        Ok(cut)
    }
}

/// Creates network `name` (`internal`: no traffic beyond it) with bridge interface `bridge` on a
/// /24 subnet of 10.200.0.0–10.249.255.0 that no other network takes (tried from `seed`, 20 at
/// most); returns the subnet's first three octets.
fn network(name: &str, bridge: &str, internal: bool, seed: usize) -> Result<String> {
    let label = docker::run_label();
    let bridge = format!("com.docker.network.bridge.name={bridge}");
    for attempt in 0..20 {
        let prefix = format!(
            "10.{}.{}",
            200 + (seed + attempt * 7) % 50,
            (seed / 50 + attempt * 13) % 256
        );
        let subnet = format!("{prefix}.0/24");
        let mut args = vec![
            "network", "create", "--label", &label, "--subnet", &subnet, "-o", &bridge,
        ];
        if internal {
            args.push("--internal");
        }
        args.push(name);
        match docker(&args) {
            Ok(_) => return Ok(prefix),
            Err(e) => eprintln!("subnet {subnet}: {e:#}; trying another"),
        }
    }
    bail!("no free subnet for network {name} in 20 tries")
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

/// A node cut off from its peers; reconnected (under its peer name, at its address there: its
/// listeners for them are bound to it) when dropped, also when the test fails.
struct CutOff<'a> {
    cluster: &'a Cluster,
    node: i32,
}

impl CutOff<'_> {
    /// Inserts (`-I`) or deletes (`-D`) the host's rules that drop traffic forwarded between the
    /// two networks, both ways.
    fn forwarding(&self, how: &str) -> Result<()> {
        let (clients, peers) = &self.cluster.bridges;
        for (from, to) in [(clients, peers), (peers, clients)] {
            let out = std::process::Command::new("iptables")
                .args([how, "DOCKER-USER", "-i", from, "-o", to, "-j", "DROP"])
                .output()
                .context("running iptables (this test needs root on the Docker host, as dockerd has)")?;
            ensure!(
                out.status.success(),
                "iptables {how} DOCKER-USER -i {from} -o {to} -j DROP: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }
}

impl Drop for CutOff<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.forwarding("-D") {
            eprintln!("removing the cut's iptables rules: {e:#}");
        }
        let container = &self.cluster.nodes[self.node as usize - 1];
        let alias = container.replace("-kafka-", "-peer-");
        let address = &self.cluster.peer_addresses[self.node as usize - 1];
        if let Err(e) = docker(&[
            "network",
            "connect",
            "--alias",
            &alias,
            "--ip",
            address,
            &self.cluster.peers,
            container,
        ]) {
            eprintln!("reconnecting node {}: {e:#}", self.node);
        }
    }
}

/// Waits (120 s at most) until every partition of `topics` has all three replicas in sync.
async fn in_sync(env: &TestEnv, topics: &[&str]) -> Result<()> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .create()
        .context("creating a metadata client")?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut short = Vec::new();
        for topic in topics {
            match consumer.fetch_metadata(Some(topic), Duration::from_secs(10)) {
                Ok(md) => {
                    for t in md.topics() {
                        for p in t.partitions() {
                            if p.isr().len() < NODES as usize {
                                short.push(format!("{}-{} {:?}", t.name(), p.id(), p.isr()));
                            }
                        }
                    }
                }
                Err(e) => short.push(format!("{topic}: {e}")),
            }
        }
        if short.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("120 s after the node rejoined, partitions not in sync: {short:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The nodes' logs kept when a test failed (the containers go with the cluster).
fn keep_logs(cluster: &Cluster, outcome: &Result<()>) -> Result<()> {
    if outcome.is_err() {
        let dir = std::env::temp_dir().join(&cluster.peers);
        std::fs::create_dir_all(&dir)?;
        for node in &cluster.nodes {
            std::fs::write(dir.join(format!("{node}.log")), docker::logs(node, 1_000_000))?;
        }
        eprintln!("the Kafka nodes' logs are in {}", dir.display());
    }
    Ok(())
}

/// Creates `topic` with three partitions, partition p first replicated on (so led by) node
/// `leaders[p % leaders.len()]`, then on the others.
async fn create_led_by(env: &TestEnv, topic: &str, leaders: &[i32]) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .create()
        .context("creating an admin client")?;
    let replicas: Vec<Vec<i32>> = (0..3)
        .map(|p| {
            let leader = leaders[p % leaders.len()];
            std::iter::once(leader)
                .chain((1..=NODES as i32).filter(|n| *n != leader))
                .collect()
        })
        .collect();
    let slices: Vec<&[i32]> = replicas.iter().map(Vec::as_slice).collect();
    let new = NewTopic::new(topic, 3, TopicReplication::Variable(&slices));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in admin.create_topics([&new], &options).await? {
        result.map_err(|(t, e)| anyhow::anyhow!("creating {t}: {e}"))?;
    }
    Ok(())
}
