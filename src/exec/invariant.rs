//! The invariant operator: learn a set or range of one column per key
//! during training, then judge every later row against it.
//!
//! Rows are taken in arrival order. `OFFLINE` freezes what was learned when
//! training ends, so every later row outside it is a violation; `ONLINE`
//! keeps learning from every judged row, so a new value or a new extreme is
//! a violation once and then belongs to the invariant (SAQL's online mode).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float64Array, Int64Array, ListBuilder, RecordBatch,
    StringArray, StringBuilder, UInt32Array,
};
use datafusion::arrow::compute::{cast, take_record_batch};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema, SchemaRef};
use datafusion::arrow::row::{OwnedRow, RowConverter, SortField};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};

use super::alert::event_times;
use super::{Message, Operator};
use crate::error::Result;
use crate::plan::{InvariantSpec, Training};
use crate::sql::Learn;
use crate::state::OperatorState;

/// How many set members `learned` shows before it abbreviates.
const SHOWN_MEMBERS: usize = 10;

/// Learns an invariant per key and judges rows against it.
pub struct InvariantOp {
    spec: InvariantSpec,
    output: SchemaRef,
    converter: RowConverter,
    input: SchemaRef,
    keys: HashMap<OwnedRow, Learned>,
    /// Event time of the first row seen, where an interval of training
    /// starts.
    first_time: Option<i64>,
}

/// What one key has learned.
#[derive(Debug, Default)]
struct Learned {
    rows: u64,
    set: BTreeSet<String>,
    range: Option<(f64, f64)>,
}

/// A row's value of the learned column, in the form its kind compares.
enum Value {
    Null,
    Member(String),
    Number(f64),
}

impl Learned {
    fn contains(&self, value: &Value) -> bool {
        match value {
            Value::Null => true,
            Value::Member(v) => self.set.contains(v),
            Value::Number(x) => self.range.is_some_and(|(lo, hi)| lo <= *x && *x <= hi),
        }
    }

    fn learn(&mut self, value: Value) {
        match value {
            Value::Null => {}
            Value::Member(v) => {
                self.set.insert(v);
            }
            Value::Number(x) => {
                self.range = Some(match self.range {
                    None => (x, x),
                    Some((lo, hi)) => (lo.min(x), hi.max(x)),
                });
            }
        }
    }

    fn describe(&self, learn: Learn) -> String {
        match learn {
            Learn::Range => match self.range {
                Some((lo, hi)) => format!("[{}, {}]", shown(lo), shown(hi)),
                None => "nothing learned".into(),
            },
            Learn::Set if self.set.is_empty() => "nothing learned".into(),
            Learn::Set => {
                let shown: Vec<&str> = self
                    .set
                    .iter()
                    .take(SHOWN_MEMBERS)
                    .map(|s| s.as_str())
                    .collect();
                match self.set.len() > SHOWN_MEMBERS {
                    true => format!("{{{}, ... ({} values)}}", shown.join(", "), self.set.len()),
                    false => format!("{{{}}}", shown.join(", ")),
                }
            }
        }
    }
}

/// A bound as `learned` shows it: to 6 decimals, without trailing zeros.
fn shown(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

impl InvariantOp {
    /// An operator for `spec` over rows of `input`, producing `output`.
    pub fn try_new(spec: InvariantSpec, input: SchemaRef, output: SchemaRef) -> Result<Self> {
        let mut fields: Vec<SortField> = spec
            .keys
            .iter()
            .map(|&i| SortField::new(input.field(i).data_type().clone()))
            .collect();
        if fields.is_empty() {
            // One invariant for the whole stream: a constant key column, as
            // the row format cannot count rows of no columns.
            fields.push(SortField::new(DataType::Boolean));
        }
        Ok(Self {
            converter: RowConverter::new(fields)?,
            spec,
            input,
            output,
            keys: HashMap::new(),
            first_time: None,
        })
    }

    fn values(&self, batch: &RecordBatch) -> Result<Vec<Value>> {
        let column = batch.column(self.spec.column);
        let values = match self.spec.learn {
            Learn::Range => {
                let numbers = cast(column, &DataType::Float64)?;
                let numbers = numbers.as_primitive::<Float64Type>();
                (0..numbers.len())
                    .map(
                        |i| match numbers.is_valid(i) && !numbers.value(i).is_nan() {
                            true => Value::Number(numbers.value(i)),
                            false => Value::Null,
                        },
                    )
                    .collect()
            }
            Learn::Set => {
                let format = ArrayFormatter::try_new(column.as_ref(), &FormatOptions::default())?;
                (0..column.len())
                    .map(|i| match column.is_valid(i) {
                        true => Value::Member(format.value(i).to_string()),
                        false => Value::Null,
                    })
                    .collect()
            }
        };
        Ok(values)
    }

    /// The schema of the `keys` table: the key columns, then each key's
    /// rows so far, learned set and learned range.
    fn keys_schema(&self) -> SchemaRef {
        let mut fields: Vec<Field> = self
            .spec
            .keys
            .iter()
            .map(|&i| self.input.field(i).clone().with_nullable(true))
            .collect();
        fields.extend([
            Field::new("rows", DataType::Int64, false),
            Field::new(
                "set",
                DataType::List(Arc::new(Field::new_list_field(DataType::Utf8, true))),
                false,
            ),
            Field::new("low", DataType::Float64, true),
            Field::new("high", DataType::Float64, true),
        ]);
        Arc::new(Schema::new(fields))
    }

    fn keys_table(&self) -> Result<RecordBatch> {
        let (keys, mut columns) =
            super::sorted_keys(&self.keys, &self.converter, !self.spec.keys.is_empty())?;
        let learned = keys.iter().map(|(_, l)| *l);
        let mut sets = ListBuilder::new(StringBuilder::new());
        for l in learned.clone() {
            sets.append_value(l.set.iter().map(Some));
        }
        columns.push(Arc::new(Int64Array::from_iter_values(
            learned.clone().map(|l| l.rows as i64),
        )));
        columns.push(Arc::new(sets.finish()));
        let range = |f: fn((f64, f64)) -> f64| -> ArrayRef {
            Arc::new(Float64Array::from_iter(
                learned.clone().map(|l| l.range.map(f)),
            ))
        };
        columns.push(range(|r| r.0));
        columns.push(range(|r| r.1));
        Ok(RecordBatch::try_new(self.keys_schema(), columns)?)
    }

    fn restore_keys(&mut self, table: &RecordBatch) -> Result<()> {
        let n = self.spec.keys.len();
        let rows = self
            .converter
            .convert_columns(&self.key_columns(&table.columns()[..n], table.num_rows()))?;
        let counts = table.column(n).as_primitive::<Int64Type>();
        let sets = table.column(n + 1).as_list::<i32>();
        let low = table.column(n + 2).as_primitive::<Float64Type>();
        let high = table.column(n + 3).as_primitive::<Float64Type>();
        for i in 0..table.num_rows() {
            let members = sets.value(i);
            let learned = Learned {
                rows: counts.value(i) as u64,
                set: members
                    .as_string::<i32>()
                    .iter()
                    .flatten()
                    .map(String::from)
                    .collect(),
                range: (low.is_valid(i) && high.is_valid(i)).then(|| (low.value(i), high.value(i))),
            };
            self.keys.insert(rows.row(i).owned(), learned);
        }
        Ok(())
    }

    /// The columns the converter reads for `keys` of `rows` rows: a
    /// constant column for an invariant without keys.
    fn key_columns(&self, keys: &[ArrayRef], rows: usize) -> Vec<ArrayRef> {
        match keys.is_empty() {
            true => vec![Arc::new(BooleanArray::from(vec![true; rows]))],
            false => keys.to_vec(),
        }
    }

    fn in_training(&self, learned: &Learned, t: i64) -> bool {
        match self.spec.training {
            Training::Rows(n) => learned.rows < n,
            Training::Interval(ms) => self.first_time.is_some_and(|first| t < first + ms),
        }
    }
}

impl Operator for InvariantOp {
    fn describe(&self) -> String {
        format!("invariant {}", self.spec.name)
    }

    fn on_batch(&mut self, batch: RecordBatch, out: &mut Vec<Message>) -> Result<()> {
        let times = event_times(batch.column(self.spec.event_time))?;
        let keys: Vec<ArrayRef> = self
            .spec
            .keys
            .iter()
            .map(|&i| batch.column(i).clone())
            .collect();
        let rows = self
            .converter
            .convert_columns(&self.key_columns(&keys, batch.num_rows()))?;
        let mut judged = Vec::new();
        let mut violation = Vec::new();
        let mut learned_text = Vec::new();
        for (i, value) in self.values(&batch)?.into_iter().enumerate() {
            let t = times[i];
            self.first_time.get_or_insert(t);
            let mut learned = self.keys.remove(&rows.row(i).owned()).unwrap_or_default();
            if self.in_training(&learned, t) {
                learned.learn(value);
            } else {
                judged.push(i as u32);
                violation.push(!learned.contains(&value));
                learned_text.push(learned.describe(self.spec.learn));
                if self.spec.online {
                    learned.learn(value);
                }
            }
            learned.rows += 1;
            self.keys.insert(rows.row(i).owned(), learned);
        }
        if judged.is_empty() {
            return Ok(());
        }
        let kept = take_record_batch(&batch, &UInt32Array::from(judged))?;
        let mut columns = kept.columns().to_vec();
        columns.push(Arc::new(BooleanArray::from(violation)));
        columns.push(Arc::new(StringArray::from(learned_text)));
        out.push(Message::Batch(RecordBatch::try_new(
            self.output.clone(),
            columns,
        )?));
        Ok(())
    }

    /// Table `keys` (what each key has learned, keyed by the invariant's
    /// key columns) and the scalar `first_time`, where interval training
    /// started.
    fn snapshot(&mut self) -> Result<Option<OperatorState>> {
        let mut state = OperatorState::new();
        let key_columns = (0..self.spec.keys.len()).collect();
        state.add("keys", self.keys_table()?, key_columns);
        state.add_scalars("meta", &[("first_time", self.first_time)]);
        Ok(Some(state))
    }

    fn restore(&mut self, state: OperatorState) -> Result<()> {
        self.restore_keys(&state.table_of("keys", &self.keys_schema())?)?;
        self.first_time = state.scalar("meta", "first_time")?;
        Ok(())
    }
}
