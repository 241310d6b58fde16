//! Planning a bounded question as a batch query.
//!
//! A query the streaming rules reject (an aggregate without a window,
//! `ORDER BY`, a join without a common window, ...) cannot run on a stream
//! that never ends. When every stream it reads does end (a file read
//! without `follow`), it is a question about a table: it runs once, at the
//! end of its input, as DataFusion plans it (see [`BatchOp`]). Over a stream
//! that never ends, the rejection stands and says which stream and why.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::execution::SessionStateBuilder;
use datafusion::logical_expr::{LogicalPlan, TableScan};
use datafusion::prelude::SessionConfig;

use super::{ExecutionMode, QueryGraph, QueryInput, Stages};
use crate::connector::SourceLocation;
use crate::error::{Error, Result};
use crate::exec::{BatchInput, BatchOp, Operator, QueryStats};
use crate::plan::{EmitNode, StreamDef, StreamSource, WatermarkNode};

/// Plans `plan`, which the streaming rules rejected with `rejected`, as a
/// batch query if every stream it reads ends; otherwise returns the
/// rejection, saying which stream never ends.
pub(super) fn plan_batch(
    plan: &LogicalPlan,
    mode: ExecutionMode,
    rejected: Error,
) -> Result<QueryGraph> {
    let bounded_question =
        matches!(&rejected, Error::Unbounded { rule, .. } if BOUNDED_RULES.contains(rule));
    if !bounded_question {
        return Err(rejected);
    }
    if let Some(stream) = streams_read(plan)
        .into_iter()
        .find(|s| never_ends(s).is_some())
    {
        return Err(never_finishes(rejected, &stream));
    }
    let Some((batch_plan, streams)) = with_batch_inputs(plan)? else {
        return Err(rejected);
    };
    let mut config = SessionConfig::new().with_target_partitions(1);
    config.options_mut().optimizer.repartition_joins = false;
    config.options_mut().optimizer.repartition_aggregations = false;
    config.options_mut().optimizer.repartition_sorts = false;
    let mut state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .build();
    crate::functions::register(&mut state)?;
    let schema = Arc::new(plan.schema().as_arrow().clone());
    let op = BatchOp::try_new(
        batch_plan,
        state,
        streams.iter().map(|s| s.schema.clone()).collect(),
        schema.clone(),
    )?;
    let several = streams.len() > 1;
    let inputs = streams
        .into_iter()
        .map(|stream| QueryInput {
            stream,
            stages: Vec::new(),
        })
        .collect();
    // One input feeds the operator directly; several meet in it, each
    // input's rows kept apart.
    let (join, stages): (_, Stages) = match several {
        true => (Some(super::Merge::single(Box::new(op))), Vec::new()),
        false => (
            None,
            vec![super::Stage::single(
                vec![Box::new(op) as Box<dyn Operator>],
            )],
        ),
    };
    Ok(QueryGraph {
        inputs,
        join,
        stages,
        schema,
        mode,
        stats: Arc::new(QueryStats::default()),
        late_outputs: Vec::new(),
    })
}

/// The streaming rules whose rejections are about an input that never
/// ends: over inputs that end, such a query has an answer.
const BOUNDED_RULES: [&str; 4] = ["unbounded aggregate", "ORDER BY", "join", "window function"];

/// Why `stream` never ends, if it does not.
pub fn never_ends(stream: &StreamDef) -> Option<&'static str> {
    match &stream.source.location {
        SourceLocation::File(_) if stream.source.follow => {
            Some("it follows its file as it grows (follow = 'true' or --follow)")
        }
        SourceLocation::File(_) => None,
        SourceLocation::Stdin => Some("it reads standard input as it comes"),
        SourceLocation::Connector(reader) => Some(reader.0.live_because()),
        SourceLocation::Push => Some("connector 'push' takes rows as they are pushed"),
    }
}

/// The rejection, with why the query cannot finish on `stream`.
fn never_finishes(rejected: Error, stream: &StreamDef) -> Error {
    let why = never_ends(stream).unwrap_or("it never ends");
    match rejected {
        Error::Unbounded { rule, message } => Error::Unbounded {
            rule,
            message: format!(
                "{message}; the query cannot finish on stream '{}', which never ends ({why})",
                stream.name
            ),
        },
        other => other,
    }
}

/// The streams `plan` scans, in plan order.
fn streams_read(plan: &LogicalPlan) -> Vec<Arc<StreamDef>> {
    let mut streams = Vec::new();
    let _ = plan.apply(|node| {
        if let Some(def) = stream_of(node) {
            streams.push(def);
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    });
    streams
}

fn stream_of(node: &LogicalPlan) -> Option<Arc<StreamDef>> {
    let LogicalPlan::TableScan(scan) = node else {
        return None;
    };
    scan.source
        .as_ref()
        .downcast_ref::<StreamSource>()
        .map(|s| s.def.clone())
}

/// `plan` as DataFusion can run it over tables: each stream scan reads a
/// [`BatchInput`] (numbered in the order of the returned streams), and
/// watermarks and a plain emit clause are dropped (they mean nothing
/// without a window). `None` when the plan has a node only vigil's
/// streaming operators know (a window, an alert, a changelog).
fn with_batch_inputs(plan: &LogicalPlan) -> Result<Option<(LogicalPlan, Vec<Arc<StreamDef>>)>> {
    let mut streams: Vec<Arc<StreamDef>> = Vec::new();
    let mut streaming_only = false;
    let rewritten = plan
        .clone()
        .transform_up(|node| {
            if let Some(def) = stream_of(&node) {
                let LogicalPlan::TableScan(scan) = &node else {
                    unreachable!("stream_of reads scans only")
                };
                let input = BatchInput {
                    index: streams.len(),
                    schema: def.schema.clone(),
                };
                streams.push(def);
                return Ok(Transformed::yes(LogicalPlan::TableScan(TableScan {
                    source: Arc::new(input),
                    ..scan.clone()
                })));
            }
            let LogicalPlan::Extension(ext) = &node else {
                return Ok(Transformed::no(node));
            };
            let any = ext.node.as_any();
            let dropped = any
                .downcast_ref::<WatermarkNode>()
                .map(|w| &w.input)
                .or_else(|| {
                    any.downcast_ref::<EmitNode>()
                        .filter(|e| e.policy.marker().is_none())
                        .map(|e| &e.input)
                });
            match dropped {
                Some(input) => Ok(Transformed::yes(input.clone())),
                None => {
                    streaming_only = true;
                    Ok(Transformed::no(node))
                }
            }
        })?
        .data;
    Ok((!streaming_only).then_some((rewritten, streams)))
}
