//! Kafka-to-Kafka exactly-once jobs against a cluster of three brokers, as production runs Kafka
//! (`scripts/services up cluster`: every topic with three replicas, two in sync required, one
//! partition for the group offsets and one for the transaction log, so one node coordinates every
//! transactional id): partition leaders and coordinators move when a node dies, which a single
//! broker never shows. The first two tests' jobs reach the cluster over SASL_SSL (SCRAM-SHA-512,
//! the cluster's test CA), as production clusters are reached: their clients connect and
//! authenticate anew at each node a leader or coordinator moves to; the third's in plaintext.
//!
//! - Each node SIGKILLed in turn while the job runs with input arriving (the partitions it led,
//!   the transaction coordinator and the group coordinator move to the others, then some back):
//!   the job goes on committing while a node is down, and the read_committed output ends with
//!   every record exactly once, in order per key (`drain_and_verify`, then `exactly verify`).
//! - The job SIGKILLed after a durable checkpoint, before its commits, and then the node that
//!   coordinates its transactions: the restart commits the checkpoint's transactions through the
//!   node that took over (the output grows while the old coordinator is still down), exactly once.
//! - Two nodes down at once for 20 s (no controller quorum, no partition writable): the job
//!   stalls and, once they return, goes on; exactly once.
//! - The transaction coordinator's node stopped (SIGSTOP: a network stall, its connections open
//!   and silent) until the cluster has fenced it and the job has committed through the node that
//!   took over; then it answers again; exactly once. It found a loss (an EndTxn waited on the
//!   silent node until the new coordinator had aborted its transaction) and stalls of a minute
//!   and more (the source's group commit waited on the silent group coordinator; each producer
//!   paid 30 s request timeouts in a row to find the moved coordinator): see
//!   `kafka-sink`'s `pool::request_timeout` and `kafka-source`'s `commit_to_group`.
//!
//! The tests take turns (`ONE_AT_A_TIME`): each kills nodes the others' jobs use.

mod k2k;

use std::time::Duration;

use anyhow::{Context, Result};
use exactly_integration_tests::{create_topic, read_committed, unique, ChildJob, TestEnv};
use k2k::{
    committed_count, drain_and_verify, exactly, killed_before_its_commits, leader_of, wait_for_more_output, Job,
    Running, TRANSACTION_LOG,
};

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A cluster node a test stopped — SIGKILLed (started again when dropped), or SIGSTOPped (it
/// stops answering, its connections stay open, as when its network stalls; SIGCONTed when
/// dropped) — brought back also when the test fails, so the next test finds three nodes.
struct Stopped<'a> {
    env: &'a TestEnv,
    node: i32,
    /// The `scripts/services` command that brings it back (`start` or `resume`).
    undo: &'static str,
}

impl<'a> Stopped<'a> {
    fn killed(env: &'a TestEnv, node: i32) -> Result<Self> {
        Self::by(env, node, "kill", "start")
    }

    fn paused(env: &'a TestEnv, node: i32) -> Result<Self> {
        Self::by(env, node, "pause", "resume")
    }

    fn by(env: &'a TestEnv, node: i32, how: &str, undo: &'static str) -> Result<Self> {
        env.services(&format!("{how}-cluster-{node}"))?;
        Ok(Stopped { env, node, undo })
    }
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.env.services(&format!("{}-cluster-{}", self.undo, self.node)) {
            eprintln!("{} cluster node {} failed: {e:#}", self.undo, self.node);
        }
    }
}

/// The job file of these tests: two subtasks, checkpoints every 500 ms that may take 20 s (a
/// failover stalls writes for seconds; the tests are about failover, not checkpoint timeouts).
fn job_args(env: &TestEnv, input: &str, output: &str, dir: &std::path::Path) -> Vec<String> {
    Job {
        interval: "500ms",
        checkpoint_timeout: "20s",
        ..Job::new(input, output)
    }
    .write(env, dir, "k2k")
}

/// The cluster's SASL_SSL listeners (SCRAM-SHA-512, user `user`, the password in
/// `EXACTLY_KAFKA_SCRAM_PASSWORD`; TLS certificates of the CA in `tls`).
struct Secured {
    sasl_ssl: String,
    tls: String,
    user: String,
}

fn secured() -> Result<Secured> {
    let var = |name: &str| {
        std::env::var(name).with_context(|| {
            format!(
                "{name} is not set: this test needs the cluster's SASL_SSL listeners, which \
                 `scripts/services up cluster` configures (then `eval \"$(scripts/services env)\"`)"
            )
        })
    };
    var("EXACTLY_KAFKA_SCRAM_PASSWORD")?;
    Ok(Secured {
        sasl_ssl: var("EXACTLY_KAFKA_CLUSTER_SASL_SSL")?,
        tls: var("EXACTLY_KAFKA_CLUSTER_TLS_DIR")?,
        user: var("EXACTLY_KAFKA_SCRAM_USER")?,
    })
}

/// [`job_args`] over the cluster's SASL_SSL listeners, as production clusters are reached (the
/// password referenced from the environment, never in the file): every client of the job —
/// librdkafka's, and the wire client that commits after a restart and checks topic IDs —
/// connects and authenticates anew at whichever node a leader or a coordinator moves to. The
/// tests feed and read through the plaintext listeners.
fn secured_job_args(env: &TestEnv, s: &Secured, input: &str, output: &str, dir: &std::path::Path) -> Vec<String> {
    Job {
        interval: "500ms",
        checkpoint_timeout: "20s",
        bootstrap: Some(s.sasl_ssl.clone()),
        kafka: Some(k2k::scram_settings(
            &s.user,
            "EXACTLY_KAFKA_SCRAM_PASSWORD",
            &format!("{}/ca.pem", s.tls),
        )),
        ..Job::new(input, output)
    }
    .write(env, dir, "k2k")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_broker_of_three_killed_in_turn_loses_and_doubles_nothing() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let env = &TestEnv::get().await?.cluster()?;
    let s = secured()?;
    let mut run = Running::on_new_topics(env, "cl", |i, o, d| secured_job_args(env, &s, i, o, d)).await?;
    let wait = Duration::from_secs(90);
    let mut committed = run.committed;
    for node in 1..=3 {
        let coordinator = leader_of(env, TRANSACTION_LOG)?;
        let killed = Stopped::killed(env, node)?;
        // Two nodes left: the job goes on committing.
        let (n, took) = wait_for_more_output(env, &run.output, committed, &mut run.job, wait).await?;
        eprintln!("node {node} down (transaction coordinator: node {coordinator}): output grew to {n} after {took:?}");
        drop(killed);
        committed = wait_for_more_output(env, &run.output, n, &mut run.job, wait).await?.0;
    }
    let (fed, out, restarts) = run.finish(env).await?;
    eprintln!(
        "3 nodes killed in turn; {fed} records fed, {out} out, 0 duplicates, 0 missing; {restarts} attempt restarts"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_commits_through_the_node_that_took_over_the_transactions() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let env = &TestEnv::get().await?.cluster()?;
    let (input, output) = (unique("clc-in"), unique("clc-out"));
    create_topic(env, &input, 3).await?;
    create_topic(env, &output, 3).await?;
    let dir = tempfile::tempdir()?;
    let args = secured_job_args(env, &secured()?, &input, &output, dir.path());

    // Checkpoint 4 durable, its transactions pre-committed and not committed: SIGKILL.
    let (next, _) = killed_before_its_commits(env, &input, &args)?;
    let before = read_committed(env, &output, Duration::from_secs(30))?.len();
    let coordinator = leader_of(env, TRANSACTION_LOG)?;
    let killed = Stopped::killed(env, coordinator)?;
    // Restarted at once, as a supervisor would: the coordinator is dead and not yet replaced.
    let mut job = ChildJob::spawn(exactly(), &args, "")?;
    let (n, took) = wait_for_more_output(env, &output, before, &mut job, Duration::from_secs(120)).await?;
    let now = leader_of(env, TRANSACTION_LOG)?;
    assert_ne!(now, coordinator, "the transaction log's leader did not move");
    let log = job.tail(1_000_000);
    assert!(
        log.contains("Committed a restored transaction"),
        "the restart did not commit the checkpoint's transactions:\n{}",
        job.log(40)
    );
    eprintln!(
        "coordinator node {coordinator} killed, node {now} took over; {before} → {n} records committed after {took:?}; {} attempt restarts",
        log.matches("restarting").count()
    );
    job.kill();
    drop(killed);
    let out = drain_and_verify(env, &args, &output, &next).await?;
    eprintln!("{out} records out, 0 duplicates, 0 missing");
    Ok(())
}

/// Two nodes of three down at once: no quorum of controllers, no partition with two replicas in
/// sync — nothing can be written or committed. The job waits (or restarts its attempts) through
/// 20 s of that, and when the nodes return it goes on: every record exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_brokers_of_three_down_at_once_stall_the_job_and_lose_nothing() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let env = &TestEnv::get().await?.cluster()?;
    let mut run = Running::on_new_topics(env, "cl2", |i, o, d| job_args(env, i, o, d)).await?;
    let coordinator = leader_of(env, TRANSACTION_LOG)?;
    let (a, b) = (coordinator, coordinator % 3 + 1);
    {
        let _first = Stopped::killed(env, a)?;
        let _second = Stopped::killed(env, b)?;
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(
            run.job.running(),
            "the job exited while two nodes were down:\n{}",
            run.job.log(40)
        );
    }
    let (n, took) =
        wait_for_more_output(env, &run.output, run.committed, &mut run.job, Duration::from_secs(180)).await?;
    eprintln!("nodes {a} and {b} down 20 s; output grew to {n} within {took:?} of their return");
    let (fed, out, restarts) = run.finish(env).await?;
    eprintln!("{fed} records fed, {out} out, 0 duplicates, 0 missing; {restarts} attempt restarts");
    Ok(())
}

/// The node coordinating the job's transactions stops answering (SIGSTOP: nothing comes back on
/// its open connections, unlike a killed node's refused ones — a network stall), past the
/// cluster's 6 s session: the controllers fence it and give its partitions and the transaction log
/// other leaders. The job's clients must give up on the requests they sent it and find the new
/// leaders: the node stays stopped until output committed after the fence — through the new
/// coordinator — is seen. Then it answers again, with requests sent long ago and a stale view of
/// what it led, and rejoins as a follower. Every record exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_coordinator_node_is_fenced_and_the_job_goes_on_through_the_others() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let env = &TestEnv::get().await?.cluster()?;
    let mut run = Running::on_new_topics(env, "clp", |i, o, d| job_args(env, i, o, d)).await?;
    let coordinator = leader_of(env, TRANSACTION_LOG)?;
    let (fenced, n, took, now) = {
        let _paused = Stopped::paused(env, coordinator)?;
        // Past the session (6 s) and the leaders' move: what is committed from here on was
        // committed without the stopped node (its EndTxn answers nothing).
        tokio::time::sleep(Duration::from_secs(10)).await;
        let now = leader_of(env, TRANSACTION_LOG)?;
        assert_ne!(
            now, coordinator,
            "the transaction log's leader did not move off the stopped node"
        );
        let fenced = committed_count(env, &run.output, std::time::Instant::now() + Duration::from_secs(60)).await?;
        // Each pooled producer (three per subtask, more if the pool grows meanwhile) learns of
        // the move only from a request of its own timing out (10 s), and may then ask the
        // silent node for the new coordinator (10 s more): 10–71 s seen, 180 s allowed.
        let (n, took) = wait_for_more_output(env, &run.output, fenced, &mut run.job, Duration::from_secs(180)).await?;
        (fenced, n, took, now)
    };
    eprintln!(
        "node {coordinator} stopped (node {now} took the transaction log): output {fenced} → {n} within {took:?}, the node still stopped"
    );
    let (grown, _) = wait_for_more_output(env, &run.output, n, &mut run.job, Duration::from_secs(90)).await?;
    eprintln!("node {coordinator} answers again: output grew to {grown}");
    let (fed, out, restarts) = run.finish(env).await?;
    eprintln!("{fed} records fed, {out} out, 0 duplicates, 0 missing; {restarts} attempt restarts");
    Ok(())
}
