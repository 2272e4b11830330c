//! The MySQL sink's record handling against MariaDB: records that do not fit the mapping fail the
//! job (naming the record), are skipped, or land in the dead-letter table with their origin; in
//! both modes the rows become visible only when the checkpoint completes (xa) or at the barrier
//! (upsert), together with the progress row.

use anyhow::Result;
use exactly_core::runtime::{InitContext, Sink, SnapshotContext};
use exactly_core::SnapshotKind;
use exactly_integration_tests::{connect_mysql, query_i64, subtask_info, unique, within, TestEnv};
use exactly_mysql_sink::{
    Column, ColumnType, Format, Mapping, Mode, MysqlSink, MysqlSinkConfig, OnError, Origin, SinkRecord,
};

fn config(env: &TestEnv, mode: Mode, on_error: OnError) -> MysqlSinkConfig {
    let col = |name: &str, ty, key: bool| {
        let c = Column::new(name, ty).length(32);
        if key {
            c.key()
        } else {
            c
        }
    };
    MysqlSinkConfig {
        url: env.mysql_url.clone(),
        password_file: None,
        table: unique("records").replace('-', "_"),
        mode,
        insert_mode: None,
        job_id: unique("job"),
        sink_id: "rows".into(),
        mapping: Mapping {
            format: Format::Json,
            columns: vec![
                col("id", ColumnType::Bigint, true),
                col("name", ColumnType::Varchar, false),
            ],
        },
        batch_size: 100,
        create_table: true,
        progress_table: unique("progress").replace('-', "_"),
        on_error,
    }
}

fn record(offset: i64, payload: &str) -> SinkRecord {
    SinkRecord {
        payload: payload.as_bytes().to_vec(),
        key: None,
        tombstone: false,
        origin: Some(Origin {
            topic: "orders".into(),
            partition: 0,
            offset,
        }),
    }
}

async fn run_one_checkpoint(sink: &mut MysqlSink, records: Vec<SinkRecord>) -> exactly_core::Result<()> {
    let info = subtask_info("mysql");
    sink.initialize_state(&InitContext::new(&info, None)).await?;
    sink.write(records).await?;
    let mut ctx = SnapshotContext::new(1, SnapshotKind::Checkpoint, 0);
    sink.snapshot_state(&mut ctx).await?;
    sink.notify_checkpoint_complete(1).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_records_go_to_the_dead_letter_table_with_their_origin_in_both_modes() -> Result<()> {
    let env = TestEnv::get().await?;
    for mode in [Mode::Xa, Mode::Upsert] {
        let dlq = unique("dead").replace('-', "_");
        let c = config(env, mode, OnError::DeadLetter { table: dlq.clone() });
        let (table, progress) = (c.table.clone(), c.progress_table.clone());
        let mut sink = MysqlSink::new(c)?;
        run_one_checkpoint(
            &mut sink,
            vec![
                record(10, r#"{"id":1,"name":"a"}"#),
                record(11, r#"{"id":"x"}"#),
                record(12, r#"{"id":2,"name":"b"}"#),
            ],
        )
        .await?;
        let mut conn = connect_mysql(env).await?;
        assert_eq!(
            query_i64(&mut conn, &format!("SELECT COUNT(*) FROM `{table}`")).await?,
            2
        );
        assert_eq!(
            query_i64(
                &mut conn,
                &format!("SELECT COUNT(*) FROM `{dlq}` WHERE origin = 'orders/0@11'")
            )
            .await?,
            1
        );
        assert_eq!(
            query_i64(
                &mut conn,
                &format!(
                    "SELECT COUNT(*) FROM `{progress}` WHERE checkpoint_id = 1 AND offsets LIKE '%\"orders:0\":13%'"
                )
            )
            .await?,
            1,
            "progress row with the next offset"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_records_fail_or_are_skipped_as_configured() -> Result<()> {
    let env = TestEnv::get().await?;
    let mut sink = MysqlSink::new(config(env, Mode::Upsert, OnError::Fail))?;
    let err = run_one_checkpoint(&mut sink, vec![record(5, "not json")])
        .await
        .unwrap_err();
    let text = format!("{err} {:?}", std::error::Error::source(&err));
    assert!(text.contains("orders/0@5") && text.contains("not JSON"), "{text}");
    assert_eq!(
        err.class(),
        exactly_core::ErrorClass::Fatal,
        "a restart would meet the same record"
    );

    let c = config(env, Mode::Xa, OnError::Skip);
    let table = c.table.clone();
    let mut sink = MysqlSink::new(c)?;
    run_one_checkpoint(
        &mut sink,
        vec![record(1, r#"{"id":1}"#), record(2, r#"{"id":3,"name":"c"}"#)],
    )
    .await?;
    let mut conn = connect_mysql(env).await?;
    assert_eq!(
        query_i64(&mut conn, &format!("SELECT COUNT(*) FROM `{table}`")).await?,
        1
    );
    Ok(())
}

fn tombstone(offset: i64, key: &str) -> SinkRecord {
    SinkRecord {
        payload: Vec::new(),
        key: Some(key.as_bytes().to_vec()),
        tombstone: true,
        ..record(offset, "")
    }
}

/// A Kafka tombstone is a deletion, not a JSON `null`: mode upsert deletes its key's row (a plain
/// key or a JSON object key), in input order with the upserts around it; mode xa has no row to
/// write and applies `on_error` (here: the dead-letter table, saying why).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tombstones_delete_their_row_in_upsert_mode_and_follow_on_error_in_xa_mode() -> Result<()> {
    let env = TestEnv::get().await?;
    let c = config(env, Mode::Upsert, OnError::Fail);
    let table = c.table.clone();
    let mut sink = MysqlSink::new(c)?;
    run_one_checkpoint(
        &mut sink,
        vec![
            record(1, r#"{"id":1,"name":"a"}"#),
            record(2, r#"{"id":2,"name":"b"}"#),
            tombstone(3, "1"),
            record(4, r#"{"id":3,"name":"c"}"#),
            tombstone(5, r#"{"id":2}"#),
            record(6, r#"{"id":1,"name":"again"}"#),
        ],
    )
    .await?;
    let mut conn = connect_mysql(env).await?;
    let rows: Vec<(i64, String)> = sqlx::query_as(&format!("SELECT id, CAST(name AS CHAR) FROM `{table}` ORDER BY id"))
        .fetch_all(&mut conn)
        .await?;
    assert_eq!(rows, [(1, "again".to_owned()), (3, "c".to_owned())]);

    let dlq = unique("dead").replace('-', "_");
    let c = config(env, Mode::Xa, OnError::DeadLetter { table: dlq.clone() });
    let table = c.table.clone();
    let mut sink = MysqlSink::new(c)?;
    run_one_checkpoint(&mut sink, vec![record(1, r#"{"id":1,"name":"a"}"#), tombstone(2, "1")]).await?;
    assert_eq!(
        query_i64(&mut conn, &format!("SELECT COUNT(*) FROM `{table}`")).await?,
        1
    );
    assert_eq!(
        query_i64(
            &mut conn,
            &format!("SELECT COUNT(*) FROM `{dlq}` WHERE origin = 'orders/0@2' AND error LIKE '%tombstone%'")
        )
        .await?,
        1
    );
    Ok(())
}

/// Restoring a savepoint taken long ago (here 120 checkpoints) must find its XA branches
/// committed, not report them lost; and the progress table stays bounded however long the job
/// runs. Before, progress rows older than 100 checkpoints were deleted, and such a restore ended
/// in "DATA LOST".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_savepoints_branches_still_read_as_committed_and_progress_stays_bounded() -> Result<()> {
    let env = TestEnv::get().await?;
    let c = config(env, Mode::Xa, OnError::Fail);
    let (table, progress) = (c.table.clone(), c.progress_table.clone());
    let info = subtask_info("mysql");
    let mut sink = MysqlSink::new(c.clone())?;
    sink.initialize_state(&InitContext::new(&info, None)).await?;
    let mut savepoint = None;
    for id in 1..=120u64 {
        sink.write(vec![record(id as i64, &format!(r#"{{"id":{id},"name":"n"}}"#))])
            .await?;
        let mut ctx = SnapshotContext::new(id, SnapshotKind::Checkpoint, 0);
        sink.snapshot_state(&mut ctx).await?;
        if id == 2 {
            savepoint = Some(ctx.into_restored());
        }
        sink.notify_checkpoint_complete(id).await?;
    }
    sink.close().await?;
    let mut conn = connect_mysql(env).await?;
    assert_eq!(
        query_i64(&mut conn, &format!("SELECT COUNT(*) FROM `{table}`")).await?,
        120
    );
    let rows = query_i64(&mut conn, &format!("SELECT COUNT(*) FROM `{progress}`")).await?;
    assert!(rows <= 2, "{rows} progress rows after 120 checkpoints");

    // The savepoint of checkpoint 2, restored: behind the 120 the table holds, so refused ...
    let savepoint = savepoint.expect("taken");
    let mut restoring = info.clone();
    restoring.restored_checkpoint = Some(2);
    let err = MysqlSink::new(c.clone())?
        .initialize_state(&InitContext::new(&restoring, Some(&savepoint)))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("shows checkpoint 120 committed"), "{err}");
    // ... unless the replay is accepted: its branch is committed (not lost), nothing twice, and
    // the sink forgets the commits after it (the checkpoints that follow may reuse their ids).
    restoring.accept_replay = true;
    let mut restored = MysqlSink::new(c)?;
    restored
        .initialize_state(&InitContext::new(&restoring, Some(&savepoint)))
        .await?;
    assert_eq!(
        query_i64(&mut conn, &format!("SELECT COUNT(*) FROM `{table}`")).await?,
        120
    );
    let through = query_i64(
        &mut conn,
        &format!(
            "SELECT GREATEST(COALESCE((SELECT MAX(checkpoint_id) FROM `{progress}`), 0), \
             COALESCE((SELECT MAX(committed_through) FROM `{progress}_through`), 0))"
        ),
    )
    .await?;
    assert_eq!(through, 2, "commits after the restored checkpoint forgotten");
    Ok(())
}

/// A database that refuses the user, or does not exist, stops the job at once with the server's
/// message: a restart cannot cure it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_refuses_the_user_or_lacks_the_database_is_a_permanent_error() -> Result<()> {
    let env = TestEnv::get().await?;
    let mut c = config(env, Mode::Upsert, OnError::Fail);
    let (scheme, rest) = env.mysql_url.split_once("://").expect("a URL");
    let host = rest.split_once('@').map_or(rest, |(_, h)| h);
    c.url = format!("{scheme}://exactly:wrong-password@{host}");
    let mut sink = MysqlSink::new(c.clone())?;
    let err = run_one_checkpoint(&mut sink, vec![]).await.unwrap_err();
    assert_eq!(err.class(), exactly_core::ErrorClass::Fatal, "{err:?}");
    assert!(format!("{err:?}").contains("1045"), "{err:?}");

    let mut c = config(env, Mode::Xa, OnError::Fail);
    let base = env.mysql_url.rsplit_once('/').expect("a database in the URL").0;
    c.url = format!("{base}/no_such_database_{}", unique("db").replace('-', "_"));
    let mut sink = MysqlSink::new(c)?;
    let err = run_one_checkpoint(&mut sink, vec![]).await.unwrap_err();
    assert_eq!(err.class(), exactly_core::ErrorClass::Fatal, "{err:?}");
    Ok(())
}

/// Identifiers reach SQL only as bound parameters (ids) or validated names (tables): a job id
/// with quotes in it works in both modes, progress row and commit included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_id_with_quotes_works() -> Result<()> {
    let env = TestEnv::get().await?;
    for mode in [Mode::Xa, Mode::Upsert] {
        let mut c = config(env, mode, OnError::Fail);
        c.job_id = format!("{}'; \"x", unique("job"));
        let (table, progress, job) = (c.table.clone(), c.progress_table.clone(), c.job_id.clone());
        let mut sink = MysqlSink::new(c)?;
        run_one_checkpoint(&mut sink, vec![record(1, r#"{"id":1,"name":"a"}"#)]).await?;
        let mut conn = connect_mysql(env).await?;
        assert_eq!(
            query_i64(&mut conn, &format!("SELECT COUNT(*) FROM `{table}`")).await?,
            1
        );
        let n: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM `{progress}` WHERE job = ?"))
            .bind(&job)
            .fetch_one(&mut conn)
            .await?;
        assert_eq!(n, 1, "{mode:?}: the progress row under the quoted job id");
    }
    Ok(())
}

/// Checkpoint 1 of a sink prepared (one row), its completion never seen (the process stopped
/// there): the state a restore of it gets.
async fn prepared_not_completed(
    c: &MysqlSinkConfig,
    info: &exactly_core::runtime::SubtaskInfo,
) -> Result<exactly_core::state::RestoredState> {
    let mut sink = MysqlSink::new(c.clone())?;
    sink.initialize_state(&InitContext::new(info, None)).await?;
    sink.write(vec![record(1, r#"{"id":1,"name":"a"}"#)]).await?;
    let mut ctx = SnapshotContext::new(1, SnapshotKind::Checkpoint, 0);
    sink.snapshot_state(&mut ctx).await?;
    Ok(ctx.into_restored())
}

/// The XA branches of job `job_id` that XA RECOVER lists (prepared, neither committed nor
/// rolled back).
async fn prepared_branches(conn: &mut sqlx::MySqlConnection, job_id: &str) -> Result<usize> {
    use sqlx::Row;
    let gtrid = format!("exactly:{job_id}:");
    Ok(sqlx::raw_sql("XA RECOVER")
        .fetch_all(conn)
        .await?
        .iter()
        .filter(|row| {
            row.try_get::<Vec<u8>, _>("data")
                .is_ok_and(|d| d.starts_with(gtrid.as_bytes()))
        })
        .count())
}

/// A run restoring a checkpoint whose location another run took over meanwhile (it stalled past
/// its claim's lease while it restored) changes nothing in the database: the restored
/// checkpoint's prepared XA branch is neither committed nor rolled back by it — the new owner's
/// recovery settles it. The run that still owns the location commits it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_lost_its_location_leaves_the_restored_branch_to_the_owner() -> Result<()> {
    use exactly_core::storage::{CheckpointStorage, Storage};
    use std::sync::Arc;
    use std::time::Duration;

    let env = TestEnv::get().await?;
    let c = config(env, Mode::Xa, OnError::Fail);
    let table = c.table.clone();
    let info = subtask_info("mysql");
    // Checkpoint 1 prepared, its completion never seen (the process stopped there).
    let restored = prepared_not_completed(&c, &info).await?;
    let mut conn = connect_mysql(env).await?;
    let branches = || format!("SELECT COUNT(*) FROM `{table}`");

    let dir = tempfile::tempdir()?;
    let lease = Duration::from_secs(60);
    let stalled = Storage::new(dir.path())?;
    stalled.claim("job", lease)?;
    // Another run claims the location (here the same process: an earlier run of it has ended).
    Storage::new(dir.path())?.claim("job", lease)?;
    let stalled: Arc<dyn CheckpointStorage> = Arc::new(stalled);
    let mut restoring = info.clone();
    restoring.restored_checkpoint = Some(1);
    let err = MysqlSink::new(c.clone())?
        .initialize_state(&InitContext::new(&restoring, Some(&restored)).with_checkpoint_storage(&stalled))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("another run took it over"), "{err}");
    assert_eq!(
        query_i64(&mut conn, &branches()).await?,
        0,
        "not committed by the run that lost the location"
    );
    let prepared = prepared_branches(&mut conn, &c.job_id).await?;
    assert_eq!(prepared, 1, "the branch is still prepared (not rolled back)");

    // The owner's recovery commits it.
    let owner = Storage::new(dir.path())?;
    owner.claim("job", lease)?;
    let owner: Arc<dyn CheckpointStorage> = Arc::new(owner);
    let mut sink = MysqlSink::new(c)?;
    sink.initialize_state(&InitContext::new(&restoring, Some(&restored)).with_checkpoint_storage(&owner))
        .await?;
    assert_eq!(query_i64(&mut conn, &branches()).await?, 1);
    sink.close().await?;
    Ok(())
}

/// The location lost while the recovery runs (a partition from the checkpoint store, the claim
/// taken over after a lease): each step that changes the database checks again, so the recovery
/// stops at the next one, and the restored branch stays prepared for the new owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_that_loses_its_location_midway_stops_before_its_next_step() -> Result<()> {
    use exactly_core::storage::CheckpointStorage;
    use exactly_integration_tests::OwnerLostAfter;
    use std::sync::Arc;

    let env = TestEnv::get().await?;
    let c = config(env, Mode::Xa, OnError::Fail);
    let table = c.table.clone();
    let info = subtask_info("mysql");
    let restored = prepared_not_completed(&c, &info).await?;

    let lost: Arc<dyn CheckpointStorage> = Arc::new(OwnerLostAfter::new(1));
    let mut restoring = info.clone();
    restoring.restored_checkpoint = Some(1);
    let err = MysqlSink::new(c.clone())?
        .initialize_state(&InitContext::new(&restoring, Some(&restored)).with_checkpoint_storage(&lost))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("another run took it over"), "{err}");
    let mut conn = connect_mysql(env).await?;
    assert_eq!(
        query_i64(&mut conn, &format!("SELECT COUNT(*) FROM `{table}`")).await?,
        0,
        "nothing committed after the location was lost"
    );
    let prepared = prepared_branches(&mut conn, &c.job_id).await?;
    assert_eq!(prepared, 1, "the restored branch is still prepared, for the new owner");
    // Tidy: the branch goes with a recovery that owns the location.
    let mut owner = MysqlSink::new(c)?;
    owner
        .initialize_state(&InitContext::new(&restoring, Some(&restored)))
        .await?;
    owner.close().await?;
    Ok(())
}

fn changes_config(env: &TestEnv) -> MysqlSinkConfig {
    MysqlSinkConfig {
        insert_mode: Some(exactly_mysql_sink::InsertMode::Upsert),
        ..config(env, Mode::Xa, OnError::Fail)
    }
}

async fn names(conn: &mut sqlx::MySqlConnection, table: &str) -> Result<Vec<(i64, String)>> {
    Ok(
        sqlx::query_as(&format!("SELECT id, CAST(name AS CHAR) FROM `{table}` ORDER BY id"))
            .fetch_all(conn)
            .await?,
    )
}

fn pairs(rows: &[(i64, &str)]) -> Vec<(i64, String)> {
    rows.iter().map(|(i, s)| (*i, s.to_string())).collect()
}

/// Mode `xa` with insert_mode `upsert` (a change stream): a checkpoint's upserts and deletes
/// commit with its XA branch. The records after a barrier arrive while that checkpoint's prepared
/// branch still holds the rows it changed, before the checkpoint completes; changes to those rows
/// must not wait for locks that only this subtask's own commit, later, releases. (Written at
/// once, the write below fails after MariaDB's lock wait timeout.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_in_xa_mode_commit_with_their_checkpoint_and_never_wait_for_their_own_commit() -> Result<()> {
    let env = TestEnv::get().await?;
    let c = changes_config(env);
    let (table, job) = (c.table.clone(), c.job_id.clone());
    let mut sink = MysqlSink::new(c)?;
    let info = subtask_info("mysql");
    sink.initialize_state(&InitContext::new(&info, None)).await?;
    sink.write(vec![
        record(1, r#"{"id":1,"name":"a"}"#),
        record(2, r#"{"id":2,"name":"b"}"#),
        record(3, r#"{"id":3,"name":"c"}"#),
        record(4, r#"{"id":3,"name":"c2"}"#),
    ])
    .await?;
    sink.snapshot_state(&mut SnapshotContext::new(1, SnapshotKind::Checkpoint, 0))
        .await?;
    // Checkpoint 2's changes, before checkpoint 1 completes, to rows checkpoint 1 holds.
    within(
        "a write of checkpoint 2",
        sink.write(vec![record(5, r#"{"id":1,"name":"a2"}"#), tombstone(6, "2")]),
    )
    .await??;
    let mut conn = connect_mysql(env).await?;
    assert_eq!(names(&mut conn, &table).await?, [], "nothing visible before completion");
    sink.notify_checkpoint_complete(1).await?;
    assert_eq!(
        names(&mut conn, &table).await?,
        pairs(&[(1, "a"), (2, "b"), (3, "c2")]),
        "checkpoint 1's rows (the later of two for one key)"
    );
    // After the commit: written at once, behind the held changes (row 2 deleted, then back).
    sink.write(vec![record(7, r#"{"id":2,"name":"b3"}"#)]).await?;
    within(
        "checkpoint 2's pre-commit",
        sink.snapshot_state(&mut SnapshotContext::new(2, SnapshotKind::Checkpoint, 0)),
    )
    .await??;
    sink.notify_checkpoint_complete(2).await?;
    assert_eq!(
        names(&mut conn, &table).await?,
        pairs(&[(1, "a2"), (2, "b3"), (3, "c2")]),
        "checkpoint 2 updated row 1, deleted row 2 and wrote it again, in that order"
    );
    sink.close().await?;
    assert_eq!(prepared_branches(&mut conn, &job).await?, 0);
    Ok(())
}

/// A sink whose checkpoint 1 (row 1) is prepared and then aborted: its branch waits for a later
/// checkpoint to commit it, holding row 1.
async fn row_1_prepared_then_aborted(
    c: &MysqlSinkConfig,
    info: &exactly_core::runtime::SubtaskInfo,
) -> Result<MysqlSink> {
    let mut sink = MysqlSink::new(c.clone())?;
    sink.initialize_state(&InitContext::new(info, None)).await?;
    sink.write(vec![record(1, r#"{"id":1,"name":"a"}"#)]).await?;
    sink.snapshot_state(&mut SnapshotContext::new(1, SnapshotKind::Checkpoint, 0))
        .await?;
    sink.notify_checkpoint_aborted(1).await?;
    Ok(sink)
}

/// When the earlier checkpoint did not complete (aborted: its branch waits for a later checkpoint
/// to commit it), the next checkpoint's changes to its rows cannot be written before that one
/// completes: the pre-commit gives up after a bounded wait with an error that names the cause,
/// and the job restarts and recovers (here: nothing committed, the branch rolled back by the
/// next start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_held_behind_an_aborted_checkpoint_fail_the_xa_pre_commit_saying_why() -> Result<()> {
    let env = TestEnv::get().await?;
    let c = changes_config(env);
    let (table, job) = (c.table.clone(), c.job_id.clone());
    let info = subtask_info("mysql");
    let mut sink = row_1_prepared_then_aborted(&c, &info).await?;
    within(
        "a write of checkpoint 2",
        sink.write(vec![record(2, r#"{"id":1,"name":"a2"}"#)]),
    )
    .await??;
    let e = within(
        "checkpoint 2's pre-commit",
        sink.snapshot_state(&mut SnapshotContext::new(2, SnapshotKind::Checkpoint, 0)),
    )
    .await?
    .expect_err("checkpoint 2 cannot prepare while checkpoint 1's branch holds row 1");
    let text = format!("{e:#}");
    assert!(
        text.contains("held back") && text.contains("\"0:1\"") && text.contains("Lock wait timeout"),
        "{text}"
    );
    drop(sink);
    // The next start (restored from before checkpoint 1) rolls checkpoint 1's branch back.
    let mut next = MysqlSink::new(c)?;
    next.initialize_state(&InitContext::new(&info, None)).await?;
    let mut conn = connect_mysql(env).await?;
    assert_eq!(prepared_branches(&mut conn, &job).await?, 0);
    assert_eq!(names(&mut conn, &table).await?, []);
    Ok(())
}

/// After a failed checkpoint, the next one's held records that touch other rows are written at
/// its barrier (with the bounded lock wait) and prepared; its completion commits both branches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_held_behind_an_aborted_checkpoint_on_other_rows_commit_with_the_next_branch() -> Result<()> {
    let env = TestEnv::get().await?;
    let c = changes_config(env);
    let (table, job) = (c.table.clone(), c.job_id.clone());
    let info = subtask_info("mysql");
    let mut sink = row_1_prepared_then_aborted(&c, &info).await?;
    within(
        "a write of checkpoint 2",
        sink.write(vec![record(2, r#"{"id":5,"name":"e"}"#), tombstone(3, "6")]),
    )
    .await??;
    within(
        "checkpoint 2's pre-commit",
        sink.snapshot_state(&mut SnapshotContext::new(2, SnapshotKind::Checkpoint, 0)),
    )
    .await??;
    let mut conn = connect_mysql(env).await?;
    assert_eq!(
        names(&mut conn, &table).await?,
        [],
        "nothing visible before a completion"
    );
    sink.notify_checkpoint_complete(2).await?;
    assert_eq!(names(&mut conn, &table).await?, pairs(&[(1, "a"), (5, "e")]));
    sink.close().await?;
    assert_eq!(prepared_branches(&mut conn, &job).await?, 0);
    Ok(())
}
