//! Property tests of barrier alignment against a reference model: random per-input scripts of
//! records, barriers, cancel markers and early ends, delivered in random interleavings.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::message::SnapshotKind;

/// What one input sends, in order. Records carry (input, sequence number).
#[derive(Debug, Clone)]
enum Step {
    Record,
    /// Barrier of this id, or (when `skip`) a cancel marker instead.
    Barrier {
        id: u64,
        skip: bool,
    },
}

fn barrier(id: u64) -> CheckpointBarrier {
    CheckpointBarrier {
        id,
        timestamp_ms: 0,
        kind: SnapshotKind::Checkpoint,
    }
}

/// Per-input scripts: each input sends the same increasing barrier ids (some as cancels), with
/// records between them, then ends (some end early, before the last barriers).
fn scripts() -> impl Strategy<Value = (Vec<Vec<Step>>, Vec<usize>)> {
    (1usize..=4, 1u64..=5).prop_flat_map(|(inputs, barriers)| {
        let per_input = proptest::collection::vec(
            (
                proptest::collection::vec(0usize..4, barriers as usize + 1),
                proptest::collection::vec(proptest::bool::weighted(0.15), barriers as usize),
                0..=barriers,
            ),
            inputs,
        );
        let schedule = proptest::collection::vec(0usize..inputs, 0..400);
        (per_input, schedule).prop_map(move |(per_input, schedule)| {
            let scripts = per_input
                .into_iter()
                .map(|(gaps, skips, end_after)| {
                    let mut s = Vec::new();
                    for (i, gap) in gaps.iter().enumerate() {
                        s.extend(std::iter::repeat_n(Step::Record, *gap));
                        if (i as u64) < end_after {
                            s.push(Step::Barrier {
                                id: i as u64 + 1,
                                skip: skips[i],
                            });
                        } else {
                            break;
                        }
                    }
                    s
                })
                .collect();
            (scripts, schedule)
        })
    })
}

#[derive(Debug, Default)]
struct Outcome {
    /// Every event, records as (input, seq).
    events: Vec<AlignerEvent<(usize, usize)>>,
}

fn run(scripts: &[Vec<Step>], schedule: &[usize], mode: AlignmentMode, max_buffered: usize) -> Outcome {
    let inputs = scripts.len();
    let mut aligner = BarrierAligner::new(inputs, mode, max_buffered);
    let mut next = vec![0usize; inputs]; // next step index per input; len+1 = EOS sent
    let mut seq = vec![0usize; inputs];
    let mut outcome = Outcome::default();
    let mut deliver = |input: usize, next: &mut Vec<usize>, seq: &mut Vec<usize>, outcome: &mut Outcome| {
        let i = next[input];
        let msg = if i < scripts[input].len() {
            match scripts[input][i] {
                Step::Record => {
                    seq[input] += 1;
                    Message::Record((input, seq[input] - 1))
                }
                Step::Barrier { id, skip: false } => Message::Barrier(barrier(id)),
                Step::Barrier { id, skip: true } => Message::CancelCheckpoint(id),
            }
        } else if i == scripts[input].len() {
            Message::EndOfStream
        } else {
            return;
        };
        next[input] += 1;
        aligner.push(input, msg, &mut |e| outcome.events.push(e));
    };
    for &input in schedule {
        deliver(input, &mut next, &mut seq, &mut outcome);
    }
    // Drain every input to its end, round robin.
    while (0..inputs).any(|i| next[i] <= scripts[i].len()) {
        for input in 0..inputs {
            deliver(input, &mut next, &mut seq, &mut outcome);
        }
    }
    outcome
}

/// Records an input sent before its barrier `id` (all of them if it ended without sending it).
fn records_before(script: &[Step], id: u64) -> usize {
    let mut n = 0;
    for step in script {
        match step {
            Step::Record => n += 1,
            Step::Barrier { id: b, .. } if *b == id => return n,
            Step::Barrier { .. } => {}
        }
    }
    n
}

fn check_common(scripts: &[Vec<Step>], outcome: &Outcome) -> Result<(), TestCaseError> {
    // Every record exactly once, in per-input order.
    let mut per_input: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for e in &outcome.events {
        if let AlignerEvent::Record((i, s)) = e {
            per_input.entry(*i).or_default().push(*s);
        }
    }
    for (i, script) in scripts.iter().enumerate() {
        let sent = script.iter().filter(|s| matches!(s, Step::Record)).count();
        let got = per_input.remove(&i).unwrap_or_default();
        prop_assert_eq!(got, (0..sent).collect::<Vec<_>>(), "input {} records", i);
    }
    // Each checkpoint decided at most once, in increasing order; end of stream last and once.
    let mut last = 0;
    for e in &outcome.events {
        let id = match e {
            AlignerEvent::Barrier { barrier, .. } => barrier.id,
            AlignerEvent::Aborted { id, .. } => *id,
            _ => continue,
        };
        prop_assert!(id > last, "checkpoint {} decided after {}", id, last);
        last = id;
    }
    prop_assert_eq!(
        outcome
            .events
            .iter()
            .filter(|e| matches!(e, AlignerEvent::EndOfStream))
            .count(),
        1
    );
    prop_assert!(matches!(outcome.events.last(), Some(AlignerEvent::EndOfStream)));
    Ok(())
}

/// Barriers every input sent (none skipped) and that no input overtook with a newer one before
/// sending it — these must complete when nothing limits buffering.
fn must_complete(scripts: &[Vec<Step>], id: u64) -> bool {
    scripts.iter().all(|s| {
        s.iter()
            .any(|st| matches!(st, Step::Barrier { id: b, skip: false } if *b == id))
            || !s.iter().any(|st| matches!(st, Step::Barrier { id: b, .. } if *b >= id))
    }) && scripts.iter().any(|s| {
        s.iter()
            .any(|st| matches!(st, Step::Barrier { id: b, skip: false } if *b == id))
    }) && !scripts.iter().any(|s| {
        s.iter()
            .any(|st| matches!(st, Step::Barrier { id: b, skip: true } if *b == id))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn exactly_once_snapshots_are_consistent_cuts((scripts, schedule) in scripts()) {
        let outcome = run(&scripts, &schedule, AlignmentMode::ExactlyOnce, usize::MAX);
        check_common(&scripts, &outcome)?;
        let mut emitted = vec![0usize; scripts.len()];
        for e in &outcome.events {
            match e {
                AlignerEvent::Record((i, _)) => emitted[*i] += 1,
                AlignerEvent::Barrier { barrier, .. } => {
                    for (i, script) in scripts.iter().enumerate() {
                        prop_assert_eq!(
                            emitted[i], records_before(script, barrier.id),
                            "input {} at barrier {}", i, barrier.id
                        );
                    }
                }
                _ => {}
            }
        }
        let max_id = scripts.iter().flatten().filter_map(|s| match s { Step::Barrier { id, .. } => Some(*id), _ => None }).max().unwrap_or(0);
        for id in 1..=max_id {
            if must_complete(&scripts, id) {
                let done = outcome.events.iter().any(|e| matches!(e, AlignerEvent::Barrier { barrier, .. } if barrier.id == id));
                prop_assert!(done, "checkpoint {} was sent by every input but did not complete", id);
            }
        }
    }

    #[test]
    fn buffer_limit_aborts_instead_of_growing((scripts, schedule) in scripts(), limit in 0usize..6) {
        let outcome = run(&scripts, &schedule, AlignmentMode::ExactlyOnce, limit);
        check_common(&scripts, &outcome)?;
        // Completed barriers are still consistent cuts.
        let mut emitted = vec![0usize; scripts.len()];
        for e in &outcome.events {
            match e {
                AlignerEvent::Record((i, _)) => emitted[*i] += 1,
                AlignerEvent::Barrier { barrier, .. } => {
                    for (i, script) in scripts.iter().enumerate() {
                        prop_assert_eq!(emitted[i], records_before(script, barrier.id));
                    }
                }
                _ => {}
            }
        }
    }

    #[test]
    fn at_least_once_never_holds_records_back((scripts, schedule) in scripts()) {
        let outcome = run(&scripts, &schedule, AlignmentMode::AtLeastOnce, 0);
        check_common(&scripts, &outcome)?;
        // Each barrier's snapshot includes at least every record sent before it.
        let mut emitted = vec![0usize; scripts.len()];
        for e in &outcome.events {
            match e {
                AlignerEvent::Record((i, _)) => emitted[*i] += 1,
                AlignerEvent::Barrier { barrier, .. } => {
                    for (i, script) in scripts.iter().enumerate() {
                        prop_assert!(emitted[i] >= records_before(script, barrier.id));
                    }
                }
                _ => {}
            }
        }
    }
}

#[test]
fn single_input_completes_immediately() {
    let mut a = BarrierAligner::<u32>::new(1, AlignmentMode::ExactlyOnce, 10);
    let mut events = Vec::new();
    a.push(0, Message::Record(1), &mut |e| events.push(e));
    a.push(0, Message::Barrier(barrier(1)), &mut |e| events.push(e));
    a.push(0, Message::Record(2), &mut |e| events.push(e));
    assert!(matches!(events[1], AlignerEvent::Barrier { barrier: b, .. } if b.id == 1));
    assert_eq!(events[2], AlignerEvent::Record(2));
}

#[test]
fn watermark_is_the_minimum_of_open_inputs() {
    let mut a = BarrierAligner::<u32>::new(2, AlignmentMode::ExactlyOnce, 10);
    let mut events = Vec::new();
    a.push(0, Message::Watermark(Watermark(10)), &mut |e| events.push(e));
    assert!(events.is_empty(), "input 1 has no watermark yet");
    a.push(1, Message::Watermark(Watermark(5)), &mut |e| events.push(e));
    a.push(1, Message::Watermark(Watermark(20)), &mut |e| events.push(e));
    a.push(0, Message::EndOfStream, &mut |e| events.push(e));
    assert_eq!(
        events,
        vec![
            AlignerEvent::Watermark(Watermark(5)),
            AlignerEvent::Watermark(Watermark(10)),
            AlignerEvent::Watermark(Watermark(20))
        ]
    );
}

#[test]
fn idle_inputs_do_not_hold_the_watermark_back() {
    let mut a = BarrierAligner::<u32>::new(2, AlignmentMode::ExactlyOnce, 10);
    let mut events = Vec::new();
    a.push(0, Message::Watermark(Watermark(10)), &mut |e| events.push(e));
    assert!(events.is_empty(), "input 1 has no watermark yet");
    a.push(1, Message::Idle, &mut |e| events.push(e));
    assert_eq!(
        std::mem::take(&mut events),
        vec![AlignerEvent::Watermark(Watermark(10))]
    );
    a.push(0, Message::Idle, &mut |e| events.push(e));
    assert_eq!(
        std::mem::take(&mut events),
        vec![AlignerEvent::Idle],
        "every input idle"
    );
    a.push(0, Message::Idle, &mut |e| events.push(e));
    assert!(events.is_empty(), "idle is told once");
    // Input 1 becomes active again with a record, then a watermark below what was emitted.
    a.push(1, Message::Record(7), &mut |e| events.push(e));
    a.push(1, Message::Watermark(Watermark(5)), &mut |e| events.push(e));
    a.push(1, Message::Watermark(Watermark(20)), &mut |e| events.push(e));
    assert_eq!(
        std::mem::take(&mut events),
        vec![AlignerEvent::Record(7), AlignerEvent::Watermark(Watermark(20))],
        "watermarks never go back; input 0 is still idle"
    );
    a.push(1, Message::Idle, &mut |e| events.push(e));
    assert_eq!(events, vec![AlignerEvent::Idle], "idle again once both are");
}

#[test]
fn held_back_bytes_beyond_the_limit_abort_the_checkpoint() {
    // Records weigh their length; 100 bytes may be held back.
    let mut a: BarrierAligner<Vec<u8>> = BarrierAligner::new(2, AlignmentMode::ExactlyOnce, usize::MAX)
        .with_byte_limit(100, Arc::new(|r: &Vec<u8>| r.len()));
    let mut events = Vec::new();
    a.push(0, Message::Barrier(barrier(1)), &mut |e| events.push(e));
    a.push(0, Message::Record(vec![0; 60]), &mut |e| events.push(e));
    assert_eq!(
        a.buffered_bytes(),
        60,
        "held back while input 1 has not delivered barrier 1"
    );
    assert!(events.is_empty());
    a.push(0, Message::Record(vec![0; 60]), &mut |e| events.push(e));
    assert!(
        matches!(
            events.first(),
            Some(AlignerEvent::Aborted {
                id: 1,
                reason: AbortReason::BufferLimit
            })
        ),
        "{events:?}"
    );
    let released = events.iter().filter(|e| matches!(e, AlignerEvent::Record(_))).count();
    assert_eq!(released, 2, "the held records go on, in order");
    assert_eq!(a.buffered_bytes(), 0);
}
