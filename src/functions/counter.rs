//! Counter aggregates as Prometheus reads counters: a value that drops is a
//! counter reset, after which the counter counts again from zero.
//!
//! - `counter_increase(ts, value)`: how much the counter grew from the
//!   group's first sample to its last, in time order, each reset adding the
//!   value just before it (what Prometheus' `rate` and `increase` compute
//!   before extrapolating to the range's edges). NULL below two samples.
//! - `counter_irate(ts, value)`: the per-second rate between the group's last
//!   two samples (Prometheus' `irate`): after a reset, the last value itself.
//!   NULL below two samples or when both have the same time.
//!
//! Both hold the group's samples and sort them when evaluated, so rows may
//! arrive in any order and partial states (a `HOP`'s panes) merge.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array, ListArray};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{
    DataType, Field, FieldRef, Float64Type, Int64Type, TimeUnit, TimestampMillisecondType,
};
use datafusion::common::{ScalarValue, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{Accumulator, AggregateUDFImpl, Signature, Volatility};

/// What a counter aggregate computes from its sorted samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CounterKind {
    /// `counter_increase`.
    Increase,
    /// `counter_irate`.
    Irate,
}

/// `counter_increase(ts, value)` or `counter_irate(ts, value)`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Counter {
    kind: CounterKind,
    signature: Signature,
}

impl Counter {
    /// The aggregate computing `kind`.
    pub fn new(kind: CounterKind) -> Self {
        Self {
            kind,
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl AggregateUDFImpl for Counter {
    fn name(&self) -> &str {
        match self.kind {
            CounterKind::Increase => "counter_increase",
            CounterKind::Irate => "counter_irate",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let name = self.name();
        match arg_types {
            [DataType::Timestamp(_, tz), v] if v.is_numeric() || v.is_null() => Ok(vec![
                DataType::Timestamp(TimeUnit::Millisecond, tz.clone()),
                DataType::Float64,
            ]),
            [t, v] if v.is_numeric() || v.is_null() => {
                plan_err!("{name} needs a timestamp first argument (the sample time), got {t}")
            }
            [_, v] => plan_err!("{name} needs a numeric second argument (the counter), got {v}"),
            _ => plan_err!(
                "{name} takes two arguments (ts, value), got {}",
                arg_types.len()
            ),
        }
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        let list = |item: DataType, what: &str| {
            Arc::new(Field::new(
                format_state_name(args.name, what),
                DataType::List(Arc::new(Field::new_list_field(item, true))),
                true,
            ))
        };
        Ok(vec![
            list(DataType::Int64, "times"),
            list(DataType::Float64, "values"),
        ])
    }

    fn accumulator(&self, _args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(CounterAccumulator {
            kind: self.kind,
            samples: Vec::new(),
        }))
    }
}

/// Holds the group's `(time in ms, value)` samples.
#[derive(Debug)]
struct CounterAccumulator {
    kind: CounterKind,
    samples: Vec<(i64, f64)>,
}

impl Accumulator for CounterAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let times = values[0].as_primitive::<TimestampMillisecondType>();
        let counts = values[1].as_primitive::<Float64Type>();
        for i in 0..times.len() {
            if times.is_valid(i) && counts.is_valid(i) {
                self.samples.push((times.value(i), counts.value(i)));
            }
        }
        Ok(())
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        self.samples.sort_by_key(|s| s.0);
        Ok(ScalarValue::Float64(match self.kind {
            CounterKind::Increase => increase(&self.samples),
            CounterKind::Irate => irate(&self.samples),
        }))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.samples.capacity() * std::mem::size_of::<(i64, f64)>()
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let times: ArrayRef = Arc::new(Int64Array::from_iter_values(
            self.samples.iter().map(|s| s.0),
        ));
        let values: ArrayRef = Arc::new(Float64Array::from_iter_values(
            self.samples.iter().map(|s| s.1),
        ));
        Ok(vec![one_list(times), one_list(values)])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let (times, values) = (states[0].as_list::<i32>(), states[1].as_list::<i32>());
        for (t, v) in times.iter().zip(values.iter()) {
            let (Some(t), Some(v)) = (t, v) else { continue };
            let (t, v) = (
                t.as_primitive::<Int64Type>(),
                v.as_primitive::<Float64Type>(),
            );
            self.samples
                .extend(t.values().iter().copied().zip(v.values().iter().copied()));
        }
        Ok(())
    }
}

/// A one-row list column holding `values`.
fn one_list(values: ArrayRef) -> ScalarValue {
    let item = Arc::new(Field::new_list_field(values.data_type().clone(), true));
    let offsets = OffsetBuffer::from_lengths([values.len()]);
    ScalarValue::List(Arc::new(ListArray::new(item, offsets, values, None)))
}

/// The reset-corrected growth over `samples` (sorted by time), as
/// Prometheus' `extrapolatedRate` computes it before extrapolating.
pub fn increase(samples: &[(i64, f64)]) -> Option<f64> {
    let (first, last) = (samples.first()?, samples.last()?);
    if samples.len() < 2 {
        return None;
    }
    let resets: f64 = samples
        .windows(2)
        .filter(|pair| pair[1].1 < pair[0].1)
        .map(|pair| pair[0].1)
        .sum();
    Some(last.1 - first.1 + resets)
}

/// The per-second rate between the last two of `samples` (sorted by time),
/// as Prometheus' `irate`.
pub fn irate(samples: &[(i64, f64)]) -> Option<f64> {
    let [.., (t0, v0), (t1, v1)] = samples else {
        return None;
    };
    if t1 == t0 {
        return None;
    }
    let grown = if v1 < v0 { *v1 } else { v1 - v0 };
    Some(grown / ((t1 - t0) as f64 / 1000.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::TimestampMillisecondArray;

    fn accumulator(kind: CounterKind, samples: &[(i64, f64)]) -> CounterAccumulator {
        let mut acc = CounterAccumulator {
            kind,
            samples: Vec::new(),
        };
        let times: ArrayRef = Arc::new(TimestampMillisecondArray::from_iter_values(
            samples.iter().map(|s| s.0),
        ));
        let values: ArrayRef =
            Arc::new(Float64Array::from_iter_values(samples.iter().map(|s| s.1)));
        acc.update_batch(&[times, values]).unwrap();
        acc
    }

    #[test]
    fn a_reset_adds_the_value_before_it() {
        // 10 -> 30 (+20), reset to 5 (+5 from zero), 5 -> 15 (+10).
        let samples = [(0, 10.0), (1000, 30.0), (2000, 5.0), (3000, 15.0)];
        assert_eq!(increase(&samples), Some(35.0));
        assert_eq!(increase(&samples[..1]), None);
        assert_eq!(increase(&[]), None);
    }

    #[test]
    fn irate_reads_the_last_two_samples() {
        assert_eq!(irate(&[(0, 1.0), (1000, 4.0), (3000, 10.0)]), Some(3.0));
        // A reset: the last value counts from zero.
        assert_eq!(irate(&[(0, 10.0), (2000, 4.0)]), Some(2.0));
        assert_eq!(irate(&[(0, 1.0), (0, 2.0)]), None);
        assert_eq!(irate(&[(0, 1.0)]), None);
    }

    #[test]
    fn samples_out_of_order_and_merged_states_give_the_same_result() {
        let mut late = accumulator(CounterKind::Increase, &[(3000, 15.0), (1000, 30.0)]);
        let mut early = accumulator(CounterKind::Increase, &[(2000, 5.0), (0, 10.0)]);
        let state: Vec<ArrayRef> = early
            .state()
            .unwrap()
            .iter()
            .map(|s| s.to_array().unwrap())
            .collect();
        late.merge_batch(&state).unwrap();
        assert_eq!(late.evaluate().unwrap(), ScalarValue::Float64(Some(35.0)));
        let mut rate = accumulator(CounterKind::Irate, &[(2000, 4.0), (0, 10.0)]);
        assert_eq!(rate.evaluate().unwrap(), ScalarValue::Float64(Some(2.0)));
    }

    #[test]
    fn bad_arguments_are_plan_errors() {
        let f = Counter::new(CounterKind::Increase);
        let ts = DataType::Timestamp(TimeUnit::Millisecond, None);
        assert!(f.coerce_types(&[ts.clone(), DataType::Int64]).is_ok());
        let e = f
            .coerce_types(&[DataType::Utf8, DataType::Float64])
            .unwrap_err();
        assert!(e.to_string().contains("timestamp first argument"), "{e}");
        let e = f.coerce_types(&[ts, DataType::Utf8]).unwrap_err();
        assert!(e.to_string().contains("numeric second argument"), "{e}");
        assert!(f.coerce_types(&[DataType::Float64]).is_err());
    }
}
