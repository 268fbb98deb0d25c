//! Iceberg's file access over lockgate's own: a local warehouse (`file://` or a plain
//! path) through the file system with every write fsynced before it is referenced,
//! and an object store (`s3://`, `gs://`, `az://`) through the same client and
//! settings as the file sink and the checkpoint store (the section's `endpoint`,
//! `region`, ... over the standard environment variables).
//!
//! Every file is written whole, in one request, when it is closed (a data file,
//! a manifest, a table metadata file): a crash leaves a file complete or absent, never
//! a multipart upload behind. Data files are at most `roll_bytes`; metadata is small.

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use iceberg::io::{
    FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage, StorageConfig,
    StorageFactory,
};
use iceberg::{Error, ErrorKind, Result};
use lockgate_state::store::StoreLocation;
use object_store::path::Path as StorePath;
use object_store::ObjectStore;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::Write;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Makes [`LakeStorage`]: the object-store client settings of the warehouse, applied
/// to every bucket a table's files are in.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LakeStorageFactory {
    /// A location whose client settings (`aws_endpoint`, ...) every bucket takes.
    #[serde(skip)]
    settings: Option<StoreLocation>,
}

impl LakeStorageFactory {
    /// The factory for a warehouse reached with `settings`' client options (None: a
    /// local warehouse, or the environment's settings only).
    pub fn new(settings: Option<&StoreLocation>) -> LakeStorageFactory {
        LakeStorageFactory {
            settings: settings.cloned(),
        }
    }
}

#[typetag::serde]
impl StorageFactory for LakeStorageFactory {
    fn build(&self, _config: &StorageConfig) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(LakeStorage {
            settings: self.settings.clone(),
            stores: Arc::default(),
        }))
    }
}

/// Files of a table, local or in an object store (see the module).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LakeStorage {
    #[serde(skip)]
    settings: Option<StoreLocation>,
    /// One client per bucket, built on first use.
    #[serde(skip)]
    stores: Arc<Mutex<HashMap<String, Arc<dyn ObjectStore>>>>,
}

/// Where a path of a table is.
enum Place {
    Local(PathBuf),
    Store(Arc<dyn ObjectStore>, StorePath),
}

fn io_error(what: &str, path: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Unexpected, format!("{what} {path}: {e}"))
}

/// A local path of `path` (`file:///a/b`, `file:/a/b`, `/a/b`), if it is one.
pub fn local_path(path: &str) -> Option<PathBuf> {
    if let Some(rest) = path.strip_prefix("file://") {
        return Some(PathBuf::from(rest));
    }
    if let Some(rest) = path.strip_prefix("file:") {
        return Some(PathBuf::from(rest));
    }
    path.starts_with('/').then(|| PathBuf::from(path))
}

impl LakeStorage {
    fn place(&self, path: &str) -> Result<Place> {
        if let Some(p) = local_path(path) {
            return Ok(Place::Local(p));
        }
        let (bucket_url, key) =
            object_key(path).map_err(|e| Error::new(ErrorKind::DataInvalid, e))?;
        let mut stores = self.stores.lock().expect("store cache");
        let store = match stores.get(bucket_url) {
            Some(s) => s.clone(),
            None => {
                let mut bucket = StoreLocation::parse(bucket_url)
                    .map_err(|e| Error::new(ErrorKind::DataInvalid, e))?;
                if let Some(settings) = &self.settings {
                    bucket = bucket.with_options_of(settings);
                }
                let (store, _) = bucket
                    .open()
                    .map_err(|e| Error::new(ErrorKind::DataInvalid, e))?;
                stores.insert(bucket_url.to_string(), store.clone());
                store
            }
        };
        Ok(Place::Store(store, key))
    }
}

/// The bucket (`s3://lake`) and the object's key of a table's path
/// (`s3://lake/wh/t/data/f.parquet`). The key is the path's text after the bucket,
/// byte for byte, as every other Iceberg reader takes it: neither decoded as a URL
/// (a `#` or `?` in a partition's value would cut the key short, so that files of
/// different partitions overwrite one another) nor escaped (a `%` or `~` would put
/// the file under a key no reader looks at). A key that would leave its folder
/// (`..`) or has an empty segment is refused.
pub fn object_key(path: &str) -> std::result::Result<(&str, StorePath), String> {
    let (scheme, rest) = path
        .split_once("://")
        .ok_or_else(|| format!("`{path}` is neither a local path nor a store URL"))?;
    let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() || key.is_empty() {
        return Err(format!(
            "`{path}` names no object (write {scheme}://BUCKET/KEY)"
        ));
    }
    let key = StorePath::parse(key).map_err(|e| format!("`{path}`: {e}"))?;
    Ok((&path[..scheme.len() + 3 + bucket.len()], key))
}

/// Writes `bytes` to `path` durably: a temporary file beside it, fsynced, renamed
/// over, and the folder's entry fsynced (folders created on the way are too).
fn write_local(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let parent = path.parent().unwrap_or(std::path::Path::new("/"));
    let mut missing = Vec::new();
    let mut at = parent;
    while !at.exists() {
        missing.push(at.to_path_buf());
        match at.parent() {
            Some(p) => at = p,
            None => break,
        }
    }
    std::fs::create_dir_all(parent)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = parent.join(format!(".{}.tmp", name.unwrap_or_default()));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(parent)?.sync_all()?;
    // A new folder's own entry is in its parent: fsynced from the top down.
    for dir in missing.iter().rev() {
        if let Some(p) = dir.parent() {
            std::fs::File::open(p)?.sync_all()?;
        }
    }
    Ok(())
}

#[async_trait]
#[typetag::serde]
impl Storage for LakeStorage {
    async fn exists(&self, path: &str) -> Result<bool> {
        match self.place(path)? {
            Place::Local(p) => Ok(p.exists()),
            Place::Store(s, key) => match s.head(&key).await {
                Ok(_) => Ok(true),
                Err(object_store::Error::NotFound { .. }) => Ok(false),
                Err(e) => Err(io_error("cannot look for", path, e)),
            },
        }
    }

    async fn metadata(&self, path: &str) -> Result<FileMetadata> {
        let size = match self.place(path)? {
            Place::Local(p) => std::fs::metadata(&p)
                .map_err(|e| io_error("cannot stat", path, e))?
                .len(),
            Place::Store(s, key) => {
                s.head(&key)
                    .await
                    .map_err(|e| io_error("cannot stat", path, e))?
                    .size
            }
        };
        Ok(FileMetadata { size })
    }

    async fn read(&self, path: &str) -> Result<Bytes> {
        match self.place(path)? {
            Place::Local(p) => std::fs::read(&p)
                .map(Bytes::from)
                .map_err(|e| io_error("cannot read", path, e)),
            Place::Store(s, key) => match s.get(&key).await {
                Ok(r) => r
                    .bytes()
                    .await
                    .map_err(|e| io_error("cannot read", path, e)),
                Err(e) => Err(io_error("cannot read", path, e)),
            },
        }
    }

    async fn reader(&self, path: &str) -> Result<Box<dyn FileRead>> {
        Ok(Box::new(Reader {
            storage: self.clone(),
            path: path.to_string(),
        }))
    }

    async fn write(&self, path: &str, bs: Bytes) -> Result<()> {
        match self.place(path)? {
            Place::Local(p) => tokio::task::block_in_place(|| write_local(&p, &bs))
                .map_err(|e| io_error("cannot write", path, e)),
            Place::Store(s, key) => s
                .put(&key, bs.into())
                .await
                .map(|_| ())
                .map_err(|e| io_error("cannot write", path, e)),
        }
    }

    async fn writer(&self, path: &str) -> Result<Box<dyn FileWrite>> {
        Ok(Box::new(Writer {
            storage: self.clone(),
            path: path.to_string(),
            buffer: Vec::new(),
            closed: false,
        }))
    }

    async fn delete(&self, path: &str) -> Result<()> {
        match self.place(path)? {
            Place::Local(p) => match std::fs::remove_file(&p) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(io_error("cannot delete", path, e))
                }
                _ => Ok(()),
            },
            Place::Store(s, key) => match s.delete(&key).await {
                Err(e) if !matches!(e, object_store::Error::NotFound { .. }) => {
                    Err(io_error("cannot delete", path, e))
                }
                _ => Ok(()),
            },
        }
    }

    async fn delete_prefix(&self, path: &str) -> Result<()> {
        match self.place(path)? {
            Place::Local(p) => match std::fs::remove_dir_all(&p) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(io_error("cannot delete", path, e))
                }
                _ => Ok(()),
            },
            Place::Store(s, key) => {
                let mut listed = s.list(Some(&key));
                while let Some(meta) = listed.next().await {
                    let meta = meta.map_err(|e| io_error("cannot list", path, e))?;
                    s.delete(&meta.location)
                        .await
                        .map_err(|e| io_error("cannot delete", path, e))?;
                }
                Ok(())
            }
        }
    }

    async fn delete_stream(&self, mut paths: BoxStream<'static, String>) -> Result<()> {
        while let Some(p) = paths.next().await {
            self.delete(&p).await?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), path.to_string()))
    }

    fn new_output(&self, path: &str) -> Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_string()))
    }
}

/// Reads ranges of one file.
struct Reader {
    storage: LakeStorage,
    path: String,
}

#[async_trait]
impl FileRead for Reader {
    async fn read(&self, range: Range<u64>) -> Result<Bytes> {
        match self.storage.place(&self.path)? {
            Place::Local(p) => {
                use std::io::{Read, Seek, SeekFrom};
                let mut f =
                    std::fs::File::open(&p).map_err(|e| io_error("cannot read", &self.path, e))?;
                f.seek(SeekFrom::Start(range.start))
                    .map_err(|e| io_error("cannot read", &self.path, e))?;
                let mut buf = vec![0; (range.end - range.start) as usize];
                f.read_exact(&mut buf)
                    .map_err(|e| io_error("cannot read", &self.path, e))?;
                Ok(Bytes::from(buf))
            }
            Place::Store(s, key) => s
                .get_range(&key, range)
                .await
                .map_err(|e| io_error("cannot read", &self.path, e)),
        }
    }
}

/// Holds one file's bytes until it is closed, then writes it whole.
struct Writer {
    storage: LakeStorage,
    path: String,
    buffer: Vec<u8>,
    closed: bool,
}

#[async_trait]
impl FileWrite for Writer {
    async fn write(&mut self, bs: Bytes) -> Result<()> {
        self.buffer.extend_from_slice(&bs);
        Ok(())
    }

    async fn close(&mut self) -> Result<()> {
        if self.closed {
            return Err(Error::new(
                ErrorKind::Unexpected,
                format!("{} is already closed", self.path),
            ));
        }
        self.closed = true;
        let bytes = Bytes::from(std::mem::take(&mut self.buffer));
        self.storage.write(&self.path, bytes).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_paths_are_told_from_store_urls() {
        assert_eq!(local_path("file:///a/b"), Some(PathBuf::from("/a/b")));
        assert_eq!(local_path("file:/a/b"), Some(PathBuf::from("/a/b")));
        assert_eq!(local_path("/a/b"), Some(PathBuf::from("/a/b")));
        assert_eq!(local_path("s3://lake/a"), None);
    }

    #[test]
    fn an_object_s_key_is_the_path_after_the_bucket_as_written() {
        fn key(p: &str) -> std::result::Result<(String, String), String> {
            object_key(p).map(|(b, k)| (b.to_string(), k.to_string()))
        }
        assert_eq!(
            key("s3://lake/wh/t/data/f.parquet").unwrap(),
            ("s3://lake".into(), "wh/t/data/f.parquet".into())
        );
        // Neither cut at `#` or `?`, nor decoded, nor escaped: the key readers use.
        for folder in [
            "c=a#b", "c=a?b", "c=50%25", "c=a%20b", "c=x~y", "c=[1]", "c=a b",
        ] {
            let path = format!("s3://lake/t/data/{folder}/f.parquet");
            assert_eq!(
                key(&path).unwrap(),
                ("s3://lake".into(), format!("t/data/{folder}/f.parquet")),
                "{path}"
            );
        }
        assert_eq!(
            key("gs://b:9000/k").unwrap(),
            ("gs://b:9000".into(), "k".into())
        );
        for bad in [
            "s3://lake",
            "s3://lake/",
            "s3:///k",
            "s3://lake/t/../x",
            "s3://lake/a//b",
            "lake/k",
        ] {
            assert!(key(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_written_file_is_read_back_whole_and_in_ranges() {
        let tmp = tempfile::tempdir().unwrap();
        let storage = LakeStorage::default();
        let path = format!("file://{}/t/metadata/v1.json", tmp.path().display());
        let mut w = storage.writer(&path).await.unwrap();
        w.write(Bytes::from_static(b"hello ")).await.unwrap();
        assert!(
            !storage.exists(&path).await.unwrap(),
            "nothing before close"
        );
        w.write(Bytes::from_static(b"world")).await.unwrap();
        w.close().await.unwrap();
        assert!(w.close().await.is_err(), "a second close is an error");
        assert_eq!(&storage.read(&path).await.unwrap()[..], b"hello world");
        assert_eq!(storage.metadata(&path).await.unwrap().size, 11);
        let r = storage.reader(&path).await.unwrap();
        assert_eq!(&r.read(6..11).await.unwrap()[..], b"world");
        storage.delete(&path).await.unwrap();
        storage.delete(&path).await.unwrap();
        assert!(!storage.exists(&path).await.unwrap());
    }
}
