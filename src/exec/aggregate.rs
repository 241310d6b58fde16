//! What every aggregating operator shares: the lowered aggregates, their
//! evaluated inputs, accumulator creation, and the pieces of their
//! checkpoint state tables.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray, BooleanArray, Int64Array};
use datafusion::arrow::compute::{SortColumn, cast, lexsort_to_indices, take_record_batch};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::logical_expr::GroupsAccumulator;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::{GroupsAccumulatorAdapter, PhysicalExpr};

use crate::error::{Error, Result};
use crate::state::OperatorState;

/// One aggregate of the query, lowered to physical form.
#[derive(Debug, Clone)]
pub struct AggregateSpec {
    /// The aggregate function with its arguments.
    pub function: Arc<AggregateFunctionExpr>,
    /// Its `FILTER (WHERE ...)` clause, if any.
    pub filter: Option<Arc<dyn PhysicalExpr>>,
}

/// The aggregates' arguments and filters, evaluated over one batch.
pub(super) struct AggregateInputs {
    /// Per aggregate, its argument columns.
    pub args: Vec<Vec<ArrayRef>>,
    /// Per aggregate, its filter column, if it has a filter.
    pub filters: Vec<Option<ArrayRef>>,
}

impl AggregateInputs {
    /// Evaluates every aggregate's arguments and filter over `batch`.
    pub fn evaluate(aggregates: &[AggregateSpec], batch: &RecordBatch) -> Result<Self> {
        // An ordered aggregate (`last_value(x ORDER BY ts)`) reads its
        // ordering columns after its arguments, as DataFusion's own
        // aggregate operator passes them.
        let args = aggregates
            .iter()
            .map(|a| {
                let mut exprs = a.function.expressions();
                exprs.extend(a.function.order_bys().iter().map(|o| o.expr.clone()));
                evaluate_all(&exprs, batch)
            })
            .collect::<Result<_>>()?;
        let filters = aggregates
            .iter()
            .map(|a| {
                a.filter
                    .as_ref()
                    .map(|f| Ok(evaluate_all(std::slice::from_ref(f), batch)?.remove(0)))
                    .transpose()
            })
            .collect::<Result<_>>()?;
        Ok(Self { args, filters })
    }
}

/// Evaluates every expression over the batch.
pub(super) fn evaluate_all(
    exprs: &[Arc<dyn PhysicalExpr>],
    batch: &RecordBatch,
) -> Result<Vec<ArrayRef>> {
    Ok(exprs
        .iter()
        .map(|e| e.evaluate(batch)?.into_array(batch.num_rows()))
        .collect::<datafusion::error::Result<_>>()?)
}

/// A groups accumulator for `function`, adapting a per-group accumulator
/// where DataFusion has no grouped one (median, percentiles).
pub(super) fn new_accumulator(
    function: &Arc<AggregateFunctionExpr>,
) -> Result<Box<dyn GroupsAccumulator>> {
    if function.groups_accumulator_supported() {
        return Ok(function.create_groups_accumulator()?);
    }
    let function = function.clone();
    Ok(Box::new(GroupsAccumulatorAdapter::new(move || {
        function.create_accumulator()
    })))
}

/// `EXPLAIN` text for an aggregating operator: its kind, grouping
/// expressions and aggregates.
pub(super) fn describe(
    kind: &str,
    groups: &[Arc<dyn PhysicalExpr>],
    aggregates: &[AggregateSpec],
) -> String {
    let groups: Vec<String> = groups.iter().map(|e| e.to_string()).collect();
    let aggregates: Vec<&str> = aggregates.iter().map(|a| a.function.name()).collect();
    format!(
        "{kind} group by [{}] compute [{}]",
        groups.join(", "),
        aggregates.join(", ")
    )
}

/// The state columns of `aggregates` as a state table holds them: per
/// aggregate its accumulator's state fields, named after the aggregate's
/// position so two aggregates of the same name stay apart. Every column is
/// nullable: a group may hold no value yet.
pub(super) fn state_fields(aggregates: &[AggregateSpec]) -> Result<Vec<Field>> {
    let mut fields = Vec::new();
    for (i, aggregate) in aggregates.iter().enumerate() {
        for field in aggregate.function.state_fields()? {
            let name = format!("{i}:{}", field.name());
            fields.push(Field::new(name, field.data_type().clone(), true));
        }
    }
    Ok(fields)
}

/// How many state columns each aggregate has, in order.
pub(super) fn state_widths(aggregates: &[AggregateSpec]) -> Result<Vec<usize>> {
    aggregates
        .iter()
        .map(|a| Ok(a.function.state_fields()?.len()))
        .collect()
}

/// The fields of `schema` as nullable columns of a state table.
pub(super) fn nullable_fields(schema: &Schema) -> Vec<Field> {
    schema
        .fields()
        .iter()
        .map(|f| Field::new(f.name(), f.data_type().clone(), true))
        .collect()
}

/// A state table of `columns` under `fields`, cast where an accumulator
/// typed a column (a list's item field) otherwise than it declares.
pub(super) fn state_batch(fields: Vec<Field>, columns: Vec<ArrayRef>) -> Result<RecordBatch> {
    let columns = columns
        .into_iter()
        .zip(&fields)
        .map(|(c, f)| match c.data_type() == f.data_type() {
            true => Ok(c),
            false => cast(&c, f.data_type()),
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let schema = Arc::new(Schema::new(fields));
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// Table `name` of a checkpoint, refused unless its columns are those the
/// plan expects (same names and types, in order): a changed query must
/// not read state it does not understand.
pub(super) fn checked_table(
    state: &OperatorState,
    name: &str,
    expected: &[Field],
) -> Result<RecordBatch> {
    let table = state.table(name)?;
    let found = table.schema();
    let same = found.fields().len() == expected.len()
        && found
            .fields()
            .iter()
            .zip(expected)
            .all(|(f, e)| f.name() == e.name() && f.data_type() == e.data_type());
    if !same {
        let names = |fields: Vec<String>| fields.join(", ");
        return Err(Error::Plan(format!(
            "state table '{name}' has columns [{}], the query expects [{}]",
            names(found.fields().iter().map(|f| f.to_string()).collect()),
            names(expected.iter().map(|f| f.to_string()).collect()),
        )));
    }
    Ok(table.clone())
}

/// `batch` sorted by `columns`, ascending: state rows back in the order
/// the operator held them, however the checkpoint stored them.
pub(super) fn sorted_by(batch: &RecordBatch, columns: &[usize]) -> Result<RecordBatch> {
    if batch.num_rows() < 2 {
        return Ok(batch.clone());
    }
    let sort: Vec<SortColumn> = columns
        .iter()
        .map(|&i| SortColumn {
            values: batch.column(i).clone(),
            options: None,
        })
        .collect();
    let indices = lexsort_to_indices(&sort, None)?;
    Ok(take_record_batch(batch, &indices)?)
}

/// Column `index` of a state table as 64-bit integers.
pub(super) fn int64s(batch: &RecordBatch, index: usize) -> Result<&Int64Array> {
    batch
        .column(index)
        .as_primitive_opt::<Int64Type>()
        .ok_or_else(|| bad_column(batch, index))
}

/// Column `index` of a state table as booleans.
pub(super) fn booleans(batch: &RecordBatch, index: usize) -> Result<&BooleanArray> {
    batch
        .column(index)
        .as_boolean_opt()
        .ok_or_else(|| bad_column(batch, index))
}

fn bad_column(batch: &RecordBatch, index: usize) -> Error {
    Error::Plan(format!(
        "state column '{}' has the wrong type",
        batch.schema().field(index).name()
    ))
}

/// A one-column table of window starts (or ends): a set of windows.
pub(super) fn window_set(name: &str, windows: &BTreeSet<i64>) -> Result<RecordBatch> {
    let values: ArrayRef = Arc::new(Int64Array::from_iter_values(windows.iter().copied()));
    state_batch(vec![Field::new(name, DataType::Int64, true)], vec![values])
}

/// Reads back a [`window_set`] table.
pub(super) fn read_window_set(
    state: &OperatorState,
    table: &str,
    column: &str,
) -> Result<BTreeSet<i64>> {
    let batch = checked_table(state, table, &[Field::new(column, DataType::Int64, true)])?;
    Ok(int64s(&batch, 0)?.iter().flatten().collect())
}

/// An event time as a checkpoint scalar: `None` before any.
pub(super) fn time_scalar(value: i64) -> Option<i64> {
    (value != i64::MIN).then_some(value)
}

#[cfg(test)]
pub(super) mod testing {
    //! Aggregating operators as the planner builds them, for unit tests.

    use datafusion::arrow::record_batch::RecordBatch;

    use crate::connector::SourceStats;
    use crate::connectors::read_source;
    use crate::engine::{Engine, Outcome};
    use crate::exec::Operator;
    use crate::sql::parse_script;

    /// Rows of `m(ts, host, cpu)`, out of order, with a NULL key and a
    /// NULL value.
    pub const ROWS: &str = "ts,host,cpu\n1000,a,1.5\n2000,b,2.0\n1500,,3.25\n\
        12000,a,\n4000,b,0.7\n13000,a,4.0\n25000,b,1.0\n";

    /// The operators of `query` over `m` (watermark delay 1 s, allowed
    /// lateness `lateness`), and the input's batches of two rows.
    pub fn plan(query: &str, lateness: &str) -> (Vec<Box<dyn Operator>>, Vec<RecordBatch>) {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("m.csv"), ROWS).expect("writes");
        let script = format!(
            "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE, \
             WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) \
             WITH (path = 'm.csv', allowed_lateness = '{lateness}');\n{query}"
        );
        let mut engine = Engine::new();
        let mut graph = None;
        for statement in parse_script(&script).expect("parses") {
            if let Outcome::Query(q) = engine.execute(&statement, dir.path()).expect("plans") {
                graph = Some(q.graph);
            }
        }
        let graph = graph.expect("a query");
        let mut config = graph.inputs[0].stream.source.clone();
        config.batch_size = 2;
        let mut batches = Vec::new();
        read_source(&config, &SourceStats::default(), &mut |b| {
            batches.push(b);
            true
        })
        .expect("reads");
        let crate::planner::QueryGraph { inputs, stages, .. } = graph;
        let ops = inputs
            .into_iter()
            .flat_map(|i| i.stages)
            .chain(stages)
            .flat_map(|s| s.into_ops())
            .collect();
        (ops, batches)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::plan;
    use crate::exec::{Chain, END_OF_INPUT, Message};
    use crate::state::OperatorState;

    const QUERIES: [&str; 4] = [
        "SELECT window_start, host, count(*) AS n, sum(cpu) AS s, median(cpu) AS m \
         FROM HOP(m, ts, INTERVAL '5' SECOND, INTERVAL '10' SECOND) GROUP BY window_start, host",
        "SELECT window_start, window_end, host, avg(cpu) AS a, max(cpu) AS hi \
         FROM SESSION(m, ts, INTERVAL '3' SECOND) GROUP BY window_start, window_end, host",
        "SELECT host, count(*) AS n, min(cpu) AS lo FROM m GROUP BY host EMIT CHANGES",
        "SELECT window_start, host, sum(cpu) AS s FROM TUMBLE(m, ts, INTERVAL '10' SECOND) \
         GROUP BY window_start, host EMIT CHANGES",
    ];

    fn is_aggregate(describe: &str) -> bool {
        describe.contains("aggregate")
    }

    #[test]
    fn a_fresh_operator_snapshots_every_table_empty_with_its_schema() {
        let expected: [&[&str]; 4] = [
            &["panes", "pending", "dirty", "fired", "meta"],
            &["sessions", "meta"],
            &["groups"],
            &["groups"],
        ];
        for (query, tables) in QUERIES.iter().zip(expected) {
            let (mut ops, _) = plan(query, "0s");
            let op = ops
                .iter_mut()
                .find(|o| is_aggregate(&o.describe()))
                .unwrap();
            let state = op.snapshot().unwrap().expect("keeps state");
            let names: Vec<&str> = state.tables.iter().map(|t| t.name.as_str()).collect();
            assert_eq!(names, tables, "{query}");
            let main = &state.tables[0];
            assert_eq!(main.batch.num_rows(), 0, "{query}");
            // The key column `host`, then the accumulators' state columns.
            let schema = main.batch.schema();
            assert_eq!(main.key_columns.len(), 1, "{query}");
            assert_eq!(schema.field(main.key_columns[0]).name(), "host");
            assert!(schema.fields().len() > main.key_columns[0] + 2, "{query}");
            // Meta scalars are there, NULL before any row.
            if let Ok(meta) = state.table("meta") {
                assert_eq!(meta.num_rows(), 1);
                assert_eq!(state.scalar("meta", "watermark").unwrap(), None);
            }
            // A fresh snapshot restores into a fresh operator.
            let (mut again, _) = plan(query, "0s");
            let other = again
                .iter_mut()
                .find(|o| is_aggregate(&o.describe()))
                .unwrap();
            other.restore(state).unwrap();
        }
    }

    /// Snapshots taken at barriers: (barrier, operator, state).
    type Taken = Vec<(u64, usize, OperatorState)>;

    /// Runs the operators over the input with `barriers` barriers after
    /// each batch; the output rows and the snapshots taken.
    fn run(query: &str, barriers: u64) -> (Vec<String>, Taken) {
        let (ops, batches) = plan(query, "5s");
        let taken = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = taken.clone();
        let mut chain = Chain::new(ops).with_snapshots(Box::new(move |id, op, state| {
            sink.lock().unwrap().extend(state.map(|s| (id, op, s)));
            Ok(())
        }));
        let mut out = Vec::new();
        let messages = batches.into_iter().map(Message::Batch);
        for message in messages.chain([Message::Watermark(END_OF_INPUT)]) {
            out.extend(chain.process(message).unwrap());
            for id in 0..barriers {
                chain.process(Message::Barrier(id)).unwrap();
            }
        }
        let rows = out
            .iter()
            .filter_map(|m| match m {
                Message::Batch(b) | Message::Changes(b, _) => Some(format!("{m:?}{b:?}")),
                _ => None,
            })
            .collect();
        let states = std::mem::take(&mut *taken.lock().unwrap());
        (rows, states)
    }

    #[test]
    fn snapshots_in_a_row_change_nothing() {
        for query in QUERIES {
            let (plain, _) = run(query, 0);
            let (twice, states) = run(query, 2);
            assert_eq!(plain, twice, "{query}");
            // The second of two back-to-back snapshots equals the first.
            let tables = |s: &OperatorState| -> Vec<_> {
                s.tables
                    .iter()
                    .map(|t| (t.name.clone(), t.batch.clone()))
                    .collect()
            };
            let firsts = states.iter().filter(|(id, _, _)| *id == 0);
            let seconds = states.iter().filter(|(id, _, _)| *id == 1);
            let mut pairs = 0;
            for ((_, op_a, a), (_, op_b, b)) in firsts.zip(seconds) {
                assert_eq!(op_a, op_b);
                assert_eq!(tables(a), tables(b), "{query}");
                pairs += 1;
            }
            assert!(pairs > 0 && states.iter().any(|(_, _, s)| s.rows() > 1));
            // Keyed rows are keyed by the grouping keys, never the window.
            for (_, _, state) in &states {
                for table in &state.tables {
                    let schema = table.batch.schema();
                    let names: Vec<&str> = table
                        .key_columns
                        .iter()
                        .map(|&c| schema.field(c).name().as_str())
                        .collect();
                    assert!(names.is_empty() || names == ["host"], "{query}: {names:?}");
                    crate::state::key_groups(&table.batch, &table.key_columns).unwrap();
                }
            }
        }
    }

    #[test]
    fn a_snapshot_of_another_query_is_refused() {
        let (mut ops, _) = plan(QUERIES[0], "0s");
        let median = ops
            .iter_mut()
            .find(|o| is_aggregate(&o.describe()))
            .unwrap();
        let state = median.snapshot().unwrap().unwrap();
        let other = QUERIES[0].replace("median(cpu)", "max(cpu)");
        let (mut max_ops, _) = plan(&other, "0s");
        let max = max_ops
            .iter_mut()
            .find(|o| is_aggregate(&o.describe()))
            .unwrap();
        let error = max.restore(state).unwrap_err().to_string();
        assert!(error.contains("state table 'panes'"), "{error}");
    }
}
