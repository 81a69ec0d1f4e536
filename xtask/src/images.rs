//! Test and demo images, built locally with no registry: an OCI image
//! layout (oci-layout, index.json, blobs) written to a tar that
//! `ctr images import` understands.
//!
//! - `swiftlet.local/pause:3.9`: a static pause binary (images/pause.c).
//! - `swiftlet.local/busybox:1.35`: Debian's static busybox with a symlink
//!   for every applet.

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::cmd::{self, step};

pub const PAUSE_IMAGE: &str = "swiftlet.local/pause:3.9";
pub const BUSYBOX_IMAGE: &str = "swiftlet.local/busybox:1.35";

/// One file of a layer.
enum Entry {
    File { path: String, data: Vec<u8>, mode: u32 },
    Dir { path: String, mode: u32 },
    Symlink { path: String, target: String },
}

/// The image tarballs, built when missing. Returns (image name, tar path).
pub fn ensure(workspace: &Path) -> Result<Vec<(&'static str, PathBuf)>> {
    let dir = workspace.join("target").join("images");
    fs::create_dir_all(&dir)?;
    let pause_tar = dir.join("pause-3.9.oci.tar");
    if !pause_tar.exists() {
        step("building the pause image (static C binary)");
        let bin = dir.join("pause");
        cmd::run(
            Command::new("gcc")
                .args(["-static", "-Os", "-s", "-o"])
                .arg(&bin)
                .arg(workspace.join("xtask/images/pause.c")),
        )
        .context("cannot compile the pause binary (gcc and libc6-dev are installed by `cargo xtask setup`)")?;
        let layer = vec![Entry::File { path: "pause".into(), data: fs::read(&bin)?, mode: 0o755 }];
        write_image(&pause_tar, PAUSE_IMAGE, layer, json!({"Entrypoint": ["/pause"]}))?;
    }
    let busybox_tar = dir.join("busybox-1.35.oci.tar");
    if !busybox_tar.exists() {
        step("building the busybox image (Debian's busybox-static)");
        let busybox = Path::new("/bin/busybox");
        let list = cmd::output(Command::new(busybox).arg("--list"))
            .context("cannot run /bin/busybox (package busybox-static)")?;
        let mut layer = vec![
            Entry::Dir { path: "bin".into(), mode: 0o755 },
            Entry::Dir { path: "etc".into(), mode: 0o755 },
            Entry::Dir { path: "tmp".into(), mode: 0o1777 },
            Entry::Dir { path: "var".into(), mode: 0o755 },
            Entry::Dir { path: "www".into(), mode: 0o755 },
            Entry::File { path: "bin/busybox".into(), data: fs::read(busybox)?, mode: 0o755 },
            Entry::File {
                path: "etc/passwd".into(),
                data: b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n".to_vec(),
                mode: 0o644,
            },
            Entry::File { path: "etc/group".into(), data: b"root:x:0:\nnogroup:x:65534:\n".to_vec(), mode: 0o644 },
            Entry::File { path: "www/index.html".into(), data: b"hello from swiftlet\n".to_vec(), mode: 0o644 },
        ];
        for applet in list.lines().map(str::trim).filter(|a| !a.is_empty() && *a != "busybox") {
            layer.push(Entry::Symlink { path: format!("bin/{applet}"), target: "busybox".into() });
        }
        write_image(
            &busybox_tar,
            BUSYBOX_IMAGE,
            layer,
            json!({"Cmd": ["sh"], "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}),
        )?;
    }
    Ok(vec![(PAUSE_IMAGE, pause_tar), (BUSYBOX_IMAGE, busybox_tar)])
}

fn sha256(data: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(data))
}

fn layer_tar(entries: Vec<Entry>) -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        match e {
            Entry::File { path, data, mode } => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(mode);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, path, data.as_slice())?;
            }
            Entry::Dir { path, mode } => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(mode);
                h.set_size(0);
                b.append_data(&mut h, path, std::io::empty())?;
            }
            Entry::Symlink { path, target } => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, path, target)?;
            }
        }
    }
    Ok(b.into_inner()?)
}

fn write_image(dest: &Path, name: &str, layer: Vec<Entry>, config: serde_json::Value) -> Result<()> {
    let tar = layer_tar(layer)?;
    let diff_id = sha256(&tar);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&tar)?;
    let layer_gz = gz.finish()?;
    let image_config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "cargo xtask (swiftlet)"}],
    }))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha256(&image_config), "size": image_config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": sha256(&layer_gz), "size": layer_gz.len()}],
    }))?;
    let tag = name.rsplit_once(':').map(|(_, t)| t).unwrap_or("latest");
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": sha256(&manifest),
            "size": manifest.len(),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag},
        }],
    }))?;
    let mut out = tar::Builder::new(Vec::new());
    let mut add = |path: String, data: &[u8]| -> Result<()> {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.set_mtime(0);
        out.append_data(&mut h, path, data)?;
        Ok(())
    };
    add("oci-layout".into(), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    add("index.json".into(), &index)?;
    for blob in [&layer_gz, &image_config, &manifest] {
        let digest = sha256(blob);
        add(format!("blobs/sha256/{}", &digest["sha256:".len()..]), blob)?;
    }
    let bytes = out.into_inner()?;
    let tmp = dest.with_extension("tmp");
    fs::write(&tmp, bytes)?;
    fs::rename(&tmp, dest)?;
    Ok(())
}

/// Imports the images into containerd's `k8s.io` namespace.
pub fn import(socket: &Path, images: &[(&str, PathBuf)]) -> Result<()> {
    for (name, tar) in images {
        let out = Command::new("ctr")
            .arg("--address")
            .arg(socket)
            .args(["--namespace", "k8s.io", "images", "import"])
            .arg(tar)
            .output()
            .context("cannot run ctr (package containerd)")?;
        if !out.status.success() {
            bail!("importing {name} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
    }
    Ok(())
}
