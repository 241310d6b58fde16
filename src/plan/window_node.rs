//! The `WindowAssign` logical node: event-time windows for each row.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::Field;
use datafusion::common::{DFSchema, DFSchemaRef};
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};

use super::catalog::TIME_TYPE;

/// Name of the column holding a row's window start.
pub const WINDOW_START: &str = "window_start";
/// Name of the column holding a row's window end (exclusive).
pub const WINDOW_END: &str = "window_end";

/// The kind and size of an event-time window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd)]
pub enum WindowSpec {
    /// `TUMBLE` (`slide == size`) and `HOP`: windows
    /// `[k*slide + offset, k*slide + offset + size)`. Rows are aggregated
    /// into panes of `gcd(slide, size)`, and a window is the merge of its
    /// panes, so a row is folded in once however many windows hold it.
    Aligned {
        /// Window length in milliseconds.
        size_ms: i64,
        /// Distance between window starts in milliseconds.
        slide_ms: i64,
        /// Shift of the window grid from the epoch, in `[0, slide)`.
        offset_ms: i64,
    },
}

impl WindowSpec {
    /// A tumbling window.
    pub fn tumble(size_ms: i64, offset_ms: i64) -> Self {
        WindowSpec::Aligned {
            size_ms,
            slide_ms: size_ms,
            offset_ms: offset_ms.rem_euclid(size_ms),
        }
    }

    /// A hopping window.
    pub fn hop(slide_ms: i64, size_ms: i64, offset_ms: i64) -> Self {
        WindowSpec::Aligned {
            size_ms,
            slide_ms,
            offset_ms: offset_ms.rem_euclid(slide_ms),
        }
    }

    /// Length of every window.
    pub fn size_ms(&self) -> i64 {
        match *self {
            WindowSpec::Aligned { size_ms, .. } => size_ms,
        }
    }

    /// Length of a pane: the largest span that lies wholly inside or wholly
    /// outside every window.
    pub fn pane_ms(&self) -> i64 {
        match *self {
            WindowSpec::Aligned {
                size_ms, slide_ms, ..
            } => gcd(size_ms, slide_ms),
        }
    }

    /// Start of the pane holding event time `t`.
    pub fn pane_start(&self, t: i64) -> i64 {
        let WindowSpec::Aligned { offset_ms, .. } = *self;
        floor_to(t - offset_ms, self.pane_ms()) + offset_ms
    }

    /// Start of the last window that holds event time `t` (the latest to
    /// close).
    pub fn last_window_start(&self, t: i64) -> i64 {
        let WindowSpec::Aligned {
            slide_ms,
            offset_ms,
            ..
        } = *self;
        floor_to(t - offset_ms, slide_ms) + offset_ms
    }

    /// Starts of every window that holds the pane starting at `pane`, in
    /// order.
    pub fn windows_of_pane(&self, pane: i64) -> impl Iterator<Item = i64> {
        let WindowSpec::Aligned {
            size_ms, slide_ms, ..
        } = *self;
        let last = self.last_window_start(pane);
        let first_end_after = pane + self.pane_ms();
        let count = (last + size_ms - first_end_after).div_euclid(slide_ms) + 1;
        (0..count).rev().map(move |i| last - i * slide_ms)
    }

    /// How many windows have closed once the watermark is at `watermark`,
    /// counted from the one ending at `offset + size`; it grows by one each
    /// time the watermark passes a window end.
    pub fn closed_windows(&self, watermark: i64) -> i64 {
        let WindowSpec::Aligned {
            size_ms,
            slide_ms,
            offset_ms,
        } = *self;
        watermark
            .saturating_sub(offset_ms + size_ms)
            .div_euclid(slide_ms)
    }

    /// True for a tumbling window, where each pane is a whole window.
    pub fn is_tumbling(&self) -> bool {
        let WindowSpec::Aligned {
            size_ms, slide_ms, ..
        } = *self;
        size_ms == slide_ms
    }
}

/// The window a `WindowAssign` node assigns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd)]
pub enum Window {
    /// `TUMBLE` or `HOP`.
    Aligned(WindowSpec),
    /// `SESSION`: per key, a row at `t` opens `[t, t + gap)` and
    /// overlapping sessions merge.
    Session {
        /// Inactivity gap in milliseconds.
        gap_ms: i64,
    },
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Window::Aligned(spec) => spec.fmt(f),
            Window::Session { gap_ms } => write!(f, "session(gap {gap_ms} ms)"),
        }
    }
}

fn floor_to(value: i64, step: i64) -> i64 {
    value.div_euclid(step) * step
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

impl fmt::Display for WindowSpec {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let WindowSpec::Aligned {
            size_ms,
            slide_ms,
            offset_ms,
        } = *self;
        if self.is_tumbling() {
            write!(f, "tumble({size_ms} ms")?;
        } else {
            write!(
                f,
                "hop(slide {slide_ms} ms, size {size_ms} ms, panes of {} ms",
                self.pane_ms()
            )?;
        }
        if offset_ms != 0 {
            write!(f, ", offset {offset_ms} ms")?;
        }
        f.write_str(")")
    }
}

/// Adds `window_start` and `window_end` to every row of its input, and drops
/// rows whose every window has already closed (late rows).
///
/// For a hopping window the two columns hold the row's pane, not one of its
/// windows: the window aggregate above maps panes to windows. The
/// incremental planner therefore allows nothing between this node and the
/// aggregate that reads those columns.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WindowNode {
    /// The watermarked stream below.
    pub input: LogicalPlan,
    /// Index of the event-time column in the input schema.
    pub time_column: usize,
    /// Window kind and size.
    pub window: Window,
    schema: DFSchemaRef,
}

impl WindowNode {
    /// Builds the node; its schema is the input's plus the two window columns.
    pub fn try_new(input: LogicalPlan, time_column: usize, window: Window) -> Result<Self> {
        let mut fields: Vec<_> = input
            .schema()
            .iter()
            .map(|(q, f)| (q.cloned(), f.clone()))
            .collect();
        for name in [WINDOW_START, WINDOW_END] {
            fields.push((None, Arc::new(Field::new(name, TIME_TYPE, false))));
        }
        let schema = DFSchema::new_with_metadata(fields, input.schema().metadata().clone())?;
        Ok(Self {
            input,
            time_column,
            window,
            schema: Arc::new(schema),
        })
    }

    /// Index of `window_start` in this node's schema (`window_end` follows).
    pub fn window_start_index(&self) -> usize {
        self.input.schema().fields().len()
    }
}

impl PartialOrd for WindowNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        (self.time_column, self.window).partial_cmp(&(other.time_column, other.window))
    }
}

impl UserDefinedLogicalNodeCore for WindowNode {
    fn name(&self) -> &str {
        "WindowAssign"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let time = self.input.schema().field(self.time_column).name();
        write!(f, "WindowAssign: {} on {time}", self.window)
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        Self::try_new(inputs.swap_remove(0), self.time_column, self.window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_panes_and_windows() {
        let hop = WindowSpec::hop(5_000, 15_000, 0);
        assert_eq!(hop.pane_ms(), 5_000);
        assert_eq!(hop.pane_start(7_000), 5_000);
        assert_eq!(hop.last_window_start(7_000), 5_000);
        let windows: Vec<i64> = hop.windows_of_pane(5_000).collect();
        assert_eq!(windows, [-5_000, 0, 5_000]);
        let odd = WindowSpec::hop(4_000, 10_000, 0);
        assert_eq!(odd.pane_ms(), 2_000);
        // Pane [6,8) lies in windows starting at 0 and 4 (not -4: it ends at 6).
        assert_eq!(odd.windows_of_pane(6_000).collect::<Vec<_>>(), [0, 4_000]);
        assert_eq!(
            odd.windows_of_pane(8_000).collect::<Vec<_>>(),
            [0, 4_000, 8_000]
        );
    }

    #[test]
    fn tumble_is_one_pane_per_window() {
        let tumble = WindowSpec::tumble(10_000, 3_000);
        assert!(tumble.is_tumbling());
        assert_eq!(tumble.pane_start(2_999), -7_000);
        assert_eq!(tumble.windows_of_pane(3_000).collect::<Vec<_>>(), [3_000]);
    }
}
