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
    let parsed: RestartStrategy = serde_json::from_str(r#"{"type":"fixed_delay","attempts":3,"delay":"2s"}"#).unwrap();
    assert_eq!(
        parsed,
        RestartStrategy::FixedDelay {
            attempts: 3,
            delay: s(2)
        }
    );
}
