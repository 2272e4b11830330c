//! A prepared transaction that another session is committing is busy until that commit ends
//! (PostgreSQL answers COMMIT PREPARED with 55000, "… is busy"): the sink tries again — a commit
//! sent before a crash, or one whose answer was lost, can still be running, e.g. waiting for a
//! synchronous standby. It must never stop the job. Against a real PostgreSQL
//! (`scripts/services up postgres`); it sets `synchronous_standby_names` server-wide for about a
//! second, at worst about two minutes (every commit waits meanwhile), so `scripts/test` runs it
//! alone; the setting is put back on every path out of the test (and `scripts/services` clears
//! it whenever it starts or finds PostgreSQL).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use exactly_integration_tests::{connect_postgres, pg_execute, pg_i64, postgres_url, subtask_info, unique};
use exactly_postgres_sink::{PgCommittable, PgOrigin, PgRecord, PostgresSinkConfig, TwoPhasePostgresSink};
use exactly_twophase::{CommitError, PreCommitted, RecoveryContext, TwoPhaseCommitSink};

/// Takes the synchronous standby setting back, on a fresh connection, trying a few times.
async fn no_standby() -> Result<()> {
    let mut last = None;
    for _ in 0..5 {
        let reset = async {
            let mut conn = connect_postgres().await?;
            pg_execute(&mut conn, "ALTER SYSTEM RESET synchronous_standby_names").await?;
            pg_execute(&mut conn, "SELECT pg_reload_conf()").await
        };
        match reset.await {
            Ok(()) => return Ok(()),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(last.expect("tried"))
}

/// Rolls back what the job `job` left prepared (each holds one of max_prepared_transactions),
/// trying a few times (one still being committed answers "busy" until it ends).
async fn roll_back_prepared(job: &str) -> Result<()> {
    let mut left = 0;
    for _ in 0..10 {
        let mut conn = connect_postgres().await?;
        let gids: Vec<String> = sqlx::query_scalar("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE $1")
            .bind(format!("exactly:{job}:%"))
            .fetch_all(&mut conn)
            .await?;
        left = gids.len();
        if left == 0 {
            return Ok(());
        }
        for gid in gids {
            let _ = pg_execute(&mut conn, &format!("ROLLBACK PREPARED '{gid}'")).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    bail!("{left} prepared transactions of {job} could not be rolled back")
}

/// Takes the setting back (and what the test left prepared) when dropped too: a panic or an
/// early return must not leave every later commit of the shared server waiting for a standby.
struct CleanUpOnDrop(String);

impl Drop for CleanUpOnDrop {
    fn drop(&mut self) {
        let job = self.0.clone();
        // On a thread of its own, with a runtime of its own: the test's may be unwinding.
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map(|rt| {
                    rt.block_on(async {
                        // Bounded: a cleanup must not hang the test. Rolled back only once no
                        // standby is awaited (ROLLBACK PREPARED would wait for it too).
                        let clean = async {
                            no_standby().await?;
                            roll_back_prepared(&job).await
                        };
                        match tokio::time::timeout(Duration::from_secs(30), clean).await {
                            Ok(Ok(())) => {}
                            Ok(Err(e)) => eprintln!("postgres_busy: cleaning up failed: {e:#}"),
                            Err(_) => eprintln!("postgres_busy: cleaning up took more than 30 s"),
                        }
                    })
                })
        })
        .join();
    }
}

async fn prepared(sink: &mut TwoPhasePostgresSink, id: u64) -> Result<PgCommittable> {
    let mut t = sink.begin(id).await?;
    let record = PgRecord {
        payload: format!(r#"{{"id": {id}}}"#).into_bytes(),
        key: None,
        tombstone: false,
        origin: Some(PgOrigin {
            topic: "t".into(),
            partition: 0,
            offset: id as i64,
        }),
    };
    sink.write(&mut t, vec![record]).await?;
    match sink.pre_commit(t, id).await? {
        PreCommitted::Committable(c) => Ok(c),
        other => bail!("expected a committable, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_transaction_busy_in_another_session_is_tried_again_never_fatal() -> Result<()> {
    let (table, job) = (unique("pg_busy").replace('-', "_"), unique("pgbusy"));
    let config: PostgresSinkConfig = serde_json::from_value(serde_json::json!({
        "url": postgres_url()?,
        "table": table,
        "mode": "two_phase",
        "job_id": job,
        "create_table": true,
        "progress_table": format!("{table}_progress"),
        "columns": [{ "name": "id", "type": "bigint" }],
    }))?;
    let me = subtask_info("pg");
    let mut sink = TwoPhasePostgresSink::new(config)?;
    sink.open(&me).await?;
    let ctx = RecoveryContext {
        info: &me,
        restored: &[],
        all_restored: &[],
        is_restored: false,
        restored_checkpoint: None,
        unreadable_newer: None,
        owner: None,
    };
    sink.abort_lingering(&ctx).await?;
    let mut admin = connect_postgres().await?;
    let guard = CleanUpOnDrop(job.clone());
    // Prepared before the standby is awaited: PREPARE TRANSACTION waits for it too.
    let mut candidates = Vec::new();
    for id in 1..=10u64 {
        candidates.push(prepared(&mut sink, id).await?);
    }

    pg_execute(
        &mut admin,
        "ALTER SYSTEM SET synchronous_standby_names = 'exactly_no_such_standby'",
    )
    .await?;
    pg_execute(&mut admin, "SELECT pg_reload_conf()").await?;
    // Another session commits a prepared transaction and waits for the standby that never
    // answers. The setting reaches the server's processes shortly after the reload: a commit
    // that did not wait (it came first) is tried again with a new transaction.
    let mut busy = None;
    for c in candidates {
        let gid = c.gid.clone();
        let other = tokio::spawn(async move {
            let mut conn = connect_postgres().await?;
            pg_execute(&mut conn, &format!("COMMIT PREPARED '{gid}'")).await
        });
        let waiting = format!(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND query LIKE '%{}%'",
            c.gid
        );
        let mut seen = false;
        for _ in 0..200 {
            if pg_i64(&mut admin, &waiting).await? > 0 {
                seen = true;
                break;
            }
            if other.is_finished() {
                break; // committed without waiting
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if !seen {
            if !other.is_finished() {
                other.abort();
            }
            // The reload had not reached the server's processes yet (a checkpoint of its own in
            // progress delays it): a while later, the next transaction.
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        let answer = sink.commit(&c).await;
        busy = Some((c, answer, other));
        break;
    }
    no_standby().await?;
    let Some((c, answer, other)) = busy else {
        bail!("no COMMIT PREPARED of another session waited for the standby in ten tries");
    };
    match answer {
        Err(CommitError::Retriable(e)) => assert!(e.to_string().contains("busy"), "{e}"),
        other => bail!("a busy prepared transaction must be tried again, got {other:?}"),
    }
    // The other session's commit ends once no standby is awaited; then the sink's next try finds
    // it committed (its progress row).
    tokio::time::timeout(Duration::from_secs(30), other)
        .await
        .context("the other session's commit never ended")???;
    sink.commit(&c).await?;
    let n = pg_i64(
        &mut admin,
        &format!("SELECT COUNT(*) FROM \"{table}\" WHERE id = {}", c.checkpoint_id),
    )
    .await?;
    assert_eq!(n, 1, "the busy transaction's row, once");
    // The candidates not needed stay prepared (holding a slot of max_prepared_transactions):
    // rolled back, as the sink's next start would.
    sink.abort_lingering(&ctx).await?;
    drop(guard);
    assert_eq!(
        pg_i64(
            &mut admin,
            &format!("SELECT COUNT(*) FROM pg_prepared_xacts WHERE gid LIKE 'exactly:{job}:%'")
        )
        .await?,
        0
    );
    Ok(())
}
