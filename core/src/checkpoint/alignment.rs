//! Barrier alignment at subtasks with several inputs.
//!
//! In exactly-once mode, once barrier N has arrived on an input, that input is blocked: whatever it
//! sends next is held back until barrier N has arrived on every open input. Then the subtask
//! snapshots, forwards the barrier, and replays the held-back messages in their order. A closed
//! input counts as aligned. A newer barrier (or a cancel marker) on an input that has not delivered
//! N means N can never align: N is aborted (subsumed) and the held-back messages are released. If
//! more than `max_buffered` messages, or records weighing more than the byte limit, are held back,
//! N is aborted rather than memory exhausted.
//!
//! In at-least-once mode nothing is held back: the barrier is forwarded once it has arrived on every
//! open input, and records that overtook it on other inputs are in the snapshot's past.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::message::{CheckpointBarrier, CheckpointId, Message, Watermark};

/// Whether alignment holds inputs back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlignmentMode {
    /// Block inputs that delivered the barrier (snapshots are consistent cuts).
    ExactlyOnce,
    /// Never block (snapshots may include records after the barrier: replays duplicate).
    AtLeastOnce,
}

/// What the aligner tells the subtask to do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum AlignerEvent<T> {
    /// Process this record.
    Record(T),
    /// The combined watermark (minimum over open, active inputs) advanced.
    Watermark(Watermark),
    /// Every open input is idle: tell downstream this subtask is idle.
    Idle,
    /// Barrier aligned on every open input: snapshot and forward it.
    Barrier {
        /// The barrier.
        barrier: CheckpointBarrier,
        /// Time from the first to the last input delivering it.
        alignment: Duration,
    },
    /// The checkpoint cannot complete here: decline it and forward a cancel marker.
    Aborted {
        /// The checkpoint.
        id: CheckpointId,
        /// Why.
        reason: AbortReason,
    },
    /// Every input has ended.
    EndOfStream,
}

/// Why alignment gave up on a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortReason {
    /// A newer barrier arrived on an input that never delivered this one.
    Subsumed,
    /// An upstream subtask canceled it.
    CanceledUpstream,
    /// Alignment would have held back more than the configured limit.
    BufferLimit,
}

impl std::fmt::Display for AbortReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AbortReason::Subsumed => "subsumed by a newer checkpoint during alignment",
            AbortReason::CanceledUpstream => "canceled upstream",
            AbortReason::BufferLimit => "alignment buffer limit exceeded",
        })
    }
}

struct Pending {
    barrier: CheckpointBarrier,
    seen: Vec<bool>,
    started: Instant,
}

/// Aligns barriers over a fixed number of inputs.
pub struct BarrierAligner<T> {
    mode: AlignmentMode,
    max_buffered: usize,
    closed: Vec<bool>,
    open_inputs: usize,
    watermarks: Vec<Option<i64>>,
    idle: Vec<bool>,
    emitted_watermark: Option<i64>,
    emitted_idle: bool,
    pending: Option<Pending>,
    /// Highest checkpoint id completed or aborted here: older barriers are stale.
    last_handled: Option<CheckpointId>,
    held: Vec<VecDeque<Message<T>>>,
    held_count: usize,
    max_bytes: usize,
    held_bytes: usize,
    size: Arc<dyn Fn(&T) -> usize + Send + Sync>,
    ended: bool,
}

impl<T> BarrierAligner<T> {
    /// An aligner for `inputs` inputs.
    pub fn new(inputs: usize, mode: AlignmentMode, max_buffered: usize) -> Self {
        BarrierAligner {
            mode,
            max_buffered,
            closed: vec![false; inputs],
            open_inputs: inputs,
            watermarks: vec![None; inputs],
            idle: vec![false; inputs],
            emitted_watermark: None,
            emitted_idle: false,
            pending: None,
            last_handled: None,
            held: (0..inputs).map(|_| VecDeque::new()).collect(),
            held_count: 0,
            max_bytes: usize::MAX,
            held_bytes: 0,
            size: Arc::new(|_: &T| std::mem::size_of::<T>()),
            ended: inputs == 0,
        }
    }

    /// Also aborts the aligning checkpoint when the held-back records weigh more than
    /// `max_bytes`, each weighed by `size`.
    pub fn with_byte_limit(mut self, max_bytes: usize, size: Arc<dyn Fn(&T) -> usize + Send + Sync>) -> Self {
        self.max_bytes = max_bytes;
        self.size = size;
        self
    }

    /// Bytes currently held back (as the record size function weighs them).
    pub fn buffered_bytes(&self) -> usize {
        self.held_bytes
    }

    fn over_limit(&self) -> bool {
        self.held_count > self.max_buffered || self.held_bytes > self.max_bytes
    }

    fn weight(&self, msg: &Message<T>) -> usize {
        match msg {
            Message::Record(r) => (self.size)(r),
            _ => 0,
        }
    }

    /// Messages currently held back.
    pub fn buffered(&self) -> usize {
        self.held_count
    }

    /// The checkpoint being aligned, if any.
    pub fn aligning(&self) -> Option<CheckpointId> {
        self.pending.as_ref().map(|p| p.barrier.id)
    }

    /// Feeds one message from `input`; events go to `out` in the order the subtask must act on them.
    pub fn push(&mut self, input: usize, msg: Message<T>, out: &mut impl FnMut(AlignerEvent<T>)) {
        if self.held[input].is_empty() {
            self.handle(input, msg, out);
        } else {
            // Older held messages of this input go first.
            self.held_bytes += self.weight(&msg);
            self.held[input].push_back(msg);
            self.held_count += 1;
            if self.blocked(input) && self.over_limit() {
                self.abort(AbortReason::BufferLimit, out);
            }
        }
        // Releasing held messages may start and finish further alignments: go on until every
        // input with held messages is blocked (or nothing is held).
        while (0..self.held.len()).any(|i| !self.held[i].is_empty() && !self.blocked(i)) {
            self.release(out);
        }
    }

    fn blocked(&self, input: usize) -> bool {
        #[cfg(test)]
        if crate::sim::mutant() == crate::sim::Mutant::AlignerNeverBlocks {
            return false;
        }
        self.mode == AlignmentMode::ExactlyOnce && self.pending.as_ref().is_some_and(|p| p.seen[input])
    }

    fn handle(&mut self, input: usize, msg: Message<T>, out: &mut impl FnMut(AlignerEvent<T>)) {
        if self.blocked(input) {
            self.held_bytes += self.weight(&msg);
            self.held[input].push_back(msg);
            self.held_count += 1;
            if self.over_limit() {
                self.abort(AbortReason::BufferLimit, out);
            }
            return;
        }
        match msg {
            Message::Record(r) => {
                self.set_active(input);
                out(AlignerEvent::Record(r))
            }
            Message::Watermark(w) => {
                self.set_active(input);
                self.watermarks[input] = Some(w.0);
                self.emit_watermark(out);
            }
            Message::Idle => {
                self.idle[input] = true;
                self.emit_watermark(out);
                self.emit_idle(out);
            }
            Message::Barrier(b) => self.on_barrier(input, b, out),
            Message::CancelCheckpoint(id) => self.on_cancel(id, out),
            Message::EndOfStream => self.on_end(input, out),
        }
    }

    fn set_active(&mut self, input: usize) {
        if self.idle[input] {
            self.idle[input] = false;
            self.emitted_idle = false;
        }
    }

    /// Idle downstream once every open input is idle.
    fn emit_idle(&mut self, out: &mut impl FnMut(AlignerEvent<T>)) {
        let all_idle = self.open_inputs > 0 && self.idle.iter().zip(&self.closed).all(|(i, c)| *i || *c);
        if all_idle && !self.emitted_idle {
            self.emitted_idle = true;
            out(AlignerEvent::Idle);
        }
    }

    fn is_stale(&self, id: CheckpointId) -> bool {
        self.last_handled.is_some_and(|last| id <= last)
    }

    fn on_barrier(&mut self, input: usize, b: CheckpointBarrier, out: &mut impl FnMut(AlignerEvent<T>)) {
        if self.is_stale(b.id) {
            return;
        }
        if let Some(p) = &self.pending {
            if b.id < p.barrier.id {
                return;
            }
            if b.id > p.barrier.id {
                // This input skipped the pending checkpoint: it can never align.
                self.abort(AbortReason::Subsumed, out);
            }
        }
        let inputs = self.closed.len();
        let p = self.pending.get_or_insert_with(|| Pending {
            barrier: b,
            seen: vec![false; inputs],
            started: Instant::now(),
        });
        p.seen[input] = true;
        self.try_complete(out);
    }

    fn on_cancel(&mut self, id: CheckpointId, out: &mut impl FnMut(AlignerEvent<T>)) {
        if self.is_stale(id) {
            return;
        }
        match &self.pending {
            Some(p) if p.barrier.id == id => self.abort(AbortReason::CanceledUpstream, out),
            Some(p) if p.barrier.id > id => {}
            Some(_) => {
                self.abort(AbortReason::Subsumed, out);
                self.last_handled = Some(id);
                out(AlignerEvent::Aborted {
                    id,
                    reason: AbortReason::CanceledUpstream,
                });
            }
            None => {
                self.last_handled = Some(id);
                out(AlignerEvent::Aborted {
                    id,
                    reason: AbortReason::CanceledUpstream,
                });
            }
        }
    }

    fn on_end(&mut self, input: usize, out: &mut impl FnMut(AlignerEvent<T>)) {
        if self.closed[input] {
            return;
        }
        self.closed[input] = true;
        self.open_inputs -= 1;
        self.watermarks[input] = None;
        self.try_complete(out);
        self.emit_watermark(out);
        self.emit_idle(out);
        if self.open_inputs == 0 && self.pending.is_none() && self.held_count == 0 && !self.ended {
            self.ended = true;
            out(AlignerEvent::EndOfStream);
        }
    }

    fn try_complete(&mut self, out: &mut impl FnMut(AlignerEvent<T>)) {
        let Some(p) = &self.pending else { return };
        let aligned = p.seen.iter().zip(&self.closed).all(|(seen, closed)| *seen || *closed);
        if aligned {
            let p = self.pending.take().expect("checked above");
            self.last_handled = Some(p.barrier.id);
            out(AlignerEvent::Barrier {
                barrier: p.barrier,
                alignment: p.started.elapsed(),
            });
        }
    }

    fn abort(&mut self, reason: AbortReason, out: &mut impl FnMut(AlignerEvent<T>)) {
        #[cfg(test)]
        if crate::sim::mutant() == crate::sim::Mutant::DropHeldOnAbort {
            self.held.iter_mut().for_each(VecDeque::clear);
            (self.held_count, self.held_bytes) = (0, 0);
        }
        if let Some(p) = self.pending.take() {
            self.last_handled = Some(p.barrier.id);
            out(AlignerEvent::Aborted {
                id: p.barrier.id,
                reason,
            });
        }
    }

    /// Replays held messages input by input, through the normal path (they may block again).
    fn release(&mut self, out: &mut impl FnMut(AlignerEvent<T>)) {
        for input in 0..self.held.len() {
            while !self.blocked(input) {
                let Some(msg) = self.held[input].pop_front() else {
                    break;
                };
                self.held_count -= 1;
                self.held_bytes -= self.weight(&msg);
                self.handle(input, msg, out);
            }
        }
        if self.open_inputs == 0 && self.pending.is_none() && self.held_count == 0 && !self.ended {
            self.ended = true;
            out(AlignerEvent::EndOfStream);
        }
    }

    fn emit_watermark(&mut self, out: &mut impl FnMut(AlignerEvent<T>)) {
        // Idle inputs hold nothing back (Flink's watermark status); closed ones are done.
        let open = (0..self.watermarks.len()).filter(|i| !self.closed[*i] && !self.idle[*i]);
        let mut min: Option<i64> = None;
        for w in open.map(|i| &self.watermarks[i]) {
            match w {
                None => return, // an open input has no watermark yet
                Some(w) => min = Some(min.map_or(*w, |m: i64| m.min(*w))),
            }
        }
        if let Some(m) = min {
            if self.emitted_watermark.is_none_or(|e| m > e) {
                self.emitted_watermark = Some(m);
                out(AlignerEvent::Watermark(Watermark(m)));
            }
        }
    }
}

#[cfg(test)]
#[path = "alignment_tests.rs"]
mod tests;
