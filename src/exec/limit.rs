use datafusion::arrow::record_batch::RecordBatch;

use super::{Message, Operator};
use crate::error::{Error, Result};
use crate::state::OperatorState;

/// Passes the first `n` rows, then nothing.
pub struct LimitOp {
    remaining: usize,
    skip: usize,
}

impl LimitOp {
    /// Skips `skip` rows, then passes `fetch` rows.
    pub fn new(skip: usize, fetch: usize) -> Self {
        Self {
            remaining: fetch,
            skip,
        }
    }
}

impl Operator for LimitOp {
    fn describe(&self) -> String {
        format!("limit {} offset {}", self.remaining, self.skip)
    }

    fn on_batch(&mut self, batch: RecordBatch, out: &mut Vec<Message>) -> Result<()> {
        let skipped = self.skip.min(batch.num_rows());
        self.skip -= skipped;
        let take = self.remaining.min(batch.num_rows() - skipped);
        if take > 0 {
            self.remaining -= take;
            out.push(Message::Batch(batch.slice(skipped, take)));
        }
        Ok(())
    }

    fn finished(&self) -> bool {
        self.remaining == 0
    }

    fn snapshot(&mut self) -> Result<Option<OperatorState>> {
        let mut state = OperatorState::new();
        state.add_scalars(
            "meta",
            &[
                ("remaining", Some(self.remaining as i64)),
                ("skip", Some(self.skip as i64)),
            ],
        );
        Ok(Some(state))
    }

    fn restore(&mut self, state: OperatorState) -> Result<()> {
        let count = |column: &str| -> Result<usize> {
            state
                .scalar("meta", column)?
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| Error::Plan(format!("limit state: bad '{column}'")))
        };
        self.remaining = count("remaining")?;
        self.skip = count("skip")?;
        Ok(())
    }
}
