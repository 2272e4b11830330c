//! The MySQL sink's record handling against MariaDB: records that do not fit the mapping fail the
//! job (naming the record), are skipped, or land in the dead-letter table with their origin; in
//! both modes the rows become visible only when the checkpoint completes (xa) or at the barrier
//! (upsert), together with the progress row.

use anyhow::Result;
use exactly_core::runtime::{InitContext, Sink, SnapshotContext, SubtaskInfo};
use exactly_core::SnapshotKind;
use exactly_integration_tests::{connect_mysql, query_i64, unique, TestEnv};
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
        table: unique("records").replace('-', "_"),
        mode,
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
        origin: Some(Origin {
            topic: "orders".into(),
            partition: 0,
            offset,
        }),
    }
}

fn info() -> SubtaskInfo {
    SubtaskInfo {
        uid: "mysql".into(),
        index: 0,
        parallelism: 1,
        max_parallelism: 128,
        attempt: 0,
    }
}

async fn run_one_checkpoint(sink: &mut MysqlSink, records: Vec<SinkRecord>) -> exactly_core::Result<()> {
    let info = info();
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
