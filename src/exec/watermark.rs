use datafusion::arrow::array::AsArray;
use datafusion::arrow::compute::max;
use datafusion::arrow::datatypes::TimestampMillisecondType;
use datafusion::arrow::record_batch::RecordBatch;

use super::{Message, Operator};
use crate::error::Result;
use crate::state::OperatorState;

/// Generates watermarks: after each batch, the largest event time seen so far
/// minus the declared delay, whenever that has advanced.
pub struct WatermarkOp {
    time_column: usize,
    delay_ms: i64,
    max_seen: i64,
    emitted: i64,
}

impl WatermarkOp {
    /// Watermarks on column `time_column` (Timestamp(ms)) lagging by `delay_ms`.
    pub fn new(time_column: usize, delay_ms: i64) -> Self {
        Self {
            time_column,
            delay_ms,
            max_seen: i64::MIN,
            emitted: i64::MIN,
        }
    }
}

impl Operator for WatermarkOp {
    fn describe(&self) -> String {
        format!(
            "watermark(column {} - {} ms)",
            self.time_column, self.delay_ms
        )
    }

    fn on_batch(&mut self, batch: RecordBatch, out: &mut Vec<Message>) -> Result<()> {
        let times = batch
            .column(self.time_column)
            .as_primitive::<TimestampMillisecondType>();
        if let Some(batch_max) = max(times) {
            self.max_seen = self.max_seen.max(batch_max);
        }
        out.push(Message::Batch(batch));
        let watermark = self.max_seen.saturating_sub(self.delay_ms);
        if self.max_seen != i64::MIN && watermark > self.emitted {
            self.emitted = watermark;
            out.push(Message::Watermark(watermark));
        }
        Ok(())
    }

    fn snapshot(&mut self) -> Result<Option<OperatorState>> {
        let mut state = OperatorState::new();
        let seen = |v: i64| (v != i64::MIN).then_some(v);
        state.add_scalars(
            "meta",
            &[
                ("max_seen", seen(self.max_seen)),
                ("emitted", seen(self.emitted)),
            ],
        );
        Ok(Some(state))
    }

    fn restore(&mut self, state: OperatorState) -> Result<()> {
        self.max_seen = state.scalar("meta", "max_seen")?.unwrap_or(i64::MIN);
        self.emitted = state.scalar("meta", "emitted")?.unwrap_or(i64::MIN);
        Ok(())
    }

    fn on_watermark(&mut self, watermark: i64, out: &mut Vec<Message>) -> Result<()> {
        if watermark > self.emitted {
            self.emitted = watermark;
            out.push(Message::Watermark(watermark));
        }
        Ok(())
    }
}
