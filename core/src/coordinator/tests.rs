use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;

fn config() -> CheckpointConfig {
    let mut c = CheckpointConfig::new("/unused");
    c.interval = Duration::from_millis(100);
    c.min_pause = Duration::from_millis(30);
    c.timeout = Duration::from_secs(1);
    c.max_concurrent = 2;
    c.tolerable_failures = 1;
    c
}

fn ack_state(uid: &str, subtask: u32, parallelism: u32) -> TaskSnapshot {
    TaskSnapshot {
        operators: vec![OperatorSubtaskState {
            uid: uid.into(),
            subtask,
            parallelism,
            max_parallelism: 128,
            state: SubtaskSnapshot::default(),
        }],
        alignment: Duration::ZERO,
        written: 0,
    }
}

#[test]
fn completes_only_when_every_task_acknowledged() {
    let t0 = Instant::now();
    let mut c = CheckpointCoordinator::new(&config(), 2, 5, t0);
    assert!(!c.due(t0));
    let t1 = t0 + Duration::from_millis(100);
    assert!(c.due(t1));
    let b = c.trigger(t1, SnapshotKind::Checkpoint, 0);
    assert_eq!(b.id, 5);
    assert!(matches!(
        c.acknowledge(5, 0, ack_state("op", 0, 2)),
        Acknowledged::Pending
    ));
    assert!(matches!(
        c.acknowledge(99, 1, ack_state("op", 1, 2)),
        Acknowledged::Unknown
    ));
    let Acknowledged::AllAcknowledged(p) = c.acknowledge(5, 1, ack_state("op", 1, 2)) else {
        panic!("expected completion")
    };
    let meta = p.into_metadata("job", 1).unwrap();
    assert_eq!(meta.operators["op"].subtasks.len(), 2);
}

#[test]
fn min_pause_and_max_concurrency_hold_back_triggers() {
    let t0 = Instant::now();
    let mut c = CheckpointCoordinator::new(&config(), 1, 1, t0);
    let ms = |n| t0 + Duration::from_millis(n);
    c.trigger(ms(100), SnapshotKind::Checkpoint, 0);
    c.trigger(ms(200), SnapshotKind::Checkpoint, 0);
    assert!(!c.due(ms(300)), "two in flight, max_concurrent = 2");
    // Nothing to wake for while full (a past instant here made the coordinator's loop spin).
    assert_eq!(c.next_due(), None);
    assert_eq!(c.next_due_early(), None);
    assert!(c.completed(2, ms(310)).iter().any(|b| b.id == 1), "1 is subsumed by 2");
    assert!(!c.due(ms(320)), "min pause after completion");
    assert!(c.due(ms(340)));
    assert_eq!(c.next_due(), Some(ms(340)));
}

#[test]
fn an_early_trigger_waits_a_tenth_of_the_interval_and_the_min_pause() {
    let t0 = Instant::now();
    let mut c = CheckpointCoordinator::new(&config(), 1, 1, t0);
    let ms = |n| t0 + Duration::from_millis(n);
    c.trigger(ms(100), SnapshotKind::Checkpoint, 0);
    assert!(
        !c.due_early(ms(105)),
        "a tenth of the 100 ms interval after the trigger"
    );
    assert!(c.due_early(ms(110)));
    c.completed(1, ms(120));
    assert!(!c.due_early(ms(140)), "min pause (30 ms) after the completion");
    assert_eq!(c.next_due_early(), Some(ms(150)));
    assert!(c.due_early(ms(150)));
    assert!(!c.due(ms(150)), "the periodic trigger still waits for the interval");
}

#[test]
fn timeouts_and_declines_count_as_failures_up_to_the_tolerance() {
    let t0 = Instant::now();
    let mut c = CheckpointCoordinator::new(&config(), 1, 1, t0);
    let b = c.trigger(t0, SnapshotKind::Checkpoint, 0);
    assert!(c.expired(t0 + Duration::from_millis(999)).is_empty());
    assert_eq!(c.expired(t0 + Duration::from_secs(1)), vec![b]);
    c.failed(t0).unwrap();
    let b2 = c.trigger(t0, SnapshotKind::Checkpoint, 0);
    assert_eq!(c.decline(b2.id), Some(b2));
    assert!(matches!(
        c.failed(t0),
        Err(CoreError::TooManyCheckpointFailures {
            failures: 2,
            tolerated: 1
        })
    ));
}

#[test]
fn duplicate_uids_are_refused() {
    let t0 = Instant::now();
    let mut c = CheckpointCoordinator::new(&config(), 2, 1, t0);
    c.trigger(t0, SnapshotKind::Checkpoint, 0);
    c.acknowledge(1, 0, ack_state("same", 0, 1));
    let Acknowledged::AllAcknowledged(p) = c.acknowledge(1, 1, ack_state("same", 0, 1)) else {
        panic!()
    };
    assert!(matches!(p.into_metadata("j", 0), Err(CoreError::InvalidJob(_))));
}

#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    Trigger,
    Ack { checkpoint: u8, task: u8 },
    Decline(u8),
    Expire,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u64..200).prop_map(Op::Advance),
        Just(Op::Trigger),
        (0u8..8, 0u8..3).prop_map(|(checkpoint, task)| Op::Ack { checkpoint, task }),
        (0u8..8).prop_map(Op::Decline),
        Just(Op::Expire),
    ]
}

proptest! {
    /// Against a model: a checkpoint completes exactly when all tasks acknowledged it while it was
    /// pending; completions are never of aborted checkpoints; concurrency stays bounded; ids grow.
    #[test]
    fn coordinator_matches_model(ops in proptest::collection::vec(op(), 1..120)) {
        let tasks = 3usize;
        let cfg = config();
        let t0 = Instant::now();
        let mut now = t0;
        let mut c = CheckpointCoordinator::new(&cfg, tasks, 1, t0);
        // Model: pending id -> (acked set, started)
        let mut model: BTreeMap<u64, (std::collections::BTreeSet<usize>, Instant)> = BTreeMap::new();
        let mut aborted = std::collections::BTreeSet::new();
        let mut last_id = 0;
        for op in ops {
            match op {
                Op::Advance(ms) => now += Duration::from_millis(ms),
                Op::Trigger => {
                    if c.due(now) {
                        let b = c.trigger(now, SnapshotKind::Checkpoint, 0);
                        prop_assert_eq!(b.id, last_id + 1);
                        last_id = b.id;
                        model.insert(b.id, (Default::default(), now));
                    }
                    prop_assert!(model.len() <= cfg.max_concurrent);
                }
                Op::Ack { checkpoint, task } => {
                    let id = u64::from(checkpoint);
                    let result = c.acknowledge(id, task as usize, TaskSnapshot::default());
                    match model.get_mut(&id) {
                        None => prop_assert!(matches!(result, Acknowledged::Unknown)),
                        Some((acks, _)) => {
                            acks.insert(task as usize);
                            if acks.len() == tasks {
                                prop_assert!(matches!(result, Acknowledged::AllAcknowledged(_)));
                                prop_assert!(!aborted.contains(&id));
                                model.remove(&id);
                                for b in c.completed(id, now) {
                                    prop_assert!(b.id < id);
                                    model.remove(&b.id);
                                    aborted.insert(b.id);
                                }
                            } else {
                                prop_assert!(matches!(result, Acknowledged::Pending));
                            }
                        }
                    }
                }
                Op::Decline(checkpoint) => {
                    let id = u64::from(checkpoint);
                    let was = model.remove(&id).is_some();
                    prop_assert_eq!(c.decline(id).is_some(), was);
                    if was { aborted.insert(id); }
                }
                Op::Expire => {
                    for b in c.expired(now) {
                        let (_, started) = model.remove(&b.id).expect("expired a pending checkpoint");
                        prop_assert!(now.duration_since(started) >= cfg.timeout);
                        aborted.insert(b.id);
                    }
                    for (_, started) in model.values() {
                        prop_assert!(now.duration_since(*started) < cfg.timeout);
                    }
                }
            }
            prop_assert_eq!(c.pending().count(), model.len());
        }
    }
}
