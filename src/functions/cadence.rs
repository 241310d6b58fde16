//! `cadence(ts)`: the sampling step of a series, in seconds: the median of
//! the gaps between consecutive distinct timestamps of its input, sorted.
//! Meant for rules that count in samples whatever the step
//! (`3 * cadence(ts)`), and for missing samples
//! (`count(*) * cadence(ts)` against a window's length).

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray, Int64Array, ListArray};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Int64Type, TimeUnit};
use datafusion::common::{ScalarValue, exec_err, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{Accumulator, AggregateUDFImpl, Signature, Volatility};

use super::mad::median;

/// The `cadence` aggregate. It depends only on the set of distinct
/// timestamps, so rows may come in any order and partial states (a `HOP`'s
/// panes) merge.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Cadence {
    signature: Signature,
}

impl Default for Cadence {
    fn default() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl AggregateUDFImpl for Cadence {
    fn name(&self) -> &str {
        "cadence"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    /// Any timestamp keeps its unit, so a nanosecond series keeps its
    /// precision and a far date in milliseconds cannot overflow.
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        match arg_types {
            [t @ DataType::Timestamp(_, _)] => Ok(vec![t.clone()]),
            [DataType::Null] => Ok(vec![DataType::Timestamp(TimeUnit::Millisecond, None)]),
            [t] => plan_err!("cadence needs a TIMESTAMP argument, got {t}"),
            _ => plan_err!("cadence takes one argument (ts), got {}", arg_types.len()),
        }
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        let item = Field::new_list_field(DataType::Int64, true);
        Ok(vec![Arc::new(Field::new(
            format_state_name(args.name, "timestamps"),
            DataType::List(Arc::new(item)),
            true,
        ))])
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let per_second = match args.expr_fields.first().map(|f| f.data_type()) {
            Some(DataType::Timestamp(unit, _)) => units_per_second(*unit),
            other => return exec_err!("cadence needs a TIMESTAMP argument, got {other:?}"),
        };
        Ok(Box::new(CadenceAccumulator {
            per_second,
            times: Vec::new(),
            distinct: 0,
        }))
    }
}

fn units_per_second(unit: TimeUnit) -> f64 {
    match unit {
        TimeUnit::Second => 1.0,
        TimeUnit::Millisecond => 1e3,
        TimeUnit::Microsecond => 1e6,
        TimeUnit::Nanosecond => 1e9,
    }
}

/// The timestamps seen, in the input's unit. Repeats do not change the
/// result, so the list is sorted and deduplicated whenever it has doubled
/// since the last time: it stays within twice the distinct timestamps,
/// however many rows share them.
#[derive(Debug)]
struct CadenceAccumulator {
    per_second: f64,
    times: Vec<i64>,
    /// How many timestamps were left by the last deduplication.
    distinct: usize,
}

impl CadenceAccumulator {
    fn add(&mut self, times: impl Iterator<Item = i64>) {
        for time in times {
            self.times.push(time);
            if self.times.len() > (2 * self.distinct).max(64) {
                self.dedup();
            }
        }
    }

    fn dedup(&mut self) {
        self.times.sort_unstable();
        self.times.dedup();
        self.distinct = self.times.len();
    }
}

impl Accumulator for CadenceAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let times = cast(&values[0], &DataType::Int64)?;
        self.add(times.as_primitive::<Int64Type>().iter().flatten());
        Ok(())
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        self.dedup();
        let gaps: Vec<f64> = self
            .times
            .windows(2)
            .map(|w| (i128::from(w[1]) - i128::from(w[0])) as f64)
            .collect();
        Ok(ScalarValue::Float64(
            median(gaps).map(|gap| gap / self.per_second),
        ))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.times.capacity() * std::mem::size_of::<i64>()
    }

    /// The distinct timestamps, in order.
    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        self.dedup();
        let times: ArrayRef = Arc::new(Int64Array::from(self.times.clone()));
        Ok(vec![ScalarValue::List(Arc::new(ListArray::new(
            Arc::new(Field::new_list_field(DataType::Int64, true)),
            OffsetBuffer::from_lengths([times.len()]),
            times,
            None,
        )))])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        for list in states[0].as_list::<i32>().iter().flatten() {
            self.add(list.as_primitive::<Int64Type>().iter().flatten());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{TimestampMillisecondArray, TimestampNanosecondArray};

    use super::*;

    fn accumulator(per_second: f64) -> CadenceAccumulator {
        CadenceAccumulator {
            per_second,
            times: Vec::new(),
            distinct: 0,
        }
    }

    fn cadence_of(times: Vec<Option<i64>>) -> Option<f64> {
        let mut acc = accumulator(1e3);
        let times: ArrayRef = Arc::new(TimestampMillisecondArray::from(times));
        acc.update_batch(&[times]).unwrap();
        match acc.evaluate().unwrap() {
            ScalarValue::Float64(v) => v,
            other => panic!("not a DOUBLE: {other}"),
        }
    }

    #[test]
    fn median_of_the_gaps_between_distinct_timestamps() {
        // Sorted: 0, 10, 20, 30, 60 -> gaps 10, 10, 10, 30 -> 10 s.
        let times = [30_000, 0, 10_000, 60_000, 20_000, 10_000];
        assert_eq!(cadence_of(times.map(Some).to_vec()), Some(10.0));
        // 0, 10, 30: gaps 10, 20 -> an even count averages them: 15 s.
        assert_eq!(
            cadence_of(vec![Some(30_000), None, Some(0), Some(10_000)]),
            Some(15.0)
        );
        // Fewer than two distinct timestamps.
        assert_eq!(cadence_of(vec![Some(5), Some(5), None]), None);
        assert_eq!(cadence_of(vec![None]), None);
        assert_eq!(cadence_of(vec![]), None);
    }

    #[test]
    fn keeps_the_unit_of_its_input() {
        let mut acc = accumulator(1e9);
        let times: ArrayRef = Arc::new(TimestampNanosecondArray::from(vec![0, 1_500, 3_000]));
        acc.update_batch(&[times]).unwrap();
        assert_eq!(acc.evaluate().unwrap(), ScalarValue::Float64(Some(1.5e-6)));
    }

    #[test]
    fn repeats_are_dropped_as_they_come() {
        let mut acc = accumulator(1e3);
        for _ in 0..100 {
            let times: ArrayRef = Arc::new(TimestampMillisecondArray::from(vec![0, 2_000, 4_000]));
            acc.update_batch(&[times]).unwrap();
        }
        assert!(acc.times.len() <= 128, "{}", acc.times.len());
        assert_eq!(acc.evaluate().unwrap(), ScalarValue::Float64(Some(2.0)));
    }

    #[test]
    fn partial_states_merge_in_any_order() {
        let mut a = accumulator(1e3);
        let mut b = accumulator(1e3);
        a.update_batch(&[Arc::new(TimestampMillisecondArray::from(vec![0, 20_000]))])
            .unwrap();
        b.update_batch(&[Arc::new(TimestampMillisecondArray::from(vec![
            30_000, 10_000, 20_000,
        ]))])
        .unwrap();
        let state = a.state().unwrap()[0].to_array().unwrap();
        b.merge_batch(&[state]).unwrap();
        assert_eq!(b.evaluate().unwrap(), ScalarValue::Float64(Some(10.0)));
        let mut empty = accumulator(1e3);
        let state = b.state().unwrap()[0].to_array().unwrap();
        empty.merge_batch(&[state]).unwrap();
        assert_eq!(empty.evaluate().unwrap(), ScalarValue::Float64(Some(10.0)));
    }
}
