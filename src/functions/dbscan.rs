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
mod tests {
    use datafusion::arrow::array::{Float64Array, Int32Array};
    use datafusion::logical_expr::{cast, col, lit};

    use super::*;

    /// Runs the evaluator on one partition: eps, min_pts and feature
    /// columns.
    fn evaluate(eps: f64, min_pts: i64, features: &[Vec<Option<f64>>]) -> Vec<Option<i64>> {
        let n = features[0].len();
        let mut values: Vec<ArrayRef> = vec![
            Arc::new(Float64Array::from(vec![eps; n])),
            Arc::new(Int64Array::from(vec![min_pts; n])),
        ];
        for f in features {
            values.push(Arc::new(Float64Array::from(f.clone())));
        }
        let labels = DbscanEvaluator.evaluate_all(&values, n).unwrap();
        labels.as_primitive::<Int64Type>().iter().collect()
    }

    fn some(values: &[f64]) -> Vec<Option<f64>> {
        values.iter().copied().map(Some).collect()
    }

    fn labels(values: &[i64]) -> Vec<Option<i64>> {
        values.iter().copied().map(Some).collect()
    }

    #[test]
    fn one_dimension_by_hand() {
        // eps 1: 1-2 and 2-2.5 are neighbours, 10-11 too, 30 has none.
        // Every point but 30 has 2 points in its neighbourhood: core.
        let x = some(&[1.0, 2.0, 2.5, 10.0, 11.0, 30.0]);
        assert_eq!(evaluate(1.0, 2, &[x]), labels(&[0, 0, 0, 1, 1, -1]));
        // Numbered in row order, whatever the values.
        let x = some(&[30.0, 11.0, 2.0, 10.0, 1.0, 2.5]);
        assert_eq!(evaluate(1.0, 2, &[x]), labels(&[-1, 0, 1, 0, 1, 1]));
        // min_pts 3: only 2 (with 1 and 2.5) is core; 1 and 2.5 are its
        // border points; 10, 11 and 30 are noise.
        let x = some(&[1.0, 2.0, 2.5, 10.0, 11.0, 30.0]);
        assert_eq!(evaluate(1.0, 3, &[x]), labels(&[0, 0, 0, -1, -1, -1]));
    }

    #[test]
    fn two_dimensions_with_a_border_point() {
        // eps 1, min_pts 3. A square of four core points at distance 1 of
        // each other (diagonals sqrt 2 are too far): each has itself and
        // two neighbours. (2, 0) is 1 from (1, 0) only: a border point.
        // (5, 5) and (5, 5.5) are neighbours but neither is core.
        let x = some(&[0.0, 1.0, 0.0, 1.0, 2.0, 5.0, 5.0]);
        let y = some(&[0.0, 0.0, 1.0, 1.0, 0.0, 5.0, 5.5]);
        assert_eq!(
            evaluate(1.0, 3, &[x.clone(), y.clone()]),
            labels(&[0, 0, 0, 0, 0, -1, -1])
        );
        // The border point alone first: it starts no cluster but joins the
        // one found after it.
        let mut bx = x.clone();
        let mut by = y.clone();
        bx.rotate_right(3);
        by.rotate_right(3);
        assert_eq!(
            evaluate(1.0, 3, &[bx, by]),
            labels(&[0, -1, -1, 0, 0, 0, 0])
        );
    }

    #[test]
    fn border_point_joins_the_first_cluster_that_reaches_it() {
        // eps 1, min_pts 4: 0.5 is core ({0, 0.3, 0.5, 1.4}), so is 2.3
        // ({1.4, 2.3, 2.5, 2.8}); 1.4 is within 1 of both but has only
        // three points around it ({0.5, 1.4, 2.3}): a border point of both
        // clusters. The others are border points of one.
        let x = some(&[0.0, 0.3, 0.5, 1.4, 2.3, 2.5, 2.8]);
        assert_eq!(evaluate(1.0, 4, &[x]), labels(&[0, 0, 0, 0, 1, 1, 1]));
        // The right cluster found first takes the border point.
        let x = some(&[2.8, 2.5, 2.3, 1.4, 0.5, 0.3, 0.0]);
        assert_eq!(evaluate(1.0, 4, &[x]), labels(&[0, 0, 0, 0, 1, 1, 1]));
        let x = some(&[1.4, 2.8, 0.0, 2.5, 0.3, 2.3, 0.5]);
        assert_eq!(evaluate(1.0, 4, &[x]), labels(&[0, 0, 1, 0, 1, 0, 1]));
    }

    #[test]
    fn a_point_counts_itself() {
        // min_pts 1: every point is core, isolated ones are clusters of one.
        let x = some(&[1.0, 2.0, 2.5, 10.0, 11.0, 30.0]);
        assert_eq!(
            evaluate(1.0, 1, std::slice::from_ref(&x)),
            labels(&[0, 0, 0, 1, 1, 2])
        );
        let y = some(&[0.0; 6]);
        assert_eq!(evaluate(1.0, 1, &[x, y]), labels(&[0, 0, 0, 1, 1, 2]));
        // min_pts 2 with duplicates: a point and its twin are a cluster.
        let x = some(&[4.0, 4.0, 9.0]);
        assert_eq!(evaluate(0.5, 2, &[x]), labels(&[0, 0, -1]));
    }

    #[test]
    fn distance_of_exactly_eps_is_a_neighbour() {
        let x = some(&[0.0, 0.5, 5.0]);
        assert_eq!(
            evaluate(0.5, 2, std::slice::from_ref(&x)),
            labels(&[0, 0, -1])
        );
        assert_eq!(
            evaluate(0.499_999, 2, std::slice::from_ref(&x)),
            labels(&[-1, -1, -1])
        );
        // 3-4-5 triangle: distance 5 in two dimensions.
        let x = some(&[0.0, 3.0]);
        let y = some(&[0.0, 4.0]);
        assert_eq!(evaluate(5.0, 2, &[x.clone(), y.clone()]), labels(&[0, 0]));
        assert_eq!(evaluate(4.999, 2, &[x, y]), labels(&[-1, -1]));
    }

    #[test]
    fn rows_with_a_null_feature_are_null_and_left_out() {
        // Without row 1, 0 and 2 are 2 apart: noise at eps 1. With it
        // (value 1), they would all be one cluster.
        let x = vec![Some(0.0), None, Some(2.0), Some(f64::NAN)];
        assert_eq!(evaluate(1.0, 2, &[x]), vec![Some(-1), None, Some(-1), None]);
        let x = some(&[0.0, 1.0, 2.0]);
        let y = vec![Some(0.0), None, Some(0.0)];
        assert_eq!(evaluate(1.0, 2, &[x, y]), vec![Some(-1), None, Some(-1)]);
        assert_eq!(evaluate(1.0, 1, &[vec![None, None]]), vec![None, None]);
    }

    #[test]
    fn evaluator_rejects_bad_parameters() {
        let x: ArrayRef = Arc::new(Float64Array::from(vec![1.0, 2.0]));
        let run = |eps: ArrayRef, min_pts: ArrayRef| {
            DbscanEvaluator
                .evaluate_all(&[eps, min_pts, x.clone()], 2)
                .unwrap_err()
                .to_string()
        };
        let eps = |v: Vec<Option<f64>>| -> ArrayRef { Arc::new(Float64Array::from(v)) };
        let min_pts = |v: Vec<Option<i64>>| -> ArrayRef { Arc::new(Int64Array::from(v)) };
        assert!(
            run(eps(vec![Some(-1.0); 2]), min_pts(vec![Some(2); 2]))
                .contains("dbscan: eps must be a positive number, got -1"),
        );
        assert!(
            run(eps(vec![Some(0.0); 2]), min_pts(vec![Some(2); 2]))
                .contains("dbscan: eps must be a positive number, got 0"),
        );
        assert!(
            run(eps(vec![None; 2]), min_pts(vec![Some(2); 2]))
                .contains("dbscan: eps must be a positive number, got NULL"),
        );
        assert!(
            run(eps(vec![Some(1.0), Some(2.0)]), min_pts(vec![Some(2); 2]))
                .contains("eps must be the same for every row"),
        );
        assert!(
            run(eps(vec![Some(1.0); 2]), min_pts(vec![Some(0); 2]))
                .contains("dbscan: min_pts must be a positive integer, got 0"),
        );
        assert!(
            run(eps(vec![Some(1.0); 2]), min_pts(vec![Some(2), Some(3)]))
                .contains("min_pts must be the same for every row"),
        );
        // Parameters of any numeric type are taken, features too.
        let labels = DbscanEvaluator
            .evaluate_all(
                &[
                    Arc::new(Int32Array::from(vec![1; 3])),
                    Arc::new(Int32Array::from(vec![2; 3])),
                    Arc::new(Int32Array::from(vec![1, 2, 4])),
                ],
                3,
            )
            .unwrap();
        assert_eq!(
            labels.as_primitive::<Int64Type>().values().to_vec(),
            vec![0, 0, -1]
        );
        // An empty partition.
        assert_eq!(
            DbscanEvaluator
                .evaluate_all(&[eps(vec![]), min_pts(vec![]), eps(vec![])], 0)
                .unwrap()
                .len(),
            0
        );
    }

    /// DBSCAN written from its definition, independently of `cluster`:
    /// clusters are the connected components of the core points (joined
    /// when within eps), found with union-find and numbered by their first
    /// core point; a border point joins the lowest-numbered cluster with a
    /// core point within eps of it (clusters grow one at a time, in number
    /// order, so that one reaches it first).
    fn reference(points: &[Vec<f64>], eps: f64, min_pts: usize) -> Vec<i64> {
        let n = points.len();
        let near = |i: usize, j: usize| distance(&points[i], &points[j]) <= eps;
        let core: Vec<bool> = (0..n)
            .map(|i| (0..n).filter(|&j| near(i, j)).count() >= min_pts)
            .collect();
        let mut parent: Vec<usize> = (0..n).collect();
        fn find(parent: &mut [usize], i: usize) -> usize {
            let mut r = i;
            while parent[r] != r {
                r = parent[r];
            }
            parent[i] = r;
            r
        }
        for i in 0..n {
            for j in 0..i {
                if core[i] && core[j] && near(i, j) {
                    let (a, b) = (find(&mut parent, i), find(&mut parent, j));
                    parent[a.max(b)] = a.min(b);
                }
            }
        }
        // Number the components in the order of their first core point.
        let mut number = vec![None; n];
        let mut next = 0;
        let mut labels = vec![NOISE; n];
        for i in (0..n).filter(|&i| core[i]) {
            let root = find(&mut parent, i);
            let label = *number[root].get_or_insert_with(|| {
                next += 1;
                next - 1
            });
            labels[i] = label;
        }
        // Border points: the lowest-numbered cluster with a core point
        // within eps (clusters are grown one at a time, in number order).
        for i in (0..n).filter(|&i| !core[i]) {
            labels[i] = (0..n)
                .filter(|&j| core[j] && near(i, j))
                .map(|j| labels[j])
                .min()
                .unwrap_or(NOISE);
        }
        labels
    }

    /// A small deterministic generator (64-bit LCG), to need no crate.
    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self) -> f64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    #[test]
    fn agrees_with_a_reference_implementation() {
        let mut rng = Lcg(42);
        // Rounds with two clusters or more and some noise: the data is
        // not trivial.
        let mut mixed = 0;
        for round in 0..300 {
            let pick = |rng: &mut Lcg, k: usize| (rng.next() * k as f64) as usize;
            let n = 1 + pick(&mut rng, 40);
            let dims = 1 + pick(&mut rng, 3);
            // Coarse grids make ties and distances of exactly eps common.
            let grid = [0.0, 0.5, 0.25][pick(&mut rng, 3)];
            let points: Vec<Vec<f64>> = (0..n)
                .map(|_| {
                    (0..dims)
                        .map(|_| {
                            let v = rng.next() * 10.0;
                            if grid > 0.0 {
                                (v / grid).round() * grid
                            } else {
                                v
                            }
                        })
                        .collect()
                })
                .collect();
            let eps = [0.5, 1.0, 1.5, 0.25][pick(&mut rng, 4)];
            let min_pts = 1 + pick(&mut rng, 5);
            let flat: Vec<f64> = points.iter().flatten().copied().collect();
            let expected = reference(&points, eps, min_pts);
            assert_eq!(
                dbscan(&flat, dims, eps, min_pts),
                expected,
                "round {round}: {points:?} eps {eps} min_pts {min_pts}"
            );
            if dims == 1 {
                // The sorted index against the pairwise one.
                let pairwise = cluster(
                    &Pairwise {
                        points: &flat,
                        dims: 1,
                        eps,
                    },
                    min_pts,
                );
                assert_eq!(pairwise, expected, "round {round}");
            }
            if expected.contains(&1) && expected.contains(&NOISE) {
                mixed += 1;
            }
        }
        assert!(mixed > 50, "only {mixed} rounds with clusters and noise");
    }

    #[test]
    fn validator_accepts_literals() {
        check_dbscan_args(&[lit(0.5), lit(2i64), col("v")]).unwrap();
        check_dbscan_args(&[lit(1i64), lit(3i32), col("x"), col("y")]).unwrap();
        // As type coercion leaves them.
        check_dbscan_args(&[cast(lit(1i64), DataType::Float64), lit(2i64), col("v")]).unwrap();
        check_dbscan_args(&[lit(0.5), cast(lit(2.0), DataType::Int64), col("v")]).unwrap();
    }

    #[test]
    fn validator_rejects_bad_arguments() {
        let error = |args: &[Expr]| match check_dbscan_args(args) {
            Err(Error::Plan(message)) => message,
            other => panic!("expected a plan error, got {other:?}"),
        };
        assert_eq!(
            error(&[lit(0.5), lit(2i64)]),
            "dbscan takes eps, min_pts and at least one feature column, got 2 arguments"
        );
        assert_eq!(
            error(&[lit(0i64), lit(2i64), col("v")]),
            "dbscan: eps must be a positive number, got 0"
        );
        assert_eq!(
            error(&[lit(-1i64), lit(2i64), col("v")]),
            "dbscan: eps must be a positive number, got -1"
        );
        assert_eq!(
            error(&[-lit(1.0), lit(2i64), col("v")]),
            "dbscan: eps must be a positive number, got -1"
        );
        assert_eq!(
            error(&[lit(f64::NAN), lit(2i64), col("v")]),
            "dbscan: eps must be a positive number, got NaN"
        );
        assert_eq!(
            error(&[lit("0.5"), lit(2i64), col("v")]),
            "dbscan: eps must be a positive number, got '0.5'"
        );
        assert_eq!(
            error(&[col("w"), lit(2i64), col("v")]),
            "dbscan: eps must be a positive number literal, got w"
        );
        assert_eq!(
            error(&[lit(0.5), lit(0i64), col("v")]),
            "dbscan: min_pts must be a positive integer, got 0"
        );
        assert_eq!(
            error(&[lit(0.5), lit(-3i64), col("v")]),
            "dbscan: min_pts must be a positive integer, got -3"
        );
        assert_eq!(
            error(&[lit(0.5), lit(2.5), col("v")]),
            "dbscan: min_pts must be a positive integer, got 2.5"
        );
        assert_eq!(
            error(&[lit(0.5), col("k"), col("v")]),
            "dbscan: min_pts must be a positive integer literal, got k"
        );
    }
}
