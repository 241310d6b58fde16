//! `robust_z(x)`: how far each row is from its peers, in robust standard
//! deviations: the modified z-score of Iglewicz and Hoaglin.
//!
//! A window function over a whole partition, for peer comparisons: within
//! one window of results (the per-host averages of one minute, say),
//! `robust_z(avg_cpu) OVER (PARTITION BY window_end)` scores every host
//! against all hosts of that window. A score beyond 3.5 in absolute value is
//! the customary outlier threshold.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray, Float64Array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Float64Type};
use datafusion::common::plan_err;
use datafusion::error::Result;
use datafusion::logical_expr::function::{PartitionEvaluatorArgs, WindowUDFFieldArgs};
use datafusion::logical_expr::{PartitionEvaluator, Signature, Volatility, WindowUDFImpl};

use super::mad::median;

/// Scales the MAD to the standard deviation of a normal distribution.
const MAD_SCALE: f64 = 0.6745;
/// Scales the mean absolute deviation to the standard deviation of a
/// normal distribution (sqrt(pi / 2)).
const MEAN_AD_SCALE: f64 = 1.253314;

/// `robust_z(x) OVER (PARTITION BY ...)`: `0.6745 * (x - median) / MAD`,
/// with the median and the MAD (median absolute deviation from the median)
/// of the partition's non-NULL `x`; an even count's median is the mean of
/// the two middle values.
///
/// When more than half the values are equal the MAD is 0; the score then
/// falls back to the mean absolute deviation from the median, as in IBM's
/// rule: `(x - median) / (1.253314 * MeanAD)`. If that is 0 too, every
/// value is the same and every score is 0.
///
/// NULL `x` gives NULL and takes no part in the median. Any numeric `x` is
/// taken as DOUBLE. The function ignores `ORDER BY` and the frame of its
/// `OVER` clause: it always scores against the whole partition.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct RobustZ {
    signature: Signature,
}

impl Default for RobustZ {
    fn default() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl WindowUDFImpl for RobustZ {
    fn name(&self) -> &str {
        "robust_z"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        match arg_types {
            [t] if t.is_numeric() || t.is_null() => Ok(vec![DataType::Float64]),
            [t] => plan_err!("robust_z needs a numeric argument, got {t}"),
            _ => plan_err!("robust_z takes one argument, got {}", arg_types.len()),
        }
    }

    fn field(&self, field_args: WindowUDFFieldArgs) -> Result<FieldRef> {
        Ok(Arc::new(Field::new(
            field_args.name(),
            DataType::Float64,
            true,
        )))
    }

    fn partition_evaluator(
        &self,
        _args: PartitionEvaluatorArgs,
    ) -> Result<Box<dyn PartitionEvaluator>> {
        Ok(Box::new(RobustZEvaluator))
    }
}

/// Scores a whole partition at once (`evaluate_all`).
#[derive(Debug)]
struct RobustZEvaluator;

impl PartitionEvaluator for RobustZEvaluator {
    fn evaluate_all(&mut self, values: &[ArrayRef], _num_rows: usize) -> Result<ArrayRef> {
        let x = cast(&values[0], &DataType::Float64)?;
        let x = x.as_primitive::<Float64Type>();
        let scores = robust_z(&x.iter().collect::<Vec<_>>());
        Ok(Arc::new(Float64Array::from(scores)))
    }
}

/// The modified z-score of each value against all non-NULL `values`; NULL
/// stays NULL.
pub fn robust_z(values: &[Option<f64>]) -> Vec<Option<f64>> {
    let present: Vec<f64> = values.iter().flatten().copied().collect();
    let Some(center) = median(present.clone()) else {
        return vec![None; values.len()];
    };
    let deviations: Vec<f64> = present.iter().map(|v| (v - center).abs()).collect();
    let mean_ad = deviations.iter().sum::<f64>() / deviations.len() as f64;
    let mad = median(deviations).unwrap_or(0.0);
    let score = |x: f64| {
        if mad > 0.0 {
            MAD_SCALE * (x - center) / mad
        } else if mean_ad > 0.0 {
            (x - center) / (MEAN_AD_SCALE * mean_ad)
        } else {
            0.0
        }
    };
    values.iter().map(|x| x.map(score)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(actual: &[Option<f64>], expected: &[Option<f64>]) {
        assert_eq!(actual.len(), expected.len(), "{actual:?} vs {expected:?}");
        for (a, e) in actual.iter().zip(expected) {
            match (a, e) {
                (Some(a), Some(e)) => {
                    assert!((a - e).abs() < 1e-9, "{actual:?} vs {expected:?}")
                }
                _ => assert_eq!(a, e, "{actual:?} vs {expected:?}"),
            }
        }
    }

    #[test]
    fn scores_against_median_and_mad() {
        // median 10; deviations 0, 1, 1, 0, 40 -> MAD 1.
        close(
            &robust_z(&[Some(10.0), Some(11.0), Some(9.0), Some(10.0), Some(50.0)]),
            &[
                Some(0.0),
                Some(0.6745),
                Some(-0.6745),
                Some(0.0),
                Some(26.98),
            ],
        );
        // Even count: median (2 + 3) / 2 = 2.5; deviations 1.5, 0.5, 0.5,
        // 1.5 -> MAD 1; score of 4 = 0.6745 * 1.5.
        close(
            &robust_z(&[Some(1.0), Some(2.0), Some(3.0), Some(4.0)]),
            &[Some(-1.01175), Some(-0.33725), Some(0.33725), Some(1.01175)],
        );
    }

    #[test]
    fn zero_mad_falls_back_to_mean_absolute_deviation() {
        // median 5; deviations 0, 0, 0, 0, 4 -> MAD 0, MeanAD 0.8.
        let scores = robust_z(&[Some(5.0), Some(5.0), Some(5.0), Some(5.0), Some(9.0)]);
        let nine: f64 = 4.0 / (1.253314 * 0.8);
        assert!((nine - 3.989_423_2).abs() < 1e-6);
        close(
            &scores,
            &[Some(0.0), Some(0.0), Some(0.0), Some(0.0), Some(nine)],
        );
    }

    #[test]
    fn all_equal_scores_zero() {
        close(
            &robust_z(&[Some(3.0), Some(3.0), Some(3.0)]),
            &[Some(0.0), Some(0.0), Some(0.0)],
        );
        close(&robust_z(&[Some(7.0)]), &[Some(0.0)]);
    }

    #[test]
    fn nulls_stay_null_and_are_not_counted() {
        // Without the NULLs: median 10, MAD 1.
        close(
            &robust_z(&[None, Some(10.0), Some(11.0), None, Some(9.0)]),
            &[None, Some(0.0), Some(0.6745), None, Some(-0.6745)],
        );
        close(&robust_z(&[None, None]), &[None, None]);
        close(&robust_z(&[]), &[]);
    }

    #[test]
    fn evaluator_takes_any_numeric_type() {
        let values: ArrayRef = Arc::new(datafusion::arrow::array::Int32Array::from(vec![
            Some(10),
            Some(11),
            None,
            Some(9),
            Some(10),
            Some(50),
        ]));
        let scores = RobustZEvaluator.evaluate_all(&[values], 6).unwrap();
        let scores = scores.as_primitive::<Float64Type>();
        close(
            &scores.iter().collect::<Vec<_>>(),
            &[
                Some(0.0),
                Some(0.6745),
                None,
                Some(-0.6745),
                Some(0.0),
                Some(26.98),
            ],
        );
    }
}
