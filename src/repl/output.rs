//! Rendering result batches to text, and printing from background queries
//! without breaking the line being edited.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::arrow::record_batch::RecordBatch;
use rustyline::ExternalPrinter;

use crate::connector::{OutputFormat, Sink};
use crate::connectors::make_sink;
use crate::connectors::table::Table;
use crate::error::Result;

/// How long table rows wait for more before they are drawn: a query that
/// emits row by row gets one table, not one per row.
pub const FLUSH_AFTER: Duration = Duration::from_millis(100);

/// Renders one query's batches in an output format. CSV and JSON lines
/// are written as they come (a CSV header once, before the first rows);
/// table rows are kept for up to [`FLUSH_AFTER`] or a screenful, then drawn
/// as the continuation of the query's table (see [`Table`]).
pub enum Renderer {
    /// The table format: rows are kept, then drawn.
    Table {
        /// Created from the first batch's schema.
        table: Option<Table>,
        /// Rows that make a screenful: drawn at once.
        screenful: usize,
        /// When the first kept row came.
        since: Option<Instant>,
    },
    /// CSV or JSON lines, through the sink of that format.
    Text {
        sink: Box<dyn Sink>,
        buf: Arc<Mutex<Vec<u8>>>,
    },
}

impl Renderer {
    /// A renderer for `format`; a table draws at the latest when
    /// `screenful` rows are waiting.
    pub fn new(format: OutputFormat, screenful: usize) -> Self {
        if format == OutputFormat::Table {
            return Renderer::Table {
                table: None,
                screenful: screenful.max(1),
                since: None,
            };
        }
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = make_sink(format, Box::new(SharedBuf(buf.clone())));
        Renderer::Text { sink, buf }
    }

    /// Takes `batch`; returns the text to print now (empty while table
    /// rows wait).
    pub fn push(&mut self, batch: &RecordBatch) -> Result<String> {
        match self {
            Renderer::Table {
                table,
                screenful,
                since,
            } => {
                if batch.num_rows() == 0 {
                    return Ok(String::new());
                }
                let table = table.get_or_insert_with(|| Table::new(&batch.schema()));
                table.push(batch)?;
                since.get_or_insert_with(Instant::now);
                if table.buffered() >= *screenful {
                    *since = None;
                    return Ok(table.flush());
                }
                Ok(String::new())
            }
            Renderer::Text { sink, buf } => {
                sink.write(batch)?;
                let bytes = std::mem::take(&mut *buf.lock().unwrap_or_else(|e| e.into_inner()));
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
        }
    }

    /// When the rows waiting should be drawn; `None` if none wait.
    pub fn due(&self) -> Option<Instant> {
        match self {
            Renderer::Table { since, .. } => since.map(|t| t + FLUSH_AFTER),
            Renderer::Text { .. } => None,
        }
    }

    /// The text of the rows waiting.
    pub fn flush(&mut self) -> String {
        match self {
            Renderer::Table { table, since, .. } => {
                *since = None;
                table.as_mut().map(Table::flush).unwrap_or_default()
            }
            Renderer::Text { .. } => String::new(),
        }
    }

    /// The text of the rows waiting and the end of the table: the query
    /// has ended.
    pub fn finish(&mut self) -> String {
        match self {
            Renderer::Table { table, since, .. } => {
                *since = None;
                table.as_mut().map(Table::finish).unwrap_or_default()
            }
            Renderer::Text { .. } => String::new(),
        }
    }
}

struct SharedBuf(Arc<Mutex<Vec<u8>>>);

impl Write for SharedBuf {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every line of `text` prefixed with `[id] `.
pub fn tagged(id: u64, text: &str) -> String {
    text.lines()
        .map(|line| format!("[{id}] {line}\n"))
        .collect()
}

/// Prints text from background tasks in the order it comes: above the
/// prompt (through the line editor's external printer) while the editor
/// reads, straight to the terminal otherwise. A thread of its own does the
/// printing, so a task never blocks on the terminal.
#[derive(Clone)]
pub struct Printer {
    tx: mpsc::Sender<Queued>,
    closed: Arc<AtomicBool>,
}

/// What the printing thread is handed, in order.
enum Queued {
    Text(String),
    /// Answered once everything queued before it is written.
    Drained(mpsc::Sender<()>),
}

/// How long [`Printer::close`] waits for queued text to be written (a
/// reader that stopped reading a pipe must not hold the exit).
const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Printer {
    /// Starts the printing thread; without an external printer (input is
    /// not a terminal) text goes to stdout.
    pub fn start(external: Option<Box<dyn ExternalPrinter + Send>>) -> Self {
        let (tx, rx) = mpsc::channel::<Queued>();
        let mut external = external;
        let spawned = std::thread::Builder::new()
            .name("vigil-repl-printer".into())
            .spawn(move || {
                for queued in rx {
                    let text = match queued {
                        Queued::Text(text) => text,
                        Queued::Drained(done) => {
                            let _ = done.send(());
                            continue;
                        }
                    };
                    let printed = match external.as_mut() {
                        Some(printer) => printer.print(text.clone()).is_ok(),
                        None => false,
                    };
                    if !printed {
                        let mut out = std::io::stdout().lock();
                        let _ = out.write_all(text.as_bytes());
                        let _ = out.flush();
                    }
                }
            });
        if let Err(e) = spawned {
            errln!("warning: cannot start the printing thread: {e}");
        }
        Self {
            tx,
            closed: Arc::default(),
        }
    }

    /// Queues `text` (whole lines) for printing.
    pub fn print(&self, text: String) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        if let Err(mpsc::SendError(Queued::Text(text))) = self.tx.send(Queued::Text(text)) {
            out!("{text}");
        }
    }

    /// Prints nothing more: the REPL is leaving, and the queries it stops
    /// need not say so. What was queued before is written first: the
    /// process exits after this, and the last results of a piped script
    /// (the windows its end of input fires) are often still queued.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        let (done, drained) = mpsc::channel();
        if self.tx.send(Queued::Drained(done)).is_ok() {
            let _ = drained.recv_timeout(DRAIN_LIMIT);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{ArrayRef, Float64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn batch(values: &[f64]) -> RecordBatch {
        let schema = Schema::new(vec![Field::new("x", DataType::Float64, false)]);
        let column: ArrayRef = Arc::new(Float64Array::from(values.to_vec()));
        RecordBatch::try_new(Arc::new(schema), vec![column]).unwrap()
    }

    #[test]
    fn table_rows_wait_until_due_or_a_screenful() {
        let mut renderer = Renderer::new(OutputFormat::Table, 3);
        assert_eq!(renderer.due(), None);
        let before = Instant::now();
        assert_eq!(renderer.push(&batch(&[1.5])).unwrap(), "");
        let due = renderer.due().expect("rows wait");
        assert!(due >= before + FLUSH_AFTER, "{due:?}");
        assert_eq!(renderer.push(&batch(&[2.5])).unwrap(), "");
        // The third row makes a screenful: drawn at once.
        let text = renderer.push(&batch(&[3.5])).unwrap();
        assert_eq!(text.matches("| x ").count(), 1, "{text}");
        assert_eq!(text.matches("| 2.5 |").count(), 1, "{text}");
        assert_eq!(renderer.due(), None);
        assert_eq!(renderer.push(&batch(&[4.5])).unwrap(), "");
        assert_eq!(renderer.flush(), "| 4.5 |\n");
        assert_eq!(renderer.due(), None);
        assert_eq!(renderer.finish(), "+-----+\n");
    }

    #[test]
    fn csv_is_written_at_once_with_full_precision() {
        let mut renderer = Renderer::new(OutputFormat::Csv, 3);
        let text = renderer.push(&batch(&[32.949999999999996])).unwrap();
        assert_eq!(text, "x\n32.949999999999996\n");
        assert_eq!(renderer.due(), None);
        assert_eq!(renderer.push(&batch(&[1.0])).unwrap(), "1.0\n");
        assert_eq!(renderer.finish(), "");
    }
}
