//! `_metadata`: the file whose presence makes a checkpoint complete.
//!
//! Layout: magic `LGCK` (4 bytes), format version (u16 little endian), body length
//! (u32 little endian), the bincode-2 body, CRC32 of the body (u32 little endian).
//! Decoding checks every part and reports what is wrong; a truncated or flipped file
//! is never half-read.

use crate::error::{Result, StateError};
use crate::ids::{CheckpointId, NextOffset};
use crate::keygroup::KeyGroupRange;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The magic bytes that open every `_metadata` file.
pub const MAGIC: &[u8; 4] = b"LGCK";
/// The newest format version, written only when a source position holds an opaque
/// position (its field `opaque`). A checkpoint is written in the oldest version that
/// holds it, which an older release reads too: version 3 when a position carries a
/// [`SourcePosition::stream_id`], else 2 when a position carries
/// [`SourcePosition::applied`] marks, else 1. This release reads all four.
pub const FORMAT_VERSION: u16 = 4;
/// The oldest format version this release reads.
pub const OLDEST_READABLE: u16 = 1;
/// The file name of the metadata inside a checkpoint directory.
pub const METADATA_FILE: &str = "_metadata";

/// Everything a checkpoint records about the job it was taken from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMetadata {
    pub id: CheckpointId,
    pub job_name: String,
    /// A fingerprint of the job graph (operator ids and kinds, not parallelism): a
    /// checkpoint of another job is refused unless non-restored state is allowed.
    pub fingerprint: u64,
    /// Wall-clock time of completion, milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// The parallelism the job ran with when the checkpoint was taken.
    pub parallelism: u16,
    pub max_parallelism: u16,
    /// Whether this is the final checkpoint of a finished (bounded or stopped) run.
    pub is_final: bool,
    /// One entry per snapshotted operator subtask.
    pub subtasks: Vec<SubtaskSnapshot>,
    /// The union list of source positions (Flink's union list state): on restore every
    /// source subtask takes the splits its deterministic assignment gives it.
    pub positions: Vec<SourcePosition>,
}

/// The snapshot of one operator subtask.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubtaskSnapshot {
    /// The operator's stable id (its `uid`).
    pub operator: String,
    pub subtask: u16,
    /// Key groups this subtask owned, for keyed state.
    pub key_groups: Option<KeyGroupRange>,
    /// The RocksDB checkpoint directory, relative to the checkpoint directory.
    pub state_dir: Option<String>,
    /// Every file of `state_dir` with its size and CRC32.
    pub files: Vec<FileEntry>,
    /// Small operator state kept inline (for example a sink's pending commits).
    pub inline_state: Vec<u8>,
}

/// One file of a subtask's state directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    pub name: String,
    pub size: u64,
    pub crc32: u32,
}

/// The position of one source split.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SourcePosition {
    /// The stream the split belongs to (a Kafka topic, or `sequence`).
    pub stream: String,
    /// The split within the stream (a Kafka partition, a sequence split).
    pub partition: i32,
    pub next: NextOffset,
    /// For bounded sources: the offset at which the split ends (exclusive).
    pub end: Option<NextOffset>,
    /// For a split whose records carry their upstream coordinates (a topic written by
    /// a lockgate Kafka sink, read with `origin_headers`): the highest upstream offset
    /// applied from each upstream split, sorted by stream and partition. A replayed
    /// record at or below its mark is a duplicate of the upstream stage's replay.
    pub applied: Vec<UpstreamMark>,
    /// The identity of the stream the offsets belong to, when the source knows one (a
    /// Kafka topic id: a topic deleted and created again under the same name has
    /// another id, and offsets that start over). `None`: unknown (a broker that does not
    /// report ids, or a checkpoint of an older format).
    pub stream_id: Option<[u8; 16]>,
    /// The position itself, when the source's positions are not offsets (format
    /// version 4). `next` is then 0 and means nothing: tools that work on offsets refuse
    /// such a split.
    pub opaque: Option<OpaquePosition>,
}

/// A split's position that only its source reads: a Kinesis sequence number (decimal
/// text, up to 39 digits), a PostgreSQL LSN, a RabbitMQ stream offset. At most
/// [`OpaquePosition::MAX_LEN`] bytes: [`OpaquePosition::new`] refuses more, and a
/// checkpoint holding more is refused when it is written and when it is read.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct OpaquePosition(Vec<u8>);

impl OpaquePosition {
    /// The most bytes one position may hold.
    pub const MAX_LEN: usize = 256;

    /// `bytes` as a position; an error says how long it is when it holds more than
    /// [`OpaquePosition::MAX_LEN`] bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> std::result::Result<OpaquePosition, String> {
        let bytes = bytes.into();
        match bytes.len() {
            n if n > Self::MAX_LEN => Err(format!(
                "an opaque position of {n} bytes, at most {} are allowed",
                Self::MAX_LEN
            )),
            _ => Ok(OpaquePosition(bytes)),
        }
    }

    /// The bytes the source wrote.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl SourcePosition {
    /// Split `partition` of `stream` continues at `next`: no end, no upstream marks,
    /// no stream identity (what most sources checkpoint).
    pub fn new(stream: impl Into<String>, partition: i32, next: NextOffset) -> SourcePosition {
        SourcePosition {
            stream: stream.into(),
            partition,
            next,
            end: None,
            applied: Vec::new(),
            stream_id: None,
            opaque: None,
        }
    }

    /// Split `split` of `stream` continues at `position`, which only its source reads
    /// (`next` is 0).
    pub fn opaque(
        stream: impl Into<String>,
        split: i32,
        position: OpaquePosition,
    ) -> SourcePosition {
        SourcePosition {
            opaque: Some(position),
            ..SourcePosition::new(stream, split, NextOffset(0))
        }
    }

    /// The same position of a bounded split that ends at `end` (exclusive).
    pub fn with_end(mut self, end: Option<NextOffset>) -> SourcePosition {
        self.end = end;
        self
    }
}

/// The highest offset of one upstream split applied through a downstream split.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct UpstreamMark {
    pub stream: String,
    pub partition: i32,
    pub offset: i64,
}

/// Format version 1: its source positions had no marks.
mod v1 {
    use super::{NextOffset, SubtaskSnapshot};
    use crate::ids::CheckpointId;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    pub(super) struct CheckpointMetadata {
        id: CheckpointId,
        job_name: String,
        fingerprint: u64,
        created_ms: u64,
        parallelism: u16,
        max_parallelism: u16,
        is_final: bool,
        subtasks: Vec<SubtaskSnapshot>,
        positions: Vec<SourcePosition>,
    }

    #[derive(Serialize, Deserialize)]
    struct SourcePosition {
        stream: String,
        partition: i32,
        next: NextOffset,
        end: Option<NextOffset>,
    }

    impl CheckpointMetadata {
        /// `m` in version 1, if it has no marks, no stream ids and no opaque positions
        /// (which version 1 cannot hold).
        pub(super) fn of(m: &super::CheckpointMetadata) -> Option<CheckpointMetadata> {
            if m.positions
                .iter()
                .any(|p| !p.applied.is_empty() || p.stream_id.is_some() || p.opaque.is_some())
            {
                return None;
            }
            Some(CheckpointMetadata {
                id: m.id,
                job_name: m.job_name.clone(),
                fingerprint: m.fingerprint,
                created_ms: m.created_ms,
                parallelism: m.parallelism,
                max_parallelism: m.max_parallelism,
                is_final: m.is_final,
                subtasks: m.subtasks.clone(),
                positions: m
                    .positions
                    .iter()
                    .map(|p| SourcePosition {
                        stream: p.stream.clone(),
                        partition: p.partition,
                        next: p.next,
                        end: p.end,
                    })
                    .collect(),
            })
        }
    }

    impl From<CheckpointMetadata> for super::CheckpointMetadata {
        fn from(m: CheckpointMetadata) -> Self {
            super::CheckpointMetadata {
                id: m.id,
                job_name: m.job_name,
                fingerprint: m.fingerprint,
                created_ms: m.created_ms,
                parallelism: m.parallelism,
                max_parallelism: m.max_parallelism,
                is_final: m.is_final,
                subtasks: m.subtasks,
                positions: m
                    .positions
                    .into_iter()
                    .map(|p| super::SourcePosition {
                        stream: p.stream,
                        partition: p.partition,
                        next: p.next,
                        end: p.end,
                        applied: Vec::new(),
                        stream_id: None,
                        opaque: None,
                    })
                    .collect(),
            }
        }
    }
}

/// Format version 2: its source positions had marks but no stream ids.
mod v2 {
    use super::{NextOffset, SubtaskSnapshot, UpstreamMark};
    use crate::ids::CheckpointId;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    pub(super) struct CheckpointMetadata {
        id: CheckpointId,
        job_name: String,
        fingerprint: u64,
        created_ms: u64,
        parallelism: u16,
        max_parallelism: u16,
        is_final: bool,
        subtasks: Vec<SubtaskSnapshot>,
        positions: Vec<SourcePosition>,
    }

    #[derive(Serialize, Deserialize)]
    struct SourcePosition {
        stream: String,
        partition: i32,
        next: NextOffset,
        end: Option<NextOffset>,
        applied: Vec<UpstreamMark>,
    }

    impl CheckpointMetadata {
        /// `m` in version 2, if it has no stream ids and no opaque positions (which
        /// version 2 cannot hold).
        pub(super) fn of(m: &super::CheckpointMetadata) -> Option<CheckpointMetadata> {
            if m.positions
                .iter()
                .any(|p| p.stream_id.is_some() || p.opaque.is_some())
            {
                return None;
            }
            Some(CheckpointMetadata {
                id: m.id,
                job_name: m.job_name.clone(),
                fingerprint: m.fingerprint,
                created_ms: m.created_ms,
                parallelism: m.parallelism,
                max_parallelism: m.max_parallelism,
                is_final: m.is_final,
                subtasks: m.subtasks.clone(),
                positions: m
                    .positions
                    .iter()
                    .map(|p| SourcePosition {
                        stream: p.stream.clone(),
                        partition: p.partition,
                        next: p.next,
                        end: p.end,
                        applied: p.applied.clone(),
                    })
                    .collect(),
            })
        }
    }

    impl From<CheckpointMetadata> for super::CheckpointMetadata {
        fn from(m: CheckpointMetadata) -> Self {
            super::CheckpointMetadata {
                id: m.id,
                job_name: m.job_name,
                fingerprint: m.fingerprint,
                created_ms: m.created_ms,
                parallelism: m.parallelism,
                max_parallelism: m.max_parallelism,
                is_final: m.is_final,
                subtasks: m.subtasks,
                positions: m
                    .positions
                    .into_iter()
                    .map(|p| super::SourcePosition {
                        stream: p.stream,
                        partition: p.partition,
                        next: p.next,
                        end: p.end,
                        applied: p.applied,
                        stream_id: None,
                        opaque: None,
                    })
                    .collect(),
            }
        }
    }
}

/// Format version 3: its source positions had marks and stream ids, but no opaque
/// positions.
mod v3 {
    use super::{NextOffset, SubtaskSnapshot, UpstreamMark};
    use crate::ids::CheckpointId;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    pub(super) struct CheckpointMetadata {
        id: CheckpointId,
        job_name: String,
        fingerprint: u64,
        created_ms: u64,
        parallelism: u16,
        max_parallelism: u16,
        is_final: bool,
        subtasks: Vec<SubtaskSnapshot>,
        positions: Vec<SourcePosition>,
    }

    #[derive(Serialize, Deserialize)]
    struct SourcePosition {
        stream: String,
        partition: i32,
        next: NextOffset,
        end: Option<NextOffset>,
        applied: Vec<UpstreamMark>,
        stream_id: Option<[u8; 16]>,
    }

    impl CheckpointMetadata {
        /// `m` in version 3, if it has no opaque positions (which version 3 cannot
        /// hold).
        pub(super) fn of(m: &super::CheckpointMetadata) -> Option<CheckpointMetadata> {
            if m.positions.iter().any(|p| p.opaque.is_some()) {
                return None;
            }
            Some(CheckpointMetadata {
                id: m.id,
                job_name: m.job_name.clone(),
                fingerprint: m.fingerprint,
                created_ms: m.created_ms,
                parallelism: m.parallelism,
                max_parallelism: m.max_parallelism,
                is_final: m.is_final,
                subtasks: m.subtasks.clone(),
                positions: m
                    .positions
                    .iter()
                    .map(|p| SourcePosition {
                        stream: p.stream.clone(),
                        partition: p.partition,
                        next: p.next,
                        end: p.end,
                        applied: p.applied.clone(),
                        stream_id: p.stream_id,
                    })
                    .collect(),
            })
        }
    }

    impl From<CheckpointMetadata> for super::CheckpointMetadata {
        fn from(m: CheckpointMetadata) -> Self {
            super::CheckpointMetadata {
                id: m.id,
                job_name: m.job_name,
                fingerprint: m.fingerprint,
                created_ms: m.created_ms,
                parallelism: m.parallelism,
                max_parallelism: m.max_parallelism,
                is_final: m.is_final,
                subtasks: m.subtasks,
                positions: m
                    .positions
                    .into_iter()
                    .map(|p| super::SourcePosition {
                        stream: p.stream,
                        partition: p.partition,
                        next: p.next,
                        end: p.end,
                        applied: p.applied,
                        stream_id: p.stream_id,
                        opaque: None,
                    })
                    .collect(),
            }
        }
    }
}

/// The first source position whose opaque position is longer than
/// [`OpaquePosition::MAX_LEN`], described.
fn check_opaque_lengths(m: &CheckpointMetadata) -> std::result::Result<(), String> {
    m.positions.iter().try_for_each(|p| match &p.opaque {
        Some(o) if o.0.len() > OpaquePosition::MAX_LEN => Err(format!(
            "split {} {}: an opaque position of {} bytes, at most {} are allowed",
            p.stream,
            p.partition,
            o.0.len(),
            OpaquePosition::MAX_LEN
        )),
        _ => Ok(()),
    })
}

fn bincode_config() -> impl bincode::config::Config {
    bincode::config::standard()
        .with_little_endian()
        .with_fixed_int_encoding()
}

impl CheckpointMetadata {
    /// Encodes the metadata in the versioned, checksummed file format, in the oldest
    /// version that holds it: 1 when no source position carries marks, a stream id or
    /// an opaque position, 2 when marks but no ids, 3 when ids, and 4 only when some
    /// position is opaque. An opaque position longer than [`OpaquePosition::MAX_LEN`]
    /// is [`StateError::Encode`].
    pub fn encode(&self) -> Result<Vec<u8>> {
        check_opaque_lengths(self).map_err(StateError::Encode)?;
        let encoded = if let Some(old) = v1::CheckpointMetadata::of(self) {
            bincode::serde::encode_to_vec(&old, bincode_config()).map(|b| (1u16, b))
        } else if let Some(old) = v2::CheckpointMetadata::of(self) {
            bincode::serde::encode_to_vec(&old, bincode_config()).map(|b| (2u16, b))
        } else if let Some(old) = v3::CheckpointMetadata::of(self) {
            bincode::serde::encode_to_vec(&old, bincode_config()).map(|b| (3u16, b))
        } else {
            bincode::serde::encode_to_vec(self, bincode_config()).map(|b| (FORMAT_VERSION, b))
        };
        let (version, body) = encoded.map_err(|e| StateError::Encode(e.to_string()))?;
        let mut out = Vec::with_capacity(body.len() + 14);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
        out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        Ok(out)
    }

    /// Decodes and verifies bytes read from `path` (the path only names errors). Metadata
    /// naming a state directory or file that is not one plain path component is
    /// [`StateError::UnsafeName`], naming the checkpoint and the entry.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<CheckpointMetadata> {
        let corrupt = |reason: String| StateError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };
        if bytes.len() < 14 {
            return Err(corrupt(format!("truncated: {} bytes", bytes.len())));
        }
        if &bytes[0..4] != MAGIC {
            return Err(corrupt("bad magic (not a lockgate _metadata file)".into()));
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        if !(OLDEST_READABLE..=FORMAT_VERSION).contains(&version) {
            return Err(corrupt(format!(
                "format version {version}, this release reads {OLDEST_READABLE} to {FORMAT_VERSION}"
            )));
        }
        let len = u32::from_le_bytes(bytes[6..10].try_into().unwrap()) as usize;
        if bytes.len() != 10 + len + 4 {
            return Err(corrupt(format!(
                "length mismatch: header says {} body bytes, file has {}",
                len,
                bytes.len().saturating_sub(14)
            )));
        }
        let body = &bytes[10..10 + len];
        let stored = u32::from_le_bytes(bytes[10 + len..].try_into().unwrap());
        let actual = crc32fast::hash(body);
        if stored != actual {
            return Err(corrupt(format!(
                "CRC mismatch: stored {stored:08x}, computed {actual:08x}"
            )));
        }
        let undecodable =
            |e: bincode::error::DecodeError| corrupt(format!("undecodable body: {e}"));
        let (meta, used): (CheckpointMetadata, usize) = match version {
            1 => {
                let (m, used) = bincode::serde::decode_from_slice::<v1::CheckpointMetadata, _>(
                    body,
                    bincode_config(),
                )
                .map_err(undecodable)?;
                (m.into(), used)
            }
            2 => {
                let (m, used) = bincode::serde::decode_from_slice::<v2::CheckpointMetadata, _>(
                    body,
                    bincode_config(),
                )
                .map_err(undecodable)?;
                (m.into(), used)
            }
            3 => {
                let (m, used) = bincode::serde::decode_from_slice::<v3::CheckpointMetadata, _>(
                    body,
                    bincode_config(),
                )
                .map_err(undecodable)?;
                (m.into(), used)
            }
            _ => bincode::serde::decode_from_slice(body, bincode_config()).map_err(undecodable)?,
        };
        if used != body.len() {
            return Err(corrupt("trailing bytes in body".into()));
        }
        check_opaque_lengths(&meta).map_err(corrupt)?;
        // The CRC is not a secret: a well-formed file may still name paths outside the
        // checkpoint. No caller ever sees such metadata.
        crate::names::check_metadata(&meta).map_err(|detail| StateError::UnsafeName {
            checkpoint: path.parent().unwrap_or(path).to_path_buf(),
            detail,
        })?;
        Ok(meta)
    }

    /// Reads and verifies `<chk_dir>/_metadata`, which must be a regular file (a
    /// symbolic link is refused, not followed).
    pub fn read(chk_dir: &Path) -> Result<CheckpointMetadata> {
        let path = chk_dir.join(METADATA_FILE);
        let mut bytes = Vec::new();
        crate::names::open_no_follow(&path)
            .and_then(|mut f| std::io::Read::read_to_end(&mut f, &mut bytes))
            .map_err(StateError::io("read", &path))?;
        CheckpointMetadata::decode(&bytes, &path)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn sample(id: u64) -> CheckpointMetadata {
        CheckpointMetadata {
            id: CheckpointId(id),
            job_name: "orders".into(),
            fingerprint: 42,
            created_ms: 1_700_000_000_000,
            parallelism: 2,
            max_parallelism: 128,
            is_final: false,
            subtasks: vec![SubtaskSnapshot {
                operator: "rolling_sum".into(),
                subtask: 0,
                key_groups: Some(KeyGroupRange { start: 0, end: 63 }),
                state_dir: Some("rolling_sum-0".into()),
                files: vec![FileEntry {
                    name: "000009.sst".into(),
                    size: 1234,
                    crc32: 0xdead_beef,
                }],
                inline_state: vec![1, 2, 3],
            }],
            positions: vec![SourcePosition {
                stream: "orders".into(),
                partition: 3,
                next: NextOffset(17),
                end: None,
                applied: vec![UpstreamMark {
                    stream: "orders-raw".into(),
                    partition: 5,
                    offset: 99,
                }],
                stream_id: Some(*b"\x3f\x01topic-id-bytes"),
                opaque: None,
            }],
        }
    }

    /// Frames `body` as a `_metadata` file of format `version`.
    fn framed(version: u16, body: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&version.to_le_bytes());
        bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
        bytes.extend_from_slice(body);
        bytes.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
        bytes
    }

    #[test]
    fn reads_format_version_1_as_positions_without_marks() {
        // Version 1's layout, written field by field as that release's serde did.
        #[derive(Serialize)]
        struct V1Position<'a> {
            stream: &'a str,
            partition: i32,
            next: NextOffset,
            end: Option<NextOffset>,
        }
        #[derive(Serialize)]
        struct V1<'a> {
            id: CheckpointId,
            job_name: &'a str,
            fingerprint: u64,
            created_ms: u64,
            parallelism: u16,
            max_parallelism: u16,
            is_final: bool,
            subtasks: &'a [SubtaskSnapshot],
            positions: Vec<V1Position<'a>>,
        }
        let want = sample(4);
        let old = V1 {
            id: want.id,
            job_name: &want.job_name,
            fingerprint: want.fingerprint,
            created_ms: want.created_ms,
            parallelism: want.parallelism,
            max_parallelism: want.max_parallelism,
            is_final: want.is_final,
            subtasks: &want.subtasks,
            positions: want
                .positions
                .iter()
                .map(|p| V1Position {
                    stream: &p.stream,
                    partition: p.partition,
                    next: p.next,
                    end: p.end,
                })
                .collect(),
        };
        let body = bincode::serde::encode_to_vec(&old, bincode_config()).unwrap();
        let bytes = framed(1, &body);
        let got = CheckpointMetadata::decode(&bytes, Path::new("x")).unwrap();
        let mut expect = want.clone();
        expect.positions[0].applied.clear();
        expect.positions[0].stream_id = None;
        assert_eq!(got, expect);
        // With stream ids it writes version 3.
        assert_eq!(want.encode().unwrap()[4..6], 3u16.to_le_bytes());
        // This release writes a checkpoint without marks or ids as version 1, byte for
        // byte.
        assert_eq!(expect.encode().unwrap(), bytes);
        // A newer body under a version-1 header does not decode as version 1.
        let mut v3 = want.encode().unwrap();
        v3[4..6].copy_from_slice(&1u16.to_le_bytes());
        assert!(CheckpointMetadata::decode(&v3, Path::new("x")).is_err());
        // Nor does an unknown newer version.
        let mut v5 = want.encode().unwrap();
        v5[4..6].copy_from_slice(&5u16.to_le_bytes());
        let err = CheckpointMetadata::decode(&v5, Path::new("x")).unwrap_err();
        assert!(err.to_string().contains("format version 5"), "{err}");
    }

    #[test]
    fn reads_format_version_2_as_positions_without_stream_ids() {
        // Version 2's layout, written field by field as that release's serde did.
        #[derive(Serialize)]
        struct V2Position<'a> {
            stream: &'a str,
            partition: i32,
            next: NextOffset,
            end: Option<NextOffset>,
            applied: &'a [UpstreamMark],
        }
        #[derive(Serialize)]
        struct V2<'a> {
            id: CheckpointId,
            job_name: &'a str,
            fingerprint: u64,
            created_ms: u64,
            parallelism: u16,
            max_parallelism: u16,
            is_final: bool,
            subtasks: &'a [SubtaskSnapshot],
            positions: Vec<V2Position<'a>>,
        }
        let mut want = sample(5);
        want.positions[0].end = Some(NextOffset(40));
        let old = V2 {
            id: want.id,
            job_name: &want.job_name,
            fingerprint: want.fingerprint,
            created_ms: want.created_ms,
            parallelism: want.parallelism,
            max_parallelism: want.max_parallelism,
            is_final: want.is_final,
            subtasks: &want.subtasks,
            positions: want
                .positions
                .iter()
                .map(|p| V2Position {
                    stream: &p.stream,
                    partition: p.partition,
                    next: p.next,
                    end: p.end,
                    applied: &p.applied,
                })
                .collect(),
        };
        let body = bincode::serde::encode_to_vec(&old, bincode_config()).unwrap();
        let bytes = framed(2, &body);
        let got = CheckpointMetadata::decode(&bytes, Path::new("x")).unwrap();
        let mut expect = want.clone();
        expect.positions[0].stream_id = None;
        assert_eq!(got, expect);
        assert!(!expect.positions[0].applied.is_empty());
        // This release writes a checkpoint with marks but no ids as version 2, byte for
        // byte.
        assert_eq!(expect.encode().unwrap(), bytes);
        // A version-3 body under a version-2 header does not decode as version 2.
        let mut v3 = want.encode().unwrap();
        v3[4..6].copy_from_slice(&2u16.to_le_bytes());
        assert!(CheckpointMetadata::decode(&v3, Path::new("x")).is_err());
        // An id without marks is version 3 too, and round-trips.
        let mut ids_only = want.clone();
        ids_only.positions[0].applied.clear();
        let bytes = ids_only.encode().unwrap();
        assert_eq!(bytes[4..6], 3u16.to_le_bytes());
        assert_eq!(
            CheckpointMetadata::decode(&bytes, Path::new("x")).unwrap(),
            ids_only
        );
    }

    #[test]
    fn reads_format_version_3_as_positions_without_opaque_positions() {
        // Version 3's layout, written field by field as that release's serde did.
        #[derive(Serialize)]
        struct V3Position<'a> {
            stream: &'a str,
            partition: i32,
            next: NextOffset,
            end: Option<NextOffset>,
            applied: &'a [UpstreamMark],
            stream_id: Option<[u8; 16]>,
        }
        #[derive(Serialize)]
        struct V3<'a> {
            id: CheckpointId,
            job_name: &'a str,
            fingerprint: u64,
            created_ms: u64,
            parallelism: u16,
            max_parallelism: u16,
            is_final: bool,
            subtasks: &'a [SubtaskSnapshot],
            positions: Vec<V3Position<'a>>,
        }
        let mut want = sample(6);
        want.positions[0].end = Some(NextOffset(40));
        let old = V3 {
            id: want.id,
            job_name: &want.job_name,
            fingerprint: want.fingerprint,
            created_ms: want.created_ms,
            parallelism: want.parallelism,
            max_parallelism: want.max_parallelism,
            is_final: want.is_final,
            subtasks: &want.subtasks,
            positions: want
                .positions
                .iter()
                .map(|p| V3Position {
                    stream: &p.stream,
                    partition: p.partition,
                    next: p.next,
                    end: p.end,
                    applied: &p.applied,
                    stream_id: p.stream_id,
                })
                .collect(),
        };
        let body = bincode::serde::encode_to_vec(&old, bincode_config()).unwrap();
        let bytes = framed(3, &body);
        assert_eq!(
            CheckpointMetadata::decode(&bytes, Path::new("x")).unwrap(),
            want
        );
        // This release writes a checkpoint with stream ids but no opaque position as
        // version 3, byte for byte.
        assert_eq!(want.encode().unwrap(), bytes);
        // A version-4 body under a version-3 header does not decode as version 3.
        let mut v4 = want.clone();
        v4.positions[0].opaque = Some(
            OpaquePosition::new(*b"49590338271490256608559692538361571095921575989136588898")
                .unwrap(),
        );
        let mut v4 = v4.encode().unwrap();
        assert_eq!(v4[4..6], 4u16.to_le_bytes());
        v4[4..6].copy_from_slice(&3u16.to_le_bytes());
        assert!(CheckpointMetadata::decode(&v4, Path::new("x")).is_err());
    }

    #[test]
    fn writes_version_4_only_for_an_opaque_position_and_reads_it_back() {
        let mut m = sample(8);
        m.positions[0].stream_id = None;
        m.positions[0].applied.clear();
        m.positions.push(SourcePosition::opaque(
            "shards",
            0,
            OpaquePosition::new(vec![0, 0xff, b'/', 7]).unwrap(),
        ));
        let bytes = m.encode().unwrap();
        assert_eq!(bytes[4..6], 4u16.to_le_bytes());
        let got = CheckpointMetadata::decode(&bytes, Path::new("x")).unwrap();
        assert_eq!(got, m);
        assert_eq!(got.positions[1].next, NextOffset(0));
        assert_eq!(
            got.positions[1].opaque.as_ref().unwrap().as_bytes(),
            &[0, 0xff, b'/', 7]
        );
        // Without the opaque split it is version 1 again.
        m.positions.pop();
        assert_eq!(m.encode().unwrap()[4..6], 1u16.to_le_bytes());
    }

    #[test]
    fn an_opaque_position_is_at_most_max_len_bytes_written_and_read() {
        assert!(OpaquePosition::new(vec![7; OpaquePosition::MAX_LEN]).is_ok());
        let err = OpaquePosition::new(vec![7; OpaquePosition::MAX_LEN + 1]).unwrap_err();
        assert_eq!(
            err,
            "an opaque position of 257 bytes, at most 256 are allowed"
        );
        // One longer than the bound, as a release without the bound might have built it.
        let mut m = sample(9);
        m.positions[0].opaque = Some(OpaquePosition(vec![7; OpaquePosition::MAX_LEN + 1]));
        let err = m.encode().unwrap_err().to_string();
        assert!(
            err.contains("split orders 3: an opaque position of 257 bytes, at most 256"),
            "{err}"
        );
        let body = bincode::serde::encode_to_vec(&m, bincode_config()).unwrap();
        let err = CheckpointMetadata::decode(&framed(4, &body), Path::new("x"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("split orders 3: an opaque position of 257 bytes, at most 256"),
            "{err}"
        );
        // An opaque position whose length runs past the body (a crafted file with a
        // good CRC) is undecodable, not half-read.
        m.positions[0].opaque = Some(OpaquePosition(vec![7; 4]));
        let mut body = bincode::serde::encode_to_vec(&m, bincode_config()).unwrap();
        let at = body.len() - 4 - 8;
        assert_eq!(body[at..at + 8], 4u64.to_le_bytes());
        body[at..at + 8].copy_from_slice(&5u64.to_le_bytes());
        let err = CheckpointMetadata::decode(&framed(4, &body), Path::new("x"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("undecodable body"), "{err}");
    }

    #[test]
    fn round_trips() {
        let m = sample(7);
        let bytes = m.encode().unwrap();
        assert_eq!(
            CheckpointMetadata::decode(&bytes, Path::new("x")).unwrap(),
            m
        );
    }

    proptest! {
        #[test]
        fn any_single_byte_flip_is_detected(pos in any::<prop::sample::Index>(), bit in 0u8..8) {
            let bytes = sample(3).encode().unwrap();
            let mut bad = bytes.clone();
            let i = pos.index(bad.len());
            bad[i] ^= 1 << bit;
            prop_assert!(CheckpointMetadata::decode(&bad, Path::new("x")).is_err());
        }

        #[test]
        fn any_truncation_is_detected(cut in any::<prop::sample::Index>()) {
            let bytes = sample(3).encode().unwrap();
            let n = cut.index(bytes.len());
            prop_assert!(CheckpointMetadata::decode(&bytes[..n], Path::new("x")).is_err());
        }
    }

    #[test]
    fn a_header_only_file_reaches_the_body_check() {
        // 14 bytes is a whole frame with an empty body: it is checked as one (and the
        // empty body does not decode), not reported as truncated.
        let mut bytes = Vec::new();
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.extend_from_slice(&crc32fast::hash(&[]).to_le_bytes());
        assert_eq!(bytes.len(), 14);
        let err = CheckpointMetadata::decode(&bytes, Path::new("x")).unwrap_err();
        assert!(err.to_string().contains("undecodable body"), "{err}");
        let err = CheckpointMetadata::decode(&bytes[..13], Path::new("x")).unwrap_err();
        assert!(err.to_string().contains("truncated: 13 bytes"), "{err}");
    }
}
