//! `UNNEST` of list columns in a stateless query: one row per element.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::UnnestOptions;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::common::collect;
use datafusion::physical_plan::unnest::{ListUnnest, UnnestExec};

use super::{Message, Operator};
use crate::error::Result;

/// Unnests list columns (and expands struct columns) of each batch, as
/// DataFusion's `UnnestExec` does it in a batch query, so a continuous
/// query gives the rows the same query gives over a table.
pub struct UnnestOp {
    input: SchemaRef,
    lists: Vec<ListUnnest>,
    structs: Vec<usize>,
    schema: SchemaRef,
    options: UnnestOptions,
    task: Arc<TaskContext>,
}

impl UnnestOp {
    /// An operator turning rows of `input` into rows of `schema`, unnesting
    /// the list columns `lists` (by index in `input`, each to its depth)
    /// and the struct columns `structs`.
    pub fn new(
        input: SchemaRef,
        lists: Vec<ListUnnest>,
        structs: Vec<usize>,
        schema: SchemaRef,
        options: UnnestOptions,
    ) -> Self {
        Self {
            input,
            lists,
            structs,
            schema,
            options,
            task: Arc::new(TaskContext::default()),
        }
    }
}

impl Operator for UnnestOp {
    fn describe(&self) -> String {
        let columns: Vec<String> = self
            .lists
            .iter()
            .map(|l| self.input.field(l.index_in_input_schema).name().clone())
            .chain(
                self.structs
                    .iter()
                    .map(|&i| self.input.field(i).name().clone()),
            )
            .collect();
        format!("unnest {}", columns.join(", "))
    }

    fn on_batch(&mut self, batch: RecordBatch, out: &mut Vec<Message>) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let rows = MemorySourceConfig::try_new_exec(&[vec![batch]], self.input.clone(), None)?;
        let exec = UnnestExec::new(
            rows,
            self.lists.clone(),
            self.structs.clone(),
            self.schema.clone(),
            self.options.clone(),
        )?;
        // Over an in-memory batch the stream is ready at once: nothing in
        // it waits on I/O or spawns a task.
        let stream = exec.execute(0, self.task.clone())?;
        for batch in futures::executor::block_on(collect(stream))? {
            if batch.num_rows() > 0 {
                out.push(Message::Batch(batch));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{AsArray, Int64Array, ListArray, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};

    use super::*;

    #[test]
    fn one_row_per_element() {
        let input = Arc::new(Schema::new(vec![
            Field::new("host", DataType::Utf8, true),
            Field::new("xs", DataType::new_list(DataType::Int64, true), true),
        ]));
        let output = Arc::new(Schema::new(vec![
            Field::new("host", DataType::Utf8, true),
            Field::new("xs", DataType::Int64, true),
        ]));
        let xs = ListArray::from_iter_primitive::<Int64Type, _, _>([
            Some(vec![Some(1), Some(2)]),
            Some(vec![]),
            None,
            Some(vec![Some(3)]),
        ]);
        let batch = RecordBatch::try_new(
            input.clone(),
            vec![
                Arc::new(StringArray::from(vec!["a", "b", "c", "d"])),
                Arc::new(xs),
            ],
        )
        .unwrap();
        let lists = vec![ListUnnest {
            index_in_input_schema: 1,
            depth: 1,
        }];
        let options = UnnestOptions::new().with_preserve_nulls(false);
        let mut op = UnnestOp::new(input, lists, vec![], output, options);
        let mut out = Vec::new();
        op.on_batch(batch, &mut out).unwrap();
        let Message::Batch(rows) = &out[0] else {
            panic!("expected rows");
        };
        let hosts: Vec<&str> = rows.column(0).as_string::<i32>().iter().flatten().collect();
        assert_eq!(hosts, ["a", "a", "d"]);
        let xs = rows
            .column(1)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        assert_eq!(xs.values(), &[1, 2, 3]);
        assert_eq!(op.describe(), "unnest xs");
    }
}
