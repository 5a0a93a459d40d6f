//! The result cache, file-compatible with libcni's `cniCacheV1`:
//! `<cache_dir>/results/<network>-<containerID>-<ifname>` holding
//! `{"kind":"cniCacheV1","containerId","config"(base64),"ifName","networkName","netns",
//! "cniArgs","capabilityArgs","result"}`. Files are written atomically (temp file + rename),
//! mode 0600, in directories created 0700.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::config::{validate_ifname, validate_name};
use super::error::CniError;

/// libcni's cache entry kind.
pub const CACHE_KIND: &str = "cniCacheV1";

/// One cache entry (serde mirror of libcni's `cachedInfo`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheEntry {
    /// Always [`CACHE_KIND`].
    pub kind: String,
    /// Container ID.
    #[serde(rename = "containerId")]
    pub container_id: String,
    /// The network config list bytes (base64 in JSON, like Go's `[]byte`).
    #[serde(with = "base64_bytes", default)]
    pub config: Vec<u8>,
    /// Interface name.
    #[serde(rename = "ifName")]
    pub if_name: String,
    /// Network name.
    #[serde(rename = "networkName")]
    pub network_name: String,
    /// Netns path used at ADD.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub netns: String,
    /// CNI_ARGS pairs used at ADD.
    #[serde(rename = "cniArgs", default, skip_serializing_if = "Vec::is_empty")]
    pub cni_args: Vec<(String, String)>,
    /// Capability args used at ADD.
    #[serde(
        rename = "capabilityArgs",
        default,
        skip_serializing_if = "Map::is_empty"
    )]
    pub capability_args: Map<String, Value>,
    /// The final ADD result, raw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

/// The on-disk result cache rooted at a cache dir (containerd's default `/var/lib/cni`).
#[derive(Debug, Clone)]
pub struct ResultCache {
    dir: PathBuf,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl ResultCache {
    /// A cache rooted at `cache_dir` (entries live in `cache_dir/results`).
    pub fn new(cache_dir: impl Into<PathBuf>) -> Self {
        ResultCache {
            dir: cache_dir.into(),
        }
    }

    /// `cache_dir/results/<network>-<containerID>-<ifname>`, after validating all three.
    pub fn path(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Result<PathBuf, CniError> {
        validate_name("network name", network)?;
        validate_name("container ID", container_id)?;
        validate_ifname(ifname)?;
        Ok(self
            .dir
            .join("results")
            .join(format!("{network}-{container_id}-{ifname}")))
    }

    /// Writes `entry` atomically (0600 temp file in the same dir, fsync, rename).
    pub fn write(&self, entry: &CacheEntry) -> Result<PathBuf, CniError> {
        let path = self.path(&entry.network_name, &entry.container_id, &entry.if_name)?;
        let err = |reason: String| CniError::Cache {
            path: path.clone(),
            reason,
        };
        let dir = path.parent().expect("has a parent");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| err(format!("creating {}: {e}", dir.display())))?;
        let data = serde_json::to_vec(entry).map_err(|e| err(e.to_string()))?;
        let tmp = dir.join(format!(
            ".{}.tmp.{}.{}",
            path.file_name().expect("has a name").to_string_lossy(),
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let write = || -> io::Result<()> {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
                .open(&tmp)?;
            f.write_all(&data)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)?;
            // make the rename durable; failure here is not fatal for correctness
            if let Ok(d) = fs::File::open(dir) {
                let _ = d.sync_all();
            }
            Ok(())
        };
        write().map_err(|e| {
            let _ = fs::remove_file(&tmp);
            err(format!("writing: {e}"))
        })?;
        Ok(path)
    }

    /// Reads an entry. `Ok(None)` if there is none. A file that is not a `cniCacheV1` entry
    /// but is a bare result (libcni's legacy format) is returned as an entry with only `result`.
    pub fn read(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Result<Option<CacheEntry>, CniError> {
        let path = self.path(network, container_id, ifname)?;
        let data = match fs::read(&path) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(CniError::Cache {
                    path,
                    reason: format!("reading: {e}"),
                });
            }
        };
        match serde_json::from_slice::<CacheEntry>(&data) {
            Ok(entry) if entry.kind == CACHE_KIND => Ok(Some(entry)),
            _ => match serde_json::from_slice::<Value>(&data) {
                Ok(v @ Value::Object(_)) if v.get("kind").is_none() => Ok(Some(CacheEntry {
                    kind: CACHE_KIND.into(),
                    container_id: container_id.into(),
                    config: Vec::new(),
                    if_name: ifname.into(),
                    network_name: network.into(),
                    netns: String::new(),
                    cni_args: Vec::new(),
                    capability_args: Map::new(),
                    result: Some(v),
                })),
                _ => Err(CniError::Cache {
                    path,
                    reason: "not a cniCacheV1 entry".into(),
                }),
            },
        }
    }

    /// Removes an entry; a missing entry is not an error.
    pub fn remove(&self, network: &str, container_id: &str, ifname: &str) -> Result<(), CniError> {
        let path = self.path(network, container_id, ifname)?;
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(CniError::Cache {
                path,
                reason: format!("removing: {e}"),
            }),
        }
    }

    /// The cache root.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Standard base64 (RFC 4648, padded), as Go's `encoding/json` uses for `[]byte`.
mod base64_bytes {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub fn encode(data: &[u8]) -> String {
        let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
        for chunk in data.chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    pub fn decode(s: &str) -> Option<Vec<u8>> {
        let s = s.as_bytes();
        if !s.len().is_multiple_of(4) {
            return None;
        }
        let val = |c: u8| ALPHABET.iter().position(|&a| a == c).map(|p| p as u32);
        let mut out = Vec::with_capacity(s.len() / 4 * 3);
        for (ci, chunk) in s.chunks(4).enumerate() {
            let last = ci == s.len() / 4 - 1;
            let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
            if pad > 2 || (pad > 0 && !last) {
                return None;
            }
            let mut n = 0u32;
            for &c in &chunk[..4 - pad] {
                n = (n << 6) | val(c)?;
            }
            n <<= 6 * pad as u32;
            let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
            out.extend_from_slice(&bytes[..3 - pad]);
        }
        Some(out)
    }

    pub fn serialize<S: Serializer>(data: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&encode(data))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = Option::<String>::deserialize(d)?.unwrap_or_default();
        decode(&s).ok_or_else(|| D::Error::custom("invalid base64"))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn roundtrip_and_known_vectors() {
            for (plain, enc) in [
                ("", ""),
                ("f", "Zg=="),
                ("fo", "Zm8="),
                ("foo", "Zm9v"),
                ("foob", "Zm9vYg=="),
                ("fooba", "Zm9vYmE="),
                ("foobar", "Zm9vYmFy"),
            ] {
                assert_eq!(encode(plain.as_bytes()), enc);
                assert_eq!(decode(enc).unwrap(), plain.as_bytes());
            }
            let all: Vec<u8> = (0..=255).collect();
            assert_eq!(decode(&encode(&all)).unwrap(), all);
            assert!(decode("Zm9").is_none());
            assert!(decode("Z===").is_none());
            assert!(decode("Zg==Zg==").is_none());
            assert!(decode("Zm9*").is_none());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn entry() -> CacheEntry {
        CacheEntry {
            kind: CACHE_KIND.into(),
            container_id: "c1".into(),
            config: br#"{"name":"net"}"#.to_vec(),
            if_name: "eth0".into(),
            network_name: "net".into(),
            netns: "/var/run/netns/x".into(),
            cni_args: vec![("IgnoreUnknown".into(), "1".into())],
            capability_args: Map::new(),
            result: Some(serde_json::json!({"cniVersion":"1.0.0","ips":[]})),
        }
    }

    #[test]
    fn write_read_remove_with_modes_and_libcni_layout() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("cni");
        let c = ResultCache::new(&root);
        let p = c.write(&entry()).unwrap();
        assert_eq!(p, root.join("results").join("net-c1-eth0"));
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            fs::metadata(root.join("results"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o700
        );
        // no temp files left behind
        assert_eq!(fs::read_dir(root.join("results")).unwrap().count(), 1);
        // the JSON has libcni's field names and base64 config
        let v: Value = serde_json::from_slice(&fs::read(&p).unwrap()).unwrap();
        assert_eq!(v["kind"], "cniCacheV1");
        assert_eq!(v["containerId"], "c1");
        assert_eq!(v["ifName"], "eth0");
        assert_eq!(v["networkName"], "net");
        assert_eq!(v["config"], "eyJuYW1lIjoibmV0In0=");
        assert_eq!(v["cniArgs"], serde_json::json!([["IgnoreUnknown", "1"]]));
        assert!(v.get("capabilityArgs").is_none());
        assert_eq!(c.read("net", "c1", "eth0").unwrap().unwrap(), entry());
        c.remove("net", "c1", "eth0").unwrap();
        assert!(c.read("net", "c1", "eth0").unwrap().is_none());
        c.remove("net", "c1", "eth0").unwrap();
    }

    #[test]
    fn legacy_and_garbage_entries() {
        let d = tempfile::tempdir().unwrap();
        let c = ResultCache::new(d.path());
        fs::create_dir_all(d.path().join("results")).unwrap();
        fs::write(
            d.path().join("results/net-c1-eth0"),
            r#"{"cniVersion":"0.4.0","ips":[]}"#,
        )
        .unwrap();
        let e = c.read("net", "c1", "eth0").unwrap().unwrap();
        assert_eq!(e.result.unwrap()["cniVersion"], "0.4.0");
        fs::write(d.path().join("results/net-c1-eth0"), "garbage").unwrap();
        assert!(matches!(
            c.read("net", "c1", "eth0"),
            Err(CniError::Cache { .. })
        ));
        fs::write(d.path().join("results/net-c1-eth0"), r#"{"kind":"other"}"#).unwrap();
        assert!(matches!(
            c.read("net", "c1", "eth0"),
            Err(CniError::Cache { .. })
        ));
    }

    #[test]
    fn ids_are_validated() {
        let c = ResultCache::new("/nonexistent");
        assert!(c.path("net", "../../etc", "eth0").is_err());
        assert!(c.path("net", "c1", "../x").is_err());
        assert!(c.path("a/b", "c1", "eth0").is_err());
        assert!(c.path("..", "c1", "eth0").is_err());
        assert!(c.path("net", "", "eth0").is_err());
    }
}
