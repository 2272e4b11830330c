//! `exactly bench mysql`: the MySQL sink in XA and upsert modes vs a plain batched INSERT loop.

use std::time::{Duration, Instant};

use anyhow::Result;

use super::kafka::*;
use super::Report;
use exactly_core::runtime::JobBuilder;
use exactly_kafka_client::Cluster;
use exactly_kafka_source::{KafkaSource, RawBytes};
use exactly_mysql_sink::{Column, ColumnType, Format, Mapping, Mode, MysqlSink, MysqlSinkConfig, OnError};
use rdkafka::Message;

pub(crate) async fn bench_mysql(cluster: &Cluster, mysql: &str, n: u64, report: &mut Report) -> Result<()> {
    let input = unique("bench-sql");
    topic(cluster, &input).await?;
    backlog(cluster, &input, n, 0, true)?;
    println!("Kafka-to-MySQL: {n} rows (id, k, seq), batches of 500, checkpoints every 1 s");
    let col = |name: &str, ty, key: bool| {
        let c = Column::new(name, ty).length(32);
        if key {
            c.key()
        } else {
            c
        }
    };
    let mapping = Mapping {
        format: Format::Delimited { delimiter: ',' },
        columns: vec![
            col("id", ColumnType::Bigint, true),
            col("k", ColumnType::Varchar, false),
            col("seq", ColumnType::Bigint, false),
        ],
    };
    // Baseline: read the same records, plain batched INSERTs, autocommit per batch.
    let table = unique("bench_plain").replace('-', "_");
    let mut conn = {
        use sqlx::ConnectOptions;
        let o: sqlx::mysql::MySqlConnectOptions = mysql.parse()?;
        o.connect().await?
    };
    sqlx::Executor::execute(&mut conn, mapping.ddl(&table).as_str()).await?;
    let c = consumer(cluster, &input, true)?;
    let start = Instant::now();
    let mut seen = 0u64;
    let mut batch: Vec<(i64, String, i64)> = Vec::new();
    while seen < n {
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            let m = m?;
            let text = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
            let f: Vec<&str> = text.split(',').collect();
            batch.push((f[0].parse()?, f[1].to_owned(), f[2].parse()?));
            seen += 1;
        }
        if batch.len() >= 500 || (seen == n && !batch.is_empty()) {
            let mut qb = sqlx::QueryBuilder::<sqlx::MySql>::new(format!("INSERT INTO `{table}` (id, k, seq) "));
            qb.push_values(batch.drain(..), |mut b, (id, k, s)| {
                b.push_bind(id).push_bind(k).push_bind(s);
            });
            qb.build().execute(&mut conn).await?;
        }
    }
    let plain = n as f64 / start.elapsed().as_secs_f64();
    println!("{:<22} {:>12.0} rows/s   ratio 1.000", "plain INSERT loop", plain);
    report.row("mysql", "plain INSERT loop", &[("rows_per_s", plain), ("ratio", 1.0)]);
    sqlx::Executor::execute(&mut conn, format!("DROP TABLE IF EXISTS `{table}`").as_str()).await?;
    for mode in [Mode::Xa, Mode::Upsert] {
        let table = unique("bench_rows").replace('-', "_");
        let job_id = unique("bench");
        let config = MysqlSinkConfig {
            url: mysql.to_owned(),
            password_file: None,
            table: table.clone(),
            mode,
            insert_mode: None,
            job_id: job_id.clone(),
            sink_id: "rows".into(),
            mapping: mapping.clone(),
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
            .map(exactly_jobs::records::to_mysql)
            .sink("mysql", move |_| MysqlSink::new(config.clone()).expect("valid"));
        let start = Instant::now();
        let started = (job.build()?.start(), start);
        let count = format!("SELECT COUNT(*) FROM `{table}`");
        let rows =
            async || -> Result<u64> { Ok(sqlx::query_scalar::<_, i64>(&count).fetch_one(&mut conn).await? as u64) };
        let rate = table_job_rate(cluster, (&input, &group), n, started, &table, rows).await?;
        let name = if mode == Mode::Xa {
            "xa (two-phase)"
        } else {
            "upsert (idempotent)"
        };
        println!("{name:<22} {rate:>12.0} rows/s   ratio {:.3}", rate / plain);
        report.row("mysql", name, &[("rows_per_s", rate), ("ratio", rate / plain)]);
        sqlx::Executor::execute(&mut conn, format!("DROP TABLE IF EXISTS `{table}`").as_str()).await?;
    }
    delete_topics(cluster, &[&input]).await;
    Ok(())
}
