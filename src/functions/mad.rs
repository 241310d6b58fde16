//! `mad(x)`: the median absolute deviation, a spread that outliers barely
//! move. A robust score of a value is `0.6745 * (x - median) / mad`.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, ListArray};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Float64Type};
use datafusion::common::{ScalarValue, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{Accumulator, AggregateUDFImpl, Signature, Volatility};

/// `mad(x)`: median of `|x - median(x)|`. Exact: it holds every value of
/// its group, like `median`. NULLs are ignored; no values give NULL.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Mad {
    signature: Signature,
}

impl Default for Mad {
    fn default() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl AggregateUDFImpl for Mad {
    fn name(&self) -> &str {
        "mad"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        match arg_types {
            [t] if t.is_numeric() || t.is_null() => Ok(vec![DataType::Float64]),
            [t] => plan_err!("mad needs a numeric argument, got {t}"),
            _ => plan_err!("mad takes one argument, got {}", arg_types.len()),
        }
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        let item = Field::new_list_field(DataType::Float64, true);
        Ok(vec![Arc::new(Field::new(
            format_state_name(args.name, "mad"),
            DataType::List(Arc::new(item)),
            true,
        ))])
    }

    fn accumulator(&self, _args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(MadAccumulator::default()))
    }
}

/// Holds the group's values.
#[derive(Debug, Default)]
struct MadAccumulator {
    values: Vec<f64>,
}

impl Accumulator for MadAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let array = values[0].as_primitive::<Float64Type>();
        self.values.extend(array.iter().flatten());
        Ok(())
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        Ok(ScalarValue::Float64(mad(&self.values)))
    }

    /// Removes one occurrence of each value, so a sliding frame
    /// (`OVER (... ROWS n PRECEDING)`) keeps one accumulator.
    fn retract_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let array = values[0].as_primitive::<Float64Type>();
        for value in array.iter().flatten() {
            if let Some(i) = self.values.iter().position(|v| v.total_cmp(&value).is_eq()) {
                self.values.swap_remove(i);
            }
        }
        Ok(())
    }

    fn supports_retract_batch(&self) -> bool {
        true
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.values.capacity() * std::mem::size_of::<f64>()
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let values: ArrayRef = Arc::new(Float64Array::from(self.values.clone()));
        Ok(vec![ScalarValue::List(Arc::new(ListArray::new(
            Arc::new(Field::new_list_field(DataType::Float64, true)),
            datafusion::arrow::buffer::OffsetBuffer::from_lengths([values.len()]),
            values,
            None,
        )))])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let lists = states[0].as_list::<i32>();
        for list in lists.iter().flatten() {
            self.values
                .extend(list.as_primitive::<Float64Type>().iter().flatten());
        }
        Ok(())
    }
}

/// The median absolute deviation of `values`, `None` when there are none.
pub fn mad(values: &[f64]) -> Option<f64> {
    let center = median(values.to_vec())?;
    median(values.iter().map(|v| (v - center).abs()).collect())
}

/// The median of `values` (an even count's is the mean of the two middle
/// values), `None` when there are none.
pub(super) fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retracting_values_slides_the_frame() {
        let mut acc = MadAccumulator::default();
        let batch = |v: Vec<f64>| -> Vec<ArrayRef> { vec![Arc::new(Float64Array::from(v))] };
        acc.update_batch(&batch(vec![10.0, 11.0, 9.0, 50.0]))
            .unwrap();
        acc.retract_batch(&batch(vec![50.0])).unwrap();
        // [10, 11, 9]: median 10, deviations 0, 1, 1 -> 1.
        assert_eq!(acc.evaluate().unwrap(), ScalarValue::Float64(Some(1.0)));
        acc.retract_batch(&batch(vec![10.0, 11.0, 9.0])).unwrap();
        assert_eq!(acc.evaluate().unwrap(), ScalarValue::Float64(None));
    }

    #[test]
    fn median_absolute_deviation() {
        // median 3; deviations 2, 1, 0, 1, 97 -> median 1.
        assert_eq!(mad(&[1.0, 2.0, 3.0, 4.0, 100.0]), Some(1.0));
        // median 2.5; deviations 1.5, 0.5, 0.5, 1.5 -> median 1.
        assert_eq!(mad(&[1.0, 2.0, 3.0, 4.0]), Some(1.0));
        assert_eq!(mad(&[7.0]), Some(0.0));
        assert_eq!(mad(&[]), None);
    }

    #[test]
    fn state_round_trips_through_merge() {
        let mut a = MadAccumulator::default();
        a.update_batch(&[Arc::new(Float64Array::from(vec![
            Some(1.0),
            None,
            Some(2.0),
        ]))])
        .unwrap();
        let state = a.state().unwrap();
        let mut b = MadAccumulator::default();
        b.update_batch(&[Arc::new(Float64Array::from(vec![3.0, 4.0, 100.0]))])
            .unwrap();
        b.merge_batch(&[state[0].to_array().unwrap()]).unwrap();
        assert_eq!(b.evaluate().unwrap(), ScalarValue::Float64(Some(1.0)));
    }
}
