use std::collections::BTreeMap;

use datafusion::arrow::array::{
    Array, AsArray, Float64Array, RecordBatch, StringArray, TimestampMillisecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema};
use datafusion::datasource::MemTable;
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::SessionContext;

use super::*;

/// A session with vigil's functions, as `SqlPlanner` builds its state,
/// and a table `t(g, host, v)`: partition `a` is the 1-D example of
/// `dbscan` and partition `b` that of `robust_z`.
fn session() -> SessionContext {
    let mut state = SessionStateBuilder::new().with_default_features().build();
    register(&mut state).unwrap();
    let ctx = SessionContext::new_with_state(state);
    let rows = [
        ("a", "a1", Some(1.0)),
        ("b", "b1", Some(10.0)),
        ("a", "a2", Some(2.0)),
        ("a", "a3", Some(2.5)),
        ("b", "b2", Some(11.0)),
        ("a", "a4", Some(10.0)),
        ("b", "b3", Some(9.0)),
        ("a", "a5", Some(11.0)),
        ("b", "b4", Some(10.0)),
        ("a", "a6", Some(30.0)),
        ("b", "b5", Some(50.0)),
        ("b", "b6", None),
    ];
    let schema = Arc::new(Schema::new(vec![
        Field::new("g", DataType::Utf8, false),
        Field::new("host", DataType::Utf8, false),
        Field::new("v", DataType::Float64, true),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.2))),
        ],
    )
    .unwrap();
    let table = MemTable::try_new(schema, vec![vec![batch]]).unwrap();
    ctx.register_table("t", Arc::new(table)).unwrap();
    ctx
}

/// Runs `sql`, returning host -> (cluster, score).
async fn run(ctx: &SessionContext, sql: &str) -> BTreeMap<String, (Option<i64>, Option<f64>)> {
    let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    let mut out = BTreeMap::new();
    for batch in batches {
        let hosts = batch.column(0).as_string::<i32>();
        let clusters = batch.column(1).as_primitive::<Int64Type>();
        let scores = batch.column(2).as_primitive::<Float64Type>();
        for i in 0..batch.num_rows() {
            let cluster = clusters.is_valid(i).then(|| clusters.value(i));
            let score = scores.is_valid(i).then(|| scores.value(i));
            out.insert(hosts.value(i).to_string(), (cluster, score));
        }
    }
    out
}

#[tokio::test]
async fn peer_functions_run_through_datafusion_sql() {
    let ctx = session();
    // ORDER BY host fixes the row order the functions see, and so the
    // numbering of the clusters.
    let rows = run(
        &ctx,
        "SELECT host, dbscan(1.0, 2, v) OVER (PARTITION BY g ORDER BY host) AS c, \
                    robust_z(v) OVER (PARTITION BY g ORDER BY host) AS z FROM t",
    )
    .await;
    let clusters: Vec<_> = rows.iter().map(|(h, (c, _))| (h.as_str(), *c)).collect();
    assert_eq!(
        clusters,
        vec![
            ("a1", Some(0)),
            ("a2", Some(0)),
            ("a3", Some(0)),
            ("a4", Some(1)),
            ("a5", Some(1)),
            ("a6", Some(-1)),
            // b: 9, 10, 10, 11 chain within 1; 50 alone; NULL is NULL.
            ("b1", Some(0)),
            ("b2", Some(0)),
            ("b3", Some(0)),
            ("b4", Some(0)),
            ("b5", Some(-1)),
            ("b6", None),
        ]
    );
    // b: median 10, MAD 1 (the NULL left out).
    for (host, expected) in [
        ("b1", Some(0.0)),
        ("b2", Some(0.6745)),
        ("b3", Some(-0.6745)),
        ("b4", Some(0.0)),
        ("b5", Some(26.98)),
        ("b6", None),
    ] {
        let actual = rows[host].1;
        assert!(
            match (actual, expected) {
                (Some(a), Some(e)) => (a - e).abs() < 1e-9,
                (a, e) => a == e,
            },
            "{host}: {actual:?}, expected {expected:?}"
        );
    }
    // a: median (2.5 + 10) / 2 = 6.25; deviations 5.25, 4.25, 3.75,
    // 3.75, 4.75, 23.75 -> MAD (4.25 + 4.75) / 2 = 4.5.
    let a1 = rows["a1"].1.unwrap();
    assert!((a1 - 0.6745 * (1.0 - 6.25) / 4.5).abs() < 1e-9, "{a1}");

    // Without ORDER BY (the frame the planner uses) the numbering may
    // follow any row order, but the clusters are the same.
    let unordered = run(
        &ctx,
        "SELECT host, dbscan(1.0, 2, v) OVER (PARTITION BY g) AS c, \
                    robust_z(v) OVER (PARTITION BY g) AS z FROM t",
    )
    .await;
    let label = |h: &str| unordered[h].0;
    assert_eq!(label("a1"), label("a2"));
    assert_eq!(label("a1"), label("a3"));
    assert_eq!(label("a4"), label("a5"));
    assert_ne!(label("a1"), label("a4"));
    assert_eq!(label("a6"), Some(-1));
    assert_eq!(label("b5"), Some(-1));
    assert_eq!(label("b6"), None);
    assert_eq!(unordered["b5"].1, rows["b5"].1);

    // Integer features and scores, coerced to DOUBLE.
    let ints = run(
        &ctx,
        "SELECT host, dbscan(1, 2, CAST(v AS INT)) OVER (PARTITION BY g ORDER BY host), \
                    robust_z(CAST(v AS INT)) OVER (PARTITION BY g ORDER BY host) FROM t",
    )
    .await;
    assert_eq!(ints["b5"], rows["b5"]);
    assert_eq!(ints["a3"].0, Some(0));
}

#[tokio::test]
async fn bad_dbscan_arguments_fail_with_clear_errors() {
    let ctx = session();
    let error = async |sql: &str| match ctx.sql(sql).await {
        Ok(frame) => frame.collect().await.unwrap_err().to_string(),
        Err(e) => e.to_string(),
    };
    let message = error("SELECT dbscan(-1, 2, v) OVER (PARTITION BY g) FROM t").await;
    assert!(
        message.contains("dbscan: eps must be a positive number, got -1"),
        "{message}"
    );
    let message = error("SELECT dbscan(1.0, 2.5, v) OVER (PARTITION BY g) FROM t").await;
    assert!(
        message.contains("dbscan: min_pts must be a positive integer"),
        "{message}"
    );
    let message = error("SELECT dbscan(1.0, 2) OVER (PARTITION BY g) FROM t").await;
    assert!(message.contains("at least one feature column"), "{message}");
    let message = error("SELECT robust_z(host) OVER (PARTITION BY g) FROM t").await;
    assert!(
        message.contains("robust_z needs a numeric argument"),
        "{message}"
    );
}

/// A table `s(ts, g, v)`: `a` at 0, 10, 20, 40, 50, 60, 70 s with
/// values 1, 2, 3, 4, 100, 9, 11 (listed out of order), `b` one row.
fn history_session() -> SessionContext {
    let mut state = SessionStateBuilder::new().with_default_features().build();
    register(&mut state).unwrap();
    let ctx = SessionContext::new_with_state(state);
    let rows = [
        (60, "a", Some(9.0)),
        (0, "a", Some(1.0)),
        (20, "a", Some(3.0)),
        (10, "a", Some(2.0)),
        (5, "b", None),
        (70, "a", Some(11.0)),
        (40, "a", Some(4.0)),
        (50, "a", Some(100.0)),
    ];
    let schema = Arc::new(Schema::new(vec![
        Field::new(
            "ts",
            DataType::Timestamp(datafusion::arrow::datatypes::TimeUnit::Millisecond, None),
            false,
        ),
        Field::new("g", DataType::Utf8, false),
        Field::new("v", DataType::Float64, true),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(TimestampMillisecondArray::from_iter_values(
                rows.iter().map(|r| r.0 * 1000),
            )),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.2))),
        ],
    )
    .unwrap();
    let table = MemTable::try_new(schema, vec![vec![batch]]).unwrap();
    ctx.register_table("s", Arc::new(table)).unwrap();
    ctx
}

/// The DOUBLE columns after the first of `sql`'s rows, in its order.
async fn doubles(ctx: &SessionContext, sql: &str) -> Vec<Vec<Option<f64>>> {
    let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    let mut rows = Vec::new();
    for batch in batches {
        for i in 0..batch.num_rows() {
            let row = (1..batch.num_columns())
                .map(|c| {
                    let column = batch.column(c).as_primitive::<Float64Type>();
                    column.is_valid(i).then(|| column.value(i))
                })
                .collect();
            rows.push(row);
        }
    }
    rows
}

fn assert_close(actual: Option<f64>, expected: Option<f64>, what: &str) {
    assert!(
        match (actual, expected) {
            (Some(a), Some(e)) => (a - e).abs() < 1e-12 * e.abs().max(1.0),
            (a, e) => a == e,
        },
        "{what}: {actual:?}, expected {expected:?}"
    );
}

#[tokio::test]
async fn history_functions_run_through_datafusion_sql() {
    let ctx = history_session();
    // a: sorted gaps 10, 10, 20, 10, 10, 10 -> 10 s; b: one timestamp.
    let rows = doubles(&ctx, "SELECT g, cadence(ts) FROM s GROUP BY g ORDER BY g").await;
    assert_eq!(rows, vec![vec![Some(10.0)], vec![None]]);

    // Over a's history in time order, as a growing frame (DataFusion's
    // window operator slides a frame only with retract_batch).
    let rows = doubles(
        &ctx,
        "SELECT ts, change_score(v, 1) OVER w, change_score(CAST(v AS INT), 2) OVER w, \
                    seasonal_z(v, 2) OVER w, cadence(ts) OVER w, \
                    cusum(v, 0.5, 5, 2) OVER w \
             FROM s WHERE g = 'a' \
             WINDOW w AS (ORDER BY ts ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) \
             ORDER BY ts",
    )
    .await;
    assert_eq!(rows.len(), 7);
    // Row 3: 3 against 1, 2 (median 1.5, MAD 0.5).
    assert_close(rows[2][0], Some(1.5 / (1.4826 * 0.5)), "change_score row 3");
    for row in &rows[..2] {
        assert_eq!(row[0], None);
    }
    let last = &rows[6];
    // 11 against 1, 2, 3, 4, 100, 9: median 3.5, MAD 2, but the
    // standard deviation, the scale's floor, is larger.
    let sd = |xs: &[f64]| {
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        (xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / xs.len() as f64).sqrt()
    };
    let scale = sd(&[1.0, 2.0, 3.0, 4.0, 100.0, 9.0]);
    assert_close(last[0], Some(7.5 / scale), "change_score(v, 1)");
    // 9, 11 against 1, 2, 3, 4, 100: median 3, and the sd again.
    let scale = sd(&[1.0, 2.0, 3.0, 4.0, 100.0]);
    assert_close(last[1], Some(7.0 / scale), "change_score(v, 2)");
    // 11 against v[4], v[2], v[0] = 100, 3, 1 (median 3); differences
    // 2, 2, 97, 5: median 3.5, MAD 1.5.
    let scale = 1.4826 * 1.5 / 2f64.sqrt();
    assert_close(last[2], Some(8.0 / scale), "seasonal_z");
    assert_close(last[3], Some(10.0), "cadence");
    assert_eq!(rows[0][3], None);
    // cusum with warmup 2: 1, 2 warm up (mean 1.5, sd 0.5); 3: z = 3,
    // S+ = 2.5; 4: mean 2, sd sqrt(2 / 3), S+ = 2.5 + 2 / sqrt(2 / 3)
    // - 0.5; 100: mean 2.5, sd sqrt(5 / 4), S+ passes 5, so the
    // reference restarts at {100}; 9 warms it up; 11: mean 54.5, sd
    // 45.5, z = -43.5 / 45.5, S- = -z - 0.5.
    let cusum: Vec<Option<f64>> = rows.iter().map(|row| row[4]).collect();
    let s4 = 2.0 + 2.0 / (2.0f64 / 3.0).sqrt();
    let s100 = s4 + 97.5 / 1.25f64.sqrt() - 0.5;
    let s11 = -(43.5 / 45.5 - 0.5);
    let expected = [None, None, Some(2.5), Some(s4), Some(s100), None, Some(s11)];
    for (i, (actual, expected)) in cusum.into_iter().zip(expected).enumerate() {
        assert_close(actual, expected, &format!("cusum row {i}"));
    }
}

#[tokio::test]
async fn bad_history_function_arguments_fail_with_clear_errors() {
    let ctx = history_session();
    let error = async |sql: &str| match ctx.sql(sql).await {
        Ok(frame) => frame.collect().await.unwrap_err().to_string(),
        Err(e) => e.to_string(),
    };
    for (sql, expected) in [
        (
            "SELECT cadence(v) FROM s",
            "cadence needs a TIMESTAMP argument",
        ),
        (
            "SELECT cadence(ts, ts) FROM s",
            "cadence takes one argument",
        ),
        (
            "SELECT change_score(g, 1) FROM s",
            "change_score(x, n) needs a numeric x",
        ),
        (
            "SELECT change_score(v, g) FROM s",
            "change_score(x, n) needs an integer n",
        ),
        (
            "SELECT change_score(v, 0) FROM s",
            "change_score: n must be a positive integer literal",
        ),
        (
            "SELECT seasonal_z(v, 2.5) FROM s",
            "seasonal_z: period must be a positive integer literal",
        ),
        (
            "SELECT seasonal_z(v) FROM s",
            "seasonal_z takes two arguments",
        ),
        (
            "SELECT cusum(g, 0.5, 5) FROM s",
            "cusum(x, k, h) needs a numeric x, got Utf8",
        ),
        (
            "SELECT cusum(v, 0.5) FROM s",
            "cusum takes three or four arguments (x, k, h [, warmup]), got 2",
        ),
        (
            "SELECT cusum(v, 0.5, v) FROM s",
            "cusum: h must be a number literal > 0",
        ),
    ] {
        let message = error(sql).await;
        assert!(message.contains(expected), "{sql}: {message}");
    }
}
