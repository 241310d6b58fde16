//! vigil against its peers, in one run: `benches/run.sh [OPTIONS]` (or
//! `cargo bench --bench harness -- [OPTIONS]`). See `benches/README.md`,
//! "Against the peers".
//!
//! It writes deterministic input into a cache directory (reused when the
//! same parameters ask for it), runs every query on the release `vigil`
//! binary as a child process (wall time from spawn to exit; CPU seconds and
//! peak RSS from `wait4`), runs Q1 through the `Session` API and the batch
//! peers (DataFusion in a child of its own, DuckDB in Python when it can be
//! installed), and prints two Markdown tables: the measurements, and the
//! targets of issue 11 with PASS or FAIL.

mod child;
mod data;
mod inproc;
mod latency;
mod report;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use clap::{Parser, Subcommand};

use data::{MetricsSpec, NexmarkSpec};
use report::{Extra, latency_line, machine, nexmark_table, ratios, table, targets};

/// Command line of the harness.
#[derive(Parser)]
#[command(
    name = "vigil-bench",
    about = "vigil against its peers: streaming queries, Nexmark, DataFusion and DuckDB, one table"
)]
struct Cli {
    #[command(subcommand)]
    child: Option<ChildCommand>,
    /// Seed of the data generators.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Input rows (and Nexmark events); default 10,000,000, or 1,000,000
    /// with --quick.
    #[arg(long)]
    rows: Option<u64>,
    /// A quick run: 1,000,000 rows, one run per query, 0.5 s of latency.
    #[arg(long)]
    quick: bool,
    /// Hosts of the metrics data (Q0-Q5, Q7).
    #[arg(long, default_value_t = 1_000)]
    hosts: u64,
    /// Hosts of Q6, the state-size query.
    #[arg(long, default_value_t = 100_000)]
    many_hosts: u64,
    /// Which parts to run, comma-separated: q0,q1,q1json,q2,q3,q4,q4approx,
    /// q5,q6,q7,latency,startup,nexmark,peers (default: all).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// vigil's --parallelism (passed only when `vigil run --help` offers
    /// it) and the peers' threads; default: the number of cores.
    #[arg(long)]
    parallelism: Option<usize>,
    /// Runs per query; the table shows medians.
    #[arg(long)]
    runs: Option<usize>,
    /// Where the generated data, the scripts and DuckDB's venv go.
    #[arg(long)]
    cache: Option<PathBuf>,
    /// The vigil binary (default: `vigil` next to this program's target
    /// directory, i.e. `$CARGO_TARGET_DIR/release/vigil`).
    #[arg(long)]
    vigil: Option<PathBuf>,
    /// Seconds after which one run is killed and reported as failed.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// Offered rows per second of the per-record latency runs, one run per
    /// rate; the first is the target's.
    #[arg(long, value_delimiter = ',', default_value = "500000,100000")]
    latency_rates: Vec<u64>,
    /// Do not try `pip install duckdb` when DuckDB is missing.
    #[arg(long)]
    no_install: bool,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// The harness's own measured children.
#[derive(Subcommand)]
enum ChildCommand {
    /// Q1 through the Session API from in-memory Arrow batches.
    #[command(name = "__session", hide = true)]
    Session {
        #[arg(long)]
        csv: PathBuf,
        #[arg(long)]
        query: String,
    },
    /// A batch query in DataFusion over the metrics CSV.
    #[command(name = "__datafusion", hide = true)]
    DataFusion {
        #[arg(long)]
        csv: PathBuf,
        #[arg(long)]
        sql: String,
        #[arg(long)]
        threads: usize,
    },
}

/// Everything a run needs to know.
struct Ctx {
    vigil: PathBuf,
    cache: PathBuf,
    /// Extra arguments of every `vigil run` (`--parallelism N` when offered).
    vigil_args: Vec<String>,
    parallelism: usize,
    parallel_flag: bool,
    runs: usize,
    timeout: Duration,
    only: Vec<String>,
}

impl Ctx {
    fn wants(&self, part: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|p| p == part)
    }
}

/// One line of the main table.
#[derive(Default, Clone)]
struct Row {
    name: String,
    what: String,
    input: String,
    rows: u64,
    bytes: u64,
    wall: f64,
    cpu: f64,
    rss: u64,
    results: u64,
    notes: String,
    failed: Option<String>,
}

impl Row {
    fn rate(&self) -> f64 {
        self.rows as f64 / self.wall
    }
}

/// The median of some values (the upper one of an even count).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// `vigil: stream X: rows=N` summed over streams, and query 1's `out=`
/// and `late=`, from vigil's stderr.
fn summary(stderr: &str) -> (u64, u64, u64) {
    let field = |line: &str, key: &str| -> u64 {
        line.split_whitespace()
            .find_map(|p| p.strip_prefix(key))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let mut rows = 0;
    let (mut out, mut late) = (0, 0);
    for line in stderr.lines() {
        if line.starts_with("vigil: stream ") {
            rows += field(line, "rows=");
        } else if line.starts_with("vigil: query 1:") {
            out = field(line, "out=");
            late = field(line, "late=");
        }
    }
    (rows, out, late)
}

/// The stream over the metrics file `path` (CSV or JSON lines).
fn metrics_stream(path: &Path, format: &str) -> String {
    format!(
        "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE,
           WATERMARK FOR ts AS ts - INTERVAL '2' SECOND)
           WITH (connector = 'file', path = '{}', format = '{format}');\n",
        path.display()
    )
}

const Q1_SELECT: &str = "SELECT window_start, window_end, host, avg(cpu) AS avg_cpu, \
     max(cpu) AS max_cpu, count(*) AS n";
const BY_WINDOW_HOST: &str = "GROUP BY window_start, window_end, host";

fn q1_sql() -> String {
    format!("{Q1_SELECT} FROM TUMBLE(m, ts, INTERVAL '10' SECOND) {BY_WINDOW_HOST};")
}

/// Runs `script` (written to the cache) `ctx.runs` times on vigil and
/// makes a row of the medians.
fn run_vigil(ctx: &Ctx, row: Row, script: &str, expect_rows: u64) -> Row {
    let file = format!("{}.sql", row.name.replace(' ', "_"));
    let path = ctx.cache.join("scripts").join(file);
    let written = std::fs::create_dir_all(path.parent().unwrap_or(&ctx.cache))
        .and_then(|()| std::fs::write(&path, script));
    if let Err(e) = written {
        return Row {
            failed: Some(format!("writing {}: {e}", path.display())),
            ..row
        };
    }
    let (mut walls, mut cpus, mut rsss) = (Vec::new(), Vec::new(), Vec::new());
    let mut last = (0, 0, 0);
    for _ in 0..ctx.runs {
        let mut command = Command::new(&ctx.vigil);
        command
            .arg("run")
            .arg(&path)
            .args(["--format", "csv", "--progress", "never"])
            .args(&ctx.vigil_args);
        match child::run(command, ctx.timeout, true) {
            Ok(m) => {
                walls.push(m.wall.as_secs_f64());
                cpus.push(m.cpu.as_secs_f64());
                rsss.push(m.peak_rss as f64);
                last = summary(&m.stderr);
            }
            Err(e) => {
                return Row {
                    failed: Some(e),
                    ..row
                };
            }
        }
    }
    let (rows, results, late) = last;
    let mut notes = row.notes.clone();
    if late > 0 {
        let _ = write!(notes, " {late} rows late!");
    }
    if rows != expect_rows {
        let _ = write!(notes, " read {rows} rows, {expect_rows} expected!");
    }
    eprintln!("  {}: {:.3} s", row.name, median(&mut walls.clone()));
    Row {
        rows: expect_rows,
        wall: median(&mut walls),
        cpu: median(&mut cpus),
        rss: median(&mut rsss) as u64,
        results,
        notes: notes.trim().to_string(),
        ..row
    }
}

/// Runs this program's hidden subcommand `args` `ctx.runs` times; the wall
/// time is the query's own (reported by the child), CPU too.
fn run_self(ctx: &Ctx, row: Row, args: &[String]) -> Row {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            return Row {
                failed: Some(e.to_string()),
                ..row
            };
        }
    };
    run_reporting(ctx, row, || {
        let mut c = Command::new(&exe);
        c.args(args);
        c
    })
}

/// Runs a child that prints `out=.. secs=.. cpu=..` `ctx.runs` times.
fn run_reporting(ctx: &Ctx, row: Row, command: impl Fn() -> Command) -> Row {
    let (mut walls, mut cpus, mut rsss) = (Vec::new(), Vec::new(), Vec::new());
    let mut results = 0;
    for _ in 0..ctx.runs {
        let measured = child::run(command(), ctx.timeout, false).and_then(|m| {
            match inproc::parse_report(&m.stdout) {
                Some(r) => Ok((m, r)),
                None => Err(format!("no report in its output: {}", m.stderr.trim())),
            }
        });
        match measured {
            Ok((m, (out, secs, cpu))) => {
                walls.push(secs);
                cpus.push(if cpu.is_nan() {
                    m.cpu.as_secs_f64()
                } else {
                    cpu
                });
                rsss.push(m.peak_rss as f64);
                results = out;
            }
            Err(e) => {
                return Row {
                    failed: Some(e),
                    ..row
                };
            }
        }
    }
    eprintln!("  {}: {:.3} s", row.name, median(&mut walls.clone()));
    Row {
        wall: median(&mut walls),
        cpu: median(&mut cpus),
        rss: median(&mut rsss) as u64,
        results,
        ..row
    }
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

fn row(name: &str, what: &str, input: &str, rows: u64, bytes: u64) -> Row {
    Row {
        name: name.into(),
        what: what.into(),
        input: input.into(),
        rows,
        bytes,
        ..Row::default()
    }
}

/// Q0-Q6 on the binary, Q7 through the Session API.
fn streaming_rows(ctx: &Ctx, spec: MetricsSpec, many: MetricsSpec) -> Result<Vec<Row>, String> {
    let (csv, json) = data::write_metrics(&ctx.cache, spec).map_err(|e| e.to_string())?;
    let (csv_bytes, json_bytes) = (file_size(&csv), file_size(&json));
    let n = spec.rows;
    let csv_stream = metrics_stream(&csv, "csv");
    let hosts = spec.hosts;
    let mut rows = Vec::new();
    let agg = |window: &str| format!("{Q1_SELECT} FROM {window} {BY_WINDOW_HOST};");
    let queries: Vec<(&str, String, String)> = vec![
        (
            "q0",
            "filter `cpu > 90`".into(),
            "SELECT ts, host, cpu FROM m WHERE cpu > 90;".into(),
        ),
        (
            "q1",
            format!("TUMBLE 10 s avg/max/count per host ({hosts} hosts)"),
            q1_sql(),
        ),
        (
            "q2",
            "HOP 10 s / 60 s, the same aggregates".into(),
            agg("HOP(m, ts, INTERVAL '10' SECOND, INTERVAL '60' SECOND)"),
        ),
        (
            "q3",
            "SESSION 30 s per host, the same aggregates".into(),
            agg("SESSION(m, ts, INTERVAL '30' SECOND)"),
        ),
        (
            "q4",
            "TUMBLE 10 s exact `median(cpu)` per host".into(),
            format!(
                "SELECT window_start, window_end, host, median(cpu) AS median_cpu \
                 FROM TUMBLE(m, ts, INTERVAL '10' SECOND) {BY_WINDOW_HOST};"
            ),
        ),
        (
            "q4approx",
            "TUMBLE 10 s `approx_percentile_cont(cpu, 0.99)` per host".into(),
            format!(
                "SELECT window_start, window_end, host, approx_percentile_cont(cpu, 0.99) AS p99 \
                 FROM TUMBLE(m, ts, INTERVAL '10' SECOND) {BY_WINDOW_HOST};"
            ),
        ),
        (
            "q5",
            "Q1 + `ALERT WHEN avg_cpu > 55 FOR 3 WINDOWS`".into(),
            format!(
                "{Q1_SELECT} FROM TUMBLE(m, ts, INTERVAL '10' SECOND) {BY_WINDOW_HOST} \
                 ALERT WHEN avg_cpu > 55 FOR 3 WINDOWS;"
            ),
        ),
    ];
    for (name, what, sql) in queries {
        if ctx.wants(name) {
            let r = row(name, &what, "CSV", n, csv_bytes);
            rows.push(run_vigil(ctx, r, &format!("{csv_stream}{sql}"), n));
        }
    }
    if ctx.wants("q1json") {
        let r = row("q1", "Q1 from JSON lines", "JSON lines", n, json_bytes);
        let script = format!("{}{}", metrics_stream(&json, "jsonl"), q1_sql());
        rows.push(run_vigil(
            ctx,
            Row {
                name: "q1json".into(),
                ..r
            },
            &script,
            n,
        ));
    }
    if ctx.wants("q6") {
        let (many_csv, _) = data::write_metrics(&ctx.cache, many).map_err(|e| e.to_string())?;
        let r = row(
            "q6",
            &format!("Q1 with {} hosts (state size)", many.hosts),
            "CSV",
            many.rows,
            file_size(&many_csv),
        );
        let script = format!("{}{}", metrics_stream(&many_csv, "csv"), q1_sql());
        rows.push(run_vigil(ctx, r, &script, many.rows));
    }
    if ctx.wants("q7") {
        let r = row(
            "q7",
            "Q1 from in-memory Arrow batches (Session::push, no parsing)",
            "Arrow",
            n,
            0,
        );
        let args = [
            "__session".to_string(),
            "--csv".into(),
            csv.display().to_string(),
            "--query".into(),
            q1_sql(),
        ];
        let mut r = run_self(ctx, r, &args);
        r.notes = "time and CPU of the pushes alone; RSS includes the loaded batches".into();
        rows.push(r);
    }
    Ok(rows)
}

/// One Nexmark query: name, what it does, Flink 1.13's events/s per core
/// (nexmark project README), the SQL (or why vigil cannot say it), and
/// which streams it reads.
struct Nexmark {
    name: &'static str,
    what: &'static str,
    flink_per_core: f64,
    sql: &'static str,
    reads_bids: bool,
}

const NEXMARK: &[Nexmark] = &[
    Nexmark {
        name: "q0",
        what: "pass-through",
        flink_per_core: 155_020.0,
        sql: "SELECT auction, bidder, price, date_time, extra FROM bid;",
        reads_bids: true,
    },
    Nexmark {
        name: "q1",
        what: "projection, currency conversion",
        flink_per_core: 157_940.0,
        sql: "SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM bid;",
        reads_bids: true,
    },
    Nexmark {
        name: "q2",
        what: "filter on auction ids",
        flink_per_core: 175_210.0,
        sql: "SELECT auction, price FROM bid WHERE auction % 123 = 0;",
        reads_bids: true,
    },
    Nexmark {
        name: "q5",
        what: "hot items: HOP 10 s / 2 s count per auction, the max per window",
        flink_per_core: 22_140.0,
        sql: "SELECT auction, num, window_end FROM (
                SELECT auction, num, window_end, max(num) OVER (PARTITION BY window_end) AS maxn
                FROM (SELECT window_start, window_end, auction, count(*) AS num
                      FROM HOP(bid, date_time, INTERVAL '2' SECOND, INTERVAL '10' SECOND)
                      GROUP BY window_start, window_end, auction))
              WHERE num >= maxn;",
        reads_bids: true,
    },
    Nexmark {
        name: "q7",
        what: "highest bid: TUMBLE 10 s max price, joined back to the bids",
        flink_per_core: 12_330.0,
        sql: "SELECT b.auction, b.bidder, b.price, b.date_time, b.extra
              FROM TUMBLE(bid, date_time, INTERVAL '10' SECOND) b
              JOIN (SELECT window_start, window_end, max(price) AS maxprice
                    FROM TUMBLE(bid, date_time, INTERVAL '10' SECOND)
                    GROUP BY window_start, window_end) w
                ON b.window_start = w.window_start AND b.price = w.maxprice;",
        reads_bids: true,
    },
    Nexmark {
        name: "q8",
        what: "new users: persons and sellers of the same 10 s window (window join)",
        flink_per_core: 146_140.0,
        sql: "SELECT p.id, p.name, p.window_start
              FROM (SELECT window_start, window_end, id, name
                    FROM TUMBLE(person, date_time, INTERVAL '10' SECOND)
                    GROUP BY window_start, window_end, id, name) p
              JOIN (SELECT window_start, window_end, seller
                    FROM TUMBLE(auction, date_time, INTERVAL '10' SECOND)
                    GROUP BY window_start, window_end, seller) a
                ON p.id = a.seller AND p.window_start = a.window_start;",
        reads_bids: false,
    },
];

/// The three Nexmark streams over the files at `paths` (person, auction,
/// bid), with Flink's watermark delay of the nexmark project (4 s).
fn nexmark_ddl(paths: &[PathBuf; 3], reads_bids: bool) -> String {
    let stream = |name: &str, columns: &str, path: &Path| {
        format!(
            "CREATE STREAM {name} ({columns},
               WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND)
               WITH (connector = 'file', path = '{}', format = 'csv');\n",
            path.display()
        )
    };
    if reads_bids {
        stream(
            "bid",
            "auction BIGINT, bidder BIGINT, price BIGINT, channel TEXT, url TEXT, \
             date_time TIMESTAMP, extra TEXT",
            &paths[2],
        )
    } else {
        stream(
            "person",
            "id BIGINT, name TEXT, email_address TEXT, credit_card TEXT, city TEXT, \
             state TEXT, date_time TIMESTAMP, extra TEXT",
            &paths[0],
        ) + &stream(
            "auction",
            "id BIGINT, item_name TEXT, description TEXT, initial_bid BIGINT, reserve BIGINT, \
             date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT, extra TEXT",
            &paths[1],
        )
    }
}

/// The Nexmark rows: vigil, with events/s per core beside Flink's.
fn nexmark_rows(ctx: &Ctx, spec: NexmarkSpec) -> Result<Vec<(Row, f64)>, String> {
    let paths = data::write_nexmark(&ctx.cache, spec).map_err(|e| e.to_string())?;
    let counts = data::nexmark_counts(spec);
    let mut out = Vec::new();
    for q in NEXMARK {
        let (events, bytes) = if q.reads_bids {
            (counts.bids, file_size(&paths[2]))
        } else {
            (
                counts.persons + counts.auctions,
                file_size(&paths[0]) + file_size(&paths[1]),
            )
        };
        let r = row(&format!("nexmark {}", q.name), q.what, "CSV", events, bytes);
        let script = format!("{}{}", nexmark_ddl(&paths, q.reads_bids), q.sql);
        out.push((run_vigil(ctx, r, &script, events), q.flink_per_core));
    }
    Ok(out)
}

/// The batch peers' SQL of Q1 and Q4 over table `m`: a GROUP BY on the
/// window start (`ts - ts % 10000`, ts in epoch ms).
fn peer_sql(query: &str) -> String {
    let aggregates = match query {
        "q1" => "avg(cpu) AS avg_cpu, max(cpu) AS max_cpu, count(*) AS n",
        _ => "median(cpu) AS median_cpu",
    };
    format!(
        "SELECT host, ts - ts % 10000 AS window_start, {aggregates} \
         FROM m GROUP BY host, ts - ts % 10000"
    )
}

/// A Python with DuckDB, in a venv under the cache (installed with pip on
/// first use unless `no_install`), or why there is none.
fn duckdb_python(cache: &Path, no_install: bool) -> Result<PathBuf, String> {
    let venv = cache.join("duckdb-venv");
    let python = venv.join("bin/python");
    let has_duckdb = |python: &Path| {
        Command::new(python)
            .args(["-c", "import duckdb"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if has_duckdb(&python) {
        return Ok(python);
    }
    if no_install {
        return Err("DuckDB is not installed (--no-install given)".into());
    }
    eprintln!("installing DuckDB into {} ...", venv.display());
    let made = Command::new("python3")
        .arg("-m")
        .arg("venv")
        .arg(&venv)
        .output()
        .map_err(|e| format!("python3 -m venv: {e}"))?;
    if !made.status.success() {
        return Err(format!(
            "python3 -m venv failed: {}",
            String::from_utf8_lossy(&made.stderr).trim()
        ));
    }
    let pip = Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "duckdb"])
        .output()
        .map_err(|e| format!("pip: {e}"))?;
    if !pip.status.success() || !has_duckdb(&python) {
        return Err(format!(
            "pip install duckdb failed: {}",
            String::from_utf8_lossy(&pip.stderr).trim()
        ));
    }
    Ok(python)
}

/// DuckDB's script: the aggregation materialized into a temporary table,
/// timed inside Python (interpreter start and import excluded).
fn duckdb_script(csv: &Path, sql: &str, threads: usize) -> String {
    let table = format!(
        "read_csv('{}', header = true, columns = {{'ts': 'BIGINT', 'host': 'VARCHAR', 'cpu': 'DOUBLE'}})",
        csv.display()
    );
    let sql = sql.replace("FROM m ", &format!("FROM {table} "));
    format!(
        "import duckdb, time, resource\n\
         con = duckdb.connect()\n\
         con.execute('SET threads = {threads}')\n\
         def cpu():\n    r = resource.getrusage(resource.RUSAGE_SELF)\n    return r.ru_utime + r.ru_stime\n\
         c0, t0 = cpu(), time.perf_counter()\n\
         con.execute(\"\"\"CREATE TEMP TABLE r AS {sql}\"\"\")\n\
         out = con.execute('SELECT count(*) FROM r').fetchone()[0]\n\
         print(f'out={{out}} secs={{time.perf_counter() - t0:.6f}} cpu={{cpu() - c0:.6f}}')\n"
    )
}

/// Q1 and Q4 as batch queries in DataFusion and DuckDB over the CSV.
fn peer_rows(ctx: &Ctx, spec: MetricsSpec, no_install: bool) -> Result<(Vec<Row>, String), String> {
    let (csv, _) = data::write_metrics(&ctx.cache, spec).map_err(|e| e.to_string())?;
    let bytes = file_size(&csv);
    let threads = ctx.parallelism;
    let mut rows = Vec::new();
    for query in ["q1", "q4"] {
        let sql = peer_sql(query);
        let r = row(
            &format!("datafusion {query}"),
            &format!(
                "{} as a batch GROUP BY, {threads} partitions",
                query.to_uppercase()
            ),
            "CSV",
            spec.rows,
            bytes,
        );
        let args = [
            "__datafusion".to_string(),
            "--csv".into(),
            csv.display().to_string(),
            "--sql".into(),
            sql,
            "--threads".into(),
            threads.to_string(),
        ];
        rows.push(run_self(ctx, r, &args));
    }
    let duck_note = match duckdb_python(&ctx.cache, no_install) {
        Ok(python) => {
            for query in ["q1", "q4"] {
                let script = duckdb_script(&csv, &peer_sql(query), threads);
                let r = row(
                    &format!("duckdb {query}"),
                    &format!(
                        "{} as a batch GROUP BY, {threads} threads",
                        query.to_uppercase()
                    ),
                    "CSV",
                    spec.rows,
                    bytes,
                );
                rows.push(run_reporting(ctx, r, || {
                    let mut c = Command::new(&python);
                    c.args(["-c", &script]);
                    c
                }));
            }
            String::new()
        }
        Err(e) => format!("DuckDB: missing ({e})"),
    };
    Ok((rows, duck_note))
}

/// Whether `vigil run --help` mentions `--parallelism`.
fn vigil_has_parallelism(vigil: &Path) -> bool {
    Command::new(vigil)
        .args(["run", "--help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("--parallelism"))
        .unwrap_or(false)
}

fn default_vigil() -> PathBuf {
    // This program is target/release/deps/harness-<hash>.
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("vigil")))
        .unwrap_or_else(|| PathBuf::from("vigil"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match &cli.child {
        Some(ChildCommand::Session { csv, query }) => inproc::session_q1(csv, query),
        Some(ChildCommand::DataFusion { csv, sql, threads }) => {
            inproc::datafusion_batch(csv, sql, *threads)
        }
        None => harness(&cli),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn harness(cli: &Cli) -> Result<(), String> {
    let rows = cli
        .rows
        .unwrap_or(if cli.quick { 1_000_000 } else { 10_000_000 });
    let vigil = cli.vigil.clone().unwrap_or_else(default_vigil);
    if !vigil.exists() {
        return Err(format!(
            "no vigil binary at {} (build it with `cargo build --release`, or pass --vigil)",
            vigil.display()
        ));
    }
    let cache = cli
        .cache
        .clone()
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/out/harness"));
    std::fs::create_dir_all(&cache).map_err(|e| format!("{}: {e}", cache.display()))?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let parallelism = cli.parallelism.unwrap_or(cores);
    let parallel_flag = vigil_has_parallelism(&vigil);
    let vigil_args = if parallel_flag {
        vec!["--parallelism".to_string(), parallelism.to_string()]
    } else {
        Vec::new()
    };
    let ctx = Ctx {
        vigil,
        cache,
        vigil_args,
        parallelism,
        parallel_flag,
        runs: cli.runs.unwrap_or(if cli.quick { 1 } else { 3 }).max(1),
        timeout: Duration::from_secs(cli.timeout),
        only: cli.only.clone(),
    };
    let spec = MetricsSpec {
        seed: cli.seed,
        rows,
        hosts: cli.hosts,
    };
    let many = MetricsSpec {
        hosts: cli.many_hosts,
        ..spec
    };
    eprintln!(
        "generating data into {} (reused when present) ...",
        ctx.cache.display()
    );
    let mut all = streaming_rows(&ctx, spec, many)?;
    let nexmark = if ctx.wants("nexmark") {
        let nspec = NexmarkSpec {
            seed: cli.seed,
            events: rows,
            rate: 10_000,
        };
        nexmark_rows(&ctx, nspec)?
    } else {
        Vec::new()
    };
    let mut duck_note = String::new();
    if ctx.wants("peers") {
        let (peers, note) = peer_rows(&ctx, spec, cli.no_install)?;
        all.extend(peers);
        duck_note = note;
    }
    ratios(&mut all, cli.hosts, cli.many_hosts);
    let duration = Duration::from_secs_f64(if cli.quick { 0.5 } else { 2.0 });
    let mut latencies = Vec::new();
    if ctx.wants("latency") {
        for &rate in &cli.latency_rates {
            eprintln!("  latency at {rate} rows/s offered ...");
            let dir = ctx.cache.join("latency");
            let measured = latency::per_record(
                &ctx.vigil,
                &dir,
                &ctx.vigil_args,
                rate,
                duration,
                ctx.timeout,
            );
            latencies.push((rate, measured));
        }
    }
    let startup = if ctx.wants("startup") {
        Some(latency::startup(
            &ctx.vigil,
            &ctx.cache.join("latency"),
            &ctx.vigil_args,
            9,
        ))
    } else {
        None
    };

    let mut report = String::new();
    let _ = writeln!(report, "\nmachine: {}", machine());
    let _ = writeln!(
        report,
        "vigil: {}; parallelism {}{}; {} run(s) per query, medians; seed {}, {} rows, {} hosts (Q6: {})\n",
        ctx.vigil.display(),
        if ctx.parallel_flag {
            ctx.parallelism
        } else {
            1
        },
        if ctx.parallel_flag {
            " (--parallelism)"
        } else {
            " (vigil run has no --parallelism flag yet)"
        },
        ctx.runs,
        cli.seed,
        rows,
        cli.hosts,
        cli.many_hosts
    );
    report.push_str(&table(&all));
    if !duck_note.is_empty() {
        let _ = writeln!(report, "\n{duck_note}");
    }
    if !latencies.is_empty() {
        report.push('\n');
    }
    for (rate, l) in &latencies {
        report.push_str(&latency_line(l, *rate));
    }
    if let Some(s) = &startup {
        let _ = match s {
            Ok(ms) => writeln!(report, "start-up to first result: {ms:.1} ms (median of 9)"),
            Err(e) => writeln!(report, "start-up to first result: failed: {e}"),
        };
    }
    if !nexmark.is_empty() {
        report.push_str("\nNexmark (events of the streams each query reads; per core = events / CPU seconds of the vigil process):\n\n");
        report.push_str(&nexmark_table(&nexmark));
    }
    let extra = Extra {
        nexmark: &nexmark,
        latency: latencies.first().and_then(|(_, l)| l.as_ref().ok()),
        latency_rate: cli.latency_rates.first().copied().unwrap_or(0),
        startup_ms: startup.and_then(Result::ok),
        parallelism: if ctx.parallel_flag {
            ctx.parallelism
        } else {
            1
        },
    };
    report.push_str("\nTargets (issue 11):\n\n");
    report.push_str(&targets(&all, &extra));
    println!("{report}");
    Ok(())
}
