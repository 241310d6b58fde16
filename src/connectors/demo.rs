//! The `demo` connector: a real sensor series, embedded in the binary,
//! replayed as a live stream.
//!
//! The series is the machine-temperature file of the Numenta Anomaly
//! Benchmark (`queries/data/nab/machine_temperature_system_failure.csv`, MIT
//! licence, see `LICENSE.txt` and `PROVENANCE` next to it): 22,695 readings
//! taken every 5 minutes from 2013-12-02 21:15 to 2014-02-19 15:25 (UTC),
//! with the known failures of the benchmark. Rows keep their real
//! timestamps; they are released at a steady number of rows per second of
//! wall-clock time.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{ArrayRef, Float64Array, StringArray, TimestampMillisecondArray};
use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;

use super::catalogue::{CatalogueColumn, match_columns};
use super::common::{LIMIT, limit, live_config};
use super::options::Options;
use super::{SourceConfig, SourcePosition, SourceStats};
use crate::connector::{
    Columns, OptionSpec, OptionType, Reader, SourceConnector, SourceRead, StreamDecl,
};
use crate::error::{Error, Result};
use crate::text::pause;
use crate::timestamp::parse_timestamp_ms;

/// The bundled series, `timestamp,value` with a header line.
const DATA: &str = include_str!("../../queries/data/nab/machine_temperature_system_failure.csv");

/// Number of readings in the series.
pub const ROWS: usize = 22_695;

/// The `host` column's value.
pub const HOST: &str = "machine";

/// The `metric` column's value.
pub const METRIC: &str = "temperature";

/// Default replay speed: rows per second of wall-clock time. The whole
/// series takes about 23 s; the first anomaly (2013-12-10) comes after
/// about 2 s.
pub const DEFAULT_SPEED: f64 = 1000.0;

/// Shortest pause between two batches: at high speeds rows go out in
/// batches of the rows that fell due meanwhile.
const MIN_PAUSE: Duration = Duration::from_millis(10);

/// The columns a `demo` stream can declare, in the order of the built-in
/// stream `demo`.
pub const COLUMNS: &[CatalogueColumn] = &[
    CatalogueColumn {
        name: "ts",
        data_type: DataType::Timestamp(TimeUnit::Millisecond, None),
        meaning: "time of the reading, as recorded (UTC, 2013-12-02 to 2014-02-19, every 5 minutes)",
    },
    CatalogueColumn {
        name: "host",
        data_type: DataType::Utf8,
        meaning: "always 'machine'",
    },
    CatalogueColumn {
        name: "metric",
        data_type: DataType::Utf8,
        meaning: "always 'temperature'",
    },
    CatalogueColumn {
        name: "value",
        data_type: DataType::Float64,
        meaning: "the machine's temperature sensor reading (unit not given by the source)",
    },
];

const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "speed",
        ty: OptionType::Number,
        default: Some("1000"),
        accepted: "a positive number of rows per second such as 1000",
        doc: "rows released per second",
    },
    LIMIT,
];

/// `connector = 'demo'`: the bundled NAB machine-temperature series.
pub struct DemoSource;

impl SourceConnector for DemoSource {
    fn name(&self) -> &'static str {
        "demo"
    }
    fn summary(&self) -> &'static str {
        "the bundled NAB machine-temperature series (labelled failures), replayed at `speed`"
    }
    fn options(&self) -> &'static [OptionSpec] {
        OPTIONS
    }
    fn columns(&self) -> Columns {
        Columns::Catalogue(COLUMNS)
    }
    fn configure(&self, decl: &StreamDecl<'_>, opts: &Options<'_>) -> Result<SourceConfig> {
        let speed = opts.number("speed")?.unwrap_or(DEFAULT_SPEED);
        let limit = limit(opts)?;
        Ok(live_config(
            decl,
            "demo",
            Reader(Arc::new(Demo { speed, limit })),
        ))
    }
}

/// A configured `demo` source.
#[derive(Debug, Clone, PartialEq)]
pub struct Demo {
    /// Rows released per second of wall-clock time.
    pub speed: f64,
    /// Stop after this many rows; `None` replays the whole series.
    pub limit: Option<u64>,
}

impl SourceRead for Demo {
    fn describe(&self) -> String {
        format!("demo replay, {} rows/s", self.speed)
    }
    fn explain(&self) -> String {
        format!("demo, {} rows/s", self.speed)
    }
    fn live_because(&self) -> &'static str {
        "connector 'demo' is a live feed"
    }
    fn read(
        &self,
        config: &SourceConfig,
        stats: &SourceStats,
        start: Option<&SourcePosition>,
        emit: &mut dyn FnMut(RecordBatch) -> bool,
    ) -> Result<()> {
        read_demo(config, self.speed, self.limit, stats, start, emit)
    }
}

/// The series as (epoch milliseconds, value) pairs, in file order.
pub fn series() -> Result<Vec<(i64, f64)>> {
    let mut rows = Vec::with_capacity(ROWS);
    for (i, line) in DATA.lines().enumerate().skip(1) {
        let parsed = line.trim_end().split_once(',').and_then(|(t, v)| {
            Some((parse_timestamp_ms(t.trim())?, v.trim().parse::<f64>().ok()?))
        });
        match parsed {
            Some(row) => rows.push(row),
            None => {
                return Err(Error::Connector(format!(
                    "the bundled demo series is damaged at line {}",
                    i + 1
                )));
            }
        }
    }
    Ok(rows)
}

/// Replays the series at `speed` rows per second, stopping after `limit`
/// rows (if any), at the end of the series, when `stats.stop` is set or
/// when `emit` returns false. Batches have at most `config.batch_size`
/// rows.
///
/// Its position is the number of rows emitted (`rows`): a resumed replay
/// (from `start`) skips them and paces the rest from its own start, at the
/// same speed. While it waits for the next row to fall due it emits an
/// empty batch every 100 ms.
fn read_demo(
    config: &SourceConfig,
    speed: f64,
    limit: Option<u64>,
    stats: &SourceStats,
    start: Option<&SourcePosition>,
    emit: &mut dyn FnMut(RecordBatch) -> bool,
) -> Result<()> {
    let columns = match_columns(&config.stream, "demo", &config.schema, COLUMNS)?;
    let mut rows = series()?;
    let skipped = match start {
        None => 0,
        Some(position) => resume(config, position, rows.len(), stats)?,
    };
    if let Some(limit) = limit {
        rows.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    }
    let batch_size = config.batch_size.max(1);
    let begin = Instant::now();
    let mut sent = skipped.min(rows.len());
    let mut send = |batch: RecordBatch, sent: usize| {
        *stats.position.lock().unwrap_or_else(|e| e.into_inner()) = Some(SourcePosition {
            rows: sent as u64,
            ..SourcePosition::default()
        });
        emit(batch)
    };
    while sent < rows.len() && !stats.stop.load(Ordering::Relaxed) {
        // Row i falls due (i - skipped) / speed seconds after the start.
        let due = ((begin.elapsed().as_secs_f64() * speed).floor() as usize)
            .saturating_add(1)
            .saturating_add(skipped);
        let end = due.min(rows.len()).min(sent + batch_size);
        if end <= sent {
            let next_due = Duration::from_secs_f64((sent - skipped) as f64 / speed);
            let wait = next_due.saturating_sub(begin.elapsed()).max(MIN_PAUSE);
            let empty = RecordBatch::new_empty(config.schema.clone());
            if !pause(wait, &stats.stop, &mut || Ok(send(empty.clone(), sent)))? {
                break;
            }
            continue;
        }
        let batch = batch(config, &columns, &rows[sent..end])?;
        sent = end;
        stats
            .rows
            .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
        if !send(batch, sent) {
            break;
        }
    }
    Ok(())
}

/// Takes up from `position`: restores the row count and returns the rows
/// to skip.
fn resume(
    config: &SourceConfig,
    position: &SourcePosition,
    series: usize,
    stats: &SourceStats,
) -> Result<usize> {
    let skipped = usize::try_from(position.rows).unwrap_or(usize::MAX);
    if skipped > series {
        return Err(Error::Connector(format!(
            "stream {}: the checkpoint's position is row {} of the demo series, which has {series}",
            config.stream, position.rows
        )));
    }
    stats.rows.store(position.rows, Ordering::Relaxed);
    Ok(skipped)
}

/// One batch of rows with the stream's schema; `columns` are the declared
/// columns' indexes in [`COLUMNS`].
fn batch(config: &SourceConfig, columns: &[usize], rows: &[(i64, f64)]) -> Result<RecordBatch> {
    let arrays: Vec<ArrayRef> = columns
        .iter()
        .map(|&c| -> ArrayRef {
            match c {
                0 => Arc::new(TimestampMillisecondArray::from_iter_values(
                    rows.iter().map(|r| r.0),
                )),
                1 => Arc::new(StringArray::from_iter_values(rows.iter().map(|_| HOST))),
                2 => Arc::new(StringArray::from_iter_values(rows.iter().map(|_| METRIC))),
                _ => Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.1))),
            }
        })
        .collect();
    Ok(RecordBatch::try_new(config.schema.clone(), arrays)?)
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::Array;
    use datafusion::arrow::datatypes::{Field, Schema};

    use super::super::catalogue::full_schema;
    use super::super::options::DEFAULT_BATCH_SIZE;
    use super::super::{Format, Replay, SourceLocation};
    use super::*;
    use crate::timestamp::parse_timestamp_ms;

    fn config(schema: Arc<Schema>, speed: f64, limit: Option<u64>) -> SourceConfig {
        SourceConfig {
            stream: "d".into(),
            schema,
            connector: "demo",
            location: SourceLocation::Connector(Reader(Arc::new(Demo { speed, limit }))),
            format: Format::Csv,
            replay: Replay::Fast,
            event_time: Some(0),
            batch_size: DEFAULT_BATCH_SIZE,
            dead_letter: None,
            follow: false,
            decode_threads: 1,
            decode: Default::default(),
        }
    }

    /// Reads `cfg` as the runtime does, through its reader.
    fn read_config(
        cfg: &SourceConfig,
        stats: &SourceStats,
        start: Option<&SourcePosition>,
        emit: &mut dyn FnMut(RecordBatch) -> bool,
    ) -> Result<()> {
        cfg.location.reader().unwrap().read(cfg, stats, start, emit)
    }

    fn run(cfg: &SourceConfig) -> Vec<RecordBatch> {
        let mut batches = Vec::new();
        read_config(cfg, &SourceStats::default(), None, &mut |b| {
            batches.push(b);
            true
        })
        .unwrap();
        batches
    }

    #[test]
    fn the_embedded_series_parses() {
        let rows = series().unwrap();
        assert_eq!(rows.len(), ROWS);
        assert_eq!(
            rows[0],
            (
                parse_timestamp_ms("2013-12-02 21:15:00").unwrap(),
                73.96732207
            )
        );
        assert_eq!(
            rows[ROWS - 1].0,
            parse_timestamp_ms("2014-02-19 15:25:00").unwrap()
        );
    }

    #[test]
    fn first_rows_with_every_column() {
        let cfg = config(full_schema(COLUMNS), DEFAULT_SPEED, Some(3));
        let batches = run(&cfg);
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        assert_eq!(rows, 3);
        let b = &batches[0];
        let ts = b
            .column(0)
            .as_any()
            .downcast_ref::<TimestampMillisecondArray>()
            .unwrap();
        assert_eq!(
            ts.value(0),
            parse_timestamp_ms("2013-12-02 21:15:00").unwrap()
        );
        let host = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
        let metric = b.column(2).as_any().downcast_ref::<StringArray>().unwrap();
        let value = b.column(3).as_any().downcast_ref::<Float64Array>().unwrap();
        assert_eq!(host.value(0), "machine");
        assert_eq!(metric.value(0), "temperature");
        assert_eq!(value.value(0), 73.96732207);
        assert_eq!(value.null_count(), 0);
    }

    #[test]
    fn paced_by_rows_per_second() {
        let schema = Arc::new(Schema::new(vec![Field::new(
            "value",
            DataType::Float64,
            true,
        )]));
        // 20 rows at 100 rows/s: about 190 ms.
        let cfg = config(schema, 100.0, Some(20));
        let start = Instant::now();
        let batches = run(&cfg);
        let elapsed = start.elapsed();
        assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 20);
        assert!(batches.len() > 2, "{}", batches.len());
        assert!(elapsed >= Duration::from_millis(180), "{elapsed:?}");
        assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    }

    fn values(batches: &[RecordBatch]) -> Vec<f64> {
        batches
            .iter()
            .flat_map(|b| {
                let v = b.column(0).as_any().downcast_ref::<Float64Array>().unwrap();
                v.values().to_vec()
            })
            .collect()
    }

    fn value_schema() -> Arc<Schema> {
        Arc::new(Schema::new(vec![Field::new(
            "value",
            DataType::Float64,
            true,
        )]))
    }

    /// Reads from `start`; the batches with the position stored before each.
    fn run_from(
        cfg: &SourceConfig,
        start: Option<&SourcePosition>,
        stats: &SourceStats,
    ) -> Vec<(RecordBatch, SourcePosition)> {
        let mut batches = Vec::new();
        read_config(cfg, stats, start, &mut |b| {
            let position = stats.position.lock().unwrap().clone().unwrap();
            batches.push((b, position));
            true
        })
        .unwrap();
        batches
    }

    #[test]
    fn resumes_at_every_batch() {
        let cfg = SourceConfig {
            batch_size: 2,
            ..config(value_schema(), 1e9, Some(7))
        };
        let whole = run_from(&cfg, None, &SourceStats::default());
        let batches: Vec<RecordBatch> = whole.iter().map(|(b, _)| b.clone()).collect();
        assert_eq!(
            batches.iter().map(|b| b.num_rows()).collect::<Vec<_>>(),
            vec![2, 2, 2, 1]
        );
        let all = values(&batches);
        for (k, (_, position)) in whole.iter().enumerate() {
            assert_eq!(position.rows, values(&batches[..=k]).len() as u64);
            let stats = SourceStats::default();
            let resumed = run_from(&cfg, Some(position), &stats);
            let mut got = values(&batches[..=k]);
            got.extend(values(
                &resumed.iter().map(|(b, _)| b.clone()).collect::<Vec<_>>(),
            ));
            assert_eq!(got, all, "after batch {k}");
            assert_eq!(stats.rows.load(Ordering::Relaxed), 7);
        }
        let past = SourcePosition {
            rows: ROWS as u64 + 1,
            ..SourcePosition::default()
        };
        let err =
            read_config(&cfg, &SourceStats::default(), Some(&past), &mut |_| true).unwrap_err();
        assert!(err.to_string().contains("demo series"), "{err}");
    }

    #[test]
    fn a_resumed_replay_paces_from_its_own_start_and_emits_while_waiting() {
        // 4 rows a second: 250 ms between rows.
        let cfg = SourceConfig {
            batch_size: 1,
            ..config(value_schema(), 4.0, Some(4))
        };
        let start = SourcePosition {
            rows: 2,
            ..SourcePosition::default()
        };
        let begin = Instant::now();
        let mut arrivals = Vec::new();
        let stats = SourceStats::default();
        super::read_demo(&cfg, 4.0, Some(4), &stats, Some(&start), &mut |b| {
            let rows = stats.position.lock().unwrap().as_ref().unwrap().rows;
            arrivals.push((b.num_rows(), rows, begin.elapsed()));
            true
        })
        .unwrap();
        let sent: Vec<&(usize, u64, Duration)> = arrivals.iter().filter(|a| a.0 > 0).collect();
        assert_eq!(sent.len(), 2, "{arrivals:?}");
        // Row 2 goes at once, not 500 ms in (the bound leaves room for a
        // busy machine); row 3 250 ms later.
        assert!(sent[0].2 < Duration::from_millis(450), "{arrivals:?}");
        assert!(sent[1].2 >= Duration::from_millis(240), "{arrivals:?}");
        // Empty batches while waiting, with the position of the rows sent.
        let empty: Vec<&(usize, u64, Duration)> = arrivals.iter().filter(|a| a.0 == 0).collect();
        assert!(!empty.is_empty(), "{arrivals:?}");
        assert!(empty.iter().all(|a| a.1 == 3), "{arrivals:?}");
        assert_eq!(stats.rows.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn fast_replay_of_the_whole_series_in_big_batches() {
        let schema = Arc::new(Schema::new(vec![Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            true,
        )]));
        let cfg = config(schema, 1e9, None);
        let batches = run(&cfg);
        assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), ROWS);
        assert!(batches.iter().all(|b| b.num_rows() <= DEFAULT_BATCH_SIZE));
    }
}
