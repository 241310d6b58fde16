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

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use datafusion::arrow::array::{
    ArrayRef, BooleanBuilder, Float64Builder, Int64Builder, StringBuilder,
    TimestampMillisecondBuilder,
};
use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use serde_json::Value;

use super::timestamp::{in_range, parse_timestamp_ms};
use super::{BadRow, Format, Replay, SourceConfig, SourceLocation, SourceStats};
use crate::error::{Error, Result};

/// Size of the read buffer for files and stdin.
const READ_BUFFER: usize = 1 << 16;

/// How often a followed file is checked for new bytes, and the longest a
/// pause (realtime replay, following) goes without looking at `stop`.
const POLL: Duration = Duration::from_millis(100);

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
/// Errors: a missing or unreadable file (`cannot open <path>: ...`), a
/// declared column absent from the CSV header, an unsupported column type, a
/// read error, or a failure to write the dead-letter file.
///
/// The file-less connectors are read by their own modules: `host` samples
/// this machine until its `limit` (see [`host`](super::host)), `demo`
/// replays the bundled series (see [`demo`](super::demo)).
pub fn read_source(
    config: &SourceConfig,
    stats: &SourceStats,
    emit: &mut dyn FnMut(RecordBatch) -> bool,
) -> Result<()> {
    match &config.location {
        SourceLocation::File(path) => {
            let mut driver = Driver::new(config, stats, emit)?;
            let file = File::open(path)
                .map_err(|e| Error::Connector(format!("cannot open {}: {e}", path.display())))?;
            let name = path.display().to_string();
            // A pipe or socket is read like stdin: rows go on as soon as a
            // read comes back short, not when a batch fills.
            let regular = file.metadata().is_ok_and(|m| m.file_type().is_file());
            if config.follow && regular {
                let follow = Follow::new(file, &stats.stop);
                return read_format(config.format, follow, &name, true, &mut driver);
            }
            read_format(config.format, file, &name, !regular, &mut driver)
        }
        SourceLocation::Stdin => {
            let mut driver = Driver::new(config, stats, emit)?;
            let stdin = io::stdin();
            let lock = stdin.lock();
            read_format(config.format, lock, "<stdin>", true, &mut driver)
        }
        SourceLocation::Push => Err(Error::Connector(format!(
            "stream {} is fed by its program (connector 'push'): embed vigil or use `vigil serve` to push rows into it",
            config.stream
        ))),
        SourceLocation::Host { interval, limit } => {
            super::host::read_host(config, *interval, *limit, stats, emit)
        }
        SourceLocation::Demo { speed, limit } => {
            super::demo::read_demo(config, *speed, *limit, stats, emit)
        }
    }
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
    read_format(format, bytes, "<pushed rows>", false, &mut driver)
}

fn read_format<R: Read>(
    format: Format,
    input: R,
    name: &str,
    live: bool,
    driver: &mut Driver<'_>,
) -> Result<()> {
    let result = match format {
        Format::Csv => read_csv(input, name, live, driver),
        Format::Jsonl => read_jsonl(input, name, live, driver),
    };
    // Close the dead-letter file even when reading failed.
    let closed = driver.close_dead_letter();
    result.and(closed)
}

/// The value kinds a source can produce, one per supported column type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Timestamp,
    Text,
    Float,
    Int,
    Bool,
}

impl Kind {
    fn of(data_type: &DataType) -> Option<Kind> {
        match data_type {
            DataType::Timestamp(TimeUnit::Millisecond, _) => Some(Kind::Timestamp),
            DataType::Utf8 => Some(Kind::Text),
            DataType::Float64 => Some(Kind::Float),
            DataType::Int64 => Some(Kind::Int),
            DataType::Boolean => Some(Kind::Bool),
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
}

/// Accumulates rows into Arrow builders for one schema.
struct Batcher {
    schema: SchemaRef,
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
                     (supported: TIMESTAMP, TEXT, DOUBLE, BIGINT, BOOLEAN)",
                    config.stream,
                    field.name(),
                    field.data_type()
                ))
            })?;
            kinds.push(kind);
        }
        let capacity = config.batch_size.clamp(1, 1 << 16);
        let mut batcher = Batcher {
            schema: config.schema.clone(),
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
            .map(|k| match k {
                Kind::Timestamp => {
                    ColBuilder::Timestamp(TimestampMillisecondBuilder::with_capacity(cap))
                }
                Kind::Text => ColBuilder::Text(StringBuilder::with_capacity(cap, cap * 8)),
                Kind::Float => ColBuilder::Float(Float64Builder::with_capacity(cap)),
                Kind::Int => ColBuilder::Int(Int64Builder::with_capacity(cap)),
                Kind::Bool => ColBuilder::Bool(BooleanBuilder::with_capacity(cap)),
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
                (ColBuilder::Timestamp(b), _) => b.append_null(),
                (ColBuilder::Int(b), _) => b.append_null(),
                (ColBuilder::Float(b), _) => b.append_null(),
                (ColBuilder::Bool(b), _) => b.append_null(),
                (ColBuilder::Text(b), _) => b.append_null(),
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
            .map(|(b, field)| -> ArrayRef {
                match b {
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
                }
            })
            .collect();
        let options = RecordBatchOptions::new().with_row_count(Some(self.len));
        self.len = 0;
        let batch = RecordBatch::try_new_with_options(self.schema.clone(), columns, &options)?;
        Ok(Some(batch))
    }
}

/// Most a followed file is read ahead of what was handed out.
const FOLLOW_READ_AHEAD: usize = 1 << 20;

/// A regular file read `tail -f` style: at its end, a read waits for more
/// bytes instead of returning 0, until `stop` is set.
///
/// Only whole lines are handed out: a partial last line is held back until
/// its newline arrives. So the reader never waits in the middle of a row
/// (a quoted CSV field spanning lines aside), and the rows it holds go on
/// before it waits for more. The last read of what the file has comes back
/// short, which tells the reader that nothing more is available for now.
struct Follow<'a> {
    file: File,
    /// Bytes read from the file and not yet handed out start at `start`;
    /// those before `ready` end with a newline.
    buf: Vec<u8>,
    start: usize,
    ready: usize,
    /// Bytes read from the file so far.
    size: u64,
    stop: &'a AtomicBool,
}

impl<'a> Follow<'a> {
    fn new(file: File, stop: &'a AtomicBool) -> Self {
        Follow {
            file,
            buf: Vec::new(),
            start: 0,
            ready: 0,
            size: 0,
            stop,
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
        if got == 0 {
            let len = self.file.metadata()?.len();
            if len < self.size {
                return Err(io::Error::other(format!(
                    "the file shrank from {} to {len} bytes while being followed \
                     (truncated or rotated)",
                    self.size
                )));
            }
        }
        Ok(got > 0)
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
            }
        }
    }
}

/// Sleeps for `wait`, waking early once `stop` is set.
fn pause(wait: Duration, stop: &AtomicBool) {
    let until = Instant::now() + wait;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || stop.load(Ordering::Relaxed) {
            return;
        }
        std::thread::sleep(left.min(POLL));
    }
}

/// Sleeps between rows to replay event-time gaps at a given speed.
struct Pacer {
    column: usize,
    speed: f64,
    origin: Option<(Instant, i64)>,
}

impl Pacer {
    /// How long to wait before releasing a row with event time `t`.
    fn delay(&mut self, t: i64) -> Option<Duration> {
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

/// The dead-letter file, opened (for appending) on the first bad row.
struct DeadLetter {
    path: PathBuf,
    out: Option<BufWriter<File>>,
}

impl DeadLetter {
    fn write(&mut self, line: u64, reason: &str, raw: &[u8]) -> Result<()> {
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
        let mut text = Vec::with_capacity(raw.len() + reason.len() + 24);
        write!(text, "{line}\t{reason}\t").expect("writing to a Vec cannot fail");
        for &b in raw {
            match b {
                b'\n' => text.extend_from_slice(b"\\n"),
                b'\r' => text.extend_from_slice(b"\\r"),
                _ => text.push(b),
            }
        }
        text.push(b'\n');
        out.write_all(&text).map_err(|e| self.io_error(e))
    }

    fn close(&mut self) -> Result<()> {
        match self.out.take() {
            Some(mut out) => out.flush().map_err(|e| self.io_error(e)),
            None => Ok(()),
        }
    }

    fn io_error(&self, e: io::Error) -> Error {
        Error::io(
            format!("writing dead-letter file {}", self.path.display()),
            e,
        )
    }
}

/// Shared row handling for both formats: batching, pacing, bad rows.
struct Driver<'a> {
    stream: &'a str,
    stats: &'a SourceStats,
    emit: &'a mut dyn FnMut(RecordBatch) -> bool,
    batcher: Batcher,
    batch_size: usize,
    pacer: Option<Pacer>,
    dead_letter: Option<DeadLetter>,
    /// The largest event time among the rows taken since the last flush.
    max_event_time: i64,
}

impl<'a> Driver<'a> {
    fn new(
        config: &'a SourceConfig,
        stats: &'a SourceStats,
        emit: &'a mut dyn FnMut(RecordBatch) -> bool,
    ) -> Result<Driver<'a>> {
        let pacer = match (config.replay, config.event_time) {
            (Replay::Realtime { speed }, Some(column)) if speed > 0.0 => Some(Pacer {
                column,
                speed,
                origin: None,
            }),
            _ => None,
        };
        Ok(Driver {
            stream: &config.stream,
            stats,
            emit,
            batcher: Batcher::new(config)?,
            batch_size: config.batch_size.max(1),
            pacer,
            dead_letter: config
                .dead_letter
                .clone()
                .map(|path| DeadLetter { path, out: None }),
            max_event_time: i64::MIN,
        })
    }

    /// Takes one parsed row. Returns `Ok(false)` once downstream is gone.
    /// `line` computes the row's line number; it is only called when the
    /// row turns out to be bad.
    fn row(
        &mut self,
        line: impl FnOnce() -> u64,
        vals: &[Val],
        text: &[u8],
        raw: RawRow<'_>,
    ) -> Result<bool> {
        if self.stats.stop.load(Ordering::Relaxed) {
            self.flush()?;
            return Ok(false);
        }
        if let Err(reason) = self.batcher.check(vals) {
            self.bad(line(), reason, raw)?;
            return Ok(true);
        }
        if let Some(pacer) = &mut self.pacer
            && let Val::Int(t) = vals[pacer.column]
            && let Some(wait) = pacer.delay(t)
        {
            if !self.flush()? {
                return Ok(false);
            }
            pause(wait, &self.stats.stop);
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

    /// Records a malformed row.
    fn bad(&mut self, line: u64, reason: String, raw: RawRow<'_>) -> Result<()> {
        if let Some(dead) = &mut self.dead_letter {
            let mut buf = Vec::new();
            raw.render(&mut buf);
            dead.write(line, &reason, &buf)?;
        }
        self.stats.record_bad(BadRow { line, reason });
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
                Ok((self.emit)(batch))
            }
            None => Ok(true),
        }
    }

    fn pending(&self) -> bool {
        self.batcher.len > 0
    }

    fn close_dead_letter(&mut self) -> Result<()> {
        match &mut self.dead_letter {
            Some(dead) => dead.close(),
            None => Ok(()),
        }
    }
}

/// The original text of a row, rendered only when it goes to the dead-letter
/// file.
#[derive(Clone, Copy)]
enum RawRow<'r> {
    Csv(&'r csv::ByteRecord),
    Line(&'r [u8]),
}

impl RawRow<'_> {
    fn render(self, out: &mut Vec<u8>) {
        match self {
            RawRow::Line(bytes) => out.extend_from_slice(bytes),
            RawRow::Csv(record) => {
                let mut w = csv::WriterBuilder::new()
                    .terminator(csv::Terminator::Any(b'\n'))
                    .from_writer(&mut *out);
                // Writing into a Vec cannot fail.
                let last = record.len().saturating_sub(1);
                let _ = w.write_record(record.iter().enumerate().map(|(i, f)| {
                    if i == last {
                        f.strip_suffix(b"\r").unwrap_or(f)
                    } else {
                        f
                    }
                }));
                let _ = w.flush();
                drop(w);
                if out.last() == Some(&b'\n') {
                    out.pop();
                }
            }
        }
    }
}

/// A reader that remembers how many bytes it has produced and whether the
/// last read returned less than was asked for (i.e. the input had nothing
/// more available at that moment).
struct Tracked<R> {
    inner: R,
    total: u64,
    short: bool,
    eof: bool,
}

impl<R: Read> Tracked<R> {
    fn new(inner: R) -> Self {
        Tracked {
            inner,
            total: 0,
            short: false,
            eof: false,
        }
    }
}

impl<R: Read> Read for Tracked<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.total += n as u64;
        self.short = n < buf.len();
        self.eof |= n == 0 && !buf.is_empty();
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

/// Finds each declared column in the header: exact name first, then
/// case-insensitively.
fn map_header(
    config_schema: &SchemaRef,
    stream: &str,
    header: &csv::ByteRecord,
    name: &str,
) -> Result<Vec<usize>> {
    let names: Vec<String> = header
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let s = String::from_utf8_lossy(f);
            let s = if i == 0 {
                s.trim_start_matches('\u{feff}')
            } else {
                &s
            };
            s.trim().to_string()
        })
        .collect();
    let mut columns = Vec::with_capacity(config_schema.fields().len());
    for field in config_schema.fields() {
        let wanted = field.name();
        let found = names.iter().position(|n| n == wanted).or_else(|| {
            names
                .iter()
                .position(|n| n.to_lowercase() == wanted.to_lowercase())
        });
        match found {
            Some(i) => columns.push(i),
            None => {
                return Err(Error::Connector(format!(
                    "stream {stream}: column {wanted} not found in the header of {name} \
                     (header columns: {})",
                    names.join(", ")
                )));
            }
        }
    }
    Ok(columns)
}

/// Parses one CSV field of the given kind.
fn parse_csv_field(
    kind: Kind,
    column: &str,
    record: &csv::ByteRecord,
    index: usize,
) -> std::result::Result<Val, String> {
    let mut bytes = record.get(index).unwrap_or_default();
    // Lines end at '\n'; drop the '\r' of a CRLF ending from the last field.
    if index + 1 == record.len()
        && let Some(stripped) = bytes.strip_suffix(b"\r")
    {
        bytes = stripped;
    }
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Err(format!("column {column}: invalid UTF-8"));
    };
    if kind == Kind::Text {
        if text.is_empty() {
            return Ok(Val::Null);
        }
        let start = record.range(index).map_or(0, |r| r.start);
        return Ok(Val::Text(start, start + text.len()));
    }
    let value = text.trim_ascii();
    if value.is_empty() {
        return Ok(Val::Null);
    }
    let parsed = match kind {
        Kind::Timestamp => parse_timestamp_ms(value).map(Val::Int),
        Kind::Float => value.parse::<f64>().ok().map(Val::Float),
        Kind::Int => value.parse::<i64>().ok().map(Val::Int),
        Kind::Bool => parse_bool(value).map(Val::Bool),
        Kind::Text => unreachable!("handled above"),
    };
    parsed.ok_or_else(|| {
        format!(
            "column {column}: cannot parse {} as {}",
            quote(value),
            kind.sql_name()
        )
    })
}

fn read_csv<R: Read>(input: R, name: &str, live: bool, d: &mut Driver<'_>) -> Result<()> {
    let read_error = |e: csv::Error| match e.into_kind() {
        csv::ErrorKind::Io(e) => Error::io(format!("reading {name}"), e),
        other => Error::Connector(format!("reading {name}: {other:?}")),
    };
    // Records end at '\n' only, so that csv's line counter sees every line
    // ending exactly once; a CRLF's '\r' is stripped from the last field.
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .terminator(csv::Terminator::Any(b'\n'))
        .buffer_capacity(READ_BUFFER)
        .from_reader(Tracked::new(input));
    let is_blank = |r: &csv::ByteRecord| r.len() == 1 && &r[0] == b"\r";
    // The header is the first non-blank record (empty if there is none).
    let mut header = csv::ByteRecord::new();
    while rdr.read_byte_record(&mut header).map_err(read_error)? && is_blank(&header) {}
    if header.is_empty() {
        // No header and no rows: an empty stream, not an error.
        return Ok(());
    }
    let schema = d.batcher.schema.clone();
    let columns = map_header(&schema, d.stream, &header, name)?;
    let kinds = d.batcher.kinds.clone();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();

    let mut record = csv::ByteRecord::new();
    let mut vals = vec![Val::Null; columns.len()];
    while rdr.read_byte_record(&mut record).map_err(read_error)? {
        if is_blank(&record) {
            continue; // a blank CRLF line
        }
        // The record's first line: csv's line counter (1 + the number of
        // '\n' consumed so far) minus the newlines inside quoted fields, minus
        // the record's own terminator unless it ended at end of input. (The
        // position csv stores in the record can be off after blank lines.)
        let line_after = rdr.position().line();
        let terminated = u64::from(!rdr.get_ref().eof);
        let line = || {
            let inner = record.as_slice().iter().filter(|&&b| b == b'\n').count() as u64;
            line_after.saturating_sub(inner + terminated)
        };
        let keep_going = if record.len() != header.len() {
            let reason = format!("expected {} fields, found {}", header.len(), record.len());
            d.bad(line(), reason, RawRow::Csv(&record))?;
            true
        } else {
            let mut failure = None;
            for (i, (&index, &kind)) in columns.iter().zip(&kinds).enumerate() {
                match parse_csv_field(kind, names[i], &record, index) {
                    Ok(v) => vals[i] = v,
                    Err(reason) => {
                        failure = Some(reason);
                        break;
                    }
                }
            }
            match failure {
                Some(reason) => {
                    d.bad(line(), reason, RawRow::Csv(&record))?;
                    true
                }
                None => d.row(line, &vals, record.as_slice(), RawRow::Csv(&record))?,
            }
        };
        if !keep_going {
            return Ok(());
        }
        // On live input, emit what we have before a read that may block.
        if live && d.pending() {
            let src = rdr.get_ref();
            if src.short && rdr.position().byte() >= src.total && !d.flush()? {
                return Ok(());
            }
        }
    }
    d.flush()?;
    Ok(())
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
        (Kind::Timestamp, Value::Number(n)) if n.as_i64().is_some_and(|ms| !in_range(ms)) => {
            return Err(format!("column {column}: timestamp {n} is out of range"));
        }
        (Kind::Int | Kind::Timestamp, Value::Number(n)) => match n.as_i64() {
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
        (Kind::Timestamp, Value::String(s)) => match parse_timestamp_ms(s) {
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

fn parse_json_row(
    text: &[u8],
    schema: &SchemaRef,
    kinds: &[Kind],
    vals: &mut [Val],
    arena: &mut String,
) -> std::result::Result<(), String> {
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
    for (i, (field, &kind)) in schema.fields().iter().zip(kinds).enumerate() {
        let name = field.name();
        let found = map.get(name.as_str()).or_else(|| {
            map.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v)
        });
        vals[i] = match found {
            None => Val::Null,
            Some(v) => json_value(kind, name, v, arena)?,
        };
    }
    Ok(())
}

fn read_jsonl<R: Read>(input: R, name: &str, live: bool, d: &mut Driver<'_>) -> Result<()> {
    let mut rdr = BufReader::with_capacity(READ_BUFFER, Tracked::new(input));
    let schema = d.batcher.schema.clone();
    let kinds = d.batcher.kinds.clone();
    let mut vals = vec![Val::Null; kinds.len()];
    let mut arena = String::new();
    let mut buf = Vec::new();
    let mut line = 0u64;
    loop {
        buf.clear();
        let n = rdr
            .read_until(b'\n', &mut buf)
            .map_err(|e| Error::io(format!("reading {name}"), e))?;
        if n == 0 {
            break;
        }
        line += 1;
        let text = buf.trim_ascii();
        if !text.is_empty() {
            let keep_going = match parse_json_row(text, &schema, &kinds, &mut vals, &mut arena) {
                Ok(()) => d.row(|| line, &vals, arena.as_bytes(), RawRow::Line(text))?,
                Err(reason) => {
                    d.bad(line, reason, RawRow::Line(text))?;
                    true
                }
            };
            if !keep_going {
                return Ok(());
            }
        }
        if live && d.pending() && rdr.buffer().is_empty() && rdr.get_ref().short && !d.flush()? {
            return Ok(());
        }
    }
    d.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use datafusion::arrow::array::{
        Array, BooleanArray, Float64Array, Int64Array, StringArray, TimestampMillisecondArray,
    };
    use datafusion::arrow::datatypes::{Field, Schema};

    use super::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
            Field::new("host", DataType::Utf8, true),
            Field::new("cpu", DataType::Float64, true),
            Field::new("n", DataType::Int64, true),
            Field::new("up", DataType::Boolean, true),
        ]))
    }

    fn config(format: Format, location: SourceLocation) -> SourceConfig {
        SourceConfig {
            stream: "m".to_string(),
            schema: schema(),
            location,
            format,
            replay: Replay::Fast,
            event_time: Some(0),
            batch_size: 100,
            dead_letter: None,
            follow: false,
        }
    }

    struct Run {
        batches: Vec<RecordBatch>,
        stats: SourceStats,
        result: Result<()>,
    }

    impl Run {
        fn rows(&self) -> usize {
            self.batches.iter().map(|b| b.num_rows()).sum()
        }

        fn bad(&self) -> Vec<(u64, String)> {
            self.stats
                .bad_samples
                .lock()
                .unwrap()
                .iter()
                .map(|b| (b.line, b.reason.clone()))
                .collect()
        }

        fn lines(&self) -> Vec<u64> {
            self.bad().into_iter().map(|(l, _)| l).collect()
        }

        /// All rows, each rendered as a string of its values.
        fn table(&self) -> Vec<String> {
            let mut out = Vec::new();
            for b in &self.batches {
                assert_eq!(b.schema(), schema());
                let ts = b
                    .column(0)
                    .as_any()
                    .downcast_ref::<TimestampMillisecondArray>()
                    .unwrap();
                let host = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
                let cpu = b.column(2).as_any().downcast_ref::<Float64Array>().unwrap();
                let n = b.column(3).as_any().downcast_ref::<Int64Array>().unwrap();
                let up = b.column(4).as_any().downcast_ref::<BooleanArray>().unwrap();
                for i in 0..b.num_rows() {
                    let cell = |a: &dyn Array, s: String| {
                        if a.is_null(i) { "NULL".to_string() } else { s }
                    };
                    out.push(format!(
                        "{}|{}|{}|{}|{}",
                        cell(ts, ts.value(i).to_string()),
                        cell(host, host.value(i).to_string()),
                        cell(cpu, cpu.value(i).to_string()),
                        cell(n, n.value(i).to_string()),
                        cell(up, up.value(i).to_string()),
                    ));
                }
            }
            out
        }
    }

    fn run_reader<R: Read>(cfg: &SourceConfig, input: R, live: bool) -> Run {
        let stats = SourceStats::default();
        let mut batches = Vec::new();
        let mut emit = |b: RecordBatch| {
            batches.push(b);
            true
        };
        let result = Driver::new(cfg, &stats, &mut emit)
            .and_then(|mut d| read_format(cfg.format, input, "test-input", live, &mut d));
        Run {
            batches,
            stats,
            result,
        }
    }

    fn run_csv(text: &str) -> Run {
        let cfg = config(Format::Csv, SourceLocation::Stdin);
        let run = run_reader(&cfg, Cursor::new(text.as_bytes().to_vec()), false);
        assert!(run.result.is_ok(), "{:?}", run.result);
        run
    }

    fn run_jsonl(text: &str) -> Run {
        let cfg = config(Format::Jsonl, SourceLocation::Stdin);
        let run = run_reader(&cfg, Cursor::new(text.as_bytes().to_vec()), false);
        assert!(run.result.is_ok(), "{:?}", run.result);
        run
    }

    #[test]
    fn csv_basic_and_types() {
        let run = run_csv(
            "ts,host,cpu,n,up\n\
             1970-01-01T00:00:10Z,a,1.5,7,true\n\
             1970-01-01 00:00:11.250,b,-2,-3,f\n\
             12000, c ,1e3, 42 ,0\n",
        );
        assert_eq!(
            run.table(),
            vec![
                "10000|a|1.5|7|true",
                "11250|b|-2|-3|false",
                "12000| c |1000|42|false",
            ]
        );
        assert_eq!(run.stats.rows.load(Ordering::Relaxed), 3);
        assert_eq!(run.stats.bad_rows.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn csv_extra_and_reordered_columns() {
        let run = run_csv(
            "extra,UP,n,cpu,Host,ts,more\n\
             x,true,1,0.5,h1,1000,y\n\
             z,false,2,0.25,h2,2000,w\n",
        );
        assert_eq!(
            run.table(),
            vec!["1000|h1|0.5|1|true", "2000|h2|0.25|2|false"]
        );
    }

    #[test]
    fn csv_exact_header_match_wins() {
        let cfg = SourceConfig {
            schema: Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, true)])),
            event_time: None,
            ..config(Format::Csv, SourceLocation::Stdin)
        };
        let run = run_reader(&cfg, Cursor::new(b"V,v\n1,2\n".to_vec()), false);
        let col = run.batches[0]
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        assert_eq!(col.value(0), 2);
    }

    #[test]
    fn csv_quoted_fields() {
        let run = run_csv(
            "ts,host,cpu,n,up\n\
             1000,\"a, \"\"quoted\"\" host\",\"2.5\",1,true\n\
             2000,\"two\nlines\",3,2,false\n\
             3000,x,abc,3,true\n",
        );
        assert_eq!(
            run.table(),
            vec![
                "1000|a, \"quoted\" host|2.5|1|true",
                "2000|two\nlines|3|2|false"
            ]
        );
        // The multi-line record occupies lines 3-4, so the bad row is line 5.
        assert_eq!(
            run.bad(),
            vec![(5, "column cpu: cannot parse 'abc' as DOUBLE".to_string())]
        );
    }

    #[test]
    fn csv_empty_fields_are_null() {
        let run = run_csv("ts,host,cpu,n,up\n1000,,,,\n2000,\"\",  ,,\n");
        assert_eq!(
            run.table(),
            vec!["1000|NULL|NULL|NULL|NULL", "2000|NULL|NULL|NULL|NULL"]
        );
    }

    #[test]
    fn csv_bad_rows_with_line_numbers() {
        let run = run_csv(
            "ts,host,cpu,n,up\n\
             1000,a,1,1,true\n\
             2000,a,1\n\
             3000,a,1,1,true,extra\n\
             4000,a,x1,1,true\n\
             5000,a,1,1.5,true\n\
             yesterday,a,1,1,true\n\
             \n\
             6000,a,1,1,maybe\n\
             ,a,1,1,true\n\
             7000,a,1,1,true\n",
        );
        assert_eq!(run.table(), vec!["1000|a|1|1|true", "7000|a|1|1|true"]);
        assert_eq!(
            run.bad(),
            vec![
                (3, "expected 5 fields, found 3".to_string()),
                (4, "expected 5 fields, found 6".to_string()),
                (5, "column cpu: cannot parse 'x1' as DOUBLE".to_string()),
                (6, "column n: cannot parse '1.5' as BIGINT".to_string()),
                (
                    7,
                    "column ts: cannot parse 'yesterday' as TIMESTAMP".to_string()
                ),
                (9, "column up: cannot parse 'maybe' as BOOLEAN".to_string()),
                (10, "column ts: missing event time".to_string()),
            ]
        );
        assert_eq!(run.stats.rows.load(Ordering::Relaxed), 2);
        assert_eq!(run.stats.bad_rows.load(Ordering::Relaxed), 7);
    }

    #[test]
    fn csv_crlf_line_endings() {
        let run = run_csv("ts,host,cpu,n,up\r\n1000,a,1,1,true\r\n2000,a,oops,1,true\r\n");
        assert_eq!(run.table(), vec!["1000|a|1|1|true"]);
        assert_eq!(run.lines(), vec![3]);
    }

    #[test]
    fn csv_line_numbers_with_blank_lines_crlf_and_quotes() {
        let run = run_csv(
            "\r\n\
             ts,host,cpu,n,up\r\n\
             \r\n\
             \n\
             1000,a,x,1,true\r\n\
             2000,\"multi\r\nline\",1,1,true\r\n\
             \r\n\
             3000,b,1,1,true,extra\r\n\
             4000,\"q\",1,1,\"true\"\r\n\
             5000,c,1,1,bad",
        );
        assert_eq!(
            run.table(),
            vec!["2000|multi\r\nline|1|1|true", "4000|q|1|1|true"]
        );
        assert_eq!(run.lines(), vec![5, 9, 11]);
        assert_eq!(run.bad()[2].1, "column up: cannot parse 'bad' as BOOLEAN");
    }

    #[test]
    fn csv_crlf_text_in_last_column() {
        let cfg = SourceConfig {
            schema: Arc::new(Schema::new(vec![
                Field::new("n", DataType::Int64, true),
                Field::new("s", DataType::Utf8, true),
            ])),
            event_time: None,
            ..config(Format::Csv, SourceLocation::Stdin)
        };
        let input = b"n,s\r\n1,abc\r\n2,\"q\"\r\n3,\r\n4\r\n".to_vec();
        let run = run_reader(&cfg, Cursor::new(input), false);
        let b = &run.batches[0];
        let s = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!(s.value(0), "abc");
        assert_eq!(s.value(1), "q");
        assert!(s.is_null(2));
        assert_eq!(
            run.bad(),
            vec![(5, "expected 2 fields, found 1".to_string())]
        );
    }

    #[test]
    fn csv_invalid_utf8_is_a_bad_row() {
        let cfg = config(Format::Csv, SourceLocation::Stdin);
        let input = b"ts,host,cpu,n,up\n1000,\xff\xfe,1,1,true\n2000,b,1,1,true\n".to_vec();
        let run = run_reader(&cfg, Cursor::new(input), false);
        assert_eq!(run.table(), vec!["2000|b|1|1|true"]);
        assert_eq!(
            run.bad(),
            vec![(2, "column host: invalid UTF-8".to_string())]
        );
    }

    #[test]
    fn csv_missing_header_column_is_an_error() {
        let cfg = config(Format::Csv, SourceLocation::Stdin);
        let run = run_reader(
            &cfg,
            Cursor::new(b"ts,host,cpu,up\n1,a,1,true\n".to_vec()),
            false,
        );
        let msg = run.result.unwrap_err().to_string();
        assert!(
            msg.contains("column n") && msg.contains("test-input"),
            "{msg}"
        );
        assert!(run.batches.is_empty());
    }

    #[test]
    fn empty_input_is_an_empty_stream() {
        let cfg = config(Format::Csv, SourceLocation::Stdin);
        let run = run_reader(&cfg, Cursor::new(Vec::new()), false);
        assert!(run.result.is_ok());
        assert!(run.batches.is_empty());
        assert_eq!(run.stats.bad_rows.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn header_only_emits_nothing() {
        let run = run_csv("ts,host,cpu,n,up\n");
        assert!(run.batches.is_empty());
        assert_eq!(run.stats.rows.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn batches_split_at_batch_size() {
        let mut text = String::from("ts,host,cpu,n,up\n");
        for i in 0..7 {
            text.push_str(&format!("{i},h,1,{i},true\n"));
        }
        let cfg = SourceConfig {
            batch_size: 3,
            ..config(Format::Csv, SourceLocation::Stdin)
        };
        let run = run_reader(&cfg, Cursor::new(text.into_bytes()), false);
        let sizes: Vec<usize> = run.batches.iter().map(|b| b.num_rows()).collect();
        assert_eq!(sizes, vec![3, 3, 1]);
        assert_eq!(run.stats.rows.load(Ordering::Relaxed), 7);

        let mut text = String::new();
        for i in 0..6 {
            text.push_str(&format!("{{\"ts\":{i}}}\n"));
        }
        let cfg = SourceConfig {
            batch_size: 3,
            ..config(Format::Jsonl, SourceLocation::Stdin)
        };
        let run = run_reader(&cfg, Cursor::new(text.into_bytes()), false);
        let sizes: Vec<usize> = run.batches.iter().map(|b| b.num_rows()).collect();
        assert_eq!(sizes, vec![3, 3]);
    }

    #[test]
    fn stops_when_downstream_is_gone() {
        let mut text = String::from("ts,host,cpu,n,up\n");
        for i in 0..10 {
            text.push_str(&format!("{i},h,1,{i},true\n"));
        }
        let cfg = SourceConfig {
            batch_size: 2,
            ..config(Format::Csv, SourceLocation::Stdin)
        };
        let stats = SourceStats::default();
        let mut calls = 0;
        let mut emit = |_b: RecordBatch| {
            calls += 1;
            false
        };
        let mut d = Driver::new(&cfg, &stats, &mut emit).unwrap();
        read_format(
            cfg.format,
            Cursor::new(text.into_bytes()),
            "t",
            false,
            &mut d,
        )
        .unwrap();
        drop(d);
        assert_eq!(calls, 1);
    }

    #[test]
    fn jsonl_rows() {
        let run = run_jsonl(
            "{\"ts\":\"1970-01-01T00:00:01Z\",\"host\":\"a\",\"cpu\":1.5,\"n\":2,\"up\":true}\n\
             {\"ts\":2000,\"host\":\"b\\\"q\\\"\",\"cpu\":3,\"n\":4.0,\"up\":false,\"other\":[1,{}]}\n\
             {\"TS\":3000,\"Host\":\"c\"}\n",
        );
        assert_eq!(
            run.table(),
            vec![
                "1000|a|1.5|2|true",
                "2000|b\"q\"|3|4|false",
                "3000|c|NULL|NULL|NULL",
            ]
        );
    }

    #[test]
    fn jsonl_missing_fields_and_nulls() {
        let run = run_jsonl(
            "{\"ts\":1000}\n{\"ts\":2000,\"host\":null,\"cpu\":null,\"n\":null,\"up\":null}\n",
        );
        assert_eq!(
            run.table(),
            vec!["1000|NULL|NULL|NULL|NULL", "2000|NULL|NULL|NULL|NULL"]
        );
    }

    #[test]
    fn jsonl_bad_rows_and_blank_lines() {
        let run = run_jsonl(
            "{\"ts\":1000,\"host\":\"a\"}\n\
             \n\
             {\"ts\":2000,\"host\":\"a\"\n\
             {\"ts\":3000,\"cpu\":\"high\"}\n\
             \x20\x20\t\n\
             {\"ts\":4000,\"host\":5}\n\
             {\"ts\":5000,\"n\":1.5}\n\
             {\"ts\":\"soon\"}\n\
             [1,2]\n\
             {\"ts\":true}\n\
             {\"host\":\"no time\"}\n\
             {\"ts\":6000,\"up\":\"yes\"}\n\
             {\"ts\":7000} trailing\n\
             {\"ts\":8000,\"host\":\"z\"}\r\n",
        );
        assert_eq!(
            run.table(),
            vec!["1000|a|NULL|NULL|NULL", "8000|z|NULL|NULL|NULL"]
        );
        let bad = run.bad();
        let lines: Vec<u64> = bad.iter().map(|(l, _)| *l).collect();
        assert_eq!(lines, vec![3, 4, 6, 7, 8, 9, 10, 11, 12, 13]);
        // Only the first BAD_ROW_SAMPLES are kept; the count is complete.
        assert_eq!(run.stats.bad_rows.load(Ordering::Relaxed), 10);
        assert!(bad[0].1.starts_with("invalid JSON: "), "{}", bad[0].1);
        assert!(!bad[0].1.contains("line 1"), "{}", bad[0].1);
        assert_eq!(bad[1].1, "column cpu: expected DOUBLE, found string 'high'");
        assert_eq!(bad[2].1, "column host: expected TEXT, found number 5");
        assert_eq!(bad[3].1, "column n: cannot represent 1.5 as BIGINT");
        assert_eq!(bad[4].1, "column ts: cannot parse 'soon' as TIMESTAMP");
        assert_eq!(bad[5].1, "expected a JSON object, found an array");
        assert_eq!(
            bad[6].1,
            "column ts: expected TIMESTAMP, found boolean true"
        );
        assert_eq!(bad[7].1, "column ts: missing event time");
        assert_eq!(bad[8].1, "column up: expected BOOLEAN, found string 'yes'");
        assert!(
            bad[9].1.starts_with("invalid JSON: trailing characters"),
            "{}",
            bad[9].1
        );
    }

    #[test]
    fn dead_letter_file() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.csv");
        std::fs::write(
            &input,
            "ts,host,cpu,n,up\n1000,a,1,1,true\n2000,\"b,c\",zz,1,true\n3000,a\n",
        )
        .unwrap();
        let dead = dir.path().join("bad.txt");
        std::fs::write(&dead, "earlier\n").unwrap();
        let cfg = SourceConfig {
            dead_letter: Some(dead.clone()),
            ..config(Format::Csv, SourceLocation::File(input))
        };
        let stats = SourceStats::default();
        let mut rows = 0;
        read_source(&cfg, &stats, &mut |b| {
            rows += b.num_rows();
            true
        })
        .unwrap();
        assert_eq!(rows, 1);
        assert_eq!(
            std::fs::read_to_string(&dead).unwrap(),
            "earlier\n\
             3\tcolumn cpu: cannot parse 'zz' as DOUBLE\t2000,\"b,c\",zz,1,true\n\
             4\texpected 5 fields, found 2\t3000,a\n"
        );

        let input = dir.path().join("in.jsonl");
        std::fs::write(&input, "{\"ts\":1}\n{\"ts\":\"x\"}\n").unwrap();
        let dead = dir.path().join("bad-json.txt");
        let cfg = SourceConfig {
            dead_letter: Some(dead.clone()),
            ..config(Format::Jsonl, SourceLocation::File(input))
        };
        read_source(&cfg, &stats, &mut |_| true).unwrap();
        assert_eq!(
            std::fs::read_to_string(&dead).unwrap(),
            "2\tcolumn ts: cannot parse 'x' as TIMESTAMP\t{\"ts\":\"x\"}\n"
        );
    }

    #[test]
    fn no_dead_letter_file_without_bad_rows() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.csv");
        std::fs::write(&input, "ts,host,cpu,n,up\n1000,a,1,1,true\n").unwrap();
        let dead = dir.path().join("bad.txt");
        let cfg = SourceConfig {
            dead_letter: Some(dead.clone()),
            ..config(Format::Csv, SourceLocation::File(input))
        };
        read_source(&cfg, &SourceStats::default(), &mut |_| true).unwrap();
        assert!(!dead.exists());
    }

    #[test]
    fn missing_file_is_a_connector_error() {
        let cfg = config(
            Format::Csv,
            SourceLocation::File(PathBuf::from("/nonexistent/vigil/m.csv")),
        );
        let err = read_source(&cfg, &SourceStats::default(), &mut |_| true).unwrap_err();
        assert!(matches!(err, Error::Connector(_)));
        let msg = err.to_string();
        assert!(
            msg.starts_with("cannot open /nonexistent/vigil/m.csv: "),
            "{msg}"
        );
    }

    #[test]
    fn unsupported_column_type_is_an_error() {
        let cfg = SourceConfig {
            schema: Arc::new(Schema::new(vec![Field::new("d", DataType::Date32, true)])),
            event_time: None,
            ..config(Format::Csv, SourceLocation::Stdin)
        };
        let run = run_reader(&cfg, Cursor::new(b"d\n1\n".to_vec()), false);
        assert!(run.result.unwrap_err().to_string().contains("column d"));
    }

    #[test]
    fn non_nullable_column_rejects_nulls() {
        let cfg = SourceConfig {
            schema: Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)])),
            event_time: None,
            ..config(Format::Csv, SourceLocation::Stdin)
        };
        let run = run_reader(&cfg, Cursor::new(b"v\n1\n\"\"\n3\n".to_vec()), false);
        assert_eq!(run.rows(), 2);
        assert_eq!(run.bad(), vec![(3, "column v: missing value".to_string())]);
    }

    /// Hands out its input in the given chunks, one per read call, like a
    /// pipe whose writer is slow.
    struct Chunked(Vec<Vec<u8>>);

    impl Read for Chunked {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.0.is_empty() {
                return Ok(0);
            }
            let chunk = self.0.remove(0);
            assert!(chunk.len() < buf.len());
            buf[..chunk.len()].copy_from_slice(&chunk);
            Ok(chunk.len())
        }
    }

    #[test]
    fn live_input_emits_when_input_runs_dry() {
        for format in [Format::Csv, Format::Jsonl] {
            let chunks: Vec<Vec<u8>> = match format {
                Format::Csv => vec![
                    b"ts,host,cpu,n,up\n1000,a,1,1,true\n".to_vec(),
                    b"2000,a,1,1,true\r\n3000,a,1,1,true\r\n".to_vec(),
                    b"4000,a,1,1,true\n".to_vec(),
                ],
                Format::Jsonl => vec![
                    b"{\"ts\":1000}\n".to_vec(),
                    b"{\"ts\":2000}\n{\"ts\":3000}\r\n".to_vec(),
                    b"{\"ts\":4000}\n".to_vec(),
                ],
            };
            let cfg = config(format, SourceLocation::Stdin);
            let run = run_reader(&cfg, Chunked(chunks.clone()), true);
            let sizes: Vec<usize> = run.batches.iter().map(|b| b.num_rows()).collect();
            assert_eq!(sizes, vec![1, 2, 1], "{format:?}");
            // Not live: one batch.
            let run = run_reader(&cfg, Chunked(chunks), false);
            let sizes: Vec<usize> = run.batches.iter().map(|b| b.num_rows()).collect();
            assert_eq!(sizes, vec![4], "{format:?}");
        }
    }

    #[test]
    fn follow_reads_a_growing_file_until_stopped() {
        for format in [Format::Csv, Format::Jsonl] {
            let rows: [&str; 4] = match format {
                Format::Csv => [
                    "ts,host,cpu,n,up\n1000,a,1,1,true\n",
                    "2000,a,1,1,true\n3000,a,",
                    "1,1,true\n",
                    "4000,a,1,1,true\n",
                ],
                Format::Jsonl => [
                    "{\"ts\":1000}\n",
                    "{\"ts\":2000}\n{\"ts\":",
                    "3000}\n",
                    "{\"ts\":4000}\n",
                ],
            };
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("in");
            std::fs::write(&path, rows[0]).unwrap();
            let cfg = SourceConfig {
                follow: true,
                ..config(format, SourceLocation::File(path.clone()))
            };
            let stats = Arc::new(SourceStats::default());
            let (tx, rx) = std::sync::mpsc::channel();
            let reader = {
                let stats = stats.clone();
                std::thread::spawn(move || {
                    read_source(&cfg, &stats, &mut |b| tx.send(b.num_rows()).is_ok())
                })
            };
            let append = |text: &str| {
                let mut file = OpenOptions::new().append(true).open(&path).unwrap();
                file.write_all(text.as_bytes()).unwrap();
            };
            let wait = Duration::from_secs(10);
            assert_eq!(rx.recv_timeout(wait), Ok(1), "{format:?}: the first row");
            append(rows[1]);
            // The whole line goes on; the partial one waits for its newline.
            assert_eq!(rx.recv_timeout(wait), Ok(1), "{format:?}: the second row");
            assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
            append(rows[2]);
            assert_eq!(
                rx.recv_timeout(wait),
                Ok(1),
                "{format:?}: the completed row"
            );
            assert_eq!(stats.max_event_time.get(), Some(3000));
            stats.stop.store(true, Ordering::Relaxed);
            reader.join().unwrap().unwrap();
            append(rows[3]);
            assert_eq!(stats.rows.load(Ordering::Relaxed), 3);
            assert_eq!(stats.bad_rows.load(Ordering::Relaxed), 0);
        }
    }

    #[test]
    fn follow_fails_when_the_file_shrinks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.csv");
        std::fs::write(&path, "ts,host,cpu,n,up\n1000,a,1,1,true\n").unwrap();
        let cfg = SourceConfig {
            follow: true,
            ..config(Format::Csv, SourceLocation::File(path.clone()))
        };
        let stats = Arc::new(SourceStats::default());
        let reader = {
            let stats = stats.clone();
            std::thread::spawn(move || read_source(&cfg, &stats, &mut |_| true))
        };
        while stats.rows.load(Ordering::Relaxed) == 0 {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::fs::write(&path, "").unwrap();
        let err = reader.join().unwrap().unwrap_err().to_string();
        assert!(err.contains("shrank"), "{err}");
    }

    #[test]
    fn a_stop_request_ends_reading_at_the_next_row() {
        let mut text = String::from("ts,host,cpu,n,up\n");
        for i in 0..10 {
            text.push_str(&format!("{i},h,1,{i},true\n"));
        }
        let cfg = SourceConfig {
            batch_size: 2,
            ..config(Format::Csv, SourceLocation::Stdin)
        };
        let stats = SourceStats::default();
        let mut batches = 0;
        let mut emit = |_b: RecordBatch| {
            batches += 1;
            stats.stop.store(true, Ordering::Relaxed);
            true
        };
        let mut d = Driver::new(&cfg, &stats, &mut emit).unwrap();
        read_format(
            cfg.format,
            Cursor::new(text.into_bytes()),
            "t",
            false,
            &mut d,
        )
        .unwrap();
        drop(d);
        assert_eq!(batches, 1);
        assert_eq!(stats.rows.load(Ordering::Relaxed), 2);
        assert_eq!(stats.max_event_time.get(), Some(1));
    }

    #[test]
    fn realtime_replay_paces_rows() {
        let text = "ts,host,cpu,n,up\n0,a,1,1,true\n0,a,1,1,true\n400,a,1,1,true\n800,a,1,1,true\n";
        let cfg = SourceConfig {
            replay: Replay::Realtime { speed: 4.0 },
            ..config(Format::Csv, SourceLocation::Stdin)
        };
        let stats = SourceStats::default();
        let start = Instant::now();
        let mut arrivals = Vec::new();
        let mut emit = |b: RecordBatch| {
            arrivals.push((b.num_rows(), start.elapsed()));
            true
        };
        let mut d = Driver::new(&cfg, &stats, &mut emit).unwrap();
        read_format(
            cfg.format,
            Cursor::new(text.as_bytes().to_vec()),
            "t",
            false,
            &mut d,
        )
        .unwrap();
        drop(d);
        // 400 ms of event time at speed 4 = 100 ms of wall time per gap.
        let sizes: Vec<usize> = arrivals.iter().map(|a| a.0).collect();
        assert_eq!(sizes, vec![2, 1, 1]);
        assert!(arrivals[0].1 < Duration::from_millis(50), "{arrivals:?}");
        assert!(arrivals[1].1 >= Duration::from_millis(100), "{arrivals:?}");
        assert!(arrivals[2].1 >= Duration::from_millis(200), "{arrivals:?}");
        assert!(arrivals[2].1 < Duration::from_millis(1000), "{arrivals:?}");
    }
}
