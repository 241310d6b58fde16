//! Decoding a file on several threads.
//!
//! The rest of the input is cut into chunks of whole lines, which worker
//! threads decode at once into rows and bad rows; the [`Driver`] then
//! takes each chunk's lines in file order, as it takes them from the
//! single-threaded decoders. So batches, line numbers, the guard, the
//! watermark and positions are what one thread gives.
//!
//! Only inputs whose lines decode on their own are cut: JSON lines, and
//! CSV without `multiline` (a record ends at its newline) after its header.
//! A quoted CSV field spanning lines, a followed file, stdin, pipes and
//! pushed rows are decoded by one thread.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::ops::Range;
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use super::{
    CsvColumns, CsvHeader, CsvRecord, Driver, Input, Kind, Mark, Row, SchemaRef, TsUnit, Val,
    overlong_reason, parse_json_row, split_terminator, unclosed_reason,
};
use crate::error::{Error, Result};

/// Bytes of input per chunk (a line longer than this makes its chunk
/// longer).
const CHUNK: usize = 1 << 20;

/// The bytes per chunk of a source opened now: [`CHUNK`], or in tests
/// what the test set.
pub(super) fn chunk_size() -> usize {
    #[cfg(test)]
    if let Some(size) = tests::CHUNK_SIZE.get() {
        return size;
    }
    CHUNK
}

/// Chunks in flight (read, being decoded, or decoded and waiting) per
/// decoder thread.
const IN_FLIGHT: usize = 2;

/// How the lines of an input decode, shared by the decoder threads.
pub(super) struct Lines {
    schema: SchemaRef,
    kinds: Vec<Kind>,
    event_time: Option<usize>,
    unit: TsUnit,
    /// A CSV file's header; `None` for JSON lines.
    csv: Option<CsvHeader>,
    /// The longest line taken (`max_record_size`).
    limit: usize,
}

impl Lines {
    /// The lines of `d`'s stream, CSV ones under `csv` when it is given.
    pub(super) fn new(d: &Driver<'_>, csv: Option<CsvHeader>) -> Lines {
        Lines {
            schema: d.batcher.schema.clone(),
            kinds: d.batcher.kinds.clone(),
            event_time: d.batcher.event_time,
            unit: d.decode.ts_unit,
            csv,
            limit: d.decode.max_record_size,
        }
    }

    /// Decodes the lines of the chunk in `out.bytes` into `out`.
    fn decode(&self, mut out: Decoded, scratch: &mut Scratch) -> Decoded {
        if let Some(length) = out.overlong {
            let mut entry = self.overlong(&out.bytes, length);
            entry.line = 0..length as usize;
            out.entries.push(entry);
            return out;
        }
        let bytes = std::mem::take(&mut out.bytes);
        let mut start = 0;
        while start < bytes.len() {
            let end = memchr::memchr(b'\n', &bytes[start..]).map_or(bytes.len(), |i| start + i + 1);
            let line = &bytes[start..end];
            let entry = match &self.csv {
                _ if line.len() > self.limit => {
                    self.overlong(&line[..self.limit], line.len() as u64)
                }
                Some(header) => self.csv_line(header, &bytes[start..end], scratch, &mut out),
                None => self.json_line(&bytes[start..end], scratch, &mut out),
            };
            out.entries.push(entry.shifted(start, end));
            start = end;
        }
        out.bytes = bytes;
        out
    }

    /// A line of `length` bytes, longer than the limit, of which `kept` is
    /// the start: a bad row showing what the one-thread reader shows.
    fn overlong(&self, kept: &[u8], length: u64) -> Entry {
        let raw = match self.csv {
            Some(_) => 0..kept.len(),
            None => {
                let lead = kept.len() - kept.trim_ascii_start().len();
                lead..lead + kept.trim_ascii().len()
            }
        };
        Entry::new(raw, What::Bad(overlong_reason(length, self.limit)))
    }

    /// A CSV line, as `CsvReader::line` takes it when no record is open
    /// and quoted fields end at their line.
    fn csv_line(
        &self,
        header: &CsvHeader,
        line: &[u8],
        scratch: &mut Scratch,
        out: &mut Decoded,
    ) -> Entry {
        let (content, terminator) = split_terminator(line);
        let raw = 0..line.len();
        if content.is_empty() {
            return Entry::new(raw, What::Blank);
        }
        let record = &mut scratch.record;
        record.restart();
        if !record.feed(content, terminator) {
            return Entry::new(raw, What::Bad(unclosed_reason(false, "")));
        }
        let columns = CsvColumns {
            header,
            schema: &self.schema,
            kinds: &self.kinds,
            event_time: self.event_time,
            unit: self.unit,
        };
        match columns.parse(&record.fields, &mut scratch.vals) {
            Ok(epoch_time) => {
                let what = out.row(&scratch.vals, &record.fields.text, epoch_time);
                Entry::new(raw, what)
            }
            Err(reason) => Entry::new(raw, What::Bad(reason)),
        }
    }

    /// A JSON line, as `read_jsonl` takes it.
    fn json_line(&self, line: &[u8], scratch: &mut Scratch, out: &mut Decoded) -> Entry {
        let text = line.trim_ascii();
        let lead = line.len() - line.trim_ascii_start().len();
        let raw = lead..lead + text.len();
        if text.is_empty() {
            return Entry::new(raw, What::Blank);
        }
        let parsed = parse_json_row(
            text,
            &self.schema,
            &self.kinds,
            self.unit,
            self.event_time,
            &mut scratch.vals,
            &mut scratch.arena,
        );
        match parsed {
            Ok(epoch_time) => {
                let what = out.row(&scratch.vals, scratch.arena.as_bytes(), epoch_time);
                Entry::new(raw, what)
            }
            Err(reason) => Entry::new(raw, What::Bad(reason)),
        }
    }
}

/// A decoder thread's buffers, reused from line to line.
struct Scratch {
    record: CsvRecord,
    vals: Vec<Val>,
    arena: String,
}

/// The lines of a chunk, decoded. Its buffers go round: a chunk driven
/// is read into and decoded into again.
#[derive(Default)]
struct Decoded {
    /// The chunk.
    bytes: Vec<u8>,
    /// One per line, in order.
    entries: Vec<Entry>,
    /// The values of the rows, one row after the other.
    vals: Vec<Val>,
    /// The text of the rows, one row after the other; each row's text
    /// ranges start at its own text.
    text: Vec<u8>,
    /// Set for a chunk that is one line longer than the limit: the line's
    /// length (`bytes` holds only its start).
    overlong: Option<u64>,
}

impl Decoded {
    /// Keeps a row's values and text.
    fn row(&mut self, vals: &[Val], text: &[u8], epoch_time: bool) -> What {
        self.vals.extend_from_slice(vals);
        let start = self.text.len();
        self.text.extend_from_slice(text);
        What::Row {
            text: start..self.text.len(),
            epoch_time,
        }
    }
}

/// One line of a chunk.
struct Entry {
    /// The line in the chunk, terminator included.
    line: Range<usize>,
    /// The bytes a bad row or the dead-letter file shows.
    raw: Range<usize>,
    what: What,
}

impl Entry {
    /// An entry whose `raw` is relative to its line (placed by `shifted`).
    fn new(raw: Range<usize>, what: What) -> Entry {
        Entry {
            line: 0..0,
            raw,
            what,
        }
    }

    fn shifted(mut self, start: usize, end: usize) -> Entry {
        self.line = start..end;
        self.raw = start + self.raw.start..start + self.raw.end;
        self
    }
}

/// What a line decoded to.
enum What {
    /// A blank line.
    Blank,
    /// A row: its text in [`Decoded::text`], and whether its event time
    /// was an epoch number.
    Row {
        text: Range<usize>,
        epoch_time: bool,
    },
    /// A bad row, and why.
    Bad(String),
}

/// A chunk for a decoder thread, and where its result goes.
struct Job {
    chunk: Decoded,
    done: SyncSender<Decoded>,
}

/// Decodes the rest of `input` on `d.threads` threads, handing every line
/// to `d` in order, and leaves `input`'s line count and offset at its end.
/// Returns `Ok(false)` once downstream is gone.
pub(super) fn decode<R: Read>(
    input: &mut Input<'_, R>,
    d: &mut Driver<'_>,
    lines: &Lines,
) -> Result<bool> {
    let threads = d.threads.max(1);
    let (work, jobs) = sync_channel::<Job>(threads);
    let jobs = Mutex::new(jobs);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| work_on(lines, &jobs));
        }
        // Ends the workers (when `work` drops) whatever happens here.
        let work = work;
        hand_out(input, d, &work, threads * IN_FLIGHT)
    })
}

/// A decoder thread: decodes chunks until there are none.
fn work_on(lines: &Lines, jobs: &Mutex<Receiver<Job>>) {
    let mut scratch = Scratch {
        record: CsvRecord::new(),
        vals: vec![Val::Null; lines.kinds.len()],
        arena: String::new(),
    };
    loop {
        let job = match jobs.lock() {
            Ok(jobs) => jobs.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else { return };
        // The reader may have stopped waiting for it.
        let _ = job.done.send(lines.decode(job.chunk, &mut scratch));
    }
}

/// Reads chunks, sends them to the workers, and drives their results in
/// order, with at most `in_flight` chunks on the way.
fn hand_out<R: Read>(
    input: &mut Input<'_, R>,
    d: &mut Driver<'_>,
    work: &SyncSender<Job>,
    in_flight: usize,
) -> Result<bool> {
    let mut chunks = Chunks {
        carry: Vec::new(),
        size: d.chunk_size.max(1),
        limit: d.decode.max_record_size.max(1),
        done: false,
        free: Vec::new(),
    };
    let mut pending: VecDeque<Receiver<Decoded>> = VecDeque::new();
    let name = input.name;
    loop {
        while pending.len() < in_flight {
            let chunk = chunks
                .next(&mut input.reader)
                .map_err(|e| Error::io(format!("reading {name}"), e))?;
            let Some(chunk) = chunk else { break };
            let (done, result) = sync_channel(1);
            work.send(Job { chunk, done })
                .map_err(|_| decoder_failed(d))?;
            pending.push_back(result);
        }
        let Some(result) = pending.pop_front() else {
            return Ok(true);
        };
        let decoded = result.recv().map_err(|_| decoder_failed(d))?;
        if !drive(&decoded, input, d)? {
            return Ok(false);
        }
        chunks.recycle(decoded, in_flight);
    }
}

fn decoder_failed(d: &Driver<'_>) -> Error {
    Error::Connector(format!("stream {}: a decoder thread failed", d.stream))
}

/// Hands a decoded chunk's lines to `d`, counting them in `input`.
/// Returns `Ok(false)` once downstream is gone.
fn drive<R: Read>(decoded: &Decoded, input: &mut Input<'_, R>, d: &mut Driver<'_>) -> Result<bool> {
    let columns = d.batcher.kinds.len();
    let base = input.offset;
    let mut rows = 0;
    for entry in &decoded.entries {
        input.line += 1;
        input.line_start = base + entry.line.start as u64;
        input.offset = base + entry.line.end as u64;
        let end = Mark {
            offset: input.offset,
            line: input.line,
            file: None,
        };
        let raw = &decoded.bytes[entry.raw.clone()];
        match &entry.what {
            What::Blank => {}
            What::Row { text, epoch_time } => {
                let vals = &decoded.vals[rows * columns..(rows + 1) * columns];
                rows += 1;
                let row = Row {
                    line: input.line,
                    vals,
                    text: &decoded.text[text.clone()],
                    raw,
                    epoch_time: *epoch_time,
                    end,
                };
                if !d.row(row)? {
                    return Ok(false);
                }
            }
            What::Bad(reason) => d.bad_record(input.line, reason.clone(), raw)?,
        }
        d.advance(end);
    }
    Ok(true)
}

/// Cuts an input into chunks of whole lines (the last one may lack its
/// newline).
struct Chunks {
    /// Bytes read past the last chunk's last newline.
    carry: Vec<u8>,
    size: usize,
    /// The longest line taken whole (`max_record_size`).
    limit: usize,
    done: bool,
    /// Chunks driven, to read into again.
    free: Vec<Decoded>,
}

impl Chunks {
    /// The next chunk, in `bytes`; `None` at the end of the input.
    fn next(&mut self, reader: &mut impl Read) -> io::Result<Option<Decoded>> {
        if self.done {
            return Ok(None);
        }
        let mut chunk = self.free.pop().unwrap_or_default();
        let buf = &mut chunk.bytes;
        buf.clear();
        buf.append(&mut self.carry);
        let mut want = self.size;
        loop {
            if buf.len() >= want {
                if let Some(last) = buf.iter().rposition(|&b| b == b'\n') {
                    self.carry.extend_from_slice(&buf[last + 1..]);
                    buf.truncate(last + 1);
                    return Ok(Some(chunk));
                }
                // The chunk is one line that has not ended yet.
                if buf.len() > self.limit {
                    chunk.overlong = Some(self.read_past_line(buf, reader)?);
                    return Ok(Some(chunk));
                }
                // A line longer than a chunk: its chunk grows, up to the
                // limit.
                want = (buf.len() * 2).min(self.limit + 1);
            }
            let filled = buf.len();
            buf.resize(want, 0);
            let read = loop {
                match reader.read(&mut buf[filled..]) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            };
            buf.truncate(filled + read);
            if read == 0 {
                self.done = true;
                return Ok((!buf.is_empty()).then_some(chunk));
            }
        }
    }

    /// With `line` the start of a line longer than the limit, reads past
    /// the rest of it (holding none of it) and keeps the limit's worth of
    /// its start in `line`; returns its length.
    fn read_past_line(&mut self, line: &mut Vec<u8>, reader: &mut impl Read) -> io::Result<u64> {
        let mut length = line.len() as u64;
        line.truncate(self.limit);
        let mut scratch = vec![0; 64 << 10];
        loop {
            let read = match reader.read(&mut scratch) {
                Ok(0) => {
                    self.done = true;
                    return Ok(length);
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if let Some(end) = memchr::memchr(b'\n', &scratch[..read]) {
                self.carry.extend_from_slice(&scratch[end + 1..read]);
                return Ok(length + end as u64 + 1);
            }
            length += read as u64;
        }
    }

    /// Keeps a driven chunk's buffers, at most `most` of them.
    fn recycle(&mut self, mut chunk: Decoded, most: usize) {
        if self.free.len() < most {
            chunk.overlong = None;
            chunk.entries.clear();
            chunk.vals.clear();
            chunk.text.clear();
            self.free.push(chunk);
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::cell::Cell;
    use std::path::Path;
    use std::sync::Arc;

    use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    use datafusion::arrow::record_batch::RecordBatch;
    use proptest::prelude::*;

    use super::super::{
        Decoding, Format, Replay, SourceConfig, SourceLocation, SourcePosition, SourceStats,
        read_source_from,
    };
    use crate::connector::BadRow;

    thread_local! {
        /// The chunk size of the sources a test opens on this thread.
        pub(in super::super) static CHUNK_SIZE: Cell<Option<usize>> = const { Cell::new(None) };
    }

    const WEEK: i64 = 7 * 86_400_000;

    fn config(format: Format, path: &Path, threads: usize, batch_size: usize) -> SourceConfig {
        SourceConfig {
            stream: "m".to_string(),
            schema: Arc::new(Schema::new(vec![
                Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
                Field::new("host", DataType::Utf8, true),
                Field::new("cpu", DataType::Float64, true),
                Field::new("n", DataType::Int64, true),
                Field::new("up", DataType::Boolean, true),
            ])),
            connector: "file",
            location: SourceLocation::File(path.to_path_buf()),
            format,
            replay: Replay::Fast,
            event_time: Some(0),
            batch_size,
            dead_letter: Some(path.with_extension("dead")),
            follow: false,
            decode_threads: threads,
            decode: Decoding::default(),
        }
    }

    /// Everything a read gives: each batch with the position stored
    /// before it, the bad rows, their count and the dead-letter file.
    #[derive(Debug, PartialEq)]
    struct Read {
        batches: Vec<(RecordBatch, Option<SourcePosition>)>,
        bad: Vec<BadRow>,
        bad_rows: u64,
        rows: u64,
        dead: String,
    }

    fn read(cfg: &SourceConfig, chunk: usize, start: Option<&SourcePosition>) -> Read {
        let dead = cfg.dead_letter.clone().unwrap();
        let _ = std::fs::remove_file(&dead);
        CHUNK_SIZE.set(Some(chunk));
        let stats = SourceStats::default();
        let mut batches = Vec::new();
        let result = read_source_from(cfg, &stats, start, &mut |b| {
            batches.push((b, stats.position.lock().unwrap().clone()));
            true
        });
        CHUNK_SIZE.set(None);
        result.unwrap();
        Read {
            batches,
            bad: stats.bad_samples.lock().unwrap().clone(),
            bad_rows: stats.bad_rows.load(std::sync::atomic::Ordering::Relaxed),
            rows: stats.rows.load(std::sync::atomic::Ordering::Relaxed),
            dead: std::fs::read_to_string(&dead).unwrap_or_default(),
        }
    }

    /// CSV with a header, CRLF and LF lines, blank lines, quoted fields
    /// (commas, doubled quotes, a quote left open), bad rows of every
    /// kind, an outlier, a jump of several rows, and no final newline.
    fn csv_text() -> Vec<u8> {
        let mut text = b"n,ts,host,cpu,up\r\n".to_vec();
        for i in 0..40i64 {
            let line = match i % 10 {
                3 => format!("{i},{},\"a,\"\"b\"\"\",1.5,true\r\n", i * 1000),
                4 => format!("{i},{},a,x,true\n", i * 1000),
                5 => "\n\r\n".to_string(),
                6 => format!("{i},{},\"open,1,true\n", i * 1000),
                7 => format!("{i},{},a,1\n", i * 1000),
                8 if i == 18 => format!("{i},{},a,1,true\n", 3650 * 86_400_000i64),
                9 if i > 20 => format!("{i},{},a,2,yes\n", WEEK + i),
                _ => format!("{i},{},h{i},{i}.25,f\n", i * 1000),
            };
            text.extend_from_slice(line.as_bytes());
        }
        text.extend_from_slice(b"40,40,\xff\xfe,1,true\n41,41000,last,1,true");
        text
    }

    /// JSON lines with the same kinds of rows, and keys in other cases.
    fn jsonl_text() -> Vec<u8> {
        let mut text = Vec::new();
        for i in 0..40i64 {
            let line = match i % 10 {
                3 => format!("  {{\"ts\":\"{}\",\"HOST\":\"a\\\"b\"}}\r\n", i * 1000),
                4 => format!("{{\"ts\":{},\"cpu\":\"x\"}}\n", i * 1000),
                5 => "\n \r\n".to_string(),
                6 => "{\"ts\":\n".to_string(),
                7 => format!(
                    "{{\"ts\":{},\"n\":1.0,\"up\":null,\"x\":[1,{{}}]}}\n",
                    i * 1000
                ),
                8 if i == 18 => format!("{{\"ts\":{}}}\n", 3650 * 86_400_000i64),
                9 if i > 20 => format!("{{\"ts\":{},\"n\":{i}}}\n", WEEK + i),
                _ => format!(
                    "{{\"ts\":{},\"host\":\"h{i}\",\"cpu\":{i}.25,\"up\":false}}\n",
                    i * 1000
                ),
            };
            text.extend_from_slice(line.as_bytes());
        }
        text.extend_from_slice(b"[1]\n{\"ts\":41000,\"host\":\"last\"}");
        text
    }

    /// Reads `text` with one thread, then with three at several chunk
    /// sizes (a chunk per line, lines cut everywhere), and expects the
    /// same batches, positions and bad rows; then resumes from every
    /// position the parallel read stored and expects what one thread
    /// gives from there.
    fn same_as_one_thread(format: Format, text: &[u8], batch_size: usize) -> Read {
        same_as_one_thread_within(
            format,
            text,
            batch_size,
            Decoding::default().max_record_size,
        )
    }

    /// [`same_as_one_thread`], lines longer than `max_record_size` bad.
    fn same_as_one_thread_within(
        format: Format,
        text: &[u8],
        batch_size: usize,
        max_record_size: usize,
    ) -> Read {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("input");
        std::fs::write(&path, text).unwrap();
        let config = |threads| {
            let mut cfg = config(format, &path, threads, batch_size);
            cfg.decode.max_record_size = max_record_size;
            cfg
        };
        let one = read(&config(1), 1 << 20, None);
        assert!(one.bad_rows > 5 && one.rows > 20, "{one:?}");
        for chunk in [1, 7, 64, 300, 1 << 20] {
            let many = read(&config(3), chunk, None);
            assert_eq!(many, one, "chunks of {chunk} bytes");
        }
        for (_, position) in &one.batches {
            let position = position.as_ref().unwrap();
            let single = read(&config(1), 1 << 20, Some(position));
            let parallel = read(&config(3), 13, Some(position));
            assert_eq!(parallel, single, "resumed at {position:?}");
        }
        one
    }

    /// A line longer than `max_record_size` is one bad row with its line
    /// number, on one thread as on three, and the lines after it count on.
    #[test]
    fn an_overlong_line_is_one_bad_row_on_three_threads_as_on_one() {
        for (format, mut text) in [(Format::Csv, csv_text()), (Format::Jsonl, jsonl_text())] {
            let at = text.iter().position(|&b| b == b'\n').unwrap() + 1;
            let long = format!("{}\n", "x".repeat(300));
            text.splice(at..at, long.bytes());
            let one = same_as_one_thread_within(format, &text, 4, 100);
            let bad = one
                .bad
                .iter()
                .find(|b| b.reason.contains("max_record_size"));
            let bad = bad.unwrap_or_else(|| panic!("no overlong line: {:?}", one.bad));
            assert_eq!(bad.line, 2, "{format:?}: {bad:?}");
            assert!(bad.reason.contains("301 bytes long"), "{bad:?}");
        }
    }

    #[test]
    fn csv_decodes_on_three_threads_as_on_one() {
        same_as_one_thread(Format::Csv, &csv_text(), 4);
    }

    #[test]
    fn jsonl_decodes_on_three_threads_as_on_one() {
        same_as_one_thread(Format::Jsonl, &jsonl_text(), 4);
    }

    /// A line of either format: a good row, a bad one, or garbage.
    fn line(format: Format) -> impl Strategy<Value = Vec<u8>> {
        let good = (0i64..100_000, "[a-c]{0,3}", 0u8..3).prop_map(move |(ts, host, end)| {
            let end = ["\n", "\r\n", ""][end as usize];
            match format {
                Format::Csv => format!("{ts},{host},1.5,{ts},t{end}").into_bytes(),
                Format::Jsonl => format!("{{\"ts\":{ts},\"host\":\"{host}\"}}{end}").into_bytes(),
            }
        });
        let garbage = proptest::collection::vec(
            prop_oneof![
                Just(b'\n'),
                Just(b','),
                Just(b'"'),
                Just(b'{'),
                Just(b'}'),
                Just(b':'),
                Just(b'1'),
                Just(b'\r'),
                any::<u8>()
            ],
            0..12,
        );
        prop_oneof![4 => good, 1 => garbage]
    }

    fn input(format: Format) -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(line(format), 0..60).prop_map(move |lines| {
            let mut text = match format {
                Format::Csv => b"ts,host,cpu,n,up\n".to_vec(),
                Format::Jsonl => Vec::new(),
            };
            for l in lines {
                text.extend_from_slice(&l);
            }
            text
        })
    }

    fn agree(
        format: Format,
        text: &[u8],
        chunk: usize,
        batch_size: usize,
    ) -> Result<(), TestCaseError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("input");
        std::fs::write(&path, text).unwrap();
        let one = read(&config(format, &path, 1, batch_size), 1 << 20, None);
        let many = read(&config(format, &path, 3, batch_size), chunk, None);
        prop_assert_eq!(many, one);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn random_csv_decodes_alike(text in input(Format::Csv), chunk in 1usize..200, batch in 1usize..9) {
            agree(Format::Csv, &text, chunk, batch)?;
        }

        #[test]
        fn random_jsonl_decodes_alike(text in input(Format::Jsonl), chunk in 1usize..200, batch in 1usize..9) {
            agree(Format::Jsonl, &text, chunk, batch)?;
        }
    }
}
