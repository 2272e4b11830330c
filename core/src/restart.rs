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
#[path = "restart_tests.rs"]
mod tests;
