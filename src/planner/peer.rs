//! Planning window functions over the peers of one window
//! (`OVER (PARTITION BY window_end ...)`) into a [`PeerOp`].

use std::sync::Arc;

use datafusion::common::Column;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::datasource::{MemTable, provider_as_source};
use datafusion::execution::SessionStateBuilder;
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder};
use datafusion::prelude::SessionConfig;

use crate::error::{Error, Result};
use crate::exec::{PeerOp, WindowEnd};

/// A [`PeerOp`] for a `Window` node whose functions partition by window.
/// `end` says where each input row's window ends.
pub fn peer_op(window: &datafusion::logical_expr::Window, end: WindowEnd) -> Result<PeerOp> {
    let input = Arc::new(window.input.schema().as_arrow().clone());
    let names: Vec<&String> = input.fields().iter().map(|f| f.name()).collect();
    if let Some(dup) = names
        .iter()
        .find(|n| names.iter().filter(|m| m == n).count() > 1)
    {
        return Err(Error::Plan(format!(
            "OVER (PARTITION BY window ...) needs distinct column names, but '{dup}' appears twice; alias one"
        )));
    }
    let mut config = SessionConfig::new().with_target_partitions(1);
    config.options_mut().optimizer.repartition_windows = false;
    let mut state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .build();
    crate::functions::register(&mut state)?;
    let table = MemTable::try_new(input.clone(), vec![vec![]])?;
    let scan = LogicalPlanBuilder::scan("peers", provider_as_source(Arc::new(table)), None)?;
    let exprs = window
        .window_expr
        .iter()
        .map(|e| unqualified(e.clone()))
        .collect::<Result<Vec<_>>>()?;
    let plan = LogicalPlan::Window(datafusion::logical_expr::Window::try_new(
        exprs,
        Arc::new(scan.build()?),
    )?);
    let physical = futures::executor::block_on(state.create_physical_plan(&plan))?;
    let output = Arc::new(window.schema.as_arrow().clone());
    let description = format!(
        "peers {}",
        window
            .window_expr
            .iter()
            .map(|e| e.schema_name().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(PeerOp::new(
        physical,
        state.task_ctx(),
        (input, output),
        end,
        description,
    ))
}

/// The expression with its column references unqualified, to read the
/// placeholder input (which has the same column names).
fn unqualified(expr: Expr) -> Result<Expr> {
    Ok(expr
        .transform(|e| {
            Ok(match e {
                Expr::Column(c) if c.relation.is_some() => {
                    Transformed::yes(Expr::Column(Column::new_unqualified(c.name)))
                }
                other => Transformed::no(other),
            })
        })?
        .data)
}
