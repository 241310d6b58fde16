//! What decoding a push request costs: a remote-write request as
//! Prometheus sends them (2,000 samples, its default `max_samples_per_send`
//! in 2.42, of node_exporter-like series with five labels each) decoded
//! from snappy and protobuf into rows, and 2,000 lines of line protocol as
//! Telegraf writes them parsed into rows of a declared stream. Each is
//! timed [`RUNS`] times after a warm-up; prints every median and the rate.
//!
//! Run with `cargo bench --bench ingest`.

use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use vigil::connectors::influx::{Precision, lines_batch};
use vigil::connectors::remote_write::{
    Label, Sample, TimeSeries, WriteRequest, decode_request, encode_request, samples_batch,
};

/// Samples (and lines) per request.
const SAMPLES: usize = 2_000;
/// Timed runs of each.
const RUNS: usize = 51;

fn request() -> WriteRequest {
    let label = |name: &str, value: String| Label {
        name: name.into(),
        value,
    };
    let timeseries = (0..SAMPLES / 4)
        .map(|i| TimeSeries {
            labels: vec![
                label("__name__", "node_cpu_seconds_total".into()),
                label("cpu", (i % 64).to_string()),
                label("instance", format!("host-{}:9100", i / 64)),
                label("job", "node".into()),
                label("mode", ["idle", "user", "system", "iowait"][i % 4].into()),
            ],
            samples: (0..4)
                .map(|j| Sample {
                    value: 1000.0 + (i * 4 + j) as f64 * 0.25,
                    timestamp: 1_700_000_000_000 + j as i64 * 15_000,
                })
                .collect(),
        })
        .collect();
    WriteRequest { timeseries }
}

fn lines() -> String {
    (0..SAMPLES)
        .map(|i| {
            format!(
                "cpu,cpu=cpu{},host=host-{} usage_idle={}.5,usage_user=1.2,usage_system=0.7 {}\n",
                i % 64,
                i / 64,
                90 + i % 10,
                1_700_000_000_000_000_000i64 + i as i64 * 1_000_000_000
            )
        })
        .collect()
}

/// The median seconds of `RUNS` runs of `f`, after one.
fn median(mut f: impl FnMut()) -> f64 {
    f();
    let mut times: Vec<f64> = (0..RUNS)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[RUNS / 2]
}

fn main() {
    let body = encode_request(&request()).expect("encode");
    let secs = median(|| {
        let request = decode_request(&body, 64 << 20).expect("decode");
        let rows = samples_batch(&request).expect("rows");
        assert_eq!(rows.batch.num_rows(), SAMPLES);
    });
    println!(
        "remote write: {SAMPLES} samples, {} bytes snappy: median {:.3} ms, {:.0} samples/s",
        body.len(),
        secs * 1e3,
        SAMPLES as f64 / secs
    );

    let text = lines();
    let schema = Arc::new(Schema::new(vec![
        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        Field::new("measurement", DataType::Utf8, true),
        Field::new("host", DataType::Utf8, true),
        Field::new("cpu", DataType::Utf8, true),
        Field::new("usage_idle", DataType::Float64, true),
        Field::new("usage_user", DataType::Float64, true),
    ]));
    let secs = median(|| {
        let rows = lines_batch("s", &schema, &text, Precision::Nanos, 0).expect("rows");
        assert_eq!(rows.batch.num_rows(), SAMPLES);
    });
    println!(
        "line protocol: {SAMPLES} lines, {} bytes: median {:.3} ms, {:.0} lines/s",
        text.len(),
        secs * 1e3,
        SAMPLES as f64 / secs
    );
}
