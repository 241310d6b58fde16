//! Where the planner puts load shedding: a [`ShedOp`] on the stream's rows
//! ahead of every other operator (in the one-instance task that assigns
//! windows, before the expensive stage), and on a windowed aggregate's
//! results the `_shed_fraction` column, carried through the projections,
//! filters and limits above it.
//!
//! An alert over such results turns `_shed_fraction` into its own last
//! column, `approximate` (see [`crate::exec::AlertOp::with_approximate`]).
//!
//! Supported: queries of one stream without an aggregate, and queries of
//! one stream with a windowed (TUMBLE or HOP) aggregate whose grouping keys
//! are columns of the stream. Anything else over a shedding stream is
//! refused with an error rather than given results that do not say they
//! are approximate.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::{Aggregate, Expr, LogicalPlan};
use datafusion::physical_expr::PhysicalExpr;

use super::{Builder, Built, Placement, QueryGraph};
use crate::error::{Error, Result};
use crate::exec::shed::SHED_FRACTION;
use crate::exec::{ShedConfig, ShedLedger, ShedOp, ShedOutput, ShedPolicy, ShedWindows};
use crate::plan::{WatermarkNode, WindowNode, WindowSpec};

/// A query's shedding, as one build of its plan sees it.
#[derive(Clone)]
pub(super) struct ShedPlan {
    config: ShedConfig,
    /// The ledger every build's aggregate reads: made by the first.
    ledger: Arc<OnceLock<Arc<ShedLedger>>>,
    /// Whether the aggregate reading the ledger runs as several instances.
    keyed: Arc<AtomicBool>,
    /// Whether this build has placed its shed op.
    placed: Rc<Cell<bool>>,
    /// Whether this build's results end with a marker column after
    /// `_shed_fraction`.
    marked: Rc<Cell<bool>>,
    /// Whether an alert turned `_shed_fraction` into `approximate`.
    alerted: Rc<Cell<bool>>,
}

impl ShedPlan {
    pub(super) fn new(config: ShedConfig) -> Self {
        Self {
            config,
            ledger: Arc::default(),
            keyed: Arc::default(),
            placed: Rc::default(),
            marked: Rc::default(),
            alerted: Rc::default(),
        }
    }

    /// The same shedding for another build of the plan.
    pub(super) fn for_build(&self) -> Self {
        Self {
            placed: Rc::default(),
            marked: Rc::default(),
            alerted: Rc::default(),
            ..self.clone()
        }
    }

    pub(super) fn placed(&self) -> bool {
        self.placed.get()
    }

    pub(super) fn mark(&self) {
        self.marked.set(true);
    }

    pub(super) fn alert(&self) {
        self.alerted.set(true);
    }

    /// Puts the shed op ahead of the windowed `aggregate` (over windows
    /// `spec`), and says what the aggregate does with its counts.
    pub(super) fn place(
        &self,
        builder: &Builder,
        built: &mut Built,
        aggregate: &Aggregate,
        spec: WindowSpec,
        keys: &[(usize, &Expr)],
        keyed: bool,
    ) -> Result<ShedOutput> {
        only_one_input(built)?;
        let stream = built.stream().clone();
        let window = find_window(&aggregate.input)?;
        let time_name = window.input.schema().field(window.time_column).name();
        let time_column = stream.schema.index_of(time_name).map_err(|_| {
            unsupported(format!(
                "the window's time column '{time_name}' is not a column of stream '{}'",
                stream.name
            ))
        })?;
        let over_stream = matches!(&window.input, LogicalPlan::Extension(e)
            if e.node.as_any().downcast_ref::<WatermarkNode>().is_some());
        let lateness_ms = if over_stream { stream.lateness_ms } else { 0 };
        let output = aggregate.schema.as_arrow();
        let key_columns = keys
            .iter()
            .map(|&(slot, expr)| {
                let field = output.field(slot);
                stream_column(&stream.schema, expr, field.data_type()).ok_or_else(|| {
                    unsupported(format!(
                        "its grouping key {expr} is not a column of stream '{}'",
                        stream.name
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let ledger = self
            .ledger
            .get_or_init(|| Arc::new(ShedLedger::new(spec, lateness_ms)))
            .clone();
        self.keyed.store(keyed, Ordering::Relaxed);
        let windows = ShedWindows {
            time_column,
            spec,
            delay_ms: stream.delay_ms,
            lateness_ms,
            keys: key_columns,
            ledger: ledger.clone(),
        };
        let op = self.op(builder, stream.schema.clone(), Some(windows))?;
        built.ops.insert(0, (Box::new(op), Placement::Serial));
        self.placed.set(true);
        Ok(ShedOutput {
            ledger,
            scale: self.config.scale && self.config.policy != ShedPolicy::Priority,
        })
    }

    fn op(
        &self,
        builder: &Builder,
        schema: SchemaRef,
        windows: Option<ShedWindows>,
    ) -> Result<ShedOp> {
        ShedOp::try_new(
            schema,
            self.config.policy,
            self.config.max_latency,
            self.config.keep.clone(),
            windows,
            builder.stats.clone(),
        )
    }

    /// Tells the ledger how many aggregate instances read it.
    pub(super) fn set_readers(&self, graph: &QueryGraph) {
        let Some(ledger) = self.ledger.get() else {
            return;
        };
        let keyed = graph
            .inputs
            .iter()
            .flat_map(|i| &i.stages)
            .chain(&graph.stages)
            .filter(|s| s.keys.is_some())
            .map(|s| s.instances.len())
            .max();
        let readers = match self.keyed.load(Ordering::Relaxed) {
            true => keyed.unwrap_or(1),
            false => 1,
        };
        ledger.set_readers(readers);
    }
}

impl Builder {
    /// After the whole plan is built: places the shed op of a query
    /// without a windowed aggregate, and returns the result schema.
    pub(super) fn finish_shed(
        &mut self,
        shed: &ShedPlan,
        plan: &LogicalPlan,
        built: &mut Built,
    ) -> Result<SchemaRef> {
        let shed = self.shed.clone().unwrap_or_else(|| shed.for_build());
        only_one_input(built)?;
        let schema = plan.schema().as_arrow();
        if shed.placed() {
            if shed.alerted.get() {
                return Ok(with_approximate(&Arc::new(schema.clone())));
            }
            if !built.shed_fraction {
                return Err(unsupported(
                    "what it does with the windowed results drops their _shed_fraction".into(),
                ));
            }
            return Ok(match shed.marked.get() {
                true => before_last(true, schema),
                false => with_fraction(&Arc::new(schema.clone())),
            });
        }
        if let Some(what) = aggregates(plan) {
            return Err(unsupported(format!(
                "it has {what}; shedding supports windowed (TUMBLE or HOP) aggregates and queries without one"
            )));
        }
        let stream = built.stream().clone();
        let op = shed
            .op(self, stream.schema.clone(), None)?
            .with_time_column(stream.event_time);
        built.ops.insert(0, (Box::new(op), Placement::Serial));
        Ok(Arc::new(schema.clone()))
    }
}

fn only_one_input(built: &Built) -> Result<()> {
    if built.inputs.len() != 1 || built.join.is_some() {
        return Err(unsupported(
            "it reads several streams; shedding supports queries of one stream".into(),
        ));
    }
    Ok(())
}

fn unsupported(why: String) -> Error {
    Error::Plan(format!(
        "load shedding cannot apply to this query: {why} (SET shed = 'off' to run it exactly)"
    ))
}

/// Refuses to build `what` over results that carry `_shed_fraction`.
pub(super) fn refuse(built: &Built, what: &str) -> Result<()> {
    match built.shed_fraction {
        true => Err(unsupported(format!(
            "{what} over shed windowed results is not supported yet"
        ))),
        false => Ok(()),
    }
}

/// The window node under an aggregate.
fn find_window(plan: &LogicalPlan) -> Result<WindowNode> {
    let mut found = None;
    plan.apply(|node| {
        if let LogicalPlan::Extension(ext) = node
            && let Some(window) = ext.node.as_any().downcast_ref::<WindowNode>()
        {
            found = Some(window.clone());
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    found.ok_or_else(|| unsupported("its windows are not assigned from the stream".into()))
}

/// The stream column an aggregate key reads, when it is one of that type.
fn stream_column(schema: &Schema, expr: &Expr, data_type: &DataType) -> Option<usize> {
    let Expr::Column(column) = expr.clone().unalias() else {
        return None;
    };
    let index = schema.index_of(&column.name).ok()?;
    (schema.field(index).data_type() == data_type).then_some(index)
}

/// What in `plan` computes over several rows, if anything.
fn aggregates(plan: &LogicalPlan) -> Option<&'static str> {
    let mut found = None;
    let _ = plan.apply(|node| {
        found = match node {
            LogicalPlan::Aggregate(_) => Some("an aggregate"),
            LogicalPlan::Window(_) => Some("OVER (...)"),
            LogicalPlan::Join(_) => Some("a join"),
            LogicalPlan::Extension(e) if e.node.as_any().is::<WindowNode>() => Some("a window"),
            _ => None,
        };
        Ok(match found {
            Some(_) => TreeNodeRecursion::Stop,
            None => TreeNodeRecursion::Continue,
        })
    });
    found
}

/// `schema` with `_shed_fraction` last.
pub(super) fn with_fraction(schema: &SchemaRef) -> SchemaRef {
    let mut fields = schema.fields().to_vec();
    fields.push(Arc::new(fraction_field()));
    Arc::new(Schema::new(fields))
}

/// `schema` with the alert column `approximate` last.
pub(super) fn with_approximate(schema: &SchemaRef) -> SchemaRef {
    let mut fields = schema.fields().to_vec();
    fields.push(Arc::new(Field::new(APPROXIMATE, DataType::Boolean, false)));
    Arc::new(Schema::new(fields))
}

/// The column that marks alert rows computed from shed input.
pub const APPROXIMATE: &str = "approximate";

fn fraction_field() -> Field {
    Field::new(SHED_FRACTION, DataType::Float64, false)
}

/// `schema` (which ends with a marker column) with `_shed_fraction` before
/// its last column, when `shed`.
pub(super) fn before_last(shed: bool, schema: &Schema) -> SchemaRef {
    let mut fields = schema.fields().to_vec();
    if shed {
        let last = fields.len().saturating_sub(1);
        fields.insert(last, Arc::new(fraction_field()));
    }
    Arc::new(Schema::new(fields))
}

/// A projection's expressions and schema, with `_shed_fraction` (column
/// `input_len` of its input) passed on last, when `shed`.
pub(super) fn carry(
    shed: bool,
    mut exprs: Vec<Arc<dyn PhysicalExpr>>,
    input_len: usize,
    schema: &Schema,
) -> (Vec<Arc<dyn PhysicalExpr>>, SchemaRef) {
    if !shed {
        return (exprs, Arc::new(schema.clone()));
    }
    exprs.push(Arc::new(
        datafusion::physical_expr::expressions::Column::new(SHED_FRACTION, input_len),
    ));
    (exprs, with_fraction(&Arc::new(schema.clone())))
}
