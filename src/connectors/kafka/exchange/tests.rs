use super::*;
use datafusion::arrow::array::{Array, Float64Array, Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use rdkafka::message::{Header, OwnedHeaders, Timestamp};
use rdkafka::mocking::MockCluster;

#[test]
fn rows_go_through_messages_exactly_as_they_were() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("host", DataType::Utf8, false),
        Field::new("v", DataType::Float64, true),
    ]));
    let hosts: Vec<String> = (0..50_000).map(|i| format!("host-{i}")).collect();
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from(hosts)),
            Arc::new(Float64Array::from_iter(
                (0..50_000).map(|i| (i % 7 != 0).then_some(f64::from(i) / 3.0)),
            )),
        ],
    )
    .unwrap();
    let messages = encode(&batch).unwrap();
    assert!(messages.len() > 1, "50,000 rows need several messages");
    assert!(messages.iter().all(|m| m.len() < 1_000_000));
    let parts: Vec<RecordBatch> = messages.iter().map(|m| decode(m).unwrap()).collect();
    let back = datafusion::arrow::compute::concat_batches(&batch.schema(), &parts).unwrap();
    assert_eq!(back, batch);
}

#[test]
fn a_damaged_message_is_an_error() {
    assert!(decode(b"not arrow").is_err());
}

fn boundary() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("host", DataType::Utf8, false)]))
}

/// A reader of `writers` writers on `cluster`, whose group's topic `in`
/// has that many (empty) partitions.
fn reader(
    cluster: &MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    writers: i32,
    idle_timeout: Option<Duration>,
) -> ExchangeReader {
    cluster.create_topic("in", writers, 1).unwrap();
    ExchangeReader {
        endpoint: Endpoint {
            bootstrap: cluster.bootstrap_servers(),
            topic: "x".into(),
            properties: Vec::new(),
        },
        partitions: (0..writers).collect(),
        writers,
        boundary: boundary(),
        input_topic: "in".into(),
        idle_timeout,
    }
}

fn config(reader: &ExchangeReader) -> SourceConfig {
    Arc::new(reader.clone()).source_config("exchange(q)")
}

/// What a writer sends, as the reader gets it.
enum Sent<'a> {
    Rows(&'a str),
    Watermark(i64),
    Idle(i64),
}

fn message(writer: i32, offset: i64, sent: &Sent<'_>) -> OwnedMessage {
    message_in(writer, writer, offset, sent)
}

/// A message of `writer` in partition `partition`.
fn message_in(partition: i32, writer: i32, offset: i64, sent: &Sent<'_>) -> OwnedMessage {
    let (payload, name, value) = match sent {
        Sent::Rows(host) => {
            let rows =
                RecordBatch::try_new(boundary(), vec![Arc::new(StringArray::from(vec![*host]))])
                    .unwrap();
            (
                encode(&rows).unwrap().remove(0),
                KIND_HEADER,
                "0".to_string(),
            )
        }
        Sent::Watermark(ms) => (Vec::new(), WATERMARK_HEADER, ms.to_string()),
        Sent::Idle(at) => (Vec::new(), IDLE_HEADER, at.to_string()),
    };
    let writer_text = writer.to_string();
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: WRITER_HEADER,
            value: Some(writer_text.as_bytes()),
        })
        .insert(Header {
            key: name,
            value: Some(value.as_bytes()),
        });
    OwnedMessage::new(
        Some(payload),
        None,
        "x".into(),
        Timestamp::NotAvailable,
        partition,
        offset,
        Some(headers),
    )
}

/// What the reader hands on as each message comes: hosts, and
/// watermarks as `wm:<ms>`.
fn handed_on(reading: &mut ExchangeReading<'_>, sent: &[(i32, Sent<'_>)]) -> Vec<String> {
    let schema = reading.config.schema.clone();
    let mut out = Vec::new();
    for (offset, (writer, s)) in sent.iter().enumerate() {
        reading
            .take(&message(*writer, offset as i64, s), &schema)
            .unwrap();
        while let Some(batch) = reading.next_out() {
            let watermarks = batch
                .column(1)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            let hosts = batch
                .column(0)
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap();
            for row in 0..batch.num_rows() {
                out.push(match watermarks.is_valid(row) {
                    true => format!("wm:{}", watermarks.value(row)),
                    false => hosts.value(row).to_string(),
                });
            }
        }
    }
    out
}

#[test]
fn rows_of_a_writer_ahead_go_before_the_merged_watermark_passes_them() {
    let cluster = MockCluster::new(1).unwrap();
    let reader = reader(&cluster, 2, None);
    let (config, stats) = (config(&reader), SourceStats::default());
    let mut reading = ExchangeReading::open(&reader, &config, &stats, None).unwrap();
    // Writer 0 jumped ahead: its rows of every window up to 700 came
    // before its watermark 700. When writer 1 reaches 300, those of
    // the windows up to 300 must reach the part after first.
    let got = handed_on(
        &mut reading,
        &[
            (0, Sent::Rows("a")),
            (0, Sent::Watermark(700)),
            (1, Sent::Rows("b")),
            (1, Sent::Watermark(300)),
            (1, Sent::Rows("c")),
            (1, Sent::Watermark(800)),
        ],
    );
    assert_eq!(got, ["a", "b", "wm:300", "c", "wm:700"]);
}

#[test]
fn an_idle_writer_that_had_rows_holds_event_time_back_one_without_does_not() {
    let cluster = MockCluster::new(1).unwrap();
    let reader = reader(&cluster, 3, None);
    let (config, stats) = (config(&reader), SourceStats::default());
    let mut reading = ExchangeReading::open(&reader, &config, &stats, None).unwrap();
    let got = handed_on(
        &mut reading,
        &[
            // Writer 2 never had a row: its idleness lets the others on.
            (2, Sent::Idle(0)),
            (0, Sent::Rows("a")),
            (0, Sent::Watermark(100)),
            (1, Sent::Watermark(500)),
            // Writer 0 went idle with windows maybe still open past 100:
            // event time stays there until it sends again.
            (0, Sent::Idle(1)),
            (1, Sent::Watermark(900)),
            (0, Sent::Watermark(600)),
        ],
    );
    assert_eq!(got, ["a", "wm:100", "wm:600"]);
}

#[test]
fn an_idle_writer_stops_holding_event_time_back_after_the_idle_timeout() {
    let cluster = MockCluster::new(1).unwrap();
    let reader = reader(&cluster, 2, Some(Duration::from_secs(10)));
    let (config, stats) = (config(&reader), SourceStats::default());
    let mut reading = ExchangeReading::open(&reader, &config, &stats, None).unwrap();
    let got = handed_on(
        &mut reading,
        &[
            (0, Sent::Watermark(100)),
            (0, Sent::Idle(0)),
            (1, Sent::Watermark(500)),
        ],
    );
    assert_eq!(got, ["wm:100"]);
    // As if the timeout had passed meanwhile (a sleep would make the
    // test depend on how loaded the machine is).
    for since in reading.idle_since.values_mut() {
        *since = since.checked_sub(Duration::from_secs(11)).unwrap();
    }
    let schema = config.schema.clone();
    reading.tick(&schema).unwrap();
    let out: Vec<RecordBatch> = std::iter::from_fn(|| reading.next_out()).collect();
    assert_eq!(out.len(), 1, "the watermark moves on by itself");
    let watermarks = out[0]
        .column(1)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap();
    assert_eq!(watermarks.value(0), 500);
}

/// Hosts and watermarks (`wm:<ms>`) of what `reading` hands on next.
fn all_out(reading: &mut ExchangeReading<'_>) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(batch) = reading.next_out() {
        let watermarks = batch.column(1).as_any().downcast_ref::<Int64Array>();
        let hosts = batch.column(0).as_any().downcast_ref::<StringArray>();
        for row in 0..batch.num_rows() {
            out.push(match watermarks.unwrap().is_valid(row) {
                true => format!("wm:{}", watermarks.unwrap().value(row)),
                false => hosts.unwrap().value(row).to_string(),
            });
        }
    }
    out
}

#[test]
fn a_checkpoint_between_rows_handed_on_loses_and_repeats_none_of_them() {
    // Two writers' rows re-partitioned into partition 0: b is behind,
    // so its rows go first though a's came first.
    let cluster = MockCluster::new(1).unwrap();
    let mut reader = reader(&cluster, 2, None);
    reader.partitions = vec![0];
    let (config, stats) = (config(&reader), SourceStats::default());
    let schema = config.schema.clone();
    let sent = [
        (0, Sent::Watermark(10)),
        (1, Sent::Watermark(5)),
        (0, Sent::Rows("a")),
        (1, Sent::Rows("b")),
        (1, Sent::Watermark(20)),
        (0, Sent::Watermark(30)),
    ];
    let take = |reading: &mut ExchangeReading<'_>, offsets: std::ops::Range<usize>| {
        for offset in offsets {
            let (writer, s) = &sent[offset];
            let m = message_in(0, *writer, offset as i64, s);
            reading.take(&m, &schema).unwrap();
        }
    };
    let mut reading = ExchangeReading::open(&reader, &config, &stats, None).unwrap();
    take(&mut reading, 0..2);
    assert_eq!(all_out(&mut reading), ["wm:5"]);
    take(&mut reading, 2..5);
    // b goes on, then a checkpoint barrier: a and the watermark have not.
    let first = reading.next_out().unwrap();
    let host = first.column(0).as_any().downcast_ref::<StringArray>();
    assert_eq!(host.unwrap().value(0), "b");
    let position = stored_position(&mut reading, &stats);
    assert_eq!(position.extra["offsets"]["0"], 2, "{}", position.extra);
    drop(reading);
    let mut again = ExchangeReading::open(&reader, &config, &stats, Some(&position)).unwrap();
    take(&mut again, 2..6);
    // a was released with watermark 10: both go on once a is in again.
    assert_eq!(
        all_out(&mut again),
        ["a", "wm:10", "wm:20"],
        "b went on already"
    );
}

/// The position `reading` stores now, as a checkpoint would take it.
fn stored_position(reading: &mut ExchangeReading<'_>, stats: &SourceStats) -> SourcePosition {
    reading.store_position();
    stats.position.lock().unwrap().clone().unwrap()
}

/// Takes each `(writer, offset, sent)` in, as a message of the
/// writer's own partition.
fn take_own(reading: &mut ExchangeReading<'_>, sent: &[(i32, i64, Sent<'_>)]) {
    let schema = reading.config.schema.clone();
    for (writer, offset, s) in sent {
        let m = message_in(*writer, *writer, *offset, s);
        reading.take(&m, &schema).unwrap();
    }
}

#[test]
fn rows_released_but_not_gone_on_at_a_checkpoint_go_on_when_read_again() {
    let cluster = MockCluster::new(1).unwrap();
    let reader = reader(&cluster, 2, None);
    let (config, stats) = (config(&reader), SourceStats::default());
    let schema = config.schema.clone();
    let mut reading = ExchangeReading::open(&reader, &config, &stats, None).unwrap();
    take_own(
        &mut reading,
        &[(0, 0, Sent::Watermark(10)), (1, 0, Sent::Watermark(10))],
    );
    assert_eq!(all_out(&mut reading), ["wm:10"]);
    take_own(
        &mut reading,
        &[
            (0, 1, Sent::Rows("a")),
            (0, 2, Sent::Watermark(20)),
            (1, 1, Sent::Watermark(30)),
        ],
    );
    // Released with watermark 20, then stopped before either went on.
    let position = stored_position(&mut reading, &stats);
    drop(reading);
    let mut again = ExchangeReading::open(&reader, &config, &stats, Some(&position)).unwrap();
    again.advance(&schema).unwrap();
    assert!(all_out(&mut again).is_empty(), "a is not in again yet");
    take_own(&mut again, &[(0, 1, Sent::Rows("a"))]);
    assert_eq!(all_out(&mut again), ["a"], "a goes on at once");
    // The watermark that released it is read again after it.
    take_own(&mut again, &[(0, 2, Sent::Watermark(20))]);
    assert_eq!(all_out(&mut again), ["wm:20"]);
}

#[test]
fn rows_read_again_after_a_restore_are_not_passed_by_their_writers_later_watermark() {
    let cluster = MockCluster::new(1).unwrap();
    let reader = reader(&cluster, 2, None);
    let (config, stats) = (config(&reader), SourceStats::default());
    let schema = config.schema.clone();
    let mut reading = ExchangeReading::open(&reader, &config, &stats, None).unwrap();
    // Writer 0's rows wait for writer 1, whose first watermark has not
    // come, and then writer 0's next watermark comes.
    take_own(
        &mut reading,
        &[(0, 0, Sent::Rows("a")), (0, 1, Sent::Watermark(100))],
    );
    assert!(all_out(&mut reading).is_empty());
    let position = stored_position(&mut reading, &stats);
    assert_eq!(position.extra["offsets"]["0"], 0, "{}", position.extra);
    drop(reading);
    // Restored elsewhere, writer 1's partition is read first: writer 0
    // stands where it stood before its rows, not at 100, or event time
    // would pass them before they are in again.
    let mut again = ExchangeReading::open(&reader, &config, &stats, Some(&position)).unwrap();
    again.advance(&schema).unwrap();
    take_own(&mut again, &[(1, 0, Sent::Watermark(200))]);
    assert!(all_out(&mut again).is_empty(), "writer 0 holds it back");
    take_own(
        &mut again,
        &[(0, 0, Sent::Rows("a")), (0, 1, Sent::Watermark(100))],
    );
    assert_eq!(all_out(&mut again), ["a", "wm:100"]);
}
