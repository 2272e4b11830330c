//! The operators a stream offers while its chain is open (map, filter, process, key_by,
//! rebalance, union, fan_out, sink), and those of a keyed stream.

use super::*;

impl<T: Send + 'static> Stream<T> {
    /// Chains a stateless function over every record.
    pub fn flat_map<O: Send + 'static>(
        self,
        f: impl Fn(T, &mut Collector<'_, O>) -> Result<()> + Send + Sync + 'static,
    ) -> Stream<O> {
        let f: EmitFn<T, O> = Arc::new(f);
        let prev = self.attach;
        Stream {
            graph: self.graph,
            name: self.name,
            parallelism: self.parallelism,
            is_source: self.is_source,
            attach: Arc::new(move |ctx, next| prev(ctx, Box::new(Stateless { f: f.clone(), next }))),
            record_size: None,
            size_explicit: false,
            reads: self.reads,
        }
    }

    /// Chains a stateless 1:1 transformation.
    pub fn map<O: Send + 'static>(self, f: impl Fn(T) -> O + Send + Sync + 'static) -> Stream<O> {
        self.flat_map(move |r, out| out.emit(f(r)))
    }

    /// Chains a filter (records keep the weight the stream gives them).
    pub fn filter(self, f: impl Fn(&T) -> bool + Send + Sync + 'static) -> Stream<T> {
        let (size, explicit) = (self.record_size.clone(), self.size_explicit);
        let mut filtered = self.flat_map(move |r, out| if f(&r) { out.emit(r) } else { Ok(()) });
        filtered.record_size = size;
        filtered.size_explicit = explicit;
        filtered
    }

    /// Chains a stateful operator (its uid addresses its state).
    pub fn process<O, P, F>(self, uid: &str, factory: F) -> Stream<O>
    where
        O: Send + 'static,
        P: ProcessFunction<T, O>,
        F: Fn(&SubtaskInfo) -> P + Send + Sync + 'static,
    {
        register_uid(&self.graph, uid);
        let uid = uid.to_owned();
        let prev = self.attach;
        Stream {
            graph: self.graph,
            name: self.name,
            parallelism: self.parallelism,
            is_source: self.is_source,
            attach: Arc::new(move |ctx, next| {
                let info = ctx.info(&uid);
                let restored = ctx.restored(&uid);
                let f = factory(&info);
                prev(
                    ctx,
                    Box::new(ProcessNode {
                        info,
                        f,
                        restored,
                        next,
                        _i: PhantomData,
                    }),
                )
            }),
            record_size: None,
            size_explicit: false,
            reads: self.reads,
        }
    }

    /// How many bytes a record of this stream occupies, heap included (for example
    /// `|r| r.payload.len() + 64`), for the byte limit of the alignment buffer
    /// (`max_alignment_buffer_bytes`) at the stage this stream feeds through `key_by`, `rebalance`
    /// or `union`. A source's stream is weighed as its
    /// [`Source::record_size`](crate::runtime::Source::record_size) says (and stays so through
    /// `filter`); after `map`, `flat_map` or `process` a record counts `size_of::<T>()` unless
    /// this is set, which misses what it owns on the heap.
    pub fn record_size(mut self, size: impl Fn(&T) -> usize + Send + Sync + 'static) -> Self {
        self.record_size = Some(Arc::new(size));
        self.size_explicit = true;
        self
    }

    /// Partitions by key: records with the same key bytes go to the same subtask.
    pub fn key_by(self, key: impl Fn(&T) -> Vec<u8> + Send + Sync + 'static) -> KeyedStream<T> {
        KeyedStream {
            stream: self,
            key: Arc::new(key),
        }
    }

    /// Redistributes round robin to a new stage of `parallelism` subtasks.
    pub fn rebalance(self, parallelism: u32) -> Stream<T> {
        let name = format!("{}-rebalanced", self.name);
        connect(vec![(self, Partitioner::Rebalance)], name, parallelism)
    }

    /// Merges streams of the same type into one new stage (forward edges where parallelism is
    /// equal, round robin otherwise).
    pub fn union(self, others: Vec<Stream<T>>) -> Stream<T> {
        let parallelism = self.parallelism;
        let name = format!("{}-union", self.name);
        let inputs = std::iter::once(self)
            .chain(others)
            .map(|s| {
                let p = if s.parallelism == parallelism {
                    Partitioner::Forward
                } else {
                    Partitioner::Rebalance
                };
                (s, p)
            })
            .collect();
        connect(inputs, name, parallelism)
    }

    /// Ends the chain in a sink (same parallelism; use [`rebalance`](Self::rebalance) to change it).
    pub fn sink<S, F>(self, uid: &str, factory: F)
    where
        S: Sink<T>,
        F: Fn(&SubtaskInfo) -> S + Send + Sync + 'static,
    {
        register_uid(&self.graph, uid);
        let uid = uid.to_owned();
        let attach = self.attach;
        let make: MakeTask = Box::new(move |ctx| {
            let info = ctx.info(&uid);
            let restored = ctx.restored(&uid);
            let sink = factory(&info);
            // Counted as made: every sink subtask of the run before any opens.
            if let Some(p) = &ctx.proof {
                p.expected.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            attach(
                ctx,
                Box::new(SinkNode {
                    info,
                    sink,
                    restored,
                    buffer: Vec::new(),
                    proof: ctx.proof.clone(),
                    owner: ctx.storage.clone(),
                }),
            )
        });
        close_chain(&self.graph, self.reads);
        push_vertex(&self.graph, self.name, self.parallelism, self.is_source, make);
    }

    /// Sends every record to each of `names.len()` new stages, one per name, with this stream's
    /// parallelism (subtask i feeds subtask i of every branch): one reading of the input feeding
    /// several chains and sinks. Every branch sees every record and every barrier, so sinks of
    /// all branches pre-commit at the same barrier and commit when that one checkpoint
    /// completes. Every branch must end in a sink (or a stage boundary).
    pub fn fan_out(self, names: &[&str]) -> Vec<Stream<T>>
    where
        T: Clone,
    {
        let graph = self.graph.clone();
        {
            let mut g = graph.borrow_mut();
            let distinct: BTreeSet<&str> = names.iter().copied().collect();
            if (names.is_empty() || distinct.len() != names.len()) && g.error.is_none() {
                g.error = Some(CoreError::InvalidJob(format!(
                    "{}: fan_out needs at least one branch, each with its own name (got {names:?})",
                    self.name
                )));
            }
        }
        let parallelism = self.parallelism;
        let size: RecordSize<T> = self
            .record_size
            .clone()
            .unwrap_or_else(|| Arc::new(|_: &T| std::mem::size_of::<T>()));
        let branches: Vec<(String, Arc<InputSlots<T>>, usize)> = names
            .iter()
            .map(|name| {
                let slots = Arc::new(InputSlots::<T> {
                    parallelism,
                    receivers: Mutex::new(Vec::new()),
                    senders: Mutex::new(Vec::new()),
                    inputs: Mutex::new(1),
                });
                let mut g = graph.borrow_mut();
                g.inputs.push(slots.clone());
                let at = g.inputs.len() - 1;
                g.unread.insert(at);
                ((*name).to_owned(), slots, at)
            })
            .collect();
        let senders_of: Vec<Arc<InputSlots<T>>> = branches.iter().map(|(_, s, _)| s.clone()).collect();
        let attach = self.attach;
        let task_name = self.name.clone();
        let make: MakeTask = Box::new(move |ctx| {
            let targets: Vec<_> = senders_of
                .iter()
                .map(|s| (s.senders.lock().expect("not poisoned")[ctx.index as usize].clone(), 0))
                .collect();
            let out = ChannelOut {
                task: format!("{task_name}[{}]", ctx.index),
                buffers: targets.iter().map(|_| Vec::new()).collect(),
                targets,
                partitioner: Partitioner::Copy {
                    clone: Arc::new(T::clone),
                },
                next_target: 0,
                pending_watermark: None,
                pending_idle: false,
            };
            attach(ctx, Box::new(out))
        });
        close_chain(&graph, self.reads);
        push_vertex(&graph, self.name, parallelism, self.is_source, make);
        branches
            .into_iter()
            .map(|(name, slots, at)| {
                let size = size.clone();
                let attach: Attach<T> = Arc::new(move |ctx, out| {
                    let rx = slots
                        .take_receiver(ctx.index)
                        .ok_or_else(|| CoreError::InvalidJob("input channel taken twice (internal error)".into()))?;
                    Ok(input_task(ctx, rx, 1, out, size.clone()))
                });
                Stream {
                    graph: graph.clone(),
                    name,
                    parallelism,
                    is_source: false,
                    attach,
                    record_size: self.record_size.clone(),
                    size_explicit: self.size_explicit,
                    reads: Some(at),
                }
            })
            .collect()
    }
}

impl<T: Send + 'static> KeyedStream<T> {
    /// A stateful keyed operator in a new stage of `parallelism` subtasks.
    pub fn process<O, P, F>(self, uid: &str, parallelism: u32, factory: F) -> Stream<O>
    where
        O: Send + 'static,
        P: KeyedProcessFunction<T, O>,
        F: Fn(&SubtaskInfo) -> P + Send + Sync + 'static,
    {
        let max_parallelism = self.stream.graph.borrow().config.max_parallelism;
        let graph = self.stream.graph.clone();
        check_parallelism(&graph, uid, parallelism);
        register_uid(&graph, uid);
        let key = self.key.clone();
        let part = Partitioner::Hash {
            key: self.key,
            max_parallelism,
        };
        let inner = connect(vec![(self.stream, part)], uid.to_owned(), parallelism);
        let uid = uid.to_owned();
        let prev = inner.attach;
        Stream {
            graph: inner.graph,
            name: inner.name,
            parallelism,
            is_source: false,
            attach: Arc::new(move |ctx, next| {
                let info = ctx.info(&uid);
                let restored = ctx.restored(&uid);
                let f = factory(&info);
                let make_backend = ctx.backend.clone();
                prev(
                    ctx,
                    Box::new(KeyedNode {
                        info,
                        f,
                        key: key.clone(),
                        backend: None,
                        make_backend,
                        restored,
                        next,
                    }),
                )
            }),
            record_size: None,
            size_explicit: false,
            reads: inner.reads,
        }
    }
}
