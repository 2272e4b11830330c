//! The PostgreSQL sink against a real PostgreSQL (TLS, `scripts/services up postgres`): a
//! prepared transaction survives its process and is committed by the next start; one nobody
//! needs is rolled back; committing twice is success; one rolled back behind the sink's back is
//! reported lost; upserts replay idempotently and tombstones delete; JSON values become the
//! columns' types (numeric, timestamptz, jsonb, arrays, NULL). Driven through the public
//! API only, as a third party's connector would be.

use anyhow::{bail, Result};
use exactly_core::runtime::{InitContext, Sink, SnapshotContext, SubtaskInfo};
use exactly_core::SnapshotKind;
use exactly_integration_tests::{connect_postgres, pg_execute, pg_i64, postgres_url, unique, within};
use exactly_postgres_sink::{
    PgCommittable, PgOrigin, PgRecord, PostgresSink, PostgresSinkConfig, TwoPhasePostgresSink, UpsertPostgresSink,
};
use exactly_twophase::{CommitError, PreCommitted, RecoveryContext, TwoPhaseCommitSink};

fn info(index: u32, parallelism: u32) -> SubtaskInfo {
    SubtaskInfo::new("pg", index, parallelism)
}

fn config(mode: &str, table: &str, job: &str) -> Result<PostgresSinkConfig> {
    let key = mode == "upsert";
    Ok(serde_json::from_value(serde_json::json!({
        "url": postgres_url()?,
        "table": table,
        "mode": mode,
        "job_id": job,
        "create_table": true,
        "progress_table": format!("{table}_progress"),
        "columns": [
            { "name": "id", "type": "bigint", "key": key },
            { "name": "note", "type": "text" },
        ],
    }))?)
}

fn record(id: i64, note: &str, offset: i64) -> PgRecord {
    PgRecord {
        payload: serde_json::json!({ "id": id, "note": note }).to_string().into_bytes(),
        key: Some(id.to_string().into_bytes()),
        tombstone: false,
        origin: Some(PgOrigin {
            topic: "t".into(),
            partition: 0,
            offset,
        }),
    }
}

async fn start(s: &mut TwoPhasePostgresSink, me: &SubtaskInfo, restored: &[(u64, PgCommittable)]) -> Result<()> {
    s.open(me).await?;
    let ctx = RecoveryContext {
        info: me,
        restored,
        all_restored: restored,
        is_restored: !restored.is_empty(),
        restored_checkpoint: None,
        unreadable_newer: None,
        owner: None,
    };
    s.abort_unneeded(&ctx).await?;
    for (_, c) in restored {
        s.commit(c).await?;
    }
    s.abort_lingering(&ctx).await?;
    Ok(())
}

async fn prepare(s: &mut TwoPhasePostgresSink, id: u64, rows: &[i64]) -> Result<PgCommittable> {
    let mut t = s.begin(id).await?;
    s.write(&mut t, rows.iter().map(|r| record(*r, "x", *r)).collect())
        .await?;
    match s.pre_commit(t, id).await? {
        PreCommitted::Committable(c) => Ok(c),
        other => bail!("expected a committable, got {other:?}"),
    }
}

async fn prepared_count(job: &str) -> Result<i64> {
    let mut conn = connect_postgres().await?;
    pg_i64(
        &mut conn,
        &format!("SELECT COUNT(*) FROM pg_prepared_xacts WHERE gid LIKE 'exactly:{job}:%'"),
    )
    .await
}

async fn rows(table: &str) -> Result<i64> {
    let mut conn = connect_postgres().await?;
    pg_i64(&mut conn, &format!("SELECT COUNT(*) FROM \"{table}\"")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_transaction_outlives_its_process_and_the_next_start_commits_it() -> Result<()> {
    let (table, job) = (unique("pg_2pc").replace('-', "_"), unique("pg2pc"));
    let me = info(0, 1);
    let mut crashed = TwoPhasePostgresSink::new(config("two_phase", &table, &job)?)?;
    start(&mut crashed, &me, &[]).await?;
    let c1 = prepare(&mut crashed, 1, &[1, 2, 3]).await?;
    let _c2 = prepare(&mut crashed, 2, &[4]).await?; // not in the restored checkpoint
    drop(crashed); // the process dies: prepared transactions stay, their rows invisible
    assert_eq!(rows(&table).await?, 0, "prepared rows are invisible");
    assert_eq!(prepared_count(&job).await?, 2);

    // The next start restores checkpoint 1: commits c1, rolls back the one nobody needs.
    let mut next = TwoPhasePostgresSink::new(config("two_phase", &table, &job)?)?;
    start(&mut next, &me, &[(1, c1.clone())]).await?;
    assert_eq!(rows(&table).await?, 3);
    assert_eq!(prepared_count(&job).await?, 0, "the lingering one was rolled back");
    // Committing again (a crash after the commit, before the next checkpoint) is success.
    next.commit(&c1).await?;
    assert_eq!(rows(&table).await?, 3);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_rolled_back_behind_the_sinks_back_is_reported_lost() -> Result<()> {
    let (table, job) = (unique("pg_lost").replace('-', "_"), unique("pglost"));
    let me = info(0, 1);
    let mut s = TwoPhasePostgresSink::new(config("two_phase", &table, &job)?)?;
    start(&mut s, &me, &[]).await?;
    let c = prepare(&mut s, 1, &[1]).await?;
    let mut conn = connect_postgres().await?;
    pg_execute(&mut conn, &format!("ROLLBACK PREPARED '{}'", c.gid)).await?;
    match s.commit(&c).await {
        Err(CommitError::Lost { what, .. }) => assert!(what.contains(&c.gid), "{what}"),
        other => bail!("expected Lost, got {other:?}"),
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_commits_only_on_completion_through_the_public_sink() -> Result<()> {
    let (table, job) = (unique("pg_drv").replace('-', "_"), unique("pgdrv"));
    let me = info(0, 1);
    let mut sink = PostgresSink::new(config("two_phase", &table, &job)?)?;
    sink.initialize_state(&InitContext::new(&me, None)).await?;
    sink.write((1..=10).map(|i| record(i, "a", i)).collect()).await?;
    let mut ctx = SnapshotContext::new(1, SnapshotKind::Checkpoint, 0);
    sink.snapshot_state(&mut ctx).await?;
    sink.write(vec![record(11, "b", 11)]).await?;
    assert_eq!(rows(&table).await?, 0, "nothing visible before completion");
    sink.notify_checkpoint_complete(1).await?;
    assert_eq!(rows(&table).await?, 10, "checkpoint 1's rows, not the 11th");
    sink.close().await?;
    assert_eq!(prepared_count(&job).await?, 0);
    let mut conn = connect_postgres().await?;
    let through = pg_i64(
        &mut conn,
        &format!("SELECT committed_through FROM \"{table}_progress_through\" WHERE job = '{job}'"),
    )
    .await?;
    assert_eq!(through, 1, "the progress summary");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upserts_replay_idempotently_and_tombstones_delete() -> Result<()> {
    let (table, job) = (unique("pg_ups").replace('-', "_"), unique("pgups"));
    let me = info(0, 1);
    for _replay in 0..2 {
        let mut s = UpsertPostgresSink::new(config("upsert", &table, &job)?)?;
        s.initialize_state(&InitContext::new(&me, None)).await?;
        // id 2 twice in one batch: the later one wins; id 3 deleted by its tombstone.
        let mut batch = vec![
            record(1, "a", 0),
            record(2, "b", 1),
            record(2, "c", 2),
            record(3, "d", 3),
        ];
        batch.push(PgRecord {
            payload: Vec::new(),
            key: Some(b"3".to_vec()),
            tombstone: true,
            origin: None,
        });
        s.write(batch).await?;
        s.snapshot_state(&mut SnapshotContext::new(1, SnapshotKind::Checkpoint, 0))
            .await?;
        s.close().await?;
    }
    let mut conn = connect_postgres().await?;
    assert_eq!(
        pg_i64(&mut conn, &format!("SELECT COUNT(*) FROM \"{table}\"")).await?,
        2
    );
    let note: String = sqlx::query_scalar(&format!("SELECT note FROM \"{table}\" WHERE id = 2"))
        .fetch_one(&mut conn)
        .await?;
    assert_eq!(note, "c");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_that_do_not_fit_fail_with_their_origin_or_are_skipped() -> Result<()> {
    let (table, job) = (unique("pg_bad").replace('-', "_"), unique("pgbad"));
    let me = info(0, 1);
    let mut s = UpsertPostgresSink::new(config("upsert", &table, &job)?)?;
    s.initialize_state(&InitContext::new(&me, None)).await?;
    let mut bad = PgRecord::json("not json");
    bad.origin = Some(PgOrigin {
        topic: "orders".into(),
        partition: 2,
        offset: 41,
    });
    let err = s.write(vec![bad.clone()]).await.unwrap_err().to_string();
    assert!(err.contains("orders/2@41") && err.contains("not JSON"), "{err}");
    let mut c = config("upsert", &table, &job)?;
    c.on_error = exactly_postgres_sink::OnError::Skip;
    let mut s = UpsertPostgresSink::new(c)?;
    s.initialize_state(&InitContext::new(&me, None)).await?;
    s.write(vec![bad, record(7, "ok", 42)]).await?;
    s.snapshot_state(&mut SnapshotContext::new(1, SnapshotKind::Checkpoint, 0))
        .await?;
    assert_eq!(rows(&table).await?, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_connection_is_refused_by_the_server() -> Result<()> {
    // The suite's PostgreSQL accepts TCP logins over TLS only: the sink's URL must ask for it.
    let url = postgres_url()?;
    let plain = url.split('?').next().unwrap_or(&url).to_owned() + "?sslmode=disable";
    let mut c = config("upsert", &unique("pg_plain").replace('-', "_"), &unique("pgplain"))?;
    c.url = plain;
    let mut s = UpsertPostgresSink::new(c)?;
    let err = s
        .initialize_state(&InitContext::new(&info(0, 1), None))
        .await
        .unwrap_err();
    assert_eq!(err.class(), exactly_core::ErrorClass::Fatal, "{err}");
    let text = format!("{err} {:?}", std::error::Error::source(&err));
    assert!(text.contains("no encryption") || text.contains("pg_hba"), "{text}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_fields_become_the_columns_types_as_postgresql_converts_them() -> Result<()> {
    // The sink hands PostgreSQL the JSON values and PostgreSQL converts them to each column's
    // type: numbers, strings, booleans, timestamps, JSON documents and arrays; a JSON null or an
    // absent field is NULL.
    let (table, job) = (unique("pg_types").replace('-', "_"), unique("pgtypes"));
    let mut c = config("upsert", &table, &job)?;
    c.columns = serde_json::from_value(serde_json::json!([
        { "name": "id", "type": "bigint", "key": true },
        { "name": "amount", "type": "numeric(12,2)" },
        { "name": "ratio", "type": "double precision" },
        { "name": "flag", "type": "boolean" },
        { "name": "at", "type": "timestamptz" },
        { "name": "doc", "type": "jsonb" },
        { "name": "tags", "type": "text[]" },
        { "name": "label", "type": "text" },
        { "name": "n", "type": "integer" },
        { "name": "missing", "type": "text" },
    ]))?;
    let mut s = UpsertPostgresSink::new(c)?;
    s.initialize_state(&InitContext::new(&info(0, 1), None)).await?;
    let full = serde_json::json!({
        "id": 1, "amount": 12.5, "ratio": 0.25, "flag": true, "at": "2026-12-02T10:00:00Z",
        "doc": { "a": [1, 2], "b": "x" }, "tags": ["red", "blue"], "label": 42, "n": "5",
    });
    let sparse = serde_json::json!({ "id": 2, "amount": "7.125", "flag": null, "doc": "just a string" });
    s.write(vec![
        PgRecord::json(full.to_string()),
        PgRecord::json(sparse.to_string()),
    ])
    .await?;
    s.snapshot_state(&mut SnapshotContext::new(1, SnapshotKind::Checkpoint, 0))
        .await?;
    s.close().await?;
    let mut conn = connect_postgres().await?;
    let text = "amount::text, ratio::text, flag::text, (at = '2026-12-02T10:00:00Z')::text, doc::text, \
                tags::text, label, n::text, missing";
    let select = |id: i64| format!("SELECT ARRAY[{text}] FROM \"{table}\" WHERE id = {id}");
    let got: Vec<Option<String>> = sqlx::query_scalar(&select(1)).fetch_one(&mut conn).await?;
    let want = [
        Some("12.50"),
        Some("0.25"),
        Some("true"),
        Some("true"),
        Some(r#"{"a": [1, 2], "b": "x"}"#),
        Some("{red,blue}"),
        Some("42"),
        Some("5"),
        None,
    ];
    assert_eq!(got, want.map(|v| v.map(str::to_owned)), "row 1");
    let got: Vec<Option<String>> = sqlx::query_scalar(&select(2)).fetch_one(&mut conn).await?;
    let want = [
        Some("7.13"),
        None,
        None,
        None,
        Some(r#""just a string""#),
        None,
        None,
        None,
        None,
    ];
    assert_eq!(got, want.map(|v| v.map(str::to_owned)), "row 2");
    Ok(())
}

/// A recovery that loses its checkpoint location while it rolls back lingering prepared
/// transactions (another run took it over: a partition from the checkpoint store) stops before
/// its next rollback: the new owner's prepared transactions are not its to roll back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanup_that_loses_its_location_stops_before_the_next_rollback() -> Result<()> {
    use exactly_core::storage::CheckpointStorage;
    use exactly_integration_tests::OwnerLostAfter;
    use std::sync::Arc;

    let (table, job) = (unique("pg_lost").replace('-', "_"), unique("job"));
    let me = info(0, 1);
    let mut s = TwoPhasePostgresSink::new(config("two_phase", &table, &job)?)?;
    s.open(&me).await?;
    prepare(&mut s, 1, &[1]).await?;
    prepare(&mut s, 2, &[2]).await?;
    drop(s);
    assert_eq!(prepared_count(&job).await?, 2);

    // One check passes (the first rollback), the next finds the location taken over.
    let lost = Arc::new(OwnerLostAfter::new(1));
    let owner: Arc<dyn CheckpointStorage> = lost.clone();
    let mut s = TwoPhasePostgresSink::new(config("two_phase", &table, &job)?)?;
    s.open(&me).await?;
    let ctx = RecoveryContext {
        info: &me,
        restored: &[],
        all_restored: &[],
        is_restored: false,
        restored_checkpoint: None,
        unreadable_newer: None,
        owner: Some(&owner),
    };
    let err = s.abort_lingering(&ctx).await.unwrap_err();
    assert!(err.to_string().contains("another run took it over"), "{err}");
    assert_eq!(lost.checks(), 2, "checked before each rollback");
    assert_eq!(prepared_count(&job).await?, 1, "the second was left alone");
    // The owner's cleanup rolls back what is left.
    start(&mut s, &me, &[]).await?;
    assert_eq!(prepared_count(&job).await?, 0);
    Ok(())
}

fn changes_config(table: &str, job: &str) -> Result<PostgresSinkConfig> {
    let mut c = config("two_phase", table, job)?;
    c.insert_mode = Some(exactly_postgres_sink::InsertMode::Upsert);
    c.columns[0].key = true;
    Ok(c)
}

fn tombstone(id: i64, offset: i64) -> PgRecord {
    PgRecord {
        payload: Vec::new(),
        tombstone: true,
        ..record(id, "", offset)
    }
}

async fn notes(table: &str) -> Result<Vec<(i64, String)>> {
    let mut conn = connect_postgres().await?;
    Ok(sqlx::query_as(&format!("SELECT id, note FROM \"{table}\" ORDER BY id"))
        .fetch_all(&mut conn)
        .await?)
}

/// Mode `two_phase` with insert_mode `upsert` (a change stream): a checkpoint's upserts and
/// deletes commit with it. The records after a barrier arrive while that checkpoint's prepared
/// transaction still holds the rows it changed, before the checkpoint completes; changes to those
/// rows must not wait for locks that only this subtask's own commit, later, releases. (Written
/// at once, the write below waits forever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_in_two_phase_mode_commit_with_their_checkpoint_and_never_wait_for_their_own_commit() -> Result<()> {
    let (table, job) = (unique("pg_chg").replace('-', "_"), unique("pgchg"));
    let me = info(0, 1);
    let mut sink = PostgresSink::new(changes_config(&table, &job)?)?;
    sink.initialize_state(&InitContext::new(&me, None)).await?;
    sink.write(vec![
        record(1, "a", 0),
        record(2, "b", 1),
        record(3, "c", 2),
        record(3, "c2", 3),
    ])
    .await?;
    sink.snapshot_state(&mut SnapshotContext::new(1, SnapshotKind::Checkpoint, 0))
        .await?;
    // Checkpoint 2's changes, before checkpoint 1 completes, to rows checkpoint 1 holds.
    within(
        "a write of checkpoint 2",
        sink.write(vec![record(1, "a2", 4), tombstone(2, 5)]),
    )
    .await??;
    assert_eq!(notes(&table).await?, [], "nothing visible before completion");
    sink.notify_checkpoint_complete(1).await?;
    assert_eq!(
        notes(&table).await?,
        [(1, "a".to_owned()), (2, "b".to_owned()), (3, "c2".to_owned())],
        "checkpoint 1's rows (the later of two for one key)"
    );
    // After the commit: written at once, behind the held changes (row 2 deleted, then back).
    sink.write(vec![record(2, "b3", 6)]).await?;
    within(
        "checkpoint 2's pre-commit",
        sink.snapshot_state(&mut SnapshotContext::new(2, SnapshotKind::Checkpoint, 0)),
    )
    .await??;
    sink.notify_checkpoint_complete(2).await?;
    assert_eq!(
        notes(&table).await?,
        [(1, "a2".to_owned()), (2, "b3".to_owned()), (3, "c2".to_owned())],
        "checkpoint 2 updated row 1, deleted row 2 and wrote it again, in that order"
    );
    let mut conn = connect_postgres().await?;
    let through = pg_i64(
        &mut conn,
        &format!("SELECT committed_through FROM \"{table}_progress_through\" WHERE job = '{job}'"),
    )
    .await?;
    assert_eq!(through, 2, "the progress summary");
    sink.close().await?;
    assert_eq!(prepared_count(&job).await?, 0);
    Ok(())
}

/// A sink whose checkpoint 1 (row 1) is prepared and then aborted: its transaction waits for a
/// later checkpoint to commit it, holding row 1.
async fn row_1_prepared_then_aborted(table: &str, job: &str, me: &SubtaskInfo) -> Result<PostgresSink> {
    let mut sink = PostgresSink::new(changes_config(table, job)?)?;
    sink.initialize_state(&InitContext::new(me, None)).await?;
    sink.write(vec![record(1, "a", 0)]).await?;
    sink.snapshot_state(&mut SnapshotContext::new(1, SnapshotKind::Checkpoint, 0))
        .await?;
    sink.notify_checkpoint_aborted(1).await?;
    Ok(sink)
}

/// When the earlier checkpoint did not complete (aborted: its transaction waits for a later
/// checkpoint to commit it), the next checkpoint's changes to its rows cannot be written before
/// that one completes: the pre-commit gives up after a bounded wait with an error that names the
/// cause, and the job restarts and recovers (here: nothing committed, the rows' prepared
/// transaction rolled back by the next start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_held_behind_an_aborted_checkpoint_fail_the_pre_commit_saying_why() -> Result<()> {
    let (table, job) = (unique("pg_chg_ab").replace('-', "_"), unique("pgchgab"));
    let me = info(0, 1);
    let mut sink = row_1_prepared_then_aborted(&table, &job, &me).await?;
    within("a write of checkpoint 2", sink.write(vec![record(1, "a2", 1)])).await??;
    let e = within(
        "checkpoint 2's pre-commit",
        sink.snapshot_state(&mut SnapshotContext::new(2, SnapshotKind::Checkpoint, 0)),
    )
    .await?
    .expect_err("checkpoint 2 cannot prepare while checkpoint 1's transaction holds row 1");
    let text = format!("{e:#}");
    assert!(
        text.contains("held back") && text.contains(":0:1\"") && text.contains("lock timeout"),
        "{text}"
    );
    drop(sink);
    // The next start (restored from before checkpoint 1) rolls checkpoint 1's transaction back.
    let mut next = TwoPhasePostgresSink::new(changes_config(&table, &job)?)?;
    start(&mut next, &me, &[]).await?;
    assert_eq!(prepared_count(&job).await?, 0);
    assert_eq!(notes(&table).await?, []);
    Ok(())
}

/// After a failed checkpoint, the next one's held records that touch other rows are written at
/// its barrier (with the bounded lock wait) and prepared; its completion commits both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_held_behind_an_aborted_checkpoint_on_other_rows_commit_with_the_next() -> Result<()> {
    let (table, job) = (unique("pg_chg_ok").replace('-', "_"), unique("pgchgok"));
    let me = info(0, 1);
    let mut sink = row_1_prepared_then_aborted(&table, &job, &me).await?;
    within(
        "a write of checkpoint 2",
        sink.write(vec![record(5, "e", 1), tombstone(6, 2)]),
    )
    .await??;
    within(
        "checkpoint 2's pre-commit",
        sink.snapshot_state(&mut SnapshotContext::new(2, SnapshotKind::Checkpoint, 0)),
    )
    .await??;
    assert_eq!(notes(&table).await?, [], "nothing visible before a completion");
    sink.notify_checkpoint_complete(2).await?;
    assert_eq!(notes(&table).await?, [(1, "a".to_owned()), (5, "e".to_owned())]);
    sink.close().await?;
    assert_eq!(prepared_count(&job).await?, 0);
    Ok(())
}
