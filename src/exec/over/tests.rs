use super::*;
use datafusion::arrow::array::{Float64Array, StringArray};
use datafusion::arrow::util::display::array_value_to_string;
use datafusion::execution::SessionStateBuilder;
use datafusion::functions_aggregate::{
    average::avg_udaf, median::median_udaf, min_max::min_udaf, stddev::stddev_udaf, sum::sum_udaf,
};
use datafusion::logical_expr::AggregateUDF;
use datafusion::physical_expr::aggregate::AggregateExprBuilder;
use datafusion::physical_expr::expressions::col;

fn input_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("host", DataType::Utf8, true),
        Field::new("v", DataType::Float64, true),
    ]))
}

/// An aggregate as vigil registers it (its own `median` and `mad`).
fn registered(name: &str) -> Arc<AggregateUDF> {
    let mut state = SessionStateBuilder::new().with_default_features().build();
    crate::functions::register(&mut state).unwrap();
    state.aggregate_functions()[name].clone()
}

fn aggregate(udaf: Arc<AggregateUDF>, preceding: Option<usize>) -> OverSpec {
    let schema = input_schema();
    let function = AggregateExprBuilder::new(udaf, vec![col("v", &schema).unwrap()])
        .schema(schema.clone())
        .alias("f")
        .build()
        .unwrap();
    OverSpec {
        partition_by: vec![col("host", &schema).unwrap()],
        function: OverFunction::Aggregate {
            function: Arc::new(function),
            preceding,
        },
        data_type: DataType::Float64,
    }
}

/// Sliding averages and deviations that add and retract rows of very
/// different sizes, a sliding median (whose state is every row of the
/// frame), a minimum that cannot retract, a deviation and a sum from
/// the first row, a lag of two rows; with and without a partition key.
fn op() -> OverOp {
    let schema = input_schema();
    let lag = OverSpec {
        partition_by: Vec::new(),
        function: OverFunction::Lag {
            arg: col("v", &schema).unwrap(),
            offset: 2,
            default: ScalarValue::Float64(None),
        },
        data_type: DataType::Float64,
    };
    let specs = vec![
        aggregate(avg_udaf(), Some(2)),
        aggregate(stddev_udaf(), Some(2)),
        aggregate(median_udaf(), Some(1)),
        aggregate(min_udaf(), Some(1)),
        aggregate(stddev_udaf(), None),
        aggregate(sum_udaf(), None),
        lag,
        aggregate(registered("median"), Some(2)),
        aggregate(registered("mad"), Some(3)),
        aggregate(registered("median"), None),
        aggregate(registered("mad"), None),
    ];
    let mut fields = schema.fields().to_vec();
    for i in 0..specs.len() {
        fields.push(Arc::new(Field::new(
            format!("o{i}"),
            DataType::Float64,
            true,
        )));
    }
    OverOp::new(specs, Arc::new(Schema::new(fields))).unwrap()
}

fn rows() -> Vec<RecordBatch> {
    let values = [
        1e16, 0.1, -1e16, 0.2, 0.3, 5.0, 1e-7, 3.0, 1e15, 0.7, -2.0, 4.0,
    ];
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let host = if i % 3 == 0 { "a" } else { "b" };
            RecordBatch::try_new(
                input_schema(),
                vec![
                    Arc::new(StringArray::from(vec![host])),
                    Arc::new(Float64Array::from(vec![*v])),
                ],
            )
            .unwrap()
        })
        .collect()
}

fn feed(op: &mut OverOp, batches: &[RecordBatch]) -> Vec<String> {
    let mut lines = Vec::new();
    for batch in batches {
        let mut out = Vec::new();
        op.on_batch(batch.clone(), &mut out).unwrap();
        for message in out {
            let Message::Batch(b) = message else { continue };
            let values: Vec<String> = b
                .columns()
                .iter()
                .map(|c| array_value_to_string(c, 0).unwrap())
                .collect();
            lines.push(values.join(","));
        }
    }
    lines
}

#[test]
fn restores_at_every_row_exactly() {
    let rows = rows();
    let straight = feed(&mut op(), &rows);
    for cut in 0..=rows.len() {
        let mut first = op();
        let before = feed(&mut first, &rows[..cut]);
        let state = first.snapshot().unwrap().expect("a state");
        let carried_on = feed(&mut first, &rows[cut..]);
        assert_eq!([before.clone(), carried_on].concat(), straight, "cut {cut}");
        let mut restored = op();
        restored.restore(state).unwrap();
        let after = feed(&mut restored, &rows[cut..]);
        assert_eq!([before, after].concat(), straight, "cut {cut}");
    }
}

#[test]
fn a_fresh_snapshot_has_every_table_empty() {
    let state = op().snapshot().unwrap().expect("a state");
    assert_eq!(state.tables.len(), 22);
    assert_eq!(state.rows(), 0);
    let mut other = op();
    other.restore(state).unwrap();
    assert!(other.partitions.iter().all(|p| p.is_empty()));
}

/// Values with duplicates, both zeros and magnitudes far apart, the
/// same every run.
fn values(count: usize) -> Vec<f64> {
    let mut x: u64 = 7;
    (0..count)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = x >> 33;
            match r % 7 {
                0 => -0.0,
                1 => 0.0,
                2 => (r % 5) as f64,
                3 => (r % 1000) as f64 * 1e12,
                _ => (r % 100_000) as f64 / 7.0 - 5000.0,
            }
        })
        .collect()
}

/// Today's value of `name` over `frame`: a fresh accumulator of the
/// registered aggregate, fed the frame.
fn recomputed(name: &str, frame: &[f64]) -> ScalarValue {
    let OverFunction::Aggregate { function, .. } = aggregate(registered(name), None).function
    else {
        unreachable!()
    };
    let mut accumulator = function.create_accumulator().unwrap();
    let values: ArrayRef = Arc::new(Float64Array::from(frame.to_vec()));
    accumulator.update_batch(&[values]).unwrap();
    accumulator.evaluate().unwrap()
}

/// The sorted frame's median and mad are those of `median` and `mad`
/// recomputed over the frame, to the bit, as the frame slides.
#[test]
fn ordered_statistics_match_a_recomputation_to_the_bit() {
    let values = values(400);
    for size in [1, 2, 3, 4, 7, 16, 51] {
        let mut ordered = Ordered::default();
        for (i, &value) in values.iter().enumerate() {
            ordered.insert(value);
            if i >= size {
                ordered.remove(values[i - size]);
            }
            let frame = &values[(i + 1).saturating_sub(size)..=i];
            for (name, got) in [("median", ordered.median()), ("mad", ordered.mad())] {
                let ScalarValue::Float64(expected) = recomputed(name, frame) else {
                    panic!("{name} is DOUBLE");
                };
                assert_eq!(
                    got.map(f64::to_bits),
                    expected.map(f64::to_bits),
                    "{name} of {frame:?}"
                );
            }
        }
    }
    assert_eq!(Ordered::default().mad(), None);
}

/// A sliding frame over a column that is not DOUBLE (timestamps, for
/// `min(window_end)` or `cadence(window_end)`) restores from its
/// history without reading it as one.
#[test]
fn a_sliding_frame_over_timestamps_restores() {
    use datafusion::arrow::array::TimestampMillisecondArray;
    use datafusion::arrow::datatypes::TimeUnit;
    let time = DataType::Timestamp(TimeUnit::Millisecond, None);
    let schema = Arc::new(Schema::new(vec![
        Field::new("host", DataType::Utf8, true),
        Field::new("t", time.clone(), true),
    ]));
    let function = AggregateExprBuilder::new(min_udaf(), vec![col("t", &schema).unwrap()])
        .schema(schema.clone())
        .alias("f")
        .build()
        .unwrap();
    let spec = OverSpec {
        partition_by: vec![col("host", &schema).unwrap()],
        function: OverFunction::Aggregate {
            function: Arc::new(function),
            preceding: Some(1),
        },
        data_type: time.clone(),
    };
    let mut fields = schema.fields().to_vec();
    fields.push(Arc::new(Field::new("o", time, true)));
    let out_schema = Arc::new(Schema::new(fields));
    let op = || OverOp::new(vec![spec.clone()], out_schema.clone()).unwrap();
    let batches: Vec<RecordBatch> = [10, 20, 30]
        .iter()
        .map(|t| {
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(StringArray::from(vec!["a"])),
                    Arc::new(TimestampMillisecondArray::from(vec![*t])),
                ],
            )
            .unwrap()
        })
        .collect();
    let mut first = op();
    feed(&mut first, &batches[..2]);
    let state = first.snapshot().unwrap().expect("a state");
    let mut restored = op();
    restored.restore(state).unwrap();
    let lines = feed(&mut restored, &batches[2..]);
    assert_eq!(lines, ["a,1970-01-01T00:00:00.030,1970-01-01T00:00:00.020"]);
}

/// Histories point into kept batches; with a new key in every batch
/// the kept rows are compacted, and `lag` still reads the right rows.
#[test]
fn history_batches_are_compacted_under_key_churn() {
    let schema = input_schema();
    let lag = OverSpec {
        partition_by: vec![col("host", &schema).unwrap()],
        function: OverFunction::Lag {
            arg: col("v", &schema).unwrap(),
            offset: 1,
            default: ScalarValue::Float64(Some(-1.0)),
        },
        data_type: DataType::Float64,
    };
    let mut fields = schema.fields().to_vec();
    fields.push(Arc::new(Field::new("o", DataType::Float64, true)));
    let mut op = OverOp::new(vec![lag], Arc::new(Schema::new(fields))).unwrap();
    for i in 0..400 {
        // Host "h{i}" twice (once new, once looking back), and 100 rows
        // of a host that never comes back.
        let mut hosts = vec![format!("h{i}"), format!("h{i}")];
        hosts.extend((0..100).map(|j| format!("gone{i}_{j}")));
        let v: Vec<f64> = (0..hosts.len()).map(|j| (i * 1000 + j) as f64).collect();
        let batch = RecordBatch::try_new(
            input_schema(),
            vec![
                Arc::new(StringArray::from(hosts)),
                Arc::new(Float64Array::from(v)),
            ],
        )
        .unwrap();
        let mut out = Vec::new();
        op.on_batch(batch, &mut out).unwrap();
        let Message::Batch(b) = &out[0] else { panic!() };
        let lagged = b.column(2).as_primitive::<Float64Type>();
        assert_eq!(lagged.value(0), -1.0);
        assert_eq!(lagged.value(1), (i * 1000) as f64);
        assert!(op.histories[0].rows <= (2 * op.partitions[0].len()).max(4096) + 102);
    }
    let state = op.snapshot().unwrap().unwrap();
    assert_eq!(state.table("over0_history").unwrap().num_rows(), 400 * 101);
}
