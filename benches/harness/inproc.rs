//! The harness's own child processes (hidden subcommands), measured like
//! the `vigil` binary: Q1 through the `Session` API from Arrow batches
//! already in memory, and the batch peers in DataFusion.
//!
//! Each prints one line `out=<result rows> secs=<query seconds>
//! cpu=<query CPU seconds>` on stdout: the time of the query alone, after
//! the input was loaded (Session) or the context was set up (DataFusion).

use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::prelude::{CsvReadOptions, SessionConfig, SessionContext};
use vigil::session::{Executed, Session};

use crate::child::own_cpu;

/// The columns of the metrics CSV as they are in the file.
fn file_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("ts", DataType::Int64, false),
        Field::new("host", DataType::Utf8, false),
        Field::new("cpu", DataType::Float64, false),
    ]))
}

fn runtime(threads: usize) -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .map_err(|e| format!("a tokio runtime: {e}"))
}

/// Reads the metrics CSV into batches of 8192 rows, `ts` as a TIMESTAMP.
fn load_batches(csv: &Path) -> Result<Vec<RecordBatch>, String> {
    let file = File::open(csv).map_err(|e| format!("{}: {e}", csv.display()))?;
    let reader = datafusion::arrow::csv::ReaderBuilder::new(file_schema())
        .with_header(true)
        .with_batch_size(8192)
        .build(file)
        .map_err(|e| e.to_string())?;
    let ts_type = DataType::Timestamp(TimeUnit::Millisecond, None);
    let schema = Arc::new(Schema::new(vec![
        Field::new("ts", ts_type.clone(), false),
        Field::new("host", DataType::Utf8, false),
        Field::new("cpu", DataType::Float64, false),
    ]));
    reader
        .map(|batch| {
            let batch = batch.map_err(|e| e.to_string())?;
            let ts = cast(batch.column(0), &ts_type).map_err(|e| e.to_string())?;
            RecordBatch::try_new(
                schema.clone(),
                vec![ts, batch.column(1).clone(), batch.column(2).clone()],
            )
            .map_err(|e| e.to_string())
        })
        .collect()
}

/// Q1 over a push stream: every batch of `csv`, loaded first, pushed through
/// [`Session::push`], then the end of the stream.
pub fn session_q1(csv: &Path, query: &str) -> Result<(), String> {
    let batches = load_batches(csv)?;
    let rt = runtime(2)?;
    rt.block_on(async {
        let mut session = Session::new();
        let setup = format!(
            "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE,
               WATERMARK FOR ts AS ts - INTERVAL '2' SECOND) WITH (connector = 'push');
             {query}"
        );
        let mut handle = None;
        for executed in session.execute(&setup).map_err(|e| e.to_string())? {
            if let Executed::Query(h) = executed {
                handle = Some(h);
            }
        }
        let mut handle = handle.ok_or("the setup starts no query")?;
        let (cpu0, start) = (own_cpu(), Instant::now());
        let reader = tokio::spawn(async move {
            let mut out = 0;
            while let Some(batch) = handle.next().await {
                out += batch.num_rows();
            }
            out
        });
        for batch in batches {
            session.push("m", batch).await.map_err(|e| e.to_string())?;
        }
        session.end_stream("m").await;
        let out = reader.await.map_err(|e| e.to_string())?;
        let (secs, cpu) = (start.elapsed(), own_cpu() - cpu0);
        session.shutdown().await;
        println!(
            "out={out} secs={:.6} cpu={:.6}",
            secs.as_secs_f64(),
            cpu.as_secs_f64()
        );
        Ok(())
    })
}

/// A batch aggregation of the metrics CSV in DataFusion on `threads`
/// partitions; the results are collected (materialized) and counted.
pub fn datafusion_batch(csv: &Path, sql: &str, threads: usize) -> Result<(), String> {
    let rt = runtime(threads)?;
    rt.block_on(async {
        let config = SessionConfig::new().with_target_partitions(threads.max(1));
        let ctx = SessionContext::new_with_config(config);
        let schema = file_schema();
        let options = CsvReadOptions::new().has_header(true).schema(&schema);
        let path = csv.to_str().ok_or("a CSV path that is not UTF-8")?;
        ctx.register_csv("m", path, options)
            .await
            .map_err(|e| e.to_string())?;
        let (cpu0, start) = (own_cpu(), Instant::now());
        let frame = ctx.sql(sql).await.map_err(|e| e.to_string())?;
        let batches = frame.collect().await.map_err(|e| e.to_string())?;
        let out: usize = batches.iter().map(RecordBatch::num_rows).sum();
        let (secs, cpu) = (start.elapsed(), own_cpu() - cpu0);
        println!(
            "out={out} secs={:.6} cpu={:.6}",
            secs.as_secs_f64(),
            cpu.as_secs_f64()
        );
        Ok(())
    })
}

/// `out=.. secs=.. cpu=..` of an in-process child: result rows, seconds,
/// CPU seconds.
pub fn parse_report(stdout: &str) -> Option<(u64, f64, f64)> {
    let line = stdout.lines().rev().find(|l| l.starts_with("out="))?;
    let mut out = None;
    let mut secs = None;
    let mut cpu = None;
    for part in line.split_whitespace() {
        match part.split_once('=') {
            Some(("out", v)) => out = v.parse().ok(),
            Some(("secs", v)) => secs = v.parse().ok(),
            Some(("cpu", v)) => cpu = v.parse().ok(),
            _ => {}
        }
    }
    Some((out?, secs?, cpu.unwrap_or(f64::NAN)))
}
