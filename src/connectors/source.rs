//! Reading a stream's rows from a CSV or JSONL file (or stdin) into Arrow
//! batches.
//!
//! Every emitted batch has exactly the stream's declared schema. Rows are
//! all-or-nothing: a row is parsed completely before anything is appended, so
//! a malformed row never leaves a partial value behind. Malformed rows are
//! skipped, recorded in [`SourceStats`] with their 1-based physical line
//! number, and appended to the dead-letter file when one is configured, as one
//! line each: `<line>\t<reason>\t<raw row>` (newlines inside the raw row are
//! written as `\n`).
//!
//! Both formats are line-oriented: a JSON row is one line, and a CSV record
//! ends at its newline unless the stream allows multi-line quoted fields
//! (`multiline`), so a stray quote costs its own line and no more. A bad
//! record that spans lines is one bad row per line. Event times pass the
//! checks of the `guard` module (`max_future`, `ts_unit`) before they
//! reach the watermark.
//!
//! A file read to its end can be decoded by several threads
//! ([`SourceConfig::decode_threads`], see the `parallel` module): its lines
//! are cut into chunks decoded at once and taken in file order, so that
//! everything above holds as with one thread.
//!
//! A regular file can be read again from a position ([`SourcePosition`]):
//! before each batch goes out, the reader stores where it stands after it,
//! with what the decoder keeps that later rows depend on, and
//! [`read_source_from`] takes up from there, row for row as the
//! uninterrupted read would have gone on. The dead-letter file is flushed
//! before each batch, so that it holds the bad rows of every stored
//! position; bad rows met after the last checkpoint are written to it
//! again by the resumed read (it is appended to, never cut back: two
//! streams may share it).

use std::cell::Cell;
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use datafusion::arrow::array::{
    ArrayRef, BooleanBuilder, Float64Builder, Int64Builder, StringBuilder,
    TimestampMillisecondBuilder,
};
use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::guard::{Admit, FutureGuard, GuardState, JUMP_ROWS, UnitCheck, UnitState};
use super::timestamp::{is_epoch_number, parse_timestamp};
use super::{
    BadRow, Decoding, Format, Replay, SourceConfig, SourceLocation, SourcePosition, SourceStats,
    TsUnit,
};
use crate::error::{Error, Result};

mod nested;
mod parallel;

/// Size of the read buffer for files and stdin.
const READ_BUFFER: usize = 1 << 16;

/// How often a followed file is checked for new bytes, and the longest a
/// pause (realtime replay, following) goes without looking at `stop`.
pub(super) const POLL: Duration = Duration::from_millis(100);

/// Longest value text quoted in a bad-row reason.
const MAX_QUOTED_CHARS: usize = 40;

/// Reads the source described by `config` to its end, calling `emit` with
/// each batch of at most `config.batch_size` rows. A regular file with
/// `config.follow` has no end: at its end the reader waits for more bytes
/// (a partial last line waits for its newline) until `stats.stop` is set.
///
/// Synchronous; meant to run on a blocking thread. Stops early (with `Ok`)
/// as soon as `emit` returns `false`. `stats.rows` counts emitted rows;
/// malformed rows go to `stats.record_bad` and the dead-letter file.
///
/// With [`Replay::Realtime`] and an event-time column, the gaps between rows'
/// event times are replayed as wall-clock pauses divided by the speed factor;
/// pending rows are emitted before each pause. When reading stdin, pending
/// rows are also emitted whenever the input has nothing more available yet,
/// so piped live data is not held back until a batch fills up.
///
/// Errors: a missing or unreadable file (`cannot open <path>: ...`), an
/// event-time column absent from the CSV header (other absent columns read
/// as NULL, with a warning on stderr), a CSV header whose quote is not
/// closed, an unsupported column type, a read error, or a failure to write
/// the dead-letter file.
///
/// A connector that reads by itself (`host`, `demo`, ...) is read by its
/// own module, through [`SourceRead`](super::registry::SourceRead).
pub fn read_source(
    config: &SourceConfig,
    stats: &SourceStats,
    emit: &mut dyn FnMut(RecordBatch) -> bool,
) -> Result<()> {
    read_source_from(config, stats, None, emit)
}

/// Reads like [`read_source`], from `start` on when it is given: a
/// position this source stored in [`SourceStats::position`] in an earlier
/// run. The resumed read emits exactly the rows the earlier one would have
/// emitted after that position, with the same bad rows at the same line
/// numbers, and starts `stats`' counters (rows, bad rows) where they were,
/// so that a summary counts the whole run.
///
/// Positions, and so checkpoints: before every call of `emit` the source
/// stores where it stands just after the rows of that batch (see
/// [`SourcePosition`] for what the fields mean for each source). stdin, a
/// pipe and `host` cannot be read again and store none; a `start` for them
/// is an error.
///
/// A source that waits (a followed file that has not grown, a realtime
/// pause, the pacing of `demo` and `host`) calls `emit` with an empty batch
/// (no rows, the stream's schema) at least every 100 ms, after storing its
/// position, so that the caller can act between batches; `false` still
/// stops it.
///
/// Resuming a file: the file must still hold the bytes before the position
/// (a shorter file is an error naming the file, the offset and its size);
/// a CSV file's header is read again for its column order. A followed file
/// remembers which file it was (device and inode): if the path names
/// another file by then (it was rotated while vigil was down), the new file
/// is read from its start, with a warning, and what the old file got after
/// the checkpoint is not read.
pub fn read_source_from(
    config: &SourceConfig,
    stats: &SourceStats,
    start: Option<&SourcePosition>,
    emit: &mut dyn FnMut(RecordBatch) -> bool,
) -> Result<()> {
    match &config.location {
        SourceLocation::File(path) => read_file(config, path, stats, start, emit),
        SourceLocation::Stdin => {
            if start.is_some() {
                return Err(not_replayable(&config.stream, "stdin"));
            }
            let mut driver = Driver::new(config, stats, emit)?;
            let stdin = io::stdin();
            let lock = stdin.lock();
            read_format(
                config.format,
                Input::new(lock, "<stdin>", true),
                &mut driver,
                None,
            )
        }
        SourceLocation::Push => Err(Error::Connector(format!(
            "stream {} is fed by its program (connector 'push'): embed vigil or use `vigil serve` to push rows into it",
            config.stream
        ))),
        SourceLocation::Connector(reader) => reader.0.read(config, stats, start, emit),
    }
}

fn not_replayable(stream: &str, what: &str) -> Error {
    Error::Connector(format!(
        "stream {stream} reads {what}, which cannot be read again: it cannot resume from a checkpoint"
    ))
}

/// Reads a file (or a pipe named by a path), from `start` on if given.
fn read_file(
    config: &SourceConfig,
    path: &Path,
    stats: &SourceStats,
    start: Option<&SourcePosition>,
    emit: &mut dyn FnMut(RecordBatch) -> bool,
) -> Result<()> {
    let mut driver = Driver::new(config, stats, emit)?;
    let name = path.display().to_string();
    let mut file =
        File::open(path).map_err(|e| Error::Connector(format!("cannot open {name}: {e}")))?;
    let meta = file
        .metadata()
        .map_err(|e| Error::io(format!("reading {name}"), e))?;
    // A pipe or socket is read like stdin: rows go on as soon as a read
    // comes back short, not when a batch fills. It cannot be read again.
    let regular = meta.file_type().is_file();
    let follow = config.follow && regular;
    driver.replayable = regular;
    let (offset, line) = match start {
        None => (0, 0),
        Some(_) if !regular => return Err(not_replayable(&config.stream, &name)),
        Some(position) => {
            let recorded = driver.restore(position)?;
            resume_point(
                &config.stream,
                &name,
                &meta,
                position,
                follow.then_some(recorded),
            )?
        }
    };
    let header = match (config.format, offset) {
        (Format::Csv, 1..) => {
            read_csv_header(Input::new(&file, &name, false), &mut driver, offset)?
        }
        _ => None,
    };
    if offset > 0 {
        file.seek(SeekFrom::Start(offset))
            .map_err(|e| Error::io(format!("reading {name}"), e))?;
    }
    if follow {
        let opened = Opened::new(file_id(&meta));
        let follow = Follow::new(
            file,
            path.to_path_buf(),
            &config.stream,
            &stats.stop,
            &opened,
            offset,
        );
        let input = Input::new(follow, &name, true)
            .following(&opened)
            .starting_at(offset, line);
        return read_format(config.format, input, &mut driver, header);
    }
    let input = Input::new(file, &name, !regular).starting_at(offset, line);
    read_format(config.format, input, &mut driver, header)
}

/// Where a resumed read of a file starts: `position`'s offset and line,
/// or the start of a followed file that is not the one recorded
/// (`recorded`: `Some` when following). Errors if the file is shorter than
/// the position.
fn resume_point(
    stream: &str,
    name: &str,
    meta: &std::fs::Metadata,
    position: &SourcePosition,
    recorded: Option<Option<FileId>>,
) -> Result<(u64, u64)> {
    if let Some(Some(recorded)) = recorded
        && file_id(meta) != Some(recorded)
    {
        crate::diag::warning!(
            "stream {stream}: {name} is another file than at the checkpoint \
             (rotated meanwhile): reading it from its start; what the old file got after \
             the checkpoint is not read"
        );
        return Ok((0, 0));
    }
    if meta.len() < position.offset {
        return Err(Error::Connector(format!(
            "stream {stream}: cannot resume {name} at byte {} of the checkpoint: the file has only \
             {} bytes (truncated or replaced since)",
            position.offset,
            meta.len()
        )));
    }
    Ok((position.offset, position.line))
}

/// Parses `bytes` (CSV with a header, or JSON lines, as `format` says) into
/// batches of the stream's schema, as [`read_source`] reads a file: `emit`
/// gets the batches, malformed rows are counted in `stats` with their line
/// numbers. Used for rows pushed into a stream.
pub fn read_bytes(
    config: &SourceConfig,
    format: Format,
    bytes: &[u8],
    stats: &SourceStats,
    emit: &mut dyn FnMut(RecordBatch) -> bool,
) -> Result<()> {
    let mut driver = Driver::new(config, stats, emit)?;
    // A push is small: threads would cost more than they save.
    driver.threads = 1;
    read_format(
        format,
        Input::new(bytes, "<pushed rows>", false),
        &mut driver,
        None,
    )
}

/// The message a line of [`read_messages`]' input was made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageOrigin {
    /// Where it is, for bad rows and the dead-letter file: `partition 2
    /// offset 17`.
    pub at: String,
    /// The number a bad row's [`BadRow::line`] gets (a message's offset).
    pub line: u64,
    /// The message as it came, for the dead-letter file.
    pub raw: Vec<u8>,
}

/// Decodes like [`read_bytes`] input that a message source (Kafka) made
/// of its messages, one line each (after a CSV header line): a bad row is
/// recorded and dead-lettered as the message `origin` says line `n` (1-based)
/// was, with the message's own bytes.
pub fn read_messages(
    config: &SourceConfig,
    format: Format,
    bytes: &[u8],
    stats: &SourceStats,
    origin: &dyn Fn(u64) -> MessageOrigin,
    emit: &mut dyn FnMut(RecordBatch) -> bool,
) -> Result<()> {
    let mut driver = Driver::new(config, stats, emit)?;
    driver.threads = 1;
    driver.origin = Some(origin);
    // Messages are live data decoded a poll at a time, like pushed rows:
    // judged against the wall clock, and no unit warning per poll.
    driver.guard = match (config.event_time, config.decode.max_future_ms) {
        (Some(_), Some(max_ahead)) => Some(FutureGuard::new(max_ahead, true)),
        _ => None,
    };
    driver.unit_check = None;
    read_format(
        format,
        Input::new(bytes, "<messages>", false),
        &mut driver,
        None,
    )
}

/// Decodes `input`; `header` is the CSV header when a resumed read starts
/// past it.
fn read_format<R: Read>(
    format: Format,
    input: Input<'_, R>,
    driver: &mut Driver<'_>,
    header: Option<CsvHeader>,
) -> Result<()> {
    let result = match format {
        Format::Csv => read_csv(input, driver, header),
        Format::Jsonl => read_jsonl(input, driver),
    };
    // Close the dead-letter file even when reading failed.
    let closed = driver.close_dead_letter();
    result.and(closed)
}

/// A point in a decoder's input: just past a line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Mark {
    /// Bytes of the current file before this point.
    offset: u64,
    /// The number of the line that ends here (0 before the first).
    line: u64,
    /// The followed file the offset is in.
    file: Option<FileId>,
}

/// A line just read: its number, and the points before and after it.
#[derive(Debug, Clone, Copy)]
struct LineAt {
    number: u64,
    before: Mark,
    after: Mark,
}

/// What reading a line gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// A line; `new_file` when it is the first of a file opened again.
    Line { new_file: bool },
    /// A followed file has nothing new for now.
    Idle,
    /// The end of the input.
    End,
}

/// The input of a decoder: its physical lines, numbered from 1.
struct Input<'a, R> {
    reader: BufReader<Tracked<R>>,
    /// Name for messages: the path, `<stdin>` or `<pushed rows>`.
    name: &'a str,
    /// Live input: pending rows go on whenever it runs dry.
    live: bool,
    /// The number of the last line read.
    line: u64,
    /// Bytes of the current file handed out in lines, and where the last
    /// line started.
    offset: u64,
    line_start: u64,
    /// A followed file: how often it was opened again (a change starts a
    /// new file, numbered from 1 again) and which file is open.
    opened: Option<&'a Opened>,
    seen_reopened: u64,
    file: Option<FileId>,
    /// The length of the last line read, when it was longer than the
    /// limit it was read with.
    overlong: Option<u64>,
}

impl<'a, R: Read> Input<'a, R> {
    fn new(input: R, name: &'a str, live: bool) -> Self {
        Input {
            reader: BufReader::with_capacity(READ_BUFFER, Tracked::new(input)),
            name,
            live,
            line: 0,
            offset: 0,
            line_start: 0,
            opened: None,
            seen_reopened: 0,
            file: None,
            overlong: None,
        }
    }

    fn following(mut self, opened: &'a Opened) -> Self {
        self.opened = Some(opened);
        self.seen_reopened = opened.count.get();
        self.file = opened.file.get();
        self
    }

    /// Counts lines and bytes from a resumed position: `input` starts at
    /// byte `offset`, just after line `line`.
    fn starting_at(mut self, offset: u64, line: u64) -> Self {
        self.offset = offset;
        self.line_start = offset;
        self.line = line;
        self
    }

    /// Reads the next line, its terminator included, into `buf` (cleared
    /// first). A line longer than `limit` bytes keeps only its first
    /// `limit` bytes in `buf` (the rest is read past, never held) and is
    /// [`Input::overlong`].
    fn next_line(&mut self, buf: &mut Vec<u8>, limit: usize) -> Result<Next> {
        buf.clear();
        self.overlong = None;
        let mut length = 0u64;
        loop {
            let available = match self.reader.fill_buf() {
                Ok(available) => available,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // A followed file waits between lines, never inside one;
                // were it otherwise, the line would go on being read.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if length == 0 {
                        return Ok(Next::Idle);
                    }
                    continue;
                }
                Err(e) => return Err(Error::io(format!("reading {}", self.name), e)),
            };
            if available.is_empty() {
                break;
            }
            let (take, ends) = match memchr::memchr(b'\n', available) {
                Some(i) => (i + 1, true),
                None => (available.len(), false),
            };
            let room = limit.saturating_sub(buf.len()).min(take);
            buf.extend_from_slice(&available[..room]);
            self.reader.consume(take);
            length += take as u64;
            if ends {
                break;
            }
        }
        if length > limit as u64 {
            self.overlong = Some(length);
        }
        if length == 0 {
            return Ok(Next::End);
        }
        // A followed file hands out whole lines only, so a reopening falls
        // between two lines: this one is the new file's first.
        let new_file = match self.opened {
            Some(opened) if opened.count.get() != self.seen_reopened => {
                self.seen_reopened = opened.count.get();
                self.file = opened.file.get();
                self.line = 0;
                self.offset = 0;
                true
            }
            _ => false,
        };
        self.line += 1;
        self.line_start = self.offset;
        self.offset += length;
        Ok(Next::Line { new_file })
    }

    /// The line just read.
    fn at(&self) -> LineAt {
        LineAt {
            number: self.line,
            before: Mark {
                offset: self.line_start,
                line: self.line.saturating_sub(1),
                file: self.file,
            },
            after: Mark {
                offset: self.offset,
                line: self.line,
                file: self.file,
            },
        }
    }

    /// Whether live input has nothing more available right now, so the
    /// next read may block.
    fn dry(&self) -> bool {
        self.live && self.reader.buffer().is_empty() && self.reader.get_ref().short
    }
}

/// Splits a line into its content and its terminator (`\n`, `\r\n`, or
/// nothing at the end of the input; a lone `\r` there counts too).
fn split_terminator(line: &[u8]) -> (&[u8], &[u8]) {
    let cut = if line.ends_with(b"\r\n") {
        2
    } else {
        usize::from(line.ends_with(b"\n") || line.ends_with(b"\r"))
    };
    line.split_at(line.len() - cut)
}

/// The value kinds a source can produce, one per supported column type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Timestamp,
    Text,
    Float,
    Int,
    Bool,
    /// A struct, list or map (see the `nested` module), held as its JSON
    /// text.
    Nested,
}

impl Kind {
    fn of(data_type: &DataType) -> Option<Kind> {
        match data_type {
            DataType::Timestamp(TimeUnit::Millisecond, _) => Some(Kind::Timestamp),
            DataType::Utf8 => Some(Kind::Text),
            DataType::Float64 => Some(Kind::Float),
            DataType::Int64 => Some(Kind::Int),
            DataType::Boolean => Some(Kind::Bool),
            _ if nested::is_nested(data_type) => Some(Kind::Nested),
            _ => None,
        }
    }

    fn sql_name(self) -> &'static str {
        match self {
            Kind::Timestamp => "TIMESTAMP",
            Kind::Text => "TEXT",
            Kind::Float => "DOUBLE",
            Kind::Int => "BIGINT",
            Kind::Bool => "BOOLEAN",
            Kind::Nested => "a nested value",
        }
    }
}

/// One parsed field. Text is a byte range into a per-row text buffer (the
/// CSV record or the JSON text arena) so that parsing allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Val {
    Null,
    /// An integer, or a timestamp in epoch milliseconds.
    Int(i64),
    Float(f64),
    Bool(bool),
    Text(usize, usize),
}

enum ColBuilder {
    Timestamp(TimestampMillisecondBuilder),
    Text(StringBuilder),
    Float(Float64Builder),
    Int(Int64Builder),
    Bool(BooleanBuilder),
    Nested(nested::NestedBuilder),
}

/// Accumulates rows into Arrow builders for one schema.
struct Batcher {
    schema: SchemaRef,
    /// The unit of numeric timestamps inside nested values.
    unit: TsUnit,
    kinds: Vec<Kind>,
    nullable: Vec<bool>,
    event_time: Option<usize>,
    builders: Vec<ColBuilder>,
    len: usize,
    capacity: usize,
}

impl Batcher {
    fn new(config: &SourceConfig) -> Result<Batcher> {
        let mut kinds = Vec::new();
        for field in config.schema.fields() {
            let kind = Kind::of(field.data_type()).ok_or_else(|| {
                Error::Connector(format!(
                    "stream {}: column {} has type {}, which sources cannot read \
                     (supported: TIMESTAMP, TEXT, DOUBLE, BIGINT, BOOLEAN, and STRUCT, \
                     ARRAY and MAP<TEXT, ...> of them)",
                    config.stream,
                    field.name(),
                    crate::types::sql_name(field.data_type())
                ))
            })?;
            kinds.push(kind);
        }
        let capacity = config.batch_size.clamp(1, 1 << 16);
        let mut batcher = Batcher {
            schema: config.schema.clone(),
            unit: config.decode.ts_unit,
            nullable: config
                .schema
                .fields()
                .iter()
                .map(|f| f.is_nullable())
                .collect(),
            kinds,
            event_time: config.event_time,
            builders: Vec::new(),
            len: 0,
            capacity,
        };
        batcher.builders = batcher.fresh_builders();
        Ok(batcher)
    }

    fn fresh_builders(&self) -> Vec<ColBuilder> {
        let cap = self.capacity;
        self.kinds
            .iter()
            .zip(self.schema.fields())
            .map(|(k, field)| match k {
                Kind::Timestamp => {
                    ColBuilder::Timestamp(TimestampMillisecondBuilder::with_capacity(cap))
                }
                Kind::Text => ColBuilder::Text(StringBuilder::with_capacity(cap, cap * 8)),
                Kind::Float => ColBuilder::Float(Float64Builder::with_capacity(cap)),
                Kind::Int => ColBuilder::Int(Int64Builder::with_capacity(cap)),
                Kind::Bool => ColBuilder::Bool(BooleanBuilder::with_capacity(cap)),
                Kind::Nested => ColBuilder::Nested(nested::NestedBuilder::new(
                    field.data_type(),
                    self.unit,
                    cap,
                )),
            })
            .collect()
    }

    /// Checks the row-level rules that single fields cannot: NULL in a
    /// non-nullable column, and a missing event time.
    fn check(&self, vals: &[Val]) -> std::result::Result<(), String> {
        for (i, v) in vals.iter().enumerate() {
            if *v == Val::Null {
                let name = self.schema.field(i).name();
                if self.event_time == Some(i) {
                    return Err(format!("column {name}: missing event time"));
                }
                if !self.nullable[i] {
                    return Err(format!("column {name}: missing value"));
                }
            }
        }
        Ok(())
    }

    /// Appends one complete, checked row; text ranges index into `text`.
    fn push(&mut self, vals: &[Val], text: &[u8]) {
        for (builder, val) in self.builders.iter_mut().zip(vals) {
            match (builder, *val) {
                (ColBuilder::Timestamp(b), Val::Int(x)) => b.append_value(x),
                (ColBuilder::Int(b), Val::Int(x)) => b.append_value(x),
                (ColBuilder::Float(b), Val::Float(x)) => b.append_value(x),
                (ColBuilder::Bool(b), Val::Bool(x)) => b.append_value(x),
                (ColBuilder::Text(b), Val::Text(start, end)) => {
                    b.append_value(std::str::from_utf8(&text[start..end]).unwrap_or_default())
                }
                (ColBuilder::Nested(b), Val::Text(start, end)) => b.append_text(&text[start..end]),
                (ColBuilder::Timestamp(b), _) => b.append_null(),
                (ColBuilder::Int(b), _) => b.append_null(),
                (ColBuilder::Float(b), _) => b.append_null(),
                (ColBuilder::Bool(b), _) => b.append_null(),
                (ColBuilder::Text(b), _) => b.append_null(),
                (ColBuilder::Nested(b), _) => b.append_null(),
            }
        }
        self.len += 1;
    }

    /// Finishes the pending rows into a batch (None when there are none).
    fn take(&mut self) -> Result<Option<RecordBatch>> {
        if self.len == 0 {
            return Ok(None);
        }
        let fields = self.schema.fields();
        let columns: Vec<ArrayRef> = self
            .builders
            .iter_mut()
            .zip(fields.iter())
            .map(|(b, field)| -> Result<ArrayRef> {
                Ok(match b {
                    ColBuilder::Timestamp(b) => {
                        let tz = match field.data_type() {
                            DataType::Timestamp(_, tz) => tz.clone(),
                            _ => None,
                        };
                        Arc::new(b.finish().with_timezone_opt(tz))
                    }
                    ColBuilder::Text(b) => Arc::new(b.finish()),
                    ColBuilder::Float(b) => Arc::new(b.finish()),
                    ColBuilder::Int(b) => Arc::new(b.finish()),
                    ColBuilder::Bool(b) => Arc::new(b.finish()),
                    ColBuilder::Nested(b) => b.finish()?,
                })
            })
            .collect::<Result<_>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(self.len));
        self.len = 0;
        let batch = RecordBatch::try_new_with_options(self.schema.clone(), columns, &options)?;
        Ok(Some(batch))
    }
}

/// Most a followed file is read ahead of what was handed out.
const FOLLOW_READ_AHEAD: usize = 1 << 20;

/// A regular file read `tail -F` style: at its end, a read waits for more
/// bytes instead of returning 0, until `stop` is set.
///
/// Only whole lines are handed out: a partial last line is held back until
/// its newline arrives. So the reader never waits in the middle of a row
/// (a quoted CSV field spanning lines aside), and the rows it holds go on
/// before it waits for more. The last read of what the file has comes back
/// short, which tells the reader that nothing more is available for now.
///
/// The file is followed by name: when the path names another file (log
/// rotation by rename and create) or the file shrinks (truncation), what
/// is left of the old file is handed out, a partial last line completed
/// with a newline, and then the path is opened again and read from its
/// start. Each reopening is said on stderr and counted in `opened`, which
/// tells the decoder that a new file (and for CSV a new header) begins.
///
/// At its end, a read sleeps for [`POLL`] and then fails with
/// `WouldBlock`, so that the decoder can tell that it waits (and emit an
/// empty batch) between two polls.
struct Follow<'a> {
    file: File,
    path: PathBuf,
    stream: &'a str,
    /// Bytes read from the file and not yet handed out start at `start`;
    /// those before `ready` end with a newline.
    buf: Vec<u8>,
    start: usize,
    ready: usize,
    /// Bytes read from the file so far.
    size: u64,
    stop: &'a AtomicBool,
    opened: &'a Opened,
}

/// What a followed file tells its decoder.
#[derive(Debug, Default)]
struct Opened {
    /// How many times the path was opened again.
    count: Cell<u64>,
    /// The file open now.
    file: Cell<Option<FileId>>,
}

impl Opened {
    fn new(file: Option<FileId>) -> Self {
        Opened {
            count: Cell::new(0),
            file: Cell::new(file),
        }
    }
}

/// A file's identity: its device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct FileId {
    dev: u64,
    ino: u64,
}

/// The identity of the file `meta` describes; `None` on systems without
/// inodes (where only truncation is noticed).
#[cfg(unix)]
fn file_id(meta: &std::fs::Metadata) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    Some(FileId {
        dev: meta.dev(),
        ino: meta.ino(),
    })
}

#[cfg(not(unix))]
fn file_id(_: &std::fs::Metadata) -> Option<FileId> {
    None
}

/// Why a followed file is opened again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rotation {
    /// The path now names another file.
    Replaced,
    /// The file is shorter than what was read from it.
    Truncated,
}

impl<'a> Follow<'a> {
    fn new(
        file: File,
        path: PathBuf,
        stream: &'a str,
        stop: &'a AtomicBool,
        opened: &'a Opened,
        offset: u64,
    ) -> Self {
        Follow {
            file,
            path,
            stream,
            buf: Vec::new(),
            start: 0,
            ready: 0,
            size: offset,
            stop,
            opened,
        }
    }

    /// Reads what the file has now (up to [`FOLLOW_READ_AHEAD`]); false
    /// when it has nothing new.
    fn fill(&mut self) -> io::Result<bool> {
        self.buf.drain(..self.start);
        self.ready -= self.start;
        self.start = 0;
        let before = self.buf.len();
        while self.buf.len() < before + FOLLOW_READ_AHEAD {
            let at = self.buf.len();
            self.buf.resize(at + READ_BUFFER, 0);
            let n = self.file.read(&mut self.buf[at..])?;
            self.buf.truncate(at + n);
            if n == 0 {
                break;
            }
        }
        let got = self.buf.len() - before;
        self.size += got as u64;
        if let Some(newline) = self.buf[self.ready..].iter().rposition(|&b| b == b'\n') {
            self.ready += newline + 1;
        }
        if got > 0 {
            return Ok(true);
        }
        let Some(rotation) = self.rotation()? else {
            return Ok(false);
        };
        if self.ready < self.buf.len() {
            // The old file's last line has no newline and never will.
            self.buf.push(b'\n');
            self.ready = self.buf.len();
            return Ok(true);
        }
        self.reopen(rotation)?;
        Ok(true)
    }

    /// Whether the file was rotated or truncated since it was opened. A
    /// path that names no file for now (between a rename and the create)
    /// is no rotation yet.
    fn rotation(&self) -> io::Result<Option<Rotation>> {
        let open = self.file.metadata()?;
        if open.len() < self.size {
            return Ok(Some(Rotation::Truncated));
        }
        let Ok(named) = std::fs::metadata(&self.path) else {
            return Ok(None);
        };
        Ok((file_id(&open) != file_id(&named)).then_some(Rotation::Replaced))
    }

    fn reopen(&mut self, rotation: Rotation) -> io::Result<()> {
        self.file = File::open(&self.path)?;
        self.buf.clear();
        self.start = 0;
        self.ready = 0;
        self.size = 0;
        self.opened.count.set(self.opened.count.get() + 1);
        self.opened.file.set(file_id(&self.file.metadata()?));
        let what = match rotation {
            Rotation::Replaced => "rotated",
            Rotation::Truncated => "truncated",
        };
        crate::diag::note!(
            "stream {}: file {what}, reopened {} (line numbers restart at 1)",
            self.stream,
            self.path.display()
        );
        Ok(())
    }
}

impl Read for Follow<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return Ok(0);
            }
            let ready = self.ready - self.start;
            if ready > 0 {
                // Exactly a buffer's worth left would fill the read: hand
                // out one byte less, so that the last read is a short one.
                let n = if ready == out.len() {
                    (ready - 1).max(1)
                } else {
                    ready.min(out.len())
                };
                out[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
                self.start += n;
                return Ok(n);
            }
            if !self.fill()? {
                std::thread::sleep(POLL);
                if !self.stop.load(Ordering::Relaxed) {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
            }
        }
    }
}

/// Sleeps for `wait`, waking early once `stop` is set. After each [`POLL`]
/// of it that does not end it, calls `idle` (which emits an empty batch);
/// returns `Ok(false)` as soon as `idle` does.
pub(super) fn pause(
    wait: Duration,
    stop: &AtomicBool,
    idle: &mut dyn FnMut() -> Result<bool>,
) -> Result<bool> {
    let until = Instant::now() + wait;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || stop.load(Ordering::Relaxed) {
            return Ok(true);
        }
        std::thread::sleep(left.min(POLL));
        if Instant::now() < until && !idle()? {
            return Ok(false);
        }
    }
}

/// Sleeps between rows to replay event-time gaps at a given speed.
pub(super) struct Pacer {
    column: usize,
    speed: f64,
    origin: Option<(Instant, i64)>,
}

impl Pacer {
    /// Paces by the event times of column `column`, `speed` times faster
    /// than they passed.
    pub(super) fn new(column: usize, speed: f64) -> Pacer {
        Pacer {
            column,
            speed,
            origin: None,
        }
    }

    /// How long to wait before releasing a row with event time `t`.
    pub(super) fn delay(&mut self, t: i64) -> Option<Duration> {
        let now = Instant::now();
        let (start, t0) = *self.origin.get_or_insert((now, t));
        let offset_ms = (t.saturating_sub(t0)) as f64 / self.speed;
        if offset_ms <= 0.0 {
            return None;
        }
        let target = start + Duration::from_secs_f64(offset_ms / 1000.0);
        let wait = target.saturating_duration_since(now);
        (wait >= Duration::from_millis(1)).then_some(wait)
    }
}

/// A dead-letter file's line: `<where>\t<reason>\t<raw row>`, newlines
/// in the raw row written as `\n`.
pub fn dead_letter_line(at: &dyn std::fmt::Display, reason: &str, raw: &[u8]) -> Vec<u8> {
    let mut text = Vec::with_capacity(raw.len() + reason.len() + 24);
    write!(text, "{at}\t{reason}\t").expect("writing to a Vec cannot fail");
    // A message's own line end is not part of what was bad: the entry's
    // newline ends it (escaped, it would read as a literal `\n`).
    let (raw, _) = split_terminator(raw);
    for &b in raw {
        match b {
            b'\n' => text.extend_from_slice(b"\\n"),
            b'\r' => text.extend_from_slice(b"\\r"),
            _ => text.push(b),
        }
    }
    text.push(b'\n');
    text
}

/// The dead-letter file, opened (for appending) on the first bad row.
struct DeadLetter {
    path: PathBuf,
    out: Option<BufWriter<File>>,
}

impl DeadLetter {
    fn write(&mut self, at: &dyn std::fmt::Display, reason: &str, raw: &[u8]) -> Result<()> {
        if self.out.is_none() {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)
                .map_err(|e| {
                    Error::Connector(format!(
                        "cannot open dead-letter file {}: {e}",
                        self.path.display()
                    ))
                })?;
            self.out = Some(BufWriter::new(file));
        }
        let Some(out) = self.out.as_mut() else {
            return Ok(());
        };
        let text = dead_letter_line(at, reason, raw);
        out.write_all(&text).map_err(|e| self.io_error(e))
    }

    /// Hands what was written to the file, so that it holds the bad rows
    /// of every position stored so far.
    fn flush(&mut self) -> Result<()> {
        match self.out.as_mut() {
            Some(out) => out.flush().map_err(|e| self.io_error(e)),
            None => Ok(()),
        }
    }

    fn close(&mut self) -> Result<()> {
        let flushed = self.flush();
        self.out = None;
        flushed
    }

    fn io_error(&self, e: io::Error) -> Error {
        Error::io(
            format!("writing dead-letter file {}", self.path.display()),
            e,
        )
    }
}

/// One decoded row, as the decoders hand it to the [`Driver`].
struct Row<'r> {
    /// Its first physical line.
    line: u64,
    vals: &'r [Val],
    /// The text that `Val::Text` ranges index into.
    text: &'r [u8],
    /// The original line(s), for the dead-letter file.
    raw: &'r [u8],
    /// Whether the event time was written as an epoch number.
    epoch_time: bool,
    /// The point just past its last line.
    end: Mark,
}

/// A row the future guard holds back, copied out of the decoder's buffers.
struct HeldRow {
    line: u64,
    time: i64,
    vals: Vec<Val>,
    text: Vec<u8>,
    raw: Vec<u8>,
    /// Why it is bad, if it turns out to be an outlier.
    reason: String,
}

impl HeldRow {
    fn copy(row: &Row<'_>, time: i64, reason: String) -> Self {
        HeldRow {
            line: row.line,
            time,
            vals: row.vals.to_vec(),
            text: row.text.to_vec(),
            raw: row.raw.to_vec(),
            reason,
        }
    }
}

/// A row the guard accepted that is not in a batch yet: one of a jump's
/// rows, or the row a realtime pause is for.
struct PendingRow {
    vals: Vec<Val>,
    text: Vec<u8>,
}

/// Shared row handling for both formats: batching, pacing, bad rows, the
/// event-time guard, positions.
struct Driver<'a> {
    stream: &'a str,
    stats: &'a SourceStats,
    emit: &'a mut dyn FnMut(RecordBatch) -> bool,
    batcher: Batcher,
    batch_size: usize,
    decode: Decoding,
    pacer: Option<Pacer>,
    dead_letter: Option<DeadLetter>,
    guard: Option<FutureGuard>,
    /// Rows the guard holds back, in input order.
    held: Vec<HeldRow>,
    /// Rows accepted and still to be batched, in input order: the row a
    /// realtime pause waits to release, then the rest of a jump's rows.
    waiting: Option<PendingRow>,
    accepted: VecDeque<PendingRow>,
    unit_check: Option<UnitCheck>,
    /// The largest event time among the rows taken since the last flush.
    max_event_time: i64,
    /// Whether the input can be read again from a position: a regular
    /// file. Only then are positions stored.
    replayable: bool,
    /// The input is consumed up to here: every row before it is emitted,
    /// bad, or kept by the driver (held, accepted).
    mark: Mark,
    /// Threads that decode a file whose lines decode on their own (see
    /// [`parallel`]); 1 decodes on the reading thread.
    threads: usize,
    /// Bytes of input per chunk for those threads.
    chunk_size: usize,
    /// For input made of messages (see [`read_messages`]): the message
    /// each line is, which bad rows name instead of the line.
    origin: Option<&'a dyn Fn(u64) -> MessageOrigin>,
}

impl<'a> Driver<'a> {
    fn new(
        config: &'a SourceConfig,
        stats: &'a SourceStats,
        emit: &'a mut dyn FnMut(RecordBatch) -> bool,
    ) -> Result<Driver<'a>> {
        let pacer = match (config.replay, config.event_time) {
            (Replay::Realtime { speed }, Some(column)) if speed > 0.0 => {
                Some(Pacer::new(column, speed))
            }
            _ => None,
        };
        let pushed = config.location == SourceLocation::Push;
        let guard = match (config.event_time, config.decode.max_future_ms) {
            (Some(_), Some(max_ahead)) => Some(FutureGuard::new(max_ahead, pushed)),
            _ => None,
        };
        // Each push is decoded on its own: a warning would repeat per push.
        let unit_check =
            (config.event_time.is_some() && !pushed).then(|| UnitCheck::new(config.decode.ts_unit));
        Ok(Driver {
            stream: &config.stream,
            stats,
            emit,
            batcher: Batcher::new(config)?,
            batch_size: config.batch_size.max(1),
            decode: config.decode,
            pacer,
            dead_letter: config
                .dead_letter
                .clone()
                .map(|path| DeadLetter { path, out: None }),
            guard,
            held: Vec::new(),
            waiting: None,
            accepted: VecDeque::new(),
            unit_check,
            max_event_time: i64::MIN,
            replayable: false,
            mark: Mark::default(),
            threads: config.decode_threads.max(1),
            chunk_size: parallel::chunk_size(),
            origin: None,
        })
    }

    /// Takes one parsed row. Returns `Ok(false)` once downstream is gone.
    fn row(&mut self, row: Row<'_>) -> Result<bool> {
        if self.stopped() {
            // The row is not taken: the position stays before it.
            self.flush()?;
            return Ok(false);
        }
        self.mark = row.end;
        if let Err(reason) = self.batcher.check(row.vals) {
            self.bad(row.line, reason, row.raw)?;
            return Ok(true);
        }
        let time = self.batcher.event_time.and_then(|i| match row.vals[i] {
            Val::Int(t) => Some(t),
            _ => None,
        });
        if let (Some(t), true, Some(check)) = (time, row.epoch_time, &mut self.unit_check) {
            check.observe(t, self.stream);
        }
        let (Some(t), Some(guard)) = (time, &mut self.guard) else {
            return self.accept(row.vals, row.text);
        };
        let admit = guard.admit(t);
        match admit {
            Admit::Accept => {
                self.reject_held()?;
                self.accept(row.vals, row.text)
            }
            Admit::Reject(reason) => {
                let reason = self.time_reason(reason);
                self.bad(row.line, reason, row.raw)?;
                Ok(true)
            }
            Admit::Hold { reason, breaks_run } => {
                if breaks_run {
                    self.reject_held()?;
                }
                let reason = self.time_reason(reason);
                self.held.push(HeldRow::copy(&row, t, reason));
                if self.held.len() < JUMP_ROWS {
                    return Ok(true);
                }
                // Enough rows agree: the stream jumped ahead (a gap in the
                // data); they are not outliers.
                let held = std::mem::take(&mut self.held);
                if let Some(guard) = &mut self.guard {
                    for h in &held {
                        guard.raise(h.time);
                    }
                }
                self.accepted.extend(held.into_iter().map(|h| PendingRow {
                    vals: h.vals,
                    text: h.text,
                }));
                self.accept_pending()
            }
        }
    }

    /// Whether the source was asked to stop.
    fn stopped(&self) -> bool {
        self.stats.stop.load(Ordering::Relaxed)
    }

    /// The input is consumed up to `mark`.
    fn advance(&mut self, mark: Mark) {
        self.mark = mark;
    }

    /// A guard's reason, naming the event-time column.
    fn time_reason(&self, reason: String) -> String {
        let column = self
            .batcher
            .event_time
            .map_or("", |i| self.batcher.schema.field(i).name().as_str());
        format!("column {column}: {reason}")
    }

    /// Batches the accepted rows still pending, in order.
    fn accept_pending(&mut self) -> Result<bool> {
        while let Some(row) = self.accepted.pop_front() {
            if !self.accept(&row.vals, &row.text)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Adds a checked row to the pending batch, pacing it first.
    fn accept(&mut self, vals: &[Val], text: &[u8]) -> Result<bool> {
        if let Some(pacer) = &mut self.pacer
            && let Val::Int(t) = vals[pacer.column]
            && let Some(wait) = pacer.delay(t)
        {
            // Until the pause ends the row is pending, and positions
            // stored meanwhile keep it.
            self.waiting = Some(PendingRow {
                vals: vals.to_vec(),
                text: text.to_vec(),
            });
            let go_on = self.flush()? && self.pause(wait)?;
            self.waiting = None;
            if !go_on {
                return Ok(false);
            }
        }
        if let Some(Val::Int(t)) = self.batcher.event_time.map(|i| vals[i]) {
            self.max_event_time = self.max_event_time.max(t);
        }
        self.batcher.push(vals, text);
        if self.batcher.len >= self.batch_size {
            return self.flush();
        }
        Ok(true)
    }

    /// Waits `wait`, emitting empty batches meanwhile.
    fn pause(&mut self, wait: Duration) -> Result<bool> {
        let stats = self.stats;
        pause(wait, &stats.stop, &mut || self.idle())
    }

    /// Records the rows the guard held back as bad: they were outliers.
    fn reject_held(&mut self) -> Result<()> {
        for h in std::mem::take(&mut self.held) {
            self.bad(h.line, h.reason, &h.raw)?;
        }
        Ok(())
    }

    /// Records a malformed row.
    fn bad(&mut self, line: u64, reason: String, raw: &[u8]) -> Result<()> {
        if let Some(origin) = self.origin {
            let message = origin(line);
            if let Some(dead) = &mut self.dead_letter {
                dead.write(&message.at, &reason, &message.raw)?;
            }
            self.stats.record_bad(BadRow {
                line: message.line,
                reason: format!("{}: {reason}", message.at),
            });
            return Ok(());
        }
        if let Some(dead) = &mut self.dead_letter {
            dead.write(&line, &reason, raw)?;
        }
        self.stats.record_bad(BadRow { line, reason });
        Ok(())
    }

    /// Records a malformed record that may span several lines: every line
    /// is a bad row of its own (counted, and dead-lettered as itself), so
    /// the counts add up to the lines of the input.
    fn bad_record(&mut self, first: u64, reason: String, raw: &[u8]) -> Result<()> {
        let mut lines = raw.split_inclusive(|&b| b == b'\n');
        let Some(head) = lines.next() else {
            return self.bad(first, reason, raw);
        };
        let rest = format!("{reason} (in the record that starts at line {first})");
        self.bad(first, reason, split_terminator(head).0)?;
        for (i, line) in lines.enumerate() {
            self.bad(first + 1 + i as u64, rest.clone(), split_terminator(line).0)?;
        }
        Ok(())
    }

    /// Ends the input: held rows are outliers, pending rows go on, and the
    /// unit check decides on what it has seen.
    fn finish(&mut self) -> Result<()> {
        self.reject_held()?;
        if let Some(check) = &mut self.unit_check {
            check.decide(self.stream);
        }
        self.flush()?;
        Ok(())
    }

    /// Emits the pending rows, if any. Returns `Ok(false)` once downstream
    /// is gone.
    fn flush(&mut self) -> Result<bool> {
        match self.batcher.take()? {
            Some(batch) => {
                self.stats
                    .rows
                    .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
                self.stats.max_event_time.raise(self.max_event_time);
                self.send(batch)
            }
            None => Ok(true),
        }
    }

    /// While waiting for input: emits the pending rows, or else an empty
    /// batch.
    fn idle(&mut self) -> Result<bool> {
        if self.batcher.len > 0 {
            return self.flush();
        }
        self.send(RecordBatch::new_empty(self.batcher.schema.clone()))
    }

    /// Stores the position after `batch`, then emits it.
    fn send(&mut self, batch: RecordBatch) -> Result<bool> {
        if let Some(dead) = &mut self.dead_letter {
            dead.flush()?;
        }
        if self.replayable {
            let position = self.position()?;
            *self
                .stats
                .position
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(position);
        }
        Ok((self.emit)(batch))
    }

    /// Where the source stands now (see [`FileState`]).
    fn position(&self) -> Result<SourcePosition> {
        let saved = |row: &PendingRow| save_vals(&row.vals, &row.text);
        let state = FileState {
            file: self.mark.file,
            guard: self.guard.as_ref().map(FutureGuard::state),
            unit_check: self.unit_check.as_ref().map(UnitCheck::state),
            max_event_time: self.stats.max_event_time.get(),
            held: self.held.iter().map(SavedHeld::save).collect(),
            accepted: self
                .waiting
                .iter()
                .chain(&self.accepted)
                .map(saved)
                .collect(),
        };
        Ok(SourcePosition {
            offset: self.mark.offset,
            line: self.mark.line,
            rows: self.stats.rows.load(Ordering::Relaxed),
            bad_rows: self.stats.bad_rows.load(Ordering::Relaxed),
            extra: serde_json::to_value(state).map_err(|e| {
                Error::Connector(format!(
                    "stream {}: cannot record its position: {e}",
                    self.stream
                ))
            })?,
        })
    }

    /// Takes up from `position`: the counters, the guard and unit check,
    /// the rows kept. Returns the followed file recorded, if any.
    fn restore(&mut self, position: &SourcePosition) -> Result<Option<FileId>> {
        let state: FileState = match &position.extra {
            Value::Null => FileState::default(),
            extra => serde_json::from_value(extra.clone()).map_err(|e| {
                Error::Connector(format!(
                    "stream {}: the checkpoint's position is not one of a file source: {e}",
                    self.stream
                ))
            })?,
        };
        self.stats.rows.store(position.rows, Ordering::Relaxed);
        self.stats
            .bad_rows
            .store(position.bad_rows, Ordering::Relaxed);
        if let Some(t) = state.max_event_time {
            self.stats.max_event_time.raise(t);
        }
        if let (Some(guard), Some(saved)) = (&mut self.guard, state.guard) {
            guard.restore(saved);
        }
        if let (Some(check), Some(saved)) = (&mut self.unit_check, state.unit_check) {
            check.restore(saved);
        }
        let columns = self.batcher.kinds.len();
        for saved in state.accepted {
            let (vals, text) = load_vals(saved, columns, self.stream)?;
            self.accepted.push_back(PendingRow { vals, text });
        }
        for saved in state.held {
            let held = saved.load(columns, self.stream)?;
            // Without a guard (max_future changed to 'none'), nothing is
            // held: the row goes on.
            match self.guard {
                Some(_) => self.held.push(held),
                None => self.accepted.push_back(PendingRow {
                    vals: held.vals,
                    text: held.text,
                }),
            }
        }
        Ok(state.file)
    }

    /// Whether the lines of `input` are decoded by several threads: a
    /// file read to its end (not followed, not a pipe), when there are
    /// several. The decoders say whether their format allows it.
    fn parallel<R: Read>(&self, input: &Input<'_, R>) -> bool {
        self.threads > 1 && !input.live && input.opened.is_none()
    }

    /// On live input, emits the pending rows before a read that may block.
    fn flush_if_dry<R: Read>(&mut self, input: &Input<'_, R>) -> Result<bool> {
        if input.dry() && self.batcher.len > 0 {
            return self.flush();
        }
        Ok(true)
    }

    fn close_dead_letter(&mut self) -> Result<()> {
        match &mut self.dead_letter {
            Some(dead) => dead.close(),
            None => Ok(()),
        }
    }
}

/// The decoder state in a file source's position (its `extra`): what the
/// rows after the position depend on.
#[derive(Debug, Default, Serialize, Deserialize)]
struct FileState {
    /// A followed file: which file the offset is in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    file: Option<FileId>,
    /// The `max_future` guard's reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    guard: Option<GuardState>,
    /// The `ts_unit` check's samples, and whether it has decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    unit_check: Option<UnitState>,
    /// The largest event time emitted, for progress displays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_event_time: Option<i64>,
    /// Rows before the position that the guard holds back, undecided.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    held: Vec<SavedHeld>,
    /// Rows before the position that were accepted but not yet emitted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    accepted: Vec<Vec<SavedVal>>,
}

/// A value of a row kept in a position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum SavedVal {
    Null,
    Int(i64),
    /// The bits of the float: JSON has no NaN or infinities.
    Float(u64),
    Bool(bool),
    Text(String),
}

/// Bytes kept in a position: as text when they are UTF-8.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
enum SavedBytes {
    Text(String),
    Bytes(Vec<u8>),
}

impl SavedBytes {
    fn save(bytes: &[u8]) -> Self {
        match std::str::from_utf8(bytes) {
            Ok(text) => SavedBytes::Text(text.to_string()),
            Err(_) => SavedBytes::Bytes(bytes.to_vec()),
        }
    }

    fn load(self) -> Vec<u8> {
        match self {
            SavedBytes::Text(text) => text.into_bytes(),
            SavedBytes::Bytes(bytes) => bytes,
        }
    }
}

/// A held row kept in a position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SavedHeld {
    line: u64,
    time: i64,
    reason: String,
    raw: SavedBytes,
    vals: Vec<SavedVal>,
}

impl SavedHeld {
    fn save(row: &HeldRow) -> Self {
        SavedHeld {
            line: row.line,
            time: row.time,
            reason: row.reason.clone(),
            raw: SavedBytes::save(&row.raw),
            vals: save_vals(&row.vals, &row.text),
        }
    }

    fn load(self, columns: usize, stream: &str) -> Result<HeldRow> {
        let (vals, text) = load_vals(self.vals, columns, stream)?;
        Ok(HeldRow {
            line: self.line,
            time: self.time,
            vals,
            text,
            raw: self.raw.load(),
            reason: self.reason,
        })
    }
}

fn save_vals(vals: &[Val], text: &[u8]) -> Vec<SavedVal> {
    vals.iter()
        .map(|v| match *v {
            Val::Null => SavedVal::Null,
            Val::Int(i) => SavedVal::Int(i),
            Val::Float(f) => SavedVal::Float(f.to_bits()),
            Val::Bool(b) => SavedVal::Bool(b),
            Val::Text(start, end) => {
                SavedVal::Text(String::from_utf8_lossy(&text[start..end]).into_owned())
            }
        })
        .collect()
}

/// A kept row's values, with the text their ranges index into.
fn load_vals(saved: Vec<SavedVal>, columns: usize, stream: &str) -> Result<(Vec<Val>, Vec<u8>)> {
    if saved.len() != columns {
        return Err(Error::Connector(format!(
            "stream {stream}: the checkpoint keeps rows of {} columns, the stream has {columns}",
            saved.len()
        )));
    }
    let mut text = Vec::new();
    let vals = saved
        .into_iter()
        .map(|v| match v {
            SavedVal::Null => Val::Null,
            SavedVal::Int(i) => Val::Int(i),
            SavedVal::Float(bits) => Val::Float(f64::from_bits(bits)),
            SavedVal::Bool(b) => Val::Bool(b),
            SavedVal::Text(s) => {
                let start = text.len();
                text.extend_from_slice(s.as_bytes());
                Val::Text(start, text.len())
            }
        })
        .collect();
    Ok((vals, text))
}

/// A reader that remembers whether the last read returned less than was
/// asked for (i.e. the input had nothing more available at that moment).
struct Tracked<R> {
    inner: R,
    short: bool,
}

impl<R: Read> Tracked<R> {
    fn new(inner: R) -> Self {
        Tracked {
            inner,
            short: false,
        }
    }
}

impl<R: Read> Read for Tracked<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.short = n < buf.len();
        Ok(n)
    }
}

/// Quotes a value for a bad-row reason: single quotes, control characters
/// escaped, long values cut short.
fn quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len().min(MAX_QUOTED_CHARS) + 5);
    out.push('\'');
    for (i, c) in value.chars().enumerate() {
        if i == MAX_QUOTED_CHARS {
            out.push_str("...");
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

fn parse_bool(s: &str) -> Option<bool> {
    const TRUE: &[&str] = &["true", "t", "1", "yes", "y"];
    const FALSE: &[&str] = &["false", "f", "0", "no", "n"];
    if TRUE.iter().any(|t| s.eq_ignore_ascii_case(t)) {
        Some(true)
    } else if FALSE.iter().any(|f| s.eq_ignore_ascii_case(f)) {
        Some(false)
    } else {
        None
    }
}

// ---------------------------------------------------------------- CSV ----

/// The fields of one CSV record, unquoted, stored end to end.
#[derive(Debug, Default)]
struct Fields {
    text: Vec<u8>,
    ends: Vec<usize>,
}

impl Fields {
    fn clear(&mut self) {
        self.text.clear();
        self.ends.clear();
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    /// The byte range of field `i` in `text`.
    fn range(&self, i: usize) -> std::ops::Range<usize> {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        start..self.ends[i]
    }

    fn get(&self, i: usize) -> &[u8] {
        &self.text[self.range(i)]
    }
}

/// One CSV record being split, possibly over several lines, by csv-core's
/// incremental reader (RFC 4180 quoting; a quote inside an unquoted field
/// is text). The caller hands it one line at a time, so a record ends at
/// its line unless a quoted field is still open there.
struct CsvRecord {
    fields: Fields,
    reader: csv_core::Reader,
    /// The first line of the record; 0 when no record is open.
    first_line: u64,
    /// The point before the record's first line.
    start: Mark,
    /// The raw lines of a record that spans lines (empty for one line).
    raw: Vec<u8>,
}

impl std::fmt::Debug for CsvRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CsvRecord")
            .field("fields", &self.fields)
            .field("first_line", &self.first_line)
            .finish_non_exhaustive()
    }
}

impl CsvRecord {
    fn new() -> Self {
        CsvRecord {
            fields: Fields::default(),
            reader: csv_core::Reader::new(),
            first_line: 0,
            start: Mark::default(),
            raw: Vec::new(),
        }
    }

    fn is_open(&self) -> bool {
        self.first_line != 0
    }

    fn start(&mut self, at: &LineAt) {
        self.restart();
        self.raw.clear();
        self.first_line = at.number;
        self.start = at.before;
    }

    fn close(&mut self) {
        self.first_line = 0;
    }

    /// Empties the fields for a new record.
    fn restart(&mut self) {
        self.fields.clear();
        // A record abandoned as bad may have left the reader inside a
        // quoted field.
        self.reader.reset();
    }

    /// Splits one line's content into fields, continuing a quoted field
    /// from the line before. Returns whether the record is complete; if
    /// not, a quoted field goes on past this line, `terminator` included.
    fn feed(&mut self, content: &[u8], terminator: &[u8]) -> bool {
        // The last line of an input may have no terminator: end it here,
        // so that a quote it leaves open is reported rather than closed.
        let terminator: &[u8] = if terminator.is_empty() {
            b"\n"
        } else {
            terminator
        };
        self.feed_bytes(content) || self.feed_bytes(terminator)
    }

    /// Feeds bytes to the reader; true when they complete the record.
    fn feed_bytes(&mut self, mut input: &[u8]) -> bool {
        use csv_core::ReadRecordResult;
        loop {
            let (text_len, ends_len) = (self.fields.text.len(), self.fields.ends.len());
            // A field's text is never longer than its input, and there are
            // at most as many field ends as input bytes, plus one.
            let spare = input.len() + 1;
            self.fields.text.resize(text_len + spare, 0);
            self.fields.ends.resize(ends_len + spare, 0);
            let (result, read, written, ended) = self.reader.read_record(
                input,
                &mut self.fields.text[text_len..],
                &mut self.fields.ends[ends_len..],
            );
            self.fields.text.truncate(text_len + written);
            self.fields.ends.truncate(ends_len + ended);
            input = &input[read..];
            match result {
                // The `\n` of a `\r\n` may be left over: it ends this same
                // line, so it is not fed again.
                ReadRecordResult::Record | ReadRecordResult::End => return true,
                ReadRecordResult::InputEmpty if input.is_empty() => return false,
                _ => {}
            }
        }
    }
}

/// Where each declared column is in the CSV header; `None` for a column
/// the header lacks (read as NULL).
fn map_header(
    config_schema: &SchemaRef,
    stream: &str,
    event_time: Option<usize>,
    header: &Fields,
    name: &str,
) -> Result<Vec<Option<usize>>> {
    let names: Vec<String> = (0..header.len())
        .map(|i| {
            let s = String::from_utf8_lossy(header.get(i));
            let s = if i == 0 {
                s.trim_start_matches('\u{feff}')
            } else {
                &s
            };
            s.trim().to_string()
        })
        .collect();
    let mut columns = Vec::with_capacity(config_schema.fields().len());
    for (index, field) in config_schema.fields().iter().enumerate() {
        let wanted = field.name();
        let found = names.iter().position(|n| n == wanted).or_else(|| {
            names
                .iter()
                .position(|n| n.to_lowercase() == wanted.to_lowercase())
        });
        if found.is_none() {
            if event_time == Some(index) {
                return Err(Error::Connector(format!(
                    "stream {stream}: event-time column {wanted} not found in the header of {name} \
                     (header columns: {})",
                    names.join(", ")
                )));
            }
            // A pack rule declares more columns than it reads: a CSV with
            // only some of them still works for the rules that read those.
            crate::diag::warning!(
                "stream {stream}: column {wanted} is not in the header of {name}; \
                 it reads as NULL"
            );
        }
        columns.push(found);
    }
    Ok(columns)
}

/// Parses one CSV field of the given kind; `start` is its offset in the
/// record's text.
fn parse_csv_field(
    kind: Kind,
    data_type: &DataType,
    column: &str,
    bytes: &[u8],
    start: usize,
    unit: TsUnit,
) -> std::result::Result<Val, String> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Err(format!("column {column}: invalid UTF-8"));
    };
    if kind == Kind::Text {
        // Spaces around a value go, as around the header's names and the
        // numbers (`ts, host` then `1000, a` reads host `a`).
        let value = text.trim_ascii();
        if value.is_empty() {
            return Ok(Val::Null);
        }
        let lead = text.len() - text.trim_ascii_start().len();
        return Ok(Val::Text(start + lead, start + lead + value.len()));
    }
    if kind == Kind::Nested {
        let present = nested::check_text(data_type, text, unit, column)?;
        return Ok(match present {
            true => Val::Text(start, start + text.len()),
            false => Val::Null,
        });
    }
    let value = text.trim_ascii();
    if value.is_empty() {
        return Ok(Val::Null);
    }
    let parsed = match kind {
        Kind::Timestamp => parse_timestamp(value, unit).map(Val::Int),
        Kind::Float => value.parse::<f64>().ok().map(Val::Float),
        Kind::Int => value.parse::<i64>().ok().map(Val::Int),
        Kind::Bool => parse_bool(value).map(Val::Bool),
        Kind::Text | Kind::Nested => unreachable!("handled above"),
    };
    parsed.ok_or_else(|| {
        format!(
            "column {column}: cannot parse {} as {}",
            quote(value),
            kind.sql_name()
        )
    })
}

/// Why a record whose quoted field never closed is bad.
/// Why a line longer than `limit` bytes is a bad row.
fn overlong_reason(length: u64, limit: usize) -> String {
    format!(
        "the line is {length} bytes long, longer than max_record_size ({limit} bytes); \
         only its start is kept here"
    )
}

fn unclosed_reason(multiline: bool, at: &str) -> String {
    if multiline {
        format!("a quoted field is not closed {at}")
    } else {
        "a quoted field is not closed at the end of its line \
         (a quoted field spans lines only with multiline = 'true')"
            .to_string()
    }
}

/// Where each declared column is in a CSV file's header.
#[derive(Debug, Clone)]
struct CsvHeader {
    /// Each declared column's field index; `None` for a column the header
    /// lacks.
    columns: Vec<Option<usize>>,
    /// The number of fields of the header.
    len: usize,
}

/// What turns a CSV record's fields into a row: the header, and the
/// declared columns.
struct CsvColumns<'a> {
    header: &'a CsvHeader,
    schema: &'a SchemaRef,
    kinds: &'a [Kind],
    event_time: Option<usize>,
    unit: TsUnit,
}

impl CsvColumns<'_> {
    /// Parses a complete record's fields into `vals`; returns whether the
    /// event time was written as an epoch number, or why the row is bad.
    fn parse(&self, fields: &Fields, vals: &mut [Val]) -> std::result::Result<bool, String> {
        if fields.len() != self.header.len {
            return Err(format!(
                "expected {} fields, found {}",
                self.header.len,
                fields.len()
            ));
        }
        let mut epoch_time = false;
        for (i, (column, &kind)) in self.header.columns.iter().zip(self.kinds).enumerate() {
            let Some(index) = *column else {
                vals[i] = Val::Null;
                continue;
            };
            let bytes = fields.get(index);
            let start = fields.range(index).start;
            let field = self.schema.field(i);
            vals[i] = parse_csv_field(
                kind,
                field.data_type(),
                field.name(),
                bytes,
                start,
                self.unit,
            )?;
            if self.event_time == Some(i) {
                epoch_time = std::str::from_utf8(bytes).is_ok_and(is_epoch_number);
            }
        }
        Ok(epoch_time)
    }
}

/// The decoder state of one CSV input: its header and the record being
/// read.
struct CsvReader {
    multiline: bool,
    max_record_size: usize,
    unit: TsUnit,
    /// The header, once it is read.
    header: Option<CsvHeader>,
    record: CsvRecord,
    vals: Vec<Val>,
}

impl CsvReader {
    fn new(d: &Driver<'_>, header: Option<CsvHeader>) -> Self {
        CsvReader {
            multiline: d.decode.multiline,
            max_record_size: d.decode.max_record_size,
            unit: d.decode.ts_unit,
            header,
            record: CsvRecord::new(),
            vals: vec![Val::Null; d.batcher.kinds.len()],
        }
    }

    /// Where the input is consumed up to once the line ending at `after`
    /// is taken: before a record still open, else `after`.
    fn consumed(&self, after: Mark) -> Mark {
        if self.record.is_open() {
            self.record.start
        } else {
            after
        }
    }
}

fn read_csv<R: Read>(
    mut input: Input<'_, R>,
    d: &mut Driver<'_>,
    header: Option<CsvHeader>,
) -> Result<()> {
    let mut csv = CsvReader::new(d, header);
    if !d.accept_pending()? {
        return Ok(());
    }
    // Quoted fields spanning lines tie a line to the ones before it.
    let parallel = d.parallel(&input) && !csv.multiline;
    let mut line = Vec::new();
    loop {
        if let (true, Some(header)) = (parallel, &csv.header) {
            let lines = parallel::Lines::new(d, Some(header.clone()));
            if !parallel::decode(&mut input, d, &lines)? {
                return Ok(());
            }
            break;
        }
        let new_file = match input.next_line(&mut line, csv.max_record_size)? {
            Next::Line { new_file } => new_file,
            Next::Idle if d.idle()? => continue,
            Next::Idle => return Ok(()),
            Next::End => break,
        };
        if new_file {
            // A rotated file starts with its own header.
            csv.end_file(input.name, "at the end of the file", d)?;
            csv.header = None;
        }
        let at = input.at();
        let taken = match input.overlong {
            Some(length) => csv.overlong(length, &line, &at, input.name, d)?,
            None => csv.line(&line, &at, input.name, d)?,
        };
        if !taken {
            return Ok(());
        }
        d.advance(csv.consumed(at.after));
        if !d.flush_if_dry(&input)? {
            return Ok(());
        }
    }
    if d.stopped() {
        // Stopped, not ended: a record still open and held rows stay
        // undecided.
        return d.flush().map(drop);
    }
    csv.end_file(input.name, "at the end of the input", d)?;
    d.advance(input.at().after);
    d.finish()
}

/// Reads the header of a CSV file whose rows are read from byte `offset`
/// on; `None` if the file has no header before it.
fn read_csv_header<R: Read>(
    mut input: Input<'_, R>,
    d: &mut Driver<'_>,
    offset: u64,
) -> Result<Option<CsvHeader>> {
    let mut csv = CsvReader::new(d, None);
    let mut line = Vec::new();
    while let Next::Line { .. } = input.next_line(&mut line, csv.max_record_size)? {
        let at = input.at();
        if let Some(length) = input.overlong {
            csv.overlong(length, &line, &at, input.name, d)?;
            continue;
        }
        if at.before.offset >= offset {
            break;
        }
        csv.line(&line, &at, input.name, d)?;
        if csv.header.is_some() {
            if at.after.offset > offset {
                return Err(Error::Connector(format!(
                    "stream {}: cannot resume {} at byte {offset} of the checkpoint: the file's \
                     header now ends at byte {} (the file was replaced since)",
                    d.stream, input.name, at.after.offset
                )));
            }
            return Ok(csv.header);
        }
    }
    Ok(None)
}

impl CsvReader {
    /// Takes one physical line. Returns `Ok(false)` once downstream is gone.
    fn line(&mut self, line: &[u8], at: &LineAt, name: &str, d: &mut Driver<'_>) -> Result<bool> {
        let (content, terminator) = split_terminator(line);
        let continued = self.record.is_open();
        if !continued {
            if content.is_empty() {
                return Ok(true); // a blank line
            }
            self.record.start(at);
        }
        if !self.record.feed(content, terminator) {
            if !self.multiline {
                return self.bad_record(unclosed_reason(false, ""), line, name, d);
            }
            self.record.raw.extend_from_slice(line);
            if self.record.raw.len() > self.max_record_size {
                let reason = format!(
                    "a quoted field is not closed within max_record_size ({} bytes)",
                    self.max_record_size
                );
                return self.bad_record(reason, &[], name, d);
            }
            return Ok(true);
        }
        let mut raw = std::mem::take(&mut self.record.raw);
        let spans = continued;
        if spans {
            raw.extend_from_slice(line);
        }
        let raw_row = if spans { &raw[..] } else { line };
        let keep_going = self.record_done(raw_row, at.after, name, d);
        self.record.raw = raw;
        keep_going
    }

    /// Handles a complete record: the header, or a row.
    /// `end` is the point just past the record.
    fn record_done(
        &mut self,
        raw: &[u8],
        end: Mark,
        name: &str,
        d: &mut Driver<'_>,
    ) -> Result<bool> {
        let first = self.record.first_line;
        self.record.close();
        let Some(header) = &self.header else {
            let schema = d.batcher.schema.clone();
            let event_time = d.batcher.event_time;
            let columns = map_header(&schema, d.stream, event_time, &self.record.fields, name)?;
            self.header = Some(CsvHeader {
                columns,
                len: self.record.fields.len(),
            });
            return Ok(true);
        };
        let fields = &self.record.fields;
        let columns = CsvColumns {
            header,
            schema: &d.batcher.schema,
            kinds: &d.batcher.kinds,
            event_time: d.batcher.event_time,
            unit: self.unit,
        };
        match columns.parse(fields, &mut self.vals) {
            Ok(epoch_time) => d.row(Row {
                line: first,
                vals: &self.vals,
                text: &fields.text,
                raw,
                epoch_time,
                end,
            }),
            Err(reason) => {
                d.bad_record(first, reason, raw)?;
                Ok(true)
            }
        }
    }

    /// A line longer than `max_record_size`, of which `start` is kept: a
    /// bad row, as is the record it was part of.
    fn overlong(
        &mut self,
        length: u64,
        start: &[u8],
        at: &LineAt,
        name: &str,
        d: &mut Driver<'_>,
    ) -> Result<bool> {
        if !self.record.is_open() {
            self.record.start(at);
        }
        let reason = overlong_reason(length, self.max_record_size);
        self.bad_record(reason, start, name, d)
    }

    /// A record that cannot be completed: all its lines are bad rows. A
    /// broken header is an error instead.
    fn bad_record(
        &mut self,
        reason: String,
        last_line: &[u8],
        name: &str,
        d: &mut Driver<'_>,
    ) -> Result<bool> {
        let first = self.record.first_line;
        self.record.close();
        if self.header.is_none() {
            return Err(Error::Connector(format!(
                "stream {}: cannot read the header of {name}: {reason}",
                d.stream
            )));
        }
        let mut raw = std::mem::take(&mut self.record.raw);
        raw.extend_from_slice(last_line);
        d.bad_record(first, reason, &raw)?;
        self.record.raw = raw;
        Ok(true)
    }

    /// Ends a file: a record still open is bad.
    fn end_file(&mut self, name: &str, at: &str, d: &mut Driver<'_>) -> Result<()> {
        if self.record.is_open() {
            self.bad_record(unclosed_reason(true, at), &[], name, d)?;
        }
        Ok(())
    }
}

// -------------------------------------------------------------- JSONL ----

/// Describes a JSON value for a type-mismatch reason.
fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {}", quote(s)),
        Value::Array(_) => "an array".to_string(),
        Value::Object(_) => "an object".to_string(),
    }
}

/// Converts one JSON value to a column value; text is copied into `arena`.
fn json_value(
    kind: Kind,
    column: &str,
    value: &Value,
    unit: TsUnit,
    arena: &mut String,
) -> std::result::Result<Val, String> {
    let mismatch = || {
        format!(
            "column {column}: expected {}, found {}",
            kind.sql_name(),
            describe(value)
        )
    };
    let integral = |f: f64| -> Option<i64> {
        (f.is_finite() && f.fract() == 0.0 && f.abs() < 9.2e18).then_some(f as i64)
    };
    let val = match (kind, value) {
        (_, Value::Null) => Val::Null,
        (Kind::Text, Value::String(s)) => {
            let start = arena.len();
            arena.push_str(s);
            Val::Text(start, arena.len())
        }
        (Kind::Float, Value::Number(n)) => Val::Float(n.as_f64().ok_or_else(mismatch)?),
        (Kind::Timestamp, Value::Number(n)) => match json_epoch(n, unit) {
            Some(t) => Val::Int(t),
            None if n.is_i64() => {
                return Err(format!("column {column}: timestamp {n} is out of range"));
            }
            None => {
                return Err(format!(
                    "column {column}: cannot represent {n} as TIMESTAMP (ts_unit = '{}')",
                    unit.name()
                ));
            }
        },
        (Kind::Int, Value::Number(n)) => match n.as_i64() {
            Some(i) => Val::Int(i),
            None => match n.as_f64().and_then(integral) {
                Some(i) => Val::Int(i),
                None => {
                    return Err(format!(
                        "column {column}: cannot represent {n} as {}",
                        kind.sql_name()
                    ));
                }
            },
        },
        (Kind::Timestamp, Value::String(s)) => match parse_timestamp(s, unit) {
            Some(t) => Val::Int(t),
            None => {
                return Err(format!(
                    "column {column}: cannot parse {} as TIMESTAMP",
                    quote(s)
                ));
            }
        },
        (Kind::Bool, Value::Bool(b)) => Val::Bool(*b),
        _ => return Err(mismatch()),
    };
    Ok(val)
}

/// A JSON number as an epoch timestamp in `unit`: an integer, an integral
/// float, or (in seconds) a decimal fraction.
fn json_epoch(n: &serde_json::Number, unit: TsUnit) -> Option<i64> {
    if let Some(i) = n.as_i64() {
        return unit.to_ms(i);
    }
    if unit == TsUnit::Seconds {
        return parse_timestamp(&n.to_string(), unit);
    }
    let f = n.as_f64()?;
    (f.is_finite() && f.fract() == 0.0 && f.abs() < 9.2e18)
        .then_some(f as i64)
        .and_then(|i| unit.to_ms(i))
}

/// A serde_json error without its "at line 1" position, which is
/// meaningless for a single line; the column is kept.
fn json_error(e: &serde_json::Error) -> String {
    let msg = e.to_string();
    let msg = match msg.rfind(" at line ") {
        Some(pos) => &msg[..pos],
        None => &msg,
    };
    if e.column() > 0 {
        format!("invalid JSON: {msg} at column {}", e.column())
    } else {
        format!("invalid JSON: {msg}")
    }
}

/// Parses one JSON line into `vals`; returns whether the event time (at
/// `event_time`) was written as a number.
///
/// A row goes through [`fast_json_row`] first, which allocates nothing; a
/// row it does not take (an error, a key matched only ignoring case, a
/// nested value) is parsed again by [`slow_json_row`], whose result and
/// error texts are the reference: the fast path only takes rows on which
/// both agree.
fn parse_json_row(
    text: &[u8],
    schema: &SchemaRef,
    kinds: &[Kind],
    unit: TsUnit,
    event_time: Option<usize>,
    vals: &mut [Val],
    arena: &mut String,
) -> std::result::Result<bool, String> {
    if let Some(epoch_time) = fast_json_row(text, schema, kinds, unit, event_time, vals, arena) {
        return Ok(epoch_time);
    }
    slow_json_row(text, schema, kinds, unit, event_time, vals, arena)
}

/// Parses one JSON line straight into `vals` with a serde visitor (no
/// `Value` tree); `None` when the row needs [`slow_json_row`].
fn fast_json_row(
    text: &[u8],
    schema: &SchemaRef,
    kinds: &[Kind],
    unit: TsUnit,
    event_time: Option<usize>,
    vals: &mut [Val],
    arena: &mut String,
) -> Option<bool> {
    use serde::de::DeserializeSeed;
    arena.clear();
    vals.fill(Val::Null);
    let mut epoch_time = false;
    let mut de = serde_json::Deserializer::from_slice(text);
    let seed = fast_json::RowSeed {
        schema,
        kinds,
        unit,
        event_time,
        vals,
        arena,
        epoch_time: &mut epoch_time,
    };
    seed.deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(epoch_time)
}

/// Parses one JSON line through a `serde_json::Value`: the reference for
/// what a row decodes to and why a bad one is bad.
fn slow_json_row(
    text: &[u8],
    schema: &SchemaRef,
    kinds: &[Kind],
    unit: TsUnit,
    event_time: Option<usize>,
    vals: &mut [Val],
    arena: &mut String,
) -> std::result::Result<bool, String> {
    let value: Value = serde_json::from_slice(text).map_err(|e| json_error(&e))?;
    let Value::Object(map) = &value else {
        return Err(format!(
            "expected a JSON object, found {}",
            match &value {
                Value::String(_) => "a string".to_string(),
                other => describe(other),
            }
        ));
    };
    arena.clear();
    let mut epoch_time = false;
    for (i, (field, &kind)) in schema.fields().iter().zip(kinds).enumerate() {
        let name = field.name();
        let found = map.get(name.as_str()).or_else(|| {
            map.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v)
        });
        if event_time == Some(i) {
            epoch_time = matches!(found, Some(Value::Number(_)));
        }
        vals[i] = match found {
            None => Val::Null,
            Some(v) if kind == Kind::Nested => {
                nested_json(field.data_type(), name, v, unit, arena)?
            }
            Some(v) => json_value(kind, name, v, unit, arena)?,
        };
    }
    Ok(epoch_time)
}

/// Checks a nested column's value and keeps its JSON text in `arena`.
fn nested_json(
    data_type: &DataType,
    column: &str,
    value: &Value,
    unit: TsUnit,
    arena: &mut String,
) -> std::result::Result<Val, String> {
    if nested::typed(data_type, value, unit, column)?.is_null() {
        return Ok(Val::Null);
    }
    let start = arena.len();
    arena.push_str(&value.to_string());
    Ok(Val::Text(start, arena.len()))
}

/// The serde visitors of [`fast_json_row`]. Every value is judged by
/// [`json_value`], as in the slow path; strings, which a `Value` would
/// allocate, are handled here the way `json_value` handles them. Anything
/// else fails, sending the row to the slow path.
mod fast_json {
    use std::fmt;

    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
    use serde_json::Value;

    use super::{Kind, SchemaRef, TsUnit, Val, json_value, parse_timestamp};

    /// Why the fast path gave up; never shown.
    fn give_up<E: serde::de::Error>() -> E {
        E::custom("not on the fast path")
    }

    pub(super) struct RowSeed<'a> {
        pub schema: &'a SchemaRef,
        pub kinds: &'a [Kind],
        pub unit: TsUnit,
        pub event_time: Option<usize>,
        pub vals: &'a mut [Val],
        pub arena: &'a mut String,
        pub epoch_time: &'a mut bool,
    }

    impl<'de> DeserializeSeed<'de> for RowSeed<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_map(self)
        }
    }

    impl<'de> Visitor<'de> for RowSeed<'_> {
        type Value = ();

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON object")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key_seed(KeySeed(self.schema))? {
                let Some(i) = key else {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                };
                let value = ValueSeed {
                    kind: self.kinds[i],
                    column: self.schema.field(i).name(),
                    unit: self.unit,
                    arena: self.arena,
                };
                let (val, number) = map.next_value_seed(value)?;
                self.vals[i] = val;
                if self.event_time == Some(i) {
                    *self.epoch_time = number;
                }
            }
            Ok(())
        }
    }

    /// A key: the index of the column it names exactly, `None` for a key
    /// no column has in any case; a key that names a column only ignoring
    /// case fails (the slow path decides which key wins then).
    struct KeySeed<'a>(&'a SchemaRef);

    impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
        type Value = Option<usize>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
            d.deserialize_str(self)
        }
    }

    impl<'de> Visitor<'de> for KeySeed<'_> {
        type Value = Option<usize>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a key")
        }

        fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Option<usize>, E> {
            let fields = self.0.fields();
            let exact = fields.iter().position(|f| f.name() == key);
            // Another column may read this key too, ignoring case.
            let near = fields.iter().filter(|f| f.name().eq_ignore_ascii_case(key));
            match (exact, near.count()) {
                (Some(i), 1) => Ok(Some(i)),
                (None, 0) => Ok(None),
                _ => Err(give_up()),
            }
        }
    }

    /// A column's value, and whether it was a number.
    struct ValueSeed<'a> {
        kind: Kind,
        column: &'a str,
        unit: TsUnit,
        arena: &'a mut String,
    }

    impl ValueSeed<'_> {
        fn judge<E: serde::de::Error>(self, value: Value) -> Result<(Val, bool), E> {
            let number = value.is_number();
            let val = json_value(self.kind, self.column, &value, self.unit, self.arena)
                .map_err(|_| give_up::<E>())?;
            Ok((val, number))
        }
    }

    impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
        type Value = (Val, bool);
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(Val, bool), D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for ValueSeed<'_> {
        type Value = (Val, bool);

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a scalar")
        }

        fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<(Val, bool), E> {
            self.judge(Value::Bool(b))
        }

        fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<(Val, bool), E> {
            self.judge(Value::from(n))
        }

        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<(Val, bool), E> {
            self.judge(Value::from(n))
        }

        fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<(Val, bool), E> {
            match serde_json::Number::from_f64(n) {
                Some(n) => self.judge(Value::Number(n)),
                None => Err(give_up()),
            }
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<(Val, bool), E> {
            self.judge(Value::Null)
        }

        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<(Val, bool), E> {
            let val = match self.kind {
                Kind::Text => {
                    let start = self.arena.len();
                    self.arena.push_str(s);
                    Val::Text(start, self.arena.len())
                }
                Kind::Timestamp => Val::Int(parse_timestamp(s, self.unit).ok_or_else(give_up)?),
                _ => return Err(give_up()),
            };
            Ok((val, false))
        }
    }
}

fn read_jsonl<R: Read>(mut input: Input<'_, R>, d: &mut Driver<'_>) -> Result<()> {
    let schema = d.batcher.schema.clone();
    let kinds = d.batcher.kinds.clone();
    let unit = d.decode.ts_unit;
    let mut vals = vec![Val::Null; kinds.len()];
    let mut arena = String::new();
    let mut buf = Vec::new();
    if !d.accept_pending()? {
        return Ok(());
    }
    let parallel = d.parallel(&input);
    loop {
        if parallel {
            let lines = parallel::Lines::new(d, None);
            if !parallel::decode(&mut input, d, &lines)? {
                return Ok(());
            }
            break;
        }
        match input.next_line(&mut buf, d.decode.max_record_size)? {
            Next::Line { .. } => {}
            Next::Idle if d.idle()? => continue,
            Next::Idle => return Ok(()),
            Next::End => break,
        }
        let at = input.at();
        let text = buf.trim_ascii();
        if let Some(length) = input.overlong {
            let reason = overlong_reason(length, d.decode.max_record_size);
            d.bad(at.number, reason, text)?;
        } else if !text.is_empty() {
            let parsed = parse_json_row(
                text,
                &schema,
                &kinds,
                unit,
                d.batcher.event_time,
                &mut vals,
                &mut arena,
            );
            let keep_going = match parsed {
                Ok(epoch_time) => d.row(Row {
                    line: at.number,
                    vals: &vals,
                    text: arena.as_bytes(),
                    raw: text,
                    epoch_time,
                    end: at.after,
                })?,
                Err(reason) => {
                    d.bad(at.number, reason, text)?;
                    true
                }
            };
            if !keep_going {
                return Ok(());
            }
        }
        d.advance(at.after);
        if !d.flush_if_dry(&input)? {
            return Ok(());
        }
    }
    if d.stopped() {
        // Stopped, not ended: held rows stay undecided.
        return d.flush().map(drop);
    }
    d.finish()
}

#[cfg(test)]
mod tests;

/// Positions and resuming: a read resumed at any position a read stored
/// gives exactly what the uninterrupted read gave after it.
#[cfg(test)]
mod resume_tests;

/// Properties of the decoders over random input: rows or counted bad rows,
/// never a panic, and in a line-oriented source every non-blank line is
/// exactly one row or one bad row.
#[cfg(test)]
mod properties;
