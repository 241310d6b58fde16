//! `median(x)` that always averages the two middle values of an even count.

use std::sync::Arc;

use std::cmp::Ordering;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Float64Array, ListArray};
use datafusion::arrow::buffer::{OffsetBuffer, ScalarBuffer};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Float64Type};
use datafusion::common::{internal_err, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, EmitTo, GroupsAccumulator, Signature, Volatility,
};

/// DataFusion's exact median returns the input type, so an even count of
/// integers truncates the mean of the two middle values. The semantics say
/// it is their mean, so numeric input is taken as DOUBLE; the accumulator is
/// DataFusion's own.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ExactMedian {
    builtin: Arc<AggregateUDF>,
    signature: Signature,
}

impl ExactMedian {
    /// Wraps DataFusion's `median`.
    pub fn new(builtin: Arc<AggregateUDF>) -> Self {
        Self {
            builtin,
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl AggregateUDFImpl for ExactMedian {
    fn name(&self) -> &str {
        "median"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        match arg_types {
            [t] if t.is_numeric() || t.is_null() => Ok(vec![DataType::Float64]),
            [t] => plan_err!("median needs a numeric argument, got {t}"),
            _ => plan_err!("median takes one argument, got {}", arg_types.len()),
        }
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        self.builtin.inner().accumulator(args)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        self.builtin.inner().state_fields(args)
    }

    fn groups_accumulator_supported(&self, args: AccumulatorArgs) -> bool {
        self.builtin.inner().groups_accumulator_supported(args)
    }

    fn create_groups_accumulator(
        &self,
        args: AccumulatorArgs,
    ) -> Result<Box<dyn GroupsAccumulator>> {
        if args.expr_fields[0].data_type() == &DataType::Float64 {
            return Ok(Box::new(MedianGroups::default()));
        }
        self.builtin.inner().create_groups_accumulator(args)
    }
}

/// Exact medians of many groups of DOUBLEs.
///
/// DataFusion's grouped median keeps a vector per group, so each row is a
/// push into its own small vector, reallocated as it grows. Here a row
/// appends its group and value to two flat vectors; evaluating buckets
/// them by group (a stable counting sort, so each group's values stay in
/// arrival order) and takes each group's median as DataFusion does, with
/// the same selection on the same order, so the result is the same to
/// the bit. The state is DataFusion's: per group, a list of its values.
#[derive(Debug, Default)]
struct MedianGroups {
    groups: Vec<u32>,
    values: Vec<f64>,
    total: usize,
}

impl MedianGroups {
    fn grow(&mut self, total: usize) -> Result<()> {
        if u32::try_from(total).is_err() {
            return internal_err!("median: more than 2^32 groups");
        }
        self.total = self.total.max(total);
        Ok(())
    }

    /// The values of the first `emit` groups as (offsets, values) of a
    /// list array, each group's in arrival order; the later groups' values
    /// stay, renumbered from 0.
    fn take(&mut self, emit_to: EmitTo) -> (Vec<i32>, Vec<f64>) {
        let emit = match emit_to {
            EmitTo::All => self.total,
            EmitTo::First(n) => n.min(self.total),
        };
        let mut offsets = vec![0i32; emit + 1];
        for &g in &self.groups {
            if (g as usize) < emit {
                offsets[g as usize + 1] += 1;
            }
        }
        for i in 0..emit {
            offsets[i + 1] += offsets[i];
        }
        let mut next: Vec<i32> = offsets[..emit].to_vec();
        let mut sorted = vec![0.0; offsets[emit] as usize];
        let (mut kept_groups, mut kept_values) = (Vec::new(), Vec::new());
        for (&g, &v) in self.groups.iter().zip(&self.values) {
            match (g as usize).checked_sub(emit) {
                None => {
                    sorted[next[g as usize] as usize] = v;
                    next[g as usize] += 1;
                }
                Some(later) => {
                    kept_groups.push(later as u32);
                    kept_values.push(v);
                }
            }
        }
        self.groups = kept_groups;
        self.values = kept_values;
        self.total -= emit;
        (offsets, sorted)
    }
}

impl GroupsAccumulator for MedianGroups {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.grow(total_num_groups)?;
        let values = values[0].as_primitive::<Float64Type>();
        let nulls = values.logical_nulls();
        self.groups.reserve(group_indices.len());
        self.values.reserve(group_indices.len());
        for (row, (&g, &v)) in group_indices.iter().zip(values.values()).enumerate() {
            let valid = nulls.as_ref().is_none_or(|n| n.is_valid(row))
                && opt_filter.is_none_or(|f| f.is_valid(row) && f.value(row));
            if valid {
                self.groups.push(g as u32);
                self.values.push(v);
            }
        }
        Ok(())
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        total_num_groups: usize,
    ) -> Result<()> {
        self.grow(total_num_groups)?;
        let lists = values[0].as_list::<i32>();
        for (&g, list) in group_indices.iter().zip(lists.iter()) {
            let Some(list) = list else { continue };
            let list = list.as_primitive::<Float64Type>();
            for v in list.iter().flatten() {
                self.groups.push(g as u32);
                self.values.push(v);
            }
        }
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        let (offsets, mut values) = self.take(emit_to);
        let medians: Float64Array = offsets
            .windows(2)
            .map(|w| median_of(&mut values[w[0] as usize..w[1] as usize]))
            .collect();
        Ok(Arc::new(medians))
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        let (offsets, values) = self.take(emit_to);
        let list = ListArray::new(
            Arc::new(Field::new_list_field(DataType::Float64, true)),
            OffsetBuffer::new(ScalarBuffer::from(offsets)),
            Arc::new(Float64Array::from(values)),
            None,
        );
        Ok(vec![Arc::new(list)])
    }

    /// Each row as a state of its own: a list of its value, NULL where the
    /// value is NULL or filtered out.
    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        opt_filter: Option<&BooleanArray>,
    ) -> Result<Vec<ArrayRef>> {
        let values = values[0].as_primitive::<Float64Type>();
        let rows = values.len();
        let valid: BooleanArray = (0..rows)
            .map(|row| {
                Some(
                    values.is_valid(row)
                        && opt_filter.is_none_or(|f| f.is_valid(row) && f.value(row)),
                )
            })
            .collect();
        let list = ListArray::new(
            Arc::new(Field::new_list_field(DataType::Float64, true)),
            OffsetBuffer::from_lengths(std::iter::repeat_n(1, rows)),
            Arc::new(Float64Array::new(values.values().clone(), None)),
            Some(valid.values().clone().into()),
        );
        Ok(vec![Arc::new(list)])
    }

    fn size(&self) -> usize {
        self.groups.capacity() * size_of::<u32>() + self.values.capacity() * size_of::<f64>()
    }
}

/// DataFusion's `calculate_median` for DOUBLE, step for step: the same
/// selection and the same maximum of the lower half, so the same value
/// for values in the same order.
fn median_of(values: &mut [f64]) -> Option<f64> {
    let len = values.len();
    if len == 0 {
        return None;
    }
    let (low, middle, _) = values.select_nth_unstable_by(len / 2, f64::total_cmp);
    if len % 2 == 1 {
        return Some(*middle);
    }
    let left_max = low
        .iter()
        .copied()
        .max_by(|x, y| x.partial_cmp(y).unwrap_or(Ordering::Less))
        .expect("the lower half of an even count is not empty");
    Some((left_max + *middle) / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::Schema;
    use datafusion::functions_aggregate::median::median_udaf;
    use datafusion::physical_expr::aggregate::AggregateExprBuilder;
    use datafusion::physical_expr::expressions::col;

    /// A grouped median of `v` by `udaf`.
    fn groups(udaf: Arc<AggregateUDF>) -> Box<dyn GroupsAccumulator> {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Float64, true)]));
        AggregateExprBuilder::new(udaf, vec![col("v", &schema).unwrap()])
            .schema(schema)
            .alias("m")
            .build()
            .unwrap()
            .create_groups_accumulator()
            .unwrap()
    }

    /// Values (some NULL, both zeros, duplicates), their groups and a
    /// filter; the same every run.
    fn batch(seed: u64, rows: usize, total: usize) -> (ArrayRef, Vec<usize>, BooleanArray) {
        let mut x = seed;
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            x >> 33
        };
        let mut values = Vec::new();
        let mut groups = Vec::new();
        let mut filter = Vec::new();
        for _ in 0..rows {
            let r = next();
            values.push(match r % 9 {
                0 => None,
                1 => Some(-0.0),
                2 => Some(0.0),
                3 => Some((r % 4) as f64),
                _ => Some((r % 100_000) as f64 / 3.0 - 9000.0),
            });
            groups.push((next() % total as u64) as usize);
            filter.push(Some(next() % 5 != 0));
        }
        let values: ArrayRef = Arc::new(Float64Array::from(values));
        (values, groups, BooleanArray::from(filter))
    }

    /// Updates, filters, merged states and emitting the first groups give
    /// DataFusion's grouped medians to the bit.
    #[test]
    fn matches_datafusions_grouped_median_to_the_bit() {
        let builtin = median_udaf();
        let ours = Arc::new(AggregateUDF::from(ExactMedian::new(builtin.clone())));
        let mut results = Vec::new();
        for udaf in [builtin, ours] {
            let mut acc = groups(udaf.clone());
            let mut other = groups(udaf);
            let total = 40;
            for seed in 0..6 {
                let (values, group_indices, filter) = batch(seed, 500, total);
                let filter = (seed % 2 == 0).then_some(&filter);
                acc.update_batch(std::slice::from_ref(&values), &group_indices, filter, total)
                    .unwrap();
                other
                    .update_batch(&[values], &group_indices, None, total)
                    .unwrap();
            }
            let state = other.state(EmitTo::All).unwrap();
            let indices: Vec<usize> = (0..total).rev().collect();
            acc.merge_batch(&state, &indices, total).unwrap();
            let first = acc.evaluate(EmitTo::First(7)).unwrap();
            let rest = acc.evaluate(EmitTo::All).unwrap();
            let bits = |a: &ArrayRef| -> Vec<Option<u64>> {
                a.as_primitive::<Float64Type>()
                    .iter()
                    .map(|v| v.map(f64::to_bits))
                    .collect()
            };
            assert_eq!((first.len(), rest.len()), (7, total - 7));
            results.push((bits(&first), bits(&rest)));
        }
        assert_eq!(results[0], results[1]);
    }

    #[test]
    fn rows_as_states_are_lists_of_one_or_null() {
        let acc = MedianGroups::default();
        let values: ArrayRef = Arc::new(Float64Array::from(vec![Some(1.0), None, Some(3.0)]));
        let filter = BooleanArray::from(vec![true, true, false]);
        let state = acc.convert_to_state(&[values], Some(&filter)).unwrap();
        let lists = state[0].as_list::<i32>();
        assert_eq!(lists.len(), 3);
        assert!(lists.is_valid(0) && lists.is_null(1) && lists.is_null(2));
        assert_eq!(lists.value(0).as_primitive::<Float64Type>().value(0), 1.0);
    }
}
