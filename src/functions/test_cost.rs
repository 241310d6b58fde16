//! `test_row_cost(x, micros)`: `x`, after spending `micros` microseconds
//! of CPU per row; `test_row_wait(x, micros)`: the same time asleep, which
//! takes no core, so that more instances than cores each keep their rate.
//! Registered in debug builds only (the tests' builds): the autoscaling
//! tests give a query a known capacity with them, so that the parallelism
//! or the number of processes it needs is known whatever the machine's
//! speed.

use std::time::{Duration, Instant};

use datafusion::arrow::array::{Array, AsArray, Float64Array};
use datafusion::arrow::datatypes::{DataType, Float64Type, Int64Type};
use datafusion::common::{Result, ScalarValue, exec_err};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

/// How a row's time is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Spend {
    /// On a core (`test_row_cost`).
    Spin,
    /// Asleep (`test_row_wait`).
    Sleep,
}

/// See the [module docs](self).
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) struct TestRowCost {
    signature: Signature,
    spend: Spend,
}

impl TestRowCost {
    /// The function that spends its time as `spend` says.
    pub(super) fn new(spend: Spend) -> Self {
        Self {
            signature: Signature::exact(
                vec![DataType::Float64, DataType::Int64],
                Volatility::Volatile,
            ),
            spend,
        }
    }
}

impl ScalarUDFImpl for TestRowCost {
    fn name(&self) -> &str {
        match self.spend {
            Spend::Spin => "test_row_cost",
            Spend::Sleep => "test_row_wait",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let micros = match &args.args[1] {
            ColumnarValue::Scalar(ScalarValue::Int64(Some(m))) if *m >= 0 => *m as u64,
            ColumnarValue::Array(a) if !a.is_empty() && a.is_valid(0) => {
                a.as_primitive::<Int64Type>().value(0).max(0) as u64
            }
            _ => return exec_err!("test_row_cost: micros must be a whole number >= 0"),
        };
        let values = args.args[0].to_array(args.number_rows)?;
        let per_row = Duration::from_micros(micros);
        match self.spend {
            Spend::Spin => (0..values.len()).for_each(|_| spin(per_row)),
            Spend::Sleep => std::thread::sleep(per_row * values.len() as u32),
        }
        let values: &Float64Array = values.as_primitive::<Float64Type>();
        Ok(ColumnarValue::Array(std::sync::Arc::new(values.clone())))
    }
}

/// Busy-waits `time`: CPU spent, as real work would spend it.
fn spin(time: Duration) {
    let start = Instant::now();
    while start.elapsed() < time {
        std::hint::spin_loop();
    }
}
