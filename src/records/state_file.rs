//! The shim's own state files and their schema versions: what a shim writes into a bundle for
//! a later `delete` — possibly of another release of the shim (an upgrade replaces the binary
//! while pods of the old one run; `delete` after a crash is run by whatever binary containerd
//! finds then).
//!
//! | file | record | version |
//! | --- | --- | --- |
//! | `rsandbox-sandbox.json` (sandbox bundle) | `crate::pod::sandbox::SandboxRecord` | [`SANDBOX_RECORD`] |
//! | `rsandbox-task.json` (task bundle) | `crate::task::TaskRecord` | [`TASK_RECORD`] |
//!
//! Each is a JSON object with a `schema_version` key beside the record's fields. A file
//! without one was written before versions existed (0.1.0) and is version 0, whose layout is
//! version 1's without the key. The rule that keeps files readable both ways: a new version
//! only adds fields (with defaults), so an older shim reads a newer file (serde ignores what
//! it does not know) and a newer shim reads an older one; a change an older reader would
//! misread gets a new file name instead. A file of a newer version than this shim knows is
//! read all the same (for cleanup, acting on what it knows beats leaving a pod behind). A file
//! of another version is said so on stderr, which containerd logs for `delete`.
//!
//! The other files the shim writes are not its schema: `address`, `shim.pid`, `socket-dir`
//! (the Go shim library's names and formats), `rsandbox-options.pb` (containerd's protobuf
//! `Any`, self-describing), `config.json` and `exec-*.json` (OCI), the CNI result cache
//! (libcni's `cniCacheV1`, versioned by its `kind`).

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::records::error::{Error, Result};

/// The key of the version in every record file.
pub const VERSION_KEY: &str = "schema_version";

/// A record file and the version this shim writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schema {
    /// The file's name in its bundle.
    pub file: &'static str,
    pub version: u64,
}

/// The sandbox record. 1: 0.2.0 (0.1.0's layout, versioned). 2: each member's
/// `cgroups_at_create` (issue 33: cgroup ownership decided at create).
pub const SANDBOX_RECORD: Schema = Schema {
    file: crate::records::bundle::SANDBOX_STATE_FILE,
    version: 2,
};

/// The task record. 1: 0.2.0 (0.1.0's layout, versioned). 2: `cgroups_at_create`.
pub const TASK_RECORD: Schema = Schema {
    file: crate::records::bundle::TASK_STATE_FILE,
    version: 2,
};

/// A record read back, with the version it was written with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded<T> {
    pub record: T,
    /// 0: written before versions (0.1.0).
    pub version: u64,
}

impl<T> Decoded<T> {
    /// The file comes from a newer shim than this one.
    pub fn newer_than(&self, schema: &Schema) -> bool {
        self.version > schema.version
    }
}

/// The file's bytes: the record's fields and `schema_version`.
pub fn encode<T: Serialize>(schema: &Schema, record: &T) -> Result<Vec<u8>> {
    let mut v = serde_json::to_value(record)
        .map_err(|e| Error::internal(format!("encode {}: {e}", schema.file)))?;
    let Value::Object(map) = &mut v else {
        return Err(Error::internal(format!(
            "encode {}: the record is not a JSON object",
            schema.file
        )));
    };
    map.insert(VERSION_KEY.into(), Value::from(schema.version));
    serde_json::to_vec(&v).map_err(|e| Error::internal(format!("encode {}: {e}", schema.file)))
}

/// Reads a record of any version (see the module's rule); a newer one is announced on
/// stderr.
pub fn decode<T: DeserializeOwned>(schema: &Schema, raw: &[u8]) -> Result<Decoded<T>> {
    let mut v: Value =
        serde_json::from_slice(raw).map_err(|e| Error::invalid(format!("{}: {e}", schema.file)))?;
    let version = match &mut v {
        Value::Object(map) => match map.remove(VERSION_KEY) {
            None => 0,
            Some(n) => n.as_u64().ok_or_else(|| {
                Error::invalid(format!(
                    "{}: {VERSION_KEY} {n} is not a number",
                    schema.file
                ))
            })?,
        },
        _ => {
            return Err(Error::invalid(format!(
                "{}: not a JSON object",
                schema.file
            )));
        }
    };
    let record =
        serde_json::from_value(v).map_err(|e| Error::invalid(format!("{}: {e}", schema.file)))?;
    let decoded = Decoded { record, version };
    // containerd logs what `delete` prints on stderr ("warnings while cleaning up dead
    // shim"): an upgrade's cleanups show which release's record they read.
    if version != schema.version {
        eprintln!(
            "{}: schema version {version} ({}), read by rsandbox {} (schema version {}){}",
            schema.file,
            if version == 0 {
                "rsandbox 0.1.0"
            } else if decoded.newer_than(schema) {
                "a newer rsandbox"
            } else {
                "an older rsandbox"
            },
            crate::records::version::VERSION,
            schema.version,
            if decoded.newer_than(schema) {
                ": read as far as this release knows it"
            } else {
                ""
            }
        );
    }
    Ok(decoded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
    struct Rec {
        id: String,
        #[serde(default)]
        added_later: Option<u32>,
    }

    const S: Schema = Schema {
        file: "rec.json",
        version: 2,
    };

    #[test]
    fn a_record_round_trips_with_its_version() {
        let r = Rec {
            id: "a".into(),
            added_later: Some(3),
        };
        let raw = encode(&S, &r).unwrap();
        let v: Value = serde_json::from_slice(&raw).unwrap();
        assert_eq!(v["schema_version"], 2);
        let d: Decoded<Rec> = decode(&S, &raw).unwrap();
        assert_eq!((d.record, d.version), (r, 2));
    }

    #[test]
    fn unversioned_older_and_newer_files_are_read() {
        // 0.1.0 wrote no version.
        let d: Decoded<Rec> = decode(&S, br#"{"id":"old"}"#).unwrap();
        assert_eq!((d.record.id.as_str(), d.version), ("old", 0));
        assert!(!d.newer_than(&S));
        // A newer shim's file: an unknown field is ignored, the version told.
        let d: Decoded<Rec> =
            decode(&S, br#"{"id":"new","schema_version":7,"later_still":[1]}"#).unwrap();
        assert_eq!((d.record.id.as_str(), d.version), ("new", 7));
        assert!(d.newer_than(&S));
    }

    #[test]
    fn broken_files_are_typed_errors_naming_the_file() {
        for raw in [
            &b"[1]"[..],
            b"{",
            br#"{"id":"x","schema_version":"1"}"#,
            br#"{"schema_version":1}"#,
        ] {
            let e = decode::<Rec>(&S, raw).unwrap_err();
            assert!(e.message().contains("rec.json"), "{e}");
        }
    }
}
