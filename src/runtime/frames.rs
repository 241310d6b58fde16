//! The record framing shared by the write-ahead log ([`super::wal`]) and
//! the disk buffer ([`super::spill`]): segment files of checksummed
//! records, and how a torn tail is told from damage.
//!
//! A folder holds `segment-<first seq>.log` files (the sequence number in
//! 20 digits, so names sort in order). A record is a 20-byte header, all
//! little-endian: payload length (u32), sequence number (u64), CRC-32 of
//! those 12 bytes (u32), CRC-32 of the payload (u32); then the payload.
//! Sequence numbers go up by one across segments.
//!
//! [`scan_log`] reads every segment. A crash while appending can leave the
//! end of the last segment torn: a partial header or payload, a payload
//! whose checksum fails with nothing after it, or zero bytes where a header
//! should be. That tail is cut off, with a warning on stderr. Anything bad
//! before the tail is damage: an error naming the file and the offset.
//! Messages name the log as `what` says (`write-ahead log`, `disk
//! buffer`).

use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::path::{Path, PathBuf};

use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::arrow::record_batch::RecordBatch;

use crate::error::{Error, Result};

/// Bytes of a record's header.
pub(super) const HEADER: usize = 20;

/// One segment file of a log.
#[derive(Debug, Clone)]
pub(super) struct Segment {
    pub(super) path: PathBuf,
    pub(super) first_seq: u64,
    /// The segment's records are `first_seq..=last_seq`; `first_seq - 1`
    /// when it has none.
    pub(super) last_seq: u64,
    /// Durable bytes: a reader reads no further.
    pub(super) bytes: u64,
}

/// Flushes `file` (at `path`, for the message) to disk.
pub(super) fn sync(file: &File, path: &Path) -> Result<()> {
    file.sync_data()
        .map_err(|e| Error::io(format!("cannot sync {}", path.display()), e))
}

/// Opens `path` to append to it.
pub(super) fn open_append(path: &Path) -> Result<File> {
    OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(|e| Error::io(format!("cannot open {}", path.display()), e))
}

/// Creates an empty segment and makes its name durable.
pub(super) fn create_segment(path: &Path) -> Result<()> {
    File::create(path).map_err(|e| Error::io(format!("cannot create {}", path.display()), e))?;
    sync_dir(path.parent().expect("a segment is in a folder"))
}

/// Makes the names in folder `dir` durable.
pub(super) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(format!("cannot sync {}", dir.display()), e))
}

/// What a record's header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RecordHeader {
    /// Bytes of the payload.
    pub(super) length: usize,
    /// The record's sequence number.
    pub(super) seq: u64,
    /// CRC-32 of the payload.
    pub(super) payload_crc: u32,
}

/// Reads a record header ([`HEADER`] bytes); `None` if its checksum fails.
pub(super) fn parse_header(header: &[u8]) -> Option<RecordHeader> {
    let stored_crc = u32::from_le_bytes(header[12..16].try_into().ok()?);
    if crc32fast::hash(&header[0..12]) != stored_crc {
        return None;
    }
    Some(RecordHeader {
        length: u32::from_le_bytes(header[0..4].try_into().ok()?) as usize,
        seq: u64::from_le_bytes(header[4..12].try_into().ok()?),
        payload_crc: u32::from_le_bytes(header[16..20].try_into().ok()?),
    })
}

/// The header of record `seq` with `payload`.
pub(super) fn record_header(seq: u64, payload: &[u8]) -> [u8; HEADER] {
    let mut header = [0u8; HEADER];
    header[0..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    header[4..12].copy_from_slice(&seq.to_le_bytes());
    let header_crc = crc32fast::hash(&header[0..12]);
    header[12..16].copy_from_slice(&header_crc.to_le_bytes());
    header[16..20].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
    header
}

/// `batch` as an Arrow IPC stream: a record's payload.
pub(super) fn encode_batch(what: &str, batch: &RecordBatch) -> Result<Vec<u8>> {
    let mut writer = StreamWriter::try_new(Vec::new(), &batch.schema())?;
    writer.write(batch)?;
    writer.finish()?;
    let record = writer.into_inner()?;
    if record.len() > u32::MAX as usize {
        return Err(Error::Plan(format!(
            "a batch of {} bytes is too large for the {what}",
            record.len()
        )));
    }
    Ok(record)
}

/// The batch in `payload`, an Arrow IPC stream read at `offset` of `path`.
pub(super) fn decode_batch(
    what: &str,
    path: &Path,
    offset: usize,
    payload: &[u8],
) -> Result<RecordBatch> {
    let bad = |why: String| {
        Error::Connector(format!(
            "{what} {} at offset {offset}: {why}",
            path.display()
        ))
    };
    let mut reader =
        StreamReader::try_new(payload, None).map_err(|e| bad(format!("bad batch: {e}")))?;
    match reader.next() {
        Some(batch) => batch.map_err(|e| bad(format!("bad batch: {e}"))),
        None => Err(bad("the record holds no batch".into())),
    }
}

/// `name` with every byte but letters, digits, `_` and `-` as `%XX`.
pub(super) fn safe_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-' {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    if out.is_empty() {
        out.push_str("%00");
    }
    out
}

/// How many segment files `dir` holds (for tests of what is deleted).
#[cfg(test)]
pub(super) fn segment_count(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "log")
        })
        .count()
}

/// The file of the segment whose first record is `first_seq`.
pub(super) fn segment_path(dir: &Path, first_seq: u64) -> PathBuf {
    dir.join(format!("segment-{first_seq:020}.log"))
}

/// The first `bytes` bytes of `path`.
pub(super) fn read_prefix(path: &Path, bytes: u64) -> Result<Vec<u8>> {
    let mut data = Vec::with_capacity(bytes as usize);
    File::open(path)
        .and_then(|f| f.take(bytes).read_to_end(&mut data))
        .map_err(|e| Error::io(format!("cannot read {}", path.display()), e))?;
    Ok(data)
}

/// What reading one segment found.
pub(super) struct Scan {
    /// Each record's sequence number and byte range (header included).
    pub(super) records: Vec<(u64, (usize, usize))>,
    /// Where the good records end.
    pub(super) end: usize,
}

/// Reads the records of a segment whose first record is `first_seq`. With
/// `last`, a torn tail ends the scan; otherwise (and for damage before the
/// tail) a bad record is an error naming `path` and its offset.
pub(super) fn scan_records(
    what: &str,
    path: &Path,
    data: &[u8],
    first_seq: u64,
    last: bool,
) -> Result<Scan> {
    let bad = |offset: usize, why: &str| {
        Error::Connector(format!(
            "{what} {} is damaged at offset {offset}: {why}",
            path.display()
        ))
    };
    let mut records = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let rest = &data[at..];
        let torn = |why: &str| if last { Ok(()) } else { Err(bad(at, why)) };
        if rest.len() < HEADER {
            torn("a partial record header")?;
            break;
        }
        let Some(RecordHeader {
            length,
            seq,
            payload_crc,
        }) = parse_header(&rest[..HEADER])
        else {
            // Zeros to the end: space the crash allocated, never written.
            if rest.iter().all(|&b| b == 0) {
                torn("")?;
                break;
            }
            return Err(bad(at, "bad record header checksum"));
        };
        let expected = first_seq + records.len() as u64;
        if seq != expected {
            return Err(bad(
                at,
                &format!("sequence number {seq} where {expected} was expected"),
            ));
        }
        let end = at + HEADER + length;
        if end > data.len() {
            torn("a partial record")?;
            break;
        }
        if crc32fast::hash(&data[at + HEADER..end]) != payload_crc {
            if end == data.len() {
                torn("bad record checksum")?;
                break;
            }
            return Err(bad(at, "bad record checksum"));
        }
        records.push((seq, (at, end)));
        at = end;
    }
    let end = records.last().map_or(0, |r| r.1.1);
    Ok(Scan { records, end })
}

/// Reads the segments of the log in `folder`, cutting a torn tail off the
/// last one; returns them and the last sequence number (0 if none).
pub(super) fn scan_log(what: &str, folder: &Path) -> Result<(Vec<Segment>, u64)> {
    let mut paths = Vec::new();
    let entries = fs::read_dir(folder)
        .map_err(|e| Error::io(format!("cannot read {}", folder.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("cannot read {}", folder.display()), e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(first) = name
            .strip_prefix("segment-")
            .and_then(|n| n.strip_suffix(".log"))
        {
            let first: u64 = first.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                Error::Connector(format!(
                    "{what} {}: unexpected file {name}",
                    folder.display()
                ))
            })?;
            paths.push((first, entry.path()));
        }
    }
    paths.sort();
    let mut segments = Vec::new();
    let mut last_seq = 0;
    let count = paths.len();
    for (i, (first_seq, path)) in paths.into_iter().enumerate() {
        if i > 0 && first_seq != last_seq + 1 {
            return Err(Error::Connector(format!(
                "{what} {}: starts at record {first_seq}, but the segment before \
                 ends at {last_seq}",
                path.display()
            )));
        }
        let data =
            fs::read(&path).map_err(|e| Error::io(format!("cannot read {}", path.display()), e))?;
        let is_last = i + 1 == count;
        let scan = scan_records(what, &path, &data, first_seq, is_last)?;
        if scan.end < data.len() {
            cut_tail(what, &path, scan.end, data.len())?;
        }
        last_seq = first_seq + scan.records.len() as u64 - 1;
        segments.push(Segment {
            path,
            first_seq,
            last_seq,
            bytes: scan.end as u64,
        });
    }
    Ok((segments, last_seq))
}

/// Cuts `path` back to `end` of its `length` bytes, with a warning.
pub(super) fn cut_tail(what: &str, path: &Path, end: usize, length: usize) -> Result<()> {
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.set_len(end as u64).and_then(|()| f.sync_all()))
        .map_err(|e| Error::io(format!("cannot cut the torn end off {}", path.display()), e))?;
    crate::diag::note!(
        "{what} {}: cut off a torn record at offset {end} ({} bytes, never \
         acknowledged)",
        path.display(),
        length - end
    );
    Ok(())
}
