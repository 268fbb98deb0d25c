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
