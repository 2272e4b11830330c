//! Named fail points for crash tests. Inactive (one atomic load) unless the process was started
//! with `EXACTLY_FAILPOINTS`, e.g. `sink.after_pre_commit=freeze@3;checkpoint.after_durable=delay@200ms`:
//!
//! - `freeze@N`: on the N-th hit, print `FAILPOINT <name>` on stderr and stop making progress, so
//!   the test that runs this process can kill it (SIGKILL) exactly there;
//! - `delay@D`: print `FAILPOINT <name> delay` and sleep for D (a human duration) at every hit;
//!   `delay@D@N`: only at the N-th hit.
//!
//! Points: `checkpoint.after_durable` (metadata written, completion not yet notified),
//! `sink.before_pre_commit`, `sink.in_background_pre_commit` (a pre-commit completing in the
//! background has begun; the next transaction takes records meanwhile), `sink.after_pre_commit`
//! (prepared, checkpoint not yet acknowledged or durable),
//! `sink.before_commit`, `sink.between_commits`, `sink.in_background_commit` (a commit completing
//! in the background has begun; records flow meanwhile), `sink.after_commit`, `sink.before_recovery_commit`
//! (restored, before committing the restored checkpoint's transactions).
//!
//! Points hit on behalf of one operator ([`hit_in`]) also answer to `<uid>:<point>`, e.g.
//! `orders-table:sink.after_commit=freeze@2` for one sink of a job with several.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// The environment variable that arms fail points.
pub const ENV: &str = "EXACTLY_FAILPOINTS";

#[derive(Debug)]
enum Action {
    Freeze(u64),
    Delay(Duration, Option<u64>),
}

#[derive(Debug)]
struct Point {
    action: Action,
    hits: AtomicU64,
}

fn parse(spec: &str) -> HashMap<String, Point> {
    let mut out = HashMap::new();
    for item in spec.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((name, action)) = item.split_once('=') else {
            eprintln!("{ENV}: ignoring {item:?} (expected name=action)");
            continue;
        };
        let parts: Vec<&str> = action.split('@').collect();
        let action = match parts.as_slice() {
            ["freeze", n] => n.parse().ok().map(Action::Freeze),
            ["delay", d] => humantime::parse_duration(d).ok().map(|d| Action::Delay(d, None)),
            ["delay", d, n] => match (humantime::parse_duration(d), n.parse()) {
                (Ok(d), Ok(n)) => Some(Action::Delay(d, Some(n))),
                _ => None,
            },
            _ => None,
        };
        match action {
            Some(action) => {
                out.insert(
                    name.to_owned(),
                    Point {
                        action,
                        hits: AtomicU64::new(0),
                    },
                );
            }
            None => eprintln!("{ENV}: ignoring {item:?} (actions: freeze@N, delay@DURATION)"),
        }
    }
    out
}

fn points() -> &'static HashMap<String, Point> {
    static POINTS: OnceLock<HashMap<String, Point>> = OnceLock::new();
    POINTS.get_or_init(|| std::env::var(ENV).map(|s| parse(&s)).unwrap_or_default())
}

/// Marks that execution reached `name`.
pub fn hit(name: &str) {
    let points = points();
    if points.is_empty() {
        return;
    }
    let Some(p) = points.get(name) else { return };
    let n = p.hits.fetch_add(1, Ordering::SeqCst) + 1;
    match p.action {
        Action::Delay(d, at) if at.is_none_or(|at| n == at) => {
            announce(&format!("FAILPOINT {name} delay"));
            sleep(d);
        }
        Action::Delay(..) => {}
        Action::Freeze(at) if n == at => {
            announce(&format!("FAILPOINT {name}"));
            loop {
                std::thread::park();
            }
        }
        Action::Freeze(_) => {}
    }
}

/// Marks that operator `uid` reached `name`: arms both `name` and `<uid>:<name>`.
pub fn hit_in(uid: &str, name: &str) {
    if points().is_empty() {
        return;
    }
    hit(name);
    hit(&format!("{uid}:{name}"));
}

/// Tells the test that runs this process where it is (a line of its own on stderr).
fn announce(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
    let _ = err.flush();
}

/// Sleeps without holding up the other tasks of a multi-threaded tokio runtime (a plain sleep
/// would also stall tasks queued on this worker, e.g. the coordinator's timeout check).
fn sleep(d: Duration) {
    let multi = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi {
        tokio::task::block_in_place(|| std::thread::sleep(d));
    } else {
        std::thread::sleep(d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_actions_and_ignores_nonsense() {
        let p = parse("a=freeze@3; b=delay@20ms;c=explode;d;e=delay@1s@2");
        assert!(matches!(p["a"].action, Action::Freeze(3)));
        assert!(matches!(p["b"].action, Action::Delay(d, None) if d == Duration::from_millis(20)));
        assert!(matches!(p["e"].action, Action::Delay(d, Some(2)) if d == Duration::from_secs(1)));
        assert_eq!(p.len(), 3);
    }
}
