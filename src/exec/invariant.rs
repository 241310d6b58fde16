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
    Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray, UInt32Array,
};
use datafusion::arrow::compute::{cast, take_record_batch};
use datafusion::arrow::datatypes::{DataType, Float64Type, SchemaRef};
use datafusion::arrow::row::{OwnedRow, RowConverter, SortField};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};

use super::alert::event_times;
use super::{Message, Operator};
use crate::error::Result;
use crate::plan::{InvariantSpec, Training};
use crate::sql::Learn;

/// How many set members `learned` shows before it abbreviates.
const SHOWN_MEMBERS: usize = 10;

/// Learns an invariant per key and judges rows against it.
pub struct InvariantOp {
    spec: InvariantSpec,
    output: SchemaRef,
    converter: RowConverter,
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
        let fields = spec
            .keys
            .iter()
            .map(|&i| SortField::new(input.field(i).data_type().clone()))
            .collect();
        Ok(Self {
            converter: RowConverter::new(fields)?,
            spec,
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
        let key_columns: Vec<ArrayRef> = self
            .spec
            .keys
            .iter()
            .map(|&i| batch.column(i).clone())
            .collect();
        let rows = self.converter.convert_columns(&key_columns)?;
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
}
