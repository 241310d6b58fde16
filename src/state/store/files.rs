//! A checkpoint's files: each operator's tables written as Arrow IPC (keyed
//! tables split by key group, with an ordinal column), the manifest last,
//! and read back checked against the manifest's sizes and checksums.

use super::*;

/// Removes a checkpoint folder, its manifest first, so that a stop halfway
/// leaves an incomplete folder rather than a damaged complete one.
pub(super) fn remove_checkpoint(path: &Location) -> Result<()> {
    path.child(MANIFEST).remove()?;
    path.remove_all()
}

/// Writes the state files and then the manifest of `checkpoint` into the
/// empty folder `dir`; returns the bytes written.
pub(super) fn write_checkpoint(dir: &Location, checkpoint: &Checkpoint) -> Result<u64> {
    let operators = checkpoint
        .operators
        .iter()
        .enumerate()
        .map(|(i, op)| write_operator(dir, i, op))
        .collect::<Result<Vec<_>>>()?;
    crate::crashpoint::hit("checkpoint-write");
    let manifest = Manifest {
        version: MANIFEST_VERSION,
        id: checkpoint.id,
        time_ms: checkpoint.time_ms,
        query: checkpoint.query.clone(),
        fingerprint: checkpoint.fingerprint.clone(),
        savepoint: checkpoint.savepoint,
        operators,
        sources: checkpoint.sources.clone(),
        sinks: checkpoint.sinks.clone(),
    };
    let text = serde_json::to_vec(&manifest)
        .map_err(|e| Error::Plan(format!("cannot encode the checkpoint manifest: {e}")))?;
    let written = text.len() as u64;
    dir.child(MANIFEST).put(text)?;
    dir.sync()?;
    Ok(manifest.data_bytes() + written)
}

pub(super) fn write_operator(
    dir: &Location,
    index: usize,
    op: &OperatorEntry,
) -> Result<ManifestOperator> {
    let tables = op
        .state
        .tables
        .iter()
        .enumerate()
        .map(|(t, table)| {
            let file = format!("op-{index:03}-{t:02}.arrow");
            write_table(&dir.child(&file), file, table).map_err(|e| {
                Error::Plan(format!(
                    "operator {} state table '{}': {e}",
                    op.id, table.name
                ))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(ManifestOperator {
        id: op.id.clone(),
        describe: op.describe.clone(),
        tables,
    })
}

/// Writes one table to the IPC file at `path`.
pub(super) fn write_table(
    path: &Location,
    file: String,
    table: &StateTable,
) -> Result<ManifestTable> {
    let schema = table.batch.schema();
    let columns = schema.fields().len();
    if let Some(bad) = table.key_columns.iter().find(|&&c| c >= columns) {
        return Err(Error::Plan(format!(
            "key column {bad} is out of range (the table has {columns} columns)"
        )));
    }
    let (file_schema, batches, groups) = match table.key_columns.is_empty() {
        true => {
            let batches = match table.batch.num_rows() {
                0 => Vec::new(),
                _ => vec![table.batch.clone()],
            };
            (schema.clone(), batches, Vec::new())
        }
        false => by_key_group(table)?,
    };
    // Whole in memory: an object store takes one put per object.
    let mut writer = FileWriter::try_new(Vec::new(), &file_schema)?;
    for batch in &batches {
        writer.write(batch)?;
    }
    writer.finish()?;
    let encoded = writer.into_inner()?;
    let (crc32, bytes) = (crc32fast::hash(&encoded), encoded.len() as u64);
    path.put(encoded)?;
    Ok(ManifestTable {
        name: table.name.clone(),
        file,
        bytes,
        crc32,
        key_columns: table.key_columns.clone(),
        schema_fingerprint: schema_fingerprint(&schema),
        rows: table.batch.num_rows() as u64,
        groups,
    })
}

/// A keyed table as one batch per non-empty key group, each row with its
/// position in the table as a last column.
pub(super) fn by_key_group(
    table: &StateTable,
) -> Result<(SchemaRef, Vec<RecordBatch>, Vec<GroupEntry>)> {
    let mut rows_of: Vec<Vec<u64>> = vec![Vec::new(); usize::from(KEY_GROUPS)];
    for (row, group) in key_groups(&table.batch, &table.key_columns)?
        .into_iter()
        .enumerate()
    {
        rows_of[usize::from(group)].push(row as u64);
    }
    let schema = with_ordinal(&table.batch.schema());
    let mut batches = Vec::new();
    let mut groups = Vec::new();
    for (group, rows) in rows_of.into_iter().enumerate() {
        if rows.is_empty() {
            continue;
        }
        let ordinals = UInt64Array::from(rows);
        let mut columns = take_arrays(table.batch.columns(), &ordinals, None)?;
        columns.push(Arc::new(ordinals));
        groups.push(GroupEntry {
            group: group as u16,
            batch: batches.len(),
            rows: columns[0].len() as u64,
        });
        batches.push(RecordBatch::try_new(schema.clone(), columns)?);
    }
    Ok((schema, batches, groups))
}

pub(super) fn with_ordinal(schema: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(ORDINAL, DataType::UInt64, false));
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// The manifest of the checkpoint in `dir`, and its size in bytes.
pub(super) fn read_manifest(dir: &Location) -> Result<(Manifest, u64), Problem> {
    let text = match dir.child(MANIFEST).get() {
        Ok(Some(text)) => text,
        Ok(None) => return Err(Problem::Incomplete),
        Err(e) if dir.is_object_store() => return Err(Problem::Unreachable(e.to_string())),
        Err(e) => return Err(Problem::Damaged(format!("cannot read {MANIFEST}: {e}"))),
    };
    let bytes = text.len() as u64;
    let unreadable =
        |e: serde_json::Error| Problem::Damaged(format!("{MANIFEST} is unreadable: {e}"));
    // The version first: a newer manifest may not parse as this one.
    let value: serde_json::Value = serde_json::from_slice(&text).map_err(unreadable)?;
    match value.get("version").and_then(serde_json::Value::as_u64) {
        Some(v) if v > u64::from(MANIFEST_VERSION) => {
            return Err(Problem::Newer(u32::try_from(v).unwrap_or(u32::MAX)));
        }
        Some(_) => {}
        None => {
            return Err(Problem::Damaged(format!("{MANIFEST} has no version")));
        }
    }
    serde_json::from_value(value)
        .map(|manifest| (manifest, bytes))
        .map_err(unreadable)
}

/// The checkpoint in `dir`, every file checked against its manifest.
pub(super) fn load(dir: &Location) -> Result<Checkpoint, Problem> {
    let (manifest, _) = read_manifest(dir)?;
    let operators = manifest
        .operators
        .iter()
        .map(|op| {
            Ok(OperatorEntry {
                id: op.id.clone(),
                describe: op.describe.clone(),
                state: read_operator(dir, op, None)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Checkpoint {
        id: manifest.id,
        time_ms: manifest.time_ms,
        query: manifest.query,
        fingerprint: manifest.fingerprint,
        savepoint: manifest.savepoint,
        operators,
        sources: manifest.sources,
        sinks: manifest.sinks,
    })
}

/// An operator's state: every row, or (`groups`) those of some key groups.
/// An object store's failure stays an [`Error::Connector`] (see
/// [`Problem`]'s `From`).
pub(super) fn read_operator(
    dir: &Location,
    op: &ManifestOperator,
    groups: Option<&RangeInclusive<u16>>,
) -> Result<OperatorState> {
    let mut state = OperatorState::new();
    for table in &op.tables {
        let batch = read_table(dir, table, groups).map_err(|e| match e {
            Error::Connector(_) => e,
            e => Error::Plan(format!(
                "operator {} state table '{}' ({}): {e}",
                op.id, table.name, table.file
            )),
        })?;
        state.add(&table.name, batch, table.key_columns.clone());
    }
    Ok(state)
}

pub(super) fn read_table(
    dir: &Location,
    table: &ManifestTable,
    groups: Option<&RangeInclusive<u16>>,
) -> Result<RecordBatch> {
    let bytes = read_checked(dir, table)?;
    let reader = FileReader::try_new(Cursor::new(bytes), None)?;
    let file_schema = reader.schema();
    let schema = match table.keyed() {
        true => without_ordinal(&file_schema)?,
        false => file_schema.clone(),
    };
    if schema_fingerprint(&schema) != table.schema_fingerprint {
        return Err(Error::Plan(
            "its schema is not the one the manifest records".into(),
        ));
    }
    match table.keyed() {
        false => read_whole(reader, &schema, table),
        true => read_groups(reader, &schema, table, groups),
    }
}

/// The file of `table`, checked against its size and crc32.
pub(super) fn read_checked(dir: &Location, table: &ManifestTable) -> Result<Vec<u8>> {
    let name = Path::new(&table.file);
    if name.components().count() != 1 || name.file_name().is_none() {
        return Err(Error::Plan(format!(
            "the manifest names file '{}' outside the checkpoint",
            table.file
        )));
    }
    let path = dir.child(&table.file);
    let bytes = path
        .get()?
        .ok_or_else(|| Error::Plan(format!("{path} is missing")))?;
    if bytes.len() as u64 != table.bytes {
        return Err(Error::Plan(format!(
            "the file has {} bytes, the manifest says {}",
            bytes.len(),
            table.bytes
        )));
    }
    let crc32 = crc32fast::hash(&bytes);
    if crc32 != table.crc32 {
        return Err(Error::Plan(format!(
            "checksum mismatch (crc32 {crc32:08x}, the manifest says {:08x})",
            table.crc32
        )));
    }
    Ok(bytes)
}

pub(super) fn without_ordinal(schema: &Schema) -> Result<SchemaRef> {
    let fields = schema.fields();
    match fields.last() {
        Some(last) if last.name() == ORDINAL && last.data_type() == &DataType::UInt64 => {
            let kept: Vec<Field> = fields[..fields.len() - 1]
                .iter()
                .map(|f| f.as_ref().clone())
                .collect();
            Ok(Arc::new(Schema::new_with_metadata(
                kept,
                schema.metadata().clone(),
            )))
        }
        _ => Err(Error::Plan(format!(
            "a keyed table's file has no '{ORDINAL}' column"
        ))),
    }
}

pub(super) fn read_whole(
    reader: FileReader<Cursor<Vec<u8>>>,
    schema: &SchemaRef,
    table: &ManifestTable,
) -> Result<RecordBatch> {
    let batches = reader.collect::<Result<Vec<_>, _>>()?;
    let batch = concat_batches(schema, &batches)?;
    check_rows(batch.num_rows() as u64, table.rows)?;
    Ok(batch)
}

/// Reads the key groups of a keyed table (all of them without `wanted`)
/// and puts the rows back in the operator's order.
pub(super) fn read_groups(
    mut reader: FileReader<Cursor<Vec<u8>>>,
    schema: &SchemaRef,
    table: &ManifestTable,
    wanted: Option<&RangeInclusive<u16>>,
) -> Result<RecordBatch> {
    check_groups(table, reader.num_batches())?;
    let mut batches = Vec::new();
    for entry in &table.groups {
        if wanted.is_some_and(|w| !w.contains(&entry.group)) {
            continue;
        }
        reader.set_index(entry.batch)?;
        let batch = reader
            .next()
            .ok_or_else(|| Error::Plan(format!("batch {} is missing", entry.batch)))??;
        check_rows(batch.num_rows() as u64, entry.rows)?;
        batches.push(batch);
    }
    let combined = concat_batches(&reader.schema(), &batches)?;
    let last = combined.num_columns() - 1;
    let ordinals = combined.column(last).as_primitive::<UInt64Type>();
    let order: ArrayRef = match wanted {
        None => Arc::new(original_order(ordinals, table.rows)?),
        Some(_) => sort_to_indices(ordinals, None, None).map(|a| Arc::new(a) as ArrayRef)?,
    };
    let columns = take_arrays(&combined.columns()[..last], order.as_ref(), None)?;
    Ok(RecordBatch::try_new_with_options(
        schema.clone(),
        columns,
        &datafusion::arrow::record_batch::RecordBatchOptions::new()
            .with_row_count(Some(order.len())),
    )?)
}

/// Checks that the manifest's group entries describe the file's batches.
pub(super) fn check_groups(table: &ManifestTable, batches: usize) -> Result<()> {
    let indexed = table.groups.iter().enumerate().all(|(i, g)| g.batch == i);
    let in_range = table.groups.iter().all(|g| g.group < KEY_GROUPS);
    let rows: u64 = table.groups.iter().map(|g| g.rows).sum();
    if table.groups.len() != batches || !indexed || !in_range || rows != table.rows {
        return Err(Error::Plan(
            "its key groups do not match the manifest".into(),
        ));
    }
    Ok(())
}

pub(super) fn check_rows(found: u64, expected: u64) -> Result<()> {
    match found == expected {
        true => Ok(()),
        false => Err(Error::Plan(format!(
            "{found} rows where the manifest says {expected}"
        ))),
    }
}

/// The positions that put rows stored with `ordinals` back in the
/// operator's order; every position `0..rows` must occur exactly once.
pub(super) fn original_order(ordinals: &UInt64Array, rows: u64) -> Result<UInt64Array> {
    let bad = || Error::Plan(format!("its '{ORDINAL}' column is not a permutation"));
    if ordinals.null_count() > 0 || ordinals.len() as u64 != rows {
        return Err(bad());
    }
    let mut order = vec![u64::MAX; ordinals.len()];
    for (position, ordinal) in ordinals.values().iter().enumerate() {
        let slot = usize::try_from(*ordinal)
            .ok()
            .and_then(|o| order.get_mut(o))
            .filter(|s| **s == u64::MAX)
            .ok_or_else(bad)?;
        *slot = position as u64;
    }
    Ok(UInt64Array::from(order))
}
