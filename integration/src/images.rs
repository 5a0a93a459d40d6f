//! Images the tests build themselves: a deep image (many layers) on top of the bench's busybox,
//! written as an OCI image layout archive and imported with `ctr images import` (no registry).

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::{BUSYBOX, ctr, run_timeout};

const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";

/// Runs `program args...`; its stdout.
fn sh(program: &str, args: &[&std::ffi::OsStr], what: &str) -> Result<String, String> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    let o = run_timeout(cmd, None, Duration::from_secs(120));
    if !o.ok() {
        return Err(format!("{what}: {o:?}"));
    }
    Ok(o.stdout)
}

/// sha256 of a file, hex.
fn sha256(path: &Path) -> Result<String, String> {
    let out = sh("sha256sum", &[path.as_os_str()], "sha256sum")?;
    out.split_whitespace()
        .next()
        .map(str::to_string)
        .ok_or_else(|| format!("sha256sum {}: no output", path.display()))
}

/// Moves `file` into the layout's blobs under its digest; returns (digest, size).
fn add_blob(layout: &Path, file: &Path) -> Result<(String, u64), String> {
    let hex = sha256(file)?;
    let size = fs::metadata(file).map_err(|e| e.to_string())?.len();
    fs::rename(file, layout.join("blobs/sha256").join(&hex)).map_err(|e| e.to_string())?;
    Ok((format!("sha256:{hex}"), size))
}

fn read_json(path: &Path) -> Result<serde_json::Value, String> {
    let raw = fs::read(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    serde_json::from_slice(&raw).map_err(|e| format!("parse {}: {e}", path.display()))
}

fn blob_path(layout: &Path, digest: &str) -> std::path::PathBuf {
    layout
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"))
}

/// Builds `name` in namespace `ns`: the bench's busybox image plus enough one-file layers to
/// make `layers` in all. Layer `i` (1-based, busybox's being the first) adds `/layers/<i>`
/// holding `i`; layer 2 also writes `/layers/shadowed` = `2`, and the top layer overwrites it
/// with its own number (so the order of the lowerdirs shows).
pub fn import_deep_image(ns: &str, name: &str, layers: usize, work: &Path) -> Result<(), String> {
    let layout = work.join("layout");
    let _ = fs::remove_dir_all(work);
    fs::create_dir_all(&layout).map_err(|e| e.to_string())?;
    let base = work.join("base.tar");
    // Twice at most: once, under load, `ctr images export` exited 0 with a truncated archive
    // ("tar: Unexpected EOF in archive"); what is tested here is the deep image, not export.
    let mut untarred = Err(String::new());
    for _ in 0..2 {
        let o = ctr(
            ns,
            &["images", "export", &base.display().to_string(), BUSYBOX],
        );
        if !o.ok() {
            return Err(format!("ctr images export {BUSYBOX}: {o:?}"));
        }
        untarred = sh(
            "tar",
            &[
                "-xf".as_ref(),
                base.as_os_str(),
                "-C".as_ref(),
                layout.as_os_str(),
            ],
            "untar the base image",
        );
        if untarred.is_ok() {
            break;
        }
    }
    untarred?;
    let index = read_json(&layout.join("index.json"))?;
    let man_digest = index["manifests"][0]["digest"]
        .as_str()
        .ok_or("base index has no manifest")?
        .to_string();
    let mut manifest = read_json(&blob_path(&layout, &man_digest))?;
    if manifest["mediaType"] == "application/vnd.docker.distribution.manifest.v2+json" {
        return Err("the base image is not an OCI image".into());
    }
    let cfg_digest = manifest["config"]["digest"]
        .as_str()
        .ok_or("base manifest has no config")?
        .to_string();
    let mut config = read_json(&blob_path(&layout, &cfg_digest))?;
    let have = manifest["layers"].as_array().map_or(0, Vec::len);
    if have == 0 || have > layers {
        return Err(format!(
            "base image has {have} layers, want at most {layers}"
        ));
    }
    for i in have + 1..=layers {
        let dir = work.join(format!("l{i}"));
        fs::create_dir_all(dir.join("layers")).map_err(|e| e.to_string())?;
        fs::write(dir.join("layers").join(i.to_string()), i.to_string())
            .map_err(|e| e.to_string())?;
        if i == 2 || i == layers {
            fs::write(dir.join("layers/shadowed"), i.to_string()).map_err(|e| e.to_string())?;
        }
        let tar = work.join(format!("l{i}.tar"));
        sh(
            "tar",
            &[
                "--sort=name".as_ref(),
                "--owner=0".as_ref(),
                "--group=0".as_ref(),
                "--numeric-owner".as_ref(),
                "--mtime=@0".as_ref(),
                "--format=gnu".as_ref(),
                "-C".as_ref(),
                dir.as_os_str(),
                "-cf".as_ref(),
                tar.as_os_str(),
                "layers".as_ref(),
            ],
            "tar a layer",
        )?;
        let (digest, size) = add_blob(&layout, &tar)?;
        // An uncompressed layer: its diff ID is its digest.
        manifest["layers"]
            .as_array_mut()
            .ok_or("manifest layers")?
            .push(serde_json::json!({"mediaType": LAYER_TAR, "digest": digest, "size": size}));
        config["rootfs"]["diff_ids"]
            .as_array_mut()
            .ok_or("config diff_ids")?
            .push(serde_json::json!(digest));
        if let Some(h) = config["history"].as_array_mut() {
            h.push(serde_json::json!({"created": "1970-01-01T00:00:00Z", "created_by": format!("layer {i}")}));
        }
    }
    let write = |file: &str, v: &serde_json::Value| -> Result<(String, u64), String> {
        let p = work.join(file);
        fs::write(&p, serde_json::to_vec(v).unwrap()).map_err(|e| e.to_string())?;
        add_blob(&layout, &p)
    };
    let (cfg, cfg_size) = write("config.json", &config)?;
    manifest["config"]["digest"] = serde_json::json!(cfg);
    manifest["config"]["size"] = serde_json::json!(cfg_size);
    let (man, man_size) = write("manifest.json", &manifest)?;
    let mut entry = index["manifests"][0].clone();
    entry["digest"] = serde_json::json!(man);
    entry["size"] = serde_json::json!(man_size);
    entry["annotations"] = serde_json::json!({"io.containerd.image.name": name});
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [entry],
    });
    fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .map_err(|e| e.to_string())?;
    let _ = fs::remove_file(layout.join("manifest.json")); // docker-archive compatibility file
    let archive = work.join("deep.tar");
    sh(
        "tar",
        &[
            "-C".as_ref(),
            layout.as_os_str(),
            "-cf".as_ref(),
            archive.as_os_str(),
            ".".as_ref(),
        ],
        "tar the image layout",
    )?;
    let o = run_timeout(
        crate::ctr_cmd(ns, &["images", "import", &archive.display().to_string()]),
        None,
        Duration::from_secs(300),
    );
    if !o.ok() {
        return Err(format!("ctr images import: {o:?}"));
    }
    Ok(())
}
