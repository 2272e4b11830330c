//! Named fail points for crash tests, compiled in only with the crate feature `failpoints` (the
//! command's test builds enable it; a release build has none, and [`ignored_setting`] lets it
//! warn that the variable is set). Inactive (one atomic load) unless the process was started
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

/// The points the variable's value arms: none in a build without the feature `failpoints`.
fn armed(value: Option<&str>) -> HashMap<String, Point> {
    match value {
        Some(spec) if cfg!(feature = "failpoints") => parse(spec),
        _ => HashMap::new(),
    }
}

fn points() -> &'static HashMap<String, Point> {
    static POINTS: OnceLock<HashMap<String, Point>> = OnceLock::new();
    POINTS.get_or_init(|| armed(std::env::var(ENV).ok().as_deref()))
}

/// Whether this build has fail points (the feature `failpoints`).
pub const COMPILED: bool = cfg!(feature = "failpoints");

/// The value of `EXACTLY_FAILPOINTS` when it is set but this build has no fail points (it arms
/// nothing: the command says so at start).
pub fn ignored_setting() -> Option<String> {
    ignored(std::env::var(ENV).ok())
}

fn ignored(value: Option<String>) -> Option<String> {
    value.filter(|v| !COMPILED && !v.trim().is_empty())
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

    #[cfg(feature = "failpoints")]
    #[test]
    fn the_variable_arms_points_in_a_build_with_them() {
        assert_eq!(armed(Some("a=freeze@3")).len(), 1);
        assert_eq!(ignored(Some("a=freeze@3".into())), None);
    }

    /// A build without the feature (a release binary) arms nothing, whatever the environment
    /// says, and reports the setting as ignored. (Run by `cargo test -p exactly-core --lib`,
    /// without the workspace's test features; `scripts/test` does.)
    #[cfg(not(feature = "failpoints"))]
    #[test]
    fn the_variable_arms_nothing_in_a_build_without_them() {
        assert!(armed(Some("a=freeze@1;b=delay@1h")).is_empty());
        assert_eq!(ignored(Some("a=freeze@1".into())).as_deref(), Some("a=freeze@1"));
        assert_eq!(ignored(Some(" ".into())), None);
        assert_eq!(ignored(None), None);
    }
}
