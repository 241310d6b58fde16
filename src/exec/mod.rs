//! Push-based streaming operators over Arrow `RecordBatch`es.
//!
//! An operator receives [`Message`]s (batches of rows, and watermarks that
//! say how far event time has advanced) and pushes what it produces into an
//! output vector. Stateless operators evaluate DataFusion `PhysicalExpr`s;
//! the window aggregate keeps per-(window, key) state in DataFusion
//! `GroupsAccumulator`s. Operators never block and never spawn: the runtime
//! decides which of them share a task.

mod aggregate;
mod alert;
mod batch;
mod changelog;
mod control;
mod filter;
mod invariant;
mod join;
mod limit;
mod mark;
pub mod metrics;
mod over;
mod peer;
mod project;
pub mod remote;
mod session;
pub mod shed;
mod time_union;
mod unnest;
mod watermark;
mod window_aggregate;
mod window_assign;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use datafusion::arrow::record_batch::RecordBatch;

pub use aggregate::AggregateSpec;
pub use alert::AlertOp;
pub use batch::{BatchInput, BatchOp, answer_once};
pub use changelog::{ChangelogAggregateOp, ChangelogAggregateSpec};
pub use control::{ControlFilter, ControlMode, ControlSpec};
pub use filter::FilterOp;
pub use invariant::InvariantOp;
pub use join::{WindowJoin, WindowJoinSpec};
pub use limit::LimitOp;
pub use mark::MarkOp;
pub use over::{OverFunction, OverOp, OverSpec};
pub use peer::{PeerOp, WindowEnd};
pub use project::ProjectOp;
pub use remote::RemoteInOp;
pub use session::{SessionAggregateOp, SessionAggregateSpec, SessionAssignOp};
pub use shed::{ShedConfig, ShedLedger, ShedOp, ShedOutput, ShedPolicy, ShedSettings, ShedWindows};
pub use time_union::TimeOrderedUnion;
pub use unnest::UnnestOp;
pub use watermark::WatermarkOp;
pub use window_aggregate::{
    GroupSlot, WindowAggregateOp, WindowAggregateSpec, WindowGrid, WindowInput,
};
pub use window_assign::WindowAssignOp;

use crate::connector::RowKind;
use crate::error::Result;

/// What flows between operators.
#[derive(Debug, Clone)]
pub enum Message {
    /// Rows.
    Batch(RecordBatch),
    /// Result rows that say what they are (an update, an early result).
    Changes(RecordBatch, RowKind),
    /// Event time has reached this many milliseconds since the epoch: no
    /// row with a smaller event time will be accepted into an open window.
    /// `i64::MAX` marks the end of a finite input.
    Watermark(i64),
    /// Checkpoint barrier `id`: everything before it belongs to the
    /// checkpoint, everything after to the next. Operators never see it:
    /// the [`Chain`] snapshots each operator as the barrier passes it and
    /// hands the barrier on.
    Barrier(u64),
    /// The end of an epoch of rows that an exchange split between the
    /// instances of a key-partitioned stage: where their outputs meet, what
    /// each instance produced before it is handed on in instance order, so
    /// the result does not depend on thread timing. Operators never see
    /// it: a [`Chain`] hands it on after what the rows before it produced.
    Epoch,
}

/// The watermark that marks the end of input: every open window fires.
pub const END_OF_INPUT: i64 = i64::MAX;

/// Where window operators send the rows they drop as late, for queries
/// over `late(stream)`. The runtime subscribes those queries' inputs before
/// the run starts; once every operator holding it is gone, their inputs end.
#[derive(Debug, Default)]
pub struct LateRows {
    subscribers: std::sync::Mutex<Vec<tokio::sync::mpsc::UnboundedSender<RecordBatch>>>,
}

impl LateRows {
    /// Adds a receiver of late rows.
    pub fn subscribe(&self, tx: tokio::sync::mpsc::UnboundedSender<RecordBatch>) {
        self.subscribers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tx);
    }

    /// Sends dropped rows to every subscriber.
    pub fn send(&self, batch: &RecordBatch) {
        if batch.num_rows() == 0 {
            return;
        }
        let subscribers = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        for tx in subscribers.iter() {
            let _ = tx.send(batch.clone());
        }
    }
}

/// Sends the rows of `batch` whose `keep` is false to `late`.
/// `batch` with the columns of `output`, cast where DataFusion typed a
/// column more narrowly (or named it otherwise) than the plan's schema says.
pub(crate) fn conform(
    batch: &RecordBatch,
    output: &datafusion::arrow::datatypes::SchemaRef,
) -> Result<RecordBatch> {
    let columns = batch
        .columns()
        .iter()
        .zip(output.fields())
        .map(|(c, f)| match c.data_type() == f.data_type() {
            true => Ok(c.clone()),
            false => datafusion::arrow::compute::cast(c, f.data_type()),
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new(output.clone(), columns)?)
}

/// A per-key map's entries in key order, and the key columns they start a
/// state table with.
pub(crate) type SortedKeys<'a, T> = (
    Vec<(&'a datafusion::arrow::row::OwnedRow, &'a T)>,
    Vec<datafusion::arrow::array::ArrayRef>,
);

/// The entries of a per-key map in key order (so a snapshot does not
/// depend on hash order), and the key columns they start a state table
/// with (none for an operator without keys).
pub(crate) fn sorted_keys<'a, T>(
    keys: &'a std::collections::HashMap<datafusion::arrow::row::OwnedRow, T>,
    converter: &datafusion::arrow::row::RowConverter,
    keyed: bool,
) -> Result<SortedKeys<'a, T>> {
    let mut sorted: Vec<_> = keys.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let columns = match keyed {
        true => converter.convert_rows(sorted.iter().map(|(k, _)| k.row()))?,
        false => Vec::new(),
    };
    Ok((sorted, columns))
}

fn send_late(late: &LateRows, batch: &RecordBatch, keep: &[bool]) -> Result<()> {
    let mask: datafusion::arrow::array::BooleanArray = keep.iter().map(|k| Some(!k)).collect();
    late.send(&datafusion::arrow::compute::filter_record_batch(
        batch, &mask,
    )?);
    Ok(())
}

/// Counters one query's operators update, read for the run summary.
#[derive(Debug)]
pub struct QueryStats {
    /// Result rows produced.
    pub rows_out: AtomicU64,
    /// Rows dropped because every window they belong to had closed.
    pub late_rows: AtomicU64,
    /// Input rows its load shedder dropped.
    pub shed_rows: AtomicU64,
    /// The last watermark its sink saw, in epoch milliseconds (`i64::MIN`
    /// before the first): wall clock minus this is its watermark lag.
    pub watermark: std::sync::atomic::AtomicI64,
    /// Its queues, operators and result latency.
    pub metrics: metrics::QueryMetrics,
    /// The counters of the streams it reads, set by the runtime once it
    /// has started their sources: its load shedder counts its dropped rows
    /// in their `shed_rows` too.
    pub sources: std::sync::OnceLock<Vec<std::sync::Arc<crate::connector::SourceStats>>>,
    /// The errors its sink's client met and retried, when the sink counts
    /// them (see [`Sink::client_errors`](crate::connector::Sink::client_errors)):
    /// set by the runtime when it starts the query.
    pub sink_errors: std::sync::OnceLock<std::sync::Arc<AtomicU64>>,
}

impl Default for QueryStats {
    fn default() -> Self {
        Self {
            rows_out: AtomicU64::new(0),
            late_rows: AtomicU64::new(0),
            shed_rows: AtomicU64::new(0),
            watermark: std::sync::atomic::AtomicI64::new(i64::MIN),
            metrics: metrics::QueryMetrics::default(),
            sources: std::sync::OnceLock::new(),
            sink_errors: std::sync::OnceLock::new(),
        }
    }
}

/// A streaming operator.
///
/// Contract: `on_batch` and `on_watermark` are called in arrival order;
/// whatever the operator emits is pushed to `out` in the order downstream
/// must see it. An operator forwards every watermark it receives (after
/// emitting the results the watermark completes), so watermarks reach the
/// sink. Errors end the query.
pub trait Operator: Send {
    /// A one-line description for `EXPLAIN`.
    fn describe(&self) -> String;

    /// Processes a batch of rows.
    fn on_batch(&mut self, batch: RecordBatch, out: &mut Vec<Message>) -> Result<()>;

    /// Processes result rows that carry a kind. The default treats them as
    /// plain rows and keeps the kind on whatever comes out, which is right
    /// for every stateless operator.
    fn on_changes(
        &mut self,
        batch: RecordBatch,
        kind: RowKind,
        out: &mut Vec<Message>,
    ) -> Result<()> {
        let mut plain = Vec::new();
        self.on_batch(batch, &mut plain)?;
        out.extend(plain.into_iter().map(|m| match m {
            Message::Batch(b) => Message::Changes(b, kind),
            other => other,
        }));
        Ok(())
    }

    /// How often the operator wants [`Operator::on_tick`] called, in
    /// processing time; `None` (the default) for never.
    fn tick_interval(&self) -> Option<std::time::Duration> {
        None
    }

    /// Called every [`Operator::tick_interval`]; the default does nothing.
    fn on_tick(&mut self, _out: &mut Vec<Message>) -> Result<()> {
        Ok(())
    }

    /// Processes a watermark; the default forwards it.
    fn on_watermark(&mut self, watermark: i64, out: &mut Vec<Message>) -> Result<()> {
        out.push(Message::Watermark(watermark));
        Ok(())
    }

    /// True once the operator will never emit again (a satisfied `LIMIT`),
    /// so the runtime can stop feeding it.
    fn finished(&self) -> bool {
        false
    }

    /// What the operator holds, for a checkpoint; `None` (the default) for
    /// an operator that holds nothing between messages.
    ///
    /// Contract (see [`crate::state`]): the operator carries on after a
    /// snapshot exactly as it would have without it; a fresh operator of the
    /// same plan that is given the snapshot through [`Operator::restore`]
    /// and then the rest of the input emits what this one emits, in the
    /// same order; and a fresh operator's snapshot has every table (empty),
    /// so its schemas can be compared with a checkpoint's.
    fn snapshot(&mut self) -> Result<Option<crate::state::OperatorState>> {
        Ok(None)
    }

    /// Takes back the state of a snapshot. Called on a fresh operator,
    /// before any message. The default refuses: an operator that keeps
    /// state implements both methods.
    fn restore(&mut self, _state: crate::state::OperatorState) -> Result<()> {
        Err(crate::error::Error::Plan(format!(
            "operator {} keeps no state to restore",
            self.describe()
        )))
    }
}

/// Where the inputs of a multi-stream query meet when their rows do not
/// simply flow on together: a window join, a control stream, or a batch
/// query. The runtime hands it each input's rows with the input's index,
/// and the minimum of the inputs' watermarks.
///
/// Lifecycle: built by the planner (once per instance, see
/// [`MergeOperator::input_keys`]) -> [`restore`](MergeOperator::restore)
/// when a checkpoint is restored -> [`on_rows`](MergeOperator::on_rows)
/// and [`on_watermark`](MergeOperator::on_watermark) as the inputs send
/// them, with [`on_barrier`](MergeOperator::on_barrier) then a
/// [`snapshot`](MergeOperator::snapshot) at each aligned checkpoint
/// barrier -> dropped when every input has ended.
pub trait MergeOperator: Send {
    /// A one-line description for `EXPLAIN`.
    fn describe(&self) -> String;

    /// The key each input's rows are routed by when it runs as several
    /// instances, one list of expressions per input, over that input's
    /// rows: an instance then gets every row of the keys it owns, and its
    /// snapshot names the key columns of its tables so that a restore at
    /// another parallelism can split them. `None` (the default): it needs
    /// every row and runs as one instance.
    fn input_keys(&self) -> Option<Vec<Vec<Arc<dyn datafusion::physical_expr::PhysicalExpr>>>> {
        None
    }

    /// The event-time column of the rows it hands on, which go on in
    /// event-time order, for one that runs per key (see
    /// [`MergeOperator::input_keys`]): its instances' rows then meet in
    /// that order again (see [`TimeOrderedUnion`]).
    fn output_time(&self) -> Option<usize> {
        None
    }

    /// A checkpoint barrier was aligned on every input; called before
    /// [`MergeOperator::snapshot`]. One whose snapshot keeps nothing hands
    /// on here what it still holds (the default holds nothing).
    fn on_barrier(&mut self, _out: &mut Vec<Message>) -> Result<()> {
        Ok(())
    }

    /// Takes rows of input `input` (the order of the query's inputs).
    fn on_rows(&mut self, input: usize, batch: RecordBatch) -> Result<()>;

    /// Processes the merged watermark; forwards it after what it completes.
    fn on_watermark(&mut self, watermark: i64, out: &mut Vec<Message>) -> Result<()>;

    /// What it holds, for a checkpoint: as [`Operator::snapshot`].
    fn snapshot(&mut self) -> Result<Option<crate::state::OperatorState>> {
        Ok(None)
    }

    /// Takes back a snapshot: as [`Operator::restore`].
    fn restore(&mut self, _state: crate::state::OperatorState) -> Result<()> {
        Err(crate::error::Error::Plan(format!(
            "operator {} keeps no state to restore",
            self.describe()
        )))
    }
}

impl MergeOperator for WindowJoin {
    fn describe(&self) -> String {
        WindowJoin::describe(self)
    }

    fn on_rows(&mut self, input: usize, batch: RecordBatch) -> Result<()> {
        WindowJoin::on_rows(self, input, batch)
    }

    fn on_watermark(&mut self, watermark: i64, out: &mut Vec<Message>) -> Result<()> {
        WindowJoin::on_watermark(self, watermark, out)
    }

    fn snapshot(&mut self) -> Result<Option<crate::state::OperatorState>> {
        WindowJoin::snapshot(self).map(Some)
    }

    fn restore(&mut self, state: crate::state::OperatorState) -> Result<()> {
        WindowJoin::restore(self, state)
    }
}

/// Receives the snapshots a [`Chain`] takes as a barrier passes: the
/// barrier's id, the operator's index in the chain and its state.
pub type SnapshotSink =
    Box<dyn FnMut(u64, usize, Option<crate::state::OperatorState>) -> Result<()> + Send>;

/// Operators fused into one task: each message runs through all of them.
pub struct Chain {
    ops: Vec<Box<dyn Operator>>,
    snapshots: Option<SnapshotSink>,
    /// Per operator, what it took, gave and cost.
    metrics: Vec<std::sync::Arc<metrics::OperatorMetrics>>,
}

impl Chain {
    /// Fuses `ops`, first to last, as instance 0 of stage `s0`.
    pub fn new(ops: Vec<Box<dyn Operator>>) -> Self {
        Self::placed(ops, "s0", 0)
    }

    /// Fuses `ops` as instance `instance` of stage `stage` (what its
    /// operators' [`metrics::OperatorMetrics`] say).
    pub fn placed(ops: Vec<Box<dyn Operator>>, stage: &str, instance: usize) -> Self {
        let metrics = ops
            .iter()
            .enumerate()
            .map(|(index, op)| {
                std::sync::Arc::new(metrics::OperatorMetrics {
                    name: op.describe(),
                    stage: stage.to_string(),
                    instance,
                    index,
                    ..Default::default()
                })
            })
            .collect();
        Self {
            ops,
            snapshots: None,
            metrics,
        }
    }

    /// Per operator, first to last, its measurements: rows of the batches
    /// it was given and of those it emitted, and the time of its calls
    /// (batches, watermarks, ticks, and its snapshots at barriers).
    pub fn metrics(&self) -> &[std::sync::Arc<metrics::OperatorMetrics>] {
        &self.metrics
    }

    /// Sends each operator's snapshot to `sink` when a barrier passes it.
    /// Without a sink, barriers pass through and nothing is snapshot.
    pub fn with_snapshots(mut self, sink: SnapshotSink) -> Self {
        self.snapshots = Some(sink);
        self
    }

    /// The fused operators.
    pub fn ops(&self) -> &[Box<dyn Operator>] {
        &self.ops
    }

    /// Gives operator `index` the state it had at a checkpoint.
    pub fn restore(&mut self, index: usize, state: crate::state::OperatorState) -> Result<()> {
        match self.ops.get_mut(index) {
            Some(op) => op.restore(state),
            None => Err(crate::error::Error::Plan(format!(
                "the checkpoint has state for operator {index} of a chain of {}",
                self.ops.len()
            ))),
        }
    }

    /// Runs one message through every operator and returns what comes out
    /// of the last.
    pub fn process(&mut self, message: Message) -> Result<Vec<Message>> {
        self.process_from(0, vec![message])
    }

    fn process_from(&mut self, first: usize, mut current: Vec<Message>) -> Result<Vec<Message>> {
        // One clock read per call: each call's end starts the next one's
        // time, so the little bookkeeping between calls is charged to the
        // call after it.
        let mut clock = std::time::Instant::now();
        for index in first..self.ops.len() {
            let op = &mut self.ops[index];
            let metrics = &self.metrics[index];
            let mut next = Vec::with_capacity(current.len());
            for message in current {
                let rows_in = message_rows(&message);
                match message {
                    Message::Batch(_) | Message::Changes(..) if rows_in == 0 => continue,
                    Message::Epoch => {
                        next.push(Message::Epoch);
                        continue;
                    }
                    _ => {}
                }
                let emitted = next.len();
                match message {
                    Message::Batch(batch) => op.on_batch(batch, &mut next)?,
                    Message::Changes(batch, kind) => op.on_changes(batch, kind, &mut next)?,
                    Message::Watermark(w) => op.on_watermark(w, &mut next)?,
                    Message::Barrier(id) => {
                        if let Some(sink) = &mut self.snapshots {
                            sink(id, index, op.snapshot()?)?;
                        }
                        next.push(Message::Barrier(id));
                    }
                    Message::Epoch => next.push(Message::Epoch),
                }
                measure(metrics, &mut clock, rows_in, &next[emitted..]);
            }
            current = next;
        }
        Ok(current)
    }

    /// The shortest tick interval any operator asks for.
    pub fn tick_interval(&self) -> Option<std::time::Duration> {
        self.ops.iter().filter_map(|op| op.tick_interval()).min()
    }

    /// Ticks every operator; what a tick produces runs through the
    /// operators after it.
    pub fn tick(&mut self) -> Result<Vec<Message>> {
        let mut out = Vec::new();
        for i in 0..self.ops.len() {
            let mut produced = Vec::new();
            let mut clock = std::time::Instant::now();
            self.ops[i].on_tick(&mut produced)?;
            measure(&self.metrics[i], &mut clock, 0, &produced);
            if !produced.is_empty() {
                out.extend(self.process_from(i + 1, produced)?);
            }
        }
        Ok(out)
    }

    /// True once any operator will never emit again.
    pub fn finished(&self) -> bool {
        self.ops.iter().any(|op| op.finished())
    }
}

/// The rows a message carries (none for watermarks, barriers and epochs).
fn message_rows(message: &Message) -> u64 {
    match message {
        Message::Batch(batch) | Message::Changes(batch, _) => batch.num_rows() as u64,
        _ => 0,
    }
}

/// Charges one call of an operator, begun at `clock` (moved on to now),
/// that took `rows_in` rows and emitted `emitted`. The chain is the only
/// writer of its operators' rows and busy time, so a plain load and store
/// does, without the cost of an atomic add on every message.
fn measure(
    metrics: &metrics::OperatorMetrics,
    clock: &mut std::time::Instant,
    rows_in: u64,
    emitted: &[Message],
) {
    let now = std::time::Instant::now();
    let busy = now.duration_since(*clock).as_nanos() as u64;
    *clock = now;
    let rows_out: u64 = emitted.iter().map(message_rows).sum();
    add(&metrics.busy_ns, busy);
    if rows_in > 0 {
        add(&metrics.rows_in, rows_in);
    }
    if rows_out > 0 {
        add(&metrics.rows_out, rows_out);
    }
}

fn add(counter: &AtomicU64, n: u64) {
    use std::sync::atomic::Ordering::Relaxed;
    counter.store(counter.load(Relaxed).wrapping_add(n), Relaxed);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    /// Keeps the rows at even positions; sleeps `pause` on each batch, so
    /// its busy time has a known floor.
    struct Halve {
        pause: std::time::Duration,
    }

    impl Operator for Halve {
        fn describe(&self) -> String {
            "halve".into()
        }

        fn on_batch(&mut self, batch: RecordBatch, out: &mut Vec<Message>) -> Result<()> {
            std::thread::sleep(self.pause);
            let keep: datafusion::arrow::array::BooleanArray =
                (0..batch.num_rows()).map(|i| Some(i % 2 == 0)).collect();
            out.push(Message::Batch(
                datafusion::arrow::compute::filter_record_batch(&batch, &keep)?,
            ));
            Ok(())
        }
    }

    /// Emits one row per tick.
    struct Ticker;

    impl Operator for Ticker {
        fn describe(&self) -> String {
            "ticker".into()
        }

        fn on_batch(&mut self, batch: RecordBatch, out: &mut Vec<Message>) -> Result<()> {
            out.push(Message::Batch(batch));
            Ok(())
        }

        fn tick_interval(&self) -> Option<std::time::Duration> {
            Some(std::time::Duration::from_secs(1))
        }

        fn on_tick(&mut self, out: &mut Vec<Message>) -> Result<()> {
            out.push(Message::Batch(rows(1)));
            Ok(())
        }
    }

    fn rows(n: i64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from_iter_values(0..n))]).unwrap()
    }

    fn counts(m: &metrics::OperatorMetrics) -> (u64, u64) {
        (
            m.rows_in.load(Ordering::Relaxed),
            m.rows_out.load(Ordering::Relaxed),
        )
    }

    #[test]
    fn each_operator_counts_its_rows_and_time() {
        let pause = std::time::Duration::from_millis(3);
        let mut chain = Chain::placed(
            vec![Box::new(Halve { pause }), Box::new(Halve { pause })],
            "s2",
            1,
        );
        let out = chain.process(Message::Batch(rows(10))).unwrap();
        let out = out.iter().map(message_rows).sum::<u64>();
        assert_eq!(out, 3);
        chain.process(Message::Batch(rows(0))).unwrap();
        chain.process(Message::Watermark(5)).unwrap();
        let [first, second] = chain.metrics() else {
            panic!("two operators")
        };
        assert_eq!(counts(first), (10, 5));
        assert_eq!(counts(second), (5, 3));
        for m in [first, second] {
            // One batch each (the empty one never reaches an operator).
            assert!(m.busy_ns.load(Ordering::Relaxed) >= pause.as_nanos() as u64);
            assert_eq!(
                (m.stage.as_str(), m.instance, m.name.as_str()),
                ("s2", 1, "halve")
            );
        }
        assert_eq!((first.index, second.index), (0, 1));
    }

    #[test]
    fn a_tick_is_charged_to_the_operator_it_ran_and_those_after_it() {
        let pause = std::time::Duration::from_millis(1);
        let mut chain = Chain::new(vec![Box::new(Ticker), Box::new(Halve { pause })]);
        let out = chain.tick().unwrap();
        assert_eq!(out.iter().map(message_rows).sum::<u64>(), 1);
        assert_eq!(counts(&chain.metrics()[0]), (0, 1));
        assert_eq!(counts(&chain.metrics()[1]), (1, 1));
    }
}
