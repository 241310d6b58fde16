use super::*;
use datafusion::arrow::array::{Float64Array, Int64Array, StringArray};
use std::fs;

fn keyed_batch(rows: usize) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("host", DataType::Utf8, true),
        Field::new("window", DataType::Int64, false),
        Field::new("sum", DataType::Float64, true),
    ]));
    // Rows of one host spread over the table, so key groups interleave.
    let hosts: Vec<Option<String>> = (0..rows)
        .map(|i| (i % 17 != 0).then(|| format!("host-{}", (i * 7) % 40)))
        .collect();
    let windows: Vec<i64> = (0..rows as i64).map(|i| 1000 * (i % 5)).collect();
    let sums: Vec<Option<f64>> = (0..rows)
        .map(|i| (i % 3 != 0).then_some(i as f64 * 0.5))
        .collect();
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from(hosts)),
            Arc::new(Int64Array::from(windows)),
            Arc::new(Float64Array::from(sums)),
        ],
    )
    .unwrap()
}

fn sample_state() -> OperatorState {
    let mut state = OperatorState::new();
    state.add("panes", keyed_batch(300), vec![0, 1]);
    state.add_scalars("meta", &[("watermark", Some(42_000)), ("timer", None)]);
    state.add("episodes", keyed_batch(0), vec![0]);
    state.add("pending", keyed_batch(0), Vec::new());
    state
}

fn checkpoint(id: u64, savepoint: bool) -> Checkpoint {
    let state = sample_state();
    let shapes = [OperatorShape::of("2", "WindowAggregate sum(cpu)", &state)];
    Checkpoint {
        id,
        time_ms: 1_700_000_000_000 + id as i64,
        query: "q1".into(),
        fingerprint: fingerprint(&shapes),
        savepoint,
        operators: vec![
            OperatorEntry {
                id: "2".into(),
                describe: "WindowAggregate sum(cpu)".into(),
                state,
            },
            OperatorEntry {
                id: "4".into(),
                describe: "Limit 10".into(),
                state: OperatorState::new(),
            },
        ],
        sources: vec![
            SourceEntry {
                stream: "metrics".into(),
                position: Some(SourcePosition {
                    offset: 1234,
                    line: 56,
                    rows: 55,
                    bad_rows: 1,
                    extra: serde_json::json!({"reference": 5}),
                }),
                ended: false,
                buffer: None,
            },
            SourceEntry {
                stream: "stdin".into(),
                position: None,
                ended: false,
                buffer: None,
            },
        ],
        sinks: vec![
            SinkEntry {
                name: "out".into(),
                commit: Some(serde_json::json!({"bytes": 99})),
            },
            SinkEntry {
                name: "null-commit".into(),
                commit: Some(serde_json::Value::Null),
            },
            SinkEntry {
                name: "stdout".into(),
                commit: None,
            },
        ],
    }
}

fn assert_same(a: &Checkpoint, b: &Checkpoint) {
    assert_eq!(a.id, b.id);
    assert_eq!(a.time_ms, b.time_ms);
    assert_eq!(a.query, b.query);
    assert_eq!(a.fingerprint, b.fingerprint);
    assert_eq!(a.savepoint, b.savepoint);
    assert_eq!(a.sources, b.sources);
    assert_eq!(a.sinks, b.sinks);
    assert_eq!(a.operators.len(), b.operators.len());
    for (x, y) in a.operators.iter().zip(&b.operators) {
        assert_eq!(x.id, y.id);
        assert_eq!(x.describe, y.describe);
        assert_eq!(x.state.tables.len(), y.state.tables.len());
        for (s, t) in x.state.tables.iter().zip(&y.state.tables) {
            assert_eq!(s.name, t.name);
            assert_eq!(s.key_columns, t.key_columns);
            assert_eq!(s.batch, t.batch, "table {}", s.name);
        }
    }
}

fn store(root: &Location, keep: usize) -> QueryStore {
    QueryStore::open(root, "q1", keep).unwrap()
}

/// Runs `test` on an empty root of each kind of store: a local directory,
/// object_store's LocalFileSystem (`file://`) and its InMemory.
fn each_root(test: impl Fn(&Location)) {
    static MEMORY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = tempfile::tempdir().unwrap();
    let memory = MEMORY.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let roots = [
        Location::local(dir.path().join("local")),
        Location::parse(&format!("file://{}/file", dir.path().display())).unwrap(),
        Location::parse(&format!("memory://store-tests-{memory}/root")).unwrap(),
    ];
    for root in &roots {
        eprintln!("store: {root}");
        test(root);
    }
}

/// The bytes of `file` in checkpoint `id`.
fn object(store: &QueryStore, id: u64, file: &str) -> Vec<u8> {
    store.path(id).child(file).get().unwrap().unwrap()
}

/// What a run that stopped while writing checkpoint `id` leaves.
fn incomplete(store: &QueryStore, id: u64) {
    store
        .path(id)
        .child("op-000-00.arrow")
        .put(b"half".to_vec())
        .unwrap();
}

fn ids(store: &QueryStore) -> Vec<u64> {
    store.list().unwrap().iter().map(|s| s.id).collect()
}

#[test]
fn round_trip_keeps_every_table_and_row_order() {
    each_root(|root| {
        let store = store(root, 3);
        let written = checkpoint(7, false);
        let info = store.write(&written).unwrap();
        assert_eq!(info.id, 7);
        assert!(info.path.to_string().ends_with("q1/chk-0000000007"));
        assert!(info.bytes > 0);
        let read = store.read(7).unwrap();
        assert_same(&written, &read);
        assert_eq!(
            read.operators[0].state.scalar("meta", "watermark").unwrap(),
            Some(42_000)
        );
        let latest = store.latest().unwrap();
        assert!(latest.warnings.is_empty());
        assert_same(&written, &latest.checkpoint.unwrap());
    });
}

#[test]
fn keyed_tables_are_stored_by_key_group() {
    each_root(|root| {
        let store = store(root, 3);
        store.write(&checkpoint(1, false)).unwrap();
        let manifest = store.manifest(1).unwrap();
        assert_eq!(manifest.version, MANIFEST_VERSION);
        let panes = &manifest.operators[0].tables[0];
        assert_eq!(panes.rows, 300);
        let groups = key_groups(&keyed_batch(300), &[0, 1]).unwrap();
        let distinct: std::collections::BTreeSet<u16> = groups.iter().copied().collect();
        assert_eq!(panes.groups.len(), distinct.len());
        assert!(panes.groups.iter().all(|g| g.rows > 0));
        let meta = &manifest.operators[0].tables[1];
        assert!(meta.groups.is_empty() && meta.rows == 1);
        assert_eq!(manifest.operators[0].tables[2].rows, 0);
    });
}

#[test]
fn some_key_groups_read_alone_in_the_operators_order() {
    each_root(|root| {
        let store = store(root, 3);
        store.write(&checkpoint(1, false)).unwrap();
        let wanted = 10..=70;
        let state = store.read_key_groups(1, "2", &wanted).unwrap();
        let full = keyed_batch(300);
        let groups = key_groups(&full, &[0, 1]).unwrap();
        let rows: Vec<u64> = (0..300u64)
            .filter(|&r| wanted.contains(&groups[r as usize]))
            .collect();
        assert!(!rows.is_empty() && rows.len() < 300);
        let expected = take_arrays(full.columns(), &UInt64Array::from(rows), None).unwrap();
        let expected = RecordBatch::try_new(full.schema(), expected).unwrap();
        assert_eq!(state.table("panes").unwrap(), &expected);
        // Unkeyed tables come whole; empty ones keep their schema.
        assert_eq!(state.scalar("meta", "watermark").unwrap(), Some(42_000));
        assert_eq!(state.table("episodes").unwrap().schema(), full.schema());
        assert!(store.read_key_groups(1, "9", &wanted).is_err());
    });
}

#[test]
fn latest_skips_a_truncated_file() {
    each_root(|root| {
        let store = store(root, 3);
        store.write(&checkpoint(1, false)).unwrap();
        store.write(&checkpoint(2, false)).unwrap();
        let file = store.path(2).child("op-000-00.arrow");
        let bytes = file.get().unwrap().unwrap();
        file.put(bytes[..bytes.len() / 2].to_vec()).unwrap();
        let restored = store.latest().unwrap();
        assert_eq!(restored.checkpoint.unwrap().id, 1);
        assert_eq!(restored.warnings.len(), 1);
        let warning = &restored.warnings[0];
        assert!(warning.contains("checkpoint 2"), "{warning}");
        assert!(warning.contains("bytes, the manifest says"), "{warning}");
        assert!(store.read(2).is_err());
    });
}

#[test]
fn latest_skips_a_flipped_byte() {
    each_root(|root| {
        let store = store(root, 3);
        store.write(&checkpoint(1, false)).unwrap();
        store.write(&checkpoint(2, false)).unwrap();
        let file = store.path(2).child("op-000-01.arrow");
        let mut bytes = object(&store, 2, "op-000-01.arrow");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x10;
        file.put(bytes).unwrap();
        let restored = store.latest().unwrap();
        assert_eq!(restored.checkpoint.unwrap().id, 1);
        let warning = &restored.warnings[0];
        assert!(warning.contains("checkpoint 2") && warning.contains("checksum mismatch"));
        assert!(warning.contains("'meta'"), "{warning}");
    });
}

#[test]
fn latest_skips_a_missing_or_unparsable_manifest() {
    each_root(|root| {
        let store = store(root, 5);
        store.write(&checkpoint(1, false)).unwrap();
        store.write(&checkpoint(2, false)).unwrap();
        store.write(&checkpoint(3, false)).unwrap();
        store.path(3).child(MANIFEST).remove().unwrap();
        store
            .path(2)
            .child(MANIFEST)
            .put(b"{\"version\": 1, \"id\": ".to_vec())
            .unwrap();
        let restored = store.latest().unwrap();
        assert_eq!(restored.checkpoint.unwrap().id, 1);
        assert_eq!(restored.warnings.len(), 2);
        assert!(
            restored.warnings[0].contains("checkpoint 3")
                && restored.warnings[0].contains("incomplete")
        );
        assert!(
            restored.warnings[1].contains("checkpoint 2")
                && restored.warnings[1].contains("unreadable")
        );
        assert_eq!(ids(&store), vec![1]);
    });
}

#[test]
fn nothing_to_restore_is_no_checkpoint() {
    each_root(|root| {
        let restored = store(root, 1).latest().unwrap();
        assert!(restored.checkpoint.is_none() && restored.warnings.is_empty());
    });
}

#[test]
fn a_newer_manifest_version_is_refused() {
    each_root(|root| {
        let store = store(root, 3);
        store.write(&checkpoint(1, false)).unwrap();
        store.write(&checkpoint(2, false)).unwrap();
        let text = String::from_utf8(object(&store, 2, MANIFEST)).unwrap();
        let newer = text.replace("\"version\":1", "\"version\":2");
        store
            .path(2)
            .child(MANIFEST)
            .put(newer.into_bytes())
            .unwrap();
        let error = store.latest().unwrap_err().to_string();
        assert!(
            error.contains("checkpoint 2") && error.contains("newer vigil"),
            "{error}"
        );
        assert!(error.contains("manifest version 2"), "{error}");
        assert!(store.read(2).is_err());
    });
}

#[test]
fn retention_keeps_the_newest_and_every_savepoint() {
    each_root(|root| {
        let store = store(root, 2);
        store.write(&checkpoint(1, true)).unwrap();
        store.write(&checkpoint(2, false)).unwrap();
        store.write(&checkpoint(3, false)).unwrap();
        // A run that stopped while writing 4, and one that is writing 6.
        incomplete(&store, 4);
        incomplete(&store, 6);
        assert_eq!(ids(&store), vec![1, 2, 3]);
        let info = store.write(&checkpoint(5, false)).unwrap();
        assert_eq!(info.removed, vec![2, 4]);
        assert!(info.warnings.is_empty());
        assert_eq!(ids(&store), vec![1, 3, 5]);
        assert!(store.path(6).exists().unwrap());
        assert!(store.list().unwrap()[0].savepoint);
    });
}

#[test]
fn an_existing_checkpoint_is_not_overwritten() {
    each_root(|root| {
        let store = store(root, 2);
        store.write(&checkpoint(1, false)).unwrap();
        let error = store.write(&checkpoint(1, false)).unwrap_err().to_string();
        assert!(error.contains("already exists"), "{error}");
        // An incomplete folder of the same id is replaced.
        incomplete(&store, 2);
        store.write(&checkpoint(2, false)).unwrap();
        assert_same(&checkpoint(2, false), &store.read(2).unwrap());
    });
}

#[test]
fn a_checkpoint_of_another_query_is_refused() {
    each_root(|root| {
        let store = QueryStore::open(root, "other", 2).unwrap();
        assert!(store.write(&checkpoint(1, false)).is_err());
        let error = store.read(1).unwrap_err().to_string();
        assert!(error.contains("has no checkpoint 1"), "{error}");
    });
}

#[test]
fn bad_key_columns_are_an_error() {
    each_root(|root| {
        let store = store(root, 2);
        let mut bad = checkpoint(1, false);
        bad.operators[0].state.tables[0].key_columns = vec![9];
        let error = store.write(&bad).unwrap_err().to_string();
        assert!(error.contains("key column 9 is out of range"), "{error}");
        assert!(!store.path(1).exists().unwrap());
    });
}

#[test]
fn folder_names_are_safe_distinct_and_reversible() {
    let names = [
        "q1",
        "Q1",
        "cpu alert",
        "a/b",
        "..",
        ".",
        "a%2F",
        "é",
        "x-y_z",
    ];
    let folders: Vec<String> = names.iter().map(|n| folder_name(n).unwrap()).collect();
    assert_eq!(folders[0], "q1");
    assert_eq!(folders[1], "%511");
    assert_eq!(folders[3], "a%2Fb");
    assert_eq!(folders[4], "%2E%2E");
    assert_eq!(folders[7], "%C3%A9");
    let distinct: std::collections::BTreeSet<&String> = folders.iter().collect();
    assert_eq!(distinct.len(), names.len());
    for (name, folder) in names.iter().zip(&folders) {
        assert!(!folder.contains('/') && !folder.contains('.'));
        assert_eq!(query_of_folder(folder).as_deref(), Some(*name));
    }
    assert!(folder_name("").is_err());
    assert_eq!(query_of_folder("lost+found"), None);
    assert_eq!(
        query_of_folder("%51%31"),
        None,
        "not the canonical folder of Q1"
    );
    assert_eq!(
        query_of_folder("%71"),
        None,
        "not the canonical folder of q"
    );
    assert_eq!(query_of_folder("%2"), None);
}

#[test]
fn query_folders_lists_the_stores() {
    each_root(|root| {
        for query in ["b alert", "a"] {
            let mut written = checkpoint(1, false);
            written.query = query.into();
            QueryStore::open(root, query, 1)
                .unwrap()
                .write(&written)
                .unwrap();
        }
        root.child("lost+found")
            .child("x")
            .put(b"x".to_vec())
            .unwrap();
        let found = query_folders(root).unwrap();
        let names: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b alert"]);
        assert_eq!(found[1].1, root.child("b%20alert"));
    });
    let root = tempfile::tempdir().unwrap();
    let missing = query_folders(&Location::local(root.path().join("nope")))
        .unwrap_err()
        .to_string();
    assert!(
        missing.contains("cannot read checkpoint directory"),
        "{missing}"
    );
}

fn shape(describe: &str, sum_type: DataType) -> OperatorShape {
    let schema = Arc::new(Schema::new(vec![
        Field::new("host", DataType::Utf8, true),
        Field::new("sum[0]", sum_type, true),
    ]));
    let mut state = OperatorState::new();
    state.add("panes", RecordBatch::new_empty(schema), vec![0]);
    state.add_scalars("meta", &[("watermark", None)]);
    OperatorShape::of("3", describe, &state)
}

fn stored(shapes: &[OperatorShape]) -> Checkpoint {
    let operators = shapes
        .iter()
        .map(|s| {
            let mut state = OperatorState::new();
            for (name, schema) in &s.schemas {
                let keys = if name == "panes" { vec![0] } else { Vec::new() };
                state.add(name, RecordBatch::new_empty(schema.clone()), keys);
            }
            OperatorEntry {
                id: s.id.clone(),
                describe: s.describe.clone(),
                state,
            }
        })
        .collect();
    Checkpoint {
        id: 1,
        time_ms: 0,
        query: "q".into(),
        fingerprint: fingerprint(shapes),
        savepoint: false,
        operators,
        sources: Vec::new(),
        sinks: Vec::new(),
    }
}

#[test]
fn compare_finds_nothing_for_the_same_shapes() {
    let now = [shape("WindowAggregate sum", DataType::Float64)];
    assert!(compare(&stored(&now), &now).is_empty());
}

#[test]
fn compare_names_a_changed_column_type_and_description() {
    let then = stored(&[shape("WindowAggregate sum(cpu)", DataType::Float64)]);
    let now = [shape("WindowAggregate sum(mem)", DataType::Int64)];
    let found = compare(&then, &now);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].operator, "3");
    assert_eq!(
        found[0].what,
        "description was `WindowAggregate sum(cpu)`, is now `WindowAggregate sum(mem)`; \
         state table 'panes' column 'sum[0]' was Float64, is now Int64"
    );
    assert!(
        found[0]
            .to_string()
            .starts_with("operator 3: description was")
    );
}

#[test]
fn compare_names_new_and_gone_operators_and_tables() {
    let mut moved = shape("Alert", DataType::Float64);
    moved.id = "5".into();
    let mut fewer = shape("WindowAggregate sum", DataType::Float64);
    fewer.schemas.truncate(1);
    let then = stored(&[fewer, moved]);
    let mut now = shape("WindowAggregate sum", DataType::Float64);
    let extra = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
    now.schemas[0].1 = extra;
    let mut new = shape("Dedup", DataType::Float64);
    new.id = "7".into();
    let found = compare(&then, &[now, new]);
    let text: Vec<String> = found.iter().map(Mismatch::to_string).collect();
    assert_eq!(
        text,
        [
            "operator 3: state table 'panes' column 'x' is not in the checkpoint; \
             state table 'panes' column 'host' is no longer in it; \
             state table 'panes' column 'sum[0]' is no longer in it; \
             state table 'meta' is not in the checkpoint",
            "operator 7: is not in the checkpoint",
            "operator 5: is no longer in the query",
        ]
    );
}

#[test]
fn fingerprints_are_stable_and_follow_the_schema() {
    let a = [shape("WindowAggregate sum", DataType::Float64)];
    let b = [shape("WindowAggregate sum", DataType::Int64)];
    assert_eq!(fingerprint(&a), fingerprint(&a.clone()));
    assert_ne!(fingerprint(&a), fingerprint(&b));
    assert_eq!(fingerprint(&a).len(), 16);
    // A change here invalidates every checkpoint written before it.
    // The hash is FNV-1a as published (its reference vectors).
    assert_eq!(super::shape::fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(super::shape::fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(super::shape::fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
}

#[test]
fn schema_fingerprints_are_pinned() {
    // Written into every manifest: a change here (of the canonical text or
    // of how arrow names a type) makes old checkpoints fail their check.
    let schema = Schema::new(vec![
        Field::new("host", DataType::Utf8, true),
        Field::new("sum[0]", DataType::Float64, false),
    ]);
    assert_eq!(schema_fingerprint(&schema), "08e14f895463a6da");
}

#[test]
fn ids_go_on_from_the_folder() {
    each_root(|root| {
        let store = store(root, 2);
        assert_eq!(store.next_id().unwrap(), 1);
        store.write(&checkpoint(4, false)).unwrap();
        incomplete(&store, 6);
        assert_eq!(store.next_id().unwrap(), 7);
        let error = store.write(&checkpoint(2, false)).unwrap_err().to_string();
        assert!(error.contains("older than checkpoint 4"), "{error}");
        assert_eq!(ids(&store), vec![4]);
    });
}

#[test]
fn query_fingerprints_are_pinned() {
    // The runtime compares this with a checkpoint's; a change here makes
    // every stored checkpoint look different.
    let shapes = [shape("WindowAggregate sum", DataType::Float64)];
    assert_eq!(fingerprint(&shapes), "1bdf86276ebbc186");
}

#[test]
fn timestamps_lists_and_metadata_round_trip() {
    use datafusion::arrow::array::{ListArray, TimestampMillisecondArray};
    use datafusion::arrow::datatypes::{Int64Type, TimeUnit};
    let list = ListArray::from_iter_primitive::<Int64Type, _, _>(vec![
        Some(vec![Some(1), None]),
        None,
        Some(vec![]),
    ]);
    let fields = vec![
        Field::new(
            "start",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            false,
        )
        .with_metadata([("unit".to_string(), "ms".to_string())].into()),
        Field::new("history", list.data_type().clone(), true),
    ];
    let schema = Schema::new_with_metadata(fields, [("kind".to_string(), "x".to_string())].into());
    let starts = TimestampMillisecondArray::from(vec![3, 1, 2]).with_timezone("UTC");
    let batch =
        RecordBatch::try_new(Arc::new(schema), vec![Arc::new(starts), Arc::new(list)]).unwrap();
    let mut written = checkpoint(1, false);
    written.operators[1].state.add("history", batch, vec![0]);
    each_root(|root| {
        let store = store(root, 1);
        store.write(&written).unwrap();
        assert_same(&written, &store.read(1).unwrap());
    });
}

#[test]
fn an_object_store_that_fails_is_an_error_not_a_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let root = Location::parse(&format!("file://{}", dir.path().display())).unwrap();
    let store = store(&root, 3);
    store.write(&checkpoint(1, false)).unwrap();
    store.write(&checkpoint(2, false)).unwrap();
    // Opening it fails with ENOTDIR: the store does not give the object.
    let file = store.path(2).child("op-000-00.arrow").local_path().unwrap();
    fs::remove_file(&file).unwrap();
    std::os::unix::fs::symlink("/etc/passwd/x", &file).unwrap();
    let error = store.latest().unwrap_err().to_string();
    assert!(error.contains("checkpoint store: cannot"), "{error}");
}
