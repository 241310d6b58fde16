//! JSON lines: each line one object, its fields read by name into the
//! stream's columns (a fast path with serde visitors, the `Value` path for
//! what it cannot judge), nested values flattened.

use super::*;

// -------------------------------------------------------------- JSONL ----

/// Describes a JSON value for a type-mismatch reason.
pub(super) fn describe(value: &Value) -> String {
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
pub(super) fn json_value(
    kind: Kind,
    column: &str,
    value: &Value,
    unit: TsUnit,
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
        (Kind::Timestamp, Value::Number(n)) => match json_epoch(n, unit) {
            Some(t) => Val::Int(t),
            None if n.is_i64() => {
                return Err(format!("column {column}: timestamp {n} is out of range"));
            }
            None => {
                return Err(format!(
                    "column {column}: cannot represent {n} as TIMESTAMP (ts_unit = '{}')",
                    unit.name()
                ));
            }
        },
        (Kind::Int, Value::Number(n)) => match n.as_i64() {
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
        (Kind::Timestamp, Value::String(s)) => match parse_timestamp(s, unit) {
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

/// A JSON number as an epoch timestamp in `unit`: an integer, an integral
/// float, or (in seconds) a decimal fraction.
pub(super) fn json_epoch(n: &serde_json::Number, unit: TsUnit) -> Option<i64> {
    if let Some(i) = n.as_i64() {
        return unit.to_ms(i);
    }
    if unit == TsUnit::Seconds {
        return parse_timestamp(&n.to_string(), unit);
    }
    let f = n.as_f64()?;
    (f.is_finite() && f.fract() == 0.0 && f.abs() < 9.2e18)
        .then_some(f as i64)
        .and_then(|i| unit.to_ms(i))
}

/// A serde_json error without its "at line 1" position, which is
/// meaningless for a single line; the column is kept.
pub(super) fn json_error(e: &serde_json::Error) -> String {
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

/// Parses one JSON line into `vals`; returns whether the event time (at
/// `event_time`) was written as a number.
///
/// A row goes through [`fast_json_row`] first, which allocates nothing; a
/// row it does not take (an error, a key matched only ignoring case, a
/// nested value) is parsed again by [`slow_json_row`], whose result and
/// error texts are the reference: the fast path only takes rows on which
/// both agree.
pub(super) fn parse_json_row(
    text: &[u8],
    schema: &SchemaRef,
    kinds: &[Kind],
    unit: TsUnit,
    event_time: Option<usize>,
    vals: &mut [Val],
    arena: &mut String,
) -> std::result::Result<bool, String> {
    if let Some(epoch_time) = fast_json_row(text, schema, kinds, unit, event_time, vals, arena) {
        return Ok(epoch_time);
    }
    slow_json_row(text, schema, kinds, unit, event_time, vals, arena)
}

/// Parses one JSON line straight into `vals` with a serde visitor (no
/// `Value` tree); `None` when the row needs [`slow_json_row`].
pub(super) fn fast_json_row(
    text: &[u8],
    schema: &SchemaRef,
    kinds: &[Kind],
    unit: TsUnit,
    event_time: Option<usize>,
    vals: &mut [Val],
    arena: &mut String,
) -> Option<bool> {
    use serde::de::DeserializeSeed;
    arena.clear();
    vals.fill(Val::Null);
    let mut epoch_time = false;
    let mut de = serde_json::Deserializer::from_slice(text);
    let seed = fast_json::RowSeed {
        schema,
        kinds,
        unit,
        event_time,
        vals,
        arena,
        epoch_time: &mut epoch_time,
    };
    seed.deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(epoch_time)
}

/// Parses one JSON line through a `serde_json::Value`: the reference for
/// what a row decodes to and why a bad one is bad.
pub(super) fn slow_json_row(
    text: &[u8],
    schema: &SchemaRef,
    kinds: &[Kind],
    unit: TsUnit,
    event_time: Option<usize>,
    vals: &mut [Val],
    arena: &mut String,
) -> std::result::Result<bool, String> {
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
    let mut epoch_time = false;
    for (i, (field, &kind)) in schema.fields().iter().zip(kinds).enumerate() {
        let name = field.name();
        let found = map.get(name.as_str()).or_else(|| {
            map.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v)
        });
        if event_time == Some(i) {
            epoch_time = matches!(found, Some(Value::Number(_)));
        }
        vals[i] = match found {
            None => Val::Null,
            Some(v) if kind == Kind::Nested => {
                nested_json(field.data_type(), name, v, unit, arena)?
            }
            Some(v) => json_value(kind, name, v, unit, arena)?,
        };
    }
    Ok(epoch_time)
}

/// Checks a nested column's value and keeps its JSON text in `arena`.
pub(super) fn nested_json(
    data_type: &DataType,
    column: &str,
    value: &Value,
    unit: TsUnit,
    arena: &mut String,
) -> std::result::Result<Val, String> {
    if nested::typed(data_type, value, unit, column)?.is_null() {
        return Ok(Val::Null);
    }
    let start = arena.len();
    arena.push_str(&value.to_string());
    Ok(Val::Text(start, arena.len()))
}

/// The serde visitors of [`fast_json_row`]. Every value is judged by
/// [`json_value`], as in the slow path; strings, which a `Value` would
/// allocate, are handled here the way `json_value` handles them. Anything
/// else fails, sending the row to the slow path.
pub(super) mod fast_json {
    use std::fmt;

    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
    use serde_json::Value;

    use super::{Kind, SchemaRef, TsUnit, Val, json_value, parse_timestamp};

    /// Why the fast path gave up; never shown.
    fn give_up<E: serde::de::Error>() -> E {
        E::custom("not on the fast path")
    }

    pub(super) struct RowSeed<'a> {
        pub schema: &'a SchemaRef,
        pub kinds: &'a [Kind],
        pub unit: TsUnit,
        pub event_time: Option<usize>,
        pub vals: &'a mut [Val],
        pub arena: &'a mut String,
        pub epoch_time: &'a mut bool,
    }

    impl<'de> DeserializeSeed<'de> for RowSeed<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_map(self)
        }
    }

    impl<'de> Visitor<'de> for RowSeed<'_> {
        type Value = ();

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON object")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key_seed(KeySeed(self.schema))? {
                let Some(i) = key else {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                };
                let value = ValueSeed {
                    kind: self.kinds[i],
                    column: self.schema.field(i).name(),
                    unit: self.unit,
                    arena: self.arena,
                };
                let (val, number) = map.next_value_seed(value)?;
                self.vals[i] = val;
                if self.event_time == Some(i) {
                    *self.epoch_time = number;
                }
            }
            Ok(())
        }
    }

    /// A key: the index of the column it names exactly, `None` for a key
    /// no column has in any case; a key that names a column only ignoring
    /// case fails (the slow path decides which key wins then).
    struct KeySeed<'a>(&'a SchemaRef);

    impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
        type Value = Option<usize>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
            d.deserialize_str(self)
        }
    }

    impl<'de> Visitor<'de> for KeySeed<'_> {
        type Value = Option<usize>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a key")
        }

        fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Option<usize>, E> {
            let fields = self.0.fields();
            let exact = fields.iter().position(|f| f.name() == key);
            // Another column may read this key too, ignoring case.
            let near = fields.iter().filter(|f| f.name().eq_ignore_ascii_case(key));
            match (exact, near.count()) {
                (Some(i), 1) => Ok(Some(i)),
                (None, 0) => Ok(None),
                _ => Err(give_up()),
            }
        }
    }

    /// A column's value, and whether it was a number.
    struct ValueSeed<'a> {
        kind: Kind,
        column: &'a str,
        unit: TsUnit,
        arena: &'a mut String,
    }

    impl ValueSeed<'_> {
        fn judge<E: serde::de::Error>(self, value: Value) -> Result<(Val, bool), E> {
            let number = value.is_number();
            let val = json_value(self.kind, self.column, &value, self.unit, self.arena)
                .map_err(|_| give_up::<E>())?;
            Ok((val, number))
        }
    }

    impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
        type Value = (Val, bool);
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(Val, bool), D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for ValueSeed<'_> {
        type Value = (Val, bool);

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a scalar")
        }

        fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<(Val, bool), E> {
            self.judge(Value::Bool(b))
        }

        fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<(Val, bool), E> {
            self.judge(Value::from(n))
        }

        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<(Val, bool), E> {
            self.judge(Value::from(n))
        }

        fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<(Val, bool), E> {
            match serde_json::Number::from_f64(n) {
                Some(n) => self.judge(Value::Number(n)),
                None => Err(give_up()),
            }
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<(Val, bool), E> {
            self.judge(Value::Null)
        }

        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<(Val, bool), E> {
            let val = match self.kind {
                Kind::Text => {
                    let start = self.arena.len();
                    self.arena.push_str(s);
                    Val::Text(start, self.arena.len())
                }
                Kind::Timestamp => Val::Int(parse_timestamp(s, self.unit).ok_or_else(give_up)?),
                _ => return Err(give_up()),
            };
            Ok((val, false))
        }
    }
}

pub(super) fn read_jsonl<R: Read>(mut input: Input<'_, R>, d: &mut Driver<'_>) -> Result<()> {
    let schema = d.batcher.schema.clone();
    let kinds = d.batcher.kinds.clone();
    let unit = d.decode.ts_unit;
    let mut vals = vec![Val::Null; kinds.len()];
    let mut arena = String::new();
    let mut buf = Vec::new();
    if !d.accept_pending()? {
        return Ok(());
    }
    let parallel = d.parallel(&input);
    loop {
        if parallel {
            let lines = parallel::Lines::new(d, None);
            if !parallel::decode(&mut input, d, &lines)? {
                return Ok(());
            }
            break;
        }
        match input.next_line(&mut buf, d.decode.max_record_size)? {
            Next::Line { .. } => {}
            Next::Idle if d.idle()? => continue,
            Next::Idle => return Ok(()),
            Next::End => break,
        }
        let at = input.at();
        let text = buf.trim_ascii();
        if let Some(length) = input.overlong {
            let reason = overlong_reason(length, d.decode.max_record_size);
            d.bad(at.number, reason, text)?;
        } else if !text.is_empty() {
            let parsed = parse_json_row(
                text,
                &schema,
                &kinds,
                unit,
                d.batcher.event_time,
                &mut vals,
                &mut arena,
            );
            let keep_going = match parsed {
                Ok(epoch_time) => d.row(Row {
                    line: at.number,
                    vals: &vals,
                    text: arena.as_bytes(),
                    raw: text,
                    epoch_time,
                    end: at.after,
                })?,
                Err(reason) => {
                    d.bad(at.number, reason, text)?;
                    true
                }
            };
            if !keep_going {
                return Ok(());
            }
        }
        d.advance(at.after);
        if !d.flush_if_dry(&input)? {
            return Ok(());
        }
    }
    if d.stopped() {
        // Stopped, not ended: held rows stay undecided.
        return d.flush().map(drop);
    }
    d.finish()
}
