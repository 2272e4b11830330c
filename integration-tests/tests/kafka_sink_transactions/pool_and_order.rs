//! The producer pool (growth, declines, background commits) and record order across a barrier.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_pool_grows_to_its_maximum_then_declines_then_recovers_and_shrinks() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("sink-pool");
    create_topic(env, &topic, 1).await?;
    let me = info(0, 1);
    let mut s = sink(env, &topic, &unique("pool"), 2, Duration::from_secs(120));
    start(&mut s, &me, &[]).await?;
    // Checkpoints 1..=3 pre-commit and none completes (say they were aborted): the pool of 2
    // grows to 4 rather than leave the job unable to ever complete a checkpoint.
    let mut pending = Vec::new();
    for id in 1..=3 {
        let t = txn(&mut s, id, &[&format!("x{id}")]).await?;
        pending.push(prepared(&mut s, t, id).await?);
    }
    let t4 = txn(&mut s, 4, &["x4"]).await?; // the fourth and last producer
    assert_eq!(s.producers(), 4, "grown to max_pool_size");
    let t4 = match pre_commit(&mut s, t4, 4).await? {
        PreCommitted::Declined { txn, reason } => {
            assert!(reason.contains("wait for their checkpoints"), "{reason}");
            txn
        }
        other => bail!("expected a decline, got {other:?}"),
    };
    for c in &pending {
        s.commit(c).await?; // a later checkpoint completes: everything up to it commits
    }
    let c4 = prepared(&mut s, t4, 5).await?;
    s.commit(&c4).await?;
    assert_eq!(values(env, &topic)?, ["x1", "x2", "x3", "x4"]);
    assert_eq!(s.producers(), 2, "the producers it grew by are closed once free");
    // Still usable after shrinking.
    let t = txn(&mut s, 6, &["x6"]).await?;
    let c6 = prepared(&mut s, t, 6).await?;
    s.commit(&c6).await?;
    assert_eq!(values(env, &topic)?, ["x1", "x2", "x3", "x4", "x6"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_in_the_background_frees_its_producer_and_a_full_pool_waits_for_it_rather_than_grow() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("sink-bg-commit");
    create_topic(env, &topic, 1).await?;
    let me = info(0, 1);
    let mut s = sink(env, &topic, &unique("bgcommit"), 2, Duration::from_secs(120));
    start(&mut s, &me, &[]).await?;
    let t1 = txn(&mut s, 1, &["y1"]).await?;
    let c1 = prepared(&mut s, t1, 1).await?;
    let t2 = txn(&mut s, 2, &["y2"]).await?;
    // Checkpoint 1 completes: its commit goes on in the background.
    let Committed::InBackground(committing) = s.start_commit(&c1).await? else {
        bail!("a transaction of this run commits in the background");
    };
    let committing = tokio::spawn(committing);
    // Both producers are taken (one committing, one open): the barrier waits for the commit to
    // free its producer instead of growing the pool.
    let c2 = prepared(&mut s, t2, 2).await?;
    assert_eq!(s.producers(), 2, "no producer added while a commit was completing");
    committing.await??;
    assert_eq!(values(env, &topic)?, ["y1"]);
    let t3 = txn(&mut s, 3, &["y3"]).await?;
    match s.start_commit(&c2).await? {
        Committed::InBackground(rest) => rest.await?,
        Committed::Done => bail!("a transaction of this run commits in the background"),
    }
    let c3 = prepared(&mut s, t3, 3).await?;
    // Committing again after the background commit ended is idempotent (a restart does so).
    s.commit(&c2).await?;
    s.commit(&c3).await?;
    assert_eq!(values(env, &topic)?, ["y1", "y2", "y3"]);
    assert_eq!(s.producers(), 2);
    Ok(())
}

/// The records after a barrier must land after the records before it in every partition, though
/// the previous transaction's flush still runs in the background on another pooled producer:
/// read_committed readers see a partition in log order, so a transaction whose records overtake
/// the previous one's tail reorders the output. The first transaction is made slow to flush (a
/// deep queue of tiny batches), the second writes at once (held until the first has delivered
/// everything, then sent by its pre-commit), then both commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_after_a_barrier_never_overtake_the_previous_transactions_flush() -> Result<()> {
    order_across_a_barrier(1_000_000, &[100]).await
}

/// As above, but the second transaction writes more than the sink holds (a producer queue's
/// worth, here 150 000 records): that write waits for the first transaction's flush, then sends
/// what was held before its own records, and a later write goes straight out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_beyond_the_hold_wait_for_the_previous_flush_and_keep_their_order() -> Result<()> {
    order_across_a_barrier(150_000, &[100, 200_000, 100]).await
}

/// Writes 100 000 records in a first transaction, then `second` (write by write) in the next
/// while the first flushes; commits both; checks that a read_committed reader sees every record
/// once and in the order written.
async fn order_across_a_barrier(queue_cap: usize, second: &[usize]) -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("sink-order");
    create_topic(env, &topic, 1).await?;
    let mut s = {
        let mut config = KafkaSinkConfig::new(
            &env.kafka_bootstrap,
            &topic,
            DeliveryGuarantee::ExactlyOnce {
                transactional_id_prefix: unique("order"),
                pool_size: 2,
                max_pool_size: 4,
                transaction_timeout: T,
                accept_unknown_outcome_up_to: None,
            },
        );
        config
            .client
            .insert("queue.buffering.max.messages".into(), queue_cap.to_string());
        config.client.insert("batch.size".into(), "600".into());
        TransactionalKafkaSink::new(config, Box::new(KeyHashPartitioner::default()))?
    };
    let i = info(0, 1);
    start(&mut s, &i, &[]).await?;
    let record = |n: usize| ProducerRecord::keyed(b"k".as_slice(), format!("{n:07}").as_bytes());
    const FIRST: usize = 100_000;

    let mut t1 = s.begin(1).await?;
    s.write(&mut t1, (1..=FIRST).map(record).collect()).await?;
    let flushing = match s.pre_commit(t1, 1).await? {
        PreCommitted::InBackground(rest) => Some(rest),
        PreCommitted::Committable(c) => {
            s.commit(&c).await?;
            None
        }
        other => bail!("expected a pre-commit, got {other:?}"),
    };
    let mut t2 = s.begin(2).await?;
    let mut next = FIRST + 1;
    for n in second {
        s.write(&mut t2, (next..next + n).map(record).collect()).await?;
        next += n;
    }
    if let Some(rest) = flushing {
        let c1 = rest.await?;
        s.commit(&c1).await?;
    }
    let c2 = prepared(&mut s, t2, 2).await?;
    s.commit(&c2).await?;

    let seen: Vec<String> = read_committed(env, &topic, T)?.iter().map(|r| r.value_str()).collect();
    assert_eq!(seen.len(), next - 1, "every record once");
    let out_of_order = seen.windows(2).filter(|w| w[0] >= w[1]).count();
    let first = seen.windows(2).find(|w| w[0] >= w[1]);
    assert_eq!(
        out_of_order, 0,
        "log order broken {out_of_order} times, first: {first:?}"
    );
    Ok(())
}
