//! The checkpoint metadata file's encoding (magic, version, checksum, length, payload) and the
//! check of a state file against its recorded size and checksum. The same for every storage.
//!
//! The payload is postcard (format 2); metadata of format 1 (bincode) is still read, through
//! [`super::format_v1`], so checkpoints and savepoints written before stay restorable.

use std::path::Path;

use crate::checkpoint::{CheckpointMetadata, FileHandle, METADATA_VERSION};
use crate::error::{CoreError, Result};

const MAGIC: &[u8; 4] = b"EXCK";
const HEADER_LEN: usize = 4 + 4 + 4 + 8;

/// The bytes of a `_metadata` file.
pub(crate) fn encode_metadata(meta: &CheckpointMetadata) -> Result<Vec<u8>> {
    if meta.version != METADATA_VERSION {
        return Err(CoreError::ser(
            "checkpoint metadata",
            format!("it says format {}; this build writes {METADATA_VERSION}", meta.version),
        ));
    }
    let payload = postcard::to_allocvec(meta).map_err(|e| CoreError::ser("checkpoint metadata", e))?;
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&METADATA_VERSION.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Decodes and verifies the `_metadata` file `bytes` read from `path` (named in errors).
pub(crate) fn decode_metadata(path: &Path, bytes: &[u8]) -> Result<CheckpointMetadata> {
    let corrupt = |reason: String| CoreError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    if bytes.len() < HEADER_LEN || &bytes[..4] != MAGIC {
        return Err(corrupt(
            "not a checkpoint metadata file (bad magic or truncated header)".into(),
        ));
    }
    let version = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    if version > METADATA_VERSION {
        return Err(corrupt(format!(
            "metadata version {version} is newer than this build understands ({METADATA_VERSION})"
        )));
    }
    if version == 0 {
        return Err(corrupt("metadata version 0 does not exist".into()));
    }
    let crc = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    let len = u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes")) as usize;
    let payload = &bytes[HEADER_LEN..];
    if payload.len() != len {
        return Err(corrupt(format!(
            "expected {len} bytes of metadata, found {}",
            payload.len()
        )));
    }
    if crc32fast::hash(payload) != crc {
        return Err(corrupt("metadata checksum mismatch".into()));
    }
    let meta = if version == 1 {
        super::format_v1::decode(payload).map_err(|e| corrupt(format!("undecodable metadata of format 1: {e}")))?
    } else {
        let meta: CheckpointMetadata =
            decode_exact(payload).map_err(|e| corrupt(format!("undecodable metadata: {e}")))?;
        if meta.version != version {
            return Err(corrupt(format!(
                "the header says format {version}, the metadata inside says {}",
                meta.version
            )));
        }
        meta
    };
    for f in meta.files() {
        for name in [&f.name, &f.local_name] {
            if !crate::checkpoint::is_single_component(name) {
                return Err(corrupt(format!(
                    "it names a state file {name:?}, which is not a single file name: refused (a restore \
                     or retention would reach outside the checkpoint's directory)"
                )));
            }
        }
    }
    Ok(meta)
}

/// `bytes` as one postcard value, nothing left over.
fn decode_exact<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> std::result::Result<T, String> {
    match postcard::take_from_bytes(bytes) {
        Ok((value, [])) => Ok(value),
        Ok((_, rest)) => Err(format!("{} bytes left over", rest.len())),
        Err(e) => Err(e.to_string()),
    }
}

/// Checks `bytes`, read from `path`, against the size and checksum `file` records.
pub(crate) fn verify(path: &Path, file: &FileHandle, bytes: &[u8]) -> Result<()> {
    verify_sum(path, file, super::blobs::Sum::of(bytes))
}

/// [`verify`] of a file streamed elsewhere, by what passed.
pub(crate) fn verify_sum(path: &Path, file: &FileHandle, got: super::blobs::Sum) -> Result<()> {
    if got.size != file.size || got.crc32 != file.crc32 {
        return Err(CoreError::Corrupt {
            path: path.to_path_buf(),
            reason: format!(
                "expected {} bytes with crc32 {:08x}, found {} bytes with crc32 {:08x}",
                file.size, file.crc32, got.size, got.crc32
            ),
        });
    }
    Ok(())
}
