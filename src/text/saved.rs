//! The decoder state a file source's position carries (its `extra`):
//! the rows held back and the fields kept, saved and loaded.

use super::*;

/// The decoder state in a file source's position (its `extra`): what the
/// rows after the position depend on.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct FileState {
    /// A followed file: which file the offset is in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) file: Option<FileId>,
    /// The `max_future` guard's reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) guard: Option<GuardState>,
    /// The `ts_unit` check's samples, and whether it has decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) unit_check: Option<UnitState>,
    /// The largest event time emitted, for progress displays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) max_event_time: Option<i64>,
    /// Rows before the position that the guard holds back, undecided.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) held: Vec<SavedHeld>,
    /// Rows before the position that were accepted but not yet emitted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) accepted: Vec<Vec<SavedVal>>,
}

/// A value of a row kept in a position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum SavedVal {
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
pub(super) enum SavedBytes {
    Text(String),
    Bytes(Vec<u8>),
}

impl SavedBytes {
    pub(super) fn save(bytes: &[u8]) -> Self {
        match std::str::from_utf8(bytes) {
            Ok(text) => SavedBytes::Text(text.to_string()),
            Err(_) => SavedBytes::Bytes(bytes.to_vec()),
        }
    }

    pub(super) fn load(self) -> Vec<u8> {
        match self {
            SavedBytes::Text(text) => text.into_bytes(),
            SavedBytes::Bytes(bytes) => bytes,
        }
    }
}

/// A held row kept in a position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct SavedHeld {
    pub(super) line: u64,
    pub(super) time: i64,
    pub(super) reason: String,
    pub(super) raw: SavedBytes,
    pub(super) vals: Vec<SavedVal>,
}

impl SavedHeld {
    pub(super) fn save(row: &HeldRow) -> Self {
        SavedHeld {
            line: row.line,
            time: row.time,
            reason: row.reason.clone(),
            raw: SavedBytes::save(&row.raw),
            vals: save_vals(&row.vals, &row.text),
        }
    }

    pub(super) fn load(self, columns: usize, stream: &str) -> Result<HeldRow> {
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

pub(super) fn save_vals(vals: &[Val], text: &[u8]) -> Vec<SavedVal> {
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
pub(super) fn load_vals(
    saved: Vec<SavedVal>,
    columns: usize,
    stream: &str,
) -> Result<(Vec<Val>, Vec<u8>)> {
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
