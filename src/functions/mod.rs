//! vigil's SQL functions: DataFusion's built-ins, with overrides where
//! vigil's semantics differ and additions for robust statistics,
//! registered with the SQL planner.
//!
//! The JSON functions of `datafusion-functions-json` (`json_get`,
//! `json_get_str`, `json_contains`, ... and the `->`, `->>`, `?` operators)
//! read a TEXT column that holds JSON.
//!
//! `counter_increase(ts, value)` and `counter_irate(ts, value)` read a
//! counter as Prometheus does, resets included (what `vigil import-rules`
//! translates `rate`, `increase` and `irate` to).
//!
//! Aggregates for a key's history of windows, meant for
//! `f(...) OVER (PARTITION BY key ORDER BY window_end ROWS BETWEEN m
//! PRECEDING AND CURRENT ROW)` over a stream of window results:
//!
//! - `ewma(x, alpha)`: the exponentially weighted moving average.
//! - `cusum(x, k, h [, warmup])`: the self-starting two-sided CUSUM of
//!   `x` against its values since the last alarm; a level shift gives one
//!   row beyond `h`, then the new level is learnt.
//! - `cadence(ts)`: the sampling step in seconds, the median gap between
//!   consecutive distinct timestamps (NULL below two). Order-independent,
//!   so it is also a plain aggregate of any window, `HOP` included.
//! - `change_score(x, n)`: the median of the last `n` non-NULL values
//!   against the median of the ones before them (the reference), over the
//!   larger of `1.4826 * MAD(reference)` and the reference's population
//!   standard deviation; NULL when there is no spread or the reference has
//!   fewer than 2 values.
//! - `seasonal_z(x, period)`: the current (last) value against the median
//!   of the same phase in earlier periods (`v[m-1-k*period]`, NULLs keep
//!   their place), over `1.4826 * MAD(d) / sqrt(2)` of the seasonal
//!   differences `d_i = v[i] - v[i-period]` before the current row
//!   (`stddev_pop(d) / sqrt(2)` when the MAD is 0).
//!
//! `ewma`, `cusum`, `change_score` and `seasonal_z` depend on row order:
//! they cannot merge partial states (a `HOP`'s panes), only restore one;
//! their literals (`alpha`, `k` and `h`, `n`, `period`) are checked when
//! the query is planned
//! ([`check_window_call`]).
//!
//! Window functions for peer comparisons score or cluster every row of a
//! partition against all its rows: `robust_z(x)` and
//! `dbscan(eps, min_pts, x1, ...)`, called as
//! `f(...) OVER (PARTITION BY window_end)`; [`check_dbscan_args`] checks a
//! `dbscan` call's literals when the query is planned.
//!
//! Debug builds (the tests') also have `test_row_cost(x, micros)` and
//! `test_row_wait(x, micros)`, which spend a known CPU or sleeping time per
//! row (`functions/test_cost.rs`).

mod cadence;
mod change;
mod counter;
mod cusum;
mod dbscan;
mod ewma;
mod frame;
mod mad;
mod median;
mod robust_z;
mod seasonal;
mod sketch;
#[cfg(debug_assertions)]
mod test_cost;

pub use change::check_change_score_args;
pub use cusum::check_cusum_args;
pub use dbscan::check_dbscan_args;
pub use ewma::check_ewma_args;
pub use seasonal::check_seasonal_z_args;

use std::sync::Arc;

use datafusion::execution::FunctionRegistry;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::{AggregateUDF, WindowUDF};

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
    for kind in [counter::CounterKind::Increase, counter::CounterKind::Irate] {
        state.register_udaf(Arc::new(AggregateUDF::from(counter::Counter::new(kind))))?;
    }
    state.register_udaf(Arc::new(AggregateUDF::from(ewma::Ewma::default())))?;
    state.register_udaf(Arc::new(AggregateUDF::from(cusum::Cusum::default())))?;
    state.register_udaf(Arc::new(AggregateUDF::from(cadence::Cadence::default())))?;
    state.register_udaf(Arc::new(AggregateUDF::from(change::udaf())))?;
    state.register_udaf(Arc::new(AggregateUDF::from(seasonal::udaf())))?;
    state.register_udaf(Arc::new(AggregateUDF::from(
        sketch::ApproxPercentile::default(),
    )))?;
    state.register_udwf(Arc::new(WindowUDF::from(robust_z::RobustZ::default())))?;
    state.register_udwf(Arc::new(WindowUDF::from(dbscan::Dbscan::default())))?;
    datafusion_functions_json::register_all(state)?;
    #[cfg(debug_assertions)]
    for spend in [test_cost::Spend::Spin, test_cost::Spend::Sleep] {
        state.register_udf(Arc::new(datafusion::logical_expr::ScalarUDF::from(
            test_cost::TestRowCost::new(spend),
        )))?;
    }
    Ok(())
}

/// Checks, when a query is planned, the constant arguments of a window
/// function call that vigil can check early (`dbscan`'s eps and min_pts,
/// `ewma`'s alpha, `cusum`'s k, h and warmup, `change_score`'s n,
/// `seasonal_z`'s period).
pub fn check_window_call(expr: &datafusion::logical_expr::Expr) -> Result<()> {
    use datafusion::logical_expr::{Expr, WindowFunctionDefinition};
    let Expr::WindowFunction(call) = expr.clone().unalias() else {
        return Ok(());
    };
    match &call.fun {
        WindowFunctionDefinition::WindowUDF(udf) if udf.name() == "dbscan" => {
            check_dbscan_args(&call.params.args)
        }
        WindowFunctionDefinition::AggregateUDF(udaf) if udaf.name() == "ewma" => {
            check_ewma_args(&call.params.args)
        }
        WindowFunctionDefinition::AggregateUDF(udaf) if udaf.name() == "cusum" => {
            check_cusum_args(&call.params.args)
        }
        WindowFunctionDefinition::AggregateUDF(udaf) if udaf.name() == "change_score" => {
            check_change_score_args(&call.params.args)
        }
        WindowFunctionDefinition::AggregateUDF(udaf) if udaf.name() == "seasonal_z" => {
            check_seasonal_z_args(&call.params.args)
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests;
