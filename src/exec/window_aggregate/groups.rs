//! A window aggregate's groups per pane: the live part (rows since the
//! pane was last read) and the frozen parts, and how a pane is read.

use super::*;

impl Groups {
    /// Empty groups for `aggregates`, keyed by `keys` if given.
    pub(in crate::exec) fn new(
        keys: Option<Box<dyn GroupValues>>,
        aggregates: &[AggregateSpec],
    ) -> Result<Self> {
        let accumulators = aggregates
            .iter()
            .map(|a| new_accumulator(&a.function))
            .collect::<Result<_>>()?;
        Ok(Groups {
            keys,
            rows_seen: false,
            accumulators,
            ids: Vec::new(),
        })
    }

    pub(in crate::exec) fn intern(&mut self, keys: &[ArrayRef], rows: usize) -> Result<usize> {
        self.rows_seen |= rows > 0;
        match &mut self.keys {
            Some(values) => {
                values.intern(keys, &mut self.ids)?;
                Ok(values.len())
            }
            None => {
                self.ids.clear();
                self.ids.resize(rows, 0);
                Ok(1)
            }
        }
    }

    /// Folds `rows` rows into the groups of `keys`.
    pub(in crate::exec) fn update(
        &mut self,
        keys: &[ArrayRef],
        rows: usize,
        args: &[Vec<ArrayRef>],
        filters: &[Option<BooleanArray>],
    ) -> Result<()> {
        let total = self.intern(keys, rows)?;
        for ((acc, values), filter) in self.accumulators.iter_mut().zip(args).zip(filters) {
            acc.update_batch(values, &self.ids, filter.as_ref(), total)?;
        }
        Ok(())
    }

    /// Folds frozen partial aggregates into these groups.
    pub(in crate::exec) fn merge(&mut self, frozen: &Frozen) -> Result<()> {
        if frozen.rows == 0 {
            return Ok(());
        }
        let total = self.intern(&frozen.keys, frozen.rows)?;
        for (acc, state) in self.accumulators.iter_mut().zip(&frozen.states) {
            acc.merge_batch(state, &self.ids, total)?;
        }
        Ok(())
    }

    pub(in crate::exec) fn is_empty(&self) -> bool {
        !self.rows_seen
    }

    /// Key columns, final aggregate values and the number of groups,
    /// emptying the groups.
    pub(in crate::exec) fn evaluate(&mut self) -> Result<Evaluated> {
        if self.is_empty() {
            return Ok((Vec::new(), Vec::new(), 0));
        }
        let (keys, rows) = match &mut self.keys {
            Some(values) => {
                let rows = values.len();
                (values.emit(EmitTo::All)?, rows)
            }
            None => (Vec::new(), 1),
        };
        let values = self
            .accumulators
            .iter_mut()
            .map(|a| a.evaluate(EmitTo::All))
            .collect::<datafusion::error::Result<_>>()?;
        Ok((keys, values, rows))
    }

    /// Key columns and intermediate states, emptying the groups.
    pub(in crate::exec) fn freeze(&mut self) -> Result<Frozen> {
        let rows = match &self.keys {
            Some(values) => values.len(),
            None => usize::from(self.rows_seen),
        };
        let keys = match &mut self.keys {
            Some(values) => values.emit(EmitTo::All)?,
            None => Vec::new(),
        };
        let states = self
            .accumulators
            .iter_mut()
            .map(|a| a.state(EmitTo::All))
            .collect::<datafusion::error::Result<_>>()?;
        Ok(Frozen { keys, states, rows })
    }

    /// Key columns and intermediate states, leaving the groups as they
    /// were. DataFusion's `state` empties an accumulator, so the state is
    /// merged back into `fresh`, which takes these groups' place: keys are
    /// interned in group-id order, so every key keeps its id.
    pub(in crate::exec) fn snapshot(&mut self, mut fresh: Groups) -> Result<Frozen> {
        if self.is_empty() {
            return Ok(Frozen::default());
        }
        let frozen = self.freeze()?;
        fresh.merge(&frozen)?;
        *self = fresh;
        Ok(frozen)
    }
}

impl Frozen {
    /// Partial aggregates read back from a state table: `keys` and, per
    /// aggregate, as many of `states` as `widths` says.
    pub(in crate::exec) fn from_columns(
        keys: Vec<ArrayRef>,
        states: &[ArrayRef],
        widths: &[usize],
        rows: usize,
    ) -> Self {
        let mut rest = states;
        let mut per_aggregate = Vec::with_capacity(widths.len());
        for &width in widths {
            let (these, others) = rest.split_at(width.min(rest.len()));
            per_aggregate.push(these.to_vec());
            rest = others;
        }
        Frozen {
            keys,
            states: per_aggregate,
            rows,
        }
    }

    /// The number of groups.
    pub(in crate::exec) fn rows(&self) -> usize {
        self.rows
    }

    /// Key columns, then every aggregate's state columns.
    pub(in crate::exec) fn columns(&self) -> Vec<ArrayRef> {
        let states = self.states.iter().flatten();
        self.keys.iter().chain(states).cloned().collect()
    }
}

impl Pane {
    /// Merges the frozen parts into one, so a pane read by many early
    /// results does not pile them up.
    pub(in crate::exec) fn compact(&mut self, mut scratch: Groups) -> Result<()> {
        if self.frozen.len() > 1 {
            for frozen in &self.frozen {
                scratch.merge(frozen)?;
            }
            self.frozen = vec![scratch.freeze()?];
        }
        Ok(())
    }

    /// Moves the live state into the frozen list, replacing it with `fresh`.
    pub(in crate::exec) fn freeze(&mut self, fresh: Groups) -> Result<()> {
        let mut live = std::mem::replace(&mut self.live, fresh);
        if !live.is_empty() {
            self.frozen.push(live.freeze()?);
        }
        Ok(())
    }
}
