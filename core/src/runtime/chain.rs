//! Operators chained in one task: each node handles a record synchronously and pushes its output
//! into the next node; the chain ends in a sink or in the channels to the next stage. Barriers,
//! notifications and end of input travel the same path, so every operator snapshots in order.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::api::{
    CheckpointListener, CheckpointedFunction, Collector, InitContext, KeyedProcessFunction, ProcessFunction, Sink,
    SnapshotContext, SubtaskInfo,
};
use super::output::{BarrierCtx, BoxFut, Notification, Output};
use crate::coordinator::OperatorSubtaskState;
use crate::error::{CoreError, Result};
use crate::message::{CheckpointBarrier, CheckpointId, Message, Watermark};
use crate::state::{key_group, KeyedContext, KeyedStateBackend, RestoredState};

/// A stateless operator body: one input record, zero or more outputs.
pub(crate) type EmitFn<I, O> = Arc<dyn Fn(I, &mut Collector<'_, O>) -> Result<()> + Send + Sync>;

/// Extracts the key bytes of a record.
pub(crate) type KeyFn<T> = Arc<dyn Fn(&T) -> Vec<u8> + Send + Sync>;

/// How records are routed from one stage to the next.
pub(crate) enum Partitioner<T> {
    /// Subtask i to subtask i.
    Forward,
    /// Round robin over every downstream subtask.
    Rebalance,
    /// By key group of the key.
    Hash { key: KeyFn<T>, max_parallelism: u32 },
    /// A copy to every target (one per branch of a fan-out, each the same subtask index).
    Copy { clone: CloneFn<T> },
}

/// Copies a record (for the branches of a fan-out).
pub(crate) type CloneFn<T> = Arc<dyn Fn(&T) -> T + Send + Sync>;

impl<T> Clone for Partitioner<T> {
    fn clone(&self) -> Self {
        match self {
            Partitioner::Forward => Partitioner::Forward,
            Partitioner::Rebalance => Partitioner::Rebalance,
            Partitioner::Hash { key, max_parallelism } => Partitioner::Hash {
                key: key.clone(),
                max_parallelism: *max_parallelism,
            },
            Partitioner::Copy { clone } => Partitioner::Copy { clone: clone.clone() },
        }
    }
}

/// What travels on a channel between stages: which input of the receiver it is, and the message.
pub(crate) struct Envelope<T> {
    pub(crate) input: usize,
    pub(crate) msg: Message<Vec<T>>,
}

pub(crate) fn user_error(uid: &str, e: CoreError) -> CoreError {
    match e {
        // A decline stays a decline: the task declines the checkpoint instead of failing.
        e @ (CoreError::Operator { .. } | CoreError::CheckpointAborted { .. }) => e,
        other => CoreError::operator(uid, other.class(), other),
    }
}

/// A stateless node (map, filter, flat_map): `f` emits zero or more records per input.
pub(crate) struct Stateless<I, O> {
    pub(crate) f: EmitFn<I, O>,
    pub(crate) next: Box<dyn Output<O>>,
}

impl<I: Send, O: Send> Output<I> for Stateless<I, O> {
    fn close(&mut self) -> BoxFut<'_, Result<()>> {
        self.next.close()
    }
    fn open(&mut self) -> BoxFut<'_, Result<()>> {
        self.next.open()
    }
    fn record(&mut self, record: I) -> Result<()> {
        (self.f)(
            record,
            &mut Collector {
                out: self.next.as_mut(),
            },
        )
    }
    fn watermark(&mut self, w: Watermark) -> Result<()> {
        self.next.watermark(w)
    }
    fn idle(&mut self) -> Result<()> {
        self.next.idle()
    }
    fn flush(&mut self) -> BoxFut<'_, Result<()>> {
        self.next.flush()
    }
    fn barrier<'a>(&'a mut self, ctx: BarrierCtx<'a>) -> BoxFut<'a, Result<()>> {
        self.next.barrier(ctx)
    }
    fn cancel(&mut self, id: CheckpointId) -> BoxFut<'_, Result<()>> {
        self.next.cancel(id)
    }
    fn notify(&mut self, n: Notification) -> BoxFut<'_, Result<()>> {
        self.next.notify(n)
    }
    fn end(&mut self) -> BoxFut<'_, Result<()>> {
        self.next.end()
    }
}

fn push_state(info: &SubtaskInfo, ctx: &mut BarrierCtx<'_>, sctx: SnapshotContext) -> usize {
    let snapshot = &mut *ctx.snapshot;
    snapshot.operators.push(OperatorSubtaskState {
        uid: info.uid.clone(),
        subtask: info.index,
        parallelism: info.parallelism,
        max_parallelism: info.max_parallelism,
        state: crate::checkpoint::SubtaskSnapshot {
            list_state: sctx.list_state,
            union_state: sctx.union_state,
            keyed: None,
        },
    });
    let at = snapshot.operators.len() - 1;
    ctx.deferred.extend(sctx.deferred.into_iter().map(|part| (at, part)));
    at
}

/// Runs `initialize_state` of a chained function with its restored state.
fn init_function(info: &SubtaskInfo, restored: Option<&RestoredState>, f: &mut dyn CheckpointedFunction) -> Result<()> {
    f.initialize_state(&InitContext::new(info, restored))
        .map_err(|e| user_error(&info.uid, e))
}

/// Runs `snapshot_state` of a chained function and adds its state to the task's snapshot;
/// returns the entry's index.
fn snapshot_function(
    info: &SubtaskInfo,
    b: CheckpointBarrier,
    f: &mut dyn CheckpointedFunction,
    ctx: &mut BarrierCtx<'_>,
) -> Result<usize> {
    let mut sctx = SnapshotContext::new(b.id, b.kind, b.timestamp_ms);
    f.snapshot_state(&mut sctx).map_err(|e| user_error(&info.uid, e))?;
    Ok(push_state(info, ctx, sctx))
}

fn notify_listener(uid: &str, l: &mut dyn CheckpointListener, n: Notification) -> Result<()> {
    match n {
        Notification::Complete(id) => l.notify_checkpoint_complete(id),
        Notification::Aborted(id) => l.notify_checkpoint_aborted(id),
    }
    .map_err(|e| user_error(uid, e))
}

/// A node running a [`ProcessFunction`].
pub(crate) struct ProcessNode<I, O, P> {
    pub(crate) info: SubtaskInfo,
    pub(crate) f: P,
    pub(crate) restored: Option<RestoredState>,
    pub(crate) next: Box<dyn Output<O>>,
    pub(crate) _i: std::marker::PhantomData<fn(I)>,
}

impl<I: Send, O: Send, P: ProcessFunction<I, O>> Output<I> for ProcessNode<I, O, P> {
    fn close(&mut self) -> BoxFut<'_, Result<()>> {
        self.next.close()
    }
    fn open(&mut self) -> BoxFut<'_, Result<()>> {
        Box::pin(async move {
            init_function(&self.info, self.restored.as_ref(), &mut self.f)?;
            self.restored = None;
            self.next.open().await
        })
    }
    fn record(&mut self, record: I) -> Result<()> {
        self.f.process(
            record,
            &mut Collector {
                out: self.next.as_mut(),
            },
        )
    }
    fn watermark(&mut self, w: Watermark) -> Result<()> {
        self.f.on_watermark(
            w,
            &mut Collector {
                out: self.next.as_mut(),
            },
        )?;
        self.next.watermark(w)
    }
    fn idle(&mut self) -> Result<()> {
        self.next.idle()
    }
    fn flush(&mut self) -> BoxFut<'_, Result<()>> {
        self.next.flush()
    }
    fn barrier<'a>(&'a mut self, mut ctx: BarrierCtx<'a>) -> BoxFut<'a, Result<()>> {
        Box::pin(async move {
            let b = ctx.barrier;
            if ctx.forward {
                self.f.prepare_snapshot_pre_barrier(
                    b.id,
                    &mut Collector {
                        out: self.next.as_mut(),
                    },
                )?;
            }
            snapshot_function(&self.info, b, &mut self.f, &mut ctx)?;
            self.next.barrier(ctx).await
        })
    }
    fn cancel(&mut self, id: CheckpointId) -> BoxFut<'_, Result<()>> {
        self.next.cancel(id)
    }
    fn notify(&mut self, n: Notification) -> BoxFut<'_, Result<()>> {
        Box::pin(async move {
            notify_listener(&self.info.uid, &mut self.f, n)?;
            self.next.notify(n).await
        })
    }
    fn end(&mut self) -> BoxFut<'_, Result<()>> {
        Box::pin(async move {
            self.f.finish(&mut Collector {
                out: self.next.as_mut(),
            })?;
            self.next.end().await
        })
    }
}

/// Builds a subtask's keyed state backend (fresh or restored).
pub(crate) type BackendFactory =
    Arc<dyn Fn(&SubtaskInfo, Option<&RestoredState>) -> Result<Box<dyn KeyedStateBackend>> + Send + Sync>;

/// A node running a [`KeyedProcessFunction`] with its keyed state backend.
pub(crate) struct KeyedNode<I, O, P> {
    pub(crate) info: SubtaskInfo,
    pub(crate) f: P,
    pub(crate) key: KeyFn<I>,
    pub(crate) backend: Option<Box<dyn KeyedStateBackend>>,
    pub(crate) make_backend: BackendFactory,
    pub(crate) restored: Option<RestoredState>,
    pub(crate) next: Box<dyn Output<O>>,
}

impl<I: Send, O: Send, P: KeyedProcessFunction<I, O>> Output<I> for KeyedNode<I, O, P> {
    fn close(&mut self) -> BoxFut<'_, Result<()>> {
        self.next.close()
    }
    fn open(&mut self) -> BoxFut<'_, Result<()>> {
        Box::pin(async move {
            init_function(&self.info, self.restored.as_ref(), &mut self.f)?;
            let backend = (self.make_backend)(&self.info, self.restored.as_ref())?;
            self.backend = Some(backend);
            self.restored = None;
            self.next.open().await
        })
    }
    fn record(&mut self, record: I) -> Result<()> {
        let key = (self.key)(&record);
        let backend = self.backend.as_deref_mut().expect("opened before records");
        let mut state = KeyedContext {
            key_group: key_group(&key, self.info.max_parallelism),
            backend,
            key: &key,
        };
        self.f.process(
            record,
            &mut state,
            &mut Collector {
                out: self.next.as_mut(),
            },
        )
    }
    fn watermark(&mut self, w: Watermark) -> Result<()> {
        self.next.watermark(w)
    }
    fn idle(&mut self) -> Result<()> {
        self.next.idle()
    }
    fn flush(&mut self) -> BoxFut<'_, Result<()>> {
        self.next.flush()
    }
    fn barrier<'a>(&'a mut self, mut ctx: BarrierCtx<'a>) -> BoxFut<'a, Result<()>> {
        Box::pin(async move {
            let b = ctx.barrier;
            let at = snapshot_function(&self.info, b, &mut self.f, &mut ctx)?;
            if let Some(storage) = ctx.storage {
                let writer = storage.writer(b.id)?;
                let name = format!("{}-{}", self.info.uid, self.info.index);
                let backend = self.backend.as_deref_mut().expect("opened before barriers");
                let handle = tokio::task::block_in_place(|| backend.snapshot(b.id, b.kind, &name, writer.as_ref()))?;
                ctx.snapshot.operators[at].state.keyed = Some(handle);
                ctx.snapshot.written += writer.bytes_written();
            }
            self.next.barrier(ctx).await
        })
    }
    fn cancel(&mut self, id: CheckpointId) -> BoxFut<'_, Result<()>> {
        self.next.cancel(id)
    }
    fn notify(&mut self, n: Notification) -> BoxFut<'_, Result<()>> {
        Box::pin(async move {
            notify_listener(&self.info.uid, &mut self.f, n)?;
            if let (Notification::Complete(id), Some(b)) = (n, self.backend.as_deref_mut()) {
                b.checkpoint_complete(id);
            }
            self.next.notify(n).await
        })
    }
    fn end(&mut self) -> BoxFut<'_, Result<()>> {
        self.next.end()
    }
}

/// The end of a chain that writes into a [`Sink`].
pub(crate) struct SinkNode<T, S> {
    pub(crate) info: SubtaskInfo,
    pub(crate) sink: S,
    pub(crate) restored: Option<RestoredState>,
    pub(crate) buffer: Vec<T>,
    /// The run's restore past unreadable checkpoints, which this sink must prove safe.
    pub(crate) proof: Option<Arc<crate::runtime::api::RestoreProof>>,
    /// The job's checkpoint storage, whose owner check a sink makes before its recovery acts.
    pub(crate) owner: Option<Arc<dyn crate::storage::CheckpointStorage>>,
}

impl<T: Send + 'static, S: Sink<T>> SinkNode<T, S> {
    async fn write_buffered(&mut self) -> Result<()> {
        if !self.buffer.is_empty() {
            let batch = std::mem::take(&mut self.buffer);
            self.sink
                .write(batch)
                .await
                .map_err(|e| user_error(&self.info.uid, e))?;
        }
        Ok(())
    }
}

impl<T: Send + 'static, S: Sink<T>> Output<T> for SinkNode<T, S> {
    fn close(&mut self) -> BoxFut<'_, Result<()>> {
        Box::pin(async move { self.sink.close().await.map_err(|e| user_error(&self.info.uid, e)) })
    }
    fn open(&mut self) -> BoxFut<'_, Result<()>> {
        Box::pin(async move {
            // A restore past checkpoints that cannot be read: a sink that cannot prove it safe is
            // not initialised at all (it could change its external system), and stops the job.
            if let Some(p) = &self.proof {
                if !self.sink.can_prove_restores() {
                    p.record(false);
                    return Err(crate::CoreError::FallbackNotProven {
                        unusable: p.reason.clone(),
                        restored: self.info.restored_checkpoint.unwrap_or(0),
                        unproven: 1,
                        sinks: p.expected.load(std::sync::atomic::Ordering::SeqCst),
                    });
                }
            }
            let ctx = InitContext {
                info: &self.info,
                restored: self.restored.as_ref(),
                proof: self.proof.as_deref(),
                proved_here: Default::default(),
                owner: self.owner.as_ref(),
            };
            let opened = self.sink.initialize_state(&ctx).await;
            // A sink that returns without having proved it: a refusal (fatal) stops the others,
            // which wait for the proofs; another failure (an outage) ends this attempt, and the
            // next proves again.
            if let Some(p) = &self.proof {
                if !ctx.proved_here.load(std::sync::atomic::Ordering::SeqCst) {
                    match &opened {
                        Err(e) if e.class() != crate::ErrorClass::Fatal => p.abort(),
                        _ => p.record(false),
                    }
                }
            }
            opened.map_err(|e| user_error(&self.info.uid, e))?;
            self.restored = None;
            Ok(())
        })
    }
    fn record(&mut self, record: T) -> Result<()> {
        self.buffer.push(record);
        Ok(())
    }
    fn watermark(&mut self, _w: Watermark) -> Result<()> {
        Ok(())
    }
    fn idle(&mut self) -> Result<()> {
        Ok(())
    }
    fn flush(&mut self) -> BoxFut<'_, Result<()>> {
        Box::pin(self.write_buffered())
    }
    fn barrier<'a>(&'a mut self, mut ctx: BarrierCtx<'a>) -> BoxFut<'a, Result<()>> {
        Box::pin(async move {
            self.write_buffered().await?;
            let b = ctx.barrier;
            let mut sctx = SnapshotContext::new(b.id, b.kind, b.timestamp_ms);
            self.sink
                .snapshot_state(&mut sctx)
                .await
                .map_err(|e| user_error(&self.info.uid, e))?;
            push_state(&self.info, &mut ctx, sctx);
            Ok(())
        })
    }
    fn cancel(&mut self, _id: CheckpointId) -> BoxFut<'_, Result<()>> {
        Box::pin(async { Ok(()) })
    }
    fn notify(&mut self, n: Notification) -> BoxFut<'_, Result<()>> {
        Box::pin(async move {
            match n {
                Notification::Complete(id) => self.sink.notify_checkpoint_complete(id).await,
                Notification::Aborted(id) => self.sink.notify_checkpoint_aborted(id).await,
            }
            .map_err(|e| user_error(&self.info.uid, e))
        })
    }
    fn end(&mut self) -> BoxFut<'_, Result<()>> {
        Box::pin(async move {
            self.write_buffered().await?;
            self.sink.finish().await.map_err(|e| user_error(&self.info.uid, e))
        })
    }
}

/// The end of a chain that sends into the channels of the next stage.
pub(crate) struct ChannelOut<T> {
    pub(crate) task: String,
    /// (sender, input index at the receiver) per downstream subtask this subtask feeds.
    pub(crate) targets: Vec<(mpsc::Sender<Envelope<T>>, usize)>,
    pub(crate) partitioner: Partitioner<T>,
    pub(crate) buffers: Vec<Vec<T>>,
    pub(crate) next_target: usize,
    /// Sent to every target after the buffered records at the next flush.
    pub(crate) pending_watermark: Option<Watermark>,
    /// Idle is sent to every target (after records and watermark) at the next flush.
    pub(crate) pending_idle: bool,
}

impl<T: Send + 'static> ChannelOut<T> {
    async fn send_all(&mut self, msg: impl Fn() -> Message<Vec<T>>) -> Result<()> {
        self.send_buffers().await?;
        for (tx, input) in &self.targets {
            tx.send(Envelope {
                input: *input,
                msg: msg(),
            })
            .await
            .map_err(|_| self.lost())?;
        }
        Ok(())
    }

    async fn send_buffers(&mut self) -> Result<()> {
        for (i, buf) in self.buffers.iter_mut().enumerate() {
            if !buf.is_empty() {
                let (tx, input) = &self.targets[i];
                let batch = std::mem::take(buf);
                if tx
                    .send(Envelope {
                        input: *input,
                        msg: Message::Record(batch),
                    })
                    .await
                    .is_err()
                {
                    return Err(CoreError::TaskLost {
                        task: self.task.clone(),
                        reason: "the downstream task is gone".into(),
                    });
                }
            }
        }
        if let Some(w) = self.pending_watermark.take() {
            for (tx, input) in &self.targets {
                tx.send(Envelope {
                    input: *input,
                    msg: Message::Watermark(w),
                })
                .await
                .map_err(|_| self.lost())?;
            }
        }
        if std::mem::take(&mut self.pending_idle) {
            for (tx, input) in &self.targets {
                tx.send(Envelope {
                    input: *input,
                    msg: Message::Idle,
                })
                .await
                .map_err(|_| self.lost())?;
            }
        }
        Ok(())
    }

    fn lost(&self) -> CoreError {
        CoreError::TaskLost {
            task: self.task.clone(),
            reason: "the downstream task is gone".into(),
        }
    }
}

impl<T: Send + 'static> Output<T> for ChannelOut<T> {
    fn open(&mut self) -> BoxFut<'_, Result<()>> {
        Box::pin(async { Ok(()) })
    }
    fn record(&mut self, record: T) -> Result<()> {
        if let Partitioner::Copy { clone } = &self.partitioner {
            if let Some((last, rest)) = self.buffers.split_last_mut() {
                for b in rest {
                    b.push(clone(&record));
                }
                last.push(record);
            }
            self.pending_idle = false;
            return Ok(());
        }
        let target = match &self.partitioner {
            Partitioner::Forward => 0,
            Partitioner::Rebalance => {
                self.next_target = (self.next_target + 1) % self.targets.len();
                self.next_target
            }
            Partitioner::Hash { key, max_parallelism } => {
                let kg = key_group(&key(&record), *max_parallelism);
                crate::state::subtask_for_key_group(*max_parallelism, self.targets.len() as u32, kg) as usize
            }
            Partitioner::Copy { .. } => unreachable!("handled above"),
        };
        self.buffers[target].push(record);
        self.pending_idle = false;
        Ok(())
    }
    fn watermark(&mut self, w: Watermark) -> Result<()> {
        self.pending_watermark = Some(self.pending_watermark.map_or(w, |p| p.max(w)));
        self.pending_idle = false;
        Ok(())
    }
    fn idle(&mut self) -> Result<()> {
        self.pending_idle = true;
        Ok(())
    }
    fn flush(&mut self) -> BoxFut<'_, Result<()>> {
        Box::pin(self.send_buffers())
    }
    fn barrier<'a>(&'a mut self, ctx: BarrierCtx<'a>) -> BoxFut<'a, Result<()>> {
        Box::pin(async move {
            if ctx.forward {
                let b = ctx.barrier;
                self.send_all(|| Message::Barrier(b)).await?;
            }
            Ok(())
        })
    }
    fn cancel(&mut self, id: CheckpointId) -> BoxFut<'_, Result<()>> {
        Box::pin(self.send_all(move || Message::CancelCheckpoint(id)))
    }
    fn notify(&mut self, _n: Notification) -> BoxFut<'_, Result<()>> {
        Box::pin(async { Ok(()) })
    }
    fn end(&mut self) -> BoxFut<'_, Result<()>> {
        Box::pin(self.send_all(|| Message::EndOfStream))
    }
}
