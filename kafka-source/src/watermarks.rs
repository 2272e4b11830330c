//! Event time: a bounded-out-of-orderness watermark per partition, combined over the partitions a
//! subtask reads, with partitions that have been silent for the idle timeout left out (as Flink's
//! `WatermarkStrategy.forBoundedOutOfOrderness(..).withIdleness(..)` does per split).

use std::time::{Duration, Instant};

use exactly_core::runtime::SourceWatermark;
use exactly_core::Watermark;
use serde::{Deserialize, Serialize};

/// Watermark generation (`[source.watermarks]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatermarkConfig {
    /// How late a record may be relative to the largest timestamp seen in its partition.
    #[serde(with = "humantime_serde")]
    pub max_out_of_orderness: Duration,
    /// A partition without records for this long stops holding the watermark back; a subtask
    /// whose partitions are all idle (or that has none) tells downstream it is idle.
    #[serde(default, with = "humantime_serde")]
    pub idle_timeout: Option<Duration>,
}

/// The event-time state of one partition.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PartitionClock {
    /// Largest record timestamp seen (ms).
    pub(crate) max_ts: Option<i64>,
    /// When the partition last delivered a record (or was assigned).
    pub(crate) last_active: Instant,
}

impl PartitionClock {
    pub(crate) fn new(now: Instant) -> Self {
        PartitionClock {
            max_ts: None,
            last_active: now,
        }
    }

    pub(crate) fn saw(&mut self, timestamp: Option<i64>, now: Instant) {
        if let Some(ts) = timestamp {
            self.max_ts = Some(self.max_ts.map_or(ts, |m| m.max(ts)));
        }
        self.last_active = now;
    }
}

/// The subtask's watermark: the minimum over active partitions of (largest timestamp − bound −
/// 1); `Idle` when no partition is active; `None` while an active partition has no record yet.
pub(crate) fn combine<'a>(
    config: &WatermarkConfig,
    now: Instant,
    partitions: impl Iterator<Item = &'a PartitionClock>,
) -> Option<SourceWatermark> {
    let bound = i64::try_from(config.max_out_of_orderness.as_millis()).unwrap_or(i64::MAX);
    let mut min: Option<i64> = None;
    let mut active = 0;
    for p in partitions {
        if config
            .idle_timeout
            .is_some_and(|t| now.saturating_duration_since(p.last_active) >= t)
        {
            continue;
        }
        active += 1;
        let w = p.max_ts?.saturating_sub(bound).saturating_sub(1);
        min = Some(min.map_or(w, |m| m.min(w)));
    }
    if active == 0 {
        return Some(SourceWatermark::Idle);
    }
    min.map(|m| SourceWatermark::At(Watermark(m)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(idle: Option<u64>) -> WatermarkConfig {
        WatermarkConfig {
            max_out_of_orderness: Duration::from_millis(100),
            idle_timeout: idle.map(Duration::from_millis),
        }
    }

    #[test]
    fn minimum_over_partitions_minus_the_bound() {
        let now = Instant::now();
        let mut a = PartitionClock::new(now);
        let mut b = PartitionClock::new(now);
        assert_eq!(combine(&config(None), now, [a, b].iter()), None, "no record yet");
        a.saw(Some(1_000), now);
        assert_eq!(combine(&config(None), now, [a, b].iter()), None, "b holds it back");
        b.saw(Some(5_000), now);
        a.saw(Some(900), now); // late record: the maximum stays
        assert_eq!(
            combine(&config(None), now, [a, b].iter()),
            Some(SourceWatermark::At(Watermark(899)))
        );
    }

    #[test]
    fn silent_partitions_stop_holding_back_and_all_silent_is_idle() {
        let t0 = Instant::now();
        let mut a = PartitionClock::new(t0);
        let b = PartitionClock::new(t0);
        a.saw(Some(10_000), t0);
        let c = config(Some(50));
        assert_eq!(combine(&c, t0, [a, b].iter()), None, "b is not idle yet");
        let later = t0 + Duration::from_millis(60);
        assert_eq!(combine(&c, later, [a, b].iter()), Some(SourceWatermark::Idle));
        a.saw(Some(10_100), later);
        assert_eq!(
            combine(&c, later, [a, b].iter()),
            Some(SourceWatermark::At(Watermark(9_999))),
            "a is active again; b is still idle"
        );
        assert_eq!(
            combine(&c, later, [].iter()),
            Some(SourceWatermark::Idle),
            "no partition"
        );
    }
}
