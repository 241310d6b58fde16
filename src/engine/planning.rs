//! Planning a query: the logical plan, its emit policy, the operator graph,
//! and what `EXPLAIN` and `EXPLAIN ANALYZE` print.

use super::*;

impl Engine {
    /// Plans a query with its `EMIT` clause into its logical plan and
    /// operator graph.
    pub fn plan(&self, query: &Query, emit: Option<&Emit>) -> Result<(LogicalPlan, QueryGraph)> {
        let logical = self.plan_logical(query, emit)?;
        self.plan_graph(logical, emit)
    }

    /// Plans a query that ends with an `ALERT` clause; `alert` is the
    /// clause and the alert's name.
    pub fn plan_alert(
        &self,
        query: &Query,
        emit: Option<&Emit>,
        alert: (&AlertClause, &str),
    ) -> Result<(LogicalPlan, QueryGraph)> {
        let logical = self.plan_logical(query, emit)?;
        if let LogicalPlan::Extension(ext) = &logical
            && let Some(node) = ext.node.as_any().downcast_ref::<EmitNode>()
            && node.policy.marker().is_some()
        {
            return Err(Error::Plan(format!(
                "ALERT needs final rows, but the query emits {} (drop the EMIT clause, or allowed_lateness)",
                node.policy
            )));
        }
        let (clause, name) = alert;
        let logical = self
            .planner
            .plan_alert(&self.catalog, logical, clause, name)?;
        self.plan_graph(logical, emit)
    }

    /// A query that reads no stream nor view (`SELECT 1`, `SELECT now()`)
    /// is answered at once, as a one-off question; `None` for one that
    /// reads something.
    pub(super) fn answer_without_streams(&self, logical: &LogicalPlan) -> Result<Option<Listing>> {
        let reads_a_table = logical
            .exists(|node| Ok(matches!(node, LogicalPlan::TableScan(_))))
            .unwrap_or(true);
        if reads_a_table {
            return Ok(None);
        }
        let batches = crate::exec::answer_once(logical)?;
        let schema = logical.schema().as_arrow().clone();
        Listing::from_batches(&schema, &batches).map(Some)
    }

    pub(super) fn plan_logical(&self, query: &Query, emit: Option<&Emit>) -> Result<LogicalPlan> {
        let logical = self.planner.plan_query(&self.catalog, query)?;
        self.with_emit(logical, emit)
    }

    /// `logical`, a planned query, under its `EMIT` policy (the default
    /// one when late rows update windows).
    pub(super) fn with_emit(
        &self,
        mut logical: LogicalPlan,
        emit: Option<&Emit>,
    ) -> Result<LogicalPlan> {
        check_plan_depth(&logical)?;
        let mut policy = emit.map(|e| self.emit_policy(e)).transpose()?;
        if windows_take_late_rows(&logical)
            && matches!(policy, None | Some(EmitPolicy::OnWindowClose { .. }))
        {
            policy = Some(EmitPolicy::OnWindowClose { late_updates: true });
        }
        if let Some(policy) = policy {
            let node = EmitNode::try_new(logical, policy)?;
            logical = LogicalPlan::Extension(Extension {
                node: Arc::new(node),
            });
        }
        Ok(logical)
    }

    pub(super) fn plan_graph(
        &self,
        logical: LogicalPlan,
        emit: Option<&Emit>,
    ) -> Result<(LogicalPlan, QueryGraph)> {
        let policy = emit.map(|e| self.emit_policy(e)).transpose()?;
        let mode = self.mode.unwrap_or(match policy {
            Some(EmitPolicy::Changes) => ExecutionMode::PerRecord,
            _ => ExecutionMode::MicroBatch,
        });
        let shed = self.query_shed(&logical)?;
        let mut graph = plan_incremental_shed(&logical, mode, self.parallelism(), shed)?;
        self.apply_buffer(&mut graph);
        Ok((logical, graph))
    }

    /// Gives the inputs of `graph` the session's buffer setting where
    /// their streams' options say nothing.
    pub(super) fn apply_buffer(&self, graph: &mut QueryGraph) {
        for input in &mut graph.inputs {
            let buffer = input.stream.buffer.or(self.buffer);
            if buffer != input.stream.buffer {
                let mut stream = (*input.stream).clone();
                stream.buffer = buffer;
                input.stream = Arc::new(stream);
            }
        }
    }

    pub(super) fn emit_policy(&self, emit: &Emit) -> Result<EmitPolicy> {
        Ok(match emit {
            Emit::OnWindowClose => EmitPolicy::OnWindowClose {
                late_updates: false,
            },
            Emit::Changes => EmitPolicy::Changes,
            Emit::Every(interval) => {
                let interval_ms = self.planner.interval_ms(&self.catalog, interval)?;
                if interval_ms <= 0 {
                    return Err(Error::Plan(format!(
                        "EMIT EVERY needs a positive interval, got {interval}"
                    )));
                }
                EmitPolicy::Every { interval_ms }
            }
        })
    }

    /// The logical plan and the operator graph of a query, as text.
    pub fn explain(
        &self,
        query: &Query,
        emit: Option<&Emit>,
        alert: Option<(&AlertClause, String)>,
    ) -> Result<String> {
        let (logical, graph) = self.plan_explained(query, emit, alert)?;
        Ok(explain_text(&logical, &graph))
    }

    /// `EXPLAIN ANALYZE`: the text of [`Engine::explain`], then what each
    /// operator took, gave and cost when the query ran to the end of its
    /// input (see [`crate::analyze`]). Blocks until the query ends; with
    /// [`Engine::set_plan_only`], plans the query but does not run it.
    pub fn explain_analyze(
        &self,
        query: &Query,
        emit: Option<&Emit>,
        alert: Option<(&AlertClause, String)>,
    ) -> Result<String> {
        let (logical, graph) = self.plan_explained(query, emit, alert)?;
        crate::analyze::check_finite(&graph)?;
        let plan = explain_text(&logical, &graph);
        if self.plan_only {
            return Ok(plan);
        }
        Ok(format!(
            "{plan}\n{}",
            crate::analyze::run(graph, self.autoscale().as_ref())?
        ))
    }

    /// Makes `EXPLAIN ANALYZE` plan its query without running it (for
    /// `vigil check`).
    pub fn set_plan_only(&mut self, plan_only: bool) {
        self.plan_only = plan_only;
    }

    pub(super) fn plan_explained(
        &self,
        query: &Query,
        emit: Option<&Emit>,
        alert: Option<(&AlertClause, String)>,
    ) -> Result<(LogicalPlan, QueryGraph)> {
        match alert {
            Some((clause, name)) => self.plan_alert(query, emit, (clause, &name)),
            None => self.plan(query, emit),
        }
    }

    /// Plans `statement` (a query, or the `CREATE ALERT` of an alert the
    /// catalog has) again, at `parallelism`: the query a running one
    /// changes into.
    pub fn replan(
        &mut self,
        statement: &Statement,
        base_dir: &Path,
        parallelism: usize,
    ) -> Result<PreparedQuery> {
        let mut statement = statement.clone();
        statement.or_replace = matches!(statement.kind, StatementKind::CreateAlert { .. });
        let before = self.parallelism;
        let saved_name = self.query_name.take();
        self.parallelism = Some(check_parallelism(parallelism)?);
        let outcome = self.execute(&statement, base_dir);
        self.parallelism = before;
        self.query_name = saved_name;
        match outcome? {
            Outcome::Query(query) => Ok(*query),
            _ => Err(Error::Plan("the statement plans no query".into())),
        }
    }
}

/// Refuses a plan deeper than [`MAX_PLAN_DEPTH`]; measured with a stack
/// of its own, not by recursion.
pub(super) fn check_plan_depth(plan: &LogicalPlan) -> Result<()> {
    let mut pending = vec![(plan, 1usize)];
    while let Some((node, depth)) = pending.pop() {
        if depth > MAX_PLAN_DEPTH {
            return Err(Error::Plan(format!(
                "query plan too deep: more than {MAX_PLAN_DEPTH} levels of operators \
                 (each view it reads, and each view they read, adds its own)"
            )));
        }
        pending.extend(node.inputs().into_iter().map(|input| (input, depth + 1)));
    }
    Ok(())
}

/// Rejects a query whose rows are not all final for a sink that takes
/// only final rows.
pub(super) fn check_append_only(plan: &LogicalPlan, sink: &SinkConfig) -> Result<()> {
    let LogicalPlan::Extension(ext) = plan else {
        return Ok(());
    };
    let Some(emit) = ext.node.as_any().downcast_ref::<EmitNode>() else {
        return Ok(());
    };
    let what = match emit.policy {
        EmitPolicy::Changes => "a changelog (EMIT CHANGES)",
        EmitPolicy::Every { .. } => "early results (EMIT EVERY)",
        EmitPolicy::OnWindowClose { late_updates: true } => {
            "updates of windows that take late rows (allowed_lateness)"
        }
        EmitPolicy::OnWindowClose {
            late_updates: false,
        } => return Ok(()),
    };
    Err(Error::Plan(format!(
        "sink '{}' is append_only and takes final rows only, but the query emits {what}",
        sink.name
    )))
}

/// What `EXPLAIN` prints: the logical plan, then the operator graph.
pub(super) fn explain_text(logical: &LogicalPlan, graph: &QueryGraph) -> String {
    format!(
        "logical plan:\n{}\n{}",
        indent(&logical.display_indent().to_string()),
        graph.describe()
    )
}

pub(super) fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}
