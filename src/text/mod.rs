//! The text kit: reading a stream's rows from a CSV or JSONL file (or
//! stdin, or bytes a connector received) into Arrow batches. The file,
//! stdin and push connectors, Kafka and the scrapers decode through it, and
//! the runtime reads file and stdin streams with it.
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

use crate::connector::{
    BadRow, Decoding, Format, Replay, SourceConfig, SourceLocation, SourcePosition, SourceStats,
};
use crate::error::{Error, Result};
use crate::timestamp::TsUnit;
use crate::timestamp::{is_epoch_number, parse_timestamp};
use guard::{Admit, FutureGuard, GuardState, JUMP_ROWS, UnitCheck, UnitState};

mod driver;
mod guard;
use driver::*;
mod follow;
use follow::*;
mod saved;
use saved::*;
mod csv;
use csv::*;
mod json;
use json::*;
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
/// own module, through [`SourceRead`](crate::connector::SourceRead).
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
