//! Property tests: whatever text reaches the parser and planner, or the
//! CSV and JSON-lines decoders, each returns a result or a clean error in
//! bounded time; never a panic or a hang. The case counts are small so the
//! suite stays fast; `fuzz/` runs the same checks for longer.

use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, RngSeed};
use vigil::connectors::{Format, Replay, SourceConfig, SourceLocation, SourceStats, read_bytes};
use vigil::engine::Engine;
use vigil::sql::parse_statements;

use crate::statement_gen::{PRELUDE, script};

/// Longest one script may take to parse and plan; far more than any
/// takes, so only a hang (or a quadratic blow-up) trips it.
const BOUND: Duration = Duration::from_secs(60);

/// The runner's configuration: `cases` cases from a seed that is printed,
/// failing inputs kept.
///
/// A failure's minimal input is saved in `proptest-regressions/props.txt`
/// (at the repository's root, beside the other modules' files); every later
/// run tries the saved cases first, so commit that file with the fix.
///
/// The cases come from one seed per test, `PROPTEST_RNG_SEED` when it is
/// set, else a random one. It is printed to the test's output, which
/// `cargo test` shows when the test fails; rerun the same cases with
///
/// ```text
/// PROPTEST_RNG_SEED=<seed> cargo test --locked --test main props::<test name>
/// ```
fn config(cases: u32) -> Config {
    // Config::default() reads the PROPTEST_* variables.
    let defaults = Config::default();
    let seed = match defaults.rng_seed {
        RngSeed::Fixed(seed) => seed,
        RngSeed::Random => fastrand::u64(..),
    };
    eprintln!(
        "proptest seed {seed} ({:?}); rerun with PROPTEST_RNG_SEED={seed}",
        defaults.rng_algorithm
    );
    Config {
        cases,
        // A failure is shrunk a little, not for minutes.
        max_shrink_iters: 64,
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel(
            "proptest-regressions",
        ))),
        rng_seed: RngSeed::Fixed(seed),
        ..defaults
    }
}

/// Runs `f` on a thread of the size tokio gives its workers (2 MiB), so a
/// deep recursion shows as here as in the service, and fails if it takes
/// longer than [`BOUND`]. A panic in `f` fails the test with its message.
fn bounded(what: &str, f: impl FnOnce() + Send + 'static) {
    let (done, finished) = mpsc::channel();
    let worker = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            f();
            let _ = done.send(());
        })
        .expect("a thread");
    match finished.recv_timeout(BOUND) {
        Ok(()) => worker.join().expect("finished"),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(panic) = worker.join() {
                std::panic::resume_unwind(panic)
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("took over {BOUND:?}: {what}"),
    }
}

/// Parses `sql` and plans every statement that parses, like `vigil check`.
fn check(sql: String) {
    let what = sql.chars().take(2000).collect::<String>();
    bounded(&what, move || {
        let Ok(statements) = parse_statements(&sql) else {
            return;
        };
        let mut engine = Engine::new();
        for statement in statements.into_iter().flatten() {
            let _ = engine.execute(&statement, Path::new("/nonexistent-vigil-dir"));
        }
    });
}

/// The statements of the conformance cases' `--- sql` sections.
fn case_statements() -> &'static [String] {
    static STATEMENTS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    STATEMENTS.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cases");
        let mut paths: Vec<_> = std::fs::read_dir(dir)
            .expect("tests/cases")
            .map(|e| e.expect("an entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "case"))
            .collect();
        paths.sort();
        let mut statements = Vec::new();
        for path in paths {
            let text = std::fs::read_to_string(&path).expect("a case");
            let Some((_, rest)) = text.split_once("--- sql\n") else {
                continue;
            };
            let sql = rest.split("\n--- ").next().unwrap_or("");
            statements.extend(
                sql.split(';')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from),
            );
        }
        assert!(statements.len() > 100, "the cases hold statements");
        statements
    })
}

/// Words and symbols spliced into statements by [`mutate`].
const SPLICE: &[&str] = &[
    "(",
    ")",
    ",",
    ";",
    "'",
    "\"",
    "--",
    "/*",
    "*/",
    " SELECT ",
    " FROM ",
    " WHERE ",
    " GROUP BY ",
    " EMIT CHANGES",
    " EMIT ",
    " ALERT WHEN ",
    " ALERT ",
    " LEARN SET OF ",
    " TRAIN FOR ",
    " FOR ",
    " RESOLVE WHEN ",
    " WINDOWS",
    " INTERVAL '1' SECOND",
    " TUMBLE(",
    " HOP(",
    " SESSION(",
    " UNION ALL ",
    " AND ",
    " + ",
    " NULL ",
    " 0 ",
    " -1 ",
    " 1e999 ",
    " ts ",
    " window_start ",
    " WATERMARK FOR ",
    " WITH (",
    " = ",
    " CREATE ",
    " VIEW ",
    " AS ",
    "é",
    "\u{0}",
];

/// One edit of a statement: delete, duplicate or replace a range, or
/// splice in a word; positions are fractions of the length.
#[derive(Debug, Clone)]
enum Edit {
    Delete(u16, u16),
    Duplicate(u16, u16),
    Splice(u16, usize),
    Truncate(u16),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<u16>(), any::<u16>()).prop_map(|(a, b)| Edit::Delete(a, b)),
        (any::<u16>(), any::<u16>()).prop_map(|(a, b)| Edit::Duplicate(a, b)),
        (any::<u16>(), 0..SPLICE.len()).prop_map(|(a, w)| Edit::Splice(a, w)),
        any::<u16>().prop_map(Edit::Truncate),
    ]
}

/// The char boundary at fraction `at / 65536` of `text`.
fn boundary(text: &str, at: u16) -> usize {
    let mut i = text.len() * at as usize / 65536;
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn mutate(statement: &str, edits: &[Edit]) -> String {
    let mut text = statement.to_string();
    for edit in edits {
        match *edit {
            Edit::Delete(a, b) | Edit::Duplicate(a, b) => {
                let (a, b) = (boundary(&text, a.min(b)), boundary(&text, a.max(b)));
                let piece = text[a..b].to_string();
                if matches!(edit, Edit::Delete(..)) {
                    text.replace_range(a..b, "");
                } else {
                    text.insert_str(b, &piece);
                }
            }
            Edit::Splice(a, word) => {
                let at = boundary(&text, a);
                text.insert_str(at, SPLICE[word]);
            }
            Edit::Truncate(a) => text.truncate(boundary(&text, a)),
        }
    }
    text
}

proptest! {
    #![proptest_config(config(48))]

    #[test]
    fn random_bytes_parse_and_plan_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        check(String::from_utf8_lossy(&bytes).into_owned());
    }

    #[test]
    fn random_text_after_declarations_plans_cleanly(text in "[ -~\n]{0,200}") {
        check(format!("{PRELUDE}{text}"));
    }

    #[test]
    fn generated_statements_plan_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        check(script(&bytes));
    }

    #[test]
    fn mutated_case_statements_plan_cleanly(
        pick in any::<prop::sample::Index>(),
        edits in proptest::collection::vec(edit(), 1..4),
    ) {
        let statements = case_statements();
        let statement = &statements[pick.index(statements.len())];
        check(format!("{PRELUDE}{};", mutate(statement, &edits)));
    }
}

/// The schema rows are decoded into: a column of each supported type.
fn row_config(format: Format) -> SourceConfig {
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
        connector: "push",
        location: SourceLocation::Push,
        format,
        replay: Replay::Fast,
        event_time: Some(0),
        batch_size: 3,
        dead_letter: None,
        follow: false,
        decode_threads: 1,
        decode: Default::default(),
    }
}

/// Decodes `bytes`; every batch has the schema and at most a batch of
/// rows, and no more rows come out than lines went in.
fn decode(format: Format, bytes: Vec<u8>) {
    let what = String::from_utf8_lossy(&bytes).into_owned();
    bounded(&what, move || {
        let config = row_config(format);
        let stats = SourceStats::default();
        let mut rows = 0;
        let _ = read_bytes(&config, format, &bytes, &stats, &mut |batch| {
            assert_eq!(batch.schema(), config.schema);
            assert!(batch.num_rows() <= config.batch_size);
            rows += batch.num_rows();
            true
        });
        let lines = bytes.split(|&b| b == b'\n' || b == b'\r').count();
        assert!(rows <= lines, "{rows} rows from {lines} lines");
    });
}

/// Field values that sit on the edges of what the decoders accept.
const VALUES: &[&str] = &[
    "1000",
    "-1",
    "0",
    "1.5",
    "",
    "a",
    "\"a,b\"",
    "\"",
    "\"\"",
    "true",
    "FALSE",
    "t",
    "1e400",
    "-0",
    "NaN",
    "inf",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "2024-01-01T00:00:00Z",
    "2024-02-30 00:00:00",
    "1700000000000",
    "99999999999999999999",
    "é",
    "\u{0}",
    "null",
    "[1]",
    "{\"a\":1}",
];

fn csv_text() -> impl Strategy<Value = Vec<u8>> {
    let header = prop_oneof![
        Just("ts,host,cpu,n,ok".to_string()),
        Just("host,ts,cpu".to_string()),
        Just("TS,Host,CPU,N,OK,extra".to_string()),
        Just("ts,ts,host".to_string()),
        "[a-z,]{0,12}",
    ];
    let row = proptest::collection::vec(proptest::sample::select(VALUES), 0..7)
        .prop_map(|fields| fields.join(","));
    (
        header,
        proptest::collection::vec(row, 0..8),
        prop_oneof![Just("\n"), Just("\r\n")],
    )
        .prop_map(|(header, rows, end)| {
            let mut text = header;
            for row in rows {
                text.push_str(end);
                text.push_str(&row);
            }
            text.into_bytes()
        })
}

fn jsonl_text() -> impl Strategy<Value = Vec<u8>> {
    let key = proptest::sample::select(&["ts", "host", "cpu", "n", "ok", "TS", "x", ""][..]);
    let value = prop_oneof![
        proptest::sample::select(
            &[
                "1000",
                "-1",
                "1.5",
                "1e400",
                "true",
                "null",
                "[]",
                "{}",
                "\"a\"",
                "\"2024-01-01T00:00:00Z\"",
                "18446744073709551616",
                "\"\\ud800\""
            ][..]
        )
        .prop_map(String::from),
        "\"[ -~]{0,8}\"".prop_map(|s| s.replace('\\', "")),
    ];
    let object = proptest::collection::vec((key, value), 0..6).prop_map(|fields| {
        let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
        format!("{{{}}}", body.join(","))
    });
    let line = prop_oneof![object, "[ -~]{0,20}"];
    proptest::collection::vec(line, 0..8).prop_map(|lines| lines.join("\n").into_bytes())
}

proptest! {
    #![proptest_config(config(96))]

    #[test]
    fn random_csv_decodes_cleanly(bytes in csv_text()) {
        decode(Format::Csv, bytes);
    }

    #[test]
    fn random_jsonl_decodes_cleanly(bytes in jsonl_text()) {
        decode(Format::Jsonl, bytes);
    }

    #[test]
    fn random_bytes_decode_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..200), json in any::<bool>()) {
        decode(if json { Format::Jsonl } else { Format::Csv }, bytes);
    }
}

/// The generator is only worth its runs if its scripts get past the
/// parser: over a few fixed seeds, some statements plan into queries or
/// explained plans.
#[test]
fn generated_scripts_reach_the_planner() {
    use vigil::engine::Outcome;
    let mut planned = 0;
    for seed in 0u8..32 {
        let bytes: Vec<u8> = (0..64u8)
            .map(|i| i.wrapping_mul(37).wrapping_add(seed.wrapping_mul(11)))
            .collect();
        let statements = parse_statements(&script(&bytes)).expect("tokenizes");
        let mut engine = Engine::new();
        for statement in statements.into_iter().flatten() {
            let outcome = engine.execute(&statement, Path::new("/nonexistent-vigil-dir"));
            planned += usize::from(matches!(
                outcome,
                Ok(Outcome::Query(_) | Outcome::Explain(_))
            ));
        }
    }
    assert!(planned >= 3, "only {planned} generated queries planned");
}
