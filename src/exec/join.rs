//! Window joins: two streams' rows of the same window and key, paired when
//! the window closes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray, UInt32Array};
use datafusion::arrow::compute::{concat_batches, filter_record_batch, take};
use datafusion::arrow::datatypes::{SchemaRef, TimestampMillisecondType};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;

use super::Message;
use super::aggregate::evaluate_all;
use crate::error::Result;
use crate::state::OperatorState;

/// The planner's description of a window join.
#[derive(Debug, Clone)]
pub struct WindowJoinSpec {
    /// Join keys evaluated on the left rows (the window column among them).
    pub left_keys: Vec<Arc<dyn PhysicalExpr>>,
    /// The matching keys on the right rows.
    pub right_keys: Vec<Arc<dyn PhysicalExpr>>,
    /// The left input's column that gives the window, and what to add to
    /// it for the window's end.
    pub left_window_end: (usize, i64),
    /// The same for the right input.
    pub right_window_end: (usize, i64),
    /// The rest of the `ON` condition, over the joined row.
    pub filter: Option<Arc<dyn PhysicalExpr>>,
    /// Schema of the left rows.
    pub left_schema: SchemaRef,
    /// Schema of the right rows.
    pub right_schema: SchemaRef,
    /// Output schema: left columns, then right columns.
    pub schema: SchemaRef,
}

/// An inner join of two windowed streams on equal keys within the same
/// window. Each side's rows are kept per window until the merged watermark
/// reaches the window's end; then the window's rows are paired by a hash
/// lookup on the keys (Arrow's row format), emitted, and dropped. A row
/// cannot arrive for a window already joined: that window had closed on its
/// own stream too, so the row was dropped there as late.
pub struct WindowJoin {
    spec: WindowJoinSpec,
    converter: RowConverter,
    /// Per window end: the buffered rows of each side.
    windows: BTreeMap<i64, [Vec<RecordBatch>; 2]>,
}

impl WindowJoin {
    /// A window join as the planner describes it.
    pub fn new(spec: WindowJoinSpec) -> Result<Self> {
        let fields = spec
            .left_keys
            .iter()
            .map(|k| Ok(SortField::new(k.data_type(&spec.left_schema)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            converter: RowConverter::new(fields)?,
            spec,
            windows: BTreeMap::new(),
        })
    }

    /// A line for `EXPLAIN`.
    pub fn describe(&self) -> String {
        let keys: Vec<String> = self
            .spec
            .left_keys
            .iter()
            .zip(&self.spec.right_keys)
            .map(|(l, r)| format!("{l} = {r}"))
            .collect();
        format!("window join on [{}]", keys.join(", "))
    }

    /// Buffers rows of side 0 (left) or 1 (right) by window.
    pub fn on_rows(&mut self, side: usize, batch: RecordBatch) -> Result<()> {
        let (column, offset) = if side == 0 {
            self.spec.left_window_end
        } else {
            self.spec.right_window_end
        };
        let values = batch
            .column(column)
            .as_primitive::<TimestampMillisecondType>()
            .clone();
        let mut rows_by_end: HashMap<i64, Vec<u32>> = HashMap::new();
        for (row, value) in values.values().iter().enumerate() {
            rows_by_end
                .entry(value + offset)
                .or_default()
                .push(row as u32);
        }
        for (end, rows) in rows_by_end {
            let part = if rows.len() == batch.num_rows() {
                batch.clone()
            } else {
                take_rows(&batch, &UInt32Array::from(rows))?
            };
            self.windows.entry(end).or_default()[side].push(part);
        }
        Ok(())
    }

    /// Joins and emits every window that ends at or before `watermark`.
    pub fn on_watermark(&mut self, watermark: i64, out: &mut Vec<Message>) -> Result<()> {
        while let Some((&end, _)) = self.windows.first_key_value() {
            if end > watermark {
                break;
            }
            let [left, right] = self.windows.remove(&end).expect("present");
            if let Some(batch) = self.join(&left, &right)? {
                out.push(Message::Batch(batch));
            }
        }
        out.push(Message::Watermark(watermark));
        Ok(())
    }

    /// The buffered rows of each side (tables `left` and `right`), window
    /// by window in order of their end, each window's rows as they came;
    /// keyed by the join keys where those are plain columns.
    pub fn snapshot(&mut self) -> Result<OperatorState> {
        let mut state = OperatorState::new();
        for side in 0..2 {
            let rows: Vec<RecordBatch> = self
                .windows
                .values()
                .flat_map(|sides| sides[side].iter().cloned())
                .collect();
            let (name, schema, keys) = self.side(side);
            let key_columns = keys
                .iter()
                .map(|k| k.as_ref().downcast_ref::<Column>().map(|c| c.index()))
                .collect::<Option<Vec<usize>>>()
                .unwrap_or_default();
            state.add(name, concat_batches(schema, &rows)?, key_columns);
        }
        Ok(state)
    }

    /// Takes back the buffered rows of a snapshot.
    pub fn restore(&mut self, state: OperatorState) -> Result<()> {
        for side in 0..2 {
            let (name, schema, _) = self.side(side);
            let rows = state.table_of(name, schema)?;
            if rows.num_rows() > 0 {
                self.on_rows(side, rows)?;
            }
        }
        Ok(())
    }

    /// The state table name, schema and join keys of side 0 or 1.
    fn side(&self, side: usize) -> (&'static str, &SchemaRef, &[Arc<dyn PhysicalExpr>]) {
        match side {
            0 => ("left", &self.spec.left_schema, &self.spec.left_keys),
            _ => ("right", &self.spec.right_schema, &self.spec.right_keys),
        }
    }

    fn join(&self, left: &[RecordBatch], right: &[RecordBatch]) -> Result<Option<RecordBatch>> {
        if left.is_empty() || right.is_empty() {
            return Ok(None);
        }
        let left = concat_batches(&self.spec.left_schema, left)?;
        let right = concat_batches(&self.spec.right_schema, right)?;
        let left_keys = self
            .converter
            .convert_columns(&evaluate_all(&self.spec.left_keys, &left)?)?;
        let right_keys = self
            .converter
            .convert_columns(&evaluate_all(&self.spec.right_keys, &right)?)?;
        let mut table: HashMap<&[u8], Vec<u32>> = HashMap::new();
        for row in 0..right.num_rows() {
            table
                .entry(right_keys.row(row).data())
                .or_default()
                .push(row as u32);
        }
        let (mut left_rows, mut right_rows) = (Vec::new(), Vec::new());
        for row in 0..left.num_rows() {
            if let Some(matches) = table.get(left_keys.row(row).data()) {
                left_rows.extend(std::iter::repeat_n(row as u32, matches.len()));
                right_rows.extend_from_slice(matches);
            }
        }
        if left_rows.is_empty() {
            return Ok(None);
        }
        let mut columns: Vec<ArrayRef> = take_columns(&left, &UInt32Array::from(left_rows))?;
        columns.extend(take_columns(&right, &UInt32Array::from(right_rows))?);
        let joined = RecordBatch::try_new(self.spec.schema.clone(), columns)?;
        let Some(filter) = &self.spec.filter else {
            return Ok(Some(joined));
        };
        let mask = filter.evaluate(&joined)?.into_array(joined.num_rows())?;
        let kept = filter_record_batch(&joined, mask.as_boolean())?;
        Ok((kept.num_rows() > 0).then_some(kept))
    }
}

fn take_columns(batch: &RecordBatch, rows: &UInt32Array) -> Result<Vec<ArrayRef>> {
    Ok(batch
        .columns()
        .iter()
        .map(|c| take(c, rows, None))
        .collect::<std::result::Result<_, _>>()?)
}

fn take_rows(batch: &RecordBatch, rows: &UInt32Array) -> Result<RecordBatch> {
    Ok(RecordBatch::try_new(
        batch.schema(),
        take_columns(batch, rows)?,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Float64Array, StringArray, TimestampMillisecondArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    use datafusion::arrow::util::display::array_value_to_string;
    use datafusion::physical_expr::expressions::col;

    fn side_schema(value: &str) -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new(
                "window_end",
                DataType::Timestamp(TimeUnit::Millisecond, None),
                false,
            ),
            Field::new("host", DataType::Utf8, true),
            Field::new(value, DataType::Float64, true),
        ]))
    }

    /// Joined on window and host, as the planner describes `l JOIN r ON
    /// l.window_end = r.window_end AND l.host = r.host`.
    fn join() -> WindowJoin {
        let (left, right) = (side_schema("cpu"), side_schema("mem"));
        let keys = |s: &SchemaRef| vec![col("window_end", s).unwrap(), col("host", s).unwrap()];
        let mut fields = left.fields().to_vec();
        fields.extend(right.fields().iter().cloned());
        WindowJoin::new(WindowJoinSpec {
            left_keys: keys(&left),
            right_keys: keys(&right),
            left_window_end: (0, 0),
            right_window_end: (0, 0),
            filter: None,
            left_schema: left,
            right_schema: right,
            schema: Arc::new(Schema::new(fields)),
        })
        .unwrap()
    }

    enum Step {
        Rows(usize, RecordBatch),
        Watermark(i64),
    }

    fn rows(side: usize, rows: &[(i64, &str, f64)]) -> Step {
        let schema = side_schema(if side == 0 { "cpu" } else { "mem" });
        let ends = TimestampMillisecondArray::from_iter_values(rows.iter().map(|r| r.0));
        let hosts = StringArray::from_iter_values(rows.iter().map(|r| r.1));
        let values = Float64Array::from_iter_values(rows.iter().map(|r| r.2));
        let batch = RecordBatch::try_new(
            schema,
            vec![Arc::new(ends), Arc::new(hosts), Arc::new(values)],
        )
        .unwrap();
        Step::Rows(side, batch)
    }

    fn steps() -> Vec<Step> {
        vec![
            rows(0, &[(10, "a", 1.0), (10, "b", 2.0), (20, "a", 3.0)]),
            rows(1, &[(10, "a", 10.0), (20, "a", 30.0)]),
            rows(0, &[(10, "a", 1.5)]),
            rows(1, &[(10, "b", 20.0), (10, "a", 11.0), (30, "c", 5.0)]),
            Step::Watermark(10),
            rows(0, &[(20, "a", 3.5), (30, "c", 6.0)]),
            rows(1, &[(20, "b", 31.0), (20, "a", 32.0)]),
            Step::Watermark(25),
            rows(0, &[(40, "a", 7.0)]),
            Step::Watermark(super::super::END_OF_INPUT),
        ]
    }

    fn run(join: &mut WindowJoin, steps: &[Step]) -> Vec<String> {
        let mut out = Vec::new();
        for step in steps {
            match step {
                Step::Rows(side, batch) => join.on_rows(*side, batch.clone()).unwrap(),
                Step::Watermark(w) => join.on_watermark(*w, &mut out).unwrap(),
            }
        }
        out.iter()
            .filter_map(|m| match m {
                Message::Batch(b) => Some(b),
                _ => None,
            })
            .flat_map(|b| {
                (0..b.num_rows()).map(move |r| {
                    let values: Vec<String> = b
                        .columns()
                        .iter()
                        .map(|c| array_value_to_string(c, r).unwrap())
                        .collect();
                    values.join(",")
                })
            })
            .collect()
    }

    #[test]
    fn restores_its_buffered_windows_in_order() {
        let steps = steps();
        let straight = run(&mut join(), &steps);
        assert_eq!(straight.len(), 10, "{straight:?}");
        for cut in 0..=steps.len() {
            let mut first = join();
            let before = run(&mut first, &steps[..cut]);
            let state = first.snapshot().unwrap();
            assert_eq!(state.tables[0].key_columns, vec![0, 1]);
            let carried_on = run(&mut first, &steps[cut..]);
            assert_eq!([before.clone(), carried_on].concat(), straight, "cut {cut}");
            let mut restored = join();
            restored.restore(state).unwrap();
            let after = run(&mut restored, &steps[cut..]);
            assert_eq!([before, after].concat(), straight, "cut {cut}");
        }
    }

    #[test]
    fn a_fresh_snapshot_has_both_sides_empty() {
        let state = join().snapshot().unwrap();
        let names: Vec<&str> = state.tables.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["left", "right"]);
        assert_eq!(state.rows(), 0);
        let mut wrong = state.clone();
        wrong.tables.swap(0, 1);
        wrong.tables[0].name = "left".into();
        wrong.tables[1].name = "right".into();
        assert!(join().restore(wrong).is_err(), "a side of other columns");
    }
}
