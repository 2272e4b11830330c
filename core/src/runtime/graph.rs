//! Building a job: sources, chained operators, stage boundaries (key_by, rebalance, union) and
//! sinks. A [`Stream`] is a chain under construction; it becomes a stage when it meets a
//! boundary or a sink.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use super::api::{Collector, KeyedProcessFunction, ProcessFunction, Sink, Source, SubtaskInfo};
use super::chain::{ChannelOut, EmitFn, Envelope, KeyFn, KeyedNode, Partitioner, ProcessNode, SinkNode, Stateless};
use super::job::{MakeTask, PrepareInputs, Vertex};
use super::output::Output;
use super::task::{input_task, source_task, RecordSize, TaskBody, TaskContext};
use super::{Job, JobConfig};
use crate::error::{CoreError, Result};

mod stream;

/// Builds the chain of one subtask: given the rest of the chain, returns the task.
type Attach<T> = Arc<dyn Fn(&mut TaskContext, Box<dyn Output<T>>) -> Result<TaskBody> + Send + Sync>;

/// The input channels of one stage: a receiver per subtask, and the senders upstream stages use.
pub(crate) struct InputSlots<T> {
    parallelism: u32,
    receivers: Mutex<Vec<Option<mpsc::Receiver<Envelope<T>>>>>,
    senders: Mutex<Vec<mpsc::Sender<Envelope<T>>>>,
    /// Inputs per subtask, summed over incoming edges.
    inputs: Mutex<usize>,
}

impl<T: Send + 'static> PrepareInputs for InputSlots<T> {
    fn prepare(&self, capacity: usize) {
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..self.parallelism)
            .map(|_| mpsc::channel(capacity))
            .map(|(t, r)| (t, Some(r)))
            .unzip();
        *self.receivers.lock().expect("not poisoned") = rxs;
        *self.senders.lock().expect("not poisoned") = txs;
    }

    fn prepare_one(&self, capacity: usize, index: u32) {
        let (tx, rx) = mpsc::channel(capacity);
        if let Some(r) = self.receivers.lock().expect("not poisoned").get_mut(index as usize) {
            *r = Some(rx);
        }
        if let Some(s) = self.senders.lock().expect("not poisoned").get_mut(index as usize) {
            *s = tx;
        }
    }
}

impl<T> InputSlots<T> {
    fn take_receiver(&self, index: u32) -> Option<mpsc::Receiver<Envelope<T>>> {
        self.receivers
            .lock()
            .expect("not poisoned")
            .get_mut(index as usize)
            .and_then(Option::take)
    }
}

struct Graph {
    config: JobConfig,
    vertices: Vec<Vertex>,
    /// Every stage's input channels, created anew for each run.
    inputs: Vec<Arc<dyn PrepareInputs>>,
    uids: BTreeSet<String>,
    /// Whether some edge is not forward (key_by, rebalance, union of unequal parallelism).
    shuffles: bool,
    /// Stage inputs (by index in `inputs`) whose stream has not yet ended in a sink or a stage
    /// boundary: a stream dropped on the way would leave its upstream sending into nothing.
    unread: BTreeSet<usize>,
    error: Option<CoreError>,
}

/// Builds a job. Every stateful operator, source and sink has a uid: state is addressed by it.
///
/// ```
/// use exactly_core::runtime::{JobBuilder, JobConfig, Sink, Source, SourceStatus};
///
/// /// 0, 1, …, 9, then the end of the input.
/// struct Numbers(u64);
///
/// impl Source<u64> for Numbers {
///     async fn poll_next(&mut self, out: &mut Vec<u64>) -> exactly_core::Result<SourceStatus> {
///         if self.0 == 10 {
///             return Ok(SourceStatus::End);
///         }
///         out.push(self.0);
///         self.0 += 1;
///         Ok(SourceStatus::More)
///     }
/// }
///
/// struct Print;
///
/// impl Sink<u64> for Print {
///     async fn write(&mut self, records: Vec<u64>) -> exactly_core::Result<()> {
///         for r in records {
///             println!("{r}");
///         }
///         Ok(())
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> exactly_core::Result<()> {
/// let mut job = JobBuilder::new(JobConfig::new("numbers"));
/// job.source("numbers", 1, |_| Numbers(0))
///     .filter(|n| n % 2 == 0)
///     .map(|n| n * 10)
///     .sink("print", |_| Print);
/// // `JobConfig::checkpointing` (a `CheckpointConfig`) turns checkpoints on; without it, no
/// // state survives a restart.
/// let outcome = job.build()?.run().await?;
/// assert_eq!(outcome.restarts, 0);
/// # Ok(())
/// # }
/// ```
///
/// Runnable programs: `cargo run -p exactly-core --example custom_source`, and the guide
/// `docs/writing-a-connector.md`.
pub struct JobBuilder {
    graph: Rc<RefCell<Graph>>,
}

/// A stream of `T` whose chain is still open for more operators.
pub struct Stream<T> {
    graph: Rc<RefCell<Graph>>,
    name: String,
    parallelism: u32,
    is_source: bool,
    attach: Attach<T>,
    record_size: Option<RecordSize<T>>,
    /// `record_size` was given by the user ([`Stream::record_size`]), not the source's default.
    size_explicit: bool,
    /// The stage input this chain reads (none for a chain that starts at a source).
    reads: Option<usize>,
}

/// A stream partitioned by key: the next operator sees each key on one subtask only.
pub struct KeyedStream<T> {
    stream: Stream<T>,
    key: KeyFn<T>,
}

impl JobBuilder {
    /// A builder for a job with `config`.
    pub fn new(config: JobConfig) -> Self {
        JobBuilder {
            graph: Rc::new(RefCell::new(Graph {
                config,
                vertices: Vec::new(),
                inputs: Vec::new(),
                uids: BTreeSet::new(),
                shuffles: false,
                unread: BTreeSet::new(),
                error: None,
            })),
        }
    }

    /// Adds a source with `parallelism` subtasks, each made by `factory`.
    pub fn source<T, S, F>(&mut self, uid: &str, parallelism: u32, factory: F) -> Stream<T>
    where
        T: Send + 'static,
        S: Source<T>,
        F: Fn(&SubtaskInfo) -> S + Send + Sync + 'static,
    {
        register_uid(&self.graph, uid);
        check_parallelism(&self.graph, uid, parallelism);
        let uid = uid.to_owned();
        let uid2 = uid.clone();
        let attach: Attach<T> = Arc::new(move |ctx: &mut TaskContext, out: Box<dyn Output<T>>| {
            let info = ctx.info(&uid);
            let restored = ctx.restored(&uid);
            let source = factory(&info);
            Ok(source_task(ctx, info, restored, source, out))
        });
        Stream {
            graph: self.graph.clone(),
            name: uid2,
            parallelism,
            is_source: true,
            attach,
            record_size: Some(Arc::new(|r: &T| S::record_size(r))),
            size_explicit: false,
            reads: None,
        }
    }

    /// The finished job.
    pub fn build(self) -> Result<Job> {
        let graph = Rc::try_unwrap(self.graph)
            .map_err(|_| CoreError::InvalidJob("a stream is still open: connect it to a sink".into()))?
            .into_inner();
        if let Some(e) = graph.error {
            return Err(e);
        }
        if graph.vertices.is_empty() {
            return Err(CoreError::InvalidJob("the job has no sink".into()));
        }
        if !graph.unread.is_empty() {
            return Err(CoreError::InvalidJob(
                "a stream was dropped before reaching a sink (every branch of a fan_out, rebalance or key_by needs one)".into(),
            ));
        }
        #[cfg(not(feature = "rocksdb"))]
        if matches!(graph.config.state_backend, super::StateBackendConfig::RocksDb { .. }) {
            return Err(super::rocksdb_missing());
        }
        graph.config.state_backend.validate()?;
        if let Some(range) = graph.config.subtasks {
            if graph.shuffles {
                return Err(CoreError::InvalidJob(format!(
                    "subtasks {range}: a job split over processes must have forward edges only (no key_by, rebalance or union of different parallelism)"
                )));
            }
            let p = graph.vertices[0].parallelism;
            if graph.vertices.iter().any(|v| v.parallelism != p) {
                return Err(CoreError::InvalidJob(format!(
                    "subtasks {range}: a job split over processes must have one parallelism for every stage"
                )));
            }
            if range.last >= p {
                return Err(CoreError::InvalidJob(format!(
                    "subtasks {range}: the last index must be below the parallelism ({p})"
                )));
            }
        }
        Job::new(graph.config, graph.vertices, graph.inputs, graph.uids, graph.shuffles)
    }
}

fn register_uid(graph: &Rc<RefCell<Graph>>, uid: &str) {
    let mut g = graph.borrow_mut();
    // A uid names the operator's state files (`UID-SUBTASK…`): one path component, always.
    if !crate::checkpoint::is_single_component(uid) && g.error.is_none() {
        g.error = Some(CoreError::InvalidJob(format!(
            "operator uid {uid:?} must be usable as a file name: not empty, no '/', '\\' or NUL, not '.' or '..'"
        )));
    }
    if !g.uids.insert(uid.to_owned()) && g.error.is_none() {
        g.error = Some(CoreError::InvalidJob(format!("operator uid {uid:?} is used twice")));
    }
}

fn check_parallelism(graph: &Rc<RefCell<Graph>>, uid: &str, parallelism: u32) {
    let mut g = graph.borrow_mut();
    let max = g.config.max_parallelism;
    if (parallelism == 0 || parallelism > max) && g.error.is_none() {
        g.error = Some(CoreError::InvalidJob(format!(
            "{uid}: parallelism {parallelism} must be between 1 and max_parallelism ({max})"
        )));
    }
}

/// A chain reading stage input `reads` ends (in a sink or a stage boundary).
fn close_chain(graph: &Rc<RefCell<Graph>>, reads: Option<usize>) {
    if let Some(at) = reads {
        graph.borrow_mut().unread.remove(&at);
    }
}

fn push_vertex(graph: &Rc<RefCell<Graph>>, name: String, parallelism: u32, is_source: bool, make: MakeTask) {
    graph.borrow_mut().vertices.push(Vertex {
        name,
        parallelism,
        is_source,
        make,
    });
}

/// Closes the upstream chains into stages that send to a new stage of `parallelism` subtasks.
fn connect<T: Send + 'static>(
    upstreams: Vec<(Stream<T>, Partitioner<T>)>,
    name: String,
    parallelism: u32,
) -> Stream<T> {
    let graph = upstreams[0].0.graph.clone();
    // The stage's input records are weighed as a user said for one of its upstreams, else as
    // the first upstream's source says.
    let size_explicit = upstreams
        .iter()
        .any(|(s, _)| s.size_explicit && s.record_size.is_some());
    let record_size = upstreams
        .iter()
        .filter(|(s, _)| s.size_explicit || !size_explicit)
        .find_map(|(s, _)| s.record_size.clone());
    let size: RecordSize<T> = record_size
        .clone()
        .unwrap_or_else(|| Arc::new(|_: &T| std::mem::size_of::<T>()));
    let slots = Arc::new(InputSlots::<T> {
        parallelism,
        receivers: Mutex::new(Vec::new()),
        senders: Mutex::new(Vec::new()),
        inputs: Mutex::new(0),
    });
    let mut next_input = 0usize;
    for (up, part) in upstreams {
        let part = match part {
            Partitioner::Forward if up.parallelism != parallelism => Partitioner::Rebalance,
            p => p,
        };
        if !matches!(part, Partitioner::Forward) {
            graph.borrow_mut().shuffles = true;
        }
        let base = next_input;
        next_input += if matches!(part, Partitioner::Forward) {
            1
        } else {
            up.parallelism as usize
        };
        let slots_up = slots.clone();
        close_chain(&graph, up.reads);
        let attach = up.attach;
        let task_name = up.name.clone();
        let make: MakeTask = Box::new(move |ctx| {
            let senders = slots_up.senders.lock().expect("not poisoned").clone();
            let targets: Vec<_> = match part {
                Partitioner::Forward => vec![(senders[ctx.index as usize].clone(), base)],
                _ => senders.into_iter().map(|s| (s, base + ctx.index as usize)).collect(),
            };
            let buffers = targets.iter().map(|_| Vec::new()).collect();
            let out = ChannelOut {
                task: format!("{task_name}[{}]", ctx.index),
                targets,
                partitioner: part.clone(),
                buffers,
                next_target: 0,
                pending_watermark: None,
                pending_idle: false,
            };
            attach(ctx, Box::new(out))
        });
        push_vertex(&graph, up.name, up.parallelism, up.is_source, make);
    }
    *slots.inputs.lock().expect("not poisoned") = next_input;
    let slots_down = slots.clone();
    let attach: Attach<T> = Arc::new(move |ctx, out| {
        let rx = slots_down
            .take_receiver(ctx.index)
            .ok_or_else(|| CoreError::InvalidJob("input channel taken twice (internal error)".into()))?;
        let inputs = *slots_down.inputs.lock().expect("not poisoned");
        Ok(input_task(ctx, rx, inputs, out, size.clone()))
    });
    let reads = {
        let mut g = graph.borrow_mut();
        g.inputs.push(slots);
        let at = g.inputs.len() - 1;
        g.unread.insert(at);
        at
    };
    Stream {
        graph,
        name,
        parallelism,
        is_source: false,
        attach,
        record_size,
        size_explicit,
        reads: Some(reads),
    }
}

#[cfg(test)]
#[path = "graph_tests.rs"]
mod tests;
