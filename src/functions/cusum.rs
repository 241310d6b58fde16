//! `cusum(x, k, h [, warmup])`: the self-starting two-sided tabular CUSUM
//! of `x` in row order (Page 1954; the self-starting form after Hawkins
//! 1987), meant for a key's history of windows:
//! `cusum(v, 0.5, 5) OVER (PARTITION BY host ORDER BY window_end)`.
//!
//! The reference is the values of `x` since the last reset, kept as a
//! running count, mean and sum of squared deviations (Welford), so memory
//! is `O(1)` whatever the history. For each non-NULL `x` in row order:
//!
//! - while the reference holds fewer than `warmup` values (default 5, at
//!   least 2), the result is NULL and `x` joins the reference;
//! - otherwise `z = (x - mean) / sd`, `sd` the reference's population
//!   standard deviation; `S+ = max(0, S+ + z - k)`,
//!   `S- = max(0, S- - z - k)`; the result is `S+` if `S+ >= S-`, else
//!   `-S-` (positive: an upward shift);
//! - if `|result| > h` the row keeps that result, and then both sums go
//!   back to 0 and the reference restarts with `x` alone (the first value
//!   of the new level, which is learnt afresh through the warmup);
//!   otherwise `x` joins the reference.
//!
//! So a level shift fires once, on one row: a score against a fixed
//! reference would fire on every row after it, and a per-row z-score may
//! never pass its threshold for a shift smaller than it, where the sums
//! add the evidence up row after row.
//!
//! A NULL `x` (or NaN, infinite) changes nothing: its result is the
//! current signed sum, or NULL during the warmup. When the reference has no
//! spread (`sd = 0`, a constant series) `sd` is taken as
//! `1e-9 * max(|mean|, 1)`, one part in a billion of the level: below any
//! real metric's resolution, so any real change from a constant series
//! fires at once, while `z` stays finite (`x == mean` still gives 0).
//! Results are always finite: sums beyond the range of a DOUBLE saturate.
//!
//! `k` (the allowance, in standard deviations, `>= 0`) and `h` (the
//! decision threshold, `> 0`) are number literals, `warmup` an integer
//! literal, checked when the query is planned ([`check_cusum_args`]). The
//! value depends on row order, so partial states cannot merge (a `HOP`'s
//! panes); a checkpointed one restores into an empty accumulator.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Float64Type, UInt64Type};
use datafusion::common::{ScalarValue, exec_err, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{Accumulator, AggregateUDFImpl, Expr, Signature, Volatility};
use datafusion::physical_expr::expressions::Literal;

use crate::error::{Error, Result as VigilResult};

/// The warmup when the call gives none.
const DEFAULT_WARMUP: u64 = 5;

/// The spread assumed for a reference without one, relative to its level
/// (or absolute, for levels below 1).
const FLAT_SPREAD: f64 = 1e-9;

/// The `cusum` aggregate.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Cusum {
    signature: Signature,
}

impl Default for Cusum {
    fn default() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl AggregateUDFImpl for Cusum {
    fn name(&self) -> &str {
        "cusum"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    /// `x` becomes DOUBLE; the literals keep their types, so they reach
    /// the accumulator as written, without a cast to fold.
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let (x, literals) = match arg_types.split_first() {
            Some(split) if (3..=4).contains(&arg_types.len()) => split,
            _ => {
                return plan_err!(
                    "cusum takes three or four arguments (x, k, h [, warmup]), got {}",
                    arg_types.len()
                );
            }
        };
        if !(x.is_numeric() || x.is_null()) {
            return plan_err!("cusum(x, k, h) needs a numeric x, got {x}");
        }
        if let Some(bad) = literals.iter().find(|t| !t.is_numeric()) {
            return plan_err!(
                "cusum(x, k, h [, warmup]) needs numbers for k, h and warmup, got {bad}"
            );
        }
        let mut types = vec![DataType::Float64];
        types.extend(literals.iter().cloned());
        Ok(types)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        let field = |what: &str, data_type: DataType| -> FieldRef {
            Arc::new(Field::new(
                format_state_name(args.name, what),
                data_type,
                true,
            ))
        };
        Ok(vec![
            field("count", DataType::UInt64),
            field("mean", DataType::Float64),
            field("m2", DataType::Float64),
            field("up", DataType::Float64),
            field("down", DataType::Float64),
            field("last", DataType::Float64),
        ])
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        if args.is_distinct {
            return exec_err!("cusum does not take DISTINCT: it depends on every row, in order");
        }
        let literal = |index: usize| {
            args.exprs
                .get(index)
                .and_then(|e| e.as_ref().downcast_ref::<Literal>())
                .map(|l| l.value().clone())
        };
        let params = Params::from_literals(literal(1), literal(2), literal(3));
        match params {
            Ok(params) => Ok(Box::new(CusumAccumulator::new(params))),
            Err(message) => exec_err!("{message}"),
        }
    }
}

/// A call's constants.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Params {
    /// The allowance, in standard deviations.
    k: f64,
    /// The decision threshold.
    h: f64,
    /// How many values the reference needs before a value is scored.
    warmup: u64,
}

impl Params {
    /// The constants from the literals of `k`, `h` and `warmup` (`None`:
    /// not a literal, or for `warmup`, not given), or the error that names
    /// the bad one.
    fn from_literals(
        k: Option<ScalarValue>,
        h: Option<ScalarValue>,
        warmup: Option<ScalarValue>,
    ) -> std::result::Result<Self, String> {
        let k = match k.as_ref().and_then(finite) {
            Some(k) if k >= 0.0 => k,
            _ => return Err(bad("k must be a number literal >= 0", k.as_ref())),
        };
        let h = match h.as_ref().and_then(finite) {
            Some(h) if h > 0.0 => h,
            _ => return Err(bad("h must be a number literal > 0", h.as_ref())),
        };
        let warmup = match &warmup {
            None => DEFAULT_WARMUP,
            Some(value) => match finite(value) {
                // `as` saturates: a warmup beyond any history never ends.
                Some(w) if w >= 2.0 && w.fract() == 0.0 => w as u64,
                _ => return Err(bad("warmup must be an integer literal >= 2", Some(value))),
            },
        };
        Ok(Self { k, h, warmup })
    }
}

/// The finite number `value` holds, if it does.
fn finite(value: &ScalarValue) -> Option<f64> {
    match value.cast_to(&DataType::Float64).ok()? {
        ScalarValue::Float64(Some(v)) if v.is_finite() => Some(v),
        _ => None,
    }
}

fn bad(rule: &str, got: Option<&ScalarValue>) -> String {
    match got {
        Some(value) => format!("cusum: {rule}, got {value}"),
        None => format!("cusum: {rule}"),
    }
}

/// The values since the last reset: count, mean and sum of squared
/// deviations, updated one value at a time (Welford).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Reference {
    count: u64,
    mean: f64,
    m2: f64,
}

impl Reference {
    /// A reference that holds `x` alone.
    fn of(x: f64) -> Self {
        Self {
            count: 1,
            mean: x,
            m2: 0.0,
        }
    }

    fn add(&mut self, x: f64) {
        self.count += 1;
        let n = self.count as f64;
        let before = self.mean;
        // `x / n - mean / n` rather than `(x - mean) / n`: the difference
        // of two huge values of opposite signs would overflow.
        self.mean += x / n - before / n;
        self.m2 += (x - before) * (x - self.mean);
    }

    /// How many standard deviations `x` is from the mean; never NaN or
    /// infinite.
    fn z(&self, x: f64) -> f64 {
        let sd = (self.m2 / self.count as f64).sqrt();
        let sd = if sd > 0.0 {
            sd
        } else {
            FLAT_SPREAD * self.mean.abs().max(1.0)
        };
        let z = (x - self.mean) / sd;
        // NaN only when both the deviation and the spread overflowed: then
        // the value is as ordinary as any.
        if z.is_nan() { 0.0 } else { saturate(z) }
    }
}

/// `v` within the finite DOUBLEs.
fn saturate(v: f64) -> f64 {
    v.clamp(-f64::MAX, f64::MAX)
}

/// The CUSUM so far: the reference, both one-sided sums and the latest
/// row's result.
#[derive(Debug, Clone, Copy, PartialEq)]
struct State {
    reference: Reference,
    up: f64,
    down: f64,
    last: Option<f64>,
}

impl State {
    const EMPTY: Self = Self {
        reference: Reference {
            count: 0,
            mean: 0.0,
            m2: 0.0,
        },
        up: 0.0,
        down: 0.0,
        last: None,
    };

    /// The signed sum: the larger side, negative for a downward shift.
    fn signed(&self) -> f64 {
        if self.up >= self.down {
            self.up
        } else {
            -self.down
        }
    }

    /// Takes the next row's value and sets its result.
    fn push(&mut self, x: Option<f64>, params: &Params) {
        let warming = self.reference.count < params.warmup;
        let Some(x) = x.filter(|x| x.is_finite()) else {
            self.last = (!warming).then(|| self.signed());
            return;
        };
        if warming {
            self.last = None;
            self.reference.add(x);
            return;
        }
        let z = self.reference.z(x);
        self.up = saturate((self.up + z - params.k).max(0.0));
        self.down = saturate((self.down - z - params.k).max(0.0));
        let result = self.signed();
        self.last = Some(result);
        if result.abs() > params.h {
            self.up = 0.0;
            self.down = 0.0;
            self.reference = Reference::of(x);
        } else {
            self.reference.add(x);
        }
    }
}

/// The accumulator of one `cusum` call.
#[derive(Debug)]
struct CusumAccumulator {
    params: Params,
    state: State,
}

impl CusumAccumulator {
    fn new(params: Params) -> Self {
        Self {
            params,
            state: State::EMPTY,
        }
    }
}

impl Accumulator for CusumAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        for x in values[0].as_primitive::<Float64Type>().iter() {
            self.state.push(x, &self.params);
        }
        Ok(())
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        Ok(ScalarValue::Float64(self.state.last))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self)
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let State {
            reference,
            up,
            down,
            last,
        } = self.state;
        Ok(vec![
            ScalarValue::UInt64(Some(reference.count)),
            ScalarValue::Float64(Some(reference.mean)),
            ScalarValue::Float64(Some(reference.m2)),
            ScalarValue::Float64(Some(up)),
            ScalarValue::Float64(Some(down)),
            ScalarValue::Float64(last),
        ])
    }

    /// Takes the one partial state there is into an accumulator that has
    /// none: how a checkpointed window gets its state back. Merging two is
    /// refused, as their order is lost.
    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let mut taken = (0..states[0].len())
            .map(|row| saved_state(states, row))
            .filter(|state| *state != State::EMPTY);
        match (self.state == State::EMPTY, taken.next(), taken.next()) {
            (_, None, _) => Ok(()),
            (true, Some(state), None) => {
                self.state = state;
                Ok(())
            }
            _ => exec_err!(
                "cusum depends on row order and cannot merge partial results (HOP windows); use it over a key's history: OVER (PARTITION BY key ORDER BY window_end)"
            ),
        }
    }
}

/// Row `row` of the state columns `states`, as [`CusumAccumulator::state`]
/// wrote it (a NULL count or sum, as a state never has, reads as empty).
fn saved_state(states: &[ArrayRef], row: usize) -> State {
    let float = |column: usize| {
        let array = states[column].as_primitive::<Float64Type>();
        array.is_valid(row).then(|| array.value(row))
    };
    let counts = states[0].as_primitive::<UInt64Type>();
    let count = counts.is_valid(row).then(|| counts.value(row));
    State {
        reference: Reference {
            count: count.unwrap_or(0),
            mean: float(1).unwrap_or(0.0),
            m2: float(2).unwrap_or(0.0),
        },
        up: float(3).unwrap_or(0.0),
        down: float(4).unwrap_or(0.0),
        last: float(5),
    }
}

/// Checks, at plan time, a `cusum` call's literals: `k >= 0`, `h > 0`
/// and, if given, an integer `warmup >= 2`.
pub fn check_cusum_args(args: &[Expr]) -> VigilResult<()> {
    if !(3..=4).contains(&args.len()) {
        return Err(Error::Plan(format!(
            "cusum takes three or four arguments (x, k, h [, warmup]), got {}",
            args.len()
        )));
    }
    let literal = |index: usize| -> std::result::Result<Option<ScalarValue>, String> {
        match args.get(index) {
            None => Ok(None),
            Some(Expr::Literal(value, _)) => Ok(Some(value.clone())),
            Some(Expr::Cast(cast)) => match cast.expr.as_ref() {
                Expr::Literal(value, _) => Ok(Some(value.clone())),
                other => Err(other.to_string()),
            },
            Some(other) => Err(other.to_string()),
        }
    };
    let rules = [
        "k must be a number literal >= 0",
        "h must be a number literal > 0",
        "warmup must be an integer literal >= 2",
    ];
    let mut values = Vec::new();
    for (index, rule) in (1..).zip(rules) {
        match literal(index) {
            Ok(value) => values.push(value),
            Err(got) => return Err(Error::Plan(format!("cusum: {rule}, got {got}"))),
        }
    }
    let [k, h, warmup] = <[_; 3]>::try_from(values).expect("three literals");
    Params::from_literals(k, h, warmup)
        .map(|_| ())
        .map_err(Error::Plan)
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::Float64Array;
    use datafusion::logical_expr::{col, lit};

    use super::*;

    const PARAMS: Params = Params {
        k: 0.5,
        h: 5.0,
        warmup: 5,
    };

    /// The results of `values` pushed one by one.
    fn run(values: &[Option<f64>], params: &Params) -> Vec<Option<f64>> {
        let mut state = State::EMPTY;
        values
            .iter()
            .map(|x| {
                state.push(*x, params);
                state.last
            })
            .collect()
    }

    fn assert_close(actual: &[Option<f64>], expected: &[Option<f64>]) {
        assert_eq!(actual.len(), expected.len(), "{actual:?}");
        for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
            let ok = match (a, e) {
                (Some(a), Some(e)) => (a - e).abs() <= 1e-12 * e.abs().max(1.0),
                (a, e) => a == e,
            };
            assert!(ok, "row {i}: {a:?}, expected {e:?} in {actual:?}");
        }
    }

    #[test]
    fn accumulates_small_shifts_and_resets_after_firing() {
        // Reference 13, 7, 11, 9, 10: mean 10, deviations 3, -3, 1, -1, 0,
        // M2 20, sd sqrt(20 / 5) = 2.
        // 13: z = 3 / 2 = 1.5; S+ = 1.5 - 0.5 = 1; S- = max(0, -1.5 - 0.5)
        //     = 0 -> 1. Reference + 13: sum 63, mean 10.5, deviations 2.5,
        //     -3.5, 0.5, -1.5, -0.5, 2.5, M2 27.5, sd sqrt(27.5 / 6).
        // 16: z = 5.5 / sqrt(27.5 / 6) = 2.569047...; S+ = 1 + z - 0.5 =
        //     3.069047... -> 3.069047. Reference + 16: sum 79, mean 79 / 7,
        //     M2 = 27.5 + (16 - 10.5) * (16 - 79 / 7) = 27.5 + 5.5 * 33 / 7
        //     = 53.428571...
        // 17: z = (17 - 79 / 7) / sqrt(53.428571 / 7) = (40 / 7) / 2.762726
        //     = 2.068351...; S+ = 3.069047 + 2.068351 - 0.5 = 4.637397
        //     <= 5. Reference + 17: sum 96, mean 12, M2 = 53.428571 +
        //     (17 - 79 / 7) * (17 - 12) = 53.428571 + 200 / 7 = 82.
        // 18: z = 6 / sqrt(82 / 8) = 1.874085...; S+ = 4.637397 + 1.874085
        //     - 0.5 = 6.011482 > 5: fires; the reference restarts at {18}.
        // 18, 19, 17, 18 warm the new reference up (NULL): {18, 18, 19, 17,
        // 18}, mean 18, M2 0 + 0 + 1 + 1 + 0 = 2, sd sqrt(0.4).
        // 18: z = 0 -> S+ = S- = 0 -> 0.
        // 17: z = -1 / sqrt(2 / 6) = -1.732051 (M2 stays 2 with the 18
        //     added, n 6); S- = 1.732051 - 0.5 = 1.232051 -> -1.232051.
        let sd6 = (27.5f64 / 6.0).sqrt();
        let z16 = 5.5 / sd6;
        let m7 = 79.0 / 7.0;
        let z17 = (17.0 - m7) / ((27.5 + 5.5 * 33.0 / 7.0) / 7.0f64).sqrt();
        let z18 = 6.0 / (82.0f64 / 8.0).sqrt();
        let s16 = 1.0 + z16 - 0.5;
        let s17 = s16 + z17 - 0.5;
        let values = [
            13.0, 7.0, 11.0, 9.0, 10.0, 13.0, 16.0, 17.0, 18.0, 18.0, 19.0, 17.0, 18.0, 18.0, 17.0,
        ];
        let values: Vec<Option<f64>> = values.into_iter().map(Some).collect();
        let mut expected = vec![None; 5];
        expected.extend([Some(1.0), Some(s16), Some(s17), Some(s17 + z18 - 0.5)]);
        expected.extend([None; 4]);
        expected.extend([Some(0.0), Some(0.5 - 3.0f64.sqrt())]);
        assert_close(&run(&values, &PARAMS), &expected);
        assert!((s16 - 3.069047).abs() < 1e-6 && (s17 - 4.637397).abs() < 1e-6);
        assert!((s17 + z18 - 0.5 - 6.011482).abs() < 1e-6);
    }

    #[test]
    fn a_downward_shift_is_negative() {
        // Reference 13, 7, 11, 9, 10 (mean 10, sd 2), warmup 5.
        // 0: z = -5; S- = 5 - 0.5 = 4.5 -> -4.5, not beyond 5. Reference +
        //    0: mean 50 / 6, M2 = 20 + (0 - 10) * (0 - 50 / 6) = 20 + 83.33
        //    = 103.33, sd sqrt(103.33 / 6) = 4.149967.
        // -4: z = (-4 - 8.3333) / 4.149967 = -2.971912; S- = 4.5 +
        //    2.971912 - 0.5 = 6.971912 -> fires at -6.971912.
        let values = [13.0, 7.0, 11.0, 9.0, 10.0, 0.0, -4.0];
        let values: Vec<Option<f64>> = values.into_iter().map(Some).collect();
        let m2 = 20.0 + 10.0 * 50.0 / 6.0;
        let z = (-4.0 - 50.0 / 6.0) / (m2 / 6.0f64).sqrt();
        let mut expected = vec![None; 5];
        expected.extend([Some(-4.5), Some(-(4.5 - z - 0.5))]);
        assert_close(&run(&values, &PARAMS), &expected);
        assert!((expected[6].unwrap() + 6.971912).abs() < 1e-6);
    }

    #[test]
    fn nulls_change_nothing_and_warmup_is_the_fourth_argument() {
        // Warmup 2: 10, 12 (mean 11, sd 1), then NULL -> 0 (the sums are
        // 0 after the warmup), 14: z = 3, S+ = 3 - 0.5 = 2.5; NULL keeps
        // 2.5; NaN and infinity are skipped like NULL.
        let params = Params {
            warmup: 2,
            ..PARAMS
        };
        let values = [
            None,
            Some(10.0),
            None,
            Some(12.0),
            None,
            Some(14.0),
            None,
            Some(f64::NAN),
            Some(f64::INFINITY),
        ];
        let expected = [
            None,
            None,
            None,
            None,
            Some(0.0),
            Some(2.5),
            Some(2.5),
            Some(2.5),
            Some(2.5),
        ];
        assert_close(&run(&values, &params), &expected);
    }

    #[test]
    fn a_constant_series_scores_zero_and_any_change_from_it_fires() {
        // sd 0: z = 0 at the mean; 100.5 is 0.5 / (1e-9 * 100) = 5e6
        // deviations away: S+ = 5e6 - 0.5, fires.
        let mut values = vec![Some(100.0); 7];
        values.push(Some(100.5));
        let mut expected = vec![None; 5];
        expected.extend([Some(0.0), Some(0.0), Some(5e6 - 0.5)]);
        assert_close(&run(&values, &PARAMS), &expected);
        // Below a level of 1 the floor is absolute: 0 then 1e-9 is 1
        // deviation, S+ = 0.5.
        let mut zeros = vec![Some(0.0); 5];
        zeros.push(Some(1e-9));
        let mut expected = vec![None; 5];
        expected.push(Some(0.5));
        assert_close(&run(&zeros, &PARAMS), &expected);
    }

    #[test]
    fn huge_values_give_finite_results() {
        let values: Vec<Option<f64>> = [1e308, -1e308, f64::MAX, -f64::MAX, 1e300, -1e308, 0.0]
            .into_iter()
            .cycle()
            .take(40)
            .map(Some)
            .collect();
        for result in run(&values, &PARAMS).into_iter().flatten() {
            assert!(result.is_finite(), "{result}");
        }
        let flat_then_huge = [0.0, 0.0, 0.0, 0.0, 0.0, f64::MAX, f64::MAX, -f64::MAX];
        let values: Vec<Option<f64>> = flat_then_huge.into_iter().map(Some).collect();
        for result in run(&values, &PARAMS).into_iter().flatten() {
            assert!(result.is_finite(), "{result}");
        }
    }

    #[test]
    fn one_state_restores_at_every_row_and_two_are_refused() {
        let values: Vec<Option<f64>> = [13.0, 7.0, 11.0, 9.0, 10.0, 13.0, 16.0, 17.0, 18.0]
            .into_iter()
            .map(Some)
            .chain([None, Some(18.5), Some(30.0), Some(17.0)])
            .collect();
        let array: ArrayRef = Arc::new(Float64Array::from(values.clone()));
        let mut straight = CusumAccumulator::new(PARAMS);
        straight.update_batch(std::slice::from_ref(&array)).unwrap();
        for split in 0..=values.len() {
            let mut first = CusumAccumulator::new(PARAMS);
            first.update_batch(&[array.slice(0, split)]).unwrap();
            let state = first.state().unwrap();
            let arrays: Vec<ArrayRef> = state.iter().map(|s| s.to_array().unwrap()).collect();
            let mut restored = CusumAccumulator::new(PARAMS);
            restored.merge_batch(&arrays).unwrap();
            restored
                .update_batch(&[array.slice(split, values.len() - split)])
                .unwrap();
            assert_eq!(restored.state, straight.state, "split at {split}");
            assert_eq!(restored.evaluate().unwrap(), straight.evaluate().unwrap());
            if first.state != State::EMPTY {
                let error = restored.merge_batch(&arrays).unwrap_err().to_string();
                assert!(error.contains("cannot merge partial results"), "{error}");
            }
        }
        // An empty state merges into anything.
        let empty: Vec<ArrayRef> = CusumAccumulator::new(PARAMS)
            .state()
            .unwrap()
            .iter()
            .map(|s| s.to_array().unwrap())
            .collect();
        straight.merge_batch(&empty).unwrap();
    }

    #[test]
    fn literals_are_checked_when_planned() {
        assert!(check_cusum_args(&[col("v"), lit(0.5), lit(5)]).is_ok());
        assert!(check_cusum_args(&[col("v"), lit(0), lit(4.5), lit(10)]).is_ok());
        for (args, expected) in [
            (
                vec![col("v"), lit(-1), lit(5)],
                "cusum: k must be a number literal >= 0, got -1",
            ),
            (
                vec![col("v"), col("w"), lit(5)],
                "cusum: k must be a number literal >= 0, got w",
            ),
            (
                vec![col("v"), lit(0.5), lit(0)],
                "cusum: h must be a number literal > 0, got 0",
            ),
            (
                vec![col("v"), lit(0.5), lit(f64::INFINITY)],
                "cusum: h must be a number literal > 0, got inf",
            ),
            (
                vec![col("v"), lit(0.5), lit(5), lit(1)],
                "cusum: warmup must be an integer literal >= 2, got 1",
            ),
            (
                vec![col("v"), lit(0.5), lit(5), lit(2.5)],
                "cusum: warmup must be an integer literal >= 2, got 2.5",
            ),
            (
                vec![col("v"), lit(0.5)],
                "cusum takes three or four arguments (x, k, h [, warmup]), got 2",
            ),
        ] {
            let error = check_cusum_args(&args).unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
        }
    }
}
