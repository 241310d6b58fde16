//! Rendering parse errors with their position and a caret.

use datafusion::sql::sqlparser::tokenizer::Location;

/// Formats `message` with `line L, column C`, the source line and a caret
/// under the column.
pub fn render_error(sql: &str, message: &str, at: Location) -> String {
    if at.line == 0 {
        return message.to_string();
    }
    let text = sql.lines().nth(at.line as usize - 1).unwrap_or("");
    let gutter = at.line.to_string();
    let pad = " ".repeat(gutter.len());
    let caret_at: String = text
        .chars()
        .take(at.column.saturating_sub(1) as usize)
        .map(|c| if c == '\t' { '\t' } else { ' ' })
        .collect();
    format!(
        "{message} at line {}, column {}\n {gutter} | {text}\n {pad} | {caret_at}^",
        at.line, at.column
    )
}

/// Splits sqlparser's `"... at Line: 3, Column: 7"` into the message and the
/// location.
pub fn split_location(text: &str) -> Option<(&str, Location)> {
    let idx = text.rfind(" at Line: ")?;
    let rest = &text[idx + " at Line: ".len()..];
    let (line, column) = rest.split_once(", Column: ")?;
    let line = line.trim().parse().ok()?;
    let column = column.trim().parse().ok()?;
    Some((&text[..idx], Location { line, column }))
}

/// The inverse of [`render_error`]: the message, the location, and the
/// source line with its caret (the lines after the first).
pub fn split_rendered(text: &str) -> Option<(&str, Location, &str)> {
    let (first, caret) = text.split_once('\n')?;
    let idx = first.rfind(" at line ")?;
    let (line, column) = first[idx + " at line ".len()..].split_once(", column ")?;
    let at = Location {
        line: line.trim().parse().ok()?,
        column: column.trim().parse().ok()?,
    };
    Some((&first[..idx], at, caret))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendered_errors_split_back() {
        let sql = "SELECT a\nFROM m WHERE;";
        let text = render_error(
            sql,
            "Expected: an expression, found: ;",
            Location::new(2, 13),
        );
        let (message, at, caret) = split_rendered(&text).unwrap();
        assert_eq!(message, "Expected: an expression, found: ;");
        assert_eq!((at.line, at.column), (2, 13));
        assert_eq!(caret, " 2 | FROM m WHERE;\n   |             ^");
        assert!(split_rendered("no location here").is_none());
    }
}
