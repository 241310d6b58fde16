//! What the benchmarks share: the data generator and a counting sink.

use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use datafusion::arrow::record_batch::RecordBatch;
use vigil::connectors::Sink;

/// Event time of the first row, epoch ms (2023-11-14).
pub const BASE_MS: i64 = 1_700_000_000_000;

/// SplitMix64: a small deterministic generator, so every run reads the same
/// data.
pub struct Rng(pub u64);

impl Rng {
    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Whether `host` is silent during second `sec` of the data: 7 s out of
/// every 30 s, staggered across hosts. Longer than the 5 s session gap.
fn quiet(host: u64, sec: u64) -> bool {
    (sec + host * 3) % 30 < 7
}

/// Writes the input CSV `ts,host,cpu`: row `i` at `BASE_MS + i` ms, +-20 ms
/// of jitter (well inside a 2 s watermark delay), on a random one of
/// `hosts` hosts that is not quiet at that time.
pub fn write_csv(path: &Path, rows: u64, hosts: u64) {
    let file = File::create(path).expect("creating the benchmark CSV");
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut rng = Rng(42);
    writeln!(out, "ts,host,cpu").expect("writing the benchmark CSV");
    for i in 0..rows {
        let jitter = (rng.next_u64() % 41) as i64 - 20;
        let ts = BASE_MS + i as i64 + jitter;
        let sec = i / 1000;
        let mut host = rng.next_u64() % hosts;
        while quiet(host, sec) {
            host = (host + 1) % hosts;
        }
        let cpu = (rng.next_u64() % 10_000) as f64 / 100.0;
        writeln!(out, "{ts},host-{host:03},{cpu:.2}").expect("writing the benchmark CSV");
    }
    out.flush().expect("writing the benchmark CSV");
}

/// Counts result rows.
pub struct CountSink(pub Arc<AtomicU64>);

impl Sink for CountSink {
    fn write(&mut self, batch: &RecordBatch) -> vigil::error::Result<()> {
        self.0.fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn finish(&mut self) -> vigil::error::Result<()> {
        Ok(())
    }
}
