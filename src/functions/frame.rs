//! The machinery of `change_score` and `seasonal_z`: an aggregate that
//! keeps its input in row order, NULLs in place, and scores the whole frame
//! with a count literal (`n`, `period`) each time it is evaluated. Its value
//! depends on row order, so it cannot merge partial states: it works where
//! rows come in order (`OVER (... ORDER BY window_end)`, a tumbling
//! window's own rows), not across a `HOP`'s panes. A checkpointed frame
//! restores its one state into an empty accumulator.

use std::collections::VecDeque;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, ListArray};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Float64Type};
use datafusion::common::{ScalarValue, exec_err, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{Accumulator, AggregateUDFImpl, Expr, Signature, Volatility};
use datafusion::physical_expr::expressions::Literal;

use crate::error::{Error, Result as VigilResult};

/// How a frame is scored: its values in row order (NULLs in place) and the
/// call's count literal.
pub type Score = fn(&[Option<f64>], usize) -> Option<f64>;

/// `name(x, count)`, an aggregate that scores its frame with `score`.
#[derive(Debug)]
pub struct FrameScore {
    name: &'static str,
    count: &'static str,
    score: Score,
    signature: Signature,
}

impl FrameScore {
    /// The aggregate `name(x, count)` whose value is `score(frame, count)`.
    pub fn new(name: &'static str, count: &'static str, score: Score) -> Self {
        Self {
            name,
            count,
            score,
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

// By name: a function's name says what it computes (and function pointers
// do not compare reliably).
impl PartialEq for FrameScore {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for FrameScore {}

impl std::hash::Hash for FrameScore {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

impl AggregateUDFImpl for FrameScore {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    /// The count keeps its type, so its literal reaches the accumulator as
    /// written, without a cast to fold.
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        coerce_value_and_count(self.name, self.count, arg_types)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![values_field(args.name)])
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let count = count_argument(&args, self.name, self.count)?;
        Ok(Box::new(FrameAccumulator::new(
            self.name, self.score, count,
        )))
    }
}

/// The frame's values, NULLs included, in row order. It slides: rows join
/// at the back and leave from the front (`retract_batch`), so a `ROWS
/// BETWEEN n PRECEDING` frame costs each row one push and one pop rather
/// than gathering the whole frame again.
#[derive(Debug)]
pub(super) struct FrameAccumulator {
    name: &'static str,
    score: Score,
    count: usize,
    pub(super) values: VecDeque<Option<f64>>,
}

impl FrameAccumulator {
    /// An empty frame of `name`, scored by `score` with `count`.
    pub(super) fn new(name: &'static str, score: Score, count: usize) -> Self {
        Self {
            name,
            score,
            count,
            values: VecDeque::new(),
        }
    }
}

impl Accumulator for FrameAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let array = values[0].as_primitive::<Float64Type>();
        self.values.extend(array.iter());
        Ok(())
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let frame = self.values.make_contiguous();
        Ok(ScalarValue::Float64((self.score)(frame, self.count)))
    }

    /// Frames only ever lose their oldest rows, in the order they came.
    fn supports_retract_batch(&self) -> bool {
        true
    }

    fn retract_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let leaving = values[0].len();
        if leaving > self.values.len() {
            return exec_err!(
                "{}: {leaving} rows leave a frame of {}",
                self.name,
                self.values.len()
            );
        }
        self.values.drain(..leaving);
        Ok(())
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.values.capacity() * std::mem::size_of::<Option<f64>>()
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let values = Float64Array::from_iter(self.values.iter().copied());
        Ok(vec![values_state(values)])
    }

    /// Takes the one partial state there is into an accumulator that has
    /// none: how a checkpointed window gets its state back. Merging two is
    /// refused, as their order is lost.
    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let Some(list) = only_state(states, self.values.is_empty(), self.name)? else {
            return Ok(());
        };
        self.values
            .extend(list.as_primitive::<Float64Type>().iter());
        Ok(())
    }
}

/// The argument types of `name(x, count)`: `x` any number, as DOUBLE;
/// `count` any number, kept as it is (its literal is checked when planned
/// and when the accumulator is made).
fn coerce_value_and_count(
    name: &str,
    count: &str,
    arg_types: &[DataType],
) -> Result<Vec<DataType>> {
    match arg_types {
        [x, c] if (x.is_numeric() || x.is_null()) && c.is_numeric() => {
            Ok(vec![DataType::Float64, c.clone()])
        }
        [x, _] if !(x.is_numeric() || x.is_null()) => {
            plan_err!("{name}(x, {count}) needs a numeric x, got {x}")
        }
        [_, c] => plan_err!("{name}(x, {count}) needs an integer {count}, got {c}"),
        _ => plan_err!(
            "{name} takes two arguments (x, {count}), got {}",
            arg_types.len()
        ),
    }
}

/// The state field of an accumulator that keeps its values in row order:
/// one list of DOUBLEs.
fn values_field(name: &str) -> FieldRef {
    let item = Field::new_list_field(DataType::Float64, true);
    Arc::new(Field::new(
        format_state_name(name, "values"),
        DataType::List(Arc::new(item)),
        true,
    ))
}

/// `values` as the one-row list of a [`values_field`].
fn values_state(values: Float64Array) -> ScalarValue {
    let values: ArrayRef = Arc::new(values);
    ScalarValue::List(Arc::new(ListArray::new(
        Arc::new(Field::new_list_field(DataType::Float64, true)),
        OffsetBuffer::from_lengths([values.len()]),
        values,
        None,
    )))
}

/// The one non-empty list among the states of a [`values_field`], if there
/// is one and the accumulator (`empty` or not) can take it; an error when
/// two partial states would have to be put in an order.
fn only_state(states: &[ArrayRef], empty: bool, name: &str) -> Result<Option<ArrayRef>> {
    let mut lists = states[0]
        .as_list::<i32>()
        .iter()
        .flatten()
        .filter(|list| !list.is_empty());
    match (empty, lists.next(), lists.next()) {
        (_, None, _) => Ok(None),
        (true, Some(list), None) => Ok(Some(list)),
        _ => exec_err!(
            "{name} depends on row order and cannot merge partial results (HOP windows); use it over a key's history: OVER (PARTITION BY key ORDER BY window_end)"
        ),
    }
}

/// The positive integer that `value` holds, if it does.
fn positive_integer(value: &ScalarValue) -> Option<usize> {
    match value.cast_to(&DataType::Float64).ok()? {
        // `as` saturates: a count beyond any frame is as good as usize::MAX.
        ScalarValue::Float64(Some(v)) if v >= 1.0 && v.fract() == 0.0 => Some(v as usize),
        _ => None,
    }
}

/// The count literal of an aggregate call (`n`, `period`), its second
/// argument, when the accumulator is made.
fn count_argument(args: &AccumulatorArgs, name: &str, count: &str) -> Result<usize> {
    if args.is_distinct {
        return exec_err!("{name} does not take DISTINCT: it depends on every row, in order");
    }
    let value = args
        .exprs
        .get(1)
        .and_then(|e| e.as_ref().downcast_ref::<Literal>())
        .and_then(|l| positive_integer(l.value()));
    match value {
        Some(value) => Ok(value),
        None => exec_err!("{name}: {count} must be a positive integer literal"),
    }
}

/// Checks, at plan time, that the second argument of `name(x, count)` is a
/// positive integer literal.
pub(super) fn check_count_arg(args: &[Expr], name: &str, count: &str) -> VigilResult<()> {
    let bad = |got: &str| {
        Error::Plan(format!(
            "{name}: {count} must be a positive integer literal, got {got}"
        ))
    };
    let value = match args.get(1) {
        Some(Expr::Literal(value, _)) => value.clone(),
        Some(Expr::Cast(cast)) => match cast.expr.as_ref() {
            Expr::Literal(value, _) => value.clone(),
            other => return Err(bad(&other.to_string())),
        },
        Some(other) => return Err(bad(&other.to_string())),
        None => {
            return Err(Error::Plan(format!(
                "{name} takes two arguments (x, {count})"
            )));
        }
    };
    match positive_integer(&value) {
        Some(_) => Ok(()),
        None => Err(bad(&value.to_string())),
    }
}
