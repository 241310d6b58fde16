//! The runtime: tokio tasks joined by bounded channels.
//!
//! Each stream used by a run gets one source task, which reads it once and
//! fans its batches out to every query over it. Each query is a line of
//! tasks (one per fused operator chain, or several instances of a chain
//! whose state is per key, joined by exchanges: see [`exchange`]) ending
//! in a sink task. Channels are
//! bounded, so a slow sink slows the source instead of buffering without
//! limit. At the end of a finite input the source sends the final
//! watermark, every window fires, and the tasks end in order.

pub mod autoscale;
pub mod buffer;
pub mod channel;
pub mod checkpoint;
mod exchange;
mod frames;
pub mod live;
mod merge;
pub mod spill;
pub mod wal;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use datafusion::arrow::record_batch::RecordBatch;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::connector::{Sink, SourceConfig, SourceLocation, SourcePosition, SourceStats};
use crate::error::{Error, Result};
use crate::exec::metrics::QueueGauge;
use crate::exec::{Chain, END_OF_INPUT, Message, QueryStats};
use crate::planner::{QueryGraph, Stages};
use crate::text::read_source_from;
use channel::{Receiver, Sender};
use checkpoint::{Coordinator, QueryCheckpoints};
use exchange::{Inbox, Outbox};
use live::Live;

/// A planned query and where its results go.
pub struct RunnableQuery {
    /// The operator graph.
    pub graph: QueryGraph,
    /// The sink receiving its results.
    pub sink: Box<dyn Sink>,
}

/// What a finished run counted.
#[derive(Debug, Default, Clone)]
pub struct RunReport {
    /// Per stream read: its name and counters.
    pub streams: Vec<(String, Arc<SourceStats>)>,
    /// Per query, in the order given.
    pub queries: Vec<Arc<QueryStats>>,
}

/// Runs `queries` until their inputs end; returns the counters, or the
/// first error any task met.
pub async fn run(queries: Vec<RunnableQuery>) -> Result<RunReport> {
    run_observed(queries, |_| {}).await
}

/// Runs like [`run`]; `started` gets the counters once every task is
/// started, while they are still being updated: to show progress, or to
/// stop the sources early (see [`SourceStats::stop`]).
///
/// A fixed set of queries is a live session whose queries are all known at
/// the start: they are started together on a [`Live`] runtime (so queries
/// over the same stream share one reading of it) and waited for.
pub async fn run_observed(
    queries: Vec<RunnableQuery>,
    started: impl FnOnce(&RunReport),
) -> Result<RunReport> {
    for query in &queries {
        for input in &query.graph.inputs {
            if input.stream.source.location == SourceLocation::Push {
                return Err(Error::Plan(format!(
                    "stream {} is fed by its program (connector 'push'); `vigil run` cannot read it: embed vigil or use `vigil serve`",
                    input.stream.name
                )));
            }
        }
    }
    let labelled = queries
        .into_iter()
        .enumerate()
        .map(|(i, query)| live::NamedQuery {
            query,
            label: format!("q{}", i + 1),
            name: None,
        })
        .collect();
    run_on(&Live::new(), labelled, started).await
}

/// Runs `queries` together on `live` (see [`Live::start_all`]) until they
/// end, like [`run_observed`]: with checkpoints on `live`, named queries
/// are restored and checkpointed.
pub async fn run_on(
    live: &Live,
    queries: Vec<live::NamedQuery>,
    started: impl FnOnce(&RunReport),
) -> Result<RunReport> {
    let ids = live.start_all(queries)?;
    let report = live.report(&ids);
    started(&report);
    let mut first_error = None;
    for id in ids {
        if let Err(e) = live.wait(id).await {
            first_error.get_or_insert(e);
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(report),
    }
}

/// What the tasks of one query are started with: where their handles go,
/// where their counters are registered, and where their snapshots go.
pub(crate) struct Wiring<'a> {
    /// The tasks started so far.
    pub tasks: &'a mut Vec<JoinHandle<Result<()>>>,
    /// The query's counters: every channel and operator is registered.
    pub stats: &'a Arc<QueryStats>,
    /// Where the query collects its checkpoints, if it takes them.
    pub checkpoints: Option<&'a Arc<QueryCheckpoints>>,
}

impl Wiring<'_> {
    /// A channel whose gauge is registered with the query as `label`.
    fn channel(&self, label: String, stage: &str) -> (Sender, Receiver) {
        let gauge = Arc::new(QueueGauge::new(label, stage));
        self.stats.metrics.add_queue(gauge.clone());
        channel::channel(gauge)
    }
}

/// Tasks whose output is not wired yet: each with its chain (`None` for the
/// input itself, read by whatever comes next) and where it reads from.
type Upstream = Vec<(Option<Chain>, Inbox)>;

/// Starts the tasks of every stage, chained: an instance per chain of a
/// stage, with exchanges where the number of instances or the key changes;
/// returns the last stage's output. Stage J is named `prefix(J)`: its
/// operators' metrics and snapshots (ids `prefix(J).oK`) go by that name.
fn spawn_stages(
    stages: Stages,
    input: Receiver,
    prefix: &dyn Fn(usize) -> String,
    wiring: &mut Wiring<'_>,
) -> Receiver {
    let mut upstream: Upstream = vec![(None, Inbox::One(input))];
    let count = stages.len();
    for (j, stage) in stages.into_iter().enumerate() {
        let n = stage.instances.len();
        let inboxes = connect(upstream, n, stage.keys, &prefix(j), wiring);
        upstream = stage
            .instances
            .into_iter()
            .zip(inboxes)
            .enumerate()
            .map(|(instance, (ops, inbox))| {
                let mut chain = Chain::placed(ops, &prefix(j), instance);
                for metrics in chain.metrics() {
                    wiring.stats.metrics.add_operator(metrics.clone());
                }
                if let Some(checkpoints) = wiring.checkpoints {
                    let sink = checkpoints.chain_sink(&prefix(j), &chain, instance, n);
                    chain = chain.with_snapshots(sink);
                }
                (Some(chain), inbox)
            })
            .collect();
    }
    let after = prefix(count);
    match connect(upstream, 1, None, &after, wiring).pop() {
        Some(Inbox::One(rx)) => rx,
        Some(gather) => {
            let (tx, rx) = wiring.channel(format!("{after} gather"), &after);
            let meet = run_stage(Chain::new(Vec::new()), gather, Outbox::One(tx));
            wiring.tasks.push(tokio::spawn(meet));
            rx
        }
        None => unreachable!("connect gives one inbox per instance"),
    }
}

/// Starts the `upstream` tasks, their outputs feeding `n` new inboxes of
/// stage `stage`: one channel when both sides are single, else a channel
/// from every upstream task to every instance, rows routed by `keys`.
fn connect(
    mut upstream: Upstream,
    n: usize,
    keys: Option<Vec<Arc<dyn datafusion::physical_expr::PhysicalExpr>>>,
    stage: &str,
    wiring: &mut Wiring<'_>,
) -> Vec<Inbox> {
    let m = upstream.len();
    if m == 1 && n == 1 {
        let (chain, inbox) = upstream.pop().expect("one upstream task");
        let Some(chain) = chain else {
            return vec![inbox];
        };
        let (tx, rx) = wiring.channel(stage.to_string(), stage);
        wiring
            .tasks
            .push(tokio::spawn(run_stage(chain, inbox, Outbox::One(tx))));
        return vec![Inbox::One(rx)];
    }
    let mut receivers: Vec<Vec<Receiver>> = (0..n).map(|_| Vec::new()).collect();
    for (from, (chain, inbox)) in upstream.into_iter().enumerate() {
        let mut senders = Vec::with_capacity(n);
        for (to, column) in receivers.iter_mut().enumerate() {
            let (tx, rx) = wiring.channel(format!("{stage} i{to} from {from}"), stage);
            senders.push(tx);
            column.push(rx);
        }
        let outbox = match (n, &keys) {
            (1, _) | (_, None) => Outbox::One(senders.remove(0)),
            (_, Some(keys)) => Outbox::Route(exchange::Router::new(senders, keys.clone(), m == 1)),
        };
        let chain = chain.unwrap_or_else(|| Chain::new(Vec::new()));
        wiring
            .tasks
            .push(tokio::spawn(run_stage(chain, inbox, outbox)));
    }
    receivers
        .into_iter()
        .map(|mut inputs| match inputs.len() {
            1 => Inbox::One(inputs.remove(0)),
            _ => Inbox::Gather(exchange::Gather::new(inputs)),
        })
        .collect()
}

/// A query reading a source.
#[derive(Clone)]
struct Subscriber {
    tx: Sender,
    /// Where the query collects its checkpoints, if it takes them.
    checkpoints: Option<Arc<QueryCheckpoints>>,
    /// The query's disk buffer for this input, if it has one: then every
    /// message goes through it.
    buffer: Option<Arc<buffer::BufferedSender>>,
}

impl Subscriber {
    /// Sends `message` from async code (through the disk buffer, if any);
    /// false once the query has stopped listening.
    async fn send_message(&self, message: Message) -> bool {
        match &self.buffer {
            Some(buffer) => buffer.send(message).await,
            None => self.tx.send(message).await.is_ok(),
        }
    }

    /// Sends `message` like [`Subscriber::send_message`], from a thread
    /// outside the async runtime.
    fn blocking_send_message(&self, message: Message) -> bool {
        match &self.buffer {
            Some(buffer) => buffer.blocking_send(message),
            None => self.tx.blocking_send(message).is_ok(),
        }
    }

    /// Notes where the source stood at barrier `id` with the query's
    /// checkpoints (and for a source that cannot be read again, where the
    /// disk buffer stood).
    fn add_source(&self, id: u64, stream: &str, position: Option<SourcePosition>) {
        if let Some(checkpoints) = &self.checkpoints {
            let buffer = self
                .buffer
                .as_ref()
                .and_then(|b| b.mark_barrier(id, position.is_some()));
            checkpoints.add_source(id, stream, position, buffer);
        }
    }

    /// Sends a batch from async code; false once the query has stopped
    /// listening.
    async fn send_async(&self, batch: &RecordBatch) -> bool {
        self.send_message(Message::Batch(batch.clone())).await
    }

    /// Sends a batch; false once the query has stopped listening.
    fn send(&self, batch: &RecordBatch) -> bool {
        if batch.num_rows() == 0 {
            // A source that waits for input: nothing to send.
            return !self.tx.is_closed();
        }
        self.blocking_send_message(Message::Batch(batch.clone()))
    }

    /// Nanoseconds its sender has waited so far (with a disk buffer, the
    /// source's waits for it, not the buffer's for the query).
    fn blocked_ns(&self) -> u64 {
        match &self.buffer {
            Some(buffer) => buffer.counters().blocked_ns.load(Ordering::Relaxed),
            None => self.tx.gauge().blocked_ns.load(Ordering::Relaxed),
        }
    }
}

/// Nanoseconds `subscribers` have waited so far, together: a source sends
/// to them one after the other, so this is how long it was held up.
fn blocked_ns(subscribers: &[Subscriber]) -> u64 {
    subscribers.iter().map(Subscriber::blocked_ns).sum()
}

/// Feeds `late(stream)` queries the rows other queries dropped as late.
async fn run_late_source(
    mut rows: mpsc::UnboundedReceiver<RecordBatch>,
    subscribers: Vec<Subscriber>,
    stats: Arc<SourceStats>,
) -> Result<()> {
    while let Some(batch) = rows.recv().await {
        stats
            .rows
            .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
        let before = blocked_ns(&subscribers);
        for subscriber in &subscribers {
            subscriber.send_async(&batch).await;
        }
        let waited = blocked_ns(&subscribers) - before;
        stats.blocked_ns.fetch_add(waited, Ordering::Relaxed);
    }
    if stats.stop.load(Ordering::Relaxed) {
        return Ok(());
    }
    for subscriber in &subscribers {
        subscriber
            .send_message(Message::Watermark(END_OF_INPUT))
            .await;
    }
    Ok(())
}

/// Reads a source from `start` (its beginning when `None`) and sends its
/// rows to every subscriber; with a coordinator, sends a checkpoint barrier
/// whenever a newer checkpoint is asked for.
fn run_source(
    config: &SourceConfig,
    stats: &SourceStats,
    subscribers: Vec<Subscriber>,
    start: Option<SourcePosition>,
    coordinator: Option<(Arc<Coordinator>, u64)>,
) -> Result<()> {
    let mut barriers = coordinator.map(|(c, sent)| Barriers::new(c, &config.stream, sent));
    // Until it sends rows, the source stands where it starts: a source
    // restored at its end sends none, and must not record that it ended
    // anywhere else (a later restore would read it again).
    if let Some(start) = &start {
        *stats.position.lock().unwrap_or_else(|e| e.into_inner()) = Some(start.clone());
    }
    let mut emit = |batch: RecordBatch| {
        let mut alive = false;
        let before = blocked_ns(&subscribers);
        for subscriber in &subscribers {
            alive |= subscriber.send(&batch);
        }
        let waited = blocked_ns(&subscribers) - before;
        stats.blocked_ns.fetch_add(waited, Ordering::Relaxed);
        crate::crashpoint::hit("read");
        if let Some(barriers) = &mut barriers
            && barriers.send_due(stats, &subscribers)
        {
            stats.stop.store(true, Ordering::Relaxed);
            return false;
        }
        alive
    };
    read_source_from(config, stats, start.as_ref(), &mut emit)?;
    if stats.stop.load(Ordering::Relaxed) {
        // Stopped, not ended: no final watermark, so open windows stay
        // unfired.
        return Ok(());
    }
    if let Some(barriers) = &mut barriers {
        barriers.send_due(stats, &subscribers);
        barriers.ended(stats, &subscribers);
    }
    for subscriber in &subscribers {
        subscriber.blocking_send_message(Message::Watermark(END_OF_INPUT));
    }
    Ok(())
}

/// Where `stats`'s source stands after the rows it has sent.
fn current_position(stats: &SourceStats) -> Option<SourcePosition> {
    stats
        .position
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// Sends a source's checkpoint barriers.
struct Barriers {
    coordinator: Arc<Coordinator>,
    stream: String,
    /// The last barrier sent (or asked for before the source started).
    sent: u64,
}

impl Barriers {
    /// Barriers for a source started when checkpoint `sent` was the
    /// newest asked for (it belongs to no query of this source).
    fn new(coordinator: Arc<Coordinator>, stream: &str, sent: u64) -> Self {
        Self {
            coordinator,
            stream: stream.to_string(),
            sent,
        }
    }

    /// Sends the barrier of the newest checkpoint asked for, if not sent
    /// yet, after recording the source's position with every subscriber;
    /// true if the source must stop after it (a savepoint on stop).
    fn send_due(&mut self, stats: &SourceStats, subscribers: &[Subscriber]) -> bool {
        let rows = stats.rows.load(Ordering::Relaxed);
        if self.coordinator.stop_due(rows) {
            self.coordinator.stop();
        }
        let stop_after = stats.stop_after.load(Ordering::Acquire);
        if stop_after != 0 && self.sent >= stop_after {
            // Its barrier went before the stop was asked for.
            return true;
        }
        let id = self.coordinator.requested();
        if id <= self.sent || self.coordinator.holds_stop(id, rows) {
            return false;
        }
        self.sent = id;
        let position = current_position(stats);
        for subscriber in subscribers {
            subscriber.add_source(id, &self.stream, position.clone());
            subscriber.blocking_send_message(Message::Barrier(id));
        }
        self.coordinator.stops_at(id) || (stop_after != 0 && id >= stop_after)
    }

    /// The source read all of its input: checkpoints its queries complete
    /// later (their other inputs go on) record it as read to its end.
    fn ended(&self, stats: &SourceStats, subscribers: &[Subscriber]) {
        let position = current_position(stats);
        for subscriber in subscribers {
            if let Some(checkpoints) = &subscriber.checkpoints {
                checkpoints.source_ended(&self.stream, position.clone());
            }
        }
    }
}

async fn run_stage(mut chain: Chain, mut input: Inbox, mut output: Outbox) -> Result<()> {
    let mut ticker = chain.tick_interval().map(|period| {
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker
    });
    loop {
        let produced = tokio::select! {
            message = input.recv() => match message? {
                Some(message) => chain.process(message)?,
                None => return Ok(()),
            },
            _ = next_tick(&mut ticker) => chain.tick()?,
        };
        let before = output.blocked_ns();
        let alive = output.send(produced).await?;
        if let Some(last) = chain.metrics().last() {
            let waited = output.blocked_ns() - before;
            last.blocked_ns.fetch_add(waited, Ordering::Relaxed);
        }
        if !alive {
            return Ok(());
        }
        if chain.finished() {
            return Ok(());
        }
    }
}

/// Waits for the next tick, or forever when the chain wants none.
async fn next_tick(ticker: &mut Option<tokio::time::Interval>) {
    match ticker {
        Some(ticker) => {
            ticker.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Writes a query's results; at a barrier, commits the sink and completes
/// the query's checkpoint. `time_column` names the result column that says
/// which event time a result row is about, to measure result latency.
fn run_sink(
    mut sink: Box<dyn Sink>,
    mut input: Receiver,
    stats: &QueryStats,
    checkpoints: Option<Arc<QueryCheckpoints>>,
    time_column: Option<usize>,
) -> Result<()> {
    if checkpoints.is_none()
        && let Some(why) = sink.needs_checkpoints()
    {
        return Err(Error::Plan(why));
    }
    let mut ended = false;
    while let Some(message) = input.blocking_recv() {
        match message {
            Message::Batch(batch) => {
                count_out(&batch, stats, time_column);
                sink.write(&batch)?;
            }
            Message::Changes(batch, kind) => {
                count_out(&batch, stats, time_column);
                sink.write_changes(&batch, kind)?;
            }
            Message::Barrier(id) => {
                if let Some(checkpoints) = &checkpoints {
                    sink.sources_at_barrier(&checkpoints.source_positions(id))?;
                    let commit = sink.checkpoint()?;
                    crate::crashpoint::hit("before-manifest");
                    if checkpoints.complete(id, commit) {
                        crate::crashpoint::hit("after-manifest");
                        sink.committed()?;
                        crate::crashpoint::hit("committed");
                    }
                }
            }
            Message::Watermark(w) if w != END_OF_INPUT => {
                stats.watermark.store(w, Ordering::Relaxed);
                sink.watermark(w)?;
            }
            Message::Watermark(_) => ended = true,
            Message::Epoch => {}
        }
    }
    match ended {
        true => sink.finish(),
        false => sink.stopped(),
    }
}

/// Counts result rows and their latency.
fn count_out(batch: &RecordBatch, stats: &QueryStats, time_column: Option<usize>) {
    stats
        .rows_out
        .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
    if let Some(column) = time_column {
        observe_latency(batch, column, stats);
    }
}

/// Which result column says what event time a row is about: a window's
/// end, an alert's event time, or else the stream's own time column when
/// the query keeps it. `None` when the results have none of them.
fn latency_column(
    schema: &datafusion::arrow::datatypes::Schema,
    stream_time: Option<&str>,
) -> Option<usize> {
    let timestamp = |name: &str| {
        schema.index_of(name).ok().filter(|&i| {
            matches!(
                schema.field(i).data_type(),
                datafusion::arrow::datatypes::DataType::Timestamp(..)
            )
        })
    };
    ["window_end", "event_time"]
        .into_iter()
        .chain(stream_time)
        .find_map(timestamp)
}

/// Records, for each row of `batch`, wall clock now minus its event time.
fn observe_latency(batch: &RecordBatch, column: usize, stats: &QueryStats) {
    use datafusion::arrow::datatypes::{DataType, TimeUnit, TimestampMillisecondType};
    let Some(times) = batch.columns().get(column) else {
        return;
    };
    let Ok(millis) =
        datafusion::arrow::compute::cast(times, &DataType::Timestamp(TimeUnit::Millisecond, None))
    else {
        return;
    };
    let now = chrono::Utc::now().timestamp_millis();
    let millis =
        datafusion::arrow::array::AsArray::as_primitive::<TimestampMillisecondType>(&millis);
    stats
        .metrics
        .latency
        .observe_all(millis.iter().flatten().map(|t| now.saturating_sub(t)));
}
