//! The job simulation's steps: what each source, channel, sink and the coordinator side does
//! when the seeded generator picks it.

use std::time::Duration;

use rand::Rng;

use super::{text, Control, Event, Out, Rec, Txn, TxnState, World};
use crate::checkpoint::{AbortReason, AlignerEvent, CheckpointMetadata, SubtaskSnapshot};
use crate::coordinator::{Acknowledged, OperatorSubtaskState, TaskSnapshot};
use crate::message::{CheckpointBarrier, CheckpointId, Message, SnapshotKind};

#[derive(Debug, Clone, Copy)]
enum Act {
    Source(usize),
    Deliver(usize),
    Control(usize),
    Event,
    Timer,
    Crash,
}

impl World {
    pub(super) fn step_once(&mut self) {
        self.step += 1;
        self.clock_ms += 1;
        let p = self.inputs.len();
        let r = &self.run;
        let mut acts = Vec::new();
        for (i, s) in r.sources.iter().enumerate() {
            if !s.ended || !r.controls[i].is_empty() {
                acts.push(Act::Source(i));
            }
        }
        acts.extend(
            (0..r.channels.len())
                .filter(|c| !r.channels[*c].is_empty())
                .map(Act::Deliver),
        );
        acts.extend(
            (0..self.sinks)
                .filter(|m| !r.controls[p + m].is_empty())
                .map(Act::Control),
        );
        if !r.events.is_empty() {
            acts.push(Act::Event);
        }
        let act = if self.faults() && self.rng.random_bool(self.crash_rate) {
            Act::Crash
        } else if acts.is_empty() || self.rng.random_bool(0.08) {
            Act::Timer
        } else {
            acts[self.rng.random_range(0..acts.len())]
        };
        match act {
            Act::Source(i) => self.source(i),
            Act::Deliver(c) => self.deliver(c),
            Act::Control(m) => self.sink_control(m),
            Act::Event => self.event(),
            Act::Timer => self.timer(),
            Act::Crash => {
                self.paths.crashes += 1;
                // A new process: the ids it begins go on from the newest stored checkpoint (what
                // the crashed one triggered after it is begun again).
                self.last_id = self.durable.last().map_or(0, |m| m.id);
                self.restart("crash");
            }
        }
    }

    fn restart(&mut self, why: &str) {
        self.note(format!("run ends: {why}"));
        self.restore();
    }

    fn ack(
        &mut self,
        task: usize,
        id: CheckpointId,
        uid: &str,
        subtask: usize,
        parallelism: usize,
        state: SubtaskSnapshot,
    ) {
        let operators = vec![OperatorSubtaskState {
            uid: uid.into(),
            subtask: subtask as u32,
            parallelism: parallelism as u32,
            max_parallelism: 128,
            state,
        }];
        let snapshot = TaskSnapshot {
            operators,
            alignment: Duration::ZERO,
            written: 0,
        };
        self.run.events.push_back(Event::Ack(task, id, snapshot));
    }

    fn source(&mut self, i: usize) {
        let (p, m) = (self.inputs.len(), self.sinks);
        if let Some(c) = self.run.controls[i].pop_front() {
            if let Control::Trigger(b) | Control::SnapshotIfEnded(b) = c {
                let s = &self.run.sources[i];
                let (offset, ended) = (s.offset, s.ended);
                if !ended {
                    for ch in &mut self.run.channels[i * m..(i + 1) * m] {
                        ch.push_back(Message::Barrier(b));
                    }
                }
                let mut state = SubtaskSnapshot::default();
                state.list_state.insert("offset".into(), vec![text(offset)]);
                self.ack(i, b.id, "source", i, p, state);
                self.note(format!("source {i} snapshots checkpoint {} at offset {offset}", b.id));
            }
            return;
        }
        let s = &mut self.run.sources[i];
        let offset = s.offset;
        if let Some(&key) = self.inputs[i].get(offset as usize) {
            s.offset += 1;
            let rec = Rec {
                key,
                src: i as u32,
                offset,
            };
            self.run.channels[i * m + key as usize % m].push_back(Message::Record(rec));
        } else {
            s.ended = true;
            for ch in &mut self.run.channels[i * m..(i + 1) * m] {
                ch.push_back(Message::EndOfStream);
            }
            self.run.events.push_back(Event::Ended(i));
            self.note(format!("source {i} ended"));
        }
    }

    fn deliver(&mut self, c: usize) {
        let m = self.sinks;
        let (input, sink) = (c / m, c % m);
        let msg = self.run.channels[c].pop_front().expect("chosen non-empty");
        let mut events = Vec::new();
        if self.inputs.len() == 1 {
            // One input: the runtime's task takes each message as it comes, no aligner.
            events.push(match msg {
                Message::Record(r) => AlignerEvent::Record(r),
                Message::Watermark(w) => AlignerEvent::Watermark(w),
                Message::Barrier(barrier) => AlignerEvent::Barrier {
                    barrier,
                    alignment: Duration::ZERO,
                },
                Message::CancelCheckpoint(id) => AlignerEvent::Aborted {
                    id,
                    reason: AbortReason::CanceledUpstream,
                },
                Message::Idle => AlignerEvent::Idle,
                Message::EndOfStream => AlignerEvent::EndOfStream,
            });
        } else {
            self.run.sinks[sink].aligner.push(input, msg, &mut |e| events.push(e));
        }
        for e in events {
            self.aligned(sink, e);
        }
    }

    fn aligned(&mut self, m: usize, e: AlignerEvent<Rec>) {
        let p = self.inputs.len();
        let s = &mut self.run.sinks[m];
        match e {
            AlignerEvent::Record(rec) => {
                let count = s.counts.entry(rec.key).or_insert(0);
                *count += 1;
                let count = *count;
                s.open.push(Out { rec, count });
            }
            AlignerEvent::Barrier { barrier, .. } => self.pre_commit(m, barrier.id),
            AlignerEvent::Aborted { id, reason } => {
                match reason {
                    AbortReason::BufferLimit => self.paths.buffer_limit += 1,
                    _ => self.paths.subsumed += 1,
                }
                self.run.events.push_back(Event::Decline(id));
                self.note(format!("sink {m} declines checkpoint {id}: {reason}"));
            }
            AlignerEvent::EndOfStream => {
                s.ended = true;
                self.run.events.push_back(Event::Ended(p + m));
                self.note(format!("sink {m} ended"));
            }
            AlignerEvent::Watermark(_) | AlignerEvent::Idle => {}
        }
    }

    /// A sink's snapshot: its open transaction pre-committed, its counts and pending transactions.
    fn pre_commit(&mut self, m: usize, id: CheckpointId) {
        let (p, sinks) = (self.inputs.len(), self.sinks);
        let s = &mut self.run.sinks[m];
        if !s.open.is_empty() {
            self.txns.push(Txn {
                records: std::mem::take(&mut s.open),
                state: TxnState::Prepared,
            });
            s.pending.insert(id, self.txns.len() - 1);
        }
        let mut state = SubtaskSnapshot::default();
        let counts = s.counts.iter().map(|(k, c)| text(format!("{k}={c}"))).collect();
        let pending = s.pending.iter().map(|(id, t)| text(format!("{id}={t}"))).collect();
        state.list_state.insert("counts".into(), counts);
        state.list_state.insert("pending".into(), pending);
        let listed = format!("{:?}", s.pending);
        self.ack(p + m, id, "sink", m, sinks, state);
        self.note(format!("sink {m} snapshots checkpoint {id}, pending {listed}"));
    }

    fn sink_control(&mut self, m: usize) {
        let p = self.inputs.len();
        let c = self.run.controls[p + m].pop_front().expect("chosen non-empty");
        match c {
            Control::SnapshotIfEnded(b) if self.run.sinks[m].ended => {
                self.paths.ended_snapshots += 1;
                self.pre_commit(m, b.id);
            }
            Control::Complete(id) => {
                let s = &mut self.run.sinks[m];
                let later = s.pending.split_off(&(id + 1));
                let done = std::mem::replace(&mut s.pending, later);
                for (cid, t) in done {
                    self.commit(
                        t,
                        &format!("sink {m} on checkpoint {id} complete (pre-committed at {cid})"),
                    );
                }
            }
            // A two-phase sink keeps the transaction: the next completed checkpoint commits it.
            Control::Aborted(id) => self.note(format!("sink {m} told checkpoint {id} aborted")),
            Control::Trigger(_) | Control::SnapshotIfEnded(_) => {}
        }
    }

    fn event(&mut self) {
        let (p, tasks) = (self.inputs.len(), self.tasks());
        match self.run.events.pop_front().expect("chosen non-empty") {
            Event::Ack(task, id, snapshot) => {
                if let Acknowledged::AllAcknowledged(done) = self.run.coord.acknowledge(id, task, snapshot) {
                    self.complete(done.into_metadata("sim", self.clock_ms));
                }
            }
            Event::Decline(id) => {
                if let Some(b) = self.run.coord.decline(id) {
                    self.paths.declined += 1;
                    self.abort(b, "declined");
                }
            }
            Event::Ended(task) => {
                self.run.ended.insert(task);
                if task >= p {
                    let asks: Vec<_> = self
                        .run
                        .coord
                        .pending()
                        .filter(|c| !c.acknowledged_by(task))
                        .map(|c| Control::SnapshotIfEnded(c.barrier))
                        .collect();
                    self.run.controls[task].extend(asks);
                }
                if self.run.ended.len() == tasks && self.run.shutdown_after.is_none() {
                    let id = self.trigger();
                    self.run.shutdown_after = Some(id);
                    self.note(format!("every task ended: final checkpoint {id}"));
                }
            }
        }
    }

    fn trigger(&mut self) -> CheckpointId {
        let now = self.now();
        self.paths.concurrent += u64::from(self.run.coord.pending().next().is_some());
        let b = self.run.coord.trigger(now, SnapshotKind::Checkpoint, self.clock_ms);
        self.last_id = b.id;
        for task in 0..self.tasks() {
            if self.run.ended.contains(&task) {
                self.run.controls[task].push_back(Control::SnapshotIfEnded(b));
            } else if task < self.inputs.len() {
                self.run.controls[task].push_back(Control::Trigger(b));
            }
        }
        self.note(format!("checkpoint {} triggered", b.id));
        b.id
    }

    fn broadcast(&mut self, c: Control) {
        for q in &mut self.run.controls {
            q.push_back(c);
        }
    }

    /// Every task acknowledged: durable first, then the sinks are told.
    fn complete(&mut self, meta: crate::error::Result<CheckpointMetadata>) {
        let meta = match meta {
            Ok(m) => m,
            Err(e) => return self.fail_later(format!("METADATA: {e}")),
        };
        let id = meta.id;
        if self.faults() && self.rng.random_bool(0.05) {
            self.paths.persist_failed += 1;
            if self.rng.random_bool(0.5) {
                // Answered an error, but written: the newest checkpoint for the next restore,
                // though the run announced it aborted (its transactions stay pending).
                self.paths.landed_after_error += 1;
                self.note(format!("checkpoint {id}: metadata write answered an error, but landed"));
                self.durable.push(meta.clone());
            }
            let b = CheckpointBarrier {
                id,
                timestamp_ms: meta.timestamp_ms,
                kind: meta.kind,
            };
            self.abort(b, "its metadata write failed");
            return;
        }
        self.durable.push(meta);
        let now = self.now();
        for b in self.run.coord.completed(id, now) {
            self.paths.subsumed += 1;
            self.broadcast(Control::Aborted(b.id));
        }
        self.broadcast(Control::Complete(id));
        self.note(format!("checkpoint {id} durable"));
        if self.run.shutdown_after == Some(id) {
            self.run.finishing = true;
        }
    }

    /// A failed checkpoint: announced aborted; a restart when the tolerance is exceeded or the
    /// final checkpoint failed. Whether the run ended.
    fn abort(&mut self, b: CheckpointBarrier, why: &str) -> bool {
        self.note(format!("checkpoint {} aborted: {why}", b.id));
        self.broadcast(Control::Aborted(b.id));
        if self.run.shutdown_after == Some(b.id) {
            self.paths.final_failed += 1;
            self.restart("the final checkpoint failed");
            return true;
        }
        if let Err(e) = self.run.coord.failed(self.now()) {
            self.paths.tolerance_exceeded += 1;
            self.restart(&e.to_string());
            return true;
        }
        false
    }

    fn timer(&mut self) {
        self.clock_ms += self.rng.random_range(1..=30);
        let now = self.now();
        for b in self.run.coord.expired(now) {
            self.paths.expired += 1;
            if self.abort(b, "timed out") {
                return;
            }
        }
        let r = &self.run;
        if r.shutdown_after.is_none() && r.ended.len() < self.tasks() && r.coord.due(now) {
            self.trigger();
        }
    }
}
