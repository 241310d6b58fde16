//! The `host` connector: samples the machine vigil runs on, with the
//! `sysinfo` crate, and emits one row per sample.
//!
//! A stream declares the columns it wants from [`COLUMNS`]; only what those
//! columns need is refreshed at each sample. The first sample is taken one
//! interval after the source starts, so that the per-interval figures (CPU,
//! disk and network bytes) of every row cover a whole interval.

use std::ffi::OsStr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use datafusion::arrow::array::{
    ArrayRef, Float64Array, Int64Array, StringArray, TimestampMillisecondArray,
};
use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use sysinfo::{DiskRefreshKind, Disks, Networks, ProcessRefreshKind, ProcessesToUpdate, System};

use super::catalogue::{CatalogueColumn, match_columns};
use super::common::{LIMIT, limit, live_config};
use super::options::Options;
use super::{SourceConfig, SourcePosition, SourceStats};
use crate::connector::{
    Columns, OptionSpec, OptionType, Reader, SourceConnector, SourceRead, StreamDecl,
};
use crate::error::{Error, Result};
use crate::text::pause;

/// Default sampling interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// Shortest sampling interval accepted.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);

const TIMESTAMP: DataType = DataType::Timestamp(TimeUnit::Millisecond, None);

/// The columns a `host` stream can declare, in the order of the built-in
/// stream `host_metrics`.
pub const COLUMNS: &[CatalogueColumn] = &[
    CatalogueColumn {
        name: "ts",
        data_type: TIMESTAMP,
        meaning: "sample time (UTC, millisecond precision)",
    },
    CatalogueColumn {
        name: "host",
        data_type: DataType::Utf8,
        meaning: "host name of this machine",
    },
    CatalogueColumn {
        name: "cpu",
        data_type: DataType::Float64,
        meaning: "% of all cores busy since the previous sample (0-100, two decimals)",
    },
    CatalogueColumn {
        name: "mem",
        data_type: DataType::Float64,
        meaning: "% of memory used (0-100)",
    },
    CatalogueColumn {
        name: "mem_used_bytes",
        data_type: DataType::Int64,
        meaning: "memory used, in bytes",
    },
    CatalogueColumn {
        name: "swap",
        data_type: DataType::Float64,
        meaning: "% of swap used (0-100; 0 without swap)",
    },
    CatalogueColumn {
        name: "load_1",
        data_type: DataType::Float64,
        meaning: "1-minute load average (0 where the OS has none)",
    },
    CatalogueColumn {
        name: "disk_read_bytes",
        data_type: DataType::Int64,
        meaning: "bytes read since the previous sample, summed over the disks mounted at the start",
    },
    CatalogueColumn {
        name: "disk_write_bytes",
        data_type: DataType::Int64,
        meaning: "bytes written since the previous sample, summed over the disks mounted at the start",
    },
    CatalogueColumn {
        name: "net_rx_bytes",
        data_type: DataType::Int64,
        meaning: "bytes received since the previous sample, all interfaces",
    },
    CatalogueColumn {
        name: "net_tx_bytes",
        data_type: DataType::Int64,
        meaning: "bytes sent since the previous sample, all interfaces",
    },
    CatalogueColumn {
        name: "processes",
        data_type: DataType::Int64,
        meaning: "number of processes",
    },
];

const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "interval",
        ty: OptionType::Duration,
        default: Some("1 second"),
        accepted: "a duration of at least 100 milliseconds, e.g. '1 second', '500 ms'",
        doc: "time between two samples",
    },
    LIMIT,
];

/// `connector = 'host'`: this machine, sampled every `interval`.
pub struct HostSource;

impl SourceConnector for HostSource {
    fn name(&self) -> &'static str {
        "host"
    }
    fn summary(&self) -> &'static str {
        "this machine's CPU, memory, swap, load, disk, network and process count, sampled live"
    }
    fn options(&self) -> &'static [OptionSpec] {
        OPTIONS
    }
    fn columns(&self) -> Columns {
        Columns::Catalogue(COLUMNS)
    }
    fn configure(&self, decl: &StreamDecl<'_>, opts: &Options<'_>) -> Result<SourceConfig> {
        let interval = match opts.duration("interval")? {
            None => DEFAULT_INTERVAL,
            Some(d) if d >= MIN_INTERVAL => d,
            Some(_) => return Err(opts.bad_value("interval", opts.get("interval").unwrap_or(""))),
        };
        let limit = limit(opts)?;
        Ok(live_config(
            decl,
            "host",
            Reader(Arc::new(Host { interval, limit })),
        ))
    }
}

/// A configured `host` source.
#[derive(Debug, Clone, PartialEq)]
pub struct Host {
    /// Time between two samples.
    pub interval: Duration,
    /// Stop after this many samples; `None` runs until stopped.
    pub limit: Option<u64>,
}

impl SourceRead for Host {
    fn describe(&self) -> String {
        format!("this host, every {} ms", self.interval.as_millis())
    }
    fn explain(&self) -> String {
        format!(
            "host, every {} ms, {}",
            self.interval.as_millis(),
            crate::connector::NOT_REPLAYABLE
        )
    }
    fn live_because(&self) -> &'static str {
        "connector 'host' samples this machine live"
    }
    fn read(
        &self,
        config: &SourceConfig,
        stats: &SourceStats,
        start: Option<&SourcePosition>,
        emit: &mut dyn FnMut(RecordBatch) -> bool,
    ) -> Result<()> {
        if start.is_some() {
            return Err(Error::Connector(format!(
                "stream {} reads this machine (connector 'host'), which cannot be read again: \
                 it cannot resume from a checkpoint",
                config.stream
            )));
        }
        read_host(config, self.interval, self.limit, stats, emit)
    }
}

/// What each entry of [`COLUMNS`] measures, in the same order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Metric {
    Ts,
    Host,
    Cpu,
    Mem,
    MemUsedBytes,
    Swap,
    Load1,
    DiskReadBytes,
    DiskWriteBytes,
    NetRxBytes,
    NetTxBytes,
    Processes,
}

const METRICS: [Metric; 12] = [
    Metric::Ts,
    Metric::Host,
    Metric::Cpu,
    Metric::Mem,
    Metric::MemUsedBytes,
    Metric::Swap,
    Metric::Load1,
    Metric::DiskReadBytes,
    Metric::DiskWriteBytes,
    Metric::NetRxBytes,
    Metric::NetTxBytes,
    Metric::Processes,
];

/// Samples this machine every `interval`, emitting one single-row batch per
/// sample, until `limit` samples (if any), until `stats.stop` is set or
/// until `emit` returns false. Between samples it emits an empty batch
/// every 100 ms. It cannot be read again, so it has no position.
fn read_host(
    config: &SourceConfig,
    interval: Duration,
    limit: Option<u64>,
    stats: &SourceStats,
    emit: &mut dyn FnMut(RecordBatch) -> bool,
) -> Result<()> {
    let metrics: Vec<Metric> = match_columns(&config.stream, "host", &config.schema, COLUMNS)?
        .into_iter()
        .map(|i| METRICS[i])
        .collect();
    let mut sampler = Sampler::new(metrics);
    let mut next = Instant::now() + interval;
    let mut taken = 0u64;
    let empty = RecordBatch::new_empty(config.schema.clone());
    while limit.is_none_or(|limit| taken < limit) {
        let now = Instant::now();
        if next > now && !pause(next - now, &stats.stop, &mut || Ok(emit(empty.clone())))? {
            break;
        }
        if stats.stop.load(Ordering::Relaxed) {
            break;
        }
        // Keep to the schedule; after a stall, start it again from now.
        next += interval;
        let now = Instant::now();
        if next <= now {
            next = now + interval;
        }
        let batch = sampler.sample(config)?;
        taken += 1;
        stats.rows.fetch_add(1, Ordering::Relaxed);
        if !emit(batch) {
            break;
        }
    }
    Ok(())
}

/// The sysinfo handles a sample reads, refreshed only as far as the
/// declared columns need.
struct Sampler {
    metrics: Vec<Metric>,
    host: Option<String>,
    system: System,
    /// The disks mounted at the start, and the index of one mount per
    /// device: a device mounted several times is read once.
    disks: Option<(Disks, Vec<usize>)>,
    networks: Option<Networks>,
    cpu: bool,
    memory: bool,
    processes: bool,
}

impl Sampler {
    /// Takes the baseline that the first sample's per-interval figures are
    /// measured from.
    fn new(metrics: Vec<Metric>) -> Sampler {
        let wants = |m: &[Metric]| metrics.iter().any(|x| m.contains(x));
        let processes = wants(&[Metric::Processes]);
        if processes {
            // sysinfo otherwise keeps a /proc file open per process, up to
            // half of the process's file limit.
            sysinfo::set_open_files_limit(0);
        }
        let mut sampler = Sampler {
            host: wants(&[Metric::Host]).then(System::host_name).flatten(),
            system: System::new(),
            disks: wants(&[Metric::DiskReadBytes, Metric::DiskWriteBytes]).then(|| {
                let disks = Disks::new_with_refreshed_list_specifics(
                    DiskRefreshKind::nothing().with_io_usage(),
                );
                let mut seen: Vec<&OsStr> = Vec::new();
                let mut devices = Vec::new();
                for (i, disk) in disks.list().iter().enumerate() {
                    if !seen.contains(&disk.name()) {
                        seen.push(disk.name());
                        devices.push(i);
                    }
                }
                (disks, devices)
            }),
            networks: wants(&[Metric::NetRxBytes, Metric::NetTxBytes])
                .then(Networks::new_with_refreshed_list),
            cpu: wants(&[Metric::Cpu]),
            memory: wants(&[Metric::Mem, Metric::MemUsedBytes, Metric::Swap]),
            processes,
            metrics,
        };
        sampler.refresh();
        sampler
    }

    fn refresh(&mut self) {
        if self.cpu {
            self.system.refresh_cpu_usage();
        }
        if self.memory {
            self.system.refresh_memory();
        }
        if self.processes {
            self.system.refresh_processes_specifics(
                ProcessesToUpdate::All,
                true,
                ProcessRefreshKind::nothing(),
            );
        }
        if let Some((disks, devices)) = &mut self.disks {
            // The disks mounted when the source started: a disk listed
            // later would report its bytes since boot as one interval's.
            let list = disks.list_mut();
            for &i in devices.iter() {
                list[i].refresh_specifics(DiskRefreshKind::nothing().with_io_usage());
            }
        }
        if let Some(networks) = &mut self.networks {
            networks.refresh(true);
        }
    }

    /// Refreshes and returns one row with the stream's schema.
    fn sample(&mut self, config: &SourceConfig) -> Result<RecordBatch> {
        self.refresh();
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let (disk_read, disk_write) = self.disk_bytes();
        let (net_rx, net_tx) = self.network_bytes();
        let columns: Vec<ArrayRef> = self
            .metrics
            .iter()
            .map(|metric| -> ArrayRef {
                let float = |v: Option<f64>| Arc::new(Float64Array::from(vec![v])) as ArrayRef;
                let int = |v: u64| Arc::new(Int64Array::from(vec![saturate(v)])) as ArrayRef;
                match metric {
                    Metric::Ts => Arc::new(TimestampMillisecondArray::from(vec![ts])),
                    Metric::Host => Arc::new(StringArray::from(vec![self.host.as_deref()])),
                    // sysinfo measures in f32: keep two decimals, not
                    // the f32's binary noise.
                    Metric::Cpu => float(Some(
                        (f64::from(self.system.global_cpu_usage()) * 100.0).round() / 100.0,
                    )),
                    Metric::Mem => float(percent(
                        self.system.used_memory(),
                        self.system.total_memory(),
                    )),
                    Metric::MemUsedBytes => int(self.system.used_memory()),
                    Metric::Swap => float(Some(
                        percent(self.system.used_swap(), self.system.total_swap()).unwrap_or(0.0),
                    )),
                    Metric::Load1 => float(Some(System::load_average().one)),
                    Metric::DiskReadBytes => int(disk_read),
                    Metric::DiskWriteBytes => int(disk_write),
                    Metric::NetRxBytes => int(net_rx),
                    Metric::NetTxBytes => int(net_tx),
                    Metric::Processes => int(self.system.processes().len() as u64),
                }
            })
            .collect();
        Ok(RecordBatch::try_new(config.schema.clone(), columns)?)
    }

    /// Bytes read and written since the previous refresh, each device
    /// counted once however many times it is mounted.
    fn disk_bytes(&self) -> (u64, u64) {
        let Some((disks, devices)) = &self.disks else {
            return (0, 0);
        };
        devices.iter().fold((0u64, 0u64), |(read, written), &i| {
            let usage = disks.list()[i].usage();
            (
                read.saturating_add(usage.read_bytes),
                written.saturating_add(usage.written_bytes),
            )
        })
    }

    /// Bytes received and sent since the previous refresh.
    fn network_bytes(&self) -> (u64, u64) {
        let Some(networks) = &self.networks else {
            return (0, 0);
        };
        networks.values().fold((0u64, 0u64), |(rx, tx), data| {
            (
                rx.saturating_add(data.received()),
                tx.saturating_add(data.transmitted()),
            )
        })
    }
}

fn percent(part: u64, total: u64) -> Option<f64> {
    (total > 0).then(|| part as f64 / total as f64 * 100.0)
}

fn saturate(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::Array;
    use datafusion::arrow::datatypes::{Field, Schema};

    use super::super::catalogue::full_schema;
    use super::super::{Format, Replay, SourceLocation};
    use super::*;

    fn config(schema: Arc<Schema>) -> SourceConfig {
        SourceConfig {
            stream: "h".into(),
            schema,
            connector: "host",
            location: SourceLocation::Connector(Reader(Arc::new(Host {
                interval: MIN_INTERVAL,
                limit: Some(2),
            }))),
            format: Format::Csv,
            replay: Replay::Fast,
            event_time: Some(0),
            batch_size: 1,
            dead_letter: None,
            follow: false,
            decode_threads: 1,
            decode: Default::default(),
        }
    }

    #[test]
    fn metrics_follow_the_catalogue() {
        assert_eq!(METRICS.len(), COLUMNS.len());
        let names = [
            "ts",
            "host",
            "cpu",
            "mem",
            "mem_used_bytes",
            "swap",
            "load_1",
            "disk_read_bytes",
            "disk_write_bytes",
            "net_rx_bytes",
            "net_tx_bytes",
            "processes",
        ];
        let catalogue: Vec<&str> = COLUMNS.iter().map(|c| c.name).collect();
        assert_eq!(catalogue, names);
        for (m, name) in METRICS.iter().zip(names) {
            let debug = format!("{m:?}").to_ascii_lowercase();
            assert_eq!(debug, name.replace('_', ""), "{m:?}");
        }
    }

    #[test]
    fn samples_every_column_until_the_limit() {
        let cfg = config(full_schema(COLUMNS));
        let stats = SourceStats::default();
        let mut batches = Vec::new();
        let start = Instant::now();
        read_host(&cfg, MIN_INTERVAL, Some(2), &stats, &mut |b| {
            batches.push(b);
            true
        })
        .unwrap();
        assert!(start.elapsed() >= 2 * MIN_INTERVAL, "{:?}", start.elapsed());
        assert_eq!(batches.len(), 2);
        assert_eq!(stats.rows.load(Ordering::Relaxed), 2);
        let value = |b: &RecordBatch, name: &str| -> f64 {
            let col = b.column_by_name(name).unwrap();
            if let Some(a) = col.as_any().downcast_ref::<Float64Array>() {
                a.value(0)
            } else if let Some(a) = col.as_any().downcast_ref::<Int64Array>() {
                a.value(0) as f64
            } else {
                let a = col
                    .as_any()
                    .downcast_ref::<TimestampMillisecondArray>()
                    .unwrap();
                a.value(0) as f64
            }
        };
        for b in &batches {
            assert_eq!(b.num_rows(), 1);
            assert_eq!(b.schema(), cfg.schema);
            let host = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
            assert!(!host.is_null(0) && !host.value(0).is_empty());
            for pct in ["cpu", "mem", "swap"] {
                let v = value(b, pct);
                assert!((0.0..=100.0).contains(&v), "{pct} = {v}");
            }
            assert!(value(b, "mem_used_bytes") > 0.0);
            assert!(value(b, "processes") >= 1.0);
            assert!(value(b, "load_1") >= 0.0);
            for bytes in [
                "disk_read_bytes",
                "disk_write_bytes",
                "net_rx_bytes",
                "net_tx_bytes",
            ] {
                assert!(value(b, bytes) >= 0.0, "{bytes}");
            }
        }
        let (t0, t1) = (value(&batches[0], "ts"), value(&batches[1], "ts"));
        assert!(t1 - t0 >= 50.0, "{t0} {t1}");
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as f64;
        assert!((now_ms - t1).abs() < 60_000.0);
    }

    #[test]
    fn empty_batches_between_samples_and_a_stop_request() {
        let schema = Arc::new(Schema::new(vec![Field::new("TS", TIMESTAMP, true)]));
        let cfg = config(schema.clone());
        let stats = SourceStats::default();
        let mut sizes = Vec::new();
        read_host(
            &cfg,
            Duration::from_millis(350),
            Some(1),
            &stats,
            &mut |b| {
                assert_eq!(b.schema(), schema);
                sizes.push(b.num_rows());
                true
            },
        )
        .unwrap();
        // Every 100 ms of the 350 ms wait, then the sample.
        assert!(sizes.len() >= 3, "{sizes:?}");
        assert_eq!(sizes.last(), Some(&1));
        assert!(
            sizes[..sizes.len() - 1].iter().all(|&n| n == 0),
            "{sizes:?}"
        );
        assert_eq!(*stats.position.lock().unwrap(), None);

        // Asked to stop while it waits: it ends without sampling.
        let stats = SourceStats::default();
        let mut samples = 0;
        read_host(&cfg, Duration::from_secs(60), None, &stats, &mut |b| {
            samples += b.num_rows();
            stats.stop.store(true, Ordering::Relaxed);
            true
        })
        .unwrap();
        assert_eq!(samples, 0);
    }

    #[test]
    fn declared_subset_in_declared_order_and_early_stop() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("processes", DataType::Int64, true),
            Field::new("TS", TIMESTAMP, true),
        ]));
        let cfg = config(schema.clone());
        let stats = SourceStats::default();
        let mut calls = 0;
        read_host(&cfg, MIN_INTERVAL, None, &stats, &mut |b| {
            assert_eq!(b.schema(), schema);
            calls += 1;
            false
        })
        .unwrap();
        assert_eq!(calls, 1);
    }
}
