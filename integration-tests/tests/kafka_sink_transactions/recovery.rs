//! What a restarted sink commits, reports lost or settles: pre-committed transactions, aborted
//! ones, stale committables, expired ids, probe records, open transactions, no location.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_sink_commits_what_the_crashed_one_pre_committed() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("sink-recover");
    create_topic(env, &topic, 3).await?;
    let prefix = unique("recover");
    let me = info(0, 1);

    let mut crashed = sink(env, &topic, &prefix, 3, Duration::from_secs(120));
    start(&mut crashed, &me, &[]).await?;
    let t = txn(&mut crashed, 1, &["a", "b", "c"]).await?;
    let c = prepared(&mut crashed, t, 1).await?;
    assert!(c.producer_id >= 0 && c.probe.is_some(), "{c:?}");
    drop(crashed); // the process dies: no commit, no abort
    assert!(values(env, &topic)?.is_empty(), "nothing visible before the commit");

    let mut restarted = sink(env, &topic, &prefix, 3, Duration::from_secs(120));
    restarted.open(&me).await?;
    restarted.commit(&c).await?; // through the protocol: no producer holds it any more
    assert_eq!(values(env, &topic)?, ["a", "b", "c"]);
    restarted.commit(&c).await?; // idempotent: already committed is success
    start(&mut restarted, &me, std::slice::from_ref(&(1, c))).await?;
    assert_eq!(values(env, &topic)?, ["a", "b", "c"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_the_broker_aborted_on_timeout_is_reported_lost() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("sink-lost");
    create_topic(env, &topic, 1).await?;
    let prefix = unique("lost");
    let me = info(0, 1);
    let mut crashed = sink(env, &topic, &prefix, 2, Duration::from_secs(2));
    start(&mut crashed, &me, &[]).await?;
    let t = txn(&mut crashed, 1, &["doomed"]).await?;
    let c = prepared(&mut crashed, t, 1).await?;
    drop(crashed);

    // Wait until the coordinator aborted it (timeout 2 s, checked every second by our broker).
    let deadline = Instant::now() + T;
    loop {
        let now = describe_transaction(&Cluster::plaintext(&env.kafka_bootstrap), &c.transactional_id).await?;
        if now.state != "Ongoing" {
            eprintln!("coordinator now reports {now:?}");
            break;
        }
        if Instant::now() > deadline {
            bail!("the broker did not abort the transaction within {T:?}: {now:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut restarted = sink(env, &topic, &prefix, 2, Duration::from_secs(2));
    restarted.open(&me).await?;
    match restarted.commit(&c).await {
        Err(CommitError::Lost { what, source }) => {
            assert!(what.contains(&c.transactional_id), "{what}");
            eprintln!("lost as expected: {what}: {source}");
        }
        Ok(()) => bail!("a transaction aborted by its timeout must not count as committed"),
        Err(e) => bail!("expected Lost, got {e}"),
    }
    assert!(values(env, &topic)?.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_committable_never_commits_a_newer_transaction_of_its_id() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("sink-stale");
    create_topic(env, &topic, 1).await?;
    let prefix = unique("stale");
    let me = info(0, 1);
    let mut crashed = sink(env, &topic, &prefix, 2, Duration::from_secs(120));
    start(&mut crashed, &me, &[]).await?;
    let t1 = txn(&mut crashed, 1, &["one"]).await?; // slot 0
    let c1 = prepared(&mut crashed, t1, 1).await?;
    crashed.commit(&c1).await?;
    let t2 = txn(&mut crashed, 2, &["two"]).await?; // slot 1
    let c2 = prepared(&mut crashed, t2, 2).await?;
    crashed.commit(&c2).await?;
    let t3 = txn(&mut crashed, 3, &["late"]).await?; // slot 0 again: same id, producer id and epoch as c1
    let _open = t3; // left open when the process dies
    drop(crashed);

    // A restore of checkpoint 1 (say) hands c1 back: it must be recognised as committed, and the
    // open transaction of the same id must not be committed in its place.
    let mut restarted = sink(env, &topic, &prefix, 2, Duration::from_secs(120));
    restarted.open(&me).await?;
    restarted.commit(&c1).await?;
    start(&mut restarted, &me, std::slice::from_ref(&(1, c1))).await?; // aborts "late"
    assert_eq!(values(env, &topic)?, ["one", "two"]);
    Ok(())
}

/// A committable whose transactional id the coordinator no longer knows (expired after
/// `transactional.id.expiration.ms`, as for a week-old savepoint) is settled by its record: seen
/// by read_committed readers → committed; in the log but skipped by them → aborted (lost).
/// Before: TRANSACTIONAL_ID_NOT_FOUND was a retriable error, retried forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committable_whose_id_expired_is_settled_by_its_record() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("sink-expired");
    create_topic(env, &topic, 1).await?;
    let prefix = unique("expired");
    let me = info(0, 1);
    let mut s = sink(env, &topic, &prefix, 3, Duration::from_secs(120));
    start(&mut s, &me, &[]).await?;
    let t = txn(&mut s, 1, &["kept"]).await?;
    let committed = prepared(&mut s, t, 1).await?;
    s.commit(&committed).await?;
    let t = txn(&mut s, 2, &["dropped"]).await?;
    let aborted = prepared(&mut s, t, 2).await?;
    exactly_kafka_sink::admin::abort_transaction(
        &Cluster::plaintext(&env.kafka_bootstrap),
        &aborted.transactional_id,
        T,
    )
    .await?;
    drop(s);
    assert_eq!(values(env, &topic)?, ["kept"]);

    // The same committables under an id the coordinator has never heard of.
    let unknown = |c: &KafkaCommittable| KafkaCommittable {
        transactional_id: unique("never-seen"),
        ..c.clone()
    };
    let mut restarted = sink(env, &topic, &prefix, 3, Duration::from_secs(120));
    restarted.open(&me).await?;
    restarted.commit(&unknown(&committed)).await?;
    match restarted.commit(&unknown(&aborted)).await {
        Err(CommitError::Lost { source, .. }) => {
            assert!(source.to_string().contains("no longer knows"), "{source}")
        }
        other => bail!("an aborted transaction must be reported lost, got {other:?}"),
    }
    assert_eq!(values(env, &topic)?, ["kept"]);
    Ok(())
}

/// A committed transaction whose record retention removed cannot be checked any more: that is
/// "unknown", not "aborted → DATA LOST" (before, the probe consumer jumped to the end of the
/// partition, librdkafka's default offset reset, and read the record as absent), and unknown stops
/// the job, naming the checkpoint and the setting that accepts it, unless that setting covers the
/// checkpoint (before, it warned and went on: a guess).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_record_removed_by_retention_is_unknown_not_lost() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("sink-retention");
    create_topic(env, &topic, 1).await?;
    let prefix = unique("retention");
    let me = info(0, 1);
    let mut s = sink(env, &topic, &prefix, 2, Duration::from_secs(120));
    start(&mut s, &me, &[]).await?;
    let t = txn(&mut s, 1, &["old"]).await?;
    let c = prepared(&mut s, t, 1).await?;
    s.commit(&c).await?;
    let t = txn(&mut s, 2, &["newer"]).await?;
    let c2 = prepared(&mut s, t, 2).await?;
    s.commit(&c2).await?;
    drop(s);
    // Retention (here DeleteRecords) removes everything up to the newer record.
    let newer = c2.probe.as_ref().expect("a probe").offset;
    delete_records_before(env, &topic, 0, newer).await?;

    // The restarted sink initialises its ids (new epoch): c is no longer the open transaction of
    // its id, so only its record could tell, and it is gone.
    for accepted in [None, Some(0)] {
        let mut restarted = accepting(env, &topic, &prefix, accepted);
        start(&mut restarted, &me, &[]).await?;
        match restarted.commit(&c).await {
            Err(CommitError::Fatal(e)) => {
                let e = e.to_string();
                for part in [
                    "cannot tell",
                    "checkpoint 1",
                    "accept_unknown_outcome_up_to = 1",
                    "retention",
                ] {
                    assert!(e.contains(part), "{part:?} missing from: {e}");
                }
            }
            other => bail!("unknown outcome (accepting up to {accepted:?}) must stop the job, got {other:?}"),
        }
    }
    let mut restarted = accepting(env, &topic, &prefix, Some(1));
    start(&mut restarted, &me, &[]).await?;
    restarted.commit(&c).await?;
    assert_eq!(values(env, &topic)?, ["newer"]);
    Ok(())
}

/// An open transaction no checkpoint needs is aborted *before* the restored committables are
/// checked: otherwise it pins the partition's last stable offset, and the read_committed check of
/// a restored transaction waits on it until the broker's timeout (here 2 min) aborts it. Before,
/// the check gave up after 30 s and the commit was retried until then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unneeded_open_transaction_is_aborted_before_restored_ones_are_checked() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("sink-pin");
    create_topic(env, &topic, 1).await?;
    let prefix = unique("pin");
    let me = info(0, 1);
    let mut crashed = sink(env, &topic, &prefix, 3, Duration::from_secs(120));
    start(&mut crashed, &me, &[]).await?;
    let _linger = txn(&mut crashed, 1, &["linger"]).await?; // open when the process dies
    wait_in_log(env, &topic, "linger")?; // in the log first: it pins the last stable offset below what follows
    let t = txn(&mut crashed, 2, &["two"]).await?;
    let c = prepared(&mut crashed, t, 2).await?;
    crashed.commit(&c).await?;
    drop(crashed);
    assert!(
        values(env, &topic)?.is_empty(),
        "the open transaction pins the last stable offset"
    );

    // Restored under an id the coordinator does not know, so only its record can tell.
    let restored = KafkaCommittable {
        transactional_id: unique("forgotten"),
        ..c
    };
    let mut restarted = sink(env, &topic, &prefix, 3, Duration::from_secs(120));
    let started = Instant::now();
    restore(&mut restarted, &me, &[(2, restored)]).await?;
    eprintln!("restored in {:?}", started.elapsed());
    assert_eq!(values(env, &topic)?, ["two"]);
    Ok(())
}

/// A recovery that lost its checkpoint location (another run took it over while this one was
/// cut off from the checkpoint store) fences none of the ids: the open transaction of another
/// run of the job stays open, not aborted by this one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_without_its_location_fences_nothing() -> Result<()> {
    use exactly_core::storage::CheckpointStorage;
    use exactly_integration_tests::OwnerLostAfter;
    use std::sync::Arc;

    let env = TestEnv::get().await?;
    let (topic, prefix) = (unique("owner-lost"), unique("owner-lost-txn"));
    create_topic(env, &topic, 1).await?;
    let me = info(0, 1);
    // The run that owns the location: a transaction open on its first id.
    let mut owner = sink(env, &topic, &prefix, 2, T);
    start(&mut owner, &me, &[]).await?;
    let t = txn(&mut owner, 1, &["kept"]).await?;
    let c = prepared(&mut owner, t, 1).await?;

    // A run that lost the location recovers: refused before it fences the pool.
    let lost = Arc::new(OwnerLostAfter::new(0));
    let storage: Arc<dyn CheckpointStorage> = lost.clone();
    let mut stale = sink(env, &topic, &prefix, 2, T);
    stale.open(&me).await?;
    let err = stale
        .abort_lingering(&RecoveryContext {
            info: &me,
            restored: &[],
            all_restored: &[],
            is_restored: false,
            restored_checkpoint: None,
            unreadable_newer: None,
            owner: Some(&storage),
        })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("another run took it over"), "{err}");
    let now = describe_transaction(&Cluster::plaintext(&env.kafka_bootstrap), &c.transactional_id).await?;
    assert_eq!(now.state, "Ongoing", "the owner's transaction is still open: {now:?}");
    // And the owner commits it.
    owner.commit(&c).await.map_err(|e| anyhow::anyhow!("{e:?}"))?;
    assert_eq!(values(env, &topic)?, vec!["kept".to_owned()]);
    Ok(())
}
