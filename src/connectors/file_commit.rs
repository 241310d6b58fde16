//! A result file that one or more writers append to, with exactly-once
//! checkpoints.
//!
//! # Scheme: truncate to the committed length on restore
//!
//! A checkpoint flushes the file, fsyncs it and commits its length:
//! `{"path": ..., "length": N}` (sinks add their own state, such as CSV's
//! `header_written`, under `"format"`). Restoring that commit cuts the file
//! back to `N` bytes, dropping whatever was written after the checkpoint,
//! and appends after it: the rows that come again after the restore are
//! written once more, exactly where they were before. A file shorter than
//! its commit was changed behind the engine's back, and restoring it is an
//! error.
//!
//! Because a restore may follow, opening a file does not truncate it: it is
//! created if missing (so a bad path fails at once) and truncated to empty
//! on the first write, checkpoint or finish that no restore came before.
//!
//! # Several writers
//!
//! Queries of one process writing the same file share it, each through its
//! own [`FileWriter`]. A commit must cover, for every writer, exactly the
//! rows it wrote before its barrier of that checkpoint. As
//! [`Sink::checkpoint`](super::Sink::checkpoint) carries no checkpoint id,
//! the calls are counted: the k-th call of each writer is checkpoint k.
//! [`FileWriter::checkpoint`] blocks (it runs on the sink's blocking
//! thread) until every live writer of the file has made its k-th call, or
//! has finished or been dropped; nobody writes in between, so the length
//! then is the commit of checkpoint k, and every writer gets the same one.
//! A writer's barrier can only be held up by its co-writers' pipelines, and
//! the barriers of one checkpoint reach every query, so the wait ends.
//! Writers must all be taken before any checkpoint.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use serde_json::{Value, json};

use super::SinkCommit;
use crate::error::{Error, Result};

/// A file appended to by [`FileWriter`]s; see the [module docs](self).
pub struct CommittedFile {
    path: PathBuf,
    state: Mutex<FileState>,
    /// Signalled when a checkpoint's commit becomes known.
    committed: Condvar,
}

struct FileState {
    file: File,
    /// Truncated or restored: until then the old contents stay, in case a
    /// restore comes.
    started: bool,
    /// What the file holds (everything is written straight to it).
    length: u64,
    /// Per live writer, the checkpoints it has reached.
    reached: BTreeMap<u64, u64>,
    next_writer: u64,
    /// Checkpoints up to this one have their commit.
    done: u64,
    /// The commits writers may still ask for, by checkpoint.
    commits: BTreeMap<u64, SinkCommit>,
    /// The length a restore went back to, so that co-writers restoring the
    /// same checkpoint agree instead of cutting twice.
    restored: Option<u64>,
    /// The format state shared by all writers, if they share one.
    format: Option<Value>,
    /// An fsync that failed: every later checkpoint fails with it.
    failed: Option<String>,
    /// What the writers keep together outside the file, read at each
    /// commit (see [`CommittedFile::set_shared_state`]).
    shared: Option<SharedState>,
}

/// Reads the state writers keep together, for a commit.
type SharedState = Box<dyn Fn() -> Value + Send>;

impl CommittedFile {
    /// Opens `path` for appending, creating it and the directories above
    /// it; the contents stay until the first write (see the module docs).
    pub fn open(path: &Path) -> Result<Arc<CommittedFile>> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::Connector(format!("cannot create {}: {e}", dir.display())))?;
        }
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .map_err(|e| Error::Connector(format!("cannot create {}: {e}", path.display())))?;
        Ok(Arc::new(CommittedFile {
            path: path.to_path_buf(),
            state: Mutex::new(FileState {
                file,
                started: false,
                length: 0,
                reached: BTreeMap::new(),
                next_writer: 0,
                done: 0,
                commits: BTreeMap::new(),
                restored: None,
                format: None,
                failed: None,
                shared: None,
            }),
            committed: Condvar::new(),
        }))
    }

    /// A new writer, counted in every checkpoint from now on.
    pub fn writer(self: &Arc<Self>) -> FileWriter {
        let mut state = self.lock();
        let id = state.next_writer;
        state.next_writer += 1;
        let reached = state.done;
        state.reached.insert(id, reached);
        FileWriter {
            file: self.clone(),
            id,
        }
    }

    /// Records the state of the format all writers share, before anything
    /// is written (later writes update it, see
    /// [`FileWriter::send_with_state`]).
    pub fn set_format(&self, format: Option<Value>) {
        self.lock().format = format;
    }

    /// Has every commit record, under `"shared"`, what `read` returns
    /// then: state the writers keep together outside the file (rows held
    /// back in memory). `read` runs under this file's lock while every
    /// live writer waits in [`FileWriter::checkpoint`], so it sees that
    /// state as of the commit; it must not write to this file.
    pub fn set_shared_state(&self, read: impl Fn() -> Value + Send + 'static) {
        self.lock().shared = Some(Box::new(read));
    }

    /// Appends `bytes` outside any writer: for an output that never takes
    /// checkpoints.
    pub fn append(&self, bytes: &[u8]) -> Result<()> {
        let mut state = self.lock();
        self.start(&mut state)?;
        self.write(&mut state, bytes)
    }

    fn lock(&self) -> MutexGuard<'_, FileState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn io_error(&self, doing: &str, e: std::io::Error) -> Error {
        Error::io(format!("{doing} {}", self.path.display()), e)
    }

    /// Truncates the file if neither that nor a restore happened yet.
    fn start(&self, state: &mut FileState) -> Result<()> {
        if !state.started {
            state
                .file
                .set_len(0)
                .map_err(|e| self.io_error("cannot truncate", e))?;
            state.started = true;
            state.length = 0;
        }
        Ok(())
    }

    fn write(&self, state: &mut FileState, bytes: &[u8]) -> Result<()> {
        state
            .file
            .write_all(bytes)
            .map_err(|e| self.io_error("writing", e))?;
        state.length += bytes.len() as u64;
        Ok(())
    }

    /// Commits every checkpoint all live writers have reached, with one
    /// fsync, and wakes the writers waiting for them.
    fn commit_reached(&self, state: &mut FileState) {
        let Some(&reached) = state.reached.values().min() else {
            return;
        };
        if reached <= state.done {
            return;
        }
        crate::crashpoint::hit("sink-flush");
        if state.failed.is_none()
            && let Err(e) = state.file.sync_data()
        {
            state.failed = Some(self.io_error("cannot sync", e).to_string());
        }
        let mut commit = json!({
            "path": self.path.display().to_string(),
            "length": state.length,
        });
        if let Some(format) = &state.format {
            commit["format"] = format.clone();
        }
        if let Some(read) = &state.shared {
            commit["shared"] = read();
        }
        for checkpoint in state.done + 1..=reached {
            state.commits.insert(checkpoint, commit.clone());
        }
        state.done = reached;
        self.committed.notify_all();
    }

    fn remove_writer(&self, id: u64) {
        let mut state = self.lock();
        if state.reached.remove(&id).is_some() {
            self.commit_reached(&mut state);
        }
    }
}

/// One writer's handle on a [`CommittedFile`]. Dropping it (a finished or
/// failed query) stops it being waited for at checkpoints.
pub struct FileWriter {
    file: Arc<CommittedFile>,
    id: u64,
}

impl FileWriter {
    /// Appends `bytes` (one batch, kept whole).
    pub fn send(&mut self, bytes: &[u8]) -> Result<()> {
        let mut state = self.file.lock();
        self.file.start(&mut state)?;
        self.file.write(&mut state, bytes)
    }

    /// Like [`send`](Self::send), for writers that share one format:
    /// `format` is its state after `bytes`, recorded in the commits.
    pub fn send_with_state(&mut self, bytes: &[u8], format: Option<Value>) -> Result<()> {
        let mut state = self.file.lock();
        self.file.start(&mut state)?;
        self.file.write(&mut state, bytes)?;
        state.format = format;
        Ok(())
    }

    /// This writer's next checkpoint: waits until every live writer has
    /// reached it (see the module docs) and returns its commit, the same
    /// for every writer.
    pub fn checkpoint(&mut self) -> Result<SinkCommit> {
        let mut state = self.file.lock();
        self.file.start(&mut state)?;
        let Some(reached) = state.reached.get_mut(&self.id) else {
            return Err(Error::Connector(format!(
                "{}: checkpoint after finish",
                self.file.path.display()
            )));
        };
        *reached += 1;
        let checkpoint = *reached;
        self.file.commit_reached(&mut state);
        while state.done < checkpoint {
            state = self
                .file
                .committed
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
        if let Some(failed) = &state.failed {
            return Err(Error::Connector(failed.clone()));
        }
        let commit = state.commits[&checkpoint].clone();
        // Every live writer has asked for the commits before its last one.
        if let Some(&oldest) = state.reached.values().min() {
            state.commits.retain(|&c, _| c >= oldest);
        }
        Ok(commit)
    }

    /// Goes back to `commit`: cuts the file to its length and appends
    /// after it. Returns whether this call did it (`false` when a
    /// co-writer already restored the same commit). Must come before the
    /// file is written.
    pub fn restore(&mut self, commit: &SinkCommit) -> Result<bool> {
        let path = &self.file.path;
        let bad =
            |why: String| Error::Connector(format!("cannot restore {}: {why}", path.display()));
        let length = commit
            .get("length")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad(format!("the commit has no length: {commit}")))?;
        if let Some(committed) = commit.get("path").and_then(Value::as_str)
            && Path::new(committed) != path.as_path()
        {
            return Err(bad(format!("the checkpoint was taken for {committed}")));
        }
        let mut state = self.file.lock();
        match state.restored {
            Some(done) if done == length => return Ok(false),
            Some(done) => {
                return Err(bad(format!(
                    "restored to {done} bytes already, now asked for {length}"
                )));
            }
            None if state.started => return Err(bad("it was written before the restore".into())),
            None => {}
        }
        let actual = state
            .file
            .metadata()
            .map_err(|e| self.file.io_error("cannot read", e))?
            .len();
        if actual < length {
            return Err(bad(format!(
                "it holds {actual} bytes, fewer than the {length} the checkpoint committed \
                 (it was changed since)"
            )));
        }
        state
            .file
            .set_len(length)
            .map_err(|e| self.file.io_error("cannot truncate", e))?;
        state.started = true;
        state.length = length;
        state.restored = Some(length);
        state.format = commit.get("format").cloned();
        Ok(true)
    }

    /// The writer is done: an empty file if nothing was written, and no
    /// more waiting for it at checkpoints. Calling it again is harmless.
    pub fn finish(&mut self) -> Result<()> {
        {
            let mut state = self.file.lock();
            self.file.start(&mut state)?;
        }
        self.file.remove_writer(self.id);
        Ok(())
    }
}

impl Drop for FileWriter {
    fn drop(&mut self) {
        self.file.remove_writer(self.id);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn opening_keeps_the_contents_until_the_first_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/out.txt");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "old\n").unwrap();
        let file = CommittedFile::open(&path).unwrap();
        let mut writer = file.writer();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old\n");
        writer.send(b"new\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new\n");
        writer.finish().unwrap();

        // Nothing written: empty after finish, not left as it was.
        std::fs::write(&path, "old\n").unwrap();
        let file = CommittedFile::open(&path).unwrap();
        file.writer().finish().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
    }

    #[test]
    fn restore_cuts_back_to_the_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.txt");
        let file = CommittedFile::open(&path).unwrap();
        let mut writer = file.writer();
        writer.send(b"one\n").unwrap();
        let commit = writer.checkpoint().unwrap();
        assert_eq!(commit["length"], 4);
        writer.send(b"two\n").unwrap();
        drop((writer, file));

        let file = CommittedFile::open(&path).unwrap();
        let mut writer = file.writer();
        assert!(writer.restore(&commit).unwrap());
        writer.send(b"again\n").unwrap();
        writer.finish().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\nagain\n");

        // Shorter than committed: changed behind our back.
        std::fs::write(&path, "on").unwrap();
        let file = CommittedFile::open(&path).unwrap();
        let err = file.writer().restore(&commit).unwrap_err().to_string();
        assert!(err.contains("holds 2 bytes, fewer than the 4"), "{err}");
    }

    #[test]
    fn a_commit_covers_each_writer_up_to_its_barrier() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.txt");
        let file = CommittedFile::open(&path).unwrap();
        let (mut a, mut b) = (file.writer(), file.writer());
        a.send(b"a1\n").unwrap();
        let early = std::thread::spawn(move || {
            let first = a.checkpoint().unwrap();
            // b has not reached checkpoint 1 until it wrote b1.
            let second = a.checkpoint().unwrap();
            a.send(b"a2\n").unwrap();
            a.finish().unwrap();
            (first, second)
        });
        std::thread::sleep(Duration::from_millis(50));
        b.send(b"b1\n").unwrap();
        let first = b.checkpoint().unwrap();
        b.send(b"b2\n").unwrap();
        let second = b.checkpoint().unwrap();
        let (a_first, a_second) = early.join().unwrap();
        assert_eq!((&a_first, &a_second), (&first, &second));
        assert_eq!(first["length"], 6);
        assert_eq!(second["length"], 9);
        // A writer that has finished is no longer waited for.
        b.send(b"b3\n").unwrap();
        let third = b.checkpoint().unwrap();
        assert_eq!(third["length"], 15);
        b.finish().unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "a1\nb1\nb2\na2\nb3\n"
        );
    }

    #[test]
    fn a_dropped_writer_releases_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let file = CommittedFile::open(&dir.path().join("out.txt")).unwrap();
        let (mut a, b) = (file.writer(), file.writer());
        let waiting = std::thread::spawn(move || a.checkpoint().unwrap());
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiting.is_finished());
        drop(b);
        assert_eq!(waiting.join().unwrap()["length"], 0);
    }
}
