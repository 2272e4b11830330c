//! A prepared transaction that another session is committing is busy until that commit ends
//! (PostgreSQL answers COMMIT PREPARED with 55000, "… is busy"): the sink tries again — a commit
//! sent before a crash, or one whose answer was lost, can still be running, e.g. waiting for a
//! synchronous standby. It must never stop the job. Against a real PostgreSQL
//! (`scripts/services up postgres`); it sets `synchronous_standby_names` server-wide for a few
//! seconds (every commit waits meanwhile), so `scripts/test` runs it alone.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use exactly_core::runtime::SubtaskInfo;
use exactly_integration_tests::{connect_postgres, pg_execute, pg_i64, postgres_url, unique};
use exactly_postgres_sink::{PgOrigin, PgRecord, PostgresSinkConfig, TwoPhasePostgresSink};
use exactly_twophase::{CommitError, PreCommitted, RecoveryContext, TwoPhaseCommitSink};

fn info() -> SubtaskInfo {
    SubtaskInfo {
        uid: "pg".into(),
        index: 0,
        parallelism: 1,
        max_parallelism: 128,
        attempt: 0,
        starting: true,
        commit_window: None,
        restored_checkpoint: None,
        accept_replay: false,
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
    let me = info();
    let mut sink = TwoPhasePostgresSink::new(config)?;
    sink.open(&me).await?;
    let ctx = RecoveryContext {
        info: &me,
        restored: &[],
        all_restored: &[],
        is_restored: false,
        restored_checkpoint: None,
        unreadable_newer: None,
    };
    sink.abort_lingering(&ctx).await?;
    let mut t = sink.begin(1).await?;
    let record = PgRecord {
        payload: br#"{"id": 1}"#.to_vec(),
        key: None,
        tombstone: false,
        origin: Some(PgOrigin {
            topic: "t".into(),
            partition: 0,
            offset: 0,
        }),
    };
    sink.write(&mut t, vec![record]).await?;
    let PreCommitted::Committable(c) = sink.pre_commit(t, 1).await? else {
        bail!("expected a committable");
    };

    // Another session commits it and waits for a synchronous standby that never answers.
    let mut admin = connect_postgres().await?;
    pg_execute(
        &mut admin,
        "ALTER SYSTEM SET synchronous_standby_names = 'exactly_no_such_standby'",
    )
    .await?;
    pg_execute(&mut admin, "SELECT pg_reload_conf()").await?;
    let outcome = async {
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
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if !seen {
            bail!("the other session's COMMIT PREPARED never waited for the standby");
        }
        let busy = sink.commit(&c).await;
        Ok::<_, anyhow::Error>((busy, other))
    }
    .await;
    // Always put the server back, whatever happened.
    pg_execute(&mut admin, "ALTER SYSTEM RESET synchronous_standby_names").await?;
    pg_execute(&mut admin, "SELECT pg_reload_conf()").await?;
    let (busy, other) = outcome?;
    match busy {
        Err(CommitError::Retriable(e)) => assert!(e.to_string().contains("busy"), "{e}"),
        other => bail!("a busy prepared transaction must be tried again, got {other:?}"),
    }
    // The other session's commit ends once the standby is no longer awaited; then the sink's
    // next try finds it committed (its progress row).
    tokio::time::timeout(Duration::from_secs(30), other)
        .await
        .context("the other session's commit never ended")???;
    sink.commit(&c).await?;
    assert_eq!(
        pg_i64(&mut admin, &format!("SELECT COUNT(*) FROM \"{table}\"")).await?,
        1
    );
    Ok(())
}
