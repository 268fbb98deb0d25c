//! Errors of the state backend; each names the file or checkpoint it concerns.

use std::path::PathBuf;

/// An error of the state backend or the snapshot directory.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// An I/O call failed on the named path.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// RocksDB refused an operation on the named instance.
    #[error("rocksdb at {path}: {message}")]
    Rocks { path: PathBuf, message: String },
    /// A persisted file does not verify (magic, version, CRC, size or decoding).
    #[error("corrupt {path}: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    /// Another live process holds the checkpoint directory.
    #[error("checkpoint directory {path} is locked by another running lockgate process (pid {holder}); one process per checkpoint directory")]
    Locked { path: PathBuf, holder: String },
    /// A checkpoint names a file or directory that is not one plain path component
    /// (see [`crate::names`]); nothing of it is read or written.
    #[error("refusing checkpoint {checkpoint}: {detail}; restore only checkpoints you trust")]
    UnsafeName {
        checkpoint: PathBuf,
        detail: crate::names::UnsafeName,
    },
    /// A file that must not be overwritten already exists.
    #[error("refusing to overwrite existing {path}")]
    AlreadyExists { path: PathBuf },
    /// An object-store request failed (or a store location is misconfigured); `key`
    /// is the URL of the object or location it concerns.
    #[error("checkpoint store: {op} {key}: {message}")]
    Store {
        op: &'static str,
        key: String,
        message: String,
    },
    /// The store holds another writer's `_metadata` under this checkpoint's name
    /// (create-if-absent refused, and the object is not ours): another process
    /// publishes to this checkpoint line. Nothing of the checkpoint is published.
    #[error("checkpoint store: {url}: {reason}; another writer owns this checkpoint line (is the job running elsewhere? stop it, or give each job its own prefix)")]
    Fenced { url: String, reason: String },
    /// A `_metadata` upload failed and the store could not be asked whether it landed:
    /// the checkpoint may be complete in the store. Nothing it references may be
    /// removed; a start that reads the store decides.
    #[error("checkpoint store: cannot tell whether {url} is complete: {reason}; it is kept, and the restart decides from the store")]
    FateUnknown { url: String, reason: String },
    /// An operation refused before it touched anything, with the reason.
    #[error("{0}")]
    Refused(String),
    /// Encoding a value failed.
    #[error("encoding state: {0}")]
    Encode(String),
}

impl StateError {
    /// Wraps an I/O error with the operation and path it concerns.
    pub fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> StateError {
        let path = path.into();
        move |source| StateError::Io { op, path, source }
    }

    pub(crate) fn rocks(path: impl Into<PathBuf>) -> impl FnOnce(rocksdb::Error) -> StateError {
        let path = path.into();
        move |e| StateError::Rocks {
            path,
            message: e.into_string(),
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = StateError> = std::result::Result<T, E>;
