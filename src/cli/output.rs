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

/// The outputs of several queries sharing one [`SharedOutput`], kept in
/// query order: the first query's lines are written as they come, and
/// each later query's are held until every query before it has ended.
/// Over inputs that end, the whole output is then the same on every run
/// (each query's own lines already are); over inputs that never end a
/// later query would be held for ever, so [`Turns`] is for finite runs.
pub struct Turns {
    state: Mutex<TurnState>,
}

struct TurnState {
    out: SharedOutput,
    /// The query writing straight through; those before it have ended.
    head: usize,
    /// Per query, what it wrote before its turn came.
    held: Vec<Vec<u8>>,
    ended: Vec<bool>,
}

impl Turns {
    /// Turns for `count` queries writing to `out`; each must take its
    /// [`Turns::writer`], or the queries after it are never written.
    pub fn new(out: SharedOutput, count: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(TurnState {
                out,
                head: 0,
                held: vec![Vec::new(); count],
                ended: vec![false; count],
            }),
        })
    }

    /// The writer of query `index` (0-based, in query order). Dropping it
    /// ends the query's turn.
    pub fn writer(self: &Arc<Self>, index: usize) -> InTurn {
        InTurn {
            index,
            turns: self.clone(),
            pending: Vec::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TurnState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl TurnState {
    fn write_out(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.out.write_all(bytes)?;
        self.out.flush()
    }

    /// Marks query `index` ended and passes the turn on past every query
    /// that has ended, writing what each held.
    fn end(&mut self, index: usize) -> std::io::Result<()> {
        self.ended[index] = true;
        while self.head < self.ended.len() && self.ended[self.head] {
            self.head += 1;
            if let Some(held) = self.held.get_mut(self.head).map(std::mem::take) {
                self.write_out(&held)?;
            }
        }
        Ok(())
    }
}

/// One query's writer in [`Turns`]; it buffers until `flush`, like
/// [`SharedOutput`], so rows stay whole.
pub struct InTurn {
    index: usize,
    turns: Arc<Turns>,
    pending: Vec<u8>,
}

impl Write for InTurn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let pending = std::mem::take(&mut self.pending);
        let mut state = self.turns.lock();
        if state.head == self.index {
            state.write_out(&pending)
        } else {
            state.held[self.index].extend_from_slice(&pending);
            Ok(())
        }
    }
}

impl Drop for InTurn {
    fn drop(&mut self) {
        let _ = self.flush();
        let _ = self.turns.lock().end(self.index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer whose bytes the test can read back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn text(captured: &Captured) -> String {
        String::from_utf8(captured.0.lock().unwrap().clone()).unwrap()
    }

    fn line(writer: &mut InTurn, text: &str) {
        writer.write_all(text.as_bytes()).unwrap();
        writer.flush().unwrap();
    }

    #[test]
    fn later_queries_wait_for_the_ones_before_them() {
        let captured = Captured::default();
        let turns = Turns::new(SharedOutput::new(Box::new(captured.clone())), 3);
        let (mut a, mut b, mut c) = (turns.writer(0), turns.writer(1), turns.writer(2));
        line(&mut c, "c1\n");
        line(&mut a, "a1\n");
        line(&mut b, "b1\n");
        assert_eq!(text(&captured), "a1\n", "the first query writes through");
        line(&mut c, "c2\n");
        drop(c);
        line(&mut a, "a2\n");
        drop(a);
        assert_eq!(text(&captured), "a1\na2\nb1\n", "b's turn: its held line");
        line(&mut b, "b2\n");
        assert_eq!(text(&captured), "a1\na2\nb1\nb2\n");
        drop(b);
        assert_eq!(text(&captured), "a1\na2\nb1\nb2\nc1\nc2\n");
    }
}
