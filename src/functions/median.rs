//! `median(x)` that always averages the two middle values of an even count.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, FieldRef};
use datafusion::common::plan_err;
use datafusion::error::Result;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, GroupsAccumulator, Signature, Volatility,
};

/// DataFusion's exact median returns the input type, so an even count of
/// integers truncates the mean of the two middle values. The semantics say
/// it is their mean, so numeric input is taken as DOUBLE; the accumulator is
/// DataFusion's own.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ExactMedian {
    builtin: Arc<AggregateUDF>,
    signature: Signature,
}

impl ExactMedian {
    /// Wraps DataFusion's `median`.
    pub fn new(builtin: Arc<AggregateUDF>) -> Self {
        Self {
            builtin,
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl AggregateUDFImpl for ExactMedian {
    fn name(&self) -> &str {
        "median"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        match arg_types {
            [t] if t.is_numeric() || t.is_null() => Ok(vec![DataType::Float64]),
            [t] => plan_err!("median needs a numeric argument, got {t}"),
            _ => plan_err!("median takes one argument, got {}", arg_types.len()),
        }
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        self.builtin.inner().accumulator(args)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        self.builtin.inner().state_fields(args)
    }

    fn groups_accumulator_supported(&self, args: AccumulatorArgs) -> bool {
        self.builtin.inner().groups_accumulator_supported(args)
    }

    fn create_groups_accumulator(
        &self,
        args: AccumulatorArgs,
    ) -> Result<Box<dyn GroupsAccumulator>> {
        self.builtin.inner().create_groups_accumulator(args)
    }
}
