//! `approx_percentile(x, p)`: a quantile from a DDSketch (Masson, Rim and
//! Lee, VLDB 2019), mergeable and of bounded size.
//!
//! Values fall into logarithmic buckets `(γ^(i-1), γ^i]` with
//! `γ = (1 + α) / (1 - α)`; a bucket reports `2γ^i / (γ + 1)`, which is
//! within a relative error `α` of every value in it. So the returned
//! quantile is within `α` (here 1 %) of the exact lower quantile (the
//! value of rank `⌊p·(n-1)⌋` in sorted order). The number of buckets grows
//! with the log of the values' range, not with the row count: for
//! magnitudes between 1e-9 and 1e12 there are at most about 2,400 buckets
//! per sign.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Float64Type};
use datafusion::common::{ScalarValue, plan_err};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{Accumulator, AggregateUDFImpl, Signature, Volatility};
use datafusion::physical_expr::expressions::Literal;

/// Relative accuracy of every quantile.
pub const RELATIVE_ACCURACY: f64 = 0.01;

/// Magnitudes below this count as zero.
const MIN_MAGNITUDE: f64 = 1e-9;

/// `approx_percentile(x, p)` with `p` a constant in `[0, 1]`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ApproxPercentile {
    signature: Signature,
}

impl Default for ApproxPercentile {
    fn default() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl AggregateUDFImpl for ApproxPercentile {
    fn name(&self) -> &str {
        "approx_percentile"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        match arg_types {
            [x, p] if (x.is_numeric() || x.is_null()) && p.is_numeric() => {
                Ok(vec![DataType::Float64, DataType::Float64])
            }
            _ => {
                plan_err!("approx_percentile takes (numeric value, constant fraction p in [0, 1])")
            }
        }
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![Arc::new(Field::new(
            format_state_name(args.name, "ddsketch"),
            DataType::Binary,
            true,
        ))])
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let p = args
            .exprs
            .get(1)
            .and_then(|e| e.downcast_ref::<Literal>())
            .and_then(|l| l.value().cast_to(&DataType::Float64).ok())
            .and_then(|v| match v {
                ScalarValue::Float64(Some(p)) if (0.0..=1.0).contains(&p) => Some(p),
                _ => None,
            })
            .ok_or_else(|| {
                DataFusionError::Plan(
                    "approx_percentile needs a constant fraction p in [0, 1]".into(),
                )
            })?;
        Ok(Box::new(SketchAccumulator {
            sketch: Sketch::default(),
            p,
        }))
    }
}

/// Bucket counts of a DDSketch.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Sketch {
    positive: BTreeMap<i32, u64>,
    negative: BTreeMap<i32, u64>,
    zeros: u64,
}

fn gamma() -> f64 {
    (1.0 + RELATIVE_ACCURACY) / (1.0 - RELATIVE_ACCURACY)
}

fn bucket(magnitude: f64) -> i32 {
    (magnitude.ln() / gamma().ln()).ceil() as i32
}

fn bucket_value(index: i32) -> f64 {
    2.0 * gamma().powi(index) / (gamma() + 1.0)
}

impl Sketch {
    /// Adds a value (NaN is ignored).
    pub fn add(&mut self, v: f64) {
        if v.is_nan() {
            return;
        }
        if v.abs() < MIN_MAGNITUDE {
            self.zeros += 1;
        } else if v > 0.0 {
            *self.positive.entry(bucket(v)).or_default() += 1;
        } else {
            *self.negative.entry(bucket(-v)).or_default() += 1;
        }
    }

    /// Number of values added.
    pub fn count(&self) -> u64 {
        self.zeros + self.positive.values().sum::<u64>() + self.negative.values().sum::<u64>()
    }

    /// Adds another sketch's counts.
    pub fn merge(&mut self, other: &Sketch) {
        for (k, c) in &other.positive {
            *self.positive.entry(*k).or_default() += c;
        }
        for (k, c) in &other.negative {
            *self.negative.entry(*k).or_default() += c;
        }
        self.zeros += other.zeros;
    }

    /// The lower `p` quantile, within the relative accuracy; `None` when
    /// empty.
    pub fn quantile(&self, p: f64) -> Option<f64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let rank = (p * (n - 1) as f64).floor() as u64;
        let mut seen = 0;
        for (k, c) in self.negative.iter().rev() {
            seen += c;
            if seen > rank {
                return Some(-bucket_value(*k));
            }
        }
        seen += self.zeros;
        if seen > rank {
            return Some(0.0);
        }
        for (k, c) in &self.positive {
            seen += c;
            if seen > rank {
                return Some(bucket_value(*k));
            }
        }
        None
    }

    /// Number of buckets in use: the sketch's size.
    pub fn buckets(&self) -> usize {
        self.positive.len() + self.negative.len()
    }

    fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + 12 * self.buckets());
        out.extend_from_slice(&self.zeros.to_le_bytes());
        out.extend_from_slice(&(self.positive.len() as u32).to_le_bytes());
        for store in [&self.positive, &self.negative] {
            for (k, c) in store {
                out.extend_from_slice(&k.to_le_bytes());
                out.extend_from_slice(&c.to_le_bytes());
            }
        }
        out
    }

    fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let bad = || DataFusionError::Internal("corrupt approx_percentile state".into());
        let zeros = u64::from_le_bytes(
            bytes
                .get(0..8)
                .ok_or_else(bad)?
                .try_into()
                .map_err(|_| bad())?,
        );
        let positives = u32::from_le_bytes(
            bytes
                .get(8..12)
                .ok_or_else(bad)?
                .try_into()
                .map_err(|_| bad())?,
        );
        let mut sketch = Sketch {
            zeros,
            ..Sketch::default()
        };
        for (i, entry) in bytes[12..].chunks(12).enumerate() {
            if entry.len() != 12 {
                return Err(bad());
            }
            let k = i32::from_le_bytes(entry[0..4].try_into().map_err(|_| bad())?);
            let c = u64::from_le_bytes(entry[4..12].try_into().map_err(|_| bad())?);
            let store = if (i as u32) < positives {
                &mut sketch.positive
            } else {
                &mut sketch.negative
            };
            store.insert(k, c);
        }
        Ok(sketch)
    }
}

#[derive(Debug)]
struct SketchAccumulator {
    sketch: Sketch,
    p: f64,
}

impl Accumulator for SketchAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        for v in values[0].as_primitive::<Float64Type>().iter().flatten() {
            self.sketch.add(v);
        }
        Ok(())
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        Ok(ScalarValue::Float64(self.sketch.quantile(self.p)))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + 32 * self.sketch.buckets()
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![ScalarValue::Binary(Some(self.sketch.to_bytes()))])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        for bytes in states[0].as_binary::<i32>().iter().flatten() {
            self.sketch.merge(&Sketch::from_bytes(bytes)?);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exact_lower_quantile(values: &[f64], p: f64) -> f64 {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        sorted[(p * (sorted.len() - 1) as f64).floor() as usize]
    }

    fn relative_error(approx: f64, exact: f64) -> f64 {
        if exact == 0.0 {
            approx.abs()
        } else {
            ((approx - exact) / exact).abs()
        }
    }

    /// The real NAB machine-temperature series: every quantile within the
    /// stated relative accuracy of the exact one, whole and per day, and a
    /// merge of per-day sketches equals the sketch of the whole.
    #[test]
    fn within_one_percent_of_exact_on_real_data() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/queries/data/nab/machine_temperature_system_failure.csv"
        );
        let text = std::fs::read_to_string(path).expect("bundled NAB series");
        let values: Vec<f64> = text
            .lines()
            .skip(1)
            .map(|l| l.split(',').nth(1).unwrap().parse().unwrap())
            .collect();
        assert!(values.len() > 20_000);
        let mut whole = Sketch::default();
        let mut merged = Sketch::default();
        for day in values.chunks(288) {
            let mut sketch = Sketch::default();
            for v in day {
                sketch.add(*v);
                whole.add(*v);
            }
            merged.merge(&sketch);
            for p in [0.0, 0.1, 0.5, 0.9, 0.99, 1.0] {
                let err = relative_error(sketch.quantile(p).unwrap(), exact_lower_quantile(day, p));
                assert!(err <= RELATIVE_ACCURACY + 1e-12, "p {p}: error {err}");
            }
        }
        assert_eq!(merged, whole);
        for p in [0.01, 0.5, 0.99, 0.999] {
            let err = relative_error(whole.quantile(p).unwrap(), exact_lower_quantile(&values, p));
            assert!(err <= RELATIVE_ACCURACY + 1e-12, "p {p}: error {err}");
        }
        // Size follows the range of the values, not their number.
        assert!(whole.buckets() < 200, "{} buckets", whole.buckets());
    }

    #[test]
    fn signs_zeros_and_state_round_trip() {
        let mut sketch = Sketch::default();
        for v in [-100.0, -1.0, 0.0, 0.0, 1.0, 50.0, f64::NAN] {
            sketch.add(v);
        }
        assert_eq!(sketch.count(), 6);
        assert!(relative_error(sketch.quantile(0.0).unwrap(), -100.0) <= RELATIVE_ACCURACY);
        assert_eq!(sketch.quantile(0.4), Some(0.0));
        assert!(relative_error(sketch.quantile(1.0).unwrap(), 50.0) <= RELATIVE_ACCURACY);
        assert_eq!(Sketch::from_bytes(&sketch.to_bytes()).unwrap(), sketch);
        assert_eq!(Sketch::default().quantile(0.5), None);
    }
}
