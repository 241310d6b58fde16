//! Lowering a `WindowNode` (`TUMBLE`, `HOP`, `SESSION`): the window
//! columns each row is given.

use super::*;

impl Builder {
    /// A window's assignment: after its input, or, over a union, in each
    /// of the union's inputs, so that each stream's rows are judged by its
    /// own clock and the merge takes the least of the inputs' watermarks
    /// (a clock after the merge would run at the fastest input's pace and
    /// drop the others' rows as late).
    pub(super) fn window(&mut self, window: &WindowNode) -> Result<Built> {
        let mut built = self.build(&window.input)?;
        // Over a stream, the watermark's delay and the stream's lateness;
        // over window results (a view), neither: they come in order.
        let over_stream = matches!(&window.input, LogicalPlan::Extension(e)
            if e.node.as_any().downcast_ref::<WatermarkNode>().is_some());
        let of_results = built.window.is_some();
        let clock = |stream: &StreamDef| match (over_stream, of_results) {
            (true, _) => (stream.delay_ms, stream.lateness_ms),
            (false, true) => (0, 0),
            (false, false) => (stream.delay_ms, 0),
        };
        let kind = match window.window {
            Window::Aligned(spec) => Windowing::Grid(WindowGrid::Panes(spec)),
            Window::Session { gap_ms } => Windowing::Session { gap_ms },
        };
        if built.is_open_union() {
            for (stream, ops) in &mut built.inputs {
                let (delay, lateness) = clock(stream);
                let late_rows = self.late_rows(&stream.name);
                ops.push((
                    self.assign(window, delay, lateness, late_rows),
                    Placement::Serial,
                ));
            }
        } else {
            let (delay, lateness) = clock(built.stream());
            let late_rows = self.late_rows(&built.stream().name.clone());
            let op = self.assign(window, delay, lateness, late_rows);
            built.ops.push((op, Placement::Serial));
        }
        let start = window.window_start_index();
        built.window = Some(WindowColumns {
            start: Some(start),
            end: Some(start + 1),
            kind,
        });
        Ok(built)
    }

    /// The operator that gives rows their window (or pane, or session).
    pub(super) fn assign(
        &self,
        window: &WindowNode,
        delay: i64,
        lateness: i64,
        late_rows: Arc<LateRows>,
    ) -> Box<dyn Operator> {
        let schema = Arc::new(UserDefinedLogicalNode::schema(window).as_arrow().clone());
        let (time, stats) = (window.time_column, self.stats.clone());
        match window.window {
            Window::Aligned(spec) => Box::new(WindowAssignOp::new(
                time, spec, delay, lateness, schema, stats, late_rows,
            )),
            Window::Session { gap_ms } => Box::new(SessionAssignOp::new(
                time, gap_ms, delay, lateness, schema, stats, late_rows,
            )),
        }
    }
}

pub(super) fn grid_size(grid: WindowGrid) -> i64 {
    match grid {
        WindowGrid::Panes(spec) => spec.size_ms(),
        WindowGrid::Exact { size_ms } => size_ms,
    }
}

/// Follows the window columns through a projection that passes them on.
pub(super) fn remap_window(
    window: WindowColumns,
    exprs: &[Expr],
    input: &DFSchema,
) -> Option<WindowColumns> {
    let position = |target: Option<usize>| {
        target.and_then(|t| exprs.iter().position(|e| column_index(e, input) == Some(t)))
    };
    let remapped = WindowColumns {
        start: position(window.start),
        end: position(window.end),
        kind: window.kind,
    };
    (remapped.start.is_some() || remapped.end.is_some()).then_some(remapped)
}
