//! `ewma(x, alpha)`: the exponentially weighted moving average of `x` in
//! row order, `s = alpha * x + (1 - alpha) * s`, starting at the first
//! non-NULL `x`. Meant for a key's history of windows:
//! `ewma(avg_cpu, 0.3) OVER (PARTITION BY host ORDER BY window_end)`.

use datafusion::arrow::array::{ArrayRef, AsArray};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Float64Type};
use datafusion::common::{ScalarValue, exec_err, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{Accumulator, AggregateUDFImpl, Expr, Signature, Volatility};
use datafusion::physical_expr::expressions::Literal;

use crate::error::{Error, Result as VigilResult};

/// The `ewma` aggregate. Its value depends on row order, so it cannot merge
/// partial states: it works where rows come in order (`OVER (... ORDER BY
/// window_end)`, a tumbling window's own rows), not across a `HOP`'s panes.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Ewma {
    signature: Signature,
}

impl Default for Ewma {
    fn default() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl AggregateUDFImpl for Ewma {
    fn name(&self) -> &str {
        "ewma"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        match arg_types {
            [x, a] if (x.is_numeric() || x.is_null()) && a.is_numeric() => {
                Ok(vec![DataType::Float64, DataType::Float64])
            }
            [_, _] => plan_err!("ewma(x, alpha) needs numbers, got {arg_types:?}"),
            _ => plan_err!(
                "ewma takes two arguments (x, alpha), got {}",
                arg_types.len()
            ),
        }
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![
            Field::new(
                format_state_name(args.name, "ewma"),
                DataType::Float64,
                true,
            )
            .into(),
        ])
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let alpha = args
            .exprs
            .get(1)
            .and_then(|e| e.as_ref().downcast_ref::<Literal>())
            .and_then(|l| match l.value().clone() {
                ScalarValue::Float64(Some(a)) => Some(a),
                _ => None,
            });
        match alpha {
            Some(alpha) if alpha > 0.0 && alpha <= 1.0 => {
                Ok(Box::new(EwmaAccumulator { alpha, value: None }))
            }
            _ => exec_err!("ewma: alpha must be a number literal in (0, 1]"),
        }
    }
}

/// The average so far.
#[derive(Debug)]
struct EwmaAccumulator {
    alpha: f64,
    value: Option<f64>,
}

impl Accumulator for EwmaAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        for x in values[0].as_primitive::<Float64Type>().iter().flatten() {
            self.value = Some(match self.value {
                None => x,
                Some(s) => self.alpha * x + (1.0 - self.alpha) * s,
            });
        }
        Ok(())
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        Ok(ScalarValue::Float64(self.value))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self)
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![ScalarValue::Float64(self.value)])
    }

    /// Takes the one partial average there is into an accumulator that
    /// has none: how a checkpointed window gets its state back. Merging two
    /// averages is refused, as their order is lost.
    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let mut values = states[0].as_primitive::<Float64Type>().iter().flatten();
        match (self.value, values.next(), values.next()) {
            (_, None, _) => return Ok(()),
            (None, Some(value), None) => {
                self.value = Some(value);
                return Ok(());
            }
            _ => {}
        }
        exec_err!(
            "ewma depends on row order and cannot merge partial results (HOP windows); use it over a key's history: OVER (PARTITION BY key ORDER BY window_end)"
        )
    }
}

/// Checks, at plan time, that an `ewma` call's alpha is a literal in (0, 1].
pub fn check_ewma_args(args: &[Expr]) -> VigilResult<()> {
    let alpha = match args.get(1) {
        Some(Expr::Literal(value, _)) => value.clone(),
        Some(Expr::Cast(cast)) => match cast.expr.as_ref() {
            Expr::Literal(value, _) => value.clone(),
            other => return Err(bad_alpha(&other.to_string())),
        },
        Some(other) => return Err(bad_alpha(&other.to_string())),
        None => return Err(Error::Plan("ewma takes two arguments (x, alpha)".into())),
    };
    match alpha.cast_to(&DataType::Float64) {
        Ok(ScalarValue::Float64(Some(a))) if a > 0.0 && a <= 1.0 => Ok(()),
        _ => Err(bad_alpha(&alpha.to_string())),
    }
}

fn bad_alpha(got: &str) -> Error {
    Error::Plan(format!(
        "ewma: alpha must be a number literal in (0, 1], got {got}"
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::Float64Array;
    use datafusion::logical_expr::lit;

    use super::*;

    #[test]
    fn averages_in_row_order() {
        let mut acc = EwmaAccumulator {
            alpha: 0.5,
            value: None,
        };
        let values: ArrayRef = Arc::new(Float64Array::from(vec![Some(10.0), None, Some(20.0)]));
        acc.update_batch(&[values]).unwrap();
        // 10, then 0.5 * 20 + 0.5 * 10.
        assert_eq!(acc.evaluate().unwrap(), ScalarValue::Float64(Some(15.0)));
        let more: ArrayRef = Arc::new(Float64Array::from(vec![40.0]));
        acc.update_batch(&[more]).unwrap();
        assert_eq!(acc.evaluate().unwrap(), ScalarValue::Float64(Some(27.5)));
    }

    #[test]
    fn one_state_restores_and_two_are_refused() {
        let mut acc = EwmaAccumulator {
            alpha: 0.5,
            value: None,
        };
        acc.update_batch(&[Arc::new(Float64Array::from(vec![10.0, 20.0]))])
            .unwrap();
        let state = acc.state().unwrap()[0].to_array().unwrap();
        let mut restored = EwmaAccumulator {
            alpha: 0.5,
            value: None,
        };
        restored.merge_batch(std::slice::from_ref(&state)).unwrap();
        let more: ArrayRef = Arc::new(Float64Array::from(vec![0.1, 7.3]));
        acc.update_batch(std::slice::from_ref(&more)).unwrap();
        restored.update_batch(&[more]).unwrap();
        assert_eq!(restored.evaluate().unwrap(), acc.evaluate().unwrap());
        assert!(restored.merge_batch(&[state]).is_err());
        let nothing: ArrayRef = Arc::new(Float64Array::from(vec![None::<f64>]));
        assert!(restored.merge_batch(&[nothing]).is_ok());
    }

    #[test]
    fn alpha_is_checked_when_planned() {
        assert!(check_ewma_args(&[lit(1.0), lit(0.3)]).is_ok());
        assert!(check_ewma_args(&[lit(1.0), lit(1)]).is_ok());
        for bad in [lit(0.0), lit(1.5), lit(-0.2)] {
            let e = check_ewma_args(&[lit(1.0), bad]).unwrap_err().to_string();
            assert!(
                e.contains("alpha must be a number literal in (0, 1]"),
                "{e}"
            );
        }
        let column = datafusion::logical_expr::col("a");
        assert!(check_ewma_args(&[lit(1.0), column]).is_err());
    }
}
