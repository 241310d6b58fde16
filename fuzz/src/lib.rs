//! What the fuzz targets share: running a script through vigil's parser
//! and planner the way `vigil check` does, and decoding pushed rows.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use vigil::connectors::{Format, Replay, SourceConfig, SourceLocation, SourceStats, read_bytes};
use vigil::engine::Engine;
use vigil::sql::parse_statements;

#[path = "../../tests/statement_gen.rs"]
#[allow(dead_code)]
pub mod statement_gen;

/// A directory for the relative paths in fuzzed statements; nothing is
/// written there by planning, but it keeps stray paths out of the tree.
pub fn base_dir() -> PathBuf {
    std::env::temp_dir().join("vigil-fuzz")
}

/// Parses `sql` and plans each statement that parses, like `vigil check`:
/// every outcome is fine but a panic, an abort or a hang.
pub fn check_script(sql: &str, base: &Path) {
    let Ok(statements) = parse_statements(sql) else {
        return;
    };
    let mut engine = Engine::new();
    for statement in statements.into_iter().flatten() {
        let _ = engine.execute(&statement, base);
    }
}

/// Text from fuzz bytes: UTF-8 as is, anything else with replacements, so
/// the parser sees every byte sequence the tokenizer can get.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The schema pushed rows are decoded into: one column of each type.
pub fn row_config(format: Format) -> SourceConfig {
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    let schema = Schema::new(vec![
        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        Field::new("host", DataType::Utf8, true),
        Field::new("cpu", DataType::Float64, true),
        Field::new("n", DataType::Int64, true),
        Field::new("ok", DataType::Boolean, true),
    ]);
    SourceConfig {
        stream: "m".into(),
        schema: Arc::new(schema),
        location: SourceLocation::Push,
        format,
        replay: Replay::Fast,
        event_time: Some(0),
        batch_size: 7,
        dead_letter: None,
        follow: false,
    }
}

/// Decodes `bytes` as pushed rows; every batch must have the schema.
pub fn decode(format: Format, bytes: &[u8]) {
    let config = row_config(format);
    let stats = SourceStats::default();
    let schema = config.schema.clone();
    let _ = read_bytes(&config, format, bytes, &stats, &mut |batch| {
        assert_eq!(batch.schema(), schema, "a batch has the stream's schema");
        assert!(batch.num_rows() <= config.batch_size);
        true
    });
}
