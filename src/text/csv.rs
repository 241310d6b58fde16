//! CSV: records (quoted fields across lines included), the header mapped to
//! the stream's columns by name, and each field parsed as its column's type.

use super::*;

// ---------------------------------------------------------------- CSV ----

/// The fields of one CSV record, unquoted, stored end to end.
#[derive(Debug, Default)]
pub(super) struct Fields {
    pub(super) text: Vec<u8>,
    pub(super) ends: Vec<usize>,
}

impl Fields {
    pub(super) fn clear(&mut self) {
        self.text.clear();
        self.ends.clear();
    }

    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }

    /// The byte range of field `i` in `text`.
    pub(super) fn range(&self, i: usize) -> std::ops::Range<usize> {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        start..self.ends[i]
    }

    pub(super) fn get(&self, i: usize) -> &[u8] {
        &self.text[self.range(i)]
    }
}

/// One CSV record being split, possibly over several lines, by csv-core's
/// incremental reader (RFC 4180 quoting; a quote inside an unquoted field
/// is text). The caller hands it one line at a time, so a record ends at
/// its line unless a quoted field is still open there.
pub(super) struct CsvRecord {
    pub(super) fields: Fields,
    pub(super) reader: csv_core::Reader,
    /// The first line of the record; 0 when no record is open.
    pub(super) first_line: u64,
    /// The point before the record's first line.
    pub(super) start: Mark,
    /// The raw lines of a record that spans lines (empty for one line).
    pub(super) raw: Vec<u8>,
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
    pub(super) fn new() -> Self {
        CsvRecord {
            fields: Fields::default(),
            reader: csv_core::Reader::new(),
            first_line: 0,
            start: Mark::default(),
            raw: Vec::new(),
        }
    }

    pub(super) fn is_open(&self) -> bool {
        self.first_line != 0
    }

    pub(super) fn start(&mut self, at: &LineAt) {
        self.restart();
        self.raw.clear();
        self.first_line = at.number;
        self.start = at.before;
    }

    pub(super) fn close(&mut self) {
        self.first_line = 0;
    }

    /// Empties the fields for a new record.
    pub(super) fn restart(&mut self) {
        self.fields.clear();
        // A record abandoned as bad may have left the reader inside a
        // quoted field.
        self.reader.reset();
    }

    /// Splits one line's content into fields, continuing a quoted field
    /// from the line before. Returns whether the record is complete; if
    /// not, a quoted field goes on past this line, `terminator` included.
    pub(super) fn feed(&mut self, content: &[u8], terminator: &[u8]) -> bool {
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
    pub(super) fn feed_bytes(&mut self, mut input: &[u8]) -> bool {
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
pub(super) fn map_header(
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
pub(super) fn parse_csv_field(
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
pub(super) fn overlong_reason(length: u64, limit: usize) -> String {
    format!(
        "the line is {length} bytes long, longer than max_record_size ({limit} bytes); \
         only its start is kept here"
    )
}

pub(super) fn unclosed_reason(multiline: bool, at: &str) -> String {
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
pub(super) struct CsvHeader {
    /// Each declared column's field index; `None` for a column the header
    /// lacks.
    pub(super) columns: Vec<Option<usize>>,
    /// The number of fields of the header.
    pub(super) len: usize,
}

/// What turns a CSV record's fields into a row: the header, and the
/// declared columns.
pub(super) struct CsvColumns<'a> {
    pub(super) header: &'a CsvHeader,
    pub(super) schema: &'a SchemaRef,
    pub(super) kinds: &'a [Kind],
    pub(super) event_time: Option<usize>,
    pub(super) unit: TsUnit,
}

impl CsvColumns<'_> {
    /// Parses a complete record's fields into `vals`; returns whether the
    /// event time was written as an epoch number, or why the row is bad.
    pub(super) fn parse(
        &self,
        fields: &Fields,
        vals: &mut [Val],
    ) -> std::result::Result<bool, String> {
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
pub(super) struct CsvReader {
    pub(super) multiline: bool,
    pub(super) max_record_size: usize,
    pub(super) unit: TsUnit,
    /// The header, once it is read.
    pub(super) header: Option<CsvHeader>,
    pub(super) record: CsvRecord,
    pub(super) vals: Vec<Val>,
}

impl CsvReader {
    pub(super) fn new(d: &Driver<'_>, header: Option<CsvHeader>) -> Self {
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
    pub(super) fn consumed(&self, after: Mark) -> Mark {
        if self.record.is_open() {
            self.record.start
        } else {
            after
        }
    }
}

pub(super) fn read_csv<R: Read>(
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
pub(super) fn read_csv_header<R: Read>(
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
    pub(super) fn line(
        &mut self,
        line: &[u8],
        at: &LineAt,
        name: &str,
        d: &mut Driver<'_>,
    ) -> Result<bool> {
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
    pub(super) fn record_done(
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
    pub(super) fn overlong(
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
    pub(super) fn bad_record(
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
    pub(super) fn end_file(&mut self, name: &str, at: &str, d: &mut Driver<'_>) -> Result<()> {
        if self.record.is_open() {
            self.bad_record(unclosed_reason(true, at), &[], name, d)?;
        }
        Ok(())
    }
}
