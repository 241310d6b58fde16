//! Alert message templates: `'cpu on {host} is {avg_cpu:.1}'`.
//!
//! `{name}` is replaced by the value of column `name` in the alert row;
//! `{name:.N}` prints a number with N decimals; `{{` and `}}` are literal
//! braces. NULL prints as `NULL`; timestamps print like the sinks print
//! them (`2024-05-06T09:05:00`).

use datafusion::arrow::array::{Array, ArrayRef, AsArray, StringBuilder};
use datafusion::arrow::datatypes::{DataType, Float64Type, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};

use crate::error::{Error, Result};
use crate::timestamp::format_timestamp_ms;

/// A parsed message template.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageTemplate {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(String),
    Column {
        name: String,
        decimals: Option<usize>,
    },
}

impl MessageTemplate {
    /// Parses `text`; errors name the offending position.
    pub fn parse(text: &str) -> Result<Self> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = text.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            match c {
                '{' if chars.peek().is_some_and(|(_, n)| *n == '{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek().is_some_and(|(_, n)| *n == '}') => {
                    chars.next();
                    literal.push('}');
                }
                '{' => {
                    let rest = &text[at + 1..];
                    let end = rest.find('}').ok_or_else(|| {
                        bad(
                            text,
                            at,
                            "has a '{' without its '}' (write '{{' for a brace)",
                        )
                    })?;
                    parts.push(Part::Text(std::mem::take(&mut literal)));
                    parts.push(placeholder(text, at, &rest[..end])?);
                    for _ in 0..=rest[..end].chars().count() {
                        chars.next();
                    }
                }
                '}' => return Err(bad(text, at, "has a '}' without its '{' (write '}}')")),
                c => literal.push(c),
            }
        }
        parts.push(Part::Text(literal));
        parts.retain(|p| !matches!(p, Part::Text(t) if t.is_empty()));
        Ok(Self { parts })
    }

    /// The column names the template reads, in order of first use.
    pub fn columns(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for part in &self.parts {
            if let Part::Column { name, .. } = part
                && !names.contains(&name.as_str())
            {
                names.push(name);
            }
        }
        names
    }

    /// Renders the template for every row of `batch`, which has every
    /// column the template reads.
    pub fn render(&self, batch: &RecordBatch) -> Result<ArrayRef> {
        let mut out = StringBuilder::new();
        let mut line = String::new();
        for row in 0..batch.num_rows() {
            line.clear();
            for part in &self.parts {
                match part {
                    Part::Text(text) => line.push_str(text),
                    Part::Column { name, decimals } => {
                        let column = batch.column_by_name(name).ok_or_else(|| {
                            Error::Plan(format!("MESSAGE reads unknown column '{name}'"))
                        })?;
                        write_value(&mut line, column, row, *decimals)?;
                    }
                }
            }
            out.append_value(&line);
        }
        Ok(std::sync::Arc::new(out.finish()))
    }
}

fn placeholder(text: &str, at: usize, inside: &str) -> Result<Part> {
    let (name, format) = match inside.split_once(':') {
        Some((name, format)) => (name.trim(), Some(format.trim())),
        None => (inside.trim(), None),
    };
    if name.is_empty() {
        return Err(bad(text, at, "has an empty '{}'"));
    }
    let decimals = match format {
        None => None,
        Some(f) => Some(
            f.strip_prefix('.')
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|&n| n <= 17)
                .ok_or_else(|| {
                    bad(
                        text,
                        at,
                        &format!(
                            "has format ':{f}'; the one format is ':.N' (N decimals, 0 to 17)"
                        ),
                    )
                })?,
        ),
    };
    Ok(Part::Column {
        name: name.to_string(),
        decimals,
    })
}

fn bad(text: &str, at: usize, why: &str) -> Error {
    let column = text[..at].chars().count() + 1;
    Error::Plan(format!("MESSAGE '{text}' {why} at character {column}"))
}

fn write_value(
    line: &mut String,
    column: &ArrayRef,
    row: usize,
    decimals: Option<usize>,
) -> Result<()> {
    use std::fmt::Write;
    if column.is_null(row) {
        line.push_str("NULL");
        return Ok(());
    }
    match column.data_type() {
        DataType::Timestamp(..) => {
            let ms = timestamp_ms(column, row)?;
            line.push_str(&format_timestamp_ms(ms));
        }
        t if t.is_numeric() && decimals.is_some() => {
            let value =
                datafusion::arrow::compute::cast(&column.slice(row, 1), &DataType::Float64)?;
            let value = value.as_primitive::<Float64Type>().value(0);
            let _ = write!(line, "{value:.*}", decimals.unwrap_or(0));
        }
        _ => {
            let formatter = ArrayFormatter::try_new(column.as_ref(), &FormatOptions::default())?;
            let _ = write!(line, "{}", formatter.value(row));
        }
    }
    Ok(())
}

fn timestamp_ms(column: &ArrayRef, row: usize) -> Result<i64> {
    let millis = datafusion::arrow::compute::cast(
        &column.slice(row, 1),
        &DataType::Timestamp(TimeUnit::Millisecond, None),
    )?;
    Ok(millis
        .as_primitive::<datafusion::arrow::datatypes::TimestampMillisecondType>()
        .value(0))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Float64Array, StringArray, TimestampMillisecondArray};
    use datafusion::arrow::datatypes::{Field, Schema};

    use super::*;

    fn batch() -> RecordBatch {
        let schema = Schema::new(vec![
            Field::new("host", DataType::Utf8, true),
            Field::new("avg_cpu", DataType::Float64, true),
            Field::new(
                "event_time",
                DataType::Timestamp(TimeUnit::Millisecond, None),
                false,
            ),
        ]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(StringArray::from(vec![Some("web-01"), None])),
                Arc::new(Float64Array::from(vec![Some(93.256), Some(1.5)])),
                Arc::new(TimestampMillisecondArray::from(vec![10_000, 20_500])),
            ],
        )
        .unwrap()
    }

    fn render(template: &str) -> Vec<String> {
        let rendered = MessageTemplate::parse(template)
            .unwrap()
            .render(&batch())
            .unwrap();
        rendered
            .as_string::<i32>()
            .iter()
            .map(|v| v.unwrap().to_string())
            .collect()
    }

    #[test]
    fn placeholders_are_replaced_per_row() {
        assert_eq!(
            render("cpu on {host} is {avg_cpu} at {event_time}"),
            [
                "cpu on web-01 is 93.256 at 1970-01-01T00:00:10",
                "cpu on NULL is 1.5 at 1970-01-01T00:00:20.500"
            ]
        );
        assert_eq!(render("{avg_cpu:.1}%"), ["93.3%", "1.5%"]);
        assert_eq!(
            render("{{literal}} {host}"),
            ["{literal} web-01", "{literal} NULL"]
        );
    }

    #[test]
    fn columns_are_listed_once() {
        let t = MessageTemplate::parse("{a} {b:.2} {a}").unwrap();
        assert_eq!(t.columns(), ["a", "b"]);
    }

    #[test]
    fn malformed_templates_say_where() {
        let e = MessageTemplate::parse("cpu {host").unwrap_err().to_string();
        assert!(
            e.contains("without its '}'") && e.contains("character 5"),
            "{e}"
        );
        let e = MessageTemplate::parse("a } b").unwrap_err().to_string();
        assert!(e.contains("character 3"), "{e}");
        let e = MessageTemplate::parse("{x:5}").unwrap_err().to_string();
        assert!(e.contains("':.N'"), "{e}");
        assert!(MessageTemplate::parse("{}").is_err());
    }
}
