mod groups;
mod panes;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{
    ArrayRef, AsArray, BooleanArray, Int64Array, TimestampMillisecondArray, UInt32Array,
};
use datafusion::arrow::compute::{concat_batches, take};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimestampMillisecondType};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::aggregates::group_values::{GroupValues, new_group_values};
use datafusion::physical_plan::aggregates::order::GroupOrdering;

use super::aggregate::{self, AggregateInputs, AggregateSpec, evaluate_all, new_accumulator};
use super::shed::{ShedOutput, scale_up};
use super::{Message, Operator};
use crate::connector::RowKind;
use crate::error::Result;
use crate::plan::WindowSpec;
use crate::state::OperatorState;
use panes::*;

/// What one grouping column of the output holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupSlot {
    /// The i-th key expression.
    Key(usize),
    /// The window's start.
    WindowStart,
    /// The window's end.
    WindowEnd,
}

/// How rows map to windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowGrid {
    /// Rows carry their pane (from a window-assign operator); each window is
    /// the merge of the panes it spans.
    Panes(WindowSpec),
    /// Rows carry their exact window, e.g. the results of a windowed
    /// aggregate grouped again by window (cascading windows).
    Exact {
        /// Window length in milliseconds.
        size_ms: i64,
    },
}

/// Where each row's pane (or window) is read from.
#[derive(Debug, Clone)]
pub struct WindowInput {
    /// Evaluates to the pane's (or window's) start or end per row.
    pub expr: Arc<dyn PhysicalExpr>,
    /// True if `expr` gives the end rather than the start.
    pub is_end: bool,
}

/// The planner's description of a windowed aggregate.
#[derive(Debug, Clone)]
pub struct WindowAggregateSpec {
    /// Grouping expressions other than the window columns.
    pub keys: Vec<Arc<dyn PhysicalExpr>>,
    /// Output fields of `keys`.
    pub key_schema: SchemaRef,
    /// The output's grouping columns, in order.
    pub layout: Vec<GroupSlot>,
    /// Where rows say which pane or window they are in.
    pub window: WindowInput,
    /// How panes make windows.
    pub grid: WindowGrid,
    /// The aggregates, in output order after the grouping columns.
    pub aggregates: Vec<AggregateSpec>,
    /// Output schema: grouping columns, then aggregates.
    pub schema: SchemaRef,
    /// `EMIT EVERY`: how often to send early partial results of the windows
    /// that changed.
    pub early_every: Option<Duration>,
    /// How long after firing a window still takes rows, each making it fire
    /// again as an update.
    pub lateness_ms: i64,
    /// Over shed input: where the dropped counts are, for the
    /// `_shed_fraction` column (the last of `schema`) and scaling.
    pub shed: Option<ShedOutput>,
}

/// A batch's grouping keys, aggregate arguments and filters, evaluated once.
struct Inputs {
    keys: Vec<ArrayRef>,
    aggregates: AggregateInputs,
    rows: usize,
}

impl Inputs {
    fn evaluate(spec: &WindowAggregateSpec, batch: &RecordBatch) -> Result<Self> {
        Ok(Self {
            keys: evaluate_all(&spec.keys, batch)?,
            aggregates: AggregateInputs::evaluate(&spec.aggregates, batch)?,
            rows: batch.num_rows(),
        })
    }

    /// The inputs of `rows` only (ascending row numbers): a zero-copy
    /// slice when they are consecutive, as rows of one pane mostly are,
    /// else a `take`.
    fn select(&self, rows: &[u32]) -> Result<Inputs> {
        let (first, last) = (rows[0] as usize, rows[rows.len() - 1] as usize);
        if first == 0 && rows.len() == self.rows {
            return self.map(self.rows, |a| Ok(a.clone()));
        }
        if last - first + 1 == rows.len() {
            return self.map(rows.len(), |a| Ok(a.slice(first, rows.len())));
        }
        let indices = UInt32Array::from(rows.to_vec());
        self.map(rows.len(), |a| Ok(take(a, &indices, None)?))
    }

    fn map(&self, rows: usize, f: impl Fn(&ArrayRef) -> Result<ArrayRef>) -> Result<Inputs> {
        let all = |arrays: &[ArrayRef]| arrays.iter().map(&f).collect::<Result<Vec<_>>>();
        Ok(Inputs {
            keys: all(&self.keys)?,
            aggregates: AggregateInputs {
                args: self
                    .aggregates
                    .args
                    .iter()
                    .map(|a| all(a))
                    .collect::<Result<_>>()?,
                filters: self
                    .aggregates
                    .filters
                    .iter()
                    .map(|filter| filter.as_ref().map(&f).transpose())
                    .collect::<Result<_>>()?,
            },
            rows,
        })
    }
}

/// The rows of one batch that fall in one pane, in arrival order.
struct PaneRows {
    pane: i64,
    rows: Vec<u32>,
    /// True if a window holding the pane has fired (allowed lateness).
    late: bool,
}

/// Groups a batch's rows by pane. A batch spans few panes, so a short
/// list searched from the last pane hit beats a hash map per row.
fn rows_by_pane(panes: &[i64], is_late: impl Fn(i64) -> bool) -> Vec<PaneRows> {
    let mut groups: Vec<PaneRows> = Vec::new();
    let mut current = usize::MAX;
    for (row, &pane) in panes.iter().enumerate() {
        if groups.get(current).is_none_or(|g| g.pane != pane) {
            current = match groups.iter().position(|g| g.pane == pane) {
                Some(i) => i,
                None => {
                    groups.push(PaneRows {
                        pane,
                        rows: Vec::new(),
                        late: is_late(pane),
                    });
                    groups.len() - 1
                }
            };
        }
        groups[current].rows.push(row as u32);
    }
    groups
}

/// Grouped aggregation per event-time window.
///
/// Rows are folded, as they arrive, into the pane they fall in: DataFusion's
/// `GroupValues` maps each key to a dense group id and one
/// `GroupsAccumulator` per aggregate holds the partial results, so no row is
/// buffered and no row is aggregated more than once. When the watermark
/// passes a window's end, the window's panes are merged (for a tumbling
/// window the single pane is evaluated directly), emitted, and the panes no
/// later window needs are dropped. A pane read by an earlier window keeps
/// that part of its state as Arrow arrays (`GroupsAccumulator::state`), the
/// same form a checkpoint takes.
pub struct WindowAggregateOp {
    spec: WindowAggregateSpec,
    panes: BTreeMap<i64, Pane>,
    /// Starts of windows that hold rows and have not fired.
    pending: BTreeSet<i64>,
    /// Starts of windows changed since the last early result.
    dirty: BTreeSet<i64>,
    /// Starts of windows that fired and still take late rows.
    fired: BTreeSet<i64>,
    watermark: i64,
    /// Its reader id in the shed ledger, once it has joined.
    shed_reader: Option<usize>,
}

/// Keyed partial aggregates: a key-to-group-id map (or one group when there
/// are no keys) and one accumulator per aggregate.
pub(super) struct Groups {
    keys: Option<Box<dyn GroupValues>>,
    rows_seen: bool,
    accumulators: Vec<Box<dyn GroupsAccumulator>>,
    ids: Vec<usize>,
}

/// Key columns, aggregate values and the number of groups.
pub(super) type Evaluated = (Vec<ArrayRef>, Vec<ArrayRef>, usize);

/// A pane's state: rows since it was last read, and the frozen state of
/// rows before that.
struct Pane {
    live: Groups,
    frozen: Vec<Frozen>,
}

/// Partial aggregates as Arrow arrays: key columns and, per aggregate, its
/// state columns.
#[derive(Default)]
pub(super) struct Frozen {
    keys: Vec<ArrayRef>,
    states: Vec<Vec<ArrayRef>>,
    rows: usize,
}

impl WindowAggregateOp {
    /// A windowed aggregate as the planner describes it.
    pub fn new(spec: WindowAggregateSpec) -> Self {
        Self {
            spec,
            panes: BTreeMap::new(),
            pending: BTreeSet::new(),
            dirty: BTreeSet::new(),
            fired: BTreeSet::new(),
            watermark: i64::MIN,
            shed_reader: None,
        }
    }

    fn new_groups(&self) -> Result<Groups> {
        let keys = if self.spec.key_schema.fields().is_empty() {
            None
        } else {
            Some(new_group_values(
                self.spec.key_schema.clone(),
                &GroupOrdering::None,
            )?)
        };
        Groups::new(keys, &self.spec.aggregates)
    }

    fn pane_ms(&self) -> i64 {
        match self.spec.grid {
            WindowGrid::Panes(spec) => spec.pane_ms(),
            WindowGrid::Exact { size_ms } => size_ms,
        }
    }

    fn size_ms(&self) -> i64 {
        match self.spec.grid {
            WindowGrid::Panes(spec) => spec.size_ms(),
            WindowGrid::Exact { size_ms } => size_ms,
        }
    }

    /// Starts of the windows a pane belongs to.
    fn windows_of(&self, pane: i64) -> Vec<i64> {
        match self.spec.grid {
            WindowGrid::Panes(spec) => spec.windows_of_pane(pane).collect(),
            WindowGrid::Exact { .. } => vec![pane],
        }
    }

    /// The pane of each row.
    fn row_panes(&self, batch: &RecordBatch) -> Result<Vec<i64>> {
        let column = self
            .spec
            .window
            .expr
            .evaluate(batch)?
            .into_array(batch.num_rows())?;
        let values = column.as_primitive::<TimestampMillisecondType>().values();
        let back = if self.spec.window.is_end {
            self.pane_ms()
        } else {
            0
        };
        Ok(values.iter().map(|v| v - back).collect())
    }

    /// Folds `inputs` into `pane`.
    fn add(&mut self, pane: i64, inputs: &Inputs) -> Result<()> {
        if !self.panes.contains_key(&pane) {
            let live = self.new_groups()?;
            self.panes.insert(
                pane,
                Pane {
                    live,
                    frozen: Vec::new(),
                },
            );
        }
        let size = self.size_ms();
        for window in self.windows_of(pane) {
            if window + size > self.watermark {
                self.pending.insert(window);
                if self.spec.early_every.is_some() {
                    self.dirty.insert(window);
                }
            }
        }
        let filters: Vec<Option<BooleanArray>> = inputs
            .aggregates
            .filters
            .iter()
            .map(|f| f.as_ref().map(|f| f.as_boolean().clone()))
            .collect();
        let live = &mut self.panes.get_mut(&pane).expect("inserted above").live;
        live.update(&inputs.keys, inputs.rows, &inputs.aggregates.args, &filters)
    }

    /// Fired windows (still within allowed lateness) that hold `pane`.
    fn fired_windows_of(&self, pane: i64) -> Vec<i64> {
        if self.fired.is_empty() {
            return Vec::new();
        }
        self.windows_of(pane)
            .into_iter()
            .filter(|w| self.fired.contains(w))
            .collect()
    }

    /// The span of pane starts a window reads: all panes inside it, or for
    /// exact windows only its own.
    fn pane_span(&self, start: i64) -> std::ops::Range<i64> {
        match self.spec.grid {
            WindowGrid::Panes(spec) => start..start + spec.size_ms(),
            WindowGrid::Exact { .. } => start..start + 1,
        }
    }

    fn fire(&mut self, start: i64) -> Result<Option<RecordBatch>> {
        let span = self.pane_span(start);
        let mut in_window = self.panes.range(span.clone());
        let Some((&first, pane)) = in_window.next() else {
            return Ok(None);
        };
        // A window of one pane that no later window reads (always so for a
        // tumbling window) is evaluated in place, without a merge.
        let alone = in_window.next().is_none()
            && pane.frozen.is_empty()
            && self.spec.lateness_ms == 0
            && self.pane_done_by(first, start);
        let evaluated = if alone {
            let pane = self.panes.get_mut(&first).expect("found above");
            pane.live.evaluate()?
        } else {
            self.merge_panes(span)?
        };
        if self.spec.lateness_ms == 0 {
            self.panes
                .retain(|&pane, _| !done_by(self.spec.grid, pane, start));
        }
        self.assemble(start, evaluated)
    }

    /// The output rows of the window starting at `start`.
    fn assemble(&self, start: i64, (keys, values, rows): Evaluated) -> Result<Option<RecordBatch>> {
        let end = start + self.size_ms();
        if rows == 0 {
            return Ok(None);
        }
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.spec.schema.fields().len());
        for slot in &self.spec.layout {
            columns.push(match *slot {
                GroupSlot::Key(i) => keys[i].clone(),
                GroupSlot::WindowStart => constant_time(start, rows),
                GroupSlot::WindowEnd => constant_time(end, rows),
            });
        }
        match &self.spec.shed {
            Some(shed) => {
                let fractions = shed.fractions(start, &keys, rows)?;
                for (spec, value) in self.spec.aggregates.iter().zip(values) {
                    let name = spec.function.fun().name();
                    columns.push(match shed.scale && matches!(name, "count" | "sum") {
                        true => scale_up(&value, &fractions)?,
                        false => value,
                    });
                }
                columns.push(Arc::new(fractions));
            }
            None => columns.extend(values),
        }
        Ok(Some(RecordBatch::try_new(
            self.spec.schema.clone(),
            columns,
        )?))
    }

    /// Forgets windows, and the panes only they read, whose allowed
    /// lateness has passed.
    fn expire(&mut self, watermark: i64) {
        let horizon = self.size_ms() + self.spec.lateness_ms;
        self.fired.retain(|w| w.saturating_add(horizon) > watermark);
        let grid = self.spec.grid;
        self.panes.retain(|&pane, _| {
            let last = match grid {
                WindowGrid::Panes(spec) => spec.last_window_start(pane),
                WindowGrid::Exact { .. } => pane,
            };
            last.saturating_add(horizon) > watermark
        });
    }

    fn pane_done_by(&self, pane: i64, start: i64) -> bool {
        done_by(self.spec.grid, pane, start)
    }

    /// Merges the state of every pane in `span`.
    fn merge_panes(&mut self, span: std::ops::Range<i64>) -> Result<Evaluated> {
        let mut merged = self.new_groups()?;
        let mut fresh = Vec::new();
        for _ in self.panes.range(span.clone()) {
            fresh.push((self.new_groups()?, self.new_groups()?));
        }
        for ((_, pane), (live, scratch)) in self.panes.range_mut(span).zip(fresh) {
            pane.freeze(live)?;
            pane.compact(scratch)?;
            for frozen in &pane.frozen {
                merged.merge(frozen)?;
            }
        }
        merged.evaluate()
    }
}

/// True if no window after the one starting at `start` reads `pane`.
fn done_by(grid: WindowGrid, pane: i64, start: i64) -> bool {
    match grid {
        WindowGrid::Panes(spec) => spec.last_window_start(pane) <= start,
        WindowGrid::Exact { .. } => pane <= start,
    }
}

fn constant_time(value: i64, rows: usize) -> ArrayRef {
    Arc::new(TimestampMillisecondArray::from(vec![value; rows]))
}

impl Operator for WindowAggregateOp {
    fn describe(&self) -> String {
        let grid = match self.spec.grid {
            WindowGrid::Panes(spec) => spec.to_string(),
            WindowGrid::Exact { size_ms } => format!("windows of {size_ms} ms from input"),
        };
        let mut text = aggregate::describe(
            &format!("window aggregate {grid}"),
            &self.spec.keys,
            &self.spec.aggregates,
        );
        if let Some(every) = self.spec.early_every {
            text.push_str(&format!(", early results every {} ms", every.as_millis()));
        }
        if self.spec.lateness_ms > 0 {
            text.push_str(&format!(", allowed lateness {} ms", self.spec.lateness_ms));
        }
        if let Some(shed) = &self.spec.shed {
            text.push_str(", with _shed_fraction");
            if shed.scale {
                text.push_str(", count and sum scaled up by it");
            }
        }
        text
    }

    fn on_batch(&mut self, batch: RecordBatch, out: &mut Vec<Message>) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let inputs = Inputs::evaluate(&self.spec, &batch)?;
        let panes = self.row_panes(&batch)?;
        let groups = rows_by_pane(&panes, |pane| !self.fired_windows_of(pane).is_empty());
        // Rows for windows that already fired (within allowed lateness)
        // make them fire again, one row at a time in arrival order, as if
        // rows came one by one; the other rows go in per pane.
        let mut late = Vec::new();
        for group in groups {
            if group.late {
                late.extend(group.rows);
            } else {
                self.add(group.pane, &inputs.select(&group.rows)?)?;
            }
        }
        late.sort_unstable();
        for row in late {
            let pane = panes[row as usize];
            self.add(pane, &inputs.select(&[row])?)?;
            for window in self.fired_windows_of(pane) {
                let span = self.pane_span(window);
                let evaluated = self.merge_panes(span)?;
                if let Some(batch) = self.assemble(window, evaluated)? {
                    out.push(Message::Changes(batch, RowKind::Update));
                }
            }
        }
        Ok(())
    }

    fn tick_interval(&self) -> Option<Duration> {
        self.spec.early_every
    }

    /// Sends the current partial result of every window that changed since
    /// the last tick.
    fn on_tick(&mut self, out: &mut Vec<Message>) -> Result<()> {
        for start in std::mem::take(&mut self.dirty) {
            if !self.pending.contains(&start) {
                continue;
            }
            let span = self.pane_span(start);
            let evaluated = self.merge_panes(span)?;
            if let Some(batch) = self.assemble(start, evaluated)? {
                out.push(Message::Changes(batch, RowKind::Early));
            }
        }
        Ok(())
    }

    /// Tables: `panes` (per pane and part, the groups' keys and
    /// accumulator states; keyed by the grouping keys), `pending`, `dirty`
    /// and `fired` (window starts) and `meta` (the watermark).
    fn snapshot(&mut self) -> Result<Option<OperatorState>> {
        let mut state = OperatorState::new();
        let keys = self.spec.key_schema.fields().len();
        let panes = self.pane_table()?;
        state.add(
            "panes",
            panes,
            (PANE_COLUMNS..PANE_COLUMNS + keys).collect(),
        );
        for (name, set) in [
            ("pending", &self.pending),
            ("dirty", &self.dirty),
            ("fired", &self.fired),
        ] {
            state.add(
                name,
                aggregate::window_set("window_start", set)?,
                Vec::new(),
            );
        }
        state.add_scalars(
            "meta",
            &[("watermark", aggregate::time_scalar(self.watermark))],
        );
        Ok(Some(state))
    }

    fn restore(&mut self, state: OperatorState) -> Result<()> {
        let panes = aggregate::checked_table(&state, "panes", &self.pane_fields()?)?;
        self.restore_panes(&panes)?;
        self.pending = aggregate::read_window_set(&state, "pending", "window_start")?;
        self.dirty = aggregate::read_window_set(&state, "dirty", "window_start")?;
        self.fired = aggregate::read_window_set(&state, "fired", "window_start")?;
        self.watermark = state.scalar("meta", "watermark")?.unwrap_or(i64::MIN);
        Ok(())
    }

    fn on_watermark(&mut self, watermark: i64, out: &mut Vec<Message>) -> Result<()> {
        self.watermark = self.watermark.max(watermark);
        let size = self.size_ms();
        while let Some(&start) = self.pending.first() {
            if start.saturating_add(size) > watermark {
                break;
            }
            self.pending.remove(&start);
            if let Some(batch) = self.fire(start)? {
                out.push(Message::Batch(batch));
                crate::crashpoint::hit("fire");
            }
            if self.spec.lateness_ms > 0 {
                self.fired.insert(start);
            }
        }
        if self.spec.lateness_ms > 0 {
            self.expire(watermark);
        }
        if let Some(shed) = &self.spec.shed {
            let reader = *self.shed_reader.get_or_insert_with(|| shed.ledger.join());
            shed.ledger.advance(reader, watermark);
        }
        out.push(Message::Watermark(watermark));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Float64Array, StringArray};
    use datafusion::arrow::datatypes::Float64Type;
    use datafusion::execution::SessionStateBuilder;
    use datafusion::physical_expr::aggregate::AggregateExprBuilder;
    use datafusion::physical_expr::expressions::{col, lit};

    use super::*;

    /// Aggregates whose state merges into an empty accumulator exactly.
    const EXACT: [(&str, Option<f64>, bool); 14] = [
        ("count", None, false),
        ("count", None, true),
        ("sum", None, false),
        ("avg", None, false),
        ("min", None, false),
        ("max", None, false),
        ("median", None, false),
        ("percentile_cont", Some(0.9), false),
        ("approx_percentile", Some(0.9), false),
        ("mad", None, false),
        ("ewma", Some(0.3), false),
        ("cadence", None, false),
        ("change_score", Some(5.0), false),
        ("seasonal_z", Some(7.0), false),
    ];

    /// DataFusion aggregates whose merge recomputes the state: the
    /// variance's Welford merge takes the mean as `mean * n / n`, a
    /// t-digest's re-compression each centroid's as `mean * w / w`; either
    /// can round in the last bit.
    const ROUNDED: [(&str, Option<f64>, bool); 3] = [
        ("stddev", None, false),
        ("approx_percentile_cont", Some(0.5), false),
        ("approx_percentile_cont", Some(0.99), false),
    ];

    /// The aggregates `calls` over `v` of `schema` (`cadence` over `t`).
    fn aggregates(schema: &SchemaRef, calls: &[(&str, Option<f64>, bool)]) -> Vec<AggregateSpec> {
        let mut state = SessionStateBuilder::new().with_default_features().build();
        crate::functions::register(&mut state).unwrap();
        calls
            .iter()
            .enumerate()
            .map(|(i, (name, p, distinct))| {
                let udaf = state.aggregate_functions()[*name].clone();
                let arg = if *name == "cadence" { "t" } else { "v" };
                let mut args = vec![col(arg, schema).unwrap()];
                args.extend(p.map(lit));
                let mut builder = AggregateExprBuilder::new(udaf, args)
                    .schema(schema.clone())
                    .alias(format!("{name}{i}"));
                if *distinct {
                    builder = builder.distinct();
                }
                AggregateSpec {
                    function: Arc::new(builder.build().unwrap()),
                    filter: None,
                }
            })
            .collect()
    }

    /// Rows of (k, v, t): three keys, one of them NULL, values spread over
    /// many magnitudes, a few NULL, timestamps repeating, a few NULL; the
    /// same rows every run.
    fn batch(schema: &SchemaRef, seed: u64, rows: usize) -> RecordBatch {
        let mut x = seed;
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            x >> 11
        };
        let mut keys = Vec::new();
        let mut values = Vec::new();
        let mut times = Vec::new();
        for _ in 0..rows {
            let r = next();
            keys.push([Some("a"), Some("b"), None][(r % 3) as usize]);
            let v = (r % 100_000) as f64 / 7.0 - 3000.0;
            values.push((r % 97 != 0).then_some(v * (1.0 + (r % 5) as f64)));
            times.push((r % 89 != 0).then_some((r % 20_000) as i64 * 250));
        }
        RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(keys)),
                Arc::new(Float64Array::from(values)),
                Arc::new(TimestampMillisecondArray::from(times)),
            ],
        )
        .unwrap()
    }

    fn update(groups: &mut Groups, specs: &[AggregateSpec], batch: &RecordBatch) {
        let args: Vec<Vec<ArrayRef>> = specs
            .iter()
            .map(|spec| {
                let arg = &spec.function.expressions()[0];
                vec![
                    arg.evaluate(batch)
                        .unwrap()
                        .into_array(batch.num_rows())
                        .unwrap(),
                ]
            })
            .collect();
        let filters = vec![None; args.len()];
        let keys = [batch.column(0).clone()];
        groups
            .update(&keys, batch.num_rows(), &args, &filters)
            .unwrap();
    }

    /// Runs `calls` over two batches straight, and with snapshots (two in
    /// a row) between them, carrying on and restored; `check` compares
    /// each aggregate's values with the straight run's.
    fn snapshot_between_batches(
        calls: &[(&str, Option<f64>, bool)],
        check: impl Fn(&ArrayRef, &ArrayRef, &str),
    ) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("v", DataType::Float64, true),
            Field::new(
                "t",
                DataType::Timestamp(datafusion::arrow::datatypes::TimeUnit::Millisecond, None),
                true,
            ),
        ]));
        let key_schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Utf8, true)]));
        let specs = aggregates(&schema, calls);
        let groups = || {
            let keys = new_group_values(key_schema.clone(), &GroupOrdering::None).unwrap();
            Groups::new(Some(keys), &specs).unwrap()
        };
        let (first, second) = (batch(&schema, 1, 5000), batch(&schema, 2, 3000));
        let mut straight = groups();
        update(&mut straight, &specs, &first);
        update(&mut straight, &specs, &second);
        let mut snapshotted = groups();
        update(&mut snapshotted, &specs, &first);
        let frozen = snapshotted.snapshot(groups()).unwrap();
        // A second snapshot holds the same state, though a DISTINCT set
        // may list its values in another order.
        let again = snapshotted.snapshot(groups()).unwrap();
        let mut restored = groups();
        restored.merge(&frozen).unwrap();
        let mut restored_again = groups();
        restored_again.merge(&again).unwrap();
        for groups in [&mut snapshotted, &mut restored, &mut restored_again] {
            update(groups, &specs, &second);
        }
        let (keys, values, rows) = straight.evaluate().unwrap();
        assert_eq!(rows, 3);
        for mut other in [snapshotted, restored, restored_again] {
            let (other_keys, other_values, other_rows) = other.evaluate().unwrap();
            assert_eq!((&other_keys, other_rows), (&keys, rows));
            for ((a, b), spec) in values.iter().zip(&other_values).zip(&specs) {
                check(a, b, spec.function.name());
            }
        }
    }

    /// Rows are grouped by pane in arrival order, late panes marked; a
    /// pane's consecutive rows are sliced and scattered ones gathered.
    #[test]
    fn rows_are_grouped_by_pane_and_selected() {
        let panes = [10, 10, 20, 10, 20, 20, 30];
        let groups = rows_by_pane(&panes, |pane| pane == 30);
        let found: Vec<(i64, Vec<u32>, bool)> = groups
            .iter()
            .map(|g| (g.pane, g.rows.clone(), g.late))
            .collect();
        assert_eq!(
            found,
            [
                (10, vec![0, 1, 3], false),
                (20, vec![2, 4, 5], false),
                (30, vec![6], true)
            ]
        );
        let values: ArrayRef = Arc::new(Int64Array::from_iter_values(0..7));
        let inputs = Inputs {
            keys: vec![values.clone()],
            aggregates: AggregateInputs {
                args: vec![vec![values.clone()]],
                filters: vec![Some(Arc::new(BooleanArray::from(vec![true; 7])))],
            },
            rows: 7,
        };
        for rows in [&[0, 1, 3][..], &[4, 5], &[0, 1, 2, 3, 4, 5, 6]] {
            let picked = inputs.select(rows).unwrap();
            let expected: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
            assert_eq!(picked.rows, rows.len());
            for column in [&picked.keys[0], &picked.aggregates.args[0][0]] {
                let column = column.as_primitive::<datafusion::arrow::datatypes::Int64Type>();
                assert_eq!(column.values().to_vec(), expected);
            }
            assert_eq!(
                picked.aggregates.filters[0].as_ref().unwrap().len(),
                rows.len()
            );
        }
    }

    /// A snapshot drains every accumulator and merges its state back: what
    /// the groups give afterwards, and what groups rebuilt from the
    /// snapshot give, is exactly what they would have given, to the bit.
    #[test]
    fn a_snapshot_leaves_exact_aggregates_exactly_as_they_were() {
        snapshot_between_batches(&EXACT, |a, b, name| assert_eq!(a, b, "{name}"));
    }

    /// Where DataFusion's merge rounds, the values after a snapshot stay
    /// within a few ulps of the straight run's.
    #[test]
    fn a_snapshot_leaves_rounding_aggregates_within_a_few_ulps() {
        snapshot_between_batches(&ROUNDED, |a, b, name| {
            let (a, b) = (
                a.as_primitive::<Float64Type>(),
                b.as_primitive::<Float64Type>(),
            );
            for (x, y) in a.iter().zip(b.iter()) {
                let (x, y) = (x.unwrap(), y.unwrap());
                assert!((x - y).abs() <= 1e-12 * x.abs().max(1.0), "{name}: {x} {y}");
            }
        });
    }
}
