//! Lowering an `Aggregate` node: windowed aggregates (tumbling, hopping,
//! session windows) and unbounded ones that keep a changelog per key.

use super::*;

impl Builder {
    pub(super) fn aggregate(&mut self, aggregate: &Aggregate) -> Result<Built> {
        // The emit policy belongs to the outermost aggregate only.
        let policy = self.emit.take();
        let mut built = self.build(&aggregate.input)?;
        shed::refuse(&built, "an aggregate over windowed results")?;
        let input_schema = aggregate.input.schema();
        if policy == Some(EmitPolicy::Changes) {
            return self.changelog_aggregate(aggregate, built);
        }
        let Some(window) = built.window else {
            return Err(unbounded(
                "unbounded aggregate",
                "an aggregate over a stream needs a window (FROM TUMBLE(stream, ts, INTERVAL '1' MINUTE) ... GROUP BY window_start, window_end, ...) or EMIT CHANGES",
            ));
        };
        let early_every = match policy {
            Some(EmitPolicy::Every { interval_ms }) => {
                if matches!(window.kind, Windowing::Session { .. }) {
                    return Err(unbounded(
                        "EMIT EVERY",
                        "EMIT EVERY over SESSION windows is not supported yet",
                    ));
                }
                Some(Duration::from_millis(interval_ms as u64))
            }
            _ => None,
        };
        let mut layout = Vec::with_capacity(aggregate.group_expr.len());
        let mut keys = Vec::new();
        let mut key_fields = Vec::new();
        let mut window_input = None;
        let mut key_exprs = Vec::new();
        let output = aggregate.schema.as_arrow();
        for (i, expr) in aggregate.group_expr.iter().enumerate() {
            let slot = column_index(expr, input_schema).and_then(|c| window.slot(c));
            match slot {
                Some(slot) => {
                    if window_input.is_none() {
                        window_input = Some(WindowInput {
                            expr: self.physical(expr, input_schema)?,
                            is_end: slot == GroupSlot::WindowEnd,
                        });
                    }
                    layout.push(slot);
                }
                None => {
                    window.check_reads(expr, input_schema)?;
                    layout.push(GroupSlot::Key(keys.len()));
                    key_exprs.push((i, expr));
                    keys.push(self.physical(expr, input_schema)?);
                    key_fields.push(output.field(i).clone());
                }
            }
        }
        let Some(window_input) = window_input else {
            return Err(unbounded(
                "unbounded aggregate",
                "a windowed aggregate must GROUP BY window_start or window_end",
            ));
        };
        for e in &aggregate.aggr_expr {
            window.check_reads(e, input_schema)?;
        }
        let aggregates = self.lower_aggregates(aggregate)?;
        let key_schema = Arc::new(Schema::new(key_fields));
        let mut schema = Arc::new(output.clone());
        let grid = match window.kind {
            Windowing::Grid(grid) => grid,
            Windowing::Session { gap_ms } => {
                let start = window.start.ok_or_else(|| {
                    Error::Plan("SESSION's window_start is not available to the aggregate".into())
                })?;
                let placement = Placement::Stage(Some(keys.clone()), arrow_schema(input_schema));
                let op = SessionAggregateOp::new(SessionAggregateSpec {
                    keys,
                    key_schema,
                    layout,
                    start: Arc::new(datafusion::physical_expr::expressions::Column::new(
                        input_schema.field(start).name(),
                        start,
                    )),
                    gap_ms,
                    lateness_ms: built.lateness_ms(),
                    aggregates,
                    schema,
                })?;
                built.ops.push((Box::new(op), placement));
                // Sessions differ in length: their results are not windows
                // a later aggregate could group again.
                built.window = None;
                return Ok(built);
            }
        };
        let size_ms = match grid {
            WindowGrid::Panes(spec) => spec.size_ms(),
            WindowGrid::Exact { size_ms } => size_ms,
        };
        let lateness_ms = match grid {
            WindowGrid::Panes(_) => built.lateness_ms(),
            WindowGrid::Exact { .. } => 0,
        };
        if matches!(grid, WindowGrid::Exact { .. }) && built.lateness_ms() > 0 {
            return Err(late_updates_unsupported("grouping window results again"));
        }
        built.window = Some(WindowColumns {
            start: layout.iter().position(|s| *s == GroupSlot::WindowStart),
            end: layout.iter().position(|s| *s == GroupSlot::WindowEnd),
            kind: Windowing::Grid(WindowGrid::Exact { size_ms }),
        });
        // Early results come on processing-time ticks, which no epoch of
        // the input orders: such an aggregate runs as one instance, so they
        // are handed on as they come.
        let placement = match early_every {
            Some(_) => Placement::Stage(None, arrow_schema(input_schema)),
            None => Placement::Stage(Some(keys.clone()), arrow_schema(input_schema)),
        };
        let shed = match (&self.shed, grid) {
            (Some(plan), WindowGrid::Panes(spec)) if !plan.placed() => {
                let keyed = early_every.is_none() && !keys.is_empty();
                let output = plan.place(self, &mut built, aggregate, spec, &key_exprs, keyed)?;
                schema = shed::with_fraction(&schema);
                built.shed_fraction = true;
                Some(output)
            }
            _ => None,
        };
        let op = WindowAggregateOp::new(WindowAggregateSpec {
            keys,
            key_schema,
            layout,
            window: window_input,
            grid,
            aggregates,
            schema,
            early_every,
            lateness_ms,
            shed,
        });
        built.ops.push((Box::new(op), placement));
        Ok(built)
    }

    pub(super) fn lower_aggregates(&self, aggregate: &Aggregate) -> Result<Vec<AggregateSpec>> {
        let input_schema = aggregate.input.schema();
        let physical_input = input_schema.as_arrow();
        aggregate
            .aggr_expr
            .iter()
            .map(|e| {
                let lowered = LoweredAggregateBuilder::new(
                    e,
                    input_schema,
                    physical_input,
                    &self.props,
                    &self.planning,
                )
                .build()?;
                Ok(AggregateSpec {
                    function: lowered.aggregate,
                    filter: lowered.filter,
                })
            })
            .collect()
    }

    /// `EMIT CHANGES`: a changelog of results, with or without a window.
    pub(super) fn changelog_aggregate(
        &mut self,
        aggregate: &Aggregate,
        mut built: Built,
    ) -> Result<Built> {
        let input_schema = aggregate.input.schema();
        let window_end =
            match built.window {
                None => None,
                Some(w) if w.holds_panes() => {
                    return Err(unbounded(
                        "EMIT CHANGES",
                        "EMIT CHANGES over HOP or SESSION windows is not supported yet; use TUMBLE",
                    ));
                }
                Some(w) => {
                    let size_ms = match w.kind {
                        Windowing::Grid(WindowGrid::Panes(spec)) => spec.size_ms(),
                        Windowing::Grid(WindowGrid::Exact { size_ms }) => size_ms,
                        Windowing::Session { .. } => unreachable!("sessions hold panes"),
                    };
                    let found = aggregate.group_expr.iter().enumerate().find_map(|(i, e)| {
                        match column_index(e, input_schema).and_then(|c| w.slot(c)) {
                            Some(GroupSlot::WindowStart) => Some((i, size_ms)),
                            Some(GroupSlot::WindowEnd) => Some((i, 0)),
                            _ => None,
                        }
                    });
                    Some(found.ok_or_else(|| {
                        unbounded(
                            "unbounded aggregate",
                            "a windowed aggregate must GROUP BY window_start or window_end",
                        )
                    })?)
                }
            };
        let groups = aggregate
            .group_expr
            .iter()
            .map(|e| self.physical(e, input_schema))
            .collect::<Result<Vec<_>>>()?;
        let output = aggregate.schema.as_arrow();
        let group_schema = Arc::new(Schema::new(output.fields()[..groups.len()].to_vec()));
        let placement = Placement::Stage(Some(groups.clone()), arrow_schema(input_schema));
        let op = ChangelogAggregateOp::new(ChangelogAggregateSpec {
            groups,
            group_schema,
            window_end,
            lateness_ms: built.lateness_ms(),
            aggregates: self.lower_aggregates(aggregate)?,
            schema: Arc::new(output.clone()),
        });
        built.ops.push((Box::new(op), placement));
        built.window = None;
        Ok(built)
    }
}
