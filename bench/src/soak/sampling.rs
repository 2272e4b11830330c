//! One sample of the soak's job: its process, its log's checkpoints, the reader's latencies,
//! the broker's transactional ids and the checkpoint directory.

use super::*;

/// One sample of the running job: its process (NaN when gone), its log's checkpoints in (`from`,
/// `to`], the reader's latencies since the last sample, the broker's transactional ids, the
/// checkpoint directory.
#[allow(clippy::too_many_arguments)]
pub(super) async fn sample(
    cluster: &Cluster,
    job: &mut Job,
    incarnation: usize,
    dir: &Path,
    id: &str,
    from: SystemTime,
    to: SystemTime,
    delivered: &Deliveries,
    seen: &Mutex<Seen>,
) -> Result<Sample> {
    let pid = job.child.0.id();
    let alive = job.child.0.try_wait()?.is_none();
    let process = |v: Option<f64>| v.filter(|_| alive).unwrap_or(f64::NAN);
    let cpu = match crate::cpu::child_cpu_secs(pid).filter(|_| alive) {
        Some(secs) => {
            let cores = (secs - job.cpu_secs).max(0.0) / job.cpu_at.elapsed().as_secs_f64();
            (job.cpu_secs, job.cpu_at) = (secs, Instant::now());
            cores
        }
        None => f64::NAN,
    };
    let mut durations: Vec<f64> = checkpoints_in(&std::fs::read_to_string(&job.log).unwrap_or_default())
        .into_iter()
        .filter(|c| c.0 > from && c.0 <= to)
        .map(|c| c.1)
        .collect();
    durations.sort_by(f64::total_cmp);
    let (mut latencies, distinct) = {
        let mut s = seen.lock().expect("seen");
        (std::mem::take(&mut s.latencies), s.distinct)
    };
    // Read with the reader's count, before the broker is asked anything.
    let delivered_now = delivered.delivered.load(Ordering::Relaxed);
    latencies.sort_unstable();
    let q = |v: &[i64], q: f64| (!v.is_empty()).then(|| v[((v.len() - 1) as f64 * q).round() as usize] as f64);
    let transactional_ids = match exactly_kafka_sink::admin::list_transactions(cluster, id).await {
        Ok(t) => t.len() as f64,
        Err(e) => {
            eprintln!("the transactional ids could not be listed: {e}");
            f64::NAN
        }
    };
    let (bytes, dirs) = dir_size(&dir.join("checkpoints"));
    Ok(Sample {
        t: 0.0,
        incarnation,
        rss_mb: process(status_kb(pid, "VmRSS:").map(|kb| kb as f64 / 1024.0)),
        fds: process(
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .ok()
                .map(|d| d.count() as f64),
        ),
        threads: process(status_kb(pid, "Threads:").map(|n| n as f64)),
        cpu,
        checkpoints: durations.len(),
        checkpoint_ms_p50: (!durations.is_empty()).then(|| median(durations.clone())),
        checkpoint_ms_max: durations.last().copied(),
        latency_ms_p50: q(&latencies, 0.5),
        latency_ms_p99: q(&latencies, 0.99),
        latency_ms_max: latencies.last().map(|&l| l as f64),
        lag: delivered_now.saturating_sub(distinct) as f64,
        transactional_ids,
        checkpoint_dir_kb: bytes as f64 / 1e3,
        checkpoint_dirs: dirs as f64,
    })
}

/// Bytes of the files under `dir`, and its `chk-N` directories (at any depth).
fn dir_size(dir: &Path) -> (u64, u64) {
    let (mut bytes, mut checkpoints) = (0, 0);
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(meta) = e.metadata() else {
                continue;
            };
            if meta.is_dir() {
                if e.file_name().to_string_lossy().starts_with("chk-") {
                    checkpoints += 1;
                }
                stack.push(e.path());
            } else {
                bytes += meta.len();
            }
        }
    }
    (bytes, checkpoints)
}
