//! vigil's SQL functions: DataFusion's built-ins, with overrides where
//! vigil's semantics differ and additions for robust statistics,
//! registered with the SQL planner.
//!
//! The JSON functions of `datafusion-functions-json` (`json_get`,
//! `json_get_str`, `json_contains`, ... and the `->`, `->>`, `?` operators)
//! read a TEXT column that holds JSON.
//!
//! `counter_increase(ts, value)` and `counter_irate(ts, value)` read a
//! counter as Prometheus does, resets included (what `vigil import-rules`
//! translates `rate`, `increase` and `irate` to).
//!
//! Window functions for peer comparisons score or cluster every row of a
//! partition against all its rows: `robust_z(x)` and
//! `dbscan(eps, min_pts, x1, ...)`, called as
//! `f(...) OVER (PARTITION BY window_end)`; [`check_dbscan_args`] checks a
//! `dbscan` call's literals when the query is planned.

mod counter;
mod dbscan;
mod ewma;
mod mad;
mod median;
mod robust_z;
mod sketch;

pub use dbscan::check_dbscan_args;
pub use ewma::check_ewma_args;

use std::sync::Arc;

use datafusion::execution::FunctionRegistry;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::{AggregateUDF, WindowUDF};

use crate::error::Result;

/// Registers vigil's functions in `state`, replacing built-ins of the same
/// name.
pub fn register(state: &mut SessionState) -> Result<()> {
    if let Some(builtin) = state.aggregate_functions().get("median").cloned() {
        state.register_udaf(Arc::new(AggregateUDF::from(median::ExactMedian::new(
            builtin,
        ))))?;
    }
    state.register_udaf(Arc::new(AggregateUDF::from(mad::Mad::default())))?;
    for kind in [counter::CounterKind::Increase, counter::CounterKind::Irate] {
        state.register_udaf(Arc::new(AggregateUDF::from(counter::Counter::new(kind))))?;
    }
    state.register_udaf(Arc::new(AggregateUDF::from(ewma::Ewma::default())))?;
    state.register_udaf(Arc::new(AggregateUDF::from(
        sketch::ApproxPercentile::default(),
    )))?;
    state.register_udwf(Arc::new(WindowUDF::from(robust_z::RobustZ::default())))?;
    state.register_udwf(Arc::new(WindowUDF::from(dbscan::Dbscan::default())))?;
    datafusion_functions_json::register_all(state)?;
    Ok(())
}

/// Checks, when a query is planned, the constant arguments of a window
/// function call that vigil can check early (`dbscan`'s eps and min_pts,
/// `ewma`'s alpha).
pub fn check_window_call(expr: &datafusion::logical_expr::Expr) -> Result<()> {
    use datafusion::logical_expr::{Expr, WindowFunctionDefinition};
    let Expr::WindowFunction(call) = expr.clone().unalias() else {
        return Ok(());
    };
    match &call.fun {
        WindowFunctionDefinition::WindowUDF(udf) if udf.name() == "dbscan" => {
            check_dbscan_args(&call.params.args)
        }
        WindowFunctionDefinition::AggregateUDF(udaf) if udaf.name() == "ewma" => {
            check_ewma_args(&call.params.args)
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use datafusion::arrow::array::{Array, AsArray, Float64Array, RecordBatch, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema};
    use datafusion::datasource::MemTable;
    use datafusion::execution::SessionStateBuilder;
    use datafusion::logical_expr::{LogicalPlanBuilder, lit};
    use datafusion::prelude::SessionContext;
    use datafusion::sql::sqlparser::ast::Statement;
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    use super::*;
    use crate::plan::{Catalog, SqlPlanner};

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

    #[test]
    fn vigils_planner_knows_the_window_functions() {
        let mut catalog = Catalog::default();
        let rows = LogicalPlanBuilder::values(vec![vec![lit("a"), lit("h1"), lit(1.0)]])
            .unwrap()
            .project(vec![
                datafusion::logical_expr::col("column1").alias("g"),
                datafusion::logical_expr::col("column2").alias("host"),
                datafusion::logical_expr::col("column3").alias("v"),
            ])
            .unwrap()
            .build()
            .unwrap();
        catalog.add_view("t", rows).unwrap();
        let sql = "SELECT host, dbscan(0.5, 2, v) OVER (PARTITION BY g) AS c, \
                   robust_z(v) OVER (PARTITION BY g) AS z FROM t";
        let Statement::Query(query) = Parser::parse_sql(&GenericDialect {}, sql)
            .unwrap()
            .remove(0)
        else {
            panic!("not a query")
        };
        let plan = SqlPlanner::new().plan_query(&catalog, &query).unwrap();
        let schema = plan.schema();
        assert_eq!(
            schema.field_with_unqualified_name("c").unwrap().data_type(),
            &DataType::Int64
        );
        assert_eq!(
            schema.field_with_unqualified_name("z").unwrap().data_type(),
            &DataType::Float64
        );
        let text = plan.display_indent().to_string();
        assert!(text.contains("dbscan("), "{text}");
        assert!(text.contains("robust_z("), "{text}");
    }
}
