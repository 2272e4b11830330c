//! Asking a partition's leader again while it moves. librdkafka answers a watermark or
//! offset-for-time lookup with the broker's error when the partition has no leader at that moment
//! — a broker failing over, fencing itself, restarting, or a topic created a moment before —
//! instead of waiting for the next one (seen: `NotLeaderForPartition` on a busy machine). The
//! Kafka source's start positions (failing would restart the job, or count against its start-up
//! attempts), the sink's recovery probe and `exactly verify` (failing would end the audit) ask
//! again. It blocks: call it where blocking is allowed (`block_in_place`, a blocking thread).

use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// Calls `ask` until it returns anything but a [`leader_moving`] error, or `budget` has passed
/// (then that error); `what` names the partition in the debug line of each retry.
pub fn asking_again<R>(
    what: &str,
    budget: Duration,
    mut ask: impl FnMut() -> Result<R, KafkaError>,
) -> Result<R, KafkaError> {
    let until = Instant::now() + budget;
    loop {
        match ask() {
            Err(e) if leader_moving(&e) && Instant::now() < until => {
                tracing::debug!(partition = what, error = %e, "The partition's leader is moving: asking again.");
                std::thread::sleep(Duration::from_millis(100));
            }
            r => return r,
        }
    }
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
}
