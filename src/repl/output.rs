//! Rendering result batches to text, and printing from background queries
//! without breaking the line being edited.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use datafusion::arrow::record_batch::RecordBatch;
use rustyline::ExternalPrinter;

use crate::connectors::{OutputFormat, Sink, make_sink};
use crate::error::Result;

/// Renders one query's batches in an output format; a CSV header is
/// written once, before the first rows.
pub struct Renderer {
    sink: Box<dyn Sink>,
    buf: Arc<Mutex<Vec<u8>>>,
}

impl Renderer {
    /// A renderer for `format`.
    pub fn new(format: OutputFormat) -> Self {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = make_sink(format, Box::new(SharedBuf(buf.clone())));
        Self { sink, buf }
    }

    /// The text of `batch` (empty for no rows).
    pub fn render(&mut self, batch: &RecordBatch) -> Result<String> {
        self.sink.write(batch)?;
        let bytes = std::mem::take(&mut *self.buf.lock().unwrap_or_else(|e| e.into_inner()));
        Ok(String::from_utf8_lossy(&bytes).into_owned())
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
    tx: mpsc::Sender<String>,
    closed: Arc<AtomicBool>,
}

impl Printer {
    /// Starts the printing thread; without an external printer (input is
    /// not a terminal) text goes to stdout.
    pub fn start(external: Option<Box<dyn ExternalPrinter + Send>>) -> Self {
        let (tx, rx) = mpsc::channel::<String>();
        let mut external = external;
        let spawned = std::thread::Builder::new()
            .name("vigil-repl-printer".into())
            .spawn(move || {
                for text in rx {
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
        if let Err(mpsc::SendError(text)) = self.tx.send(text) {
            out!("{text}");
        }
    }

    /// Prints nothing more: the REPL is leaving, and the queries it stops
    /// need not say so.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
    }
}
