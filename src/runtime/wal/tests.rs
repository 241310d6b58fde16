use std::sync::Arc;

use datafusion::arrow::array::{Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};

use super::*;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("n", DataType::Int64, false),
        Field::new("host", DataType::Utf8, true),
    ]))
}

fn batch(n: i64) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(vec![n, n + 1])),
            Arc::new(StringArray::from(vec![Some(format!("h{n}")), None])),
        ],
    )
    .unwrap()
}

fn first_value(batch: &RecordBatch) -> i64 {
    batch
        .column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap()
        .value(0)
}

fn open(dir: &Path, options: WalOptions) -> Wal {
    Wal::open(dir, "cpu/metrics", schema(), options).unwrap()
}

fn block<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(future)
}

fn append_all(wal: &Wal, values: impl IntoIterator<Item = i64>) -> Vec<u64> {
    block(async {
        let mut seqs = Vec::new();
        for n in values {
            seqs.push(wal.append(&batch(n)).await.unwrap());
        }
        seqs
    })
}

/// The records after `after` as (seq, first value).
fn replayed(wal: &Wal, after: u64) -> Vec<(u64, i64)> {
    wal.replay(after)
        .unwrap()
        .iter()
        .map(|(seq, b)| (*seq, first_value(b)))
        .collect()
}

/// The only segment of the log, or the last.
fn last_segment(dir: &Path) -> PathBuf {
    let folder = dir.join("cpu%2Fmetrics");
    let mut segments: Vec<PathBuf> = fs::read_dir(folder)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    segments.sort();
    segments.pop().unwrap()
}

#[test]
fn appends_replay_across_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), WalOptions::default());
    assert_eq!(wal.last_seq(), 0);
    assert_eq!(append_all(&wal, [10, 20, 30]), [1, 2, 3]);
    assert_eq!(replayed(&wal, 1), [(2, 20), (3, 30)]);
    let bytes = wal.bytes();
    drop(wal);

    let wal = open(dir.path(), WalOptions::default());
    assert_eq!((wal.last_seq(), wal.bytes()), (3, bytes));
    assert_eq!(replayed(&wal, 0), [(1, 10), (2, 20), (3, 30)]);
    assert_eq!(append_all(&wal, [40]), [4]);
    assert_eq!(wal.replay(0).unwrap()[3].1, batch(40));
    assert!(replayed(&wal, 4).is_empty());
}

#[test]
fn a_torn_tail_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), WalOptions::default());
    append_all(&wal, [1, 2, 3]);
    drop(wal);
    let path = last_segment(dir.path());
    let length = fs::metadata(&path).unwrap().len();
    for cut in [3, 50] {
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(length - cut).unwrap();
        drop(file);
        let wal = open(dir.path(), WalOptions::default());
        assert_eq!(replayed(&wal, 0), [(1, 1), (2, 2)]);
        assert_eq!(append_all(&wal, [3]), [3], "the cut record's number again");
        drop(wal);
    }
    // Zeros where the next header should be: allocated, never written.
    let mut file = OpenOptions::new().append(true).open(&path).unwrap();
    file.write_all(&[0; 100]).unwrap();
    drop(file);
    let wal = open(dir.path(), WalOptions::default());
    assert_eq!(replayed(&wal, 0), [(1, 1), (2, 2), (3, 3)]);
}

fn flip(path: &Path, offset: u64) {
    let mut data = fs::read(path).unwrap();
    data[offset as usize] ^= 0x40;
    fs::write(path, data).unwrap();
}

#[test]
fn a_bad_last_record_is_cut_off_and_a_bad_earlier_one_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), WalOptions::default());
    append_all(&wal, [1, 2, 3]);
    let record = wal.bytes() / 3;
    drop(wal);
    let path = last_segment(dir.path());
    flip(&path, 3 * record - 5);
    let wal = open(dir.path(), WalOptions::default());
    assert_eq!(replayed(&wal, 0), [(1, 1), (2, 2)]);
    drop(wal);

    // The payload of the first of two records.
    flip(&path, HEADER as u64 + 10);
    let err = Wal::open(dir.path(), "cpu/metrics", schema(), WalOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert_eq!(
        err,
        format!(
            "write-ahead log {} is damaged at offset 0: bad record checksum",
            path.display()
        )
    );
    // A header, the second record's.
    flip(&path, HEADER as u64 + 10);
    flip(&path, record + 5);
    let err = Wal::open(dir.path(), "cpu/metrics", schema(), WalOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.ends_with(&format!("at offset {record}: bad record header checksum")),
        "{err}"
    );
}

#[test]
fn concurrent_appends_share_fsyncs_and_get_unique_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Arc::new(open(dir.path(), WalOptions::default()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .unwrap();
    let seqs = runtime.block_on(async {
        let tasks: Vec<_> = (0..8)
            .map(|task| {
                let wal = wal.clone();
                tokio::spawn(async move {
                    let mut seqs = Vec::new();
                    for i in 0..200 {
                        let value = task * 1000 + i;
                        seqs.push((wal.append(&batch(value)).await.unwrap(), value));
                    }
                    seqs
                })
            })
            .collect();
        let mut all = Vec::new();
        for task in tasks {
            let seqs = task.await.unwrap();
            // Each task's own appends come back in increasing order.
            assert!(seqs.windows(2).all(|w| w[0].0 < w[1].0));
            all.extend(seqs);
        }
        all
    });
    let mut seqs = seqs;
    seqs.sort();
    assert_eq!(
        seqs.iter().map(|s| s.0).collect::<Vec<_>>(),
        (1..=1600).collect::<Vec<_>>()
    );
    assert_eq!(wal.last_seq(), 1600);
    let replay = replayed(&wal, 0);
    assert_eq!(
        replay,
        seqs.iter().map(|&(s, v)| (s, v)).collect::<Vec<_>>()
    );
}

#[test]
fn truncation_deletes_whole_old_segments() {
    let dir = tempfile::tempdir().unwrap();
    let options = WalOptions {
        max_bytes: 1 << 30,
        segment_bytes: 1000,
    };
    let wal = open(dir.path(), options);
    append_all(&wal, 1..=20);
    let folder = dir.path().join("cpu%2Fmetrics");
    let segments = super::super::frames::segment_count;
    let before = segments(&folder);
    assert!(before > 3, "{before} segments");
    let bytes = wal.bytes();
    wal.truncate_through(10).unwrap();
    assert!(segments(&folder) < before);
    assert!(wal.bytes() < bytes);
    // Only whole segments go: everything after 10 is still there, and
    // maybe some records before it.
    let replay = replayed(&wal, 0);
    assert!(
        replay[0].0 <= 11 && replay.last().unwrap().0 == 20,
        "{replay:?}"
    );
    assert_eq!(
        replayed(&wal, 10),
        (11..=20).map(|n| (n, n as i64)).collect::<Vec<_>>()
    );
    // Through the end: the last segment stays, for the appends to come.
    wal.truncate_through(20).unwrap();
    assert_eq!(segments(&folder), 1);
    assert_eq!(append_all(&wal, [21]), [21]);
    drop(wal);
    let wal = open(dir.path(), options);
    assert_eq!(wal.last_seq(), 21);
    assert_eq!(replayed(&wal, 20), [(21, 21)]);
}

#[test]
fn a_full_log_refuses_appends_until_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let probe = open(&dir.path().join("probe"), WalOptions::default());
    append_all(&probe, [1]);
    let record = probe.bytes();
    let options = WalOptions {
        max_bytes: 3 * record + record / 2,
        segment_bytes: record,
    };
    let wal = open(dir.path(), options);
    append_all(&wal, [1, 2, 3]);
    let err = block(wal.append(&batch(4))).unwrap_err();
    let Error::Overloaded {
        message,
        retry_after,
    } = err
    else {
        panic!("not overloaded: {err}")
    };
    assert!(message.contains("is full"), "{message}");
    assert_eq!(retry_after, RETRY_AFTER);
    assert_eq!((wal.last_seq(), wal.bytes()), (3, 3 * record));
    wal.truncate_through(2).unwrap();
    assert_eq!(append_all(&wal, [4]), [4]);
    assert_eq!(replayed(&wal, 2), [(3, 3), (4, 4)]);
}

#[test]
fn a_stream_with_other_columns_starts_a_new_log() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), WalOptions::default());
    append_all(&wal, [1, 2]);
    drop(wal);
    let other = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
    let wal = Wal::open(dir.path(), "cpu/metrics", other, WalOptions::default()).unwrap();
    assert_eq!(wal.last_seq(), 2, "numbers go on");
    assert!(wal.replay(0).unwrap().is_empty());
    assert!(
        dir.path()
            .join("cpu%2Fmetrics.replaced-1/schema.arrow")
            .exists()
    );
    let err = block(wal.append(&batch(3))).unwrap_err().to_string();
    assert!(err.contains("not the stream's"), "{err}");
}

#[test]
fn stream_names_are_made_safe() {
    assert_eq!(safe_name("cpu_1-x"), "cpu_1-x");
    assert_eq!(safe_name("../a b"), "%2E%2E%2Fa%20b");
    assert_eq!(safe_name(""), "%00");
}
