//! Listings of what a catalog holds, as rows of text: what `SHOW` and
//! `DESCRIBE` answer, and what the shell's `.streams` and `.describe`
//! print.

use std::fmt::Write as _;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};

use super::catalog::StreamDef;
use crate::connector::{Format, OutputFormat, SinkConfig, SinkTarget, SourceLocation};
use crate::error::Result;

/// Rows of text under named columns, with lines that say what the rows
/// are about (`DESCRIBE`'s stream and its event time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// Lines to show before the rows; often none.
    pub notes: Vec<String>,
    /// Column names.
    pub columns: Vec<String>,
    /// The rows, each with one value per column.
    pub rows: Vec<Vec<String>>,
}

impl Listing {
    /// A listing with no notes.
    pub fn new(columns: &[&str], rows: Vec<Vec<String>>) -> Self {
        Self {
            notes: Vec::new(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            rows,
        }
    }

    /// The rows of `batches` (of `schema`) as text, one column a field.
    pub fn from_batches(schema: &Schema, batches: &[RecordBatch]) -> Result<Self> {
        let options = FormatOptions::default();
        let mut rows = Vec::new();
        for batch in batches {
            let columns = batch
                .columns()
                .iter()
                .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            for row in 0..batch.num_rows() {
                rows.push(columns.iter().map(|c| c.value(row).to_string()).collect());
            }
        }
        Ok(Self {
            notes: Vec::new(),
            columns: schema.fields().iter().map(|f| f.name().clone()).collect(),
            rows,
        })
    }

    /// The rows as a batch of text columns, to print like query results.
    pub fn to_batch(&self) -> Result<RecordBatch> {
        let fields: Vec<Field> = self
            .columns
            .iter()
            .map(|name| Field::new(name, DataType::Utf8, false))
            .collect();
        let arrays: Vec<ArrayRef> = (0..self.columns.len())
            .map(|i| {
                let values = self
                    .rows
                    .iter()
                    .map(|r| r.get(i).map_or("", String::as_str));
                Arc::new(StringArray::from_iter_values(values)) as ArrayRef
            })
            .collect();
        Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)?)
    }
}

/// A listing as text: its notes, then its rows as a table (what `vigil
/// run` and `vigil serve` print for `SHOW` and `DESCRIBE` in a script).
pub fn listing_text(listing: &Listing) -> String {
    let mut text: String = listing.notes.iter().map(|n| format!("{n}\n")).collect();
    let table = listing.to_batch().and_then(|batch| {
        Ok(datafusion::arrow::util::pretty::pretty_format_batches(&[batch])?.to_string())
    });
    match table {
        Ok(table) => text.push_str(&table),
        Err(e) => text.push_str(&format!("error: {e}")),
    }
    text.push('\n');
    text
}

/// Rows of text as lines, columns padded to their widest cell (the last
/// is not padded): the tables of `vigil checkpoints` and `vigil group`.
pub fn aligned<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            match i + 1 == row.len() {
                true => line.push_str(cell),
                false => {
                    let _ = write!(line, "{cell:<width$}  ", width = widths[i]);
                }
            }
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

/// The columns of `SHOW QUERIES` (and the shell's `.queries`).
/// `rows_in` lists each stream's rows read, with the rows waiting in its
/// disk buffer when there are some.
pub const QUERY_COLUMNS: [&str; 6] = [
    "id",
    "rows_out",
    "late_rows",
    "shed_rows",
    "rows_in",
    "query",
];

/// A column type as SQL names it in `CREATE STREAM`.
pub fn sql_type(data_type: &DataType) -> String {
    crate::types::sql_name(data_type)
}

/// `ts TIMESTAMP, host TEXT, ...`.
pub fn column_list(schema: &SchemaRef) -> String {
    schema
        .fields()
        .iter()
        .map(|f| format!("{} {}", f.name(), sql_type(f.data_type())))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where a stream's rows come from, in a few words.
pub fn source_text(stream: &StreamDef) -> String {
    let format = match stream.source.format {
        Format::Csv => "csv",
        Format::Jsonl => "jsonl",
    };
    match &stream.source.location {
        SourceLocation::File(path) => format!("file {} ({format})", path.display()),
        SourceLocation::Stdin => format!("stdin ({format})"),
        SourceLocation::Push => "push".into(),
        SourceLocation::Connector(reader) => reader.0.describe(),
    }
}

/// Where a sink writes and how, in a few words.
pub fn sink_text(sink: &SinkConfig) -> String {
    let format = match sink.format {
        OutputFormat::Table => "table",
        OutputFormat::Csv => "csv",
        OutputFormat::Jsonl => "jsonl",
    };
    let target = match &sink.target {
        SinkTarget::Stdout => "stdout".to_string(),
        SinkTarget::File(path) => format!("file {}", path.display()),
        SinkTarget::Connector(opener) => opener.0.describe(),
    };
    let append = if sink.append_only {
        ", append only"
    } else {
        ""
    };
    format!("{target} ({format}{append})")
}

/// `2 s`, or `1500 ms`.
pub fn duration(ms: i64) -> String {
    if ms % 1000 == 0 {
        format!("{} s", ms / 1000)
    } else {
        format!("{ms} ms")
    }
}

/// `DESCRIBE` of a stream: its source and event time, then its columns.
pub fn describe_stream(stream: &StreamDef) -> Listing {
    let mut listing = describe_columns(&stream.schema, stream.event_time);
    listing
        .notes
        .push(format!("stream {}: {}", stream.name, source_text(stream)));
    if let Some(i) = stream.event_time {
        let mut timing = format!(
            "event time: {}, watermark delay {}",
            stream.schema.field(i).name(),
            duration(stream.delay_ms)
        );
        if stream.lateness_ms > 0 {
            timing.push_str(&format!(
                ", allowed lateness {}",
                duration(stream.lateness_ms)
            ));
        }
        if let Some(idle) = stream.idle_timeout {
            timing.push_str(&format!(
                ", idle timeout {}",
                duration(idle.as_millis() as i64)
            ));
        }
        listing.notes.push(timing);
    }
    if let Some(bytes) = stream.buffer.disk_bytes() {
        listing.notes.push(format!(
            "a query behind it buffers its rows on disk, up to {bytes} bytes"
        ));
    }
    listing
}

/// The columns of a schema: name, type and a note on the event-time
/// column.
pub fn describe_columns(schema: &SchemaRef, event_time: Option<usize>) -> Listing {
    let rows = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let note = if Some(i) == event_time {
                "event time"
            } else {
                ""
            };
            vec![f.name().clone(), sql_type(f.data_type()), note.to_string()]
        })
        .collect();
    Listing::new(&["column", "type", "note"], rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Array;

    #[test]
    fn a_listing_becomes_a_batch_of_text() {
        let listing = Listing::new(
            &["name", "kind"],
            vec![
                vec!["m".into(), "stream".into()],
                vec!["v".into(), "view".into()],
            ],
        );
        let batch = listing.to_batch().unwrap();
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(batch.schema().field(1).name(), "kind");
        let kinds = batch
            .column(1)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        assert_eq!(kinds.value(1), "view");
        assert_eq!(kinds.len(), 2);
        assert_eq!(duration(2000), "2 s");
        assert_eq!(duration(1500), "1500 ms");
    }
}
