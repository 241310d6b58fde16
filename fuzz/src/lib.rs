//! What the fuzz targets share: running a script through vigil's parser
//! and planner the way `vigil check` does, and decoding pushed rows.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

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

/// Inputs planned by one engine before it is replaced by a fresh one.
const RUNS_PER_ENGINE: u32 = 64;

/// Parses `sql` and plans each statement that parses, like `vigil check`:
/// every outcome is fine but a panic, an abort or a hang.
///
/// A new engine per input costs more than most inputs (DataFusion builds
/// its function registry), so one engine plans [`RUNS_PER_ENGINE`] inputs
/// in a row: declarations of earlier inputs stay visible (a name declared
/// twice is an error like any other). A crash found this way reproduces
/// with the one input in nearly all cases; `check_fresh` plans it alone.
pub fn check_script(sql: &str, base: &Path) {
    static ENGINE: Mutex<Option<(Engine, u32)>> = Mutex::new(None);
    let mut slot = ENGINE.lock().unwrap_or_else(|e| e.into_inner());
    let (engine, runs) = slot.get_or_insert_with(|| (Engine::new(), 0));
    plan_all(engine, sql, base);
    *runs += 1;
    if *runs >= RUNS_PER_ENGINE {
        *slot = None;
    }
}

/// Like [`check_script`] with an engine of its own.
pub fn check_fresh(sql: &str, base: &Path) {
    plan_all(&mut Engine::new(), sql, base);
}

fn plan_all(engine: &mut Engine, sql: &str, base: &Path) {
    let Ok(statements) = parse_statements(sql) else {
        return;
    };
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
        decode: Default::default(),
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
