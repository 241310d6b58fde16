//! The default output several queries share.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::progress::StatusLine;
use crate::error::{Error, Result};

/// A writer many sinks can hold. Each holder buffers what it writes and
/// hands it over whole on `flush` (sinks flush after every batch), so the
/// results of different queries never interleave mid-row.
pub struct SharedOutput {
    shared: Arc<Mutex<Box<dyn Write + Send>>>,
    pending: Vec<u8>,
    /// The progress line on the same terminal, cleared while writing.
    status: Option<Arc<StatusLine>>,
}

impl Clone for SharedOutput {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            pending: Vec::new(),
            status: self.status.clone(),
        }
    }
}

impl SharedOutput {
    /// Standard output.
    pub fn stdout() -> Self {
        Self::new(Box::new(BufWriter::new(std::io::stdout())))
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
        let _held = self
            .status
            .as_ref()
            .filter(|_| !self.pending.is_empty())
            .map(|s| s.hold());
        out.write_all(&self.pending)?;
        self.pending.clear();
        out.flush()
    }
}

impl Drop for SharedOutput {
    fn drop(&mut self) {
        if !self.pending.is_empty() {
            let _ = self.flush();
        }
    }
}
