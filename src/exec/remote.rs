//! Rows that come from another process's part of the query.
//!
//! In a group of processes (`vigil run --group`), a query can be cut in
//! two: the part before a stage that needs rows of every key (or before a
//! re-partitioning) runs per partition, and hands what it emits, rows and
//! watermarks, through an internal topic to the part after. A stream
//! cannot carry watermarks, so the stream read from the internal topic
//! (its [`remote_schema`]) has two more columns: a watermark row has
//! [`WATERMARK_COLUMN`] set and the rest null; a row of results has it
//! null and [`KIND_COLUMN`] saying what the results were (plain rows, or
//! changes of a [`RowKind`]). [`RemoteInOp`], the first operator of the
//! part after, turns them back into the messages the part before emitted.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, Int8Array, Int64Array};
use datafusion::arrow::datatypes::{DataType, Field, Int8Type, Int64Type, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;

use super::{Message, Operator};
use crate::connector::RowKind;
use crate::error::{Error, Result};

/// The column of a watermark row: the watermark, in epoch milliseconds.
pub const WATERMARK_COLUMN: &str = "_vigil_watermark";

/// The column saying what a row of results was: see [`kind_code`].
pub const KIND_COLUMN: &str = "_vigil_kind";

/// The schema of a stream of `boundary` rows with watermarks: its fields,
/// nullable (watermark rows have no values), then the two columns.
pub fn remote_schema(boundary: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = boundary
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    fields.push(Field::new(WATERMARK_COLUMN, DataType::Int64, true));
    fields.push(Field::new(KIND_COLUMN, DataType::Int8, true));
    Arc::new(Schema::new_with_metadata(
        fields,
        boundary.metadata().clone(),
    ))
}

/// What results were, as a number: 0 plain rows, then the [`RowKind`]s.
pub fn kind_code(kind: Option<RowKind>) -> i8 {
    match kind {
        None => 0,
        Some(RowKind::Insert) => 1,
        Some(RowKind::Update) => 2,
        Some(RowKind::Early) => 3,
    }
}

/// The kind [`kind_code`] gave `code`; an error for a code this build
/// does not know.
pub fn kind_of(code: i8) -> Result<Option<RowKind>> {
    match code {
        0 => Ok(None),
        1 => Ok(Some(RowKind::Insert)),
        2 => Ok(Some(RowKind::Update)),
        3 => Ok(Some(RowKind::Early)),
        _ => Err(Error::Connector(format!(
            "a row from another process says it is of kind {code}, which this build does not know"
        ))),
    }
}

/// One watermark row of `schema` (a [`remote_schema`]).
pub fn watermark_row(schema: &SchemaRef, watermark: i64) -> Result<RecordBatch> {
    let last = schema.fields().len() - 2;
    let mut columns: Vec<Arc<dyn Array>> = schema.fields()[..last]
        .iter()
        .map(|f| datafusion::arrow::array::new_null_array(f.data_type(), 1))
        .collect();
    columns.push(Arc::new(Int64Array::from(vec![watermark])));
    columns.push(Arc::new(Int8Array::from(vec![None::<i8>])));
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// `batch` of boundary rows as rows of `schema` (a [`remote_schema`]) of
/// results of `kind`.
pub fn result_rows(
    schema: &SchemaRef,
    batch: &RecordBatch,
    kind: Option<RowKind>,
) -> Result<RecordBatch> {
    let rows = batch.num_rows();
    let mut columns = batch.columns().to_vec();
    columns.push(datafusion::arrow::array::new_null_array(
        &DataType::Int64,
        rows,
    ));
    columns.push(Arc::new(Int8Array::from(vec![kind_code(kind); rows])));
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// Turns watermark rows into watermarks and result rows back into the
/// boundary rows (and kinds) they were. The reader of the internal topic
/// hands it one kind of row per batch.
pub struct RemoteInOp {
    boundary: SchemaRef,
}

impl RemoteInOp {
    /// For rows that were `boundary` rows before they were sent.
    pub fn new(boundary: SchemaRef) -> Self {
        Self { boundary }
    }

    fn restore_rows(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        let columns = batch.columns()[..self.boundary.fields().len()].to_vec();
        RecordBatch::try_new(self.boundary.clone(), columns).map_err(|e| {
            Error::Connector(format!(
                "rows from another process do not fit this query's plan (was the script changed on one process only?): {e}"
            ))
        })
    }
}

impl Operator for RemoteInOp {
    fn describe(&self) -> String {
        "remote input (rows and watermarks of the other processes' part)".to_string()
    }

    fn on_batch(&mut self, batch: RecordBatch, out: &mut Vec<Message>) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let width = batch.num_columns();
        if width != self.boundary.fields().len() + 2 {
            return Err(Error::Connector(format!(
                "rows from another process have {width} columns, this query's plan expects {}",
                self.boundary.fields().len() + 2
            )));
        }
        let watermarks = batch.column(width - 2).as_primitive::<Int64Type>();
        if watermarks.is_valid(0) {
            out.push(Message::Watermark(watermarks.value(0)));
            return Ok(());
        }
        let kinds = batch.column(width - 1).as_primitive::<Int8Type>();
        let rows = self.restore_rows(&batch)?;
        match kind_of(kinds.value(0))? {
            None => out.push(Message::Batch(rows)),
            Some(kind) => out.push(Message::Changes(rows, kind)),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::StringArray;

    fn boundary() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("host", DataType::Utf8, false),
            Field::new("n", DataType::Int64, false),
        ]))
    }

    #[test]
    fn rows_and_watermarks_come_back_as_they_were_sent() {
        let boundary = boundary();
        let remote = remote_schema(&boundary);
        let rows = RecordBatch::try_new(
            boundary.clone(),
            vec![
                Arc::new(StringArray::from(vec!["a", "b"])),
                Arc::new(Int64Array::from(vec![1, 2])),
            ],
        )
        .unwrap();
        let mut op = RemoteInOp::new(boundary.clone());
        let mut out = Vec::new();
        let sent = result_rows(&remote, &rows, Some(RowKind::Update)).unwrap();
        op.on_batch(sent, &mut out).unwrap();
        op.on_batch(watermark_row(&remote, 42).unwrap(), &mut out)
            .unwrap();
        op.on_batch(result_rows(&remote, &rows, None).unwrap(), &mut out)
            .unwrap();
        assert!(
            matches!(&out[0], Message::Changes(b, RowKind::Update) if *b == rows),
            "{out:?}"
        );
        assert!(matches!(out[1], Message::Watermark(42)), "{out:?}");
        assert!(
            matches!(&out[2], Message::Batch(b) if *b == rows),
            "{out:?}"
        );
    }

    #[test]
    fn rows_of_another_plan_are_an_error() {
        let remote = remote_schema(&boundary());
        let mut op = RemoteInOp::new(Arc::new(Schema::new(vec![Field::new(
            "x",
            DataType::Utf8,
            false,
        )])));
        let err = op
            .on_batch(watermark_row(&remote, 1).unwrap(), &mut Vec::new())
            .unwrap_err();
        assert!(err.to_string().contains("columns"), "{err}");
    }
}
