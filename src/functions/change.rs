//! `change_score(x, n)`: how far the last `n` values of `x` (in row order,
//! NULLs skipped) moved from the values before them, in robust standard
//! deviations: `(median(recent) - median(reference)) / scale`, the scale
//! the larger of `1.4826 * MAD(reference)` and the reference's population
//! standard deviation. NULL when that is 0 or the reference has fewer than
//! 2 values. The standard deviation is a floor, not a fallback: metrics
//! that move in steps (CPU in whole percent, byte counters) often have a
//! MAD far below their real spread, and then scores of hundreds for an
//! ordinary step drown the real anomalies (on NAB's tuning series the best
//! per-sample rule scored 38.2 with the floor, 36.3 without). Meant for a
//! key's history of windows:
//! `change_score(v, 6) OVER (PARTITION BY host ORDER BY window_end ROWS
//! BETWEEN 293 PRECEDING AND CURRENT ROW)` scores a level shift of the
//! last 6 windows against the 288 before them.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, ListArray};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Float64Type};
use datafusion::common::{ScalarValue, exec_err, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{Accumulator, AggregateUDFImpl, Expr, Signature, Volatility};
use datafusion::physical_expr::expressions::Literal;

use crate::error::{Error, Result as VigilResult};

/// The factor that makes a MAD estimate the standard deviation of normal
/// data.
const MAD_TO_SIGMA: f64 = 1.4826;

/// The `change_score` aggregate. Its value depends on row order, so it
/// cannot merge partial states: it works where rows come in order (`OVER
/// (... ORDER BY window_end)`, a tumbling window's own rows), not across a
/// `HOP`'s panes.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ChangeScore {
    signature: Signature,
}

impl Default for ChangeScore {
    fn default() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl AggregateUDFImpl for ChangeScore {
    fn name(&self) -> &str {
        "change_score"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    /// `n` keeps its type, so its literal reaches the accumulator as
    /// written, without a cast to fold.
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        coerce_value_and_count(self.name(), "n", arg_types)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![values_field(args.name)])
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let recent = count_argument(&args, self.name(), "n")?;
        Ok(Box::new(ChangeAccumulator {
            recent,
            values: Vec::new(),
        }))
    }
}

/// The non-NULL values so far, in row order.
#[derive(Debug)]
struct ChangeAccumulator {
    recent: usize,
    values: Vec<f64>,
}

impl Accumulator for ChangeAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let array = values[0].as_primitive::<Float64Type>();
        self.values.extend(array.iter().flatten());
        Ok(())
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        Ok(ScalarValue::Float64(change_score(
            &self.values,
            self.recent,
        )))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.values.capacity() * std::mem::size_of::<f64>()
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let values = Float64Array::from(self.values.clone());
        Ok(vec![values_state(values)])
    }

    /// Takes the one partial state there is into an accumulator that has
    /// none: how a checkpointed window gets its state back. Merging two is
    /// refused, as their order is lost.
    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let Some(list) = only_state(states, self.values.is_empty(), "change_score")? else {
            return Ok(());
        };
        self.values
            .extend(list.as_primitive::<Float64Type>().iter().flatten());
        Ok(())
    }
}

/// `change_score` of `values` (non-NULL, in row order) with the last
/// `recent` of them scored against the ones before.
pub fn change_score(values: &[f64], recent: usize) -> Option<f64> {
    let split = values.len().checked_sub(recent)?;
    let (reference, recent) = values.split_at(split);
    if reference.len() < 2 {
        return None;
    }
    let (center, robust) = median_and_robust_spread(reference)?;
    let scale = robust.max(standard_deviation(reference));
    if scale == 0.0 {
        return None;
    }
    Some((median_in_place(&mut recent.to_vec())? - center) / scale)
}

/// The median of `values` (`None` when there are none) and `1.4826 * MAD`
/// of them.
pub(super) fn median_and_robust_spread(values: &[f64]) -> Option<(f64, f64)> {
    let mut buffer = values.to_vec();
    let center = median_in_place(&mut buffer)?;
    for value in buffer.iter_mut() {
        *value = (*value - center).abs();
    }
    Some((center, MAD_TO_SIGMA * median_in_place(&mut buffer)?))
}

/// The population standard deviation of `values` (0 for none).
pub(super) fn standard_deviation(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    (values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n).sqrt()
}

/// The median of `values`, as [`super::mad::median`] gives it (an even
/// count's is the mean of the two middle values), found by selection
/// rather than a sort; `values` is reordered.
pub(super) fn median_in_place(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let (len, mid) = (values.len(), values.len() / 2);
    let (below, middle, _) = values.select_nth_unstable_by(mid, f64::total_cmp);
    let middle = *middle;
    if len % 2 == 1 {
        return Some(middle);
    }
    let lower = below
        .iter()
        .copied()
        .max_by(f64::total_cmp)
        .expect("an even count has a lower half");
    Some((lower + middle) / 2.0)
}

/// The argument types of `name(x, count)`: `x` any number, as DOUBLE;
/// `count` any number, kept as it is (its literal is checked when planned
/// and when the accumulator is made).
pub(super) fn coerce_value_and_count(
    name: &str,
    count: &str,
    arg_types: &[DataType],
) -> Result<Vec<DataType>> {
    match arg_types {
        [x, c] if (x.is_numeric() || x.is_null()) && c.is_numeric() => {
            Ok(vec![DataType::Float64, c.clone()])
        }
        [x, _] if !(x.is_numeric() || x.is_null()) => {
            plan_err!("{name}(x, {count}) needs a numeric x, got {x}")
        }
        [_, c] => plan_err!("{name}(x, {count}) needs an integer {count}, got {c}"),
        _ => plan_err!(
            "{name} takes two arguments (x, {count}), got {}",
            arg_types.len()
        ),
    }
}

/// The state field of an accumulator that keeps its values in row order:
/// one list of DOUBLEs.
pub(super) fn values_field(name: &str) -> FieldRef {
    let item = Field::new_list_field(DataType::Float64, true);
    Arc::new(Field::new(
        format_state_name(name, "values"),
        DataType::List(Arc::new(item)),
        true,
    ))
}

/// `values` as the one-row list of a [`values_field`].
pub(super) fn values_state(values: Float64Array) -> ScalarValue {
    let values: ArrayRef = Arc::new(values);
    ScalarValue::List(Arc::new(ListArray::new(
        Arc::new(Field::new_list_field(DataType::Float64, true)),
        OffsetBuffer::from_lengths([values.len()]),
        values,
        None,
    )))
}

/// The one non-empty list among the states of a [`values_field`], if there
/// is one and the accumulator (`empty` or not) can take it; an error when
/// two partial states would have to be put in an order.
pub(super) fn only_state(states: &[ArrayRef], empty: bool, name: &str) -> Result<Option<ArrayRef>> {
    let mut lists = states[0]
        .as_list::<i32>()
        .iter()
        .flatten()
        .filter(|list| !list.is_empty());
    match (empty, lists.next(), lists.next()) {
        (_, None, _) => Ok(None),
        (true, Some(list), None) => Ok(Some(list)),
        _ => exec_err!(
            "{name} depends on row order and cannot merge partial results (HOP windows); use it over a key's history: OVER (PARTITION BY key ORDER BY window_end)"
        ),
    }
}

/// The positive integer that `value` holds, if it does.
fn positive_integer(value: &ScalarValue) -> Option<usize> {
    match value.cast_to(&DataType::Float64).ok()? {
        // `as` saturates: a count beyond any frame is as good as usize::MAX.
        ScalarValue::Float64(Some(v)) if v >= 1.0 && v.fract() == 0.0 => Some(v as usize),
        _ => None,
    }
}

/// The count literal of an aggregate call (`n`, `period`), its second
/// argument, when the accumulator is made.
pub(super) fn count_argument(args: &AccumulatorArgs, name: &str, count: &str) -> Result<usize> {
    if args.is_distinct {
        return exec_err!("{name} does not take DISTINCT: it depends on every row, in order");
    }
    let value = args
        .exprs
        .get(1)
        .and_then(|e| e.as_ref().downcast_ref::<Literal>())
        .and_then(|l| positive_integer(l.value()));
    match value {
        Some(value) => Ok(value),
        None => exec_err!("{name}: {count} must be a positive integer literal"),
    }
}

/// Checks, at plan time, that the second argument of `name(x, count)` is a
/// positive integer literal.
pub(super) fn check_count_arg(args: &[Expr], name: &str, count: &str) -> VigilResult<()> {
    let bad = |got: &str| {
        Error::Plan(format!(
            "{name}: {count} must be a positive integer literal, got {got}"
        ))
    };
    let value = match args.get(1) {
        Some(Expr::Literal(value, _)) => value.clone(),
        Some(Expr::Cast(cast)) => match cast.expr.as_ref() {
            Expr::Literal(value, _) => value.clone(),
            other => return Err(bad(&other.to_string())),
        },
        Some(other) => return Err(bad(&other.to_string())),
        None => {
            return Err(Error::Plan(format!(
                "{name} takes two arguments (x, {count})"
            )));
        }
    };
    match positive_integer(&value) {
        Some(_) => Ok(()),
        None => Err(bad(&value.to_string())),
    }
}

/// Checks, at plan time, a `change_score` call's `n`.
pub fn check_change_score_args(args: &[Expr]) -> VigilResult<()> {
    check_count_arg(args, "change_score", "n")
}

#[cfg(test)]
mod tests {
    use datafusion::logical_expr::{col, lit};

    use super::*;

    fn close(actual: Option<f64>, expected: Option<f64>) -> bool {
        match (actual, expected) {
            (Some(a), Some(e)) => (a - e).abs() < 1e-12 * e.abs().max(1.0),
            (a, e) => a == e,
        }
    }

    /// Selection gives `median` and `mad`'s values to the bit, over
    /// values with repeats, both zeros and far-apart magnitudes.
    #[test]
    fn selection_matches_the_sorting_median_and_mad() {
        let mut x: u64 = 3;
        let values: Vec<f64> = (0..300)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let r = x >> 33;
                match r % 6 {
                    0 => -0.0,
                    1 => 0.0,
                    2 => (r % 4) as f64,
                    3 => (r % 1000) as f64 * 1e12,
                    _ => (r % 100_000) as f64 / 7.0 - 5000.0,
                }
            })
            .collect();
        for len in 0..values.len() {
            let frame = &values[..len];
            let bits = |v: Option<f64>| v.map(f64::to_bits);
            let expected = super::super::mad::median(frame.to_vec());
            assert_eq!(bits(median_in_place(&mut frame.to_vec())), bits(expected));
            let spread = median_and_robust_spread(frame).map(|(_, s)| s);
            let mad = super::super::mad::mad(frame).map(|m| 1.4826 * m);
            assert_eq!(bits(spread), bits(mad), "{len}");
        }
    }

    #[test]
    fn scores_the_recent_median_against_the_reference() {
        // Reference 1, 2, 3, 4, 3, 2, 1, 3: median 2.5, deviations 1.5,
        // 0.5, 0.5, 1.5, 0.5, 0.5, 1.5, 0.5 -> MAD 0.5, 1.4826 * 0.5 =
        // 0.7413; mean 2.375, sd sqrt(7.875 / 8) = 0.99216 is larger.
        // Recent 9, 11: median 10.
        let values = [1.0, 2.0, 3.0, 4.0, 3.0, 2.0, 1.0, 3.0, 9.0, 11.0];
        let sd = (7.875f64 / 8.0).sqrt();
        let score = change_score(&values, 2);
        assert!(close(score, Some(7.5 / sd)), "{score:?}");
        // Reference 10, 11, 9, 10, 10, 50, 10: median 10, MAD 0 -> the sd
        // is the scale, outlier and all: mean 110 / 7, sd 13.995.
        let values = [10.0, 11.0, 9.0, 10.0, 10.0, 50.0, 10.0, 40.0];
        let mean = 110.0 / 7.0;
        let sd = (values[..7]
            .iter()
            .map(|v| (v - mean) * (v - mean))
            .sum::<f64>()
            / 7.0)
            .sqrt();
        let score = change_score(&values, 1);
        assert!(close(score, Some(30.0 / sd)), "{score:?}");
    }

    #[test]
    fn the_standard_deviation_is_a_floor_under_the_mad() {
        // Reference 0, 0, 0, 1, 1, 1, 1 (a metric in steps): median 1,
        // deviations 1, 1, 1, 0, 0, 0, 0 -> MAD 0; mean 4 / 7, sd
        // sqrt(12 / 49). A step to 2 scores 1 / sd = 2.02, not infinity.
        let score = change_score(&[0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 2.0], 1);
        assert!(
            close(score, Some(1.0 / (12.0f64 / 49.0).sqrt())),
            "{score:?}"
        );
        // Reference 1, 2, 3, 4, 100: MAD 1 -> 1.4826, but the sd, 38.97,
        // is larger and wins: (10 - 3) / 38.97.
        let values = [1.0, 2.0, 3.0, 4.0, 100.0, 9.0, 11.0];
        let mean = 22.0;
        let sd = (values[..5]
            .iter()
            .map(|v| (v - mean) * (v - mean))
            .sum::<f64>()
            / 5.0)
            .sqrt();
        let score = change_score(&values, 2);
        assert!(close(score, Some(7.0 / sd)), "{score:?}");
        // A constant reference has no spread at all.
        assert_eq!(change_score(&[5.0, 5.0, 5.0, 9.0], 1), None);
    }

    #[test]
    fn too_few_values_give_null() {
        assert_eq!(change_score(&[1.0, 2.0], 1), None);
        assert_eq!(change_score(&[1.0, 2.0, 3.0], 2), None);
        assert_eq!(change_score(&[1.0], 3), None);
        assert_eq!(change_score(&[], 1), None);
        assert!(change_score(&[1.0, 2.0, 3.0], 1).is_some());
    }

    #[test]
    fn nulls_are_skipped_in_row_order() {
        let mut acc = ChangeAccumulator {
            recent: 1,
            values: Vec::new(),
        };
        let batch: ArrayRef = Arc::new(Float64Array::from(vec![
            Some(1.0),
            None,
            Some(3.0),
            Some(2.0),
            None,
        ]));
        acc.update_batch(&[batch]).unwrap();
        // Reference 1, 3 (median 2, MAD 1), recent 2.
        assert_eq!(acc.evaluate().unwrap(), ScalarValue::Float64(Some(0.0)));
        let more: ArrayRef = Arc::new(Float64Array::from(vec![Some(6.0)]));
        acc.update_batch(&[more]).unwrap();
        // Reference 1, 3, 2: median 2, MAD 1 -> 1.4826 (the sd, 0.816, is
        // smaller); (6 - 2) / 1.4826.
        assert_eq!(
            acc.evaluate().unwrap(),
            ScalarValue::Float64(Some(4.0 / 1.4826))
        );
    }

    #[test]
    fn one_state_restores_and_two_are_refused() {
        let fresh = || ChangeAccumulator {
            recent: 2,
            values: Vec::new(),
        };
        let mut acc = fresh();
        acc.update_batch(&[Arc::new(Float64Array::from(vec![1.0, 4.0, 2.0]))])
            .unwrap();
        let state = acc.state().unwrap()[0].to_array().unwrap();
        let mut restored = fresh();
        restored.merge_batch(std::slice::from_ref(&state)).unwrap();
        let more: ArrayRef = Arc::new(Float64Array::from(vec![8.0, 5.0]));
        acc.update_batch(std::slice::from_ref(&more)).unwrap();
        restored.update_batch(&[more]).unwrap();
        assert_eq!(restored.evaluate().unwrap(), acc.evaluate().unwrap());
        assert!(restored.merge_batch(&[state]).is_err());
        let nothing = fresh().state().unwrap()[0].to_array().unwrap();
        assert!(restored.merge_batch(&[nothing]).is_ok());
    }

    #[test]
    fn n_is_checked_when_planned() {
        assert!(check_change_score_args(&[lit(1.0), lit(6)]).is_ok());
        assert!(check_change_score_args(&[lit(1.0), lit(6.0)]).is_ok());
        for (bad, shown) in [(lit(0), "0"), (lit(-2), "-2"), (lit(2.5), "2.5")] {
            let e = check_change_score_args(&[lit(1.0), bad])
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!(
                    "change_score: n must be a positive integer literal, got {shown}"
                )),
                "{e}"
            );
        }
        let e = check_change_score_args(&[lit(1.0), col("a")]).unwrap_err();
        assert!(e.to_string().contains("got a"), "{e}");
        assert!(check_change_score_args(&[lit(1.0)]).is_err());
    }
}
