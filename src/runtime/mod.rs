//! The runtime: tokio tasks joined by bounded channels.
//!
//! Each stream used by a run gets one source task, which reads it once and
//! fans its batches out to every query over it. Each query is a line of
//! tasks (one per fused operator chain) ending in a sink task. Channels are
//! bounded, so a slow sink slows the source instead of buffering without
//! limit. At the end of a finite input the source sends the final
//! watermark, every window fires, and the tasks end in order.

pub mod live;
mod merge;
pub mod wal;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use datafusion::arrow::record_batch::RecordBatch;
use tokio::sync::mpsc::{self, Receiver, Sender};
use tokio::task::JoinHandle;

use crate::connectors::{Sink, SourceConfig, SourceLocation, SourceStats, read_source};
use crate::error::{Error, Result};
use crate::exec::{Chain, END_OF_INPUT, Message, QueryStats};
use crate::planner::{QueryGraph, Stages};
use live::Live;

/// Messages buffered between two tasks before the sender waits.
pub const CHANNEL_CAPACITY: usize = 16;

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
    let live = Live::new();
    let labelled = queries
        .into_iter()
        .enumerate()
        .map(|(i, q)| (q, format!("q{}", i + 1)))
        .collect();
    let ids = live.start_all(labelled)?;
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

/// Starts one task per stage, chained; returns the last one's output.
fn spawn_stages(
    stages: Stages,
    mut input: Receiver<Message>,
    tasks: &mut Vec<JoinHandle<Result<()>>>,
) -> Receiver<Message> {
    for stage in stages {
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        tasks.push(tokio::spawn(run_stage(Chain::new(stage), input, tx)));
        input = rx;
    }
    input
}

/// A query reading a source.
struct Subscriber {
    tx: Sender<Message>,
    /// Send rows one at a time rather than as the source's batches.
    per_record: bool,
}

impl Subscriber {
    /// Sends a batch from async code; false once the query has stopped
    /// listening.
    async fn send_async(&self, batch: &RecordBatch) -> bool {
        if !self.per_record {
            return self.tx.send(Message::Batch(batch.clone())).await.is_ok();
        }
        for row in 0..batch.num_rows() {
            if self
                .tx
                .send(Message::Batch(batch.slice(row, 1)))
                .await
                .is_err()
            {
                return false;
            }
        }
        true
    }

    /// Sends a batch; false once the query has stopped listening.
    fn send(&self, batch: &RecordBatch) -> bool {
        if !self.per_record {
            return self.tx.blocking_send(Message::Batch(batch.clone())).is_ok();
        }
        (0..batch.num_rows()).all(|row| {
            self.tx
                .blocking_send(Message::Batch(batch.slice(row, 1)))
                .is_ok()
        })
    }
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
        for subscriber in &subscribers {
            subscriber.send_async(&batch).await;
        }
    }
    if stats.stop.load(Ordering::Relaxed) {
        return Ok(());
    }
    for subscriber in &subscribers {
        let _ = subscriber.tx.send(Message::Watermark(END_OF_INPUT)).await;
    }
    Ok(())
}

fn run_source(
    config: &SourceConfig,
    stats: &SourceStats,
    subscribers: Vec<Subscriber>,
) -> Result<()> {
    let mut emit = |batch: RecordBatch| {
        let mut alive = false;
        for subscriber in &subscribers {
            alive |= subscriber.send(&batch);
        }
        alive
    };
    read_source(config, stats, &mut emit)?;
    if stats.stop.load(Ordering::Relaxed) {
        // Stopped, not ended: no final watermark, so open windows stay
        // unfired.
        return Ok(());
    }
    for subscriber in &subscribers {
        let _ = subscriber
            .tx
            .blocking_send(Message::Watermark(END_OF_INPUT));
    }
    Ok(())
}

async fn run_stage(
    mut chain: Chain,
    mut input: Receiver<Message>,
    output: Sender<Message>,
) -> Result<()> {
    let mut ticker = chain.tick_interval().map(|period| {
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker
    });
    loop {
        let produced = tokio::select! {
            message = input.recv() => match message {
                Some(message) => chain.process(message)?,
                None => return Ok(()),
            },
            _ = next_tick(&mut ticker) => chain.tick()?,
        };
        for out in produced {
            if output.send(out).await.is_err() {
                return Ok(());
            }
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

fn run_sink(
    mut sink: Box<dyn Sink>,
    mut input: Receiver<Message>,
    stats: &QueryStats,
) -> Result<()> {
    while let Some(message) = input.blocking_recv() {
        if let Message::Batch(batch) | Message::Changes(batch, _) = message {
            stats
                .rows_out
                .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
            sink.write(&batch)?;
        }
    }
    sink.finish()
}
