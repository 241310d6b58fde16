//! Operator state as it is checkpointed: named Arrow tables, keyed rows laid
//! out by key group.
//!
//! Every stateful operator can describe what it holds as an
//! [`OperatorState`]: a few tables of rows (open panes and their
//! accumulator states, alert episodes, history buffers) plus small
//! one-row tables of scalars (a watermark, a counter). Rows of a keyed
//! table belong to one of [`KEY_GROUPS`] key groups, chosen by a fixed hash
//! of their key columns, so a checkpoint can store each group apart and a
//! later run with another parallelism can read back just the groups an
//! instance owns (as Flink's key groups and max parallelism).
//!
//! The contract an operator keeps (see `exec::Operator::snapshot`):
//! - a snapshot leaves the operator as it was: what it emits afterwards is
//!   what it would have emitted without the snapshot;
//! - restoring a snapshot into a freshly built operator of the same plan and
//!   feeding it the rest of the input gives the same output, row for row and
//!   in the same order, as the uninterrupted operator;
//! - a fresh operator's snapshot has every table, empty, with its schema, so
//!   the restore can tell a changed state schema before reading anything.

pub mod position;
pub mod store;

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::hash_utils::{RandomState, create_hashes};

use crate::error::{Error, Result};

/// The number of key groups keyed state is divided into. It bounds the
/// parallelism a checkpoint can be restored at; changing it invalidates
/// every checkpoint.
pub const KEY_GROUPS: u16 = 128;

/// Seed of the key-group hash. Fixed, so a key lands in the same group in
/// every run and every process.
const KEY_GROUP_SEED: u64 = 0x7669_6769_6c00_0001;

/// The key group of every row of `batch`, from the values of its
/// `key_columns`. NULL keys hash like any other value.
pub fn key_groups(batch: &RecordBatch, key_columns: &[usize]) -> Result<Vec<u16>> {
    let arrays: Vec<ArrayRef> = key_columns
        .iter()
        .map(|&i| batch.column(i).clone())
        .collect();
    key_groups_of(&arrays, batch.num_rows())
}

/// The key group of every row, from the values of its key `arrays` (all
/// of one length, `rows`): [`key_groups`] over columns already evaluated,
/// as an exchange routing rows by their key computes them.
pub fn key_groups_of(arrays: &[ArrayRef], rows: usize) -> Result<Vec<u16>> {
    if arrays.is_empty() {
        return Ok(vec![0; rows]);
    }
    let mut hashes = vec![0u64; rows];
    create_hashes(arrays, &RandomState::with_seed(KEY_GROUP_SEED), &mut hashes)?;
    Ok(hashes
        .iter()
        .map(|h| (h % u64::from(KEY_GROUPS)) as u16)
        .collect())
}

/// The instance, of `instances`, that owns key group `group`: contiguous
/// ranges of groups, so a rescale moves whole ranges (as Flink assigns key
/// groups to subtasks).
pub fn instance_of(group: u16, instances: usize) -> usize {
    usize::from(group) * instances / usize::from(KEY_GROUPS)
}

/// One table of an operator's state.
#[derive(Debug, Clone)]
pub struct StateTable {
    /// Its name within the operator, such as `panes` or `meta`.
    pub name: String,
    /// The rows.
    pub batch: RecordBatch,
    /// The columns holding each row's key. Empty for a table that belongs
    /// to no key (a watermark, a timer): it is stored whole and every
    /// instance of a rescaled operator reads it.
    pub key_columns: Vec<usize>,
}

/// What one operator holds at a checkpoint.
#[derive(Debug, Clone, Default)]
pub struct OperatorState {
    /// The tables, in the order the operator added them.
    pub tables: Vec<StateTable>,
}

impl OperatorState {
    /// An empty state to add tables to.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a table of rows keyed by `key_columns` (empty: not keyed).
    pub fn add(&mut self, name: &str, batch: RecordBatch, key_columns: Vec<usize>) {
        self.tables.push(StateTable {
            name: name.to_string(),
            batch,
            key_columns,
        });
    }

    /// Adds a one-row table of named 64-bit integers (`NULL` for `None`):
    /// the operator's scalars, such as its watermark.
    pub fn add_scalars(&mut self, name: &str, values: &[(&str, Option<i64>)]) {
        let fields: Vec<Field> = values
            .iter()
            .map(|(n, _)| Field::new(*n, DataType::Int64, true))
            .collect();
        let columns: Vec<ArrayRef> = values
            .iter()
            .map(|(_, v)| Arc::new(Int64Array::from(vec![*v])) as ArrayRef)
            .collect();
        let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
            .expect("one row per column, as declared");
        self.add(name, batch, Vec::new());
    }

    /// The table called `name`.
    pub fn table(&self, name: &str) -> Result<&RecordBatch> {
        self.tables
            .iter()
            .find(|t| t.name == name)
            .map(|t| &t.batch)
            .ok_or_else(|| Error::Plan(format!("the checkpoint has no state table '{name}'")))
    }

    /// The table called `name`, which must have the columns of `schema`
    /// (names and types, in order): rows the operator keeps as they came.
    pub fn table_of(&self, name: &str, schema: &SchemaRef) -> Result<RecordBatch> {
        let table = self.table(name)?;
        let names = |s: &Schema| -> Vec<(String, DataType)> {
            s.fields()
                .iter()
                .map(|f| (f.name().clone(), f.data_type().clone()))
                .collect()
        };
        if names(&table.schema()) != names(schema) {
            return Err(Error::Plan(format!(
                "state table '{name}' has columns {:?}, the plan expects {:?}",
                names(&table.schema()),
                names(schema)
            )));
        }
        Ok(RecordBatch::try_new(
            schema.clone(),
            table.columns().to_vec(),
        )?)
    }

    /// Scalar `column` of the one-row table `name`; `None` for NULL.
    pub fn scalar(&self, name: &str, column: &str) -> Result<Option<i64>> {
        let table = self.table(name)?;
        let array = table
            .column_by_name(column)
            .ok_or_else(|| Error::Plan(format!("state table '{name}' has no column '{column}'")))?;
        if table.num_rows() != 1 || array.data_type() != &DataType::Int64 {
            return Err(Error::Plan(format!(
                "state table '{name}' column '{column}' is not one 64-bit integer"
            )));
        }
        let values = array.as_primitive::<Int64Type>();
        Ok(values.is_valid(0).then(|| values.value(0)))
    }

    /// The schema of every table, by name, to compare a checkpoint with
    /// the plan restoring it.
    pub fn schemas(&self) -> Vec<(String, SchemaRef)> {
        self.tables
            .iter()
            .map(|t| (t.name.clone(), t.batch.schema()))
            .collect()
    }

    /// Total rows over all tables.
    pub fn rows(&self) -> usize {
        self.tables.iter().map(|t| t.batch.num_rows()).sum()
    }

    /// One state from the snapshots of the instances of a key-partitioned
    /// operator (at least one, all of the same operator), so a checkpoint
    /// does not depend on the parallelism it was taken at:
    /// - a keyed table holds every instance's rows (their keys are
    ///   disjoint);
    /// - a table without keys that all instances agree on is kept once;
    /// - one-row tables of integers that differ (each instance's counter or
    ///   watermark) keep the largest value of each column: the scalars of
    ///   keyed operators only go up;
    /// - other tables without keys are sets (the windows pending, fired):
    ///   their union, each row once.
    pub fn combine(parts: Vec<OperatorState>) -> Result<OperatorState> {
        let mut parts = parts.into_iter();
        let mut combined = parts
            .next()
            .ok_or_else(|| Error::Plan("no instance state to combine".into()))?;
        let rest: Vec<OperatorState> = parts.collect();
        for (index, table) in combined.tables.iter_mut().enumerate() {
            let others: Vec<&StateTable> = rest
                .iter()
                .map(|p| {
                    p.tables
                        .get(index)
                        .filter(|t| t.name == table.name)
                        .ok_or_else(|| {
                            Error::Plan(format!(
                                "instances of one operator disagree on state table '{}'",
                                table.name
                            ))
                        })
                })
                .collect::<Result<_>>()?;
            table.batch = combine_table(table, &others)?;
        }
        Ok(combined)
    }

    /// What instance `instance` of `instances` takes of a combined state:
    /// the rows of keyed tables whose key group it owns
    /// ([`instance_of`]), and every table without keys whole.
    pub fn split(&self, instance: usize, instances: usize) -> Result<OperatorState> {
        let mut part = self.clone();
        for table in part.tables.iter_mut().filter(|t| !t.key_columns.is_empty()) {
            let groups = key_groups(&table.batch, &table.key_columns)?;
            let mine: datafusion::arrow::array::BooleanArray = groups
                .iter()
                .map(|&g| Some(instance_of(g, instances) == instance))
                .collect();
            table.batch = datafusion::arrow::compute::filter_record_batch(&table.batch, &mine)?;
        }
        Ok(part)
    }
}

/// `table` combined with the same table of the other instances (see
/// [`OperatorState::combine`]).
fn combine_table(table: &StateTable, others: &[&StateTable]) -> Result<RecordBatch> {
    let schema = table.batch.schema();
    let all: Vec<&RecordBatch> = std::iter::once(&table.batch)
        .chain(others.iter().map(|t| &t.batch))
        .collect();
    if !table.key_columns.is_empty() {
        return Ok(datafusion::arrow::compute::concat_batches(&schema, all)?);
    }
    if all.iter().all(|b| *b == &table.batch) {
        return Ok(table.batch.clone());
    }
    let scalars = all.iter().all(|b| b.num_rows() == 1)
        && schema
            .fields()
            .iter()
            .all(|f| f.data_type() == &DataType::Int64);
    if scalars {
        return largest_scalars(&schema, &all);
    }
    distinct_rows(&schema, &all)
}

/// Per column, the largest non-NULL value of the one-row tables `all`.
fn largest_scalars(schema: &SchemaRef, all: &[&RecordBatch]) -> Result<RecordBatch> {
    let columns = (0..schema.fields().len())
        .map(|c| {
            let largest = all
                .iter()
                .filter_map(|b| {
                    let values = b.column(c).as_primitive::<Int64Type>();
                    values.is_valid(0).then(|| values.value(0))
                })
                .max();
            Arc::new(Int64Array::from(vec![largest])) as ArrayRef
        })
        .collect();
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// The rows of `all`, each distinct row once, in first-seen order.
fn distinct_rows(schema: &SchemaRef, all: &[&RecordBatch]) -> Result<RecordBatch> {
    use datafusion::arrow::row::{RowConverter, SortField};
    let rows = datafusion::arrow::compute::concat_batches(schema, all.iter().copied())?;
    let converter = RowConverter::new(
        schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect(),
    )?;
    let converted = converter.convert_columns(rows.columns())?;
    let mut seen = std::collections::HashSet::new();
    let keep: datafusion::arrow::array::BooleanArray = (0..rows.num_rows())
        .map(|i| Some(seen.insert(converted.row(i))))
        .collect();
    Ok(datafusion::arrow::compute::filter_record_batch(
        &rows, &keep,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::StringArray;

    #[test]
    fn key_groups_are_stable_and_in_range() {
        let schema = Arc::new(Schema::new(vec![Field::new("host", DataType::Utf8, true)]));
        let hosts: Vec<Option<String>> = (0..1000)
            .map(|i| Some(format!("h{i}")))
            .chain([None])
            .collect();
        let batch = RecordBatch::try_new(schema, vec![Arc::new(StringArray::from(hosts))]).unwrap();
        let first = key_groups(&batch, &[0]).unwrap();
        assert_eq!(first, key_groups(&batch, &[0]).unwrap());
        assert!(first.iter().all(|g| *g < KEY_GROUPS));
        let used: std::collections::BTreeSet<u16> = first.iter().copied().collect();
        assert!(used.len() > 100, "1000 keys spread over the groups");
        assert_eq!(key_groups(&batch, &[]).unwrap(), vec![0; 1001]);
    }

    fn keyed_state(hosts: &[&str], pending: &[i64], watermark: i64) -> OperatorState {
        let schema = Arc::new(Schema::new(vec![Field::new("host", DataType::Utf8, true)]));
        let rows = RecordBatch::try_new(schema, vec![Arc::new(StringArray::from(hosts.to_vec()))])
            .unwrap();
        let set_schema = Arc::new(Schema::new(vec![Field::new(
            "start",
            DataType::Int64,
            true,
        )]));
        let set = RecordBatch::try_new(
            set_schema,
            vec![Arc::new(Int64Array::from(pending.to_vec()))],
        )
        .unwrap();
        let mut state = OperatorState::new();
        state.add("rows", rows, vec![0]);
        state.add("pending", set, Vec::new());
        state.add_scalars(
            "meta",
            &[("watermark", Some(watermark)), ("fixed", Some(1))],
        );
        state
    }

    fn strings(batch: &RecordBatch) -> Vec<String> {
        let mut values: Vec<String> = batch
            .column(0)
            .as_string::<i32>()
            .iter()
            .map(|v| v.unwrap_or("").to_string())
            .collect();
        values.sort();
        values
    }

    #[test]
    fn instance_states_combine_and_split_by_key_group() {
        let a = keyed_state(&["a", "b"], &[10, 20], 5);
        let b = keyed_state(&["c"], &[20, 30], 7);
        let combined = OperatorState::combine(vec![a, b]).unwrap();
        assert_eq!(strings(combined.table("rows").unwrap()), ["a", "b", "c"]);
        let pending = combined.table("pending").unwrap();
        let starts = pending
            .column(0)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        assert_eq!(starts, vec![10, 20, 30], "a set, each window once");
        assert_eq!(combined.scalar("meta", "watermark").unwrap(), Some(7));
        assert_eq!(combined.scalar("meta", "fixed").unwrap(), Some(1));
        for instances in [1, 2, 3] {
            let mut seen = Vec::new();
            for instance in 0..instances {
                let part = combined.split(instance, instances).unwrap();
                assert_eq!(part.table("pending").unwrap().num_rows(), 3);
                let rows = part.table("rows").unwrap();
                for g in key_groups(rows, &[0]).unwrap() {
                    assert_eq!(instance_of(g, instances), instance);
                }
                seen.extend(strings(rows));
            }
            seen.sort();
            assert_eq!(seen, ["a", "b", "c"], "every key in exactly one instance");
        }
    }

    #[test]
    fn key_groups_map_onto_instances_in_ranges() {
        assert_eq!(instance_of(0, 3), 0);
        assert_eq!(instance_of(KEY_GROUPS - 1, 3), 2);
        for n in 1..=8 {
            let owners: Vec<usize> = (0..KEY_GROUPS).map(|g| instance_of(g, n)).collect();
            assert!(owners.windows(2).all(|w| w[0] <= w[1]));
            assert_eq!(
                owners
                    .iter()
                    .copied()
                    .collect::<std::collections::BTreeSet<_>>()
                    .len(),
                n
            );
        }
    }

    #[test]
    fn a_table_of_other_columns_is_refused() {
        let schema = Arc::new(Schema::new(vec![Field::new("host", DataType::Utf8, true)]));
        let mut state = OperatorState::new();
        state.add("rows", RecordBatch::new_empty(schema.clone()), vec![0]);
        assert_eq!(state.table_of("rows", &schema).unwrap().num_rows(), 0);
        let other = Arc::new(Schema::new(vec![Field::new("host", DataType::Int64, true)]));
        let e = state.table_of("rows", &other).unwrap_err().to_string();
        assert!(e.contains("the plan expects"), "{e}");
    }

    #[test]
    fn scalars_round_trip() {
        let mut state = OperatorState::new();
        state.add_scalars("meta", &[("watermark", Some(42)), ("timer", None)]);
        assert_eq!(state.scalar("meta", "watermark").unwrap(), Some(42));
        assert_eq!(state.scalar("meta", "timer").unwrap(), None);
        assert!(state.scalar("meta", "other").is_err());
        assert!(state.table("panes").is_err());
    }
}
