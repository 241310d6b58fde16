//! vigil's SQL functions: DataFusion's built-ins, with overrides where
//! vigil's semantics differ and additions for robust statistics,
//! registered with the SQL planner.

mod mad;
mod median;
mod sketch;

use std::sync::Arc;

use datafusion::execution::FunctionRegistry;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::AggregateUDF;

use crate::error::Result;

/// Registers vigil's functions in `state`, replacing built-ins of the same
/// name.
pub fn register(state: &mut SessionState) -> Result<()> {
    if let Some(builtin) = state.aggregate_functions().get("median").cloned() {
        state.register_udaf(Arc::new(AggregateUDF::from(median::ExactMedian::new(
            builtin,
        ))))?;
    }
    state.register_udaf(Arc::new(AggregateUDF::from(mad::Mad::default())))?;
    state.register_udaf(Arc::new(AggregateUDF::from(
        sketch::ApproxPercentile::default(),
    )))?;
    Ok(())
}
