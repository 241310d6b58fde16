//! Where a checkpoint store keeps its files: a local directory, or any
//! store of the `object_store` crate.
//!
//! A [`Location`] names one object or folder: a backend and a key of
//! `/`-separated names under the backend's root. The checkpoint store
//! needs these of a backend: put (atomic: a reader sees the old object or
//! the new one whole, never a part), get, the folders under a prefix,
//! delete (one object, or everything under a prefix), and sync (make what
//! was put in a folder durable).
//!
//! - A plain path is a local directory, written as before: each file to a
//!   temporary name, fsynced and renamed, and the folder fsynced by
//!   [`Location::sync`] once its files are in.
//! - `file:///abs/path` is object_store's `LocalFileSystem` (a shared
//!   filesystem path); `memory://NAME/prefix` its `InMemory` (one per name
//!   in this process, for tests); `s3://bucket/prefix` its `AmazonS3`,
//!   configured by the usual `AWS_*` environment variables. An object store
//!   has no folders: a folder is there while an object under it is, and a
//!   put is durable once it returns (`LocalFileSystem` does not fsync: a
//!   plain path is the durable local choice).
//!
//! # The sync/async boundary
//!
//! The checkpoint store is synchronous: it is called from tokio tasks of
//! the run's multi-thread runtime, from plain threads, and from tests, some
//! on a current-thread runtime. object_store is async. Each call of an
//! object store is spawned on a small runtime of the store's own (one
//! worker, started on first use, never shut down) and the caller waits for
//! its answer on a channel. The caller's thread blocks as it did on the
//! file system calls before, and nothing the future needs runs on the
//! caller's runtime, so no runtime waits for itself: this works on any
//! thread. `Handle::block_on` inside a runtime would panic, and
//! `block_in_place` is refused on a current-thread runtime.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::fs::{self, File};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::error::{Error, Result};

/// One object or folder of a checkpoint store.
#[derive(Clone)]
pub struct Location {
    backend: Arc<dyn Backend>,
    /// Names joined by `/` under the backend's root; empty for the root.
    key: String,
}

impl Location {
    /// A plain path, or a URL: `file:///abs/path`, `s3://bucket/prefix`,
    /// `memory://name/prefix`.
    pub fn parse(text: &str) -> Result<Self> {
        match url_scheme(text) {
            None => Ok(Self::local(text)),
            Some(_) => Self::object_store(text),
        }
    }

    /// The local directory `dir`.
    pub fn local(dir: impl Into<PathBuf>) -> Self {
        Self {
            backend: Arc::new(LocalDir { root: dir.into() }),
            key: String::new(),
        }
    }

    fn object_store(text: &str) -> Result<Self> {
        let bad = |why: String| Error::Plan(format!("checkpoint store {text}: {why}"));
        let url = url::Url::parse(text).map_err(|e| bad(e.to_string()))?;
        let prefix = url.path().trim_matches('/');
        let (store, local, root): (Arc<dyn ObjectStore>, _, _) = match url.scheme() {
            "file" => {
                let path = url
                    .to_file_path()
                    .map_err(|()| bad("not an absolute local path".into()))?;
                let root = ObjectPath::from_absolute_path(&path).map_err(|e| bad(e.to_string()))?;
                let store = object_store::local::LocalFileSystem::new();
                (Arc::new(store), Some(path), root)
            }
            "memory" => {
                let name = url.host_str().unwrap_or_default().to_string();
                let store = lock(&MEMORY).entry(name).or_default().clone();
                (store, None, parse_key(prefix).map_err(bad)?)
            }
            "s3" => (
                s3(&url).map_err(bad)?,
                None,
                parse_key(prefix).map_err(bad)?,
            ),
            other => {
                return Err(bad(format!(
                    "unknown scheme '{other}' (a path, file://, s3:// or memory://)"
                )));
            }
        };
        let url = text.trim_end_matches('/').to_string();
        let backend = Objects {
            store,
            root,
            url,
            local,
        };
        Ok(Self {
            backend: Arc::new(backend),
            key: String::new(),
        })
    }

    /// `name` in this folder.
    pub fn child(&self, name: &str) -> Self {
        let key = match self.key.is_empty() {
            true => name.to_string(),
            false => format!("{}/{name}", self.key),
        };
        Self {
            backend: self.backend.clone(),
            key,
        }
    }

    /// The last name of the key (empty for the root).
    pub fn name(&self) -> &str {
        self.key.rsplit('/').next().unwrap_or_default()
    }

    /// On the local file system (a plain path or `file://`): its path.
    pub fn local_path(&self) -> Option<PathBuf> {
        self.backend.local_path(&self.key)
    }

    /// An object store rather than a local directory: its errors mean it
    /// did not answer, not that a file is damaged.
    pub fn is_object_store(&self) -> bool {
        self.backend.is_object_store()
    }

    /// Stores `bytes` here, replacing what was there; see the module docs.
    pub fn put(&self, bytes: Vec<u8>) -> Result<()> {
        self.backend.put(&self.key, bytes)
    }

    /// The object here; `None` if there is none.
    pub fn get(&self) -> Result<Option<Vec<u8>>> {
        self.backend.get(&self.key)
    }

    /// True if an object or a folder is here.
    pub fn exists(&self) -> Result<bool> {
        self.backend.exists(&self.key)
    }

    /// The names of the folders in this folder, sorted.
    pub fn folders(&self) -> Result<Vec<String>> {
        self.backend.folders(&self.key)
    }

    /// The names of the objects directly in this folder, sorted.
    pub fn objects(&self) -> Result<Vec<String>> {
        self.backend.objects(&self.key)
    }

    /// Deletes the object here; none is not an error.
    pub fn remove(&self) -> Result<()> {
        self.backend.remove(&self.key)
    }

    /// Deletes this folder and everything in it; none is not an error.
    pub fn remove_all(&self) -> Result<()> {
        self.backend.remove_all(&self.key)
    }

    /// Makes the objects put in this folder durable.
    pub fn sync(&self) -> Result<()> {
        self.backend.sync(&self.key)
    }

    /// Creates this folder if it is not there (a local directory only).
    pub fn make_folder(&self) -> Result<()> {
        self.backend.make_folder(&self.key)
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.backend.describe(&self.key))
    }
}

impl fmt::Debug for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Location({self})")
    }
}

impl PartialEq for Location {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

impl From<PathBuf> for Location {
    fn from(dir: PathBuf) -> Self {
        Self::local(dir)
    }
}

impl From<&Path> for Location {
    fn from(dir: &Path) -> Self {
        Self::local(dir)
    }
}

impl std::str::FromStr for Location {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        Self::parse(text)
    }
}

/// The scheme of `text` if it is a URL (`scheme://...`), not a path.
fn url_scheme(text: &str) -> Option<&str> {
    let (scheme, _) = text.split_once("://")?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    (first.is_ascii_alphabetic() && rest_ok).then_some(scheme)
}

fn parse_key(key: &str) -> std::result::Result<ObjectPath, String> {
    ObjectPath::parse(key).map_err(|e| e.to_string())
}

#[cfg(feature = "s3")]
fn s3(url: &url::Url) -> std::result::Result<Arc<dyn ObjectStore>, String> {
    object_store::aws::AmazonS3Builder::from_env()
        .with_url(url.as_str())
        .build()
        .map(|s| Arc::new(s) as Arc<dyn ObjectStore>)
        .map_err(|e| e.to_string())
}

#[cfg(not(feature = "s3"))]
fn s3(_: &url::Url) -> std::result::Result<Arc<dyn ObjectStore>, String> {
    Err("this vigil was built without S3 support (cargo build --features s3)".into())
}

/// The `memory://` stores of this process, by name.
static MEMORY: LazyLock<Mutex<HashMap<String, Arc<object_store::memory::InMemory>>>> =
    LazyLock::new(Default::default);

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a checkpoint store needs of where it keeps its files; keys are
/// relative to the backend's root. See [`Location`]'s methods.
trait Backend: Send + Sync {
    fn put(&self, key: &str, bytes: Vec<u8>) -> Result<()>;
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>>;
    fn exists(&self, key: &str) -> Result<bool>;
    fn folders(&self, key: &str) -> Result<Vec<String>>;
    fn objects(&self, key: &str) -> Result<Vec<String>>;
    fn remove(&self, key: &str) -> Result<()>;
    fn remove_all(&self, key: &str) -> Result<()>;
    fn sync(&self, key: &str) -> Result<()>;
    fn make_folder(&self, key: &str) -> Result<()>;
    fn describe(&self, key: &str) -> String;
    fn local_path(&self, key: &str) -> Option<PathBuf>;
    fn is_object_store(&self) -> bool;
}

/// A local directory.
struct LocalDir {
    root: PathBuf,
}

impl LocalDir {
    fn path(&self, key: &str) -> PathBuf {
        match key.is_empty() {
            true => self.root.clone(),
            false => self.root.join(key),
        }
    }
}

impl Backend for LocalDir {
    /// Writes a temporary file beside it, fsyncs and renames it; the name
    /// is durable once the folder is synced.
    fn put(&self, key: &str, bytes: Vec<u8>) -> Result<()> {
        let path = self.path(key);
        let mut name = path.file_name().unwrap_or_default().to_os_string();
        name.push(".tmp");
        let tmp = path.with_file_name(name);
        let mut file = match File::create(&tmp) {
            Err(e) if e.kind() == ErrorKind::NotFound => {
                // The folder is made with its first file, as on an object store.
                if let Some(parent) = tmp.parent() {
                    fs::create_dir_all(parent)
                        .map_err(|e| Error::io(format!("cannot create {}", parent.display()), e))?;
                }
                File::create(&tmp)
            }
            other => other,
        }
        .map_err(|e| Error::io(format!("cannot create {}", tmp.display()), e))?;
        file.write_all(&bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| Error::io(format!("cannot write {}", tmp.display()), e))?;
        fs::rename(&tmp, &path)
            .map_err(|e| Error::io(format!("cannot rename {}", tmp.display()), e))
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let path = self.path(key);
        match fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("cannot read {}", path.display()), e)),
        }
    }

    fn exists(&self, key: &str) -> Result<bool> {
        Ok(self.path(key).exists())
    }

    /// The directories in it; a missing directory is an error, as it was
    /// before stores were pluggable.
    fn folders(&self, key: &str) -> Result<Vec<String>> {
        let dir = self.path(key);
        let unreadable = |e| Error::io(format!("cannot read {}", dir.display()), e);
        let mut found = Vec::new();
        for entry in fs::read_dir(&dir).map_err(unreadable)? {
            let entry = entry.map_err(unreadable)?;
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if let (true, Some(name)) = (is_dir, entry.file_name().to_str()) {
                found.push(name.to_string());
            }
        }
        found.sort();
        Ok(found)
    }

    fn objects(&self, key: &str) -> Result<Vec<String>> {
        let dir = self.path(key);
        let unreadable = |e| Error::io(format!("cannot read {}", dir.display()), e);
        let mut found = Vec::new();
        for entry in fs::read_dir(&dir).map_err(unreadable)? {
            let entry = entry.map_err(unreadable)?;
            let is_file = entry.file_type().is_ok_and(|t| t.is_file());
            if let (true, Some(name)) = (is_file, entry.file_name().to_str()) {
                found.push(name.to_string());
            }
        }
        found.sort();
        Ok(found)
    }

    fn remove(&self, key: &str) -> Result<()> {
        let path = self.path(key);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != ErrorKind::NotFound => {
                Err(Error::io(format!("cannot remove {}", path.display()), e))
            }
            _ => Ok(()),
        }
    }

    fn remove_all(&self, key: &str) -> Result<()> {
        let path = self.path(key);
        match fs::remove_dir_all(&path) {
            Err(e) if e.kind() != ErrorKind::NotFound => {
                Err(Error::io(format!("cannot remove {}", path.display()), e))
            }
            _ => Ok(()),
        }
    }

    fn sync(&self, key: &str) -> Result<()> {
        sync_dir(&self.path(key))
    }

    /// Creates it and syncs its parent, so that the folder stays.
    fn make_folder(&self, key: &str) -> Result<()> {
        let dir = self.path(key);
        fs::create_dir_all(&dir).map_err(|e| {
            Error::io(
                format!("cannot create checkpoint directory {}", dir.display()),
                e,
            )
        })?;
        match dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            Some(parent) => sync_dir(parent),
            None => Ok(()),
        }
    }

    fn describe(&self, key: &str) -> String {
        self.path(key).display().to_string()
    }

    fn local_path(&self, key: &str) -> Option<PathBuf> {
        Some(self.path(key))
    }

    fn is_object_store(&self) -> bool {
        false
    }
}

/// Makes the entries of directory `dir` durable.
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(format!("cannot sync directory {}", dir.display()), e))
}

/// A store of the `object_store` crate, under a root prefix.
struct Objects {
    store: Arc<dyn ObjectStore>,
    root: ObjectPath,
    /// The URL it was opened by, without a trailing `/`.
    url: String,
    /// For `file://`: the root's path.
    local: Option<PathBuf>,
}

impl Objects {
    fn path(&self, key: &str) -> Result<ObjectPath> {
        let full = match (self.root.as_ref(), key) {
            (root, "") => root.to_string(),
            ("", key) => key.to_string(),
            (root, key) => format!("{root}/{key}"),
        };
        ObjectPath::parse(&full)
            .map_err(|e| Error::Plan(format!("{}: not an object name: {e}", self.describe(key))))
    }

    /// A failed call: the store did not answer (or refused).
    fn failed(&self, what: &str, key: &str, e: object_store::Error) -> Error {
        Error::Connector(format!(
            "checkpoint store: cannot {what} {}: {e}",
            self.describe(key)
        ))
    }

    /// Every object under the folder `key`.
    fn list(&self, key: &str) -> Result<Vec<ObjectPath>> {
        let prefix = self.path(key)?;
        let store = self.store.clone();
        wait(async move {
            store
                .list(Some(&prefix))
                .map_ok(|meta| meta.location)
                .try_collect::<Vec<_>>()
                .await
        })?
        .map_err(|e| self.failed("list", key, e))
    }
}

impl Backend for Objects {
    fn put(&self, key: &str, bytes: Vec<u8>) -> Result<()> {
        let path = self.path(key)?;
        let store = self.store.clone();
        wait(async move { store.put(&path, PutPayload::from(bytes)).await })?
            .map(|_| ())
            .map_err(|e| self.failed("write", key, e))
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let path = self.path(key)?;
        let store = self.store.clone();
        let got = wait(async move {
            match store.get(&path).await {
                Ok(found) => found.bytes().await.map(|b| Some(b.to_vec())),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })?;
        got.map_err(|e| self.failed("read", key, e))
    }

    fn exists(&self, key: &str) -> Result<bool> {
        let path = self.path(key)?;
        let store = self.store.clone();
        let head = wait(async move { store.head(&path).await })?;
        match head {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(!self.list(key)?.is_empty()),
            Err(e) => Err(self.failed("read", key, e)),
        }
    }

    /// The folders that hold an object: from every key under it, since a
    /// `LocalFileSystem` keeps empty directories that are not folders here.
    fn folders(&self, key: &str) -> Result<Vec<String>> {
        let prefix = self.path(key)?;
        let found: BTreeSet<String> = self
            .list(key)?
            .iter()
            .filter_map(|path| {
                let mut rest = path.prefix_match(&prefix)?;
                let folder = rest.next()?;
                rest.next().map(|_| folder.as_ref().to_string())
            })
            .collect();
        Ok(found.into_iter().collect())
    }

    fn objects(&self, key: &str) -> Result<Vec<String>> {
        let prefix = self.path(key)?;
        let mut found: Vec<String> = self
            .list(key)?
            .iter()
            .filter_map(|path| {
                let mut rest = path.prefix_match(&prefix)?;
                let name = rest.next()?;
                rest.next().is_none().then(|| name.as_ref().to_string())
            })
            .collect();
        found.sort();
        Ok(found)
    }

    fn remove(&self, key: &str) -> Result<()> {
        let path = self.path(key)?;
        let store = self.store.clone();
        match wait(async move { store.delete(&path).await })? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.failed("delete", key, e)),
        }
    }

    fn remove_all(&self, key: &str) -> Result<()> {
        let paths = self.list(key)?;
        let store = self.store.clone();
        let deleted = wait(async move {
            let paths = futures::stream::iter(paths.into_iter().map(Ok)).boxed();
            let answers: Vec<_> = store.delete_stream(paths).collect().await;
            answers
                .into_iter()
                .filter_map(|a| a.err())
                .find(|e| !matches!(e, object_store::Error::NotFound { .. }))
        })?;
        if let Some(e) = deleted {
            return Err(self.failed("delete", key, e));
        }
        // What a LocalFileSystem leaves: empty directories, and the
        // temporary file of a put that never finished.
        if let Some(dir) = self.local_path(key).filter(|_| !key.is_empty()) {
            let _ = fs::remove_dir_all(dir);
        }
        Ok(())
    }

    fn sync(&self, _: &str) -> Result<()> {
        Ok(())
    }

    fn make_folder(&self, _: &str) -> Result<()> {
        Ok(())
    }

    fn describe(&self, key: &str) -> String {
        match key.is_empty() {
            true => self.url.clone(),
            false => format!("{}/{key}", self.url),
        }
    }

    fn local_path(&self, key: &str) -> Option<PathBuf> {
        let root = self.local.as_ref()?;
        Some(match key.is_empty() {
            true => root.clone(),
            false => root.join(key),
        })
    }

    fn is_object_store(&self) -> bool {
        true
    }
}

/// Runs `future` on the stores' own runtime and waits for its answer on
/// this thread (see the module docs for why).
fn wait<T: Send + 'static>(future: impl Future<Output = T> + Send + 'static) -> Result<T> {
    static RUNTIME: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> =
        OnceLock::new();
    let runtime = RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("vigil-store")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| {
            Error::Connector(format!("cannot start the checkpoint store's runtime: {e}"))
        })?;
    let (answer, answered) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = answer.send(future.await);
    });
    answered
        .recv()
        .map_err(|_| Error::Connector("a checkpoint store call stopped without an answer".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stores(dir: &Path) -> Vec<Location> {
        let file = format!("file://{}/file", dir.display());
        vec![
            Location::local(dir.join("local")),
            Location::parse(&file).unwrap(),
            Location::parse("memory://backend-tests/some/prefix").unwrap(),
        ]
    }

    #[test]
    fn put_get_list_and_remove_behave_alike() {
        let dir = tempfile::tempdir().unwrap();
        for root in stores(dir.path()) {
            root.make_folder().unwrap();
            let q = root.child("q1");
            assert_eq!(q.child("chk-1").child("a").get().unwrap(), None, "{root}");
            q.child("chk-1").child("a").put(b"one".to_vec()).unwrap();
            q.child("chk-1").child("a").put(b"two".to_vec()).unwrap();
            q.child("chk-2").child("b").put(b"x".to_vec()).unwrap();
            q.sync().unwrap();
            let got = q.child("chk-1").child("a").get().unwrap();
            assert_eq!(got.as_deref(), Some(&b"two"[..]), "{root}");
            assert_eq!(q.folders().unwrap(), ["chk-1", "chk-2"], "{root}");
            assert_eq!(root.folders().unwrap(), ["q1"], "{root}");
            assert_eq!(q.child("chk-1").objects().unwrap(), ["a"], "{root}");
            assert!(q.child("chk-2").exists().unwrap());
            q.child("chk-1").remove_all().unwrap();
            q.child("chk-1").remove_all().unwrap();
            q.child("chk-2").child("b").remove().unwrap();
            q.child("chk-2").child("b").remove().unwrap();
            let left = q.folders().unwrap();
            match root.is_object_store() {
                true => assert!(left.is_empty(), "{root}: {left:?}"),
                // A local directory's empty folder stays a folder.
                false => assert_eq!(left, ["chk-2"]),
            }
            assert!(!q.child("chk-1").exists().unwrap(), "{root}");
        }
    }

    #[test]
    fn a_file_url_keeps_the_local_layout() {
        let dir = tempfile::tempdir().unwrap();
        let root = Location::parse(&format!("file://{}", dir.path().display())).unwrap();
        root.child("q%2Eq1")
            .child("manifest.json")
            .put(b"{}".to_vec())
            .unwrap();
        assert!(dir.path().join("q%2Eq1/manifest.json").is_file());
        assert_eq!(root.local_path().unwrap(), dir.path());
        assert_eq!(
            root.child("q").to_string(),
            format!("file://{}/q", dir.path().display())
        );
    }

    #[test]
    fn paths_and_urls_are_told_apart() {
        assert!(!Location::parse("ck").unwrap().is_object_store());
        assert!(!Location::parse("/a/b:c").unwrap().is_object_store());
        assert!(Location::parse("memory://x").unwrap().is_object_store());
        let bad = Location::parse("ftp://host/x").unwrap_err().to_string();
        assert!(bad.contains("unknown scheme 'ftp'"), "{bad}");
        let relative = Location::parse("file://relative/x")
            .unwrap_err()
            .to_string();
        assert!(
            relative.contains("checkpoint store file://relative/x"),
            "{relative}"
        );
    }

    #[test]
    fn calls_work_from_inside_a_current_thread_runtime() {
        let root = Location::parse("memory://backend-runtime").unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let got = runtime.block_on(async {
            root.child("a").put(b"x".to_vec()).unwrap();
            root.child("a").get().unwrap()
        });
        assert_eq!(got.as_deref(), Some(&b"x"[..]));
    }
}
