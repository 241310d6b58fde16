//! Messages as the decoders read them: one poll's batch, each message as
//! a line of JSON or CSV with its metadata columns, its origin for
//! bad-row reports, and the offsets a position stores.

use super::*;

/// What one poll gave.
pub(super) struct Polled<'c> {
    pub(super) messages: Vec<BorrowedMessage<'c>>,
    /// Partitions whose end the consumer reached.
    pub(super) ends: Vec<i32>,
}

/// Messages until a batch is full or a poll finds none.
pub(super) fn poll_batch(consumer: &BaseConsumer<Reporter>, batch_size: usize) -> Polled<'_> {
    let mut polled = Polled {
        messages: Vec::new(),
        ends: Vec::new(),
    };
    let deadline = Instant::now() + POLL;
    while polled.messages.len() < batch_size {
        let wait = if polled.messages.is_empty() {
            deadline.saturating_duration_since(Instant::now())
        } else {
            Duration::ZERO
        };
        match consumer.poll(wait) {
            Some(Ok(m)) => polled.messages.push(m),
            Some(Err(KafkaError::PartitionEOF(p))) => polled.ends.push(p),
            Some(Err(e)) => {
                consumer.context().warn(&e.to_string());
                break;
            }
            None => break,
        }
    }
    polled
}

/// Where `m` is, for bad rows and the dead-letter file.
pub(super) fn origin_of(m: &BorrowedMessage<'_>) -> MessageOrigin {
    MessageOrigin {
        at: format!("partition {} offset {}", m.partition(), m.offset()),
        line: m.offset().max(0) as u64,
        raw: m.payload().unwrap_or_default().to_vec(),
    }
}

/// `0,2,5` as partition numbers; `None` unless every one is a number >= 0.
pub(super) fn parse_partitions(text: &str) -> Option<Vec<i32>> {
    let list: Option<Vec<i32>> = text
        .split(',')
        .map(|p| p.trim().parse().ok().filter(|&n: &i32| n >= 0))
        .collect();
    list.filter(|l| !l.is_empty())
}

/// The offsets a position holds.
pub(super) fn offsets_of(stream: &str, position: &SourcePosition) -> Result<BTreeMap<i32, i64>> {
    let bad = || {
        Error::Connector(format!(
            "stream {stream}: the checkpoint's kafka position is damaged: {}",
            position.extra
        ))
    };
    let Some(offsets) = position.extra.get("offsets").and_then(Value::as_object) else {
        return Err(bad());
    };
    offsets
        .iter()
        .map(|(p, o)| Ok((p.parse().map_err(|_| bad())?, o.as_i64().ok_or_else(bad)?)))
        .collect()
}

/// The header line the CSV decoder reads messages under.
pub(super) fn csv_header(columns: &MessageColumns) -> String {
    let mut names: Vec<&str> = columns.payload.iter().map(String::as_str).collect();
    names.extend(columns.meta.iter().map(String::as_str));
    names.extend(columns.time_from_message.as_deref());
    let mut header = names
        .iter()
        .map(|n| csv_field(n))
        .collect::<Vec<_>>()
        .join(",");
    header.push('\n');
    header
}

pub(super) fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

/// The metadata values a message gives its row: (column, JSON value).
pub(super) fn meta_values(
    columns: &MessageColumns,
    m: &BorrowedMessage<'_>,
) -> Vec<(String, Value)> {
    let timestamp = m.timestamp().to_millis();
    let mut values: Vec<(String, Value)> = columns
        .meta
        .iter()
        .map(|name| {
            let value = match name.as_str() {
                "_key" => m
                    .key()
                    .map_or(Value::Null, |k| json!(String::from_utf8_lossy(k))),
                "_partition" => json!(m.partition()),
                "_offset" => json!(m.offset()),
                "_timestamp" => timestamp.map_or(Value::Null, |t| json!(format_timestamp_ms(t))),
                _ => json!(headers_json(m).to_string()),
            };
            (name.clone(), value)
        })
        .collect();
    if let Some(name) = &columns.time_from_message {
        let value = timestamp.map_or(Value::Null, |t| json!(format_timestamp_ms(t)));
        values.push((name.clone(), value));
    }
    values
}

pub(super) fn headers_json(m: &BorrowedMessage<'_>) -> Value {
    let mut object = serde_json::Map::new();
    if let Some(headers) = m.headers() {
        for i in 0..headers.count() {
            let h = headers.get(i);
            let value = h
                .value
                .map_or(Value::Null, |v| json!(String::from_utf8_lossy(v)));
            object.insert(h.key.to_string(), value);
        }
    }
    Value::Object(object)
}

/// Appends the line the decoder reads for `m` to `text`, or says why the
/// message cannot be one.
pub(super) fn message_line(
    columns: &MessageColumns,
    m: &BorrowedMessage<'_>,
    text: &mut Vec<u8>,
) -> std::result::Result<(), String> {
    let Some(payload) = m.payload() else {
        return Err("the message has no value".to_string());
    };
    let meta = meta_values(columns, m);
    match columns.format {
        MessageFormat::Json => json_line(payload, &meta, text),
        MessageFormat::Raw => {
            let mut object = serde_json::Map::new();
            object.insert(
                columns.payload[0].clone(),
                json!(String::from_utf8_lossy(payload)),
            );
            object.extend(meta);
            text.extend_from_slice(Value::Object(object).to_string().as_bytes());
            text.push(b'\n');
            Ok(())
        }
        MessageFormat::Csv => csv_line(payload, &meta, text),
    }
}

/// The payload's JSON object with the metadata fields added at its end
/// (they win over payload fields of the same name); newlines, which JSON
/// allows only as whitespace, become spaces so the object is one line.
pub(super) fn json_line(
    payload: &[u8],
    meta: &[(String, Value)],
    text: &mut Vec<u8>,
) -> std::result::Result<(), String> {
    let body = payload.trim_ascii();
    let start = text.len();
    text.extend(body.iter().map(|&b| match b {
        b'\n' | b'\r' => b' ',
        _ => b,
    }));
    if !meta.is_empty() && body.first() == Some(&b'{') && body.last() == Some(&b'}') {
        text.pop();
        let empty = body[1..body.len() - 1].trim_ascii().is_empty();
        let mut fields = String::new();
        for (i, (name, value)) in meta.iter().enumerate() {
            if i > 0 || !empty {
                fields.push(',');
            }
            let _ = write!(fields, "{}:{value}", json!(name));
        }
        fields.push('}');
        text.extend_from_slice(fields.as_bytes());
    }
    if text.len() == start {
        return Err("the message is empty".to_string());
    }
    text.push(b'\n');
    Ok(())
}

/// The payload's CSV record with the metadata values after it.
pub(super) fn csv_line(
    payload: &[u8],
    meta: &[(String, Value)],
    text: &mut Vec<u8>,
) -> std::result::Result<(), String> {
    let record = payload.strip_suffix(b"\n").unwrap_or(payload);
    let record = record.strip_suffix(b"\r").unwrap_or(record);
    if record.contains(&b'\n') {
        return Err("a CSV message must be one record on one line".to_string());
    }
    text.extend_from_slice(record);
    for (_, value) in meta {
        text.push(b',');
        let field = match value {
            Value::Null => String::new(),
            Value::String(s) => csv_field(s),
            other => other.to_string(),
        };
        text.extend_from_slice(field.as_bytes());
    }
    text.push(b'\n');
    Ok(())
}

/// Appends a message that never reached the decoder to the dead-letter
/// file, as the decoder writes its bad rows.
pub(super) fn append_dead_letter(
    path: &std::path::Path,
    origin: &MessageOrigin,
    reason: &str,
) -> Result<()> {
    use std::io::Write;
    let line = dead_letter_line(&origin.at, reason, &origin.raw);
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(&line))
        .map_err(|e| Error::io(format!("writing dead-letter file {}", path.display()), e))
}
