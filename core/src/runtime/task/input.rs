//! The loop of a subtask fed by channels (an input task).

use super::*;

/// The loop of a subtask fed by channels: align barriers, push records through the chain.
pub(crate) fn input_task<T: Send + 'static>(
    ctx: &mut TaskContext,
    mut input: mpsc::Receiver<Envelope<T>>,
    inputs: usize,
    mut chain: Box<dyn Output<T>>,
    size: RecordSize<T>,
) -> TaskBody {
    let mut parts = ctx.parts();
    // Messages carry batches: a batch weighs what its records weigh.
    let mut aligner = BarrierAligner::new(inputs, ctx.alignment, ctx.max_alignment_buffer).with_byte_limit(
        ctx.max_alignment_bytes,
        Arc::new(move |batch: &Vec<T>| batch.iter().map(|r| size(r)).sum()),
    );
    Box::pin(async move {
        chain.open().await?;
        parts.send(TaskEvent::Opened { task: parts.task_id });
        let mut ended = false;
        let mut events = Vec::new();
        let mut acks = WaitingAcks::default();
        let mut turn = Turn::new();
        loop {
            tokio::select! {
                biased;
                c = parts.control.recv() => {
                    match c {
                        Some(Control::Notify(n)) => chain.notify(n).await?,
                        Some(Control::SnapshotIfEnded(barrier)) if ended => {
                            parts.checkpoint(&mut acks, &mut chain, barrier, TaskSnapshot::default(), false).await?;
                        }
                        Some(Control::SnapshotIfEnded(_) | Control::Trigger { .. }) => {}
                        Some(Control::Shutdown) => return chain.close().await,
                        None => return Ok(()),
                    }
                    // What a completion or a snapshot spawned starts at once.
                    turn.end().await;
                }
                () = acks.oldest_ended(), if !acks.is_empty() => parts.send_ready(&mut acks).await?,
                env = input.recv(), if !ended => {
                    let Some(env) = env else {
                        return Err(CoreError::TaskLost {
                            task: parts.name.clone(),
                            reason: "an upstream task ended without end of stream".into(),
                        });
                    };
                    let mut spawned = false;
                    if inputs == 1 {
                        // Single input: nothing to align.
                        events.push(match env.msg {
                            Message::Record(r) => AlignerEvent::Record(r),
                            Message::Watermark(w) => AlignerEvent::Watermark(w),
                            Message::Barrier(barrier) => AlignerEvent::Barrier { barrier, alignment: Duration::ZERO },
                            Message::CancelCheckpoint(id) => AlignerEvent::Aborted {
                                id,
                                reason: crate::checkpoint::AbortReason::CanceledUpstream,
                            },
                            Message::Idle => AlignerEvent::Idle,
                            Message::EndOfStream => AlignerEvent::EndOfStream,
                        });
                    } else {
                        aligner.push(env.input, env.msg, &mut |e| events.push(e));
                    }
                    for event in events.drain(..) {
                        match event {
                            AlignerEvent::Record(batch) => {
                                for r in batch {
                                    chain.record(r)?;
                                }
                            }
                            AlignerEvent::Watermark(w) => chain.watermark(w)?,
                            AlignerEvent::Idle => chain.idle()?,
                            AlignerEvent::Barrier { barrier, alignment } => {
                                let snapshot = TaskSnapshot { operators: Vec::new(), alignment, written: 0 };
                                parts.checkpoint(&mut acks, &mut chain, barrier, snapshot, true).await?;
                                spawned = true;
                            }
                            AlignerEvent::Aborted { id, reason } => {
                                chain.flush().await?;
                                chain.cancel(id).await?;
                                parts.send(TaskEvent::Decline { task: parts.task_id, id, reason: reason.to_string() });
                            }
                            AlignerEvent::EndOfStream => {
                                chain.flush().await?;
                                chain.end().await?;
                                ended = true;
                                parts.send_all(&mut acks).await?;
                                parts.send(TaskEvent::Ended { task: parts.task_id });
                            }
                        }
                    }
                    chain.flush().await?;
                    if spawned {
                        turn.end().await;
                    } else if input.is_empty() {
                        // The next receive likely waits: a new turn starts after it.
                        turn.restart();
                    } else {
                        turn.end_if_due().await;
                    }
                }
            }
        }
    })
}
