//! A write-ahead log for rows pushed into a stream: a push is acknowledged
//! once its rows are on disk, so a checkpoint can record a log position
//! and a restore can replay what came after it.
//!
//! # Files
//!
//! One log per push stream, in `DIR/<stream>/`, the stream's name made
//! safe for a file name (letters, digits, `_`, `-` kept; every other byte
//! as `%XX`):
//!
//! - `schema.arrow`: the stream's schema, as an Arrow IPC stream with no
//!   batches.
//! - `segment-<first seq>.log` (the sequence number in 20 digits, so names
//!   sort in log order): records, one after another. A record is a 20-byte
//!   header, all little-endian: payload length (u32), sequence number
//!   (u64), CRC-32 of those 12 bytes (u32), CRC-32 of the payload (u32);
//!   then the payload, one batch as an Arrow IPC stream. Sequence numbers
//!   start at 1 and go up by one across segments and restarts.
//!
//! The framing (and the recovery below) is [`super::frames`], shared with
//! the disk buffers.
//!
//! A new segment is started when a record would take the current one past
//! [`WalOptions::segment_bytes`]; [`Wal::truncate_through`] deletes whole
//! segments, never the last one.
//!
//! # Recovery
//!
//! [`Wal::open`] reads every record. A crash while appending can leave the
//! end of the last segment torn: a partial header or payload, a payload
//! whose checksum fails with nothing after it, or zero bytes where a header
//! should be. That tail is cut off, with a warning on stderr; those records
//! were never acknowledged. Anything bad before the tail (a bad header or
//! checksum with records after it, a sequence number out of order, a bad
//! earlier segment) is damage, not a torn write: an error naming the file
//! and the offset.
//!
//! A log whose schema differs from the stream's (the stream was declared
//! again with other columns) is not replayed: its folder is renamed aside
//! to `<stream>.replaced-<N>` (the first free N), kept for inspection, and
//! a new log starts. Its sequence numbers go on from the old log's last, so
//! a position recorded against the old log never skips records of the new.
//!
//! # Group commit
//!
//! Appends are queued to one writer thread, which takes everything queued
//! (at most [`GROUP_RECORDS`] records or [`GROUP_BYTES`] bytes at a time),
//! writes it and fsyncs once. An append arriving while an fsync is in
//! flight is in the next group, so it waits at most for the fsync in
//! flight and its own (more only when over a thousand records queue up at
//! once).

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::arrow::record_batch::RecordBatch;
use tokio::sync::oneshot;

use super::frames::{
    HEADER, Segment, create_segment, decode_batch, encode_batch, open_append, read_prefix,
    record_header, safe_name, scan_log, scan_records, segment_path, sync, sync_dir,
};
use crate::error::{Error, Result};

/// Most records one fsync covers.
pub const GROUP_RECORDS: usize = 1024;

/// Most payload bytes one fsync covers (a single larger record still goes
/// alone).
pub const GROUP_BYTES: u64 = 16 << 20;

/// What a full log tells the pusher to wait before trying again: space
/// comes back when a checkpoint lets [`Wal::truncate_through`] run.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// How messages name this kind of log.
const WHAT: &str = "write-ahead log";

const SCHEMA_FILE: &str = "schema.arrow";

/// Limits of a [`Wal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalOptions {
    /// Most bytes the log may hold; an append past it is refused with
    /// [`Error::Overloaded`].
    pub max_bytes: u64,
    /// The size at which a new segment is started.
    pub segment_bytes: u64,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            max_bytes: 1 << 30,
            segment_bytes: 64 << 20,
        }
    }
}

/// The write-ahead log of one push stream; see the [module docs](self).
pub struct Wal {
    shared: Arc<Shared>,
    queue: Option<mpsc::Sender<Append>>,
    writer: Option<JoinHandle<()>>,
}

/// What the appenders, the writer thread and readers share.
struct Shared {
    dir: PathBuf,
    schema: SchemaRef,
    options: WalOptions,
    state: Mutex<State>,
}

struct State {
    /// Durable segments, oldest first; never empty.
    segments: Vec<Segment>,
    /// The last durable record.
    last_seq: u64,
    /// Bytes on disk, all segments.
    bytes: u64,
    /// Bytes of queued records not yet written.
    reserved: u64,
    /// Why the log stopped taking appends (a write or fsync failed).
    failed: Option<String>,
}

/// One queued append.
struct Append {
    record: Vec<u8>,
    reply: oneshot::Sender<Result<u64>>,
}

impl Wal {
    /// Opens (or creates) the log of `stream` under `dir`, recovering it
    /// (see the module docs).
    pub fn open(dir: &Path, stream: &str, schema: SchemaRef, options: WalOptions) -> Result<Wal> {
        let folder = dir.join(safe_name(stream));
        let mut next_seq = 1;
        if folder.exists() && !same_schema(&folder, &schema)? {
            next_seq = scan_log(WHAT, &folder)?.1 + 1;
            set_aside(&folder)?;
        }
        fs::create_dir_all(&folder)
            .map_err(|e| Error::io(format!("cannot create {}", folder.display()), e))?;
        if !folder.join(SCHEMA_FILE).exists() {
            write_schema(&folder, &schema)?;
        }
        let (mut segments, last_seq) = scan_log(WHAT, &folder)?;
        if segments.is_empty() {
            let path = segment_path(&folder, next_seq);
            create_segment(&path)?;
            segments.push(Segment {
                path,
                first_seq: next_seq,
                last_seq: next_seq - 1,
                bytes: 0,
            });
        }
        let last_seq = last_seq.max(next_seq - 1);
        let bytes = segments.iter().map(|s| s.bytes).sum();
        let shared = Arc::new(Shared {
            dir: folder,
            schema,
            options,
            state: Mutex::new(State {
                segments,
                last_seq,
                bytes,
                reserved: 0,
                failed: None,
            }),
        });
        let (queue, requests) = mpsc::channel();
        let worker = shared.clone();
        let writer = std::thread::Builder::new()
            .name(format!("wal-{stream}"))
            .spawn(move || write_loop(&worker, requests))
            .map_err(|e| Error::io("cannot start the write-ahead log writer", e))?;
        Ok(Wal {
            shared,
            queue: Some(queue),
            writer: Some(writer),
        })
    }

    /// Appends `batch` and returns its sequence number once it is on disk.
    /// A log that would grow past [`WalOptions::max_bytes`] refuses it with
    /// [`Error::Overloaded`] and writes nothing.
    pub async fn append(&self, batch: &RecordBatch) -> Result<u64> {
        if batch.schema().fields() != self.shared.schema.fields() {
            return Err(Error::Plan(format!(
                "write-ahead log {}: the batch's columns are not the stream's",
                self.shared.dir.display()
            )));
        }
        let record = encode_batch(WHAT, batch)?;
        self.reserve(record.len() as u64 + HEADER as u64)?;
        let (reply, answer) = oneshot::channel();
        let queued = self
            .queue
            .as_ref()
            .is_some_and(|q| q.send(Append { record, reply }).is_ok());
        if !queued {
            return Err(self.writer_gone());
        }
        answer.await.unwrap_or_else(|_| Err(self.writer_gone()))
    }

    fn writer_gone(&self) -> Error {
        Error::Connector(format!(
            "write-ahead log {}: the writer thread has stopped",
            self.shared.dir.display()
        ))
    }

    /// Counts `size` bytes against the bound before the record is queued.
    fn reserve(&self, size: u64) -> Result<()> {
        let mut state = self.shared.lock();
        if let Some(failed) = &state.failed {
            return Err(Error::Connector(failed.clone()));
        }
        let max = self.shared.options.max_bytes;
        if size > max {
            return Err(Error::Plan(format!(
                "write-ahead log {}: a batch of {size} bytes is larger than the log may hold \
                 ({max} bytes)",
                self.shared.dir.display()
            )));
        }
        if state.bytes + state.reserved + size > max {
            return Err(Error::Overloaded {
                message: format!(
                    "write-ahead log {} is full ({} of {max} bytes); it shrinks after the next \
                     checkpoint",
                    self.shared.dir.display(),
                    state.bytes + state.reserved
                ),
                retry_after: RETRY_AFTER,
            });
        }
        state.reserved += size;
        Ok(())
    }

    /// The sequence number of the last record on disk (0 for none yet).
    pub fn last_seq(&self) -> u64 {
        self.shared.lock().last_seq
    }

    /// Bytes the log holds on disk.
    pub fn bytes(&self) -> u64 {
        self.shared.lock().bytes
    }

    /// The records after `after`, in order.
    pub fn replay(&self, after: u64) -> Result<Vec<(u64, RecordBatch)>> {
        let segments: Vec<Segment> = self
            .shared
            .lock()
            .segments
            .iter()
            .filter(|s| s.last_seq > after)
            .cloned()
            .collect();
        let mut out = Vec::new();
        for segment in segments {
            let data = read_prefix(&segment.path, segment.bytes)?;
            let scan = scan_records(WHAT, &segment.path, &data, segment.first_seq, false)?;
            for (seq, range) in scan.records {
                if seq > after {
                    out.push((
                        seq,
                        decode_batch(
                            WHAT,
                            &segment.path,
                            range.0,
                            &data[range.0 + HEADER..range.1],
                        )?,
                    ));
                }
            }
        }
        Ok(out)
    }

    /// Deletes the segments whose records all have sequence numbers up to
    /// `seq` (the last segment stays, as appends go there).
    pub fn truncate_through(&self, seq: u64) -> Result<()> {
        let mut state = self.shared.lock();
        while state.segments.len() > 1 && state.segments[0].last_seq <= seq {
            let segment = state.segments.remove(0);
            state.bytes -= segment.bytes;
            match fs::remove_file(&segment.path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    let context = format!("cannot delete {}", segment.path.display());
                    state.segments.insert(0, segment.clone());
                    state.bytes += segment.bytes;
                    return Err(Error::io(context, e));
                }
            }
        }
        Ok(())
    }
}

impl Drop for Wal {
    fn drop(&mut self) {
        // The writer finishes what is queued, then ends.
        drop(self.queue.take());
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The writer thread: takes a group of queued appends, writes and fsyncs
/// it, answers every append of it, and again, until the log is dropped.
fn write_loop(shared: &Shared, requests: mpsc::Receiver<Append>) {
    let mut active = None;
    while let Ok(first) = requests.recv() {
        let mut group = VecDeque::from([first]);
        let mut bytes = group[0].record.len() as u64;
        while group.len() < GROUP_RECORDS && bytes < GROUP_BYTES {
            match requests.try_recv() {
                Ok(next) => {
                    bytes += next.record.len() as u64;
                    group.push_back(next);
                }
                Err(_) => break,
            }
        }
        let answers = write_group(shared, &mut active, &group);
        for (append, answer) in group.into_iter().zip(answers) {
            let _ = append.reply.send(answer);
        }
    }
}

/// Writes `group` after the last durable record and fsyncs it; returns
/// one answer per append. `active` is the open last segment.
fn write_group(
    shared: &Shared,
    active: &mut Option<File>,
    group: &VecDeque<Append>,
) -> Vec<Result<u64>> {
    let size: u64 = group.iter().map(|a| (a.record.len() + HEADER) as u64).sum();
    let (mut segments, mut seq, failed) = {
        let state = shared.lock();
        (state.segments.clone(), state.last_seq, state.failed.clone())
    };
    let result = match failed {
        Some(failed) => Err(failed),
        None => append_records(shared, active, &mut segments, &mut seq, group)
            .map_err(|e| e.to_string()),
    };
    let mut state = shared.lock();
    state.reserved -= size;
    match result {
        Ok(()) => {
            // Segments deleted meanwhile stay deleted.
            let oldest = state.segments[0].first_seq;
            segments.retain(|s| s.first_seq >= oldest);
            state.bytes = segments.iter().map(|s| s.bytes).sum();
            state.segments = segments;
            let first = state.last_seq + 1;
            state.last_seq = seq;
            (first..=seq).map(Ok).collect()
        }
        Err(why) => {
            state.failed.get_or_insert(why.clone());
            group
                .iter()
                .map(|_| Err(Error::Connector(why.clone())))
                .collect()
        }
    }
}

/// Writes the records of `group`, rolling segments as needed, and fsyncs
/// every file written. On failure the segments written are cut back to
/// their durable length, best effort.
fn append_records(
    shared: &Shared,
    active: &mut Option<File>,
    segments: &mut Vec<Segment>,
    seq: &mut u64,
    group: &VecDeque<Append>,
) -> Result<()> {
    let durable: Vec<(PathBuf, u64)> = segments.iter().map(|s| (s.path.clone(), s.bytes)).collect();
    let result = (|| {
        for append in group {
            let size = (append.record.len() + HEADER) as u64;
            let last = segments.last().expect("a log has a segment");
            if last.bytes > 0 && last.bytes + size > shared.options.segment_bytes {
                if let Some(file) = active.take() {
                    sync(&file, &last.path)?;
                }
                let path = segment_path(&shared.dir, *seq + 1);
                create_segment(&path)?;
                segments.push(Segment {
                    path,
                    first_seq: *seq + 1,
                    last_seq: *seq,
                    bytes: 0,
                });
            }
            let segment = segments.last_mut().expect("a log has a segment");
            if active.is_none() {
                *active = Some(open_append(&segment.path)?);
            }
            let file = active.as_mut().expect("just opened");
            *seq += 1;
            file.write_all(&record_header(*seq, &append.record))
                .and_then(|()| file.write_all(&append.record))
                .map_err(|e| Error::io(format!("writing {}", segment.path.display()), e))?;
            segment.bytes += size;
            segment.last_seq = *seq;
        }
        match (active.as_ref(), segments.last()) {
            (Some(file), Some(segment)) => sync(file, &segment.path),
            _ => Ok(()),
        }
    })();
    if result.is_err() {
        *active = None;
        for segment in segments.iter() {
            match durable.iter().find(|(path, _)| *path == segment.path) {
                Some((path, bytes)) => {
                    if let Ok(file) = OpenOptions::new().write(true).open(path) {
                        let _ = file.set_len(*bytes);
                    }
                }
                None => {
                    let _ = fs::remove_file(&segment.path);
                }
            }
        }
    }
    result
}

fn write_schema(folder: &Path, schema: &SchemaRef) -> Result<()> {
    let mut writer = StreamWriter::try_new(Vec::new(), schema)?;
    writer.finish()?;
    let bytes = writer.into_inner()?;
    let temp = folder.join(format!("{SCHEMA_FILE}.new"));
    let path = folder.join(SCHEMA_FILE);
    File::create(&temp)
        .and_then(|mut f| f.write_all(&bytes).and_then(|()| f.sync_all()))
        .and_then(|()| fs::rename(&temp, &path))
        .map_err(|e| Error::io(format!("cannot write {}", path.display()), e))?;
    sync_dir(folder)
}

/// Whether the log in `folder` holds rows of `schema` (a log without a
/// schema file holds none yet, so it does).
fn same_schema(folder: &Path, schema: &SchemaRef) -> Result<bool> {
    let path = folder.join(SCHEMA_FILE);
    let file = match File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(Error::io(format!("cannot read {}", path.display()), e)),
    };
    let reader = StreamReader::try_new(std::io::BufReader::new(file), None).map_err(|e| {
        Error::Connector(format!(
            "write-ahead log {}: bad schema: {e}",
            path.display()
        ))
    })?;
    Ok(reader.schema().fields() == schema.fields())
}

/// Renames `folder` to `<folder>.replaced-<N>`, the first free N.
fn set_aside(folder: &Path) -> Result<()> {
    let name = folder
        .file_name()
        .expect("a log folder has a name")
        .to_string_lossy();
    let target = (1..)
        .map(|n| folder.with_file_name(format!("{name}.replaced-{n}")))
        .find(|p| !p.exists())
        .expect("a free name");
    fs::rename(folder, &target).map_err(|e| {
        Error::io(
            format!(
                "cannot move {} aside to {}",
                folder.display(),
                target.display()
            ),
            e,
        )
    })?;
    crate::diag::note!(
        "the stream's columns changed: its old write-ahead log was moved to {}",
        target.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests;
