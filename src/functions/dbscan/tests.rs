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
