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

use datafusion::logical_expr::Expr;

use super::frame::{FrameScore, check_count_arg};
use crate::error::Result as VigilResult;

/// The factor that makes a MAD estimate the standard deviation of normal
/// data.
const MAD_TO_SIGMA: f64 = 1.4826;

/// The `change_score` aggregate.
pub fn udaf() -> FrameScore {
    FrameScore::new("change_score", "n", score_frame)
}

/// `change_score` of a frame, its NULLs skipped.
fn score_frame(frame: &[Option<f64>], recent: usize) -> Option<f64> {
    let values: Vec<f64> = frame.iter().flatten().copied().collect();
    change_score(&values, recent)
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

/// Checks, at plan time, a `change_score` call's `n`.
pub fn check_change_score_args(args: &[Expr]) -> VigilResult<()> {
    check_count_arg(args, "change_score", "n")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{ArrayRef, Float64Array};
    use datafusion::common::ScalarValue;
    use datafusion::logical_expr::{Accumulator, col, lit};

    use super::super::frame::FrameAccumulator;
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
        let mut acc = FrameAccumulator::new("change_score", score_frame, 1);
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

    /// A frame that slides by retracting its oldest rows scores as the same
    /// frame built afresh, NULLs and all; retracting more rows than the frame
    /// holds is an error.
    #[test]
    fn a_sliding_frame_scores_as_a_fresh_one() {
        let values: Vec<Option<f64>> = (0..40)
            .map(|i| (i % 7 != 3).then_some(((i * 37) % 11) as f64 + i as f64 / 5.0))
            .collect();
        let width = 9;
        let mut sliding = FrameAccumulator::new("change_score", score_frame, 2);
        assert!(sliding.supports_retract_batch());
        for (i, value) in values.iter().enumerate() {
            let row: ArrayRef = Arc::new(Float64Array::from(vec![*value]));
            sliding.update_batch(&[row]).unwrap();
            if i >= width {
                let old: ArrayRef = Arc::new(Float64Array::from(vec![values[i - width]]));
                sliding.retract_batch(&[old]).unwrap();
            }
            let frame = &values[i.saturating_sub(width - 1)..=i];
            let mut fresh = FrameAccumulator::new("change_score", score_frame, 2);
            fresh
                .update_batch(&[Arc::new(Float64Array::from(frame.to_vec()))])
                .unwrap();
            assert_eq!(
                sliding.evaluate().unwrap(),
                fresh.evaluate().unwrap(),
                "row {i}"
            );
        }
        let too_many: ArrayRef = Arc::new(Float64Array::from(vec![1.0; width + 1]));
        assert!(sliding.retract_batch(&[too_many]).is_err());
    }

    #[test]
    fn one_state_restores_and_two_are_refused() {
        let fresh = || FrameAccumulator::new("change_score", score_frame, 2);
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
