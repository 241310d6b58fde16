//! `dbscan(eps, min_pts, x1 [, x2, ...])`: which rows of a partition
//! cluster together, and which stand alone: the DBSCAN cluster label of
//! each row, with scikit-learn's semantics.
//!
//! A window function over a whole partition, for peer comparisons: within
//! one window of results (the per-host averages of one minute, say),
//! `dbscan(5.0, 3, avg_cpu, avg_mem) OVER (PARTITION BY window_end)` labels
//! every host of that window; hosts labelled -1 are like no other group of
//! hosts.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Float64Type, Int64Type};
use datafusion::common::{ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::function::{PartitionEvaluatorArgs, WindowUDFFieldArgs};
use datafusion::logical_expr::{Expr, PartitionEvaluator, Signature, Volatility, WindowUDFImpl};

use crate::error::Error;

/// The label of a row that belongs to no cluster.
pub const NOISE: i64 = -1;

/// `dbscan(eps, min_pts, x1 [, x2, ...]) OVER (PARTITION BY ...)`: the
/// DBSCAN cluster label (BIGINT) of each row among the rows of its
/// partition, as scikit-learn's `DBSCAN(eps, min_samples=min_pts)` gives
/// it:
///
/// - the distance between two rows is the Euclidean distance between their
///   features `x1 .. xn` (any numeric type, taken as DOUBLE);
/// - a row's neighbourhood is every row at distance `<= eps`, the row
///   itself included; a *core* row has at least `min_pts` rows in its
///   neighbourhood;
/// - a cluster is every row reachable from a core row through
///   neighbourhoods of core rows. A border row (not core, but in a core
///   row's neighbourhood) joins the first cluster that reaches it;
/// - clusters are numbered 0, 1, 2, ... in the order their first core row
///   comes in the partition; rows in no cluster are noise, labelled -1.
///
/// A row with a NULL, NaN or infinite feature gets NULL and takes no part
/// in the clustering (it is no one's neighbour).
///
/// `eps` (a positive number) and `min_pts` (a positive integer) must be
/// literals: [`check_dbscan_args`] checks them when the query is planned,
/// the evaluator again on the values it gets. With `min_pts = 1` every row
/// is core, so there is no noise.
///
/// The function ignores `ORDER BY` and the frame of its `OVER` clause: it
/// always clusters the whole partition. Its row order decides only the
/// numbering of the clusters and which cluster a border row between two
/// clusters joins; `ORDER BY` in the `OVER` clause fixes that order.
///
/// Cost: with one feature the rows are sorted and each neighbourhood is a
/// run of the sorted rows, `O(n log n)` plus the size of the core rows'
/// neighbourhoods. With more features every pair of rows is compared, up to
/// twice: `O(n^2)` time, fine for a few thousand rows (keys) per partition;
/// memory is `O(n)` either way.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Dbscan {
    signature: Signature,
}

impl Default for Dbscan {
    fn default() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl WindowUDFImpl for Dbscan {
    fn name(&self) -> &str {
        "dbscan"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> datafusion::error::Result<Vec<DataType>> {
        let [eps, min_pts, features @ ..] = arg_types else {
            return plan_err!("{}", arity_message(arg_types.len()));
        };
        if features.is_empty() {
            return plan_err!("{}", arity_message(arg_types.len()));
        }
        if !(eps.is_numeric() || eps.is_null()) {
            return plan_err!("dbscan: eps must be a positive number, got a {eps}");
        }
        if !(min_pts.is_integer() || min_pts.is_null()) {
            return plan_err!("dbscan: min_pts must be a positive integer, got a {min_pts}");
        }
        if let Some(t) = features.iter().find(|t| !(t.is_numeric() || t.is_null())) {
            return plan_err!("dbscan needs numeric features, got {t}");
        }
        let mut types = vec![DataType::Float64, DataType::Int64];
        types.resize(arg_types.len(), DataType::Float64);
        Ok(types)
    }

    fn field(&self, field_args: WindowUDFFieldArgs) -> datafusion::error::Result<FieldRef> {
        Ok(Arc::new(Field::new(
            field_args.name(),
            DataType::Int64,
            true,
        )))
    }

    fn partition_evaluator(
        &self,
        _args: PartitionEvaluatorArgs,
    ) -> datafusion::error::Result<Box<dyn PartitionEvaluator>> {
        Ok(Box::new(DbscanEvaluator))
    }
}

fn arity_message(n: usize) -> String {
    format!("dbscan takes eps, min_pts and at least one feature column, got {n} arguments")
}

/// Checks the arguments of a `dbscan` call as the query is planned, before
/// any row arrives: at least three arguments; `eps` a numeric literal
/// greater than 0; `min_pts` an integer literal greater than 0. A literal
/// may be negated or cast (as type coercion leaves it). The features are
/// not checked here.
pub fn check_dbscan_args(args: &[Expr]) -> crate::error::Result<()> {
    let [eps, min_pts, _, ..] = args else {
        return Err(Error::Plan(arity_message(args.len())));
    };
    match constant(eps) {
        Some(v) if v.data_type().is_numeric() && as_f64(&v).is_some_and(|e| e > 0.0) => {}
        Some(v) => {
            return Err(Error::Plan(format!(
                "dbscan: eps must be a positive number, got {}",
                shown(&v)
            )));
        }
        None => {
            return Err(Error::Plan(format!(
                "dbscan: eps must be a positive number literal, got {eps}"
            )));
        }
    }
    match constant(min_pts) {
        Some(v) if v.data_type().is_integer() && as_i64(&v).is_some_and(|m| m > 0) => {}
        Some(v) => {
            return Err(Error::Plan(format!(
                "dbscan: min_pts must be a positive integer, got {}",
                shown(&v)
            )));
        }
        None => {
            return Err(Error::Plan(format!(
                "dbscan: min_pts must be a positive integer literal, got {min_pts}"
            )));
        }
    }
    Ok(())
}

/// The value of a literal, possibly negated or cast; `None` for anything
/// else.
fn constant(expr: &Expr) -> Option<ScalarValue> {
    match expr {
        Expr::Literal(value, _) => Some(value.clone()),
        Expr::Negative(inner) => constant(inner)?.arithmetic_negate().ok(),
        Expr::Cast(c) => constant(&c.expr)?.cast_to(c.field.data_type()).ok(),
        Expr::TryCast(c) => constant(&c.expr)?.cast_to(c.field.data_type()).ok(),
        _ => None,
    }
}

fn as_f64(value: &ScalarValue) -> Option<f64> {
    match value.cast_to(&DataType::Float64).ok()? {
        ScalarValue::Float64(v) => v,
        _ => None,
    }
}

fn as_i64(value: &ScalarValue) -> Option<i64> {
    match value.cast_to(&DataType::Int64).ok()? {
        ScalarValue::Int64(v) => v,
        _ => None,
    }
}

/// A literal as the user wrote it: `-1`, `0.5`, `'a'`, `NULL`.
fn shown(value: &ScalarValue) -> String {
    if value.is_null() {
        "NULL".to_string()
    } else if let ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) = value {
        format!("'{s}'")
    } else {
        value.to_string()
    }
}

/// Clusters a whole partition at once (`evaluate_all`).
#[derive(Debug)]
struct DbscanEvaluator;

impl PartitionEvaluator for DbscanEvaluator {
    fn evaluate_all(
        &mut self,
        values: &[ArrayRef],
        num_rows: usize,
    ) -> datafusion::error::Result<ArrayRef> {
        if values.len() < 3 {
            return exec_err!("{}", arity_message(values.len()));
        }
        if num_rows == 0 {
            return Ok(Arc::new(Int64Array::from(Vec::<i64>::new())));
        }
        let eps = cast(&values[0], &DataType::Float64)?;
        let eps = eps.as_primitive::<Float64Type>();
        let first_eps = eps.iter().next().flatten();
        let Some(eps_value) = first_eps.filter(|e| *e > 0.0) else {
            return exec_err!(
                "dbscan: eps must be a positive number, got {}",
                first_eps.map_or("NULL".to_string(), |e| e.to_string())
            );
        };
        if eps.iter().any(|e| e != first_eps) {
            return exec_err!("dbscan: eps must be the same for every row (a literal)");
        }
        let min_pts = cast(&values[1], &DataType::Int64)?;
        let min_pts = min_pts.as_primitive::<Int64Type>();
        let first_min_pts = min_pts.iter().next().flatten();
        let Some(min_pts_value) = first_min_pts.filter(|m| *m > 0) else {
            return exec_err!(
                "dbscan: min_pts must be a positive integer, got {}",
                first_min_pts.map_or("NULL".to_string(), |m| m.to_string())
            );
        };
        if min_pts.iter().any(|m| m != first_min_pts) {
            return exec_err!("dbscan: min_pts must be the same for every row (a literal)");
        }

        let features = values[2..]
            .iter()
            .map(|v| cast(v, &DataType::Float64))
            .collect::<Result<Vec<_>, _>>()?;
        let features: Vec<_> = features
            .iter()
            .map(|f| f.as_primitive::<Float64Type>())
            .collect();
        // The rows that take part, and their features, row-major.
        let mut rows = Vec::with_capacity(num_rows);
        let mut points = Vec::with_capacity(num_rows * features.len());
        'rows: for row in 0..num_rows {
            let start = points.len();
            for feature in &features {
                match feature.is_valid(row).then(|| feature.value(row)) {
                    Some(v) if v.is_finite() => points.push(v),
                    _ => {
                        points.truncate(start);
                        continue 'rows;
                    }
                }
            }
            rows.push(row);
        }
        let labels = dbscan(&points, features.len(), eps_value, min_pts_value as usize);
        let mut out = vec![None; num_rows];
        for (row, label) in rows.into_iter().zip(labels) {
            out[row] = Some(label);
        }
        Ok(Arc::new(Int64Array::from(out)))
    }
}

/// DBSCAN labels of the points `points` (row-major, `dims` coordinates
/// each, all finite), in their order: 0, 1, 2, ... by discovery, [`NOISE`]
/// for noise.
pub fn dbscan(points: &[f64], dims: usize, eps: f64, min_pts: usize) -> Vec<i64> {
    if dims == 1 {
        cluster(&Sorted::new(points, eps), min_pts)
    } else {
        cluster(&Pairwise { points, dims, eps }, min_pts)
    }
}

/// Finds the neighbourhoods of points (each point is its own neighbour).
trait Neighbourhoods {
    /// How many points there are.
    fn len(&self) -> usize;
    /// How many points are in the neighbourhood of point `i`.
    fn count(&self, i: usize) -> usize;
    /// Calls `f` with every point in the neighbourhood of point `i`.
    fn for_each(&self, i: usize, f: &mut dyn FnMut(usize));
}

/// scikit-learn's `dbscan_inner`: scans the points in order; each core
/// point not yet in a cluster starts a new one, grown depth-first through
/// the neighbourhoods of its core points. Memory is `O(n)`: the
/// neighbourhoods are computed again when a core point is expanded, not
/// stored.
fn cluster(index: &dyn Neighbourhoods, min_pts: usize) -> Vec<i64> {
    let n = index.len();
    let core: Vec<bool> = (0..n).map(|i| index.count(i) >= min_pts).collect();
    let mut labels = vec![NOISE; n];
    let mut next = 0;
    let mut stack = Vec::new();
    for start in 0..n {
        if labels[start] != NOISE || !core[start] {
            continue;
        }
        labels[start] = next;
        stack.push(start);
        while let Some(p) = stack.pop() {
            if !core[p] {
                continue;
            }
            index.for_each(p, &mut |q| {
                if labels[q] == NOISE {
                    labels[q] = next;
                    stack.push(q);
                }
            });
        }
        next += 1;
    }
    labels
}

/// Any number of dimensions: compares every pair.
struct Pairwise<'a> {
    points: &'a [f64],
    dims: usize,
    eps: f64,
}

impl Pairwise<'_> {
    fn point(&self, i: usize) -> &[f64] {
        &self.points[i * self.dims..(i + 1) * self.dims]
    }

    fn near(&self, i: usize, j: usize) -> bool {
        distance(self.point(i), self.point(j)) <= self.eps
    }
}

/// Euclidean distance.
fn distance(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y) * (x - y))
        .sum::<f64>()
        .sqrt()
}

impl Neighbourhoods for Pairwise<'_> {
    fn len(&self) -> usize {
        self.points.len() / self.dims
    }

    fn count(&self, i: usize) -> usize {
        (0..self.len()).filter(|&j| self.near(i, j)).count()
    }

    fn for_each(&self, i: usize, f: &mut dyn FnMut(usize)) {
        for j in 0..self.len() {
            if self.near(i, j) {
                f(j);
            }
        }
    }
}

/// One dimension: sorted, each neighbourhood is a run of the sorted points.
struct Sorted {
    /// Point indices in ascending order of value.
    order: Vec<usize>,
    /// For each point, its neighbourhood as a range of `order`.
    runs: Vec<(usize, usize)>,
}

impl Sorted {
    fn new(points: &[f64], eps: f64) -> Self {
        let n = points.len();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| points[a].total_cmp(&points[b]));
        let sorted: Vec<f64> = order.iter().map(|&i| points[i]).collect();
        // Rounded subtraction is monotonic, so both ends of the run only
        // move right as the point does; `|a - b| <= eps` is the same test
        // as the Euclidean distance in one dimension.
        let mut runs = vec![(0, 0); n];
        let (mut lo, mut hi) = (0, 0);
        for (k, &x) in sorted.iter().enumerate() {
            while x - sorted[lo] > eps {
                lo += 1;
            }
            hi = hi.max(k);
            while hi < n && sorted[hi] - x <= eps {
                hi += 1;
            }
            runs[order[k]] = (lo, hi);
        }
        Self { order, runs }
    }
}

impl Neighbourhoods for Sorted {
    fn len(&self) -> usize {
        self.order.len()
    }

    fn count(&self, i: usize) -> usize {
        let (lo, hi) = self.runs[i];
        hi - lo
    }

    fn for_each(&self, i: usize, f: &mut dyn FnMut(usize)) {
        let (lo, hi) = self.runs[i];
        for &j in &self.order[lo..hi] {
            f(j);
        }
    }
}

#[cfg(test)]
mod tests;
