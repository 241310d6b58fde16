//! Lowering a `Join` node: an inner join of two windowed streams on their
//! keys and window.

use super::*;

impl Builder {
    /// An inner join of two windowed streams on key and window.
    pub(super) fn join(&mut self, join: &datafusion::logical_expr::Join) -> Result<Built> {
        let not_windowed = || {
            unbounded(
                "join",
                "a join of streams must be an inner join of windowed inputs on their keys and the same window (e.g. ON a.host = b.host AND a.window_start = b.window_start)",
            )
        };
        if join.join_type != JoinType::Inner {
            return Err(not_windowed());
        }
        let left = self.build(&join.left)?;
        let right = self.build(&join.right)?;
        let mut windows = Vec::new();
        let mut inputs = Vec::new();
        for side in [left, right] {
            let window = side
                .window
                .filter(|w| !w.holds_panes())
                .ok_or_else(not_windowed)?;
            if side.inputs.len() != 1 || side.join.is_some() || side.lateness_ms() > 0 {
                return Err(unbounded(
                    "join",
                    "each side of a join must read one stream, without allowed lateness",
                ));
            }
            let (stream, mut ops) = side.inputs.into_iter().next().expect("one input");
            ops.extend(side.ops);
            inputs.push((stream, ops));
            windows.push(window);
        }
        let (lw, rw) = (windows[0], windows[1]);
        let size_ms = match (lw.kind, rw.kind) {
            (Windowing::Grid(l), Windowing::Grid(r)) if grid_size(l) == grid_size(r) => {
                grid_size(l)
            }
            _ => return Err(not_windowed()),
        };
        let (left_schema, right_schema) = (join.left.schema(), join.right.schema());
        let mut pairs: Vec<(Expr, Expr)> = join.on.clone();
        let mut residual = Vec::new();
        if let Some(filter) = &join.filter {
            for conjunct in split_conjunction(filter) {
                match equi_pair(conjunct, left_schema, right_schema) {
                    Some(pair) => pairs.push(pair),
                    None => residual.push(conjunct.clone()),
                }
            }
        }
        let same_window = pairs.iter().any(|(l, r)| {
            let l = column_index(l, left_schema).and_then(|i| lw.slot(i));
            let r = column_index(r, right_schema).and_then(|i| rw.slot(i));
            l.is_some() && l == r
        });
        if !same_window {
            return Err(not_windowed());
        }
        let window_end = |w: WindowColumns| match (w.end, w.start) {
            (Some(end), _) => Ok((end, 0)),
            (None, Some(start)) => Ok((start, size_ms)),
            _ => Err(not_windowed()),
        };
        let spec = WindowJoinSpec {
            left_keys: pairs
                .iter()
                .map(|(l, _)| self.physical(l, left_schema))
                .collect::<Result<_>>()?,
            right_keys: pairs
                .iter()
                .map(|(_, r)| self.physical(r, right_schema))
                .collect::<Result<_>>()?,
            left_window_end: window_end(lw)?,
            right_window_end: window_end(rw)?,
            filter: conjunction(residual)
                .map(|f| self.physical(&f, &join.schema))
                .transpose()?,
            left_schema: Arc::new(left_schema.as_arrow().clone()),
            right_schema: Arc::new(right_schema.as_arrow().clone()),
            schema: Arc::new(join.schema.as_arrow().clone()),
        };
        Ok(Built {
            inputs,
            join: Some(Box::new(WindowJoin::new(spec)?)),
            ops: Vec::new(),
            window: Some(WindowColumns {
                start: lw.start,
                end: lw.end,
                kind: Windowing::Grid(WindowGrid::Exact { size_ms }),
            }),
            shed_fraction: false,
        })
    }
}

/// `l = r` with `l` over the left input and `r` over the right (either
/// way round), as a (left, right) pair.
pub(super) fn equi_pair(expr: &Expr, left: &DFSchema, right: &DFSchema) -> Option<(Expr, Expr)> {
    let Expr::BinaryExpr(binary) = expr else {
        return None;
    };
    if binary.op != datafusion::logical_expr::Operator::Eq {
        return None;
    }
    let over = |e: &Expr, schema: &DFSchema| {
        let columns = e.column_refs();
        !columns.is_empty() && columns.iter().all(|c| schema.has_column(c))
    };
    let (a, b) = (binary.left.as_ref(), binary.right.as_ref());
    if over(a, left) && over(b, right) {
        Some((a.clone(), b.clone()))
    } else if over(b, left) && over(a, right) {
        Some((b.clone(), a.clone()))
    } else {
        None
    }
}
