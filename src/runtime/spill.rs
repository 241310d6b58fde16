//! A disk buffer: an ordered queue of a query's input messages in a local
//! folder, bounded in bytes, for a query that falls behind its stream (see
//! [`super::buffer`] for when messages go through it).
//!
//! # Files
//!
//! `DIR/segment-<first seq>.log`, records framed as [`super::frames`] says
//! (checksummed headers, sequence numbers from 1 up across segments and
//! restarts, a torn tail cut off on open). A record's payload is one
//! [`Message`]: a kind byte, the number of rows it holds (u64,
//! little-endian), then for a batch the batch as an Arrow IPC stream (for
//! changes, a row-kind byte first), for a watermark its value (i64), for a
//! barrier its id (u64); an epoch has nothing more.
//!
//! # Reading and keeping
//!
//! One reader takes the messages in order ([`Spill::pop`]) from the head;
//! [`Spill::read_from`] sets the head back to a sequence number recorded
//! earlier (a checkpoint's), so the messages after it are read again.
//! Taking a message does not delete it: records stay until
//! [`Spill::release_through`] says nothing needs them any more, and then
//! whole segments at or behind the head are deleted. The bound
//! ([`SpillOptions::max_bytes`]) counts every byte kept on disk; an append
//! past it is refused and writes nothing.
//!
//! # Durability
//!
//! Appends go to the file at once (the page cache), so a crash of the
//! process loses nothing appended; [`Spill::sync`] fsyncs, which a crash
//! of the machine needs. A new segment is fsynced before the next is begun.

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use datafusion::arrow::record_batch::RecordBatch;

use super::frames::{
    HEADER, Segment, create_segment, decode_batch, encode_batch, open_append, parse_header,
    read_prefix, record_header, scan_log, scan_records, segment_path, sync,
};
use crate::connector::RowKind;
use crate::error::{Error, Result};
use crate::exec::Message;

/// How messages name this kind of log.
const WHAT: &str = "disk buffer";

/// Bytes of a payload before its body: the kind and the row count.
const PREFIX: usize = 9;

const BATCH: u8 = 0;
const CHANGES: u8 = 1;
const WATERMARK: u8 = 2;
const BARRIER: u8 = 3;
const EPOCH: u8 = 4;

/// The largest segment: a new one is started past it.
pub const MAX_SEGMENT_BYTES: u64 = 64 << 20;

/// The smallest segment a small bound gets.
pub const MIN_SEGMENT_BYTES: u64 = 64 << 10;

/// Limits of a [`Spill`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpillOptions {
    /// Most bytes the buffer keeps on disk.
    pub max_bytes: u64,
    /// The size at which a new segment is started.
    pub segment_bytes: u64,
}

impl SpillOptions {
    /// A bound of `max_bytes`, in segments of an eighth of it (at least
    /// [`MIN_SEGMENT_BYTES`], at most [`MAX_SEGMENT_BYTES`]): space comes
    /// back a segment at a time, so a segment must be small against the
    /// bound.
    pub fn new(max_bytes: u64) -> Self {
        Self {
            max_bytes,
            segment_bytes: (max_bytes / 8).clamp(MIN_SEGMENT_BYTES, MAX_SEGMENT_BYTES),
        }
    }
}

/// A message encoded for the buffer, ready to append (again, if the buffer
/// was full).
pub struct Record {
    payload: Vec<u8>,
    rows: u64,
}

impl Record {
    /// `message`, encoded.
    pub fn encode(message: &Message) -> Result<Record> {
        let (kind, rows, body) = match message {
            Message::Batch(batch) => (BATCH, batch.num_rows(), encode_batch(WHAT, batch)?),
            Message::Changes(batch, row_kind) => {
                let mut body = vec![row_kind_byte(*row_kind)];
                body.extend(encode_batch(WHAT, batch)?);
                (CHANGES, batch.num_rows(), body)
            }
            Message::Watermark(ms) => (WATERMARK, 0, ms.to_le_bytes().to_vec()),
            Message::Barrier(id) => (BARRIER, 0, id.to_le_bytes().to_vec()),
            Message::Epoch => (EPOCH, 0, Vec::new()),
        };
        let mut payload = Vec::with_capacity(PREFIX + body.len());
        payload.push(kind);
        payload.extend((rows as u64).to_le_bytes());
        payload.extend(body);
        if payload.len() > u32::MAX as usize {
            return Err(Error::Plan(format!(
                "a batch of {} bytes is too large for the {WHAT}",
                payload.len()
            )));
        }
        Ok(Record {
            payload,
            rows: rows as u64,
        })
    }

    /// Bytes it takes on disk.
    pub fn size(&self) -> u64 {
        (HEADER + self.payload.len()) as u64
    }

    /// Rows it holds.
    pub fn rows(&self) -> u64 {
        self.rows
    }
}

fn row_kind_byte(kind: RowKind) -> u8 {
    match kind {
        RowKind::Insert => 0,
        RowKind::Update => 1,
        RowKind::Early => 2,
    }
}

/// The message in a record's payload, read at `offset` of `path`.
fn decode(path: &Path, offset: u64, payload: &[u8]) -> Result<Message> {
    let bad = |why: &str| {
        Error::Connector(format!(
            "{WHAT} {} at offset {offset}: {why}",
            path.display()
        ))
    };
    if payload.len() < PREFIX {
        return Err(bad("a record too short for a message"));
    }
    let body = &payload[PREFIX..];
    let number = |body: &[u8]| -> Result<[u8; 8]> {
        body.try_into()
            .map_err(|_| bad("a marker of the wrong length"))
    };
    let at = offset as usize + HEADER + PREFIX;
    match payload[0] {
        BATCH => Ok(Message::Batch(decode_batch(WHAT, path, at, body)?)),
        CHANGES => {
            let kind = match body.first() {
                Some(0) => RowKind::Insert,
                Some(1) => RowKind::Update,
                Some(2) => RowKind::Early,
                _ => return Err(bad("an unknown row kind")),
            };
            let batch: RecordBatch = decode_batch(WHAT, path, at + 1, &body[1..])?;
            Ok(Message::Changes(batch, kind))
        }
        WATERMARK => Ok(Message::Watermark(i64::from_le_bytes(number(body)?))),
        BARRIER => Ok(Message::Barrier(u64::from_le_bytes(number(body)?))),
        EPOCH => Ok(Message::Epoch),
        kind => Err(bad(&format!("an unknown message kind {kind}"))),
    }
}

/// The rows a payload says it holds.
fn rows_of(payload: &[u8]) -> u64 {
    payload
        .get(1..PREFIX)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// The disk buffer of one query's input; see the [module docs](self).
/// Clones share the buffer: one side appends, the other reads.
#[derive(Clone)]
pub struct Spill {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    options: SpillOptions,
    state: Mutex<State>,
    /// The reader's open segment: its first sequence number and file.
    reading: Mutex<Option<(u64, File)>>,
}

struct State {
    /// Oldest first; never empty.
    segments: Vec<Segment>,
    /// Rows per segment, in the same order.
    rows: Vec<u64>,
    /// The last record appended (0 before the first ever).
    last_seq: u64,
    /// Bytes on disk, all segments.
    bytes: u64,
    /// The last record taken by the reader.
    head: u64,
    /// Where the record after `head` starts: in the segment whose first
    /// record is `read_segment`, at `read_offset`.
    read_segment: u64,
    read_offset: u64,
    /// Rows in the records after `head`.
    pending_rows: u64,
    /// Records up to this one are no longer needed.
    released: u64,
    /// The last segment, open for appending.
    active: Option<File>,
}

impl Spill {
    /// Opens (or creates) the buffer in `dir`, cutting a torn last record
    /// off (see [`super::frames`]); every record found is unread.
    pub fn open(dir: &Path, options: SpillOptions) -> Result<Spill> {
        fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
        let (mut segments, last_seq) = scan_log(WHAT, dir)?;
        if segments.is_empty() {
            let path = segment_path(dir, last_seq + 1);
            create_segment(&path)?;
            segments.push(Segment {
                path,
                first_seq: last_seq + 1,
                last_seq,
                bytes: 0,
            });
        }
        let first = segments[0].first_seq;
        let bytes = segments.iter().map(|s| s.bytes).sum();
        let spill = Spill {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                options,
                state: Mutex::new(State {
                    rows: vec![0; segments.len()],
                    segments,
                    last_seq,
                    bytes,
                    head: first - 1,
                    read_segment: first,
                    read_offset: 0,
                    pending_rows: 0,
                    released: 0,
                    active: None,
                }),
                reading: Mutex::new(None),
            }),
        };
        spill.count_rows()?;
        spill.read_from(first - 1)?;
        Ok(spill)
    }

    /// The folder it is in.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Its limits.
    pub fn options(&self) -> SpillOptions {
        self.inner.options
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts the rows of each segment found on open.
    fn count_rows(&self) -> Result<()> {
        let segments = self.lock().segments.clone();
        let mut rows = Vec::with_capacity(segments.len());
        for segment in &segments {
            let data = read_prefix(&segment.path, segment.bytes)?;
            let scan = scan_records(WHAT, &segment.path, &data, segment.first_seq, false)?;
            rows.push(
                scan.records
                    .iter()
                    .map(|(_, (start, end))| rows_of(&data[start + HEADER..*end]))
                    .sum(),
            );
        }
        self.lock().rows = rows;
        Ok(())
    }

    /// Appends `message`; its sequence number, or `None` when the buffer is
    /// full (nothing is written).
    pub fn append(&self, message: &Message) -> Result<Option<u64>> {
        self.append_record(&Record::encode(message)?)
    }

    /// True if `record` could ever be appended: it is no larger than the
    /// bound.
    pub fn fits(&self, record: &Record) -> bool {
        record.size() <= self.inner.options.max_bytes
    }

    /// Appends an encoded message; its sequence number, or `None` when the
    /// buffer is full.
    pub fn append_record(&self, record: &Record) -> Result<Option<u64>> {
        let size = record.size();
        let mut state = self.lock();
        if state.bytes + size > self.inner.options.max_bytes {
            return Ok(None);
        }
        let last = state.segments.last().expect("a buffer has a segment");
        if last.bytes > 0 && last.bytes + size > self.inner.options.segment_bytes {
            self.roll(&mut state)?;
        }
        let seq = state.last_seq + 1;
        if state.active.is_none() {
            let path = &state.segments.last().expect("a segment").path;
            state.active = Some(open_append(path)?);
        }
        let path = state.segments.last().expect("a segment").path.clone();
        let file = state.active.as_mut().expect("just opened");
        let written = file
            .write_all(&record_header(seq, &record.payload))
            .and_then(|()| file.write_all(&record.payload));
        if let Err(e) = written {
            // Cut back what was half written (best effort: a torn record
            // left is cut off on the next open).
            state.active = None;
            let durable = state.segments.last().expect("a segment").bytes;
            if let Ok(file) = fs::OpenOptions::new().write(true).open(&path) {
                let _ = file.set_len(durable);
            }
            return Err(Error::io(format!("writing {}", path.display()), e));
        }
        let segment = state.segments.last_mut().expect("a segment");
        segment.bytes += size;
        segment.last_seq = seq;
        *state.rows.last_mut().expect("a segment") += record.rows;
        state.bytes += size;
        state.last_seq = seq;
        state.pending_rows += record.rows;
        Ok(Some(seq))
    }

    /// Ends the last segment (fsynced) and starts the next.
    fn roll(&self, state: &mut State) -> Result<()> {
        if let Some(file) = state.active.take() {
            let last = state.segments.last().expect("a segment");
            sync(&file, &last.path)?;
        }
        let first_seq = state.last_seq + 1;
        let path = segment_path(&self.inner.dir, first_seq);
        create_segment(&path)?;
        state.segments.push(Segment {
            path,
            first_seq,
            last_seq: first_seq - 1,
            bytes: 0,
        });
        state.rows.push(0);
        Ok(())
    }

    /// Fsyncs what was appended.
    pub fn sync(&self) -> Result<()> {
        let state = self.lock();
        match (&state.active, state.segments.last()) {
            (Some(file), Some(segment)) => sync(file, &segment.path),
            _ => Ok(()),
        }
    }

    /// Takes the next message in order, with its sequence number; `None`
    /// when every record has been taken.
    pub fn pop(&self) -> Result<Option<(u64, Message)>> {
        let (seq, path, offset) = {
            let mut state = self.lock();
            if state.head >= state.last_seq {
                return Ok(None);
            }
            let seq = state.head + 1;
            let index = segment_index(&state, seq);
            let (first, path) = {
                let segment = &state.segments[index];
                (segment.first_seq, segment.path.clone())
            };
            if first != state.read_segment {
                state.read_segment = first;
                state.read_offset = 0;
            }
            (seq, path, state.read_offset)
        };
        let (length, message) = self.read_record(&path, seq, offset)?;
        let mut state = self.lock();
        state.head = seq;
        state.read_offset = offset + (HEADER + length) as u64;
        if let Message::Batch(b) | Message::Changes(b, _) = &message {
            state.pending_rows = state.pending_rows.saturating_sub(b.num_rows() as u64);
        }
        Ok(Some((seq, message)))
    }

    /// Reads record `seq`, which starts at `offset` of `path`: its payload
    /// length and message.
    fn read_record(&self, path: &Path, seq: u64, offset: u64) -> Result<(usize, Message)> {
        let bad = |why: &str| {
            Error::Connector(format!(
                "{WHAT} {} is damaged at offset {offset}: {why}",
                path.display()
            ))
        };
        let io = |e| Error::io(format!("cannot read {}", path.display()), e);
        let first = self.lock().read_segment;
        let mut reading = self.inner.reading.lock().unwrap_or_else(|e| e.into_inner());
        if reading.as_ref().is_none_or(|(f, _)| *f != first) {
            *reading = Some((first, File::open(path).map_err(io)?));
        }
        let file = &reading.as_ref().expect("just opened").1;
        let mut header = [0u8; HEADER];
        file.read_exact_at(&mut header, offset).map_err(io)?;
        let header = parse_header(&header).ok_or_else(|| bad("bad record header checksum"))?;
        if header.seq != seq {
            return Err(bad(&format!(
                "sequence number {} where {seq} was expected",
                header.seq
            )));
        }
        let mut payload = vec![0u8; header.length];
        file.read_exact_at(&mut payload, offset + HEADER as u64)
            .map_err(io)?;
        if crc32fast::hash(&payload) != header.payload_crc {
            return Err(bad("bad record checksum"));
        }
        Ok((header.length, decode(path, offset, &payload)?))
    }

    /// Sets the head to `seq`: the next [`Spill::pop`] gives the record
    /// after it. The records after `seq` must still be kept.
    pub fn read_from(&self, seq: u64) -> Result<()> {
        let (first, last) = {
            let state = self.lock();
            (state.segments[0].first_seq, state.last_seq)
        };
        if seq + 1 < first || seq > last {
            return Err(Error::Connector(format!(
                "{WHAT} {} holds records {first} to {last}; it cannot be read after record {seq}",
                self.inner.dir.display()
            )));
        }
        let segments = self.lock().segments.clone();
        let index = segments
            .iter()
            .rposition(|s| s.first_seq <= seq + 1)
            .unwrap_or(0);
        let segment = &segments[index];
        let data = read_prefix(&segment.path, segment.bytes)?;
        let scan = scan_records(WHAT, &segment.path, &data, segment.first_seq, false)?;
        let mut offset = scan.end as u64;
        let mut pending = 0;
        for (record, (start, end)) in &scan.records {
            if *record > seq {
                offset = offset.min(*start as u64);
                pending += rows_of(&data[start + HEADER..*end]);
            }
        }
        let mut state = self.lock();
        pending += state.rows[index + 1..].iter().sum::<u64>();
        state.head = seq;
        state.read_segment = segment.first_seq;
        state.read_offset = offset;
        state.pending_rows = pending;
        Ok(())
    }

    /// Records up to `seq` are no longer needed: deletes the segments whose
    /// records are all up to it and already taken. Space comes back a
    /// segment at a time; once everything is taken and released, the
    /// buffer starts a fresh segment.
    pub fn release_through(&self, seq: u64) -> Result<()> {
        let mut state = self.lock();
        state.released = state.released.max(seq);
        let done = state.released.min(state.head);
        while state.segments.len() > 1 && state.segments[0].last_seq <= done {
            let segment = state.segments.remove(0);
            state.rows.remove(0);
            state.bytes -= segment.bytes;
            remove(&segment.path)?;
        }
        let only = state.segments[0].clone();
        if only.bytes > 0 && only.last_seq <= done {
            state.active = None;
            let old = only.path;
            let first_seq = state.last_seq + 1;
            let path = segment_path(&self.inner.dir, first_seq);
            create_segment(&path)?;
            remove(&old)?;
            state.segments = vec![Segment {
                path,
                first_seq,
                last_seq: first_seq - 1,
                bytes: 0,
            }];
            state.rows = vec![0];
            state.bytes = 0;
        }
        Ok(())
    }

    /// Forgets every record: the buffer starts empty, its sequence numbers
    /// going on.
    pub fn clear(&self) -> Result<()> {
        let last = {
            let mut state = self.lock();
            let last = state.last_seq;
            state.head = last;
            state.pending_rows = 0;
            last
        };
        self.release_through(last)
    }

    /// The last record appended (0 before the first).
    pub fn last_seq(&self) -> u64 {
        self.lock().last_seq
    }

    /// The last record taken.
    pub fn head(&self) -> u64 {
        self.lock().head
    }

    /// True when every record has been taken.
    pub fn is_empty(&self) -> bool {
        let state = self.lock();
        state.head >= state.last_seq
    }

    /// Rows in the records not taken yet.
    pub fn len_rows(&self) -> u64 {
        self.lock().pending_rows
    }

    /// Bytes kept on disk (taken records not released yet included): what
    /// the bound counts.
    pub fn bytes(&self) -> u64 {
        self.lock().bytes
    }
}

/// The segment holding record `seq` (or the last, for the next to come).
fn segment_index(state: &State, seq: u64) -> usize {
    state
        .segments
        .iter()
        .position(|s| s.last_seq >= seq)
        .unwrap_or(state.segments.len() - 1)
}

fn remove(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("cannot delete {}", path.display()), e)),
    }
}

#[cfg(test)]
mod tests {
    use std::fs::OpenOptions;

    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn batch(n: i64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("n", DataType::Int64, false),
            Field::new("host", DataType::Utf8, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![n, n + 1, n + 2])),
                Arc::new(StringArray::from(vec![Some(format!("h{n}")), None, None])),
            ],
        )
        .unwrap()
    }

    /// A message as text, to compare.
    fn show(message: &Message) -> String {
        match message {
            Message::Batch(b) => {
                let n = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                format!("b{}", n.value(0))
            }
            Message::Changes(b, kind) => format!("c{:?}{}", kind, b.num_rows()),
            Message::Watermark(ms) => format!("w{ms}"),
            Message::Barrier(id) => format!("x{id}"),
            Message::Epoch => "e".into(),
        }
    }

    fn drain(spill: &Spill) -> Vec<(u64, String)> {
        let mut out = Vec::new();
        while let Some((seq, message)) = spill.pop().unwrap() {
            out.push((seq, show(&message)));
        }
        out
    }

    use super::super::frames::segment_count as segments;

    fn big() -> SpillOptions {
        SpillOptions::new(1 << 30)
    }

    #[test]
    fn messages_come_back_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let spill = Spill::open(dir.path(), big()).unwrap();
        let messages = [
            Message::Batch(batch(1)),
            Message::Barrier(7),
            Message::Changes(batch(2), RowKind::Update),
            Message::Watermark(-5),
            Message::Epoch,
            Message::Batch(batch(3)),
        ];
        for (i, m) in messages.iter().enumerate() {
            assert_eq!(spill.append(m).unwrap(), Some(i as u64 + 1));
        }
        assert_eq!(spill.len_rows(), 9);
        assert!(!spill.is_empty());
        let first = spill.pop().unwrap().unwrap();
        assert_eq!(first.0, 1);
        let Message::Batch(b) = first.1 else {
            panic!("not a batch")
        };
        assert_eq!(b, batch(1), "a batch comes back whole, with its nulls");
        assert_eq!(spill.len_rows(), 6);
        assert_eq!(
            drain(&spill),
            [
                (2, "x7".to_string()),
                (3, "cUpdate3".into()),
                (4, "w-5".into()),
                (5, "e".into()),
                (6, "b3".into()),
            ]
        );
        assert!(spill.is_empty());
        assert_eq!(spill.len_rows(), 0);
        assert!(spill.pop().unwrap().is_none());
        spill.append(&Message::Batch(batch(4))).unwrap();
        assert_eq!(drain(&spill), [(7, "b4".to_string())]);
    }

    #[test]
    fn a_full_buffer_refuses_appends_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let record = Record::encode(&Message::Batch(batch(1))).unwrap().size();
        let options = SpillOptions {
            max_bytes: 3 * record + record / 2,
            segment_bytes: record,
        };
        let spill = Spill::open(dir.path(), options).unwrap();
        for n in 1..=3 {
            assert!(spill.append(&Message::Batch(batch(n))).unwrap().is_some());
        }
        assert_eq!(spill.append(&Message::Batch(batch(4))).unwrap(), None);
        assert_eq!((spill.bytes(), spill.last_seq()), (3 * record, 3));
        // Taken is not released: the bytes stay.
        spill.pop().unwrap();
        assert_eq!(spill.append(&Message::Batch(batch(4))).unwrap(), None);
        spill.release_through(1).unwrap();
        assert_eq!(spill.bytes(), 2 * record);
        assert_eq!(spill.append(&Message::Batch(batch(4))).unwrap(), Some(4));
        assert_eq!(
            drain(&spill),
            [(2, "b2".to_string()), (3, "b3".into()), (4, "b4".into())]
        );
        let huge = Record::encode(&Message::Batch(batch(9))).unwrap();
        assert!(spill.fits(&huge));
        let tiny = Spill::open(
            &dir.path().join("tiny"),
            SpillOptions {
                max_bytes: 10,
                segment_bytes: 10,
            },
        )
        .unwrap();
        assert!(!tiny.fits(&huge));
    }

    #[test]
    fn segments_roll_over_and_go_once_read_and_released() {
        let dir = tempfile::tempdir().unwrap();
        let record = Record::encode(&Message::Batch(batch(1))).unwrap().size();
        let options = SpillOptions {
            max_bytes: 1 << 30,
            segment_bytes: 2 * record,
        };
        let spill = Spill::open(dir.path(), options).unwrap();
        for n in 1..=10 {
            spill.append(&Message::Batch(batch(n))).unwrap();
        }
        assert_eq!(segments(dir.path()), 5);
        // Released but not read: nothing goes.
        spill.release_through(10).unwrap();
        assert_eq!(segments(dir.path()), 5);
        for _ in 0..5 {
            spill.pop().unwrap();
        }
        spill.release_through(10).unwrap();
        assert_eq!(segments(dir.path()), 3, "the segments read through go");
        assert_eq!(spill.bytes(), 6 * record);
        assert_eq!(spill.len_rows(), 15);
        drain(&spill);
        spill.release_through(10).unwrap();
        assert_eq!((segments(dir.path()), spill.bytes()), (1, 0));
        assert_eq!(spill.append(&Message::Epoch).unwrap(), Some(11));
        drop(spill);
        let spill = Spill::open(dir.path(), options).unwrap();
        assert_eq!(drain(&spill), [(11, "e".to_string())], "numbers go on");
    }

    #[test]
    fn a_reopened_buffer_reads_from_a_position() {
        let dir = tempfile::tempdir().unwrap();
        let record = Record::encode(&Message::Batch(batch(1))).unwrap().size();
        let options = SpillOptions {
            max_bytes: 1 << 30,
            segment_bytes: 3 * record,
        };
        let spill = Spill::open(dir.path(), options).unwrap();
        for n in 1..=8 {
            spill.append(&Message::Batch(batch(n * 10))).unwrap();
        }
        spill.sync().unwrap();
        let seen = drain(&spill);
        assert_eq!(seen.len(), 8);
        drop(spill);

        let spill = Spill::open(dir.path(), options).unwrap();
        assert_eq!(spill.len_rows(), 24, "everything found is unread");
        spill.read_from(4).unwrap();
        assert_eq!(spill.len_rows(), 12);
        assert_eq!(drain(&spill), seen[4..]);
        // Across a segment boundary, and at the very end.
        spill.read_from(2).unwrap();
        assert_eq!(drain(&spill), seen[2..]);
        spill.read_from(8).unwrap();
        assert!(spill.pop().unwrap().is_none());
        // Released records cannot be read again.
        spill.release_through(6).unwrap();
        let err = spill.read_from(1).unwrap_err().to_string();
        assert!(err.contains("cannot be read after record 1"), "{err}");
        spill.read_from(6).unwrap();
        assert_eq!(drain(&spill), seen[6..]);
    }

    #[test]
    fn a_torn_last_record_is_cut_off_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let spill = Spill::open(dir.path(), big()).unwrap();
        for n in 1..=3 {
            spill.append(&Message::Batch(batch(n))).unwrap();
        }
        drop(spill);
        let path = segment_path(dir.path(), 1);
        let length = fs::metadata(&path).unwrap().len();
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(length - 7).unwrap();
        drop(file);
        let spill = Spill::open(dir.path(), big()).unwrap();
        assert_eq!(
            drain(&spill),
            [(1, "b1".to_string()), (2, "b2".into())],
            "the torn record is gone"
        );
        assert_eq!(spill.len_rows(), 0);
        assert_eq!(spill.append(&Message::Barrier(1)).unwrap(), Some(3));
        drop(spill);
        // Zeros where the next header should be: allocated, never written.
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(&[0; 64]).unwrap();
        drop(file);
        let spill = Spill::open(dir.path(), big()).unwrap();
        assert_eq!(spill.last_seq(), 3);
        spill.read_from(2).unwrap();
        assert_eq!(drain(&spill), [(3, "x1".to_string())]);
    }

    #[test]
    fn damage_before_the_tail_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let spill = Spill::open(dir.path(), big()).unwrap();
        for n in 1..=3 {
            spill.append(&Message::Batch(batch(n))).unwrap();
        }
        drop(spill);
        let path = segment_path(dir.path(), 1);
        let mut data = fs::read(&path).unwrap();
        data[HEADER + 12] ^= 0x40;
        fs::write(&path, data).unwrap();
        let err = Spill::open(dir.path(), big()).err().unwrap().to_string();
        assert_eq!(
            err,
            format!(
                "disk buffer {} is damaged at offset 0: bad record checksum",
                path.display()
            )
        );
    }

    #[test]
    fn clearing_starts_empty_with_numbers_going_on() {
        let dir = tempfile::tempdir().unwrap();
        let spill = Spill::open(dir.path(), big()).unwrap();
        for n in 1..=3 {
            spill.append(&Message::Batch(batch(n))).unwrap();
        }
        drop(spill);
        let spill = Spill::open(dir.path(), big()).unwrap();
        spill.clear().unwrap();
        assert!(spill.is_empty());
        assert_eq!((spill.bytes(), spill.len_rows()), (0, 0));
        assert_eq!(spill.append(&Message::Batch(batch(4))).unwrap(), Some(4));
        assert_eq!(drain(&spill), [(4, "b4".to_string())]);
    }
}
