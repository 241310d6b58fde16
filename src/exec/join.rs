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

use super::Message;
use super::aggregate::evaluate_all;
use crate::error::Result;

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
