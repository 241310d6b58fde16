//! The default output several queries share.
//!
//! Standard output is at-least-once under checkpoints: it cannot go back,
//! so rows after a checkpoint may be printed again after a restore. An
//! `--output` file is exactly-once, like a file sink: a checkpoint commits
//! its length, a restore cuts it back (see
//! [`file_commit`](crate::connectors::file_commit)). Under [`Turns`], the
//! rows a later query holds back until its turn are part of the commit
//! too, so that a restore holds them back again.

use std::io::{BufWriter, ErrorKind, Write};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};

use serde_json::{Value, json};

use super::progress::StatusLine;
use crate::connector::{SinkCommit, SourceStats};
use crate::connectors::Destination;
use crate::connectors::file_commit::{CommittedFile, FileWriter};
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
    shared: Target,
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

/// Where a [`SharedOutput`] writes.
#[derive(Clone)]
enum Target {
    /// Standard output (or, in tests, any writer).
    Stream(Arc<Mutex<Box<dyn Write + Send>>>),
    /// An `--output` file.
    File(Arc<CommittedFile>),
}

impl SharedOutput {
    /// Standard output; `closed` learns when its reader goes away.
    pub fn stdout(closed: Arc<StdoutClosed>) -> Self {
        let mut out = Self::new(Box::new(BufWriter::new(std::io::stdout())));
        out.closed = Some(closed);
        out
    }

    /// A file, created if missing, emptied when first written unless a
    /// restore comes first.
    pub fn file(path: &Path) -> Result<Self> {
        let mut out = Self::new(Box::new(std::io::sink()));
        out.shared = Target::File(CommittedFile::open(path)?);
        Ok(out)
    }

    fn new(out: Box<dyn Write + Send>) -> Self {
        Self {
            shared: Target::Stream(Arc::new(Mutex::new(out))),
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

    /// A destination for one query's sink: on a file, a writer of its own
    /// that takes part in its checkpoints; on stdout, this output.
    pub fn destination(&self) -> Box<dyn Destination> {
        match &self.shared {
            Target::File(file) => Box::new(file.writer()),
            Target::Stream(_) => Box::new(self.clone()),
        }
    }

    fn committed_file(&self) -> Option<&Arc<CommittedFile>> {
        match &self.shared {
            Target::File(file) => Some(file),
            Target::Stream(_) => None,
        }
    }
}

impl Destination for SharedOutput {
    fn send(&mut self, bytes: &[u8]) -> Result<()> {
        self.write_all(bytes)
            .and_then(|()| self.flush())
            .map_err(|e| Error::io("writing results", e))
    }

    fn finish(&mut self) -> Result<()> {
        self.flush().map_err(|e| Error::io("writing results", e))
    }
}

impl Write for SharedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let shared = match &self.shared {
            Target::Stream(shared) => shared,
            Target::File(file) => {
                let pending = std::mem::take(&mut self.pending);
                return file
                    .append(&pending)
                    .map_err(|e| std::io::Error::other(e.to_string()));
            }
        };
        let mut out = shared.lock().unwrap_or_else(|e| e.into_inner());
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
        let file = out.committed_file().cloned();
        let turns = Arc::new(Self {
            state: Mutex::new(TurnState {
                out,
                head: 0,
                held: vec![Vec::new(); count],
                ended: vec![false; count],
            }),
        });
        if let Some(file) = file {
            // Lock order: the turns, then the file. The file's commit reads
            // the turns under the file's lock, but only while every writer
            // waits in its checkpoint, when nobody holds the turns.
            let weak: Weak<Turns> = Arc::downgrade(&turns);
            file.set_shared_state(move || {
                weak.upgrade()
                    .map_or(Value::Null, |turns| turns.lock().snapshot())
            });
        }
        turns
    }

    /// The writer of query `index` (0-based, in query order). Dropping it
    /// ends the query's turn.
    pub fn writer(self: &Arc<Self>, index: usize) -> InTurn {
        let file = self.lock().out.committed_file().map(|f| f.writer());
        InTurn {
            index,
            turns: self.clone(),
            pending: Vec::new(),
            file,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TurnState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl TurnState {
    /// What a checkpoint records of the turns.
    fn snapshot(&self) -> Value {
        let held: Vec<String> = self
            .held
            .iter()
            .map(|h| String::from_utf8_lossy(h).into_owned())
            .collect();
        json!({ "head": self.head, "held": held, "ended": self.ended })
    }

    /// Brings back what [`snapshot`](Self::snapshot) recorded.
    fn restore(&mut self, snapshot: &Value) -> Result<()> {
        let bad = || Error::Connector(format!("cannot restore the output's turns from {snapshot}"));
        let head = snapshot["head"].as_u64().ok_or_else(bad)? as usize;
        let held: Vec<Vec<u8>> = snapshot["held"]
            .as_array()
            .ok_or_else(bad)?
            .iter()
            .map(|h| h.as_str().map(|h| h.as_bytes().to_vec()))
            .collect::<Option<_>>()
            .ok_or_else(bad)?;
        let ended: Vec<bool> = snapshot["ended"]
            .as_array()
            .ok_or_else(bad)?
            .iter()
            .map(Value::as_bool)
            .collect::<Option<_>>()
            .ok_or_else(bad)?;
        if held.len() != self.held.len() || ended.len() != self.ended.len() {
            return Err(Error::Connector(format!(
                "cannot restore the output's turns: the checkpoint had {} queries, this run \
                 has {}",
                held.len(),
                self.held.len()
            )));
        }
        (self.head, self.held, self.ended) = (head, held, ended);
        Ok(())
    }

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
    /// On an `--output` file: this query's part in its checkpoints. It is
    /// dropped after the turn has ended, as fields drop after `drop`.
    file: Option<FileWriter>,
}

impl Destination for InTurn {
    fn send(&mut self, bytes: &[u8]) -> Result<()> {
        self.write_all(bytes)
            .and_then(|()| self.flush())
            .map_err(|e| Error::io("writing results", e))
    }

    /// Flushes only: the query stays a writer of the file until its turn
    /// has ended (on drop), as ending it writes the next query's rows.
    fn finish(&mut self) -> Result<()> {
        self.flush().map_err(|e| Error::io("writing results", e))
    }

    fn checkpoint(&mut self) -> Result<Option<SinkCommit>> {
        self.flush().map_err(|e| Error::io("writing results", e))?;
        self.file.as_mut().map(FileWriter::checkpoint).transpose()
    }

    fn restore(&mut self, commit: &SinkCommit) -> Result<()> {
        let Some(file) = self.file.as_mut() else {
            return Ok(());
        };
        if file.restore(commit)? {
            self.turns.lock().restore(&commit["shared"])?;
        }
        Ok(())
    }
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

    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::arrow::record_batch::RecordBatch;

    use crate::connector::{OutputFormat, Sink};
    use crate::connectors::make_sink_to;

    fn rows(values: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(values.to_vec()))]).unwrap()
    }

    /// Query `index` of `labels` writing to `out` in labelled CSV.
    fn query_sink(out: Box<dyn Destination>, label: &str) -> Box<dyn Sink> {
        make_sink_to(OutputFormat::Csv, Some(label), out)
    }

    /// Runs two queries, each on its own thread, over the destinations
    /// `outs`: query i writes `before[i]`, checkpoints (when `checkpoint`)
    /// and writes `after[i]`. Returns each query's commit and its sink,
    /// not finished.
    fn two_queries(
        outs: [Box<dyn Destination>; 2],
        commits: Option<[SinkCommit; 2]>,
        before: [&'static [i64]; 2],
        after: [&'static [i64]; 2],
    ) -> Vec<(Option<SinkCommit>, Box<dyn Sink>)> {
        let [a, b] = outs;
        let threads: Vec<_> = [a, b]
            .into_iter()
            .enumerate()
            .map(|(i, out)| {
                let restore = commits.as_ref().map(|c| c[i].clone());
                std::thread::spawn(move || {
                    let mut sink = query_sink(out, &format!("q{}", i + 1));
                    let mut commit = None;
                    if let Some(restore) = restore {
                        sink.restore(&restore).unwrap();
                    } else {
                        sink.write(&rows(before[i])).unwrap();
                        commit = sink.checkpoint().unwrap();
                    }
                    sink.write(&rows(after[i])).unwrap();
                    (commit, sink)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    const BEFORE: [&[i64]; 2] = [&[1, 2], &[10]];
    const AFTER: [&[i64]; 2] = [&[3], &[20, 30]];

    /// The output of `BEFORE` then `AFTER` with no checkpoint.
    fn uninterrupted(path: &Path, turns: bool) -> String {
        let out = SharedOutput::file(path).unwrap();
        let outs: [Box<dyn Destination>; 2] = if turns {
            let turns = Turns::new(out, 2);
            [Box::new(turns.writer(0)), Box::new(turns.writer(1))]
        } else {
            [out.destination(), out.destination()]
        };
        let mut sinks: Vec<Box<dyn Sink>> = outs
            .into_iter()
            .enumerate()
            .map(|(i, out)| query_sink(out, &format!("q{}", i + 1)))
            .collect();
        for (i, sink) in sinks.iter_mut().enumerate() {
            sink.write(&rows(BEFORE[i])).unwrap();
        }
        for (i, sink) in sinks.iter_mut().enumerate() {
            sink.write(&rows(AFTER[i])).unwrap();
            sink.finish().unwrap();
        }
        drop(sinks);
        std::fs::read_to_string(path).unwrap()
    }

    fn restored(path: &Path, turns: bool) -> String {
        let destinations = || -> [Box<dyn Destination>; 2] {
            let out = SharedOutput::file(path).unwrap();
            if turns {
                let turns = Turns::new(out, 2);
                [Box::new(turns.writer(0)), Box::new(turns.writer(1))]
            } else {
                [out.destination(), out.destination()]
            }
        };
        let first = two_queries(destinations(), None, BEFORE, AFTER);
        let commits: Vec<SinkCommit> = first.iter().map(|(c, _)| c.clone().unwrap()).collect();
        assert_eq!(commits[0]["length"], commits[1]["length"]);
        // The crash: the sinks go without finishing.
        drop(first);
        let length = commits[0]["length"].as_u64().unwrap() as usize;
        let committed = std::fs::read_to_string(path).unwrap()[..length].to_string();
        let commits = [commits[0].clone(), commits[1].clone()];
        let second = two_queries(destinations(), Some(commits), BEFORE, AFTER);
        for (_, mut sink) in second {
            sink.finish().unwrap();
        }
        let text = std::fs::read_to_string(path).unwrap();
        assert!(text.starts_with(&committed), "{committed:?} then {text:?}");
        text
    }

    #[test]
    fn an_output_file_restores_to_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.csv");
        let expected = uninterrupted(&path, false);
        assert_eq!(
            expected.lines().filter(|l| l.starts_with("query,")).count(),
            2
        );
        let got = restored(&path, false);
        // The queries interleave differently from run to run, but each
        // query's own lines are the same, its header (once) first.
        let of = |text: &str, q: &str| -> Vec<String> {
            let mine = text.lines().filter(|l| l.starts_with(q));
            mine.map(str::to_string).collect()
        };
        for q in ["q1,", "q2,"] {
            assert_eq!(of(&got, q), of(&expected, q), "{got}");
        }
        let headers = got.lines().filter(|l| *l == "query,n").count();
        assert_eq!(headers, 2, "{got}");
        assert_eq!(got.len(), expected.len());
    }

    #[test]
    fn held_rows_of_a_later_query_are_part_of_the_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.csv");
        let expected = uninterrupted(&path, true);
        assert_eq!(
            expected,
            "query,n\nq1,1\nq1,2\nq1,3\nquery,n\nq2,10\nq2,20\nq2,30\n"
        );
        assert_eq!(restored(&path, true), expected);
    }

    #[test]
    fn stdout_does_not_commit() {
        let captured = Captured::default();
        let out = SharedOutput::new(Box::new(captured.clone()));
        let mut sink = query_sink(out.destination(), "q1");
        sink.write(&rows(&[1])).unwrap();
        assert_eq!(sink.checkpoint().unwrap(), None);
        assert_eq!(text(&captured), "query,n\nq1,1\n");
    }
}
