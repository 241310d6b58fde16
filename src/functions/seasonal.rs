//! `seasonal_z(x, period)`: the current value of `x` (the last row) against
//! the same phase of earlier periods, scaled by how much a value usually
//! differs from the one a period before. Rows count by position, NULLs
//! included, so phases stay aligned:
//!
//! - baseline: the median of the non-NULL `v[m-1-k*period]`, `k >= 1`;
//! - differences `d_i = v[i] - v[i-period]` for `i` in `[period, m-1)`
//!   where both are non-NULL (the current row is left out);
//! - scale: `1.4826 * MAD(d) / sqrt(2)`, or `stddev_pop(d) / sqrt(2)` when
//!   the MAD is 0 (a difference of two values has twice their variance);
//! - result: `(current - baseline) / scale`; NULL when the current value is
//!   NULL, there is no baseline, fewer than 2 differences or no spread.
//!
//! Meant for a key's history of windows: with 5-minute windows,
//! `seasonal_z(v, 288) OVER (PARTITION BY host ORDER BY window_end ROWS
//! BETWEEN 2016 PRECEDING AND CURRENT ROW)` compares a window with the same
//! time of day over the last week.

use datafusion::logical_expr::Expr;

use super::change::{median_and_robust_spread, median_in_place, standard_deviation};
use super::frame::{FrameScore, check_count_arg};
use crate::error::Result as VigilResult;

/// The `seasonal_z` aggregate.
pub fn udaf() -> FrameScore {
    FrameScore::new("seasonal_z", "period", seasonal_z)
}

/// `seasonal_z` of the frame `values` (NULLs in place) with `period`.
pub fn seasonal_z(values: &[Option<f64>], period: usize) -> Option<f64> {
    if period == 0 {
        return None;
    }
    let (&current, earlier) = values.split_last()?;
    let current = current?;
    let mut same_phase: Vec<f64> = earlier
        .iter()
        .rev()
        .skip(period - 1)
        .step_by(period)
        .flatten()
        .copied()
        .collect();
    let baseline = median_in_place(&mut same_phase)?;
    let differences: Vec<f64> = earlier
        .iter()
        .zip(earlier.iter().skip(period))
        .filter_map(|(before, now)| Some((*now)? - (*before)?))
        .collect();
    if differences.len() < 2 {
        return None;
    }
    let (_, robust) = median_and_robust_spread(&differences)?;
    let spread = if robust != 0.0 {
        robust
    } else {
        standard_deviation(&differences)
    };
    if spread == 0.0 {
        return None;
    }
    Some((current - baseline) / (spread / std::f64::consts::SQRT_2))
}

/// Checks, at plan time, a `seasonal_z` call's `period`.
pub fn check_seasonal_z_args(args: &[Expr]) -> VigilResult<()> {
    check_count_arg(args, "seasonal_z", "period")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{ArrayRef, Float64Array};
    use datafusion::common::ScalarValue;
    use datafusion::logical_expr::{Accumulator, lit};

    use super::super::frame::FrameAccumulator;
    use super::*;

    fn close(actual: Option<f64>, expected: Option<f64>) -> bool {
        match (actual, expected) {
            (Some(a), Some(e)) => (a - e).abs() < 1e-12 * e.abs().max(1.0),
            (a, e) => a == e,
        }
    }

    #[test]
    fn scores_against_the_same_phase_scaled_by_seasonal_differences() {
        // Period 2; v = 10, 1, 12, 2, 11, 3, 20 (m = 7, current 20).
        // Same phase: v[4] = 11, v[2] = 12, v[0] = 10 -> median 11.
        // Differences for i in 2..6: 12-10 = 2, 2-1 = 1, 11-12 = -1,
        // 3-2 = 1 -> median 1, deviations 1, 0, 2, 0 -> MAD 0.5.
        // Scale 1.4826 * 0.5 / sqrt(2); (20 - 11) / scale.
        let v = [10.0, 1.0, 12.0, 2.0, 11.0, 3.0, 20.0].map(Some);
        let expected = 9.0 / (1.4826 * 0.5 / 2f64.sqrt());
        let score = seasonal_z(&v, 2);
        assert!(close(score, Some(expected)), "{score:?}");
    }

    #[test]
    fn nulls_keep_their_place() {
        // Period 2; v = 10, 1, NULL, 2, 11, NULL, 14, 4, 13.
        // Same phase of v[8]: v[6] = 14, v[4] = 11, v[2] NULL, v[0] = 10
        // -> median 11. Differences for i in 2..8: v[2] NULL, 2-1 = 1,
        // v[4]-v[2] NULL, v[5] NULL, 14-11 = 3, v[7]-v[5] NULL -> 1, 3:
        // median 2, MAD 1. (13 - 11) / (1.4826 / sqrt(2)).
        let v = [
            Some(10.0),
            Some(1.0),
            None,
            Some(2.0),
            Some(11.0),
            None,
            Some(14.0),
            Some(4.0),
            Some(13.0),
        ];
        let score = seasonal_z(&v, 2);
        assert!(
            close(score, Some(2.0 / (1.4826 / 2f64.sqrt()))),
            "{score:?}"
        );
        let mut null_current = v.to_vec();
        null_current.push(None);
        assert_eq!(seasonal_z(&null_current, 2), None);
    }

    #[test]
    fn a_zero_mad_falls_back_to_the_standard_deviation() {
        // Period 1; v = 1, 2, 3, 4, 6, 9. Differences over i in 1..5:
        // 1, 1, 1, 2 -> MAD 0; mean 1.25, squared deviations 1/16 (x3),
        // 9/16 -> variance 3/16, sd sqrt(3)/4. Baseline: median of
        // 1, 2, 3, 4, 6 = 3. (9 - 3) / (sqrt(3) / 4 / sqrt(2)).
        let v = [1.0, 2.0, 3.0, 4.0, 6.0, 9.0].map(Some);
        let expected = 6.0 / (3f64.sqrt() / 4.0 / 2f64.sqrt());
        let score = seasonal_z(&v, 1);
        assert!(close(score, Some(expected)), "{score:?}");
        // Every difference the same: no spread.
        let v = [1.0, 2.0, 3.0, 4.0, 9.0].map(Some);
        assert_eq!(seasonal_z(&v, 1), None);
    }

    #[test]
    fn too_little_history_gives_null() {
        // No earlier value of the phase.
        assert_eq!(seasonal_z(&[Some(1.0), Some(2.0)], 3), None);
        // Period 2, m = 4: one difference (i = 2) only.
        assert_eq!(seasonal_z(&[1.0, 5.0, 2.0, 7.0].map(Some), 2), None);
        // The only same-phase value is NULL.
        let v = [None, Some(1.0), Some(2.0), Some(4.0), Some(3.0)];
        assert_eq!(seasonal_z(&v, 4), None);
        assert_eq!(seasonal_z(&[], 1), None);
        // Period 2, m = 5: differences 2-1 = 1 (i = 2), 4-1 = 3 (i = 3).
        let v = [1.0, 1.0, 2.0, 4.0, 5.0].map(Some);
        assert!(seasonal_z(&v, 2).is_some());
    }

    #[test]
    fn one_state_restores_and_two_are_refused() {
        let fresh = || FrameAccumulator::new("seasonal_z", seasonal_z, 2);
        let mut acc = fresh();
        acc.update_batch(&[Arc::new(Float64Array::from(vec![None, Some(4.0)]))])
            .unwrap();
        let state = acc.state().unwrap()[0].to_array().unwrap();
        let mut restored = fresh();
        restored.merge_batch(std::slice::from_ref(&state)).unwrap();
        assert_eq!(restored.values, [None, Some(4.0)]);
        let more: ArrayRef = Arc::new(Float64Array::from(vec![1.0, 5.0, 2.0, 7.0, 3.0]));
        acc.update_batch(std::slice::from_ref(&more)).unwrap();
        restored.update_batch(&[more]).unwrap();
        assert_eq!(restored.evaluate().unwrap(), acc.evaluate().unwrap());
        assert!(acc.evaluate().unwrap() != ScalarValue::Float64(None));
        assert!(restored.merge_batch(&[state]).is_err());
        let nothing = fresh().state().unwrap()[0].to_array().unwrap();
        assert!(restored.merge_batch(&[nothing]).is_ok());
    }

    #[test]
    fn period_is_checked_when_planned() {
        assert!(check_seasonal_z_args(&[lit(1.0), lit(288)]).is_ok());
        let e = check_seasonal_z_args(&[lit(1.0), lit(0)]).unwrap_err();
        assert!(
            e.to_string()
                .contains("seasonal_z: period must be a positive integer literal, got 0"),
            "{e}"
        );
    }
}
