//! Text tables: result rows drawn as a table that the later rows of the same
//! query continue, and numbers rounded for reading (the shell and `vigil run`
//! on a terminal).
//!
//! A continuous query's rows come a few at a time. The rows of one query
//! share one table: its header is drawn once, and rows that come later are
//! added below the ones already drawn. Only when a later value needs a
//! wider column is the table closed and a new one, with the wider columns,
//! begun with the header again. The closing border is drawn when the query
//! ends or is stopped.

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{DataType, Float32Type, Float64Type, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};

use crate::error::Result;

/// Significant digits a DOUBLE shows in a table: enough for any reading,
/// few enough to hide binary rounding (`32.95`, not `32.949999999999996`).
const DOUBLE_DIGITS: usize = 10;
/// Significant digits of a 32-bit float.
const FLOAT_DIGITS: usize = 7;

/// The rows of one query, drawn as one growing table.
#[derive(Debug)]
pub struct Table {
    header: Vec<String>,
    /// The column widths of the table being drawn; empty before its first
    /// row and after it was closed.
    widths: Vec<usize>,
    /// Rows formatted but not drawn yet.
    buffered: Vec<Vec<String>>,
}

impl Table {
    /// A table with the columns of `schema`.
    pub fn new(schema: &Schema) -> Self {
        Self {
            header: schema.fields().iter().map(|f| clean(f.name())).collect(),
            widths: Vec::new(),
            buffered: Vec::new(),
        }
    }

    /// Formats the rows of `batch` and keeps them to be drawn.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        let options = FormatOptions::default().with_display_error(true);
        let columns = batch
            .columns()
            .iter()
            .map(|array| Column::new(array.as_ref(), &options))
            .collect::<Result<Vec<_>>>()?;
        for row in 0..batch.num_rows() {
            self.buffered
                .push(columns.iter().map(|c| c.cell(row)).collect());
        }
        Ok(())
    }

    /// The column widths of the table being drawn (empty before its first
    /// row and once closed): what a restored output needs to continue it.
    pub fn widths(&self) -> &[usize] {
        &self.widths
    }

    /// Continues a table drawn with `widths` (see [`Table::widths`]).
    pub fn continue_with(&mut self, widths: Vec<usize>) {
        self.widths = widths;
    }

    /// Rows kept and not drawn yet.
    pub fn buffered(&self) -> usize {
        self.buffered.len()
    }

    /// Draws the kept rows: below the rows drawn before when they fit its
    /// columns, else in a new table with a header.
    pub fn flush(&mut self) -> String {
        if self.buffered.is_empty() {
            return String::new();
        }
        let mut needed: Vec<usize> = self.header.iter().map(|h| width(h)).collect();
        for row in &self.buffered {
            for (w, cell) in needed.iter_mut().zip(row) {
                *w = (*w).max(width(cell));
            }
        }
        let mut out = String::new();
        let fits = !self.widths.is_empty() && needed.iter().zip(&self.widths).all(|(n, w)| n <= w);
        if !fits {
            if !self.widths.is_empty() {
                out.push_str(&border(&self.widths));
            }
            // Columns only grow, so that a query's tables change shape
            // as seldom as possible.
            for (n, w) in needed.iter_mut().zip(&self.widths) {
                *n = (*n).max(*w);
            }
            self.widths = needed;
            out.push_str(&border(&self.widths));
            out.push_str(&line(&self.header, &self.widths));
            out.push_str(&border(&self.widths));
        }
        for row in self.buffered.drain(..) {
            out.push_str(&line(&row, &self.widths));
        }
        out
    }

    /// Draws the kept rows and closes the table.
    pub fn finish(&mut self) -> String {
        let mut out = self.flush();
        if !self.widths.is_empty() {
            out.push_str(&border(&self.widths));
            self.widths.clear();
        }
        out
    }
}

/// `batch` as one closed table.
pub fn draw(batch: &RecordBatch) -> Result<String> {
    let mut table = Table::new(&batch.schema());
    table.push(batch)?;
    Ok(table.finish())
}

/// The width of the widest line of `text`.
pub fn widest_line(text: &str) -> usize {
    text.lines().map(width).max().unwrap_or(0)
}

/// `batch` in psql's expanded display: per row a `-[ RECORD n ]-` line,
/// then one `column | value` line per column, a long value wrapped at its
/// spaces to fit `columns` characters (a value with no space to break at
/// runs on).
pub fn expanded(batch: &RecordBatch, columns: usize) -> Result<String> {
    let options = FormatOptions::default().with_display_error(true);
    let schema = batch.schema();
    let names: Vec<String> = schema.fields().iter().map(|f| clean(f.name())).collect();
    let name_width = names.iter().map(|n| width(n)).max().unwrap_or(0);
    let value_width = columns.saturating_sub(name_width + 3).max(20);
    let cells = batch
        .columns()
        .iter()
        .map(|array| Column::new(array.as_ref(), &options))
        .collect::<Result<Vec<_>>>()?;
    let mut out = String::new();
    for row in 0..batch.num_rows() {
        let title = format!("-[ RECORD {} ]", row + 1);
        let rule = (name_width + 3 + value_width).saturating_sub(width(&title));
        out.push_str(&format!("{title}{}\n", "-".repeat(rule.max(1))));
        for (name, column) in names.iter().zip(&cells) {
            let mut lines = wrap(&column.cell(row), value_width).into_iter();
            let first = lines.next().unwrap_or_default();
            out.push_str(&format!("{name:<name_width$} | {first}\n"));
            for line in lines {
                out.push_str(&format!("{:<name_width$} | {line}\n", ""));
            }
        }
    }
    Ok(out)
}

/// `text` cut into lines of at most `limit` characters at its spaces.
fn wrap(text: &str, limit: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        if !line.is_empty() && width(&line) + 1 + width(word) > limit {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    lines.push(line);
    lines
}

/// How one column's values become text.
enum Column<'a> {
    Double(&'a dyn Array, usize),
    Other(ArrayFormatter<'a>),
}

impl<'a> Column<'a> {
    fn new(array: &'a dyn Array, options: &FormatOptions<'a>) -> Result<Self> {
        Ok(match array.data_type() {
            DataType::Float64 => Column::Double(array, DOUBLE_DIGITS),
            DataType::Float32 => Column::Double(array, FLOAT_DIGITS),
            _ => Column::Other(ArrayFormatter::try_new(array, options)?),
        })
    }

    fn cell(&self, row: usize) -> String {
        match self {
            Column::Double(array, _) if array.is_null(row) => String::new(),
            Column::Double(array, digits) => {
                let value = match array.data_type() {
                    DataType::Float32 => f64::from(array.as_primitive::<Float32Type>().value(row)),
                    _ => array.as_primitive::<Float64Type>().value(row),
                };
                format_double(value, *digits)
            }
            Column::Other(formatter) => clean(&formatter.value(row).to_string()),
        }
    }
}

/// `value` rounded to `digits` significant digits (more for a larger
/// integer part, which is never rounded away) and written in the shortest
/// form that reads back as the rounded value: `32.95`, `2.0`, `1e20`,
/// `1.5e-7`. Like Arrow's own display, a whole number keeps its `.0` and
/// the exponent form is used from 1e16 up and below 1e-5.
pub fn format_double(value: f64, digits: usize) -> String {
    if !value.is_finite() || value == 0.0 {
        return format!("{value:?}");
    }
    let integer_digits = value.abs().log10().floor() as i64 + 1;
    let significant = (digits as i64).max(integer_digits).clamp(1, 17) as usize;
    let rounded: f64 = format!("{value:.*e}", significant - 1)
        .parse()
        .unwrap_or(value);
    let magnitude = rounded.abs();
    if !(1e-5..1e16).contains(&magnitude) {
        return format!("{rounded:e}");
    }
    let text = rounded.to_string();
    if text.contains('.') {
        text
    } else {
        text + ".0"
    }
}

/// A value on one line: control characters (a newline in a text value)
/// are escaped, so that each row stays one line of the table.
fn clean(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn width(text: &str) -> usize {
    text.chars().count()
}

/// `+------+-----+`
fn border(widths: &[usize]) -> String {
    let mut out = String::from("+");
    for w in widths {
        out.push_str(&"-".repeat(w + 2));
        out.push('+');
    }
    out.push('\n');
    out
}

/// `| a    | 1.5 |`
fn line(cells: &[String], widths: &[usize]) -> String {
    let mut out = String::from("|");
    for (cell, w) in cells.iter().zip(widths) {
        out.push(' ');
        out.push_str(cell);
        out.push_str(&" ".repeat(w - width(cell) + 1));
        out.push('|');
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    /// psql's expanded display: a record per block, long values wrapped
    /// at spaces within the width given.
    #[test]
    fn expanded_display_wraps_long_values() {
        use std::sync::Arc;

        use datafusion::arrow::array::StringArray;
        use datafusion::arrow::datatypes::Field;

        let schema = Schema::new(vec![
            Field::new("name", DataType::Utf8, false),
            Field::new("columns", DataType::Utf8, false),
        ]);
        let batch = RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(StringArray::from(vec!["m"])),
                Arc::new(StringArray::from(vec![
                    "ts TIMESTAMP, host TEXT, cpu DOUBLE, mem DOUBLE, swap DOUBLE",
                ])),
            ],
        )
        .unwrap();
        let text = super::expanded(&batch, 40).unwrap();
        assert_eq!(
            text,
            "-[ RECORD 1 ]---------------------------\n\
             name    | m\n\
             columns | ts TIMESTAMP, host TEXT, cpu\n\
             \x20       | DOUBLE, mem DOUBLE, swap\n\
             \x20       | DOUBLE\n"
        );
        assert!(super::widest_line(&text) <= 40, "{text}");
    }

    use std::sync::Arc;

    use datafusion::arrow::array::{ArrayRef, Float32Array, Float64Array, StringArray};
    use datafusion::arrow::datatypes::Field;

    use super::*;

    fn batch(hosts: &[Option<&str>], cpus: &[Option<f64>]) -> RecordBatch {
        let schema = Schema::new(vec![
            Field::new("host", DataType::Utf8, true),
            Field::new("cpu", DataType::Float64, true),
        ]);
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(hosts.to_vec())),
            Arc::new(Float64Array::from(cpus.to_vec())),
        ];
        RecordBatch::try_new(Arc::new(schema), columns).unwrap()
    }

    #[test]
    fn doubles_are_rounded_for_reading() {
        let cases = [
            (32.949999999999996, "32.95"),
            (0.1 + 0.2, "0.3"),
            (2.0, "2.0"),
            (-7.5, "-7.5"),
            (1.0 / 3.0, "0.3333333333"),
            (123456.789012345, "123456.789"),
            // The integer part is never rounded away.
            (12345678901.25, "12345678901.0"),
            (987654321012.0, "987654321012.0"),
            (1e20, "1e20"),
            (1.5e-7, "1.5e-7"),
            (0.00012345678912, "0.0001234567891"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (f64::NAN, "NaN"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
        ];
        for (value, text) in cases {
            assert_eq!(format_double(value, DOUBLE_DIGITS), text, "{value:?}");
        }
        assert_eq!(format_double(f64::from(0.1f32), FLOAT_DIGITS), "0.1");
    }

    #[test]
    fn a_table_shows_rounded_values_and_empty_nulls() {
        let mut table = Table::new(&batch(&[], &[]).schema());
        table
            .push(&batch(
                &[Some("a"), None],
                &[Some(32.949999999999996), None],
            ))
            .unwrap();
        assert_eq!(
            table.finish(),
            "+------+-------+\n\
             | host | cpu   |\n\
             +------+-------+\n\
             | a    | 32.95 |\n\
             |      |       |\n\
             +------+-------+\n"
        );
    }

    #[test]
    fn later_rows_continue_the_table_without_a_header() {
        let mut table = Table::new(&batch(&[], &[]).schema());
        table.push(&batch(&[Some("a")], &[Some(1.5)])).unwrap();
        assert_eq!(table.buffered(), 1);
        assert_eq!(
            table.flush(),
            "+------+-----+\n| host | cpu |\n+------+-----+\n| a    | 1.5 |\n"
        );
        assert_eq!(table.buffered(), 0);
        assert_eq!(table.flush(), "");
        table.push(&batch(&[Some("b")], &[Some(2.5)])).unwrap();
        table.push(&batch(&[Some("c")], &[Some(3.5)])).unwrap();
        assert_eq!(table.flush(), "| b    | 2.5 |\n| c    | 3.5 |\n");
        assert_eq!(table.finish(), "+------+-----+\n");
        assert_eq!(table.finish(), "");
    }

    #[test]
    fn a_wider_value_starts_a_new_table_with_the_header() {
        let mut table = Table::new(&batch(&[], &[]).schema());
        table.push(&batch(&[Some("a")], &[Some(1.5)])).unwrap();
        table.flush();
        table.push(&batch(&[Some("b")], &[Some(100.25)])).unwrap();
        table.push(&batch(&[Some("c")], &[Some(1.5)])).unwrap();
        assert_eq!(
            table.flush(),
            "+------+-----+\n\
             +------+--------+\n\
             | host | cpu    |\n\
             +------+--------+\n\
             | b    | 100.25 |\n\
             | c    | 1.5    |\n"
        );
        // Narrower values fit the wider columns.
        table.push(&batch(&[Some("d")], &[Some(2.0)])).unwrap();
        assert_eq!(table.finish(), "| d    | 2.0    |\n+------+--------+\n");
    }

    #[test]
    fn other_types_keep_arrows_display_and_stay_on_one_line() {
        let schema = Schema::new(vec![
            Field::new("note", DataType::Utf8, false),
            Field::new("x", DataType::Float32, false),
        ]);
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(vec!["two\nlines"])),
            Arc::new(Float32Array::from(vec![0.1f32])),
        ];
        let batch = RecordBatch::try_new(Arc::new(schema), columns).unwrap();
        let mut table = Table::new(&batch.schema());
        table.push(&batch).unwrap();
        let text = table.finish();
        assert!(text.contains("| two\\nlines | 0.1 |"), "{text}");
    }
}
