//! `test_row_cost(x, micros)`: `x`, after spending `micros` microseconds
//! of CPU per row. Registered in debug builds only (the tests' builds):
//! the autoscaling tests give a query a known capacity with it, so that
//! the parallelism or the number of processes it needs is known whatever
//! the machine's speed.

use std::time::{Duration, Instant};

use datafusion::arrow::array::{Array, AsArray, Float64Array};
use datafusion::arrow::datatypes::{DataType, Float64Type, Int64Type};
use datafusion::common::{Result, ScalarValue, exec_err};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

/// See the [module docs](self).
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) struct TestRowCost {
    signature: Signature,
}

impl Default for TestRowCost {
    fn default() -> Self {
        Self {
            signature: Signature::exact(
                vec![DataType::Float64, DataType::Int64],
                Volatility::Volatile,
            ),
        }
    }
}

impl ScalarUDFImpl for TestRowCost {
    fn name(&self) -> &str {
        "test_row_cost"
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
        for _ in 0..values.len() {
            spin(per_row);
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
