//! Event-to-result latency through the `vigil` binary: rows go into a FIFO
//! at a fixed offered rate, the filter's results come back on its stdout;
//! and start-up to first result.

use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::child;

/// What a latency run measured.
pub struct Latency {
    /// Rows written.
    pub rows: u64,
    /// Rows per second actually written (below the offered rate when the
    /// pipe was full: vigil did not keep up).
    pub achieved_rate: f64,
    /// Results received.
    pub results: usize,
    /// Sorted latencies, microseconds.
    pub latencies_us: Vec<f64>,
    /// The child's CPU time and peak RSS.
    pub cpu: Duration,
    /// Peak RSS, bytes.
    pub peak_rss: u64,
}

/// A deterministic cpu value in [0, 100) for row `id`: about 10% above 90.
fn cpu_of(id: u64) -> f64 {
    let mut rng = crate::data::Rng::new(id);
    rng.below(10_000) as f64 / 100.0
}

fn fifo_script(fifo: &Path) -> String {
    format!(
        "CREATE STREAM m (id BIGINT, ts TIMESTAMP, host TEXT, cpu DOUBLE,
           WATERMARK FOR ts AS ts)
           WITH (connector = 'file', path = '{}', format = 'csv');
         SELECT id, cpu FROM m WHERE cpu > 90;",
        fifo.display()
    )
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Nanoseconds since `epoch`.
fn since(epoch: Instant) -> u64 {
    epoch.elapsed().as_nanos() as u64
}

/// Offers `rate` rows/s for `duration` to `SELECT id, cpu FROM m WHERE cpu >
/// 90` in per-record mode, through a FIFO; the latency of a result is its
/// line's arrival on vigil's stdout minus the time its row was written.
/// Rows due at the same moment go in one `write` (the writer wakes every
/// 100 µs).
pub fn per_record(
    vigil: &Path,
    dir: &Path,
    extra_args: &[String],
    rate: u64,
    duration: Duration,
    timeout: Duration,
) -> Result<Latency, String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let fifo = dir.join("latency.fifo");
    let _ = std::fs::remove_file(&fifo);
    let status = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .map_err(|e| format!("mkfifo: {e}"))?;
    if !status.success() {
        return Err(format!("mkfifo {} failed", fifo.display()));
    }
    let script = dir.join("latency.sql");
    std::fs::write(&script, fifo_script(&fifo)).map_err(|e| e.to_string())?;

    let rows = (rate as f64 * duration.as_secs_f64()) as u64;
    let written: Arc<Vec<AtomicU64>> = Arc::new((0..rows).map(|_| AtomicU64::new(0)).collect());
    let epoch = Instant::now();
    let mut command = Command::new(vigil);
    command
        .arg("run")
        .arg(&script)
        .args(["--format", "csv", "--execution-mode", "per-record"])
        .args(extra_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let start = Instant::now();
    let mut process = command
        .spawn()
        .map_err(|e| format!("starting vigil: {e}"))?;
    let stdout = process.stdout.take().ok_or("no stdout")?;
    let reader = std::thread::spawn(move || {
        let mut arrivals = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let now = since(epoch);
            if let Some(Ok(id)) = line.split(',').next().map(str::parse::<u64>) {
                arrivals.push((id, now));
            }
        }
        arrivals
    });
    let writer = {
        let written = written.clone();
        std::thread::spawn(move || write_rows(&fifo, rows, rate, epoch, &written))
    };
    // The child first: if it fails before opening the FIFO, the writer
    // waits on its open forever and is left behind.
    let (_, cpu, peak_rss) = child::wait(process.id(), start, timeout)?;
    let write_secs = writer.join().map_err(|_| "the writer panicked")??;
    let arrivals = reader.join().map_err(|_| "the reader panicked")?;
    let expected = (0..rows).filter(|&id| cpu_of(id) > 90.0).count();
    if arrivals.len() != expected {
        return Err(format!("{} results, {expected} expected", arrivals.len()));
    }
    let mut latencies_us: Vec<f64> = arrivals
        .iter()
        .map(|&(id, at)| {
            at.saturating_sub(written[id as usize].load(Ordering::Relaxed)) as f64 / 1e3
        })
        .collect();
    latencies_us.sort_by(f64::total_cmp);
    Ok(Latency {
        rows,
        achieved_rate: rows as f64 / write_secs,
        results: arrivals.len(),
        latencies_us,
        cpu,
        peak_rss,
    })
}

/// Writes `rows` rows into the FIFO at `rate` rows/s, recording when each
/// was written; returns the seconds the writing took.
fn write_rows(
    fifo: &Path,
    rows: u64,
    rate: u64,
    epoch: Instant,
    written: &[AtomicU64],
) -> Result<f64, String> {
    let mut pipe = OpenOptions::new()
        .write(true)
        .open(fifo)
        .map_err(|e| format!("opening the FIFO: {e}"))?;
    pipe.write_all(b"id,ts,host,cpu\n")
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut next = 0u64;
    let mut chunk = String::with_capacity(1 << 16);
    while next < rows {
        let due = ((start.elapsed().as_secs_f64() * rate as f64) as u64 + 1).min(rows);
        if due > next {
            chunk.clear();
            for id in next..due {
                let ts = crate::data::BASE_MS + id as i64;
                writeln!(chunk, "{id},{ts},host-{:02},{:.2}", id % 10, cpu_of(id))
                    .map_err(|e| e.to_string())?;
            }
            let now = since(epoch);
            for w in &written[next as usize..due as usize] {
                w.store(now, Ordering::Relaxed);
            }
            pipe.write_all(chunk.as_bytes())
                .map_err(|e| format!("writing to the FIFO: {e}"))?;
            next = due;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Milliseconds from spawning `vigil run` on a small CSV (whose first row
/// passes the filter) to the first result line on its stdout; the median of
/// `runs` runs.
pub fn startup(
    vigil: &Path,
    dir: &Path,
    extra_args: &[String],
    runs: usize,
) -> Result<f64, String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let csv = dir.join("startup.csv");
    let mut text = String::from("ts,host,cpu\n");
    for i in 0..1000 {
        let cpu = if i == 0 { 95.0 } else { cpu_of(i) };
        writeln!(
            text,
            "{},host-{:02},{cpu:.2}",
            crate::data::BASE_MS + i as i64,
            i % 10
        )
        .map_err(|e| e.to_string())?;
    }
    std::fs::write(&csv, text).map_err(|e| e.to_string())?;
    let script = dir.join("startup.sql");
    std::fs::write(
        &script,
        format!(
            "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE, WATERMARK FOR ts AS ts)
               WITH (connector = 'file', path = '{}', format = 'csv');
             SELECT ts, host, cpu FROM m WHERE cpu > 90;",
            csv.display()
        ),
    )
    .map_err(|e| e.to_string())?;
    let mut times = Vec::new();
    for _ in 0..runs {
        let start = Instant::now();
        let mut process = Command::new(vigil)
            .arg("run")
            .arg(&script)
            .args(["--format", "csv", "--execution-mode", "per-record"])
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting vigil: {e}"))?;
        let stdout = process.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        // The header, then the first result.
        let first = lines.nth(1);
        let elapsed = start.elapsed();
        for _ in lines {}
        child::wait(process.id(), start, Duration::from_secs(60))?;
        match first {
            Some(Ok(_)) => times.push(elapsed.as_secs_f64() * 1e3),
            _ => return Err("no result line".into()),
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}
