//! `exactly bench postgres`: the PostgreSQL sink in two-phase and upsert modes vs a plain batched
//! INSERT loop, over the same connection settings (TLS as the URL says).

use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::kafka::*;
use super::Report;
use exactly_core::runtime::JobBuilder;
use exactly_kafka_client::Cluster;
use exactly_kafka_source::{KafkaSource, RawBytes};
use exactly_postgres_sink::{Column, Mode, OnError, PostgresSink, PostgresSinkConfig};
use rdkafka::Message;

/// JSON `{"id", "k", "seq"}` records, as the sink reads them.
fn json_backlog(cluster: &Cluster, topic: &str, n: u64) -> Result<()> {
    let p = producer(cluster)?;
    for i in 0..n {
        let key = format!("k{}", i % 1000);
        let value = format!(r#"{{"id":{i},"k":"{key}","seq":{i}}}"#);
        send(&p, topic, key.as_bytes(), value.as_bytes());
    }
    rdkafka::producer::Producer::flush(&p, Duration::from_secs(120))?;
    Ok(())
}

async fn exec(conn: &mut sqlx::PgConnection, sql: String) -> Result<()> {
    sqlx::Executor::execute(conn, sql.as_str()).await?;
    Ok(())
}

pub(crate) async fn bench_postgres(cluster: &Cluster, url: &str, n: u64, report: &mut Report) -> Result<()> {
    let input = unique("bench-pg");
    topic(cluster, &input).await?;
    json_backlog(cluster, &input, n)?;
    println!("Kafka-to-PostgreSQL: {n} rows (id, k, seq) from JSON records, batches of 500, checkpoints every 1 s");
    let mut conn = exactly_postgres_sink::connect_url(url, None).await?;
    // Baseline: read the same records, plain batched INSERTs, autocommit per batch.
    let table = unique("bench_pg_plain").replace('-', "_");
    exec(
        &mut conn,
        // As the sink creates its table: the key column is the primary key.
        format!("CREATE TABLE \"{table}\" (id bigint PRIMARY KEY, k text, seq bigint)"),
    )
    .await?;
    let c = consumer(cluster, &input, true)?;
    let start = Instant::now();
    let mut seen = 0u64;
    let mut batch: Vec<(i64, String, i64)> = Vec::new();
    while seen < n {
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            let m = m?;
            let v: serde_json::Value = serde_json::from_slice(m.payload().unwrap_or_default())?;
            let field = |f: &str| v[f].as_i64().with_context(|| format!("field {f} of {v}"));
            batch.push((
                field("id")?,
                v["k"].as_str().unwrap_or_default().to_owned(),
                field("seq")?,
            ));
            seen += 1;
        }
        if batch.len() >= 500 || (seen == n && !batch.is_empty()) {
            let mut qb = sqlx::QueryBuilder::<sqlx::Postgres>::new(format!("INSERT INTO \"{table}\" (id, k, seq) "));
            qb.push_values(batch.drain(..), |mut b, (id, k, s)| {
                b.push_bind(id).push_bind(k).push_bind(s);
            });
            qb.build().execute(&mut conn).await?;
        }
    }
    let plain = n as f64 / start.elapsed().as_secs_f64();
    println!("{:<22} {:>12.0} rows/s   ratio 1.000", "plain INSERT loop", plain);
    report.row(
        "postgres",
        "plain INSERT loop",
        &[("rows_per_s", plain), ("ratio", 1.0)],
    );
    exec(&mut conn, format!("DROP TABLE IF EXISTS \"{table}\"")).await?;
    let column = |name: &str, ty: &str, key: bool| Column {
        name: name.into(),
        sql_type: ty.into(),
        key,
        field: None,
    };
    for mode in [Mode::TwoPhase, Mode::Upsert] {
        let table = unique("bench_pg_rows").replace('-', "_");
        let job_id = unique("bench");
        let config = PostgresSinkConfig {
            url: url.to_owned(),
            password_file: None,
            table: table.clone(),
            mode,
            insert_mode: None,
            job_id: job_id.clone(),
            sink_id: "rows".into(),
            columns: vec![
                column("id", "bigint", true),
                column("k", "text", false),
                column("seq", "bigint", false),
            ],
            batch_size: 500,
            create_table: true,
            progress_table: "bench_progress".into(),
            on_error: OnError::Fail,
        };
        let group = unique("g");
        let source = source_config(cluster, &input, &group);
        let dir = tempfile::tempdir()?;
        let mut job = JobBuilder::new(job_config(dir.path()));
        job.source("in", 1, move |_| KafkaSource::new(source.clone(), RawBytes))
            .map(exactly_jobs::records::to_postgres)
            .sink("postgres", move |_| PostgresSink::new(config.clone()).expect("valid"));
        let start = Instant::now();
        let started = (job.build()?.start(), start);
        let count = format!("SELECT COUNT(*) FROM \"{table}\"");
        let rows =
            async || -> Result<u64> { Ok(sqlx::query_scalar::<_, i64>(&count).fetch_one(&mut conn).await? as u64) };
        let rate = table_job_rate(cluster, (&input, &group), n, started, &table, rows).await?;
        let name = if mode == Mode::TwoPhase {
            "two_phase (prepared)"
        } else {
            "upsert (idempotent)"
        };
        println!("{name:<22} {rate:>12.0} rows/s   ratio {:.3}", rate / plain);
        report.row("postgres", name, &[("rows_per_s", rate), ("ratio", rate / plain)]);
        exec(&mut conn, format!("DROP TABLE IF EXISTS \"{table}\"")).await?;
    }
    delete_topics(cluster, &[&input]).await;
    Ok(())
}
