//! Decoding what one poll gave into one batch, counting and dead-lettering
//! the messages that do not decode, and advancing the read offsets.

use super::*;

impl Progress {
    /// Decodes `messages` into one batch, counting and dead-lettering the
    /// ones that do not decode, and moves the offsets past them. Returns
    /// the batch and each of its rows' partition and offset.
    pub(super) fn decode(
        &mut self,
        d: Decoder<'_>,
        messages: &[BorrowedMessage<'_>],
    ) -> Result<(RecordBatch, Vec<(i32, i64)>)> {
        let columns = d.columns;
        let mut text = Vec::new();
        if columns.format == MessageFormat::Csv {
            text.extend_from_slice(csv_header(columns).as_bytes());
        }
        // The messages that made a line of `text`, in order; the others
        // were bad before decoding.
        let mut lines = Vec::with_capacity(messages.len());
        for m in messages {
            self.offsets.insert(m.partition(), m.offset() + 1);
            match message_line(columns, m, &mut text) {
                Ok(()) => lines.push(m),
                Err(reason) => self.bad(d, origin_of(m), reason)?,
            }
        }
        let first_line = if columns.format == MessageFormat::Csv {
            2
        } else {
            1
        };
        // The lines the decoder found bad, in order: the rows it gives are
        // the other lines', in order.
        let bad_lines = std::cell::RefCell::new(Vec::new());
        let scratch = SourceStats::default();
        let mut batches = Vec::new();
        read_messages(
            d.config,
            d.config.format,
            &text,
            &scratch,
            &|line| {
                let index = line.saturating_sub(first_line) as usize;
                bad_lines.borrow_mut().push(index);
                lines.get(index).map_or_else(
                    || MessageOrigin {
                        at: format!("line {line}"),
                        line,
                        raw: Vec::new(),
                    },
                    |m| origin_of(m),
                )
            },
            &mut |b| {
                batches.push(b);
                true
            },
        )?;
        self.absorb(d, &scratch);
        let batch = concat_batches(&d.config.schema, &batches)?;
        let bad_lines = bad_lines.into_inner();
        let origins: Vec<(i32, i64)> = lines
            .iter()
            .enumerate()
            .filter(|(i, _)| !bad_lines.contains(i))
            .map(|(_, m)| (m.partition(), m.offset()))
            .collect();
        if origins.len() != batch.num_rows() {
            return Err(Error::Connector(format!(
                "stream {}: {} messages decoded into {} rows",
                d.config.stream,
                origins.len(),
                batch.num_rows()
            )));
        }
        Ok((batch, origins))
    }

    /// Counts rows that go on to the queries.
    pub(super) fn released(&mut self, d: Decoder<'_>, batch: &RecordBatch) {
        self.rows += batch.num_rows() as u64;
        d.stats
            .rows
            .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
        if let Some(i) = d.config.event_time
            && let Some(times) = batch
                .column(i)
                .as_primitive_opt::<TimestampMillisecondType>()
            && let Some(max) = datafusion::arrow::compute::max(times)
        {
            d.stats.max_event_time.raise(max);
        }
    }

    /// A message that could not even be made a line.
    pub(super) fn bad(
        &mut self,
        d: Decoder<'_>,
        origin: MessageOrigin,
        reason: String,
    ) -> Result<()> {
        if let Some(path) = &d.config.dead_letter {
            append_dead_letter(path, &origin, &reason)?;
        }
        d.stats.record_bad(crate::connectors::BadRow {
            line: origin.line,
            reason: format!("{}: {reason}", origin.at),
        });
        self.bad_rows += 1;
        Ok(())
    }

    /// Adds the bad rows a decoding met to the stream's counters.
    pub(super) fn absorb(&mut self, d: Decoder<'_>, scratch: &SourceStats) {
        let count = scratch.bad_rows.load(Ordering::Relaxed);
        let samples = std::mem::take(
            &mut *scratch
                .bad_samples
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        let kept = samples.len() as u64;
        for bad in samples {
            d.stats.record_bad(bad);
        }
        // Bad rows beyond the decoder's kept samples are counted only.
        d.stats
            .bad_rows
            .fetch_add(count.saturating_sub(kept), Ordering::Relaxed);
        self.bad_rows += count;
    }
}
