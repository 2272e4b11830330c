//! Restart strategies: whether, and after how long, a failed job restarts from its latest completed
//! checkpoint. The parameters are the ones Flink documents. Decisions take the current time as an
//! argument, so they are tested over a simulated clock.

use std::collections::VecDeque;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::error::{CoreError, Result};

/// How a failed job is restarted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum RestartStrategy {
    /// Never restart: the first failure ends the job.
    None,
    /// Restart up to `attempts` times, waiting `delay` before each.
    FixedDelay {
        /// Restarts allowed over the job's life.
        attempts: u32,
        /// Wait before each restart.
        #[serde(with = "humantime_serde")]
        delay: Duration,
    },
    /// Restart unless more than `max_failures` failures happen within `interval`.
    FailureRate {
        /// Failures tolerated within one interval.
        max_failures: u32,
        /// The measuring interval.
        #[serde(with = "humantime_serde")]
        interval: Duration,
        /// Wait before each restart.
        #[serde(with = "humantime_serde")]
        delay: Duration,
    },
    /// Restart with a delay that grows by `multiplier` per failure up to `max_delay`, with random
    /// jitter, back to `initial_delay` after `reset_threshold` without failure.
    ExponentialDelay {
        /// First delay.
        #[serde(with = "humantime_serde")]
        initial_delay: Duration,
        /// Largest delay.
        #[serde(with = "humantime_serde")]
        max_delay: Duration,
        /// Growth factor per consecutive failure (> 1).
        multiplier: f64,
        /// A run this long without failure resets the delay.
        #[serde(with = "humantime_serde")]
        reset_threshold: Duration,
        /// Relative jitter in [0, 1): the delay varies by up to this fraction either way.
        jitter: f64,
        /// Give up after this many restarts without a reset (none: never).
        #[serde(default)]
        max_attempts: Option<u32>,
    },
}

impl Default for RestartStrategy {
    fn default() -> Self {
        RestartStrategy::ExponentialDelay {
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(60),
            multiplier: 2.0,
            reset_threshold: Duration::from_secs(3600),
            jitter: 0.1,
            max_attempts: None,
        }
    }
}

impl RestartStrategy {
    /// The wait before a first restart (`None`: the strategy never restarts).
    pub fn first_delay(&self) -> Option<Duration> {
        match self {
            RestartStrategy::None => None,
            RestartStrategy::FixedDelay { delay, .. } | RestartStrategy::FailureRate { delay, .. } => Some(*delay),
            RestartStrategy::ExponentialDelay { initial_delay, .. } => Some(*initial_delay),
        }
    }

    /// The longest wait before one restart (jitter included): what a pre-committed transaction
    /// must outlive on top of its checkpoint.
    pub fn longest_delay(&self) -> Duration {
        match self {
            RestartStrategy::None => Duration::ZERO,
            RestartStrategy::FixedDelay { delay, .. } | RestartStrategy::FailureRate { delay, .. } => *delay,
            RestartStrategy::ExponentialDelay { max_delay, jitter, .. } => {
                max_delay.mul_f64(1.0 + jitter.clamp(0.0, 1.0))
            }
        }
    }

    /// Checks the parameters; the error says what to change.
    pub fn validate(&self) -> Result<()> {
        match self {
            RestartStrategy::FailureRate { max_failures: 0, .. } => Err(CoreError::Config(
                "restart_strategy.max_failures must be at least 1 (use type = \"none\" to never restart)".into(),
            )),
            RestartStrategy::ExponentialDelay { multiplier, .. } if multiplier.is_nan() || *multiplier < 1.0 => {
                Err(CoreError::Config(format!(
                    "restart_strategy.multiplier ({multiplier}) must be at least 1.0"
                )))
            }
            RestartStrategy::ExponentialDelay { jitter, .. } if !(0.0..1.0).contains(jitter) => Err(CoreError::Config(
                format!("restart_strategy.jitter ({jitter}) must be in [0, 1)"),
            )),
            RestartStrategy::ExponentialDelay {
                initial_delay,
                max_delay,
                ..
            } if initial_delay > max_delay => Err(CoreError::Config(format!(
                "restart_strategy.initial_delay ({initial_delay:?}) must not exceed max_delay ({max_delay:?})"
            ))),
            _ => Ok(()),
        }
    }
}

/// What to do after a failure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RestartDecision {
    /// Restart after this delay.
    Restart(Duration),
    /// Stop the job.
    GiveUp,
    /// Stop the job: it failed this many times in a row while starting (see
    /// [`RestartTracker::with_startup_attempts`]); a wrong address, a refused login or a missing
    /// topic will not fix itself.
    StartupFailed(u32),
}

/// A run that lasts this long without failing counts as started, even before its first checkpoint
/// (a job without checkpointing has no other sign).
pub const STARTED_AFTER: Duration = Duration::from_secs(60);

/// The longest wait between attempts to start a job that ran before while what it needs to start
/// (the checkpoint location, a broker, a database) cannot be reached: it is down, and the job
/// should be back within this long of it.
pub const WAIT_CADENCE: Duration = Duration::from_secs(2);

/// Where in a run the job failed, and how, which decides how the restart waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailedWhile {
    /// Every task had started (records were flowing): the strategy decides (a crash loop backs
    /// off).
    Running,
    /// Starting (restoring, or opening tasks), with an error that is not known to be an outage:
    /// a count towards `startup_attempts` until the job has started (a wrong topic name or a
    /// poison record will not fix itself), then as [`FailedWhile::Running`].
    Starting,
    /// Starting, with what the job needs out of reach — a connection refused or timed out, a
    /// server error (`ErrorClass::Retriable`, or a checkpoint location that does not answer).
    /// For a job that ran before (it restores its own checkpoint, or completed one) that is an
    /// outage: tried again within [`WAIT_CADENCE`] for as long as it lasts, without growing the
    /// back-off or using up the strategy's attempts. For a job that never ran it may as well be a
    /// wrong address: a count towards `startup_attempts` as [`FailedWhile::Starting`] is.
    Unreachable,
    /// The checkpoint location could not be reached (claiming it, reading its checkpoints):
    /// nothing can be decided without it, whether the job ran before or not, so it is waited for
    /// as [`FailedWhile::Unreachable`] is for a job that ran. (Only what cannot be reached:
    /// a location refused or misnamed is a [`FailedWhile::Starting`] failure.)
    LocationUnreachable,
}

/// Applies a strategy to a job's failures. Times are durations since any fixed origin.
#[derive(Debug)]
pub struct RestartTracker {
    strategy: RestartStrategy,
    restarts: u32,
    failures: VecDeque<Duration>,
    consecutive: u32,
    last_failure: Option<Duration>,
    rng: StdRng,
    startup_attempts: Option<u32>,
    started: bool,
    startup_failures: u32,
    /// A checkpoint completed since the last failure: the job recovered, the back-off resets.
    recovered: bool,
    /// Attempts that waited for what the job needs ([`FailedWhile::Unreachable`]).
    waits: u32,
    /// The job ran before (it restores a checkpoint of its own location).
    ran_before: bool,
}

impl RestartTracker {
    /// A tracker for `strategy`.
    pub fn new(strategy: RestartStrategy) -> Self {
        Self::with_seed(strategy, rand::random())
    }

    /// A tracker whose jitter comes from a seeded generator (for tests).
    pub fn with_seed(strategy: RestartStrategy, seed: u64) -> Self {
        RestartTracker {
            strategy,
            restarts: 0,
            failures: VecDeque::new(),
            consecutive: 0,
            last_failure: None,
            rng: StdRng::seed_from_u64(seed),
            startup_attempts: None,
            started: false,
            startup_failures: 0,
            recovered: false,
            waits: 0,
            ran_before: false,
        }
    }

    /// Bounds the attempts to start: until the job has started ([`RestartTracker::mark_started`],
    /// or a run that lasted [`STARTED_AFTER`]), the `attempts`-th failure ends it with
    /// [`RestartDecision::StartupFailed`] whatever the strategy allows. `None`: no bound.
    pub fn with_startup_attempts(mut self, attempts: Option<u32>) -> Self {
        self.startup_attempts = attempts;
        self
    }

    /// Whether the job has started (see [`RestartTracker::with_startup_attempts`]).
    pub fn has_started(&self) -> bool {
        self.started
    }

    /// A checkpoint completed: the job has started (from now on only the strategy decides), and
    /// recovered from any failure before (the next failure starts the back-off afresh).
    pub fn mark_started(&mut self) {
        self.started = true;
        self.recovered = true;
    }

    /// The job ran before (it restores a checkpoint of its own location): a start that cannot
    /// reach what it needs ([`FailedWhile::Unreachable`]) is an outage to wait for, not a
    /// configuration that never worked.
    pub fn mark_ran_before(&mut self) {
        self.ran_before = true;
    }

    /// Restarts granted so far.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    /// Records a failure at `now` of a running job (see [`FailedWhile::Running`]) and decides.
    pub fn on_failure(&mut self, now: Duration) -> RestartDecision {
        self.on_failure_while(now, FailedWhile::Running)
    }

    /// Records a failure at `now`, `while` the run did what it says, and decides.
    pub fn on_failure_while(&mut self, now: Duration, while_: FailedWhile) -> RestartDecision {
        if !self.started && now.saturating_sub(self.last_failure.unwrap_or_default()) >= STARTED_AFTER {
            self.started = true;
        }
        if std::mem::take(&mut self.recovered) {
            self.consecutive = 0;
        }
        let waiting = match while_ {
            FailedWhile::Unreachable => self.started || self.ran_before,
            FailedWhile::LocationUnreachable => true,
            FailedWhile::Running | FailedWhile::Starting => false,
        };
        if waiting {
            self.last_failure = Some(now);
            self.waits += 1;
            return match self.strategy.first_delay() {
                None => RestartDecision::GiveUp,
                Some(delay) => RestartDecision::Restart(delay.min(WAIT_CADENCE)),
            };
        }
        if !self.started {
            self.startup_failures += 1;
            if self.startup_attempts.is_some_and(|n| self.startup_failures >= n) {
                self.last_failure = Some(now);
                return RestartDecision::StartupFailed(self.startup_failures);
            }
        }
        self.decide(now)
    }

    /// Attempts to start that waited for what the job needs (not counted as restarts).
    pub fn waits(&self) -> u32 {
        self.waits
    }

    /// The strategy's decision.
    fn decide(&mut self, now: Duration) -> RestartDecision {
        let decision = match &self.strategy {
            RestartStrategy::None => RestartDecision::GiveUp,
            RestartStrategy::FixedDelay { attempts, delay } => {
                if self.restarts < *attempts {
                    RestartDecision::Restart(*delay)
                } else {
                    RestartDecision::GiveUp
                }
            }
            RestartStrategy::FailureRate {
                max_failures,
                interval,
                delay,
            } => {
                self.failures.push_back(now);
                while self
                    .failures
                    .front()
                    .is_some_and(|t| now.saturating_sub(*t) > *interval)
                {
                    self.failures.pop_front();
                }
                if self.failures.len() as u32 > *max_failures {
                    RestartDecision::GiveUp
                } else {
                    RestartDecision::Restart(*delay)
                }
            }
            RestartStrategy::ExponentialDelay {
                initial_delay,
                max_delay,
                multiplier,
                reset_threshold,
                jitter,
                max_attempts,
            } => {
                if self
                    .last_failure
                    .is_some_and(|t| now.saturating_sub(t) >= *reset_threshold)
                {
                    self.consecutive = 0;
                }
                if max_attempts.is_some_and(|m| self.consecutive >= m) {
                    RestartDecision::GiveUp
                } else {
                    let base = initial_delay.as_secs_f64() * multiplier.powi(self.consecutive as i32);
                    let base = base.min(max_delay.as_secs_f64());
                    let factor = if *jitter > 0.0 {
                        self.rng.random_range(-jitter..*jitter)
                    } else {
                        0.0
                    };
                    let delay = (base * (1.0 + factor)).clamp(0.0, max_delay.as_secs_f64());
                    self.consecutive += 1;
                    RestartDecision::Restart(Duration::from_secs_f64(delay))
                }
            }
        };
        self.last_failure = Some(now);
        if matches!(decision, RestartDecision::Restart(_)) {
            self.restarts += 1;
        }
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn startup_attempts_bound_failures_before_the_job_started() {
        let strategy = RestartStrategy::FixedDelay {
            attempts: 100,
            delay: s(1),
        };
        let mut t = RestartTracker::new(strategy.clone()).with_startup_attempts(Some(3));
        assert_eq!(t.on_failure(s(1)), RestartDecision::Restart(s(1)));
        assert_eq!(t.on_failure(s(5)), RestartDecision::Restart(s(1)));
        assert_eq!(t.on_failure(s(9)), RestartDecision::StartupFailed(3));

        // Started (a checkpoint completed): only the strategy decides.
        let mut t = RestartTracker::new(strategy.clone()).with_startup_attempts(Some(2));
        assert_eq!(t.on_failure(s(1)), RestartDecision::Restart(s(1)));
        t.mark_started();
        for i in 0..10 {
            assert_eq!(t.on_failure(s(2 + i)), RestartDecision::Restart(s(1)));
        }

        // A run that lasted STARTED_AFTER counts as started.
        let mut t = RestartTracker::new(strategy).with_startup_attempts(Some(2));
        assert_eq!(t.on_failure(s(1)), RestartDecision::Restart(s(1)));
        assert_eq!(t.on_failure(s(1) + STARTED_AFTER), RestartDecision::Restart(s(1)));
        assert_eq!(t.on_failure(s(2) + STARTED_AFTER), RestartDecision::Restart(s(1)));
    }

    #[test]
    fn none_never_restarts() {
        let mut t = RestartTracker::new(RestartStrategy::None);
        assert_eq!(t.on_failure(s(0)), RestartDecision::GiveUp);
    }

    #[test]
    fn fixed_delay_allows_exactly_its_attempts() {
        let mut t = RestartTracker::new(RestartStrategy::FixedDelay {
            attempts: 2,
            delay: s(3),
        });
        assert_eq!(t.on_failure(s(0)), RestartDecision::Restart(s(3)));
        assert_eq!(t.on_failure(s(100)), RestartDecision::Restart(s(3)));
        assert_eq!(t.on_failure(s(10_000)), RestartDecision::GiveUp);
        assert_eq!(t.restarts(), 2);
    }

    #[test]
    fn failure_rate_counts_failures_within_the_interval() {
        let mut t = RestartTracker::new(RestartStrategy::FailureRate {
            max_failures: 2,
            interval: s(60),
            delay: s(1),
        });
        assert_eq!(t.on_failure(s(0)), RestartDecision::Restart(s(1)));
        assert_eq!(t.on_failure(s(30)), RestartDecision::Restart(s(1)));
        // Third within 60 s of the first two: too many.
        assert_eq!(t.on_failure(s(59)), RestartDecision::GiveUp);
        // Spread out, failures never exceed the rate.
        let mut t = RestartTracker::new(RestartStrategy::FailureRate {
            max_failures: 2,
            interval: s(60),
            delay: s(1),
        });
        for i in 0..10 {
            assert_eq!(t.on_failure(s(i * 40)), RestartDecision::Restart(s(1)), "failure {i}");
        }
    }

    #[test]
    fn exponential_delay_grows_caps_and_resets() {
        let strategy = RestartStrategy::ExponentialDelay {
            initial_delay: s(1),
            max_delay: s(10),
            multiplier: 2.0,
            reset_threshold: s(300),
            jitter: 0.0,
            max_attempts: None,
        };
        let mut t = RestartTracker::new(strategy);
        let delays: Vec<_> = (0..6)
            .map(|i| match t.on_failure(s(i)) {
                RestartDecision::Restart(d) => d.as_secs(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(delays, [1, 2, 4, 8, 10, 10]);
        // A long quiet run resets the backoff.
        assert_eq!(t.on_failure(s(1000)), RestartDecision::Restart(s(1)));
    }

    fn exponential(max_delay: u64) -> RestartStrategy {
        RestartStrategy::ExponentialDelay {
            initial_delay: s(1),
            max_delay: s(max_delay),
            multiplier: 2.0,
            reset_threshold: s(3600),
            jitter: 0.0,
            max_attempts: None,
        }
    }

    fn delay(d: RestartDecision) -> u64 {
        match d {
            RestartDecision::Restart(d) => d.as_secs(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_checkpoint_completed_since_the_last_failure_resets_the_back_off() {
        let mut t = RestartTracker::new(exponential(60));
        let grown: Vec<u64> = (0..4).map(|i| delay(t.on_failure(s(i)))).collect();
        assert_eq!(grown, [1, 2, 4, 8]);
        // The restarted run completed a checkpoint: it recovered, the next failure is a new one.
        t.mark_started();
        assert_eq!(delay(t.on_failure(s(10))), 1);
        assert_eq!(
            delay(t.on_failure(s(11))),
            2,
            "a run that recovered nothing keeps growing it"
        );
    }

    #[test]
    fn a_job_that_ran_before_waits_for_what_it_cannot_reach_at_a_short_cadence() {
        let mut t = RestartTracker::new(exponential(60)).with_startup_attempts(Some(3));
        t.mark_ran_before();
        // What it needs cannot be reached at every start: tried again within WAIT_CADENCE, for as
        // long as it takes, never given up on; the job still counts as starting (its connectors
        // check their settings at once, as on a first start).
        for i in 0..100 {
            let d = t.on_failure_while(s(10 + i), FailedWhile::Unreachable);
            assert_eq!(d, RestartDecision::Restart(s(1)), "attempt {i}");
        }
        assert_eq!(t.waits(), 100);
        assert!(!t.has_started());
        // Another failure to start (a topic that does not exist, a missing ACL) is not waited
        // for: it counts against the start-up bound as on a first start.
        assert_eq!(delay(t.on_failure_while(s(110), FailedWhile::Starting)), 1);
        assert_eq!(delay(t.on_failure_while(s(111), FailedWhile::Starting)), 2);
        assert_eq!(
            t.on_failure_while(s(113), FailedWhile::Starting),
            RestartDecision::StartupFailed(3)
        );
        // Once started, running failures back off, and waiting does not grow the back-off nor
        // count as restarts.
        let mut t = RestartTracker::new(exponential(60)).with_startup_attempts(Some(3));
        t.mark_ran_before();
        t.mark_started();
        assert_eq!(delay(t.on_failure(s(0))), 1);
        assert_eq!(delay(t.on_failure(s(1))), 2);
        for i in 0..10 {
            assert_eq!(
                t.on_failure_while(s(10 + i), FailedWhile::Unreachable),
                RestartDecision::Restart(s(1))
            );
        }
        assert_eq!(delay(t.on_failure(s(100))), 4);
        assert_eq!(t.restarts(), 3);
    }

    #[test]
    fn waiting_uses_up_no_attempts_of_a_fixed_delay_and_none_never_waits() {
        let mut t = RestartTracker::new(RestartStrategy::FixedDelay {
            attempts: 3,
            delay: s(30),
        });
        t.mark_ran_before();
        for i in 0..50 {
            assert_eq!(
                t.on_failure_while(s(i), FailedWhile::Unreachable),
                RestartDecision::Restart(WAIT_CADENCE)
            );
        }
        assert_eq!(t.on_failure(s(100)), RestartDecision::Restart(s(30)));
        let mut t = RestartTracker::new(RestartStrategy::None);
        t.mark_ran_before();
        assert_eq!(
            t.on_failure_while(s(0), FailedWhile::Unreachable),
            RestartDecision::GiveUp
        );
    }

    #[test]
    fn a_job_that_never_ran_fails_fast_even_when_it_cannot_reach_what_it_needs() {
        let mut t = RestartTracker::new(exponential(60)).with_startup_attempts(Some(3));
        assert_eq!(delay(t.on_failure_while(s(0), FailedWhile::Unreachable)), 1);
        assert_eq!(delay(t.on_failure_while(s(1), FailedWhile::Starting)), 2);
        assert_eq!(
            t.on_failure_while(s(3), FailedWhile::Unreachable),
            RestartDecision::StartupFailed(3)
        );
        // Its checkpoint location out of reach: waited for all the same.
        let mut t = RestartTracker::new(exponential(60)).with_startup_attempts(Some(3));
        for i in 0..20 {
            assert_eq!(
                t.on_failure_while(s(i), FailedWhile::LocationUnreachable),
                RestartDecision::Restart(s(1))
            );
        }
    }

    #[test]
    fn exponential_delay_jitter_stays_within_bounds_and_attempts_limit() {
        let strategy = RestartStrategy::ExponentialDelay {
            initial_delay: s(10),
            max_delay: s(100),
            multiplier: 1.0,
            reset_threshold: s(300),
            jitter: 0.2,
            max_attempts: Some(50),
        };
        let mut t = RestartTracker::with_seed(strategy, 42);
        let mut distinct = std::collections::BTreeSet::new();
        for i in 0..50 {
            match t.on_failure(s(i)) {
                RestartDecision::Restart(d) => {
                    assert!(d >= Duration::from_secs(8) && d <= Duration::from_secs(12), "{d:?}");
                    distinct.insert(d.as_millis());
                }
                other => panic!("{other:?} at {i}"),
            }
        }
        assert!(distinct.len() > 10, "jitter varies the delay");
        assert_eq!(t.on_failure(s(51)), RestartDecision::GiveUp);
    }

    #[test]
    fn invalid_parameters_are_refused_with_the_field_named() {
        let bad = RestartStrategy::ExponentialDelay {
            initial_delay: s(1),
            max_delay: s(10),
            multiplier: 0.5,
            reset_threshold: s(1),
            jitter: 0.0,
            max_attempts: None,
        };
        assert!(bad.validate().unwrap_err().to_string().contains("multiplier"));
    }

    #[test]
    fn strategies_parse_from_human_durations() {
        let parsed: RestartStrategy =
            serde_json::from_str(r#"{"type":"fixed_delay","attempts":3,"delay":"2s"}"#).unwrap();
        assert_eq!(
            parsed,
            RestartStrategy::FixedDelay {
                attempts: 3,
                delay: s(2)
            }
        );
    }
}
