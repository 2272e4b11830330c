//! The soak's samples as SVG charts.

use super::*;

/// The samples over time as SVG charts next to `json`: `<stem>-<figure>.svg`.
pub(super) fn charts(json: &Path, samples: &[Sample]) -> Result<Vec<PathBuf>> {
    let stem = json.file_stem().and_then(|s| s.to_str()).unwrap_or("bench");
    let dir = json.parent().unwrap_or(Path::new("."));
    let xs = |f: &dyn Fn(&Sample) -> Option<f64>| -> Vec<(f64, f64)> {
        samples
            .iter()
            .filter_map(|s| f(s).filter(|v| v.is_finite()).map(|y| (s.t / 60.0, y)))
            .collect()
    };
    let title = "Kafka-to-Kafka exactly-once soak, SIGKILLed on schedule";
    let mut written = Vec::new();
    let mut chart = |name: &str, y: &str, series: Vec<(&str, Vec<(f64, f64)>)>| -> Result<()> {
        let path = dir.join(format!("{stem}-{name}.svg"));
        crate::chart::lines(&path, title, "minutes", y, &series)?;
        written.push(path);
        Ok(())
    };
    chart("rss", "resident memory, MB", vec![("RSS", xs(&|s| Some(s.rss_mb)))])?;
    chart(
        "handles",
        "count",
        vec![
            ("open fds", xs(&|s| Some(s.fds))),
            ("threads", xs(&|s| Some(s.threads))),
            ("transactional ids", xs(&|s| Some(s.transactional_ids))),
        ],
    )?;
    chart(
        "checkpoint",
        "checkpoint duration, ms",
        vec![
            ("p50", xs(&|s| s.checkpoint_ms_p50)),
            ("max", xs(&|s| s.checkpoint_ms_max)),
        ],
    )?;
    chart(
        "latency",
        "end-to-end latency, ms",
        vec![("p50", xs(&|s| s.latency_ms_p50)), ("p99", xs(&|s| s.latency_ms_p99))],
    )?;
    chart(
        "dir",
        "checkpoint directory, kB",
        vec![("size", xs(&|s| Some(s.checkpoint_dir_kb)))],
    )?;
    Ok(written)
}
