//! Asking a partition's leader again while it moves. librdkafka answers a watermark or
//! offset-for-time lookup with the broker's error when the partition has no leader at that moment
//! — a broker failing over, fencing itself, restarting, or a topic created a moment before —
//! instead of waiting for the next one (seen: `NotLeaderForPartition` on a busy machine). The
//! Kafka source's start positions (failing would restart the job, or count against its start-up
//! attempts), the sink's recovery probe and `exactly verify` (failing would end the audit) ask
//! again. It blocks: call it where blocking is allowed (`block_in_place`, a blocking thread).
//!
//! A consumer group's coordinator moves the same way: right after a broker restarts it loads the
//! groups' offsets (seconds with big logs), and while `__consumer_offsets`' leader is elected or
//! moves it is not available or elsewhere; librdkafka hands these errors to the caller of a
//! group's committed offsets after two tries of its own ([`coordinator_moving`]; seen failing a
//! job's start after a broker restart).

use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// Calls `ask` until it returns anything but a [`leader_moving`] error, or `budget` has passed
/// (then that error); `what` names the partition in the debug line of each retry.
pub fn asking_again<R>(
    what: &str,
    budget: Duration,
    ask: impl FnMut() -> Result<R, KafkaError>,
) -> Result<R, KafkaError> {
    asking_while(leader_moving, budget, Duration::from_millis(100), ask, |e| {
        tracing::debug!(partition = what, error = %e, "The partition's leader is moving: asking again.");
    })
}

/// Calls `ask` until it returns anything but a [`coordinator_moving`] error, or `budget` has
/// passed (then that error). `what` says what is read and of which group, for the warning logged
/// at the first such error (a start that waits says what for) and the line when it is answered.
pub fn asking_the_coordinator_again<R>(
    what: &str,
    budget: Duration,
    ask: impl FnMut() -> Result<R, KafkaError>,
) -> Result<R, KafkaError> {
    let since = Instant::now();
    let mut waited = false;
    let r = asking_while(coordinator_moving, budget, Duration::from_millis(200), ask, |e| {
        if !waited {
            let code = crate::error_code(e).map_or_else(|| e.to_string(), |c| c.to_string());
            tracing::warn!(reading = what, answer = %code, wait_s = budget.as_secs(),
                "The consumer group's coordinator is loading or moving (as after a broker restart): asking again for up to wait_s.");
            waited = true;
        }
    });
    if waited && r.is_ok() {
        tracing::info!(
            reading = what,
            waited_ms = since.elapsed().as_millis() as u64,
            "The consumer group's coordinator answered."
        );
    }
    r
}

/// Calls `ask` until it returns anything but an error `passing` accepts, or `budget` has passed
/// (then that error); `asking_again` is told each error asked again after, `pause` before it.
fn asking_while<R>(
    passing: fn(&KafkaError) -> bool,
    budget: Duration,
    pause: Duration,
    mut ask: impl FnMut() -> Result<R, KafkaError>,
    mut asking_again: impl FnMut(&KafkaError),
) -> Result<R, KafkaError> {
    let until = Instant::now() + budget;
    loop {
        match ask() {
            Err(e) if passing(&e) && Instant::now() < until => {
                asking_again(&e);
                std::thread::sleep(pause);
            }
            r => return r,
        }
    }
}

/// An error that says a consumer group's coordinator is loading the groups' offsets, not elected
/// yet, or on another broker than the one asked.
pub fn coordinator_moving(e: &KafkaError) -> bool {
    matches!(
        crate::error_code(e),
        Some(
            RDKafkaErrorCode::CoordinatorLoadInProgress
                | RDKafkaErrorCode::CoordinatorNotAvailable
                | RDKafkaErrorCode::NotCoordinator
        )
    )
}

/// An error that says the partition's leader is moving or not known yet.
pub fn leader_moving(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::NotLeaderForPartition
                | RDKafkaErrorCode::LeaderNotAvailable
                | RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::FencedLeaderEpoch
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_moving_leader_is_asked_again_and_only_within_the_budget() {
        let moving = || KafkaError::MetadataFetch(RDKafkaErrorCode::NotLeaderForPartition);
        let mut calls = 0;
        let r = asking_again("t/0", Duration::from_secs(10), || {
            calls += 1;
            if calls < 3 {
                Err(moving())
            } else {
                Ok(calls)
            }
        });
        assert_eq!(r.unwrap(), 3);
        // Another error is returned at once.
        let mut calls = 0;
        let r: Result<(), _> = asking_again("t/0", Duration::from_secs(10), || {
            calls += 1;
            Err(KafkaError::MetadataFetch(RDKafkaErrorCode::TopicAuthorizationFailed))
        });
        assert!(r.is_err());
        assert_eq!(calls, 1);
        // A leader that keeps moving: its error once the budget has passed.
        let r: Result<(), _> = asking_again("t/0", Duration::ZERO, || Err(moving()));
        assert!(r.is_err_and(|e| leader_moving(&e)));
    }

    #[test]
    fn a_moving_coordinator_is_asked_again_and_only_within_the_budget() {
        use RDKafkaErrorCode::*;
        // As librdkafka hands them over: the call's error, and a partition's (OffsetFetch).
        let errors = [
            KafkaError::MetadataFetch(CoordinatorNotAvailable),
            KafkaError::OffsetFetch(NotCoordinator),
            KafkaError::MetadataFetch(CoordinatorLoadInProgress),
        ];
        let mut calls = 0;
        let r = asking_the_coordinator_again("g", Duration::from_secs(10), || {
            calls += 1;
            match errors.get(calls - 1) {
                Some(e) => Err(e.clone()),
                None => Ok(calls),
            }
        });
        assert_eq!(r.unwrap(), 4);
        let mut calls = 0;
        let r: Result<(), _> = asking_the_coordinator_again("g", Duration::from_secs(10), || {
            calls += 1;
            Err(KafkaError::MetadataFetch(GroupAuthorizationFailed))
        });
        assert!(r.is_err());
        assert_eq!(calls, 1, "another error is returned at once");
        let r: Result<(), _> =
            asking_the_coordinator_again("g", Duration::ZERO, || Err(KafkaError::OffsetFetch(NotCoordinator)));
        assert!(r.is_err_and(|e| coordinator_moving(&e)));
        assert!(!coordinator_moving(&KafkaError::MetadataFetch(OperationTimedOut)));
    }
}
