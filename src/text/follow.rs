//! Following a file `tail -F` style: at its end a read waits for more
//! bytes, and a file rotated or truncated meanwhile is noticed and reopened.

use super::*;

/// Most a followed file is read ahead of what was handed out.
pub(super) const FOLLOW_READ_AHEAD: usize = 1 << 20;

/// A regular file read `tail -F` style: at its end, a read waits for more
/// bytes instead of returning 0, until `stop` is set.
///
/// Only whole lines are handed out: a partial last line is held back until
/// its newline arrives. So the reader never waits in the middle of a row
/// (a quoted CSV field spanning lines aside), and the rows it holds go on
/// before it waits for more. The last read of what the file has comes back
/// short, which tells the reader that nothing more is available for now.
///
/// The file is followed by name: when the path names another file (log
/// rotation by rename and create) or the file shrinks (truncation), what
/// is left of the old file is handed out, a partial last line completed
/// with a newline, and then the path is opened again and read from its
/// start. Each reopening is said on stderr and counted in `opened`, which
/// tells the decoder that a new file (and for CSV a new header) begins.
///
/// At its end, a read sleeps for [`POLL`] and then fails with
/// `WouldBlock`, so that the decoder can tell that it waits (and emit an
/// empty batch) between two polls.
pub(super) struct Follow<'a> {
    pub(super) file: File,
    pub(super) path: PathBuf,
    pub(super) stream: &'a str,
    /// Bytes read from the file and not yet handed out start at `start`;
    /// those before `ready` end with a newline.
    pub(super) buf: Vec<u8>,
    pub(super) start: usize,
    pub(super) ready: usize,
    /// Bytes read from the file so far.
    pub(super) size: u64,
    pub(super) stop: &'a AtomicBool,
    pub(super) opened: &'a Opened,
}

/// What a followed file tells its decoder.
#[derive(Debug, Default)]
pub(super) struct Opened {
    /// How many times the path was opened again.
    pub(super) count: Cell<u64>,
    /// The file open now.
    pub(super) file: Cell<Option<FileId>>,
}

impl Opened {
    pub(super) fn new(file: Option<FileId>) -> Self {
        Opened {
            count: Cell::new(0),
            file: Cell::new(file),
        }
    }
}

/// A file's identity: its device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct FileId {
    pub(super) dev: u64,
    pub(super) ino: u64,
}

/// The identity of the file `meta` describes; `None` on systems without
/// inodes (where only truncation is noticed).
#[cfg(unix)]
pub(super) fn file_id(meta: &std::fs::Metadata) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    Some(FileId {
        dev: meta.dev(),
        ino: meta.ino(),
    })
}

#[cfg(not(unix))]
pub(super) fn file_id(_: &std::fs::Metadata) -> Option<FileId> {
    None
}

/// Why a followed file is opened again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rotation {
    /// The path now names another file.
    Replaced,
    /// The file is shorter than what was read from it.
    Truncated,
}

impl<'a> Follow<'a> {
    pub(super) fn new(
        file: File,
        path: PathBuf,
        stream: &'a str,
        stop: &'a AtomicBool,
        opened: &'a Opened,
        offset: u64,
    ) -> Self {
        Follow {
            file,
            path,
            stream,
            buf: Vec::new(),
            start: 0,
            ready: 0,
            size: offset,
            stop,
            opened,
        }
    }

    /// Reads what the file has now (up to [`FOLLOW_READ_AHEAD`]); false
    /// when it has nothing new.
    pub(super) fn fill(&mut self) -> io::Result<bool> {
        self.buf.drain(..self.start);
        self.ready -= self.start;
        self.start = 0;
        let before = self.buf.len();
        while self.buf.len() < before + FOLLOW_READ_AHEAD {
            let at = self.buf.len();
            self.buf.resize(at + READ_BUFFER, 0);
            let n = self.file.read(&mut self.buf[at..])?;
            self.buf.truncate(at + n);
            if n == 0 {
                break;
            }
        }
        let got = self.buf.len() - before;
        self.size += got as u64;
        if let Some(newline) = self.buf[self.ready..].iter().rposition(|&b| b == b'\n') {
            self.ready += newline + 1;
        }
        if got > 0 {
            return Ok(true);
        }
        let Some(rotation) = self.rotation()? else {
            return Ok(false);
        };
        if self.ready < self.buf.len() {
            // The old file's last line has no newline and never will.
            self.buf.push(b'\n');
            self.ready = self.buf.len();
            return Ok(true);
        }
        self.reopen(rotation)?;
        Ok(true)
    }

    /// Whether the file was rotated or truncated since it was opened. A
    /// path that names no file for now (between a rename and the create)
    /// is no rotation yet.
    pub(super) fn rotation(&self) -> io::Result<Option<Rotation>> {
        let open = self.file.metadata()?;
        if open.len() < self.size {
            return Ok(Some(Rotation::Truncated));
        }
        let Ok(named) = std::fs::metadata(&self.path) else {
            return Ok(None);
        };
        Ok((file_id(&open) != file_id(&named)).then_some(Rotation::Replaced))
    }

    pub(super) fn reopen(&mut self, rotation: Rotation) -> io::Result<()> {
        self.file = File::open(&self.path)?;
        self.buf.clear();
        self.start = 0;
        self.ready = 0;
        self.size = 0;
        self.opened.count.set(self.opened.count.get() + 1);
        self.opened.file.set(file_id(&self.file.metadata()?));
        let what = match rotation {
            Rotation::Replaced => "rotated",
            Rotation::Truncated => "truncated",
        };
        crate::diag::note!(
            "stream {}: file {what}, reopened {} (line numbers restart at 1)",
            self.stream,
            self.path.display()
        );
        Ok(())
    }
}

impl Read for Follow<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return Ok(0);
            }
            let ready = self.ready - self.start;
            if ready > 0 {
                // Exactly a buffer's worth left would fill the read: hand
                // out one byte less, so that the last read is a short one.
                let n = if ready == out.len() {
                    (ready - 1).max(1)
                } else {
                    ready.min(out.len())
                };
                out[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
                self.start += n;
                return Ok(n);
            }
            if !self.fill()? {
                std::thread::sleep(POLL);
                if !self.stop.load(Ordering::Relaxed) {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
            }
        }
    }
}
