//! Wiring a query: its sources, its stages' tasks, its merge and its sink,
//! and the sources started for a group of queries together.

use super::*;

impl Live {
    /// Starts a query's tasks up to its sink, restored from its checkpoint
    /// if it has one; its inputs join `group`.
    pub(super) fn wire(&self, query: NamedQuery, group: &mut Group) -> Result<Wired> {
        let NamedQuery {
            query:
                RunnableQuery {
                    mut graph,
                    mut sink,
                },
            name,
            ..
        } = query;
        let checkpoints = match (&self.coordinator, &name) {
            (Some(coordinator), Some(name)) => Some(Arc::new(QueryCheckpoints::open(
                coordinator.clone(),
                name,
                graph.stats.clone(),
            )?)),
            _ => None,
        };
        let shapes = crate::runtime::checkpoint::graph_shapes(&mut graph)?;
        let allow = name
            .as_ref()
            .is_some_and(|n| self.lock().allow_non_restored.remove(n));
        let positions = match &checkpoints {
            Some(checkpoints) if allow => {
                checkpoints.restore_allowing(&mut graph, sink.as_mut(), true)?
            }
            Some(checkpoints) => checkpoints.restore(&mut graph, sink.as_mut())?,
            None => None,
        };
        // The checkpoint restored, for the disk buffers: right after a
        // restore, it is the only checkpoint kept that this run knows.
        let restored = match (&checkpoints, &positions) {
            (Some(checkpoints), Some(sources)) => {
                checkpoints.oldest_kept().map(|id| (id, sources.clone()))
            }
            _ => None,
        };
        let positions = positions.or_else(|| {
            let name = name.as_ref()?;
            self.lock().start_positions.get(name).cloned()
        });
        let QueryGraph {
            inputs,
            join,
            stages,
            mode,
            schema,
            stats,
            late_outputs,
            ..
        } = graph;
        let time_column = crate::runtime::latency_column(
            &schema,
            inputs.first().and_then(|input| {
                let stream = &input.stream;
                stream
                    .event_time
                    .map(|i| stream.schema.field(i).name().as_str())
            }),
        );
        if let Some(errors) = sink.client_errors() {
            let _ = stats.sink_errors.set(errors);
        }
        let mut tasks = Vec::new();
        let mut wired = Wired {
            stats: stats.clone(),
            shapes,
            checkpoints: checkpoints.clone(),
            ..Wired::default()
        };
        let mut wiring = Wiring {
            tasks: &mut tasks,
            stats: &stats,
            checkpoints: checkpoints.as_ref(),
        };
        for (stream, output) in late_outputs {
            group.late_outputs.entry(stream).or_default().push(output);
        }
        let per_record = mode == ExecutionMode::PerRecord;
        let mut branches = Vec::with_capacity(inputs.len());
        for (i, input) in inputs.into_iter().enumerate() {
            let (tx, rx) = wiring.channel(format!("in{i} source"), &input_prefix(i, 0));
            let rx = if per_record { rx.per_record() } else { rx };
            let stream = &input.stream;
            let position = positions
                .as_ref()
                .and_then(|p| position_of(p, &stream.name));
            let key = SourceKey::new(&stream.name, position.as_ref());
            let buffer = match stream.buffer.disk_bytes() {
                Some(max_bytes) => {
                    let place = self.buffer_place(name.as_deref(), i, &stream.name, &restored)?;
                    let opened =
                        BufferedSender::open(tx.clone(), max_bytes, place, checkpoints.clone())?;
                    // The drain reads the buffer's files: on a thread of its
                    // own, not a worker of the runtime.
                    let drain = opened.1;
                    wiring.tasks.push(tokio::task::spawn_blocking(move || {
                        futures::executor::block_on(drain)
                    }));
                    Some(Arc::new(opened.0))
                }
                None => None,
            };
            group
                .sources
                .entry(key.clone())
                .or_insert_with(|| (stream.clone(), Vec::new(), position))
                .1
                .push(Subscriber {
                    tx,
                    checkpoints: checkpoints.clone(),
                    buffer,
                });
            if !wired.streams.contains(&key) {
                wired.streams.push(key);
            }
            let prefix = move |j| input_prefix(i, j);
            let output = spawn_stages(input.stages, rx, &prefix, &mut wiring);
            branches.push((output, stream.idle_timeout));
        }
        let merged = if branches.len() == 1 && join.is_none() {
            branches.pop().expect("one input").0
        } else {
            merge::spawn(branches, join, &stage_prefix(0), &mut wiring)
        };
        let output = spawn_stages(stages, merged, &stage_prefix, &mut wiring);
        let (sink_stats, sink_checkpoints) = (stats.clone(), checkpoints.clone());
        wiring.tasks.push(tokio::task::spawn_blocking(move || {
            run_sink(sink, output, &sink_stats, sink_checkpoints, time_column)
        }));
        wired.tasks = tasks;
        Ok(wired)
    }

    /// Where input `input` (reading `stream`) of query `name` keeps its disk
    /// buffer, and what the checkpoint restored (`restored`) says of it.
    pub(super) fn buffer_place(
        &self,
        name: Option<&str>,
        input: usize,
        stream: &str,
        restored: &Option<(u64, Vec<SourceEntry>)>,
    ) -> Result<BufferPlace> {
        // The buffers are local files: beside a store on the local file
        // system, in a temporary folder beside one on an object store.
        let root = self
            .coordinator
            .as_ref()
            .and_then(|c| c.config().dir.local_path());
        let dir = match (root, name) {
            (Some(root), Some(name)) => Some(buffer_dir(&root, name, input, stream)?),
            _ => None,
        };
        let restored = restored.as_ref().and_then(|(id, sources)| {
            let entry = sources.iter().find(|s| s.stream == stream)?;
            Some((*id, entry.clone()))
        });
        Ok(BufferPlace { dir, restored })
    }

    /// Starts one source per stream of a group: a push stream's hub, the
    /// late rows of the group's queries, or a reading of its own. Returns,
    /// per stream, its counters and what its source ended with.
    pub(super) fn start_sources(&self, group: Group) -> Result<HashMap<SourceKey, SourceHandle>> {
        let Group {
            sources,
            late_outputs,
        } = group;
        let mut handles = HashMap::new();
        // Barriers asked for from now on go through the group's sources.
        let first_barrier = self.coordinator.as_ref().map_or(0, |c| c.first_barrier());
        let mut state = self.lock();
        for (key, (stream, subscribers, position)) in sources {
            let (done_tx, done) = watch::channel(None);
            let stats = if stream.source.location == SourceLocation::Push {
                let hub = state.hubs.entry(stream.name.clone()).or_default();
                if let (Some(wal), Some(position)) = (hub.wal.clone(), position) {
                    report_buffers(&subscribers, &hub.stats);
                    let live = self.clone();
                    let gate = hub.gate.clone();
                    let name = stream.name.clone();
                    let joining = Joining::start(&hub.joining);
                    tokio::spawn(async move {
                        live.join_replayed(&name, &wal, &gate, position.rows, subscribers)
                            .await;
                        drop(joining);
                    });
                    let _ = done_tx.send(Some(Ok(())));
                    handles.insert(key, (hub.stats.clone(), done));
                    continue;
                }
                for subscriber in subscribers {
                    if let Some(buffer) = &subscriber.buffer {
                        buffer.report_to(hub.stats.clone());
                    }
                    if hub.ended {
                        end_soon(subscriber);
                    } else {
                        hub.subscribers.push(subscriber);
                    }
                }
                let _ = done_tx.send(Some(Ok(())));
                hub.stats.clone()
            } else {
                let stats = Arc::new(SourceStats::default());
                report_buffers(&subscribers, &stats);
                let task_stats = stats.clone();
                let coordinator = self.coordinator.clone().map(|c| (c, first_barrier));
                let late = stream.late_of.as_ref().map(|of| {
                    let (tx, rx) = mpsc::unbounded_channel();
                    for output in late_outputs.get(of).into_iter().flatten() {
                        output.subscribe(tx.clone());
                    }
                    rx
                });
                tokio::spawn(async move {
                    let outcome = match late {
                        Some(rx) => run_late_source(rx, subscribers, task_stats).await,
                        None => {
                            let config = stream.source.clone();
                            tokio::task::spawn_blocking(move || {
                                run_source(&config, &task_stats, subscribers, position, coordinator)
                            })
                            .await
                            .unwrap_or_else(|e| {
                                Err(Error::Connector(format!("a task failed: {e}")))
                            })
                        }
                    };
                    let _ = done_tx.send(Some(outcome.map_err(|e| e.to_string())));
                });
                stats
            };
            handles.insert(key, (stats, done));
        }
        Ok(handles)
    }
}

/// Adds the disk buffers of `subscribers` to their source's counters.
fn report_buffers(subscribers: &[Subscriber], stats: &Arc<SourceStats>) {
    for buffer in subscribers.iter().filter_map(|s| s.buffer.as_ref()) {
        buffer.report_to(stats.clone());
    }
}

/// Sends the end of input to a query that joins a stream which has ended:
/// at once when it has room (and no disk buffer), else from a task.
pub(super) fn end_soon(subscriber: Subscriber) {
    if subscriber.buffer.is_none() && subscriber.tx.try_send(Message::Watermark(END_OF_INPUT)) {
        return;
    }
    tokio::spawn(async move {
        subscriber
            .send_message(Message::Watermark(END_OF_INPUT))
            .await;
    });
}

/// Where a checkpoint left `stream`.
fn position_of(sources: &[SourceEntry], stream: &str) -> Option<SourcePosition> {
    sources
        .iter()
        .find(|s| s.stream == stream)
        .and_then(|s| s.position.clone())
}

/// A task of a query that ends with its source's error, or when the
/// source ends.
pub(super) fn watch_source(mut done: SourceDone) -> JoinHandle<Result<()>> {
    tokio::spawn(async move {
        loop {
            if let Some(outcome) = done.borrow().clone() {
                return outcome.map_err(Error::Connector);
            }
            if done.changed().await.is_err() {
                return Ok(());
            }
        }
    })
}
