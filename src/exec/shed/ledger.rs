//! The shed ledger: per window pane and key, how many rows the shedder kept
//! and dropped, so that a window's results can say how approximate they
//! are, checkpointed with the query.

use super::*;

/// Per (pane, key hash), kept and dropped rows.
pub type Counts = HashMap<(i64, u64), Tally>;

/// Kept and dropped rows of one (pane, key).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Rows handed on.
    pub kept: u64,
    /// Rows dropped.
    pub dropped: u64,
}

impl Tally {
    /// The share of the rows that was dropped; 0 with no rows.
    pub fn fraction(&self) -> f64 {
        match self.kept + self.dropped {
            0 => 0.0,
            all => self.dropped as f64 / all as f64,
        }
    }
}

/// Per (pane, key), the rows a [`ShedOp`] kept and dropped, read by the
/// instances of the window aggregate after it.
///
/// Keys are [`key_hashes`] of the aggregate's grouping keys, so the shed op
/// (on stream columns) and the aggregate (on its key columns) agree. An
/// entry is forgotten once every reader's watermark has passed the end of
/// the last window holding its pane (plus allowed lateness).
#[derive(Debug)]
pub struct ShedLedger {
    spec: WindowSpec,
    lateness_ms: i64,
    inner: Mutex<LedgerInner>,
}

#[derive(Debug, Default)]
struct LedgerInner {
    panes: BTreeMap<i64, HashMap<u64, Tally>>,
    /// How many aggregate instances read it.
    readers: usize,
    /// Each reader's watermark, by its join order.
    watermarks: Vec<i64>,
}

impl ShedLedger {
    /// A ledger for windows `spec` that take rows `lateness_ms` after they
    /// fire.
    pub fn new(spec: WindowSpec, lateness_ms: i64) -> Self {
        Self {
            spec,
            lateness_ms,
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LedgerInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Says how many readers there are: entries are forgotten only once
    /// that many have joined.
    pub fn set_readers(&self, readers: usize) {
        self.lock().readers = readers;
    }

    /// A new reader's id.
    pub fn join(&self) -> usize {
        let mut inner = self.lock();
        inner.watermarks.push(i64::MIN);
        inner.watermarks.len() - 1
    }

    /// Adds counts.
    pub fn record(&self, counts: &Counts) {
        let mut inner = self.lock();
        for (&(pane, key), t) in counts {
            let entry = inner.panes.entry(pane).or_default().entry(key).or_default();
            entry.kept += t.kept;
            entry.dropped += t.dropped;
        }
    }

    /// The counts of key `key` over the panes of the window at `start`.
    pub fn window(&self, start: i64, key: u64) -> Tally {
        let inner = self.lock();
        let mut total = Tally::default();
        for (_, keys) in inner.panes.range(start..start + self.spec.size_ms()) {
            if let Some(t) = keys.get(&key) {
                total.kept += t.kept;
                total.dropped += t.dropped;
            }
        }
        total
    }

    /// Reader `reader` has fired every window its watermark closes; drops
    /// what no reader will ask for again.
    pub fn advance(&self, reader: usize, watermark: i64) {
        let mut inner = self.lock();
        if let Some(w) = inner.watermarks.get_mut(reader) {
            *w = (*w).max(watermark);
        }
        if inner.watermarks.len() < inner.readers.max(1) {
            return;
        }
        let low = inner.watermarks.iter().copied().min().unwrap_or(i64::MIN);
        let horizon = self.spec.size_ms() + self.lateness_ms;
        let spec = self.spec;
        inner
            .panes
            .retain(|&pane, _| spec.last_window_start(pane).saturating_add(horizon) > low);
    }

    /// Every entry, for a checkpoint: pane, key, kept, dropped.
    pub(super) fn table(&self) -> Result<RecordBatch> {
        let inner = self.lock();
        let mut rows: Vec<(i64, u64, Tally)> = inner
            .panes
            .iter()
            .flat_map(|(&p, keys)| keys.iter().map(move |(&k, &t)| (p, k, t)))
            .collect();
        rows.sort_by_key(|&(p, k, _)| (p, k));
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.2.kept))),
            Arc::new(UInt64Array::from_iter_values(
                rows.iter().map(|r| r.2.dropped),
            )),
        ];
        Ok(RecordBatch::try_new(ledger_schema(), columns)?)
    }

    pub(super) fn restore(&self, table: &RecordBatch) -> Result<()> {
        let (panes, keys, kept, dropped) = ledger_columns(table)?;
        let mut counts = HashMap::new();
        for i in 0..table.num_rows() {
            let tally = Tally {
                kept: kept.value(i),
                dropped: dropped.value(i),
            };
            counts.insert((panes.value(i), keys.value(i)), tally);
        }
        self.lock().panes.clear();
        self.record(&counts);
        Ok(())
    }
}

pub(super) fn ledger_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("pane_start", DataType::Int64, false),
        Field::new("key", DataType::UInt64, false),
        Field::new("kept", DataType::UInt64, false),
        Field::new("dropped", DataType::UInt64, false),
    ]))
}

type LedgerColumns<'a> = (
    &'a Int64Array,
    &'a UInt64Array,
    &'a UInt64Array,
    &'a UInt64Array,
);

fn ledger_columns(table: &RecordBatch) -> Result<LedgerColumns<'_>> {
    if table.schema().fields() != ledger_schema().fields() {
        return Err(Error::Plan(
            "the checkpoint's shed ledger has other columns than this version writes".into(),
        ));
    }
    let u = |i: usize| {
        table
            .column(i)
            .as_primitive::<datafusion::arrow::datatypes::UInt64Type>()
    };
    Ok((
        table
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>(),
        u(1),
        u(2),
        u(3),
    ))
}
