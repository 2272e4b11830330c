//! `exactly bench source`: the Kafka source in a checkpointed job vs a plain consumer loop.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::kafka::*;
use super::Report;
use exactly_core::runtime::{JobBuilder, Sink};
use exactly_kafka_client::Cluster;
use exactly_kafka_source::{KafkaSource, RawBytes};
use rdkafka::Message;

/// Counts records; `done` is polled by the benchmark.
pub(super) struct Count(Arc<AtomicU64>);

impl<T: Send + 'static> Sink<T> for Count {
    async fn write(&mut self, records: Vec<T>) -> exactly_core::Result<()> {
        self.0.fetch_add(records.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

pub(crate) async fn bench_source(cluster: &Cluster, n: u64, report: &mut Report) -> Result<()> {
    let input = unique("bench-src");
    topic(cluster, &input).await?;
    backlog(cluster, &input, n, 100, false)?;
    println!(
        "Kafka source vs plain rdkafka consumer loop: {n} records of 100 B, {PARTITIONS} partitions, one reader each"
    );
    let mut rates = Vec::new();
    for round in 0..2 {
        // plain
        // Rates are timed from the first record on, so start-up (metadata, offset look-ups, job
        // set-up) does not count for either side.
        let created = Instant::now();
        let c = consumer(cluster, &input, true)?;
        let mut start = None;
        let mut seen = 0;
        while seen < n {
            if let Some(m) = c.poll(Duration::from_millis(100)) {
                let m = m?;
                start.get_or_insert_with(Instant::now);
                std::hint::black_box(m.payload());
                seen += 1;
            }
        }
        let plain = (n - 1) as f64 / start.expect("records").elapsed().as_secs_f64();
        let plain_total = n as f64 / created.elapsed().as_secs_f64();
        // this source, one subtask, checkpoints every second
        let dir = tempfile::tempdir()?;
        let count = Arc::new(AtomicU64::new(0));
        let mut source = source_config(cluster, &input, &unique("g"));
        source.client.extend(client_overrides("BENCH_SOURCE_CLIENT"));
        let mut job = JobBuilder::new(job_config(dir.path()));
        let c2 = count.clone();
        job.source("in", 1, move |_| KafkaSource::new(source.clone(), RawBytes))
            .sink("count", move |_| Count(c2.clone()));
        let created = Instant::now();
        let handle = job.build()?.start();
        while count.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let (start, first) = (Instant::now(), count.load(Ordering::Relaxed));
        while count.load(Ordering::Relaxed) < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let ours = (n - first) as f64 / start.elapsed().as_secs_f64();
        let ours_total = n as f64 / created.elapsed().as_secs_f64();
        handle.cancel();
        handle.join().await?;
        println!(
            "round {}: from the first record: plain loop {plain:>9.0}/s, exactly source {ours:>9.0}/s, ratio {:.3}; including start-up: {plain_total:>9.0}/s vs {ours_total:>9.0}/s, ratio {:.3}",
            round + 1,
            ours / plain,
            ours_total / plain_total
        );
        rates.push(ours / plain);
        report.row(
            "source",
            &format!("round {}", round + 1),
            &[
                ("plain_records_per_s", plain),
                ("exactly_records_per_s", ours),
                ("ratio", ours / plain),
                ("plain_with_startup_records_per_s", plain_total),
                ("exactly_with_startup_records_per_s", ours_total),
                ("ratio_with_startup", ours_total / plain_total),
            ],
        );
    }
    delete_topics(cluster, &[&input]).await;
    Ok(())
}
