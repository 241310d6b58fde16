//! The `panes` state table: a window aggregate's panes, live and frozen
//! parts, saved for a checkpoint and read back.

use super::*;

/// Leading columns of the `panes` state table, before the key and state
/// columns: which pane a row belongs to, whether it is of the live part
/// (rows since the pane was last read) or of frozen part `part`, and its
/// group id within that part.
pub(in crate::exec) const PANE_COLUMNS: usize = 4;

impl WindowAggregateOp {
    /// Columns of the `panes` table: pane start, live, part, group, the
    /// grouping keys, then every aggregate's state.
    pub(in crate::exec) fn pane_fields(&self) -> Result<Vec<Field>> {
        let mut fields = vec![
            Field::new("pane_start", DataType::Int64, true),
            Field::new("live", DataType::Boolean, true),
            Field::new("part", DataType::Int64, true),
            Field::new("group", DataType::Int64, true),
        ];
        fields.extend(aggregate::nullable_fields(&self.spec.key_schema));
        fields.extend(aggregate::state_fields(&self.spec.aggregates)?);
        Ok(fields)
    }

    /// Every pane's parts as rows: the frozen parts as they are, the live
    /// part's state drained and merged back.
    pub(in crate::exec) fn pane_table(&mut self) -> Result<RecordBatch> {
        let fields = self.pane_fields()?;
        let mut parts = vec![RecordBatch::new_empty(Arc::new(Schema::new(
            fields.clone(),
        )))];
        let starts: Vec<i64> = self.panes.keys().copied().collect();
        for start in starts {
            let fresh = self.new_groups()?;
            let pane = self.panes.get_mut(&start).expect("listed above");
            let live = pane.live.snapshot(fresh)?;
            for (index, frozen) in pane.frozen.iter().enumerate() {
                parts.push(part_rows(&fields, start, false, index, frozen)?);
            }
            if live.rows() > 0 {
                parts.push(part_rows(&fields, start, true, 0, &live)?);
            }
        }
        Ok(concat_batches(&parts[0].schema(), &parts)?)
    }

    /// Rebuilds the panes from a `panes` table.
    pub(in crate::exec) fn restore_panes(&mut self, table: &RecordBatch) -> Result<()> {
        let table = aggregate::sorted_by(table, &[0, 1, 2, 3])?;
        let keys = self.spec.key_schema.fields().len();
        let widths = aggregate::state_widths(&self.spec.aggregates)?;
        let starts = aggregate::int64s(&table, 0)?.clone();
        let live = aggregate::booleans(&table, 1)?.clone();
        let parts = aggregate::int64s(&table, 2)?.clone();
        let same_part = |a: usize, b: usize| {
            starts.value(a) == starts.value(b)
                && live.value(a) == live.value(b)
                && parts.value(a) == parts.value(b)
        };
        let mut row = 0;
        while row < table.num_rows() {
            let run = (row..table.num_rows())
                .take_while(|&r| same_part(row, r))
                .count();
            let slice = table.slice(row, run);
            let columns = &slice.columns()[PANE_COLUMNS..];
            let frozen =
                Frozen::from_columns(columns[..keys].to_vec(), &columns[keys..], &widths, run);
            let start = starts.value(row);
            if !self.panes.contains_key(&start) {
                let live = self.new_groups()?;
                let frozen = Vec::new();
                self.panes.insert(start, Pane { live, frozen });
            }
            let pane = self.panes.get_mut(&start).expect("inserted above");
            if live.value(row) {
                pane.live.merge(&frozen)?;
            } else {
                pane.frozen.push(frozen);
            }
            row += run;
        }
        Ok(())
    }
}

/// The rows of one part of a pane.
pub(in crate::exec) fn part_rows(
    fields: &[Field],
    start: i64,
    live: bool,
    part: usize,
    frozen: &Frozen,
) -> Result<RecordBatch> {
    let rows = frozen.rows();
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![start; rows])),
        Arc::new(BooleanArray::from(vec![live; rows])),
        Arc::new(Int64Array::from(vec![part as i64; rows])),
        Arc::new(Int64Array::from_iter_values(0..rows as i64)),
    ];
    columns.extend(frozen.columns());
    aggregate::state_batch(fields.to_vec(), columns)
}
