//! Lowering a `Window` node (`OVER`): functions over each key's rows in
//! event-time order, `lag`, and functions over the peers of one window.

use super::*;

impl Builder {
    /// `OVER (...)` functions over a stream of window results, ordered by
    /// window.
    pub(super) fn over(&mut self, window: &datafusion::logical_expr::Window) -> Result<Built> {
        let built = self.build(&window.input)?;
        shed::refuse(&built, "OVER (...)")?;
        let input = window.input.schema();
        let windows = built
            .window
            .filter(|w| !w.holds_panes())
            .ok_or_else(|| {
                unbounded(
                    "window function",
                    "OVER (...) needs a stream of window results, ordered by window_start or window_end: apply it to a windowed aggregate",
                )
            })?;
        if built.lateness_ms() > 0 {
            return Err(late_updates_unsupported("OVER (...)"));
        }
        if self.over_peers(window, windows)? {
            let mut built = built;
            // Peers are the rows of one window, of every key: one instance.
            let end = windows.row_end().ok_or_else(|| {
                unbounded(
                    "window function",
                    "OVER (PARTITION BY window ...) needs windows of a fixed length or a window_end column",
                )
            })?;
            let op = peer::peer_op(window, end)?;
            built
                .ops
                .push((Box::new(op), Placement::Stage(None, arrow_schema(input))));
            return Ok(built);
        }
        let specs = window
            .window_expr
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let field = window.schema.field(input.fields().len() + i);
                self.over_spec(e, input, windows, field.data_type().clone())
            })
            .collect::<Result<Vec<_>>>()?;
        let schema = Arc::new(window.schema.as_arrow().clone());
        let placement = Placement::Stage(shared_partition(&specs), arrow_schema(input));
        let mut built = built;
        built
            .ops
            .push((Box::new(OverOp::new(specs, schema)?), placement));
        Ok(built)
    }

    /// True if the window functions compare the rows of one window (they
    /// partition by a window column); an error if only some do.
    pub(super) fn over_peers(
        &self,
        window: &datafusion::logical_expr::Window,
        windows: WindowColumns,
    ) -> Result<bool> {
        let input = window.input.schema();
        let peers: Vec<bool> = window
            .window_expr
            .iter()
            .map(|e| match e.clone().unalias() {
                Expr::WindowFunction(f) => f.params.partition_by.iter().any(|p| {
                    column_index(p, input)
                        .and_then(|i| windows.slot(i))
                        .is_some()
                }),
                _ => false,
            })
            .collect();
        for expr in &window.window_expr {
            crate::functions::check_window_call(expr)?;
        }
        if peers.iter().all(|p| *p) {
            return Ok(true);
        }
        if peers.iter().any(|p| *p) {
            return Err(unbounded(
                "window function",
                "a query mixes window functions over peers (PARTITION BY window_end) with ones over a key's history; compute one kind in a view and the other over it",
            ));
        }
        Ok(false)
    }

    pub(super) fn over_spec(
        &self,
        expr: &Expr,
        input: &DFSchema,
        windows: WindowColumns,
        data_type: datafusion::arrow::datatypes::DataType,
    ) -> Result<OverSpec> {
        let expr = match expr {
            Expr::Alias(alias) => alias.expr.as_ref(),
            other => other,
        };
        let Expr::WindowFunction(function) = expr else {
            return Err(Error::Plan(format!("unsupported window expression {expr}")));
        };
        let params = &function.params;
        let ordered_by_window = matches!(params.order_by.as_slice(),
            [sort] if sort.asc && column_index(&sort.expr, input).and_then(|i| windows.slot(i)).is_some());
        if !ordered_by_window {
            return Err(unbounded(
                "window function",
                format!(
                    "{expr} must be ORDER BY window_start or window_end (ascending): window results arrive in that order"
                ),
            ));
        }
        let partition_by = params
            .partition_by
            .iter()
            .map(|e| self.physical(e, input))
            .collect::<Result<Vec<_>>>()?;
        let function = match &function.fun {
            WindowFunctionDefinition::WindowUDF(udf) => match udf.name() {
                "lag" => self.lag(&params.args, input, &data_type)?,
                "row_number" => OverFunction::RowNumber,
                other => {
                    return Err(unbounded(
                        "window function",
                        format!(
                            "{other}() over a stream is not supported; use lag, row_number or an aggregate"
                        ),
                    ));
                }
            },
            WindowFunctionDefinition::AggregateUDF(udaf) => {
                let args = params
                    .args
                    .iter()
                    .map(|e| self.physical(e, input))
                    .collect::<Result<Vec<_>>>()?;
                let aggregate = AggregateExprBuilder::new(udaf.clone(), args)
                    .schema(Arc::new(input.as_arrow().clone()))
                    .alias(expr.schema_name().to_string())
                    .build()?;
                OverFunction::Aggregate {
                    function: Arc::new(aggregate),
                    preceding: rows_preceding(&params.window_frame)?,
                }
            }
        };
        Ok(OverSpec {
            partition_by,
            function,
            data_type,
        })
    }

    pub(super) fn lag(
        &self,
        args: &[Expr],
        input: &DFSchema,
        data_type: &datafusion::arrow::datatypes::DataType,
    ) -> Result<OverFunction> {
        let Some(arg) = args.first() else {
            return Err(Error::Plan("lag needs an argument".into()));
        };
        let offset = match args.get(1) {
            None => 1,
            Some(Expr::Literal(value, _)) => value
                .cast_to(&datafusion::arrow::datatypes::DataType::UInt64)
                .ok()
                .and_then(|v| match v {
                    ScalarValue::UInt64(Some(n)) => Some(n as usize),
                    _ => None,
                })
                .ok_or_else(|| {
                    Error::Plan(format!(
                        "lag offset must be a non-negative integer, got {value}"
                    ))
                })?,
            Some(other) => {
                return Err(Error::Plan(format!(
                    "lag offset must be a constant, got {other}"
                )));
            }
        };
        let default = match args.get(2) {
            None => ScalarValue::try_from(data_type)?,
            Some(Expr::Literal(value, _)) => value.cast_to(data_type)?,
            Some(other) => {
                return Err(Error::Plan(format!(
                    "lag default must be a constant, got {other}"
                )));
            }
        };
        Ok(OverFunction::Lag {
            arg: self.physical(arg, input)?,
            offset,
            default,
        })
    }
}

/// Rows before the current one in a frame ending at the current row:
/// `Some(n)` for `ROWS n PRECEDING`, `None` for everything so far.
pub(super) fn rows_preceding(frame: &WindowFrame) -> Result<Option<usize>> {
    let unsupported = || {
        unbounded(
            "window frame",
            format!(
                "frame {frame} over a stream is not supported; use ROWS BETWEEN n PRECEDING AND CURRENT ROW or UNBOUNDED PRECEDING"
            ),
        )
    };
    if !matches!(frame.end_bound, WindowFrameBound::CurrentRow) {
        return Err(unsupported());
    }
    match (&frame.units, &frame.start_bound) {
        (_, WindowFrameBound::Preceding(n)) if n.is_null() => Ok(None),
        (WindowFrameUnits::Rows, WindowFrameBound::Preceding(n)) => {
            match n.cast_to(&datafusion::arrow::datatypes::DataType::UInt64)? {
                ScalarValue::UInt64(Some(n)) => Ok(Some(n as usize)),
                _ => Err(unsupported()),
            }
        }
        (WindowFrameUnits::Rows, WindowFrameBound::CurrentRow) => Ok(Some(0)),
        _ => Err(unsupported()),
    }
}
