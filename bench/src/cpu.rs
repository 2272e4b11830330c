//! CPU time of the bench process and of a local Kafka broker over one measured run (Linux
//! `/proc`), in µs per record: on a machine the pipeline saturates, the rate follows the CPU each
//! record costs, and the split says whose CPU it is.

/// CPU seconds used so far by process `pid` (all its threads, ended ones included).
fn cpu_secs(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces and parentheses): state is the first,
    // utime the 12th and stime the 13th.
    let mut f = stat.get(stat.rfind(')')? + 2..)?.split_ascii_whitespace();
    let utime: u64 = f.nth(11)?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    let ticks = rustix::param::clock_ticks_per_second();
    (ticks > 0).then(|| (utime + stime) as f64 / ticks as f64)
}

/// The broker whose CPU is reported: `BENCH_BROKER_PID`, else, when the cluster is on this
/// machine (`local`), the one local process running `kafka.Kafka` (none or several: not reported).
fn broker_pid(local: bool) -> Option<String> {
    if let Ok(pid) = std::env::var("BENCH_BROKER_PID") {
        return Some(pid);
    }
    if !local {
        return None;
    }
    let mut found = std::fs::read_dir("/proc").ok()?.filter_map(|e| {
        let name = e.ok()?.file_name().into_string().ok()?;
        name.bytes().all(|b| b.is_ascii_digit()).then_some(())?;
        let cmdline = std::fs::read(format!("/proc/{name}/cmdline")).ok()?;
        cmdline
            .split(|&b| b == 0)
            .any(|arg| arg == b"kafka.Kafka")
            .then_some(name)
    });
    let first = found.next()?;
    found.next().is_none().then_some(first)
}

/// CPU seconds a child process has used so far (its threads, ended ones included).
pub(super) fn child_cpu_secs(pid: u32) -> Option<f64> {
    cpu_secs(&pid.to_string())
}

/// CPU used from [`CpuClock::start`] on, by this process and by the broker.
pub(super) struct CpuClock {
    broker: Option<String>,
    start: (Option<f64>, Option<f64>),
}

/// µs of CPU per record over a run (`None`: not measurable here).
pub(super) struct CpuPerRecord {
    pub(super) process: Option<f64>,
    pub(super) broker: Option<f64>,
}

/// A figure for the table: µs with two decimals, or `-`.
pub(super) fn show(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

impl CpuClock {
    /// Starts counting; `local`: the cluster's brokers are on this machine.
    pub(super) fn start(local: bool) -> Self {
        let broker = broker_pid(local);
        let start = (cpu_secs("self"), broker.as_deref().and_then(cpu_secs));
        Self { broker, start }
    }

    /// µs of CPU per record for `records` records since the start.
    pub(super) fn per_record(&self, records: u64) -> CpuPerRecord {
        let per = |before: Option<f64>, now: Option<f64>| Some((now? - before?) * 1e6 / records.max(1) as f64);
        CpuPerRecord {
            process: per(self.start.0, cpu_secs("self")),
            broker: per(self.start.1, self.broker.as_deref().and_then(cpu_secs)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_cpu_this_process_spends() {
        let clock = CpuClock::start(false);
        let before = cpu_secs("self").expect("/proc/self/stat is readable on Linux");
        // Spin until the kernel has counted 50 ms of CPU (a busy machine only makes it take longer;
        // a clock that never moves fails below rather than hangs).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut x = 0u64;
        while cpu_secs("self").expect("readable") - before < 0.05 && std::time::Instant::now() < deadline {
            for _ in 0..100_000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
        }
        std::hint::black_box(x);
        let used = clock.per_record(10).process.expect("readable");
        assert!(used >= 5_000.0, "{used} µs per record, 50 ms over 10 records");
    }
}
