//! The default output several queries share.

use std::fs::File;
use std::io::{BufWriter, ErrorKind, Write};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::progress::StatusLine;
use crate::connectors::SourceStats;
use crate::error::{Error, Result};
use crate::runtime::RunReport;

/// Turns a closed standard output into the end of the run, as for other
/// Unix tools (`vigil run ... | head`): once a write finds the pipe's
/// reader gone, every source of the run is asked to stop (as on Ctrl-C:
/// windows still open are not fired), later results are dropped, and the
/// run ends without an error.
#[derive(Default)]
pub struct StdoutClosed {
    state: Mutex<ClosedState>,
}

#[derive(Default)]
struct ClosedState {
    closed: bool,
    sources: Vec<Arc<SourceStats>>,
}

impl StdoutClosed {
    /// Stops the sources of `report`'s run when stdout closes (at once if
    /// it already has: a query may write before the run is watched).
    pub fn watch(&self, report: &RunReport) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.sources = report.streams.iter().map(|(_, s)| s.clone()).collect();
        if state.closed {
            stop_all(&state.sources);
        }
    }

    fn close(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.closed = true;
        stop_all(&state.sources);
    }

    fn is_closed(&self) -> bool {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).closed
    }
}

fn stop_all(sources: &[Arc<SourceStats>]) {
    for source in sources {
        source.stop.store(true, Ordering::Relaxed);
    }
}

/// A writer many sinks can hold. Each holder buffers what it writes and
/// hands it over whole on `flush` (sinks flush after every batch), so the
/// results of different queries never interleave mid-row.
pub struct SharedOutput {
    shared: Arc<Mutex<Box<dyn Write + Send>>>,
    pending: Vec<u8>,
    /// The progress line on the same terminal, cleared while writing.
    status: Option<Arc<StatusLine>>,
    /// For stdout: told when the reader has gone.
    closed: Option<Arc<StdoutClosed>>,
}

impl Clone for SharedOutput {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            pending: Vec::new(),
            status: self.status.clone(),
            closed: self.closed.clone(),
        }
    }
}

impl SharedOutput {
    /// Standard output; `closed` learns when its reader goes away.
    pub fn stdout(closed: Arc<StdoutClosed>) -> Self {
        let mut out = Self::new(Box::new(BufWriter::new(std::io::stdout())));
        out.closed = Some(closed);
        out
    }

    /// A file, created or truncated.
    pub fn file(path: &Path) -> Result<Self> {
        let file = File::create(path)
            .map_err(|e| Error::io(format!("cannot create {}", path.display()), e))?;
        Ok(Self::new(Box::new(BufWriter::new(file))))
    }

    fn new(out: Box<dyn Write + Send>) -> Self {
        Self {
            shared: Arc::new(Mutex::new(out)),
            pending: Vec::new(),
            status: None,
            closed: None,
        }
    }

    /// Clears `status` off the terminal while writing (for an output on
    /// the terminal the progress line is drawn on).
    pub fn with_status(mut self, status: Arc<StatusLine>) -> Self {
        self.status = Some(status);
        self
    }
}

impl Write for SharedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let mut out = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        if self.closed.as_ref().is_some_and(|c| c.is_closed()) {
            self.pending.clear();
            return Ok(());
        }
        let _held = self
            .status
            .as_ref()
            .filter(|_| !self.pending.is_empty())
            .map(|s| s.hold());
        let written = out.write_all(&self.pending).and_then(|()| out.flush());
        self.pending.clear();
        match (written, &self.closed) {
            (Err(e), Some(closed)) if e.kind() == ErrorKind::BrokenPipe => {
                closed.close();
                Ok(())
            }
            (written, _) => written,
        }
    }
}

impl Drop for SharedOutput {
    fn drop(&mut self) {
        if !self.pending.is_empty() {
            let _ = self.flush();
        }
    }
}
