//! The test CSI driver (`swiftlet-test-csi-driver`), run as a process and
//! driven over its socket with the CSI clients: a filesystem volume from
//! CreateVolume to DeleteVolume (staged once, published twice, data seen
//! through both targets, stats, online expansion, nothing left mounted or
//! attached after), a btrfs volume grown while mounted, a block volume as
//! a device file, an inline ephemeral volume, --no-stage, failure and
//! delay injection, the registration socket, and the sweep a dropped
//! driver does.

use std::{
    collections::HashMap,
    io::{Read, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use swiftlet::{
    pluginwatcher::api::{InfoRequest, RegistrationStatus, registration_client::RegistrationClient},
    volumes::csi::api::{
        controller_client::ControllerClient, identity_client::IdentityClient, node_client::NodeClient, *,
    },
};
use swiftlet_tests::{
    csi::{CsiDriverOptions, CsiDriverProcess},
    csi_driver::{filesystems, loopdev, mounts, run},
    prereq::require_root,
};
use tonic::{Code, transport::Channel};

const MI: i64 = 1 << 20;
const NODE: &str = "node-a";

fn mount_cap(flags: &[&str]) -> Option<VolumeCapability> {
    fs_cap("ext4", flags)
}

fn fs_cap(fs_type: &str, flags: &[&str]) -> Option<VolumeCapability> {
    Some(VolumeCapability {
        access_type: Some(volume_capability::AccessType::Mount(volume_capability::MountVolume {
            fs_type: fs_type.into(),
            mount_flags: flags.iter().map(|f| f.to_string()).collect(),
            volume_mount_group: String::new(),
        })),
        access_mode: Some(volume_capability::AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
    })
}

fn block_cap() -> Option<VolumeCapability> {
    Some(VolumeCapability {
        access_type: Some(volume_capability::AccessType::Block(volume_capability::BlockVolume {})),
        access_mode: Some(volume_capability::AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
    })
}

fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn range(bytes: i64) -> Option<CapacityRange> {
    Some(CapacityRange { required_bytes: bytes, limit_bytes: 0 })
}

struct Clients {
    identity: IdentityClient<Channel>,
    controller: ControllerClient<Channel>,
    node: NodeClient<Channel>,
}

async fn clients(d: &CsiDriverProcess) -> Clients {
    let ch = d.channel().await.expect("dial the driver");
    Clients {
        identity: IdentityClient::new(ch.clone()),
        controller: ControllerClient::new(ch.clone()),
        node: NodeClient::new(ch),
    }
}

fn start(opts: &CsiDriverOptions) -> CsiDriverProcess {
    CsiDriverProcess::start(opts).unwrap_or_else(|e| panic!("start the driver: {e}"))
}

async fn create(c: &mut Clients, name: &str, bytes: i64) -> Volume {
    c.controller
        .create_volume(CreateVolumeRequest {
            name: name.into(),
            capacity_range: range(bytes),
            volume_capabilities: vec![mount_cap(&[]).unwrap()],
            ..Default::default()
        })
        .await
        .expect("CreateVolume")
        .into_inner()
        .volume
        .expect("a volume")
}

/// (total, available, used) bytes, and total inodes, from NodeGetVolumeStats.
async fn stats(c: &mut Clients, id: &str, path: &Path) -> ((i64, i64, i64), i64, VolumeCondition) {
    let r = c
        .node
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: id.into(),
            volume_path: path.display().to_string(),
            staging_target_path: String::new(),
        })
        .await
        .expect("NodeGetVolumeStats")
        .into_inner();
    let of = |unit: volume_usage::Unit| r.usage.iter().find(|u| u.unit == unit as i32).cloned().unwrap_or_default();
    let b = of(volume_usage::Unit::Bytes);
    (
        (b.total, b.available, b.used),
        of(volume_usage::Unit::Inodes).total,
        r.volume_condition.expect("a volume condition"),
    )
}

fn statvfs_total(path: &Path) -> u64 {
    let s = rustix::fs::statvfs(path).expect("statvfs");
    s.f_blocks * s.f_frsize
}

/// Nothing of the driver's is attached or mounted any more.
fn assert_nothing_left(state: &Path, paths: &[&Path]) {
    let state = std::fs::canonicalize(state).unwrap();
    let loops: Vec<_> = loopdev::list().into_iter().filter(|l| l.backing.starts_with(&state)).collect();
    assert!(loops.is_empty(), "loop devices left: {loops:?}");
    for p in paths {
        assert!(mounts::mounted_at(p).is_none(), "{} is still mounted", p.display());
    }
}

#[tokio::test]
async fn filesystem_volume_from_create_to_delete() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let mut opts = CsiDriverOptions::new(dir.path(), NODE);
    opts.require_attach = true;
    let driver = start(&opts);
    let mut c = clients(&driver).await;

    let vol = create(&mut c, "pvc-fs", 20 * MI).await;
    assert_eq!((vol.volume_id.as_str(), vol.capacity_bytes), ("pvc-fs", 20 * MI));
    let image = PathBuf::from(&vol.volume_context["swiftlet.dev/image"]);
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 20 << 20);
    assert_eq!(vol.accessible_topology[0].segments, map(&[("topology.swiftlet.dev/node", NODE)]));
    assert_eq!(create(&mut c, "pvc-fs", 20 * MI).await, vol, "CreateVolume is idempotent by name");

    // The kubelet waits for the attachment: no publish context, no staging.
    let staging = dir.path().join("kubelet/plugins/staging/pvc-fs");
    std::fs::create_dir_all(&staging).unwrap();
    let mut stage = NodeStageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: mount_cap(&["noatime"]),
        volume_context: vol.volume_context.clone(),
        secrets: map(&[("stage-key", "s")]),
        ..Default::default()
    };
    let err = c.node.node_stage_volume(stage.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    let attach = c
        .controller
        .controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            node_id: NODE.into(),
            volume_capability: mount_cap(&[]),
            ..Default::default()
        })
        .await
        .expect("ControllerPublishVolume")
        .into_inner();
    assert_eq!(attach.publish_context, map(&[("swiftlet.dev/attached", NODE)]));
    stage.publish_context = attach.publish_context.clone();
    c.node.node_stage_volume(stage.clone()).await.expect("NodeStageVolume");
    c.node.node_stage_volume(stage.clone()).await.expect("NodeStageVolume again");
    let staged = mounts::mounted_at(&staging).expect("the staging path is mounted");
    assert_eq!(staged.fs_type, "ext4");
    assert!(staged.options.iter().any(|o| o == "noatime"), "mount flags honoured: {:?}", staged.options);
    let dev = loopdev::find(&image);
    assert_eq!(dev.len(), 1, "one loop device: {dev:?}");
    assert_eq!(staged.dev, dev[0].dev);
    assert_eq!(mounts::table().iter().filter(|m| m.mount_point == staged.mount_point).count(), 1, "mounted once");

    // Two pods: one writes, the other (read-only) reads.
    let targets: Vec<PathBuf> = ["pod-a", "pod-b"].iter().map(|p| dir.path().join(p).join("mount")).collect();
    for (t, ro) in targets.iter().zip([false, true]) {
        std::fs::create_dir_all(t.parent().unwrap()).unwrap();
        let publish = NodePublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            publish_context: attach.publish_context.clone(),
            staging_target_path: staging.display().to_string(),
            target_path: t.display().to_string(),
            volume_capability: mount_cap(&[]),
            readonly: ro,
            secrets: map(&[("b", "2"), ("a", "1")]),
            volume_context: map(&[
                ("csi.storage.k8s.io/pod.name", "web-0"),
                ("csi.storage.k8s.io/pod.namespace", "ns"),
            ]),
        };
        c.node.node_publish_volume(publish.clone()).await.expect("NodePublishVolume");
        c.node.node_publish_volume(publish).await.expect("NodePublishVolume again");
        assert_eq!(mounts::mounted_at(t).expect("published").read_only(), ro);
    }
    std::fs::write(targets[0].join("hello"), "from pod-a").unwrap();
    assert_eq!(std::fs::read_to_string(targets[1].join("hello")).unwrap(), "from pod-a");
    let err = std::fs::write(targets[1].join("nope"), "x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "the read-only target refuses writes");

    let ((total, available, used), inodes, condition) = stats(&mut c, "pvc-fs", &targets[0]).await;
    assert!(total > 15 * MI && total <= 20 * MI, "total {total}");
    assert!(used > 0 && available > 0 && used + available <= total, "used {used} available {available}");
    assert!(inodes > 0);
    assert!(!condition.abnormal);
    driver.set_abnormal(&["pvc-fs"]).unwrap();
    assert!(stats(&mut c, "pvc-fs", &targets[0]).await.2.abnormal);
    let err = c
        .node
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: "pvc-fs".into(),
            volume_path: dir.path().display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "an unmounted path: {err}");

    let err = c.controller.delete_volume(DeleteVolumeRequest { volume_id: "pvc-fs".into(), ..Default::default() });
    assert_eq!(err.await.unwrap_err().code(), Code::FailedPrecondition, "no deleting an attached volume");

    // Online expansion to 40 MiB, seen through the published mount.
    let grown = c
        .controller
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: "pvc-fs".into(),
            capacity_range: range(40 * MI),
            ..Default::default()
        })
        .await
        .expect("ControllerExpandVolume")
        .into_inner();
    assert_eq!((grown.capacity_bytes, grown.node_expansion_required), (40 * MI, true));
    let before = statvfs_total(&targets[0]);
    let node_expand = NodeExpandVolumeRequest {
        volume_id: "pvc-fs".into(),
        volume_path: targets[0].display().to_string(),
        capacity_range: range(40 * MI),
        staging_target_path: staging.display().to_string(),
        volume_capability: mount_cap(&[]),
        ..Default::default()
    };
    let online = filesystems::can_resize_online();
    match c.node.node_expand_volume(node_expand).await {
        Ok(r) => {
            assert!(online, "grew a mounted ext4 without CAP_SYS_RESOURCE?");
            assert_eq!(r.into_inner().capacity_bytes, 40 * MI);
            let after = statvfs_total(&targets[0]);
            assert!(after > 35 << 20 && after > before + (15 << 20), "statvfs total {before} → {after}");
        }
        // Sandboxes that withhold CAP_SYS_RESOURCE from root: the device
        // grows now, the filesystem when it is next staged (below).
        Err(e) => {
            assert!(!online, "NodeExpandVolume: {e}");
            assert!(e.message().contains("CAP_SYS_RESOURCE"), "{e}");
            assert_eq!(loopdev::size_bytes(&dev[0].device).unwrap(), 40 << 20, "the loop device grew");
            assert_eq!(statvfs_total(&targets[0]), before);
        }
    }

    // Teardown in the kubelet's order; unstaging first is refused.
    let unstage =
        NodeUnstageVolumeRequest { volume_id: "pvc-fs".into(), staging_target_path: staging.display().to_string() };
    let err = c.node.node_unstage_volume(unstage.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    for t in &targets {
        for _ in 0..2 {
            c.node
                .node_unpublish_volume(NodeUnpublishVolumeRequest {
                    volume_id: "pvc-fs".into(),
                    target_path: t.display().to_string(),
                })
                .await
                .expect("NodeUnpublishVolume");
        }
        assert!(!t.exists(), "{} removed", t.display());
    }
    c.node.node_unstage_volume(unstage.clone()).await.expect("NodeUnstageVolume");
    c.node.node_unstage_volume(unstage.clone()).await.expect("NodeUnstageVolume again");
    assert_nothing_left(driver.state(), &[&staging]);
    assert_eq!(std::fs::read_dir(&staging).unwrap().count(), 0, "the data stayed in the volume");

    // Staged again (a pod re-created): the data is there, at 40 MiB.
    c.node.node_stage_volume(stage).await.expect("NodeStageVolume after unstaging");
    assert_eq!(std::fs::read_to_string(staging.join("hello")).unwrap(), "from pod-a");
    let total = statvfs_total(&staging);
    assert!(total > 35 << 20 && total <= 40 << 20, "statvfs total {total} after restaging");
    c.node.node_unstage_volume(unstage).await.expect("NodeUnstageVolume");
    assert_nothing_left(driver.state(), &[&staging]);
    c.controller
        .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
            volume_id: "pvc-fs".into(),
            node_id: NODE.into(),
            ..Default::default()
        })
        .await
        .expect("ControllerUnpublishVolume");
    for _ in 0..2 {
        c.controller
            .delete_volume(DeleteVolumeRequest { volume_id: "pvc-fs".into(), ..Default::default() })
            .await
            .expect("DeleteVolume");
    }
    assert!(!image.exists());

    let calls = driver.calls();
    let t0 = targets[0].display();
    let expected = [
        "CreateVolume pvc-fs 20971520".to_owned(),
        format!("NodeStageVolume pvc-fs {} secrets=stage-key", staging.display()),
        "ControllerPublishVolume pvc-fs node-a".to_owned(),
        format!(
            "NodePublishVolume pvc-fs {t0} ro=false ctx=csi.storage.k8s.io/pod.name=web-0,\
             csi.storage.k8s.io/pod.namespace=ns secrets=a,b"
        ),
        "NodeGetVolumeStats pvc-fs ".to_owned() + &t0.to_string(),
        "ControllerExpandVolume pvc-fs 41943040".to_owned(),
        "NodeExpandVolume pvc-fs 41943040".to_owned(),
        format!("NodeUnpublishVolume pvc-fs {t0}"),
        format!("NodeUnstageVolume pvc-fs {}", staging.display()),
        "ControllerUnpublishVolume pvc-fs node-a".to_owned(),
        "DeleteVolume pvc-fs".to_owned(),
    ];
    for line in &expected {
        assert!(calls.contains(line), "calls.log lacks {line:?}:\n{}", calls.join("\n"));
    }
}

#[tokio::test]
async fn btrfs_volume_grows_while_mounted() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let driver = start(&CsiDriverOptions::new(dir.path(), NODE));
    let mut c = clients(&driver).await;
    let vol = create(&mut c, "pvc-btrfs", 64 * MI).await;
    let image = PathBuf::from(&vol.volume_context["swiftlet.dev/image"]);
    let staging = dir.path().join("staging/pvc-btrfs");
    let target = dir.path().join("pods/p3/volumes/data/mount");
    let stage = |cap| NodeStageVolumeRequest {
        volume_id: "pvc-btrfs".into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: cap,
        ..Default::default()
    };
    let publish = |cap| NodePublishVolumeRequest {
        volume_id: "pvc-btrfs".into(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: cap,
        ..Default::default()
    };

    // Only ext4 and btrfs; the refusal names the type.
    for (fs, err) in [
        ("xfs", c.node.node_stage_volume(stage(fs_cap("xfs", &[]))).await.unwrap_err()),
        ("zfs", c.node.node_publish_volume(publish(fs_cap("zfs", &[]))).await.unwrap_err()),
    ] {
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        assert!(err.message().contains(&format!("{fs:?}")), "{err}");
    }
    assert!(loopdev::find(&image).is_empty(), "a refused stage attaches nothing");

    c.node.node_stage_volume(stage(fs_cap("btrfs", &["noatime"]))).await.expect("NodeStageVolume");
    c.node.node_stage_volume(stage(fs_cap("btrfs", &["noatime"]))).await.expect("NodeStageVolume again");
    let staged = mounts::mounted_at(&staging).expect("the staging path is mounted");
    assert_eq!(staged.fs_type, "btrfs");
    assert!(staged.options.iter().any(|o| o == "noatime"), "mount flags honoured: {:?}", staged.options);
    let total = statvfs_total(&staging);
    assert!(total > 48 << 20 && total <= 64 << 20, "a 64 MiB btrfs: statvfs total {total}");
    c.node.node_publish_volume(publish(fs_cap("btrfs", &[]))).await.expect("NodePublishVolume");
    assert_eq!(mounts::mounted_at(&target).expect("published").dev, staged.dev);
    // A btrfs mount has an anonymous device number, not the loop device's:
    // its mounts are found by their source.
    let loop_dev = loopdev::find(&image).pop().expect("attached");
    assert_ne!(staged.dev, loop_dev.dev);
    let on_loop: Vec<PathBuf> =
        mounts::of_device(&mounts::table(), loop_dev.dev).into_iter().map(|m| m.mount_point).collect();
    assert_eq!(on_loop, [std::fs::canonicalize(&staging).unwrap(), std::fs::canonicalize(&target).unwrap()]);
    let block: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 253) as u8).collect();
    std::fs::write(target.join("before"), &block).unwrap();

    // blkid sees the btrfs: staged as ext4 elsewhere, it is refused, not reformatted.
    let other = dir.path().join("staging/other");
    let mut as_ext4 = stage(mount_cap(&[]));
    as_ext4.staging_target_path = other.display().to_string();
    let err = c.node.node_stage_volume(as_ext4).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("holds btrfs"), "{err}");
    assert!(mounts::mounted_at(&other).is_none());
    assert_eq!(std::fs::read(target.join("before")).unwrap(), block, "the data survived");

    // The kernel grows a btrfs to 256 MiB or more: a device grown by hand to
    // 100 MiB is refused as out of range, and the filesystem stays as it was.
    let expand = |required: i64| NodeExpandVolumeRequest {
        volume_id: "pvc-btrfs".into(),
        volume_path: target.display().to_string(),
        capacity_range: range(required),
        staging_target_path: staging.display().to_string(),
        volume_capability: fs_cap("btrfs", &[]),
        ..Default::default()
    };
    std::fs::OpenOptions::new().write(true).open(&image).unwrap().set_len(100 << 20).unwrap();
    let err = c.node.node_expand_volume(expand(100 * MI)).await.unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err}");
    assert!(err.message().contains("256 MiB"), "{err}");
    assert_eq!(statvfs_total(&target), total);

    // So ControllerExpandVolume rounds a btrfs's growth up to 256 MiB, and
    // NodeExpandVolume grows it through the published (bind-mounted) target.
    let grown = c
        .controller
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: "pvc-btrfs".into(),
            capacity_range: range(128 * MI),
            volume_capability: fs_cap("btrfs", &[]),
            ..Default::default()
        })
        .await
        .expect("ControllerExpandVolume")
        .into_inner();
    assert_eq!((grown.capacity_bytes, grown.node_expansion_required), (256 * MI, true));
    let r = c.node.node_expand_volume(expand(128 * MI)).await.expect("NodeExpandVolume").into_inner();
    assert_eq!(r.capacity_bytes, 256 * MI);
    assert!(!driver.state().join("resize").exists(), "grown through its mount, not one made aside");
    let after = statvfs_total(&target);
    assert!(after > 200 << 20 && after <= 256 << 20, "statvfs total {total} → {after}");
    assert_eq!(statvfs_total(&staging), after, "one filesystem");
    assert!(stats(&mut c, "pvc-btrfs", &target).await.0.0 > 200 * MI);
    assert_eq!(std::fs::read(target.join("before")).unwrap(), block, "the data survived the growth");
    c.node.node_expand_volume(expand(128 * MI)).await.expect("NodeExpandVolume again");
    assert_eq!(statvfs_total(&target), after);
    // The room is real: more than the 64 MiB it had.
    {
        let mut f = std::fs::File::create(target.join("after")).unwrap();
        for _ in 0..80 {
            f.write_all(&block).unwrap();
        }
        f.sync_all().unwrap();
    }

    let unstage =
        NodeUnstageVolumeRequest { volume_id: "pvc-btrfs".into(), staging_target_path: staging.display().to_string() };
    let err = c.node.node_unstage_volume(unstage.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "unstaging while published: {err}");
    c.node
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: "pvc-btrfs".into(),
            target_path: target.display().to_string(),
        })
        .await
        .expect("NodeUnpublishVolume");
    c.node.node_unstage_volume(unstage.clone()).await.expect("NodeUnstageVolume");
    assert!(!target.exists());
    assert_nothing_left(driver.state(), &[&staging, &target]);
    assert_eq!(std::fs::read_dir(&staging).unwrap().count(), 0);

    // Attached but not mounted (staged as a block device), the btrfs is
    // mounted aside to grow; grown while unstaged, it grows when staged.
    let controller_expand = |mib: i64| ControllerExpandVolumeRequest {
        volume_id: "pvc-btrfs".into(),
        capacity_range: range(mib * MI),
        ..Default::default()
    };
    c.controller.controller_expand_volume(controller_expand(300)).await.expect("ControllerExpandVolume");
    c.node.node_stage_volume(stage(block_cap())).await.expect("NodeStageVolume as a block device");
    let r = c.node.node_expand_volume(expand(300 * MI)).await.expect("NodeExpandVolume unmounted").into_inner();
    assert_eq!(r.capacity_bytes, 300 * MI);
    c.node.node_unstage_volume(unstage.clone()).await.expect("NodeUnstageVolume");
    assert_nothing_left(driver.state(), &[&driver.state().join("resize/pvc-btrfs")]);
    let args = ["inspect-internal", "dump-super"].map(std::ffi::OsStr::new);
    let sb = run("btrfs", &[args[0], args[1], image.as_os_str()]).expect("btrfs inspect-internal dump-super");
    let fs_bytes = sb.lines().find_map(|l| l.strip_prefix("total_bytes")).map(str::trim);
    assert_eq!(fs_bytes, Some("314572800"), "the btrfs grew to 300 MiB:\n{sb}");
    c.controller.controller_expand_volume(controller_expand(320)).await.expect("ControllerExpandVolume");
    c.node.node_stage_volume(stage(fs_cap("btrfs", &[]))).await.expect("NodeStageVolume after unstaging");
    assert_eq!(mounts::mounted_at(&staging).expect("staged").fs_type, "btrfs");
    let restaged = statvfs_total(&staging);
    assert!(restaged > 300 << 20 && restaged <= 320 << 20, "statvfs total {restaged} after restaging");
    assert_eq!(std::fs::read(staging.join("before")).unwrap(), block, "the same btrfs, not a new one");
    assert_eq!(std::fs::metadata(staging.join("after")).unwrap().len(), 80 << 20);
    c.node.node_unstage_volume(unstage).await.expect("NodeUnstageVolume");
    assert_nothing_left(driver.state(), &[&staging]);
    c.controller
        .delete_volume(DeleteVolumeRequest { volume_id: "pvc-btrfs".into(), ..Default::default() })
        .await
        .expect("DeleteVolume");
    assert!(!image.exists());
}

#[tokio::test]
async fn block_volume_is_a_device_file_and_a_dropped_driver_leaves_nothing() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let driver = start(&CsiDriverOptions::new(dir.path(), NODE));
    let mut c = clients(&driver).await;
    let vol = create(&mut c, "pvc-blk", 16 * MI).await;
    let image = PathBuf::from(&vol.volume_context["swiftlet.dev/image"]);
    let staging = dir.path().join("staging/pvc-blk");
    std::fs::create_dir_all(&staging).unwrap();
    c.node
        .node_stage_volume(NodeStageVolumeRequest {
            volume_id: "pvc-blk".into(),
            staging_target_path: staging.display().to_string(),
            volume_capability: block_cap(),
            ..Default::default()
        })
        .await
        .expect("NodeStageVolume");
    assert!(mounts::mounted_at(&staging).is_none(), "a block volume is not mounted when staged");
    let target = dir.path().join("pods/p1/volumeDevices/pvc-blk");
    c.node
        .node_publish_volume(NodePublishVolumeRequest {
            volume_id: "pvc-blk".into(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: block_cap(),
            ..Default::default()
        })
        .await
        .expect("NodePublishVolume");
    let loop_dev = loopdev::find(&image).pop().expect("attached");
    assert_eq!(mounts::device_node(&target), Some(loop_dev.dev), "the target is the loop device");

    let pattern: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    {
        let mut f = std::fs::OpenOptions::new().read(true).write(true).open(&target).unwrap();
        f.seek(SeekFrom::Start(1 << 20)).unwrap();
        f.write_all(&pattern).unwrap();
        f.sync_all().unwrap();
    }
    let read_at = |path: &Path| {
        let mut back = vec![0; pattern.len()];
        let mut f = std::fs::File::open(path).unwrap();
        f.seek(SeekFrom::Start(1 << 20)).unwrap();
        f.read_exact(&mut back).unwrap();
        back
    };
    assert_eq!(read_at(&target), pattern, "read back through the device");
    assert_eq!(read_at(&image), pattern, "the bytes are in the image");

    let ((total, _, _), _, _) = stats(&mut c, "pvc-blk", &target).await;
    assert_eq!(total, 16 * MI);
    c.controller
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: "pvc-blk".into(),
            capacity_range: range(32 * MI),
            ..Default::default()
        })
        .await
        .expect("ControllerExpandVolume");
    let grown = c
        .node
        .node_expand_volume(NodeExpandVolumeRequest {
            volume_id: "pvc-blk".into(),
            volume_path: target.display().to_string(),
            capacity_range: range(32 * MI),
            volume_capability: block_cap(),
            ..Default::default()
        })
        .await
        .expect("NodeExpandVolume")
        .into_inner();
    assert_eq!(grown.capacity_bytes, 32 * MI);
    assert_eq!(stats(&mut c, "pvc-blk", &target).await.0.0, 32 * MI);

    // A test failing here would drop the driver with the volume published.
    let state = driver.state().to_owned();
    drop(driver);
    assert_nothing_left(&state, &[&target]);
}

#[tokio::test]
async fn inline_ephemeral_volume_comes_and_goes() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let driver = start(&CsiDriverOptions::new(dir.path(), NODE));
    let mut c = clients(&driver).await;
    let target = dir.path().join("pods/p2/volumes/scratch/mount");
    let ctx = map(&[
        ("csi.storage.k8s.io/ephemeral", "true"),
        ("size", "24Mi"),
        ("csi.storage.k8s.io/pod.name", "eph-0"),
        ("csi.storage.k8s.io/pod.uid", "uid-1"),
    ]);
    c.node
        .node_publish_volume(NodePublishVolumeRequest {
            volume_id: "csi-eph".into(),
            target_path: target.display().to_string(),
            volume_capability: mount_cap(&[]),
            volume_context: ctx,
            ..Default::default()
        })
        .await
        .expect("NodePublishVolume");
    let total = statvfs_total(&target);
    assert!(total > 20 << 20 && total <= 24 << 20, "total {total}");
    std::fs::write(target.join("scratch"), "x").unwrap();
    let image = driver.state().join("ephemeral/csi-eph.img");
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 24 << 20);
    c.node
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: "csi-eph".into(),
            target_path: target.display().to_string(),
        })
        .await
        .expect("NodeUnpublishVolume");
    assert!(!image.exists() && !target.exists());
    assert_nothing_left(driver.state(), &[&target]);
    let line = format!(
        "NodePublishVolume csi-eph {} ro=false ctx=csi.storage.k8s.io/ephemeral=true,\
         csi.storage.k8s.io/pod.name=eph-0,csi.storage.k8s.io/pod.uid=uid-1,size=24Mi secrets=",
        target.display()
    );
    assert!(driver.calls().contains(&line), "{line:?} in {:?}", driver.calls());
}

#[tokio::test]
async fn without_staging_publish_attaches_and_the_last_unpublish_detaches() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let mut opts = CsiDriverOptions::new(dir.path(), NODE);
    opts.no_stage = true;
    opts.max_volumes = 7;
    let driver = start(&opts);
    let mut c = clients(&driver).await;
    let caps = c.node.node_get_capabilities(NodeGetCapabilitiesRequest {}).await.unwrap().into_inner();
    let rpcs: Vec<i32> = caps
        .capabilities
        .iter()
        .filter_map(|c| c.r#type.as_ref().map(|node_service_capability::Type::Rpc(r)| r.r#type))
        .collect();
    use node_service_capability::rpc::Type;
    assert!(!rpcs.contains(&(Type::StageUnstageVolume as i32)), "{rpcs:?}");
    assert!(rpcs.contains(&(Type::GetVolumeStats as i32)) && rpcs.contains(&(Type::ExpandVolume as i32)));
    let info = c.node.node_get_info(NodeGetInfoRequest {}).await.unwrap().into_inner();
    assert_eq!((info.node_id.as_str(), info.max_volumes_per_node), (NODE, 7));
    assert_eq!(info.accessible_topology.unwrap().segments, map(&[("topology.swiftlet.dev/node", NODE)]));

    let vol = create(&mut c, "pvc-direct", MI).await;
    assert_eq!(vol.capacity_bytes, 16 * MI, "16 MiB at least");
    let targets: Vec<PathBuf> = ["a", "b"].iter().map(|p| dir.path().join(p)).collect();
    for t in &targets {
        c.node
            .node_publish_volume(NodePublishVolumeRequest {
                volume_id: "pvc-direct".into(),
                target_path: t.display().to_string(),
                volume_capability: mount_cap(&[]),
                ..Default::default()
            })
            .await
            .expect("NodePublishVolume");
    }
    std::fs::write(targets[0].join("f"), "shared").unwrap();
    assert_eq!(std::fs::read_to_string(targets[1].join("f")).unwrap(), "shared");
    let image = PathBuf::from(&vol.volume_context["swiftlet.dev/image"]);
    for (i, t) in targets.iter().enumerate() {
        c.node
            .node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: "pvc-direct".into(),
                target_path: t.display().to_string(),
            })
            .await
            .expect("NodeUnpublishVolume");
        assert_eq!(loopdev::find(&image).is_empty(), i == 1, "attached until the last unpublish");
    }
    assert_nothing_left(driver.state(), &[&targets[0], &targets[1]]);
}

#[tokio::test]
async fn identity_failures_delays_registration_and_restarts() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let mut opts = CsiDriverOptions::new(dir.path(), NODE);
    opts.extra = vec!["--fail".into(), "NodeGetInfo".into()];
    let mut driver = start(&opts);
    let mut c = clients(&driver).await;

    let info = c.identity.get_plugin_info(GetPluginInfoRequest {}).await.unwrap().into_inner();
    assert_eq!((info.name.as_str(), info.vendor_version.as_str()), ("csi.swiftlet.dev", "0.1.0"));
    let caps = c.identity.get_plugin_capabilities(GetPluginCapabilitiesRequest {}).await.unwrap().into_inner();
    use plugin_capability::{Type, service, volume_expansion};
    let services: Vec<i32> = caps
        .capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(Type::Service(s)) => Some(s.r#type),
            _ => None,
        })
        .collect();
    assert_eq!(
        services,
        [service::Type::ControllerService as i32, service::Type::VolumeAccessibilityConstraints as i32]
    );
    assert!(caps.capabilities.iter().any(|c| matches!(&c.r#type,
        Some(Type::VolumeExpansion(e)) if e.r#type == volume_expansion::Type::Online as i32)));

    // --fail is for good; the fail file can be switched off again.
    let err = c.node.node_get_info(NodeGetInfoRequest {}).await.unwrap_err();
    assert_eq!((err.code(), err.message()), (Code::Internal, "injected failure"));
    driver.set_fail(&["Probe"]).unwrap();
    assert_eq!(c.identity.probe(ProbeRequest {}).await.unwrap_err().code(), Code::Internal);
    driver.set_fail(&[]).unwrap();
    assert_eq!(c.identity.probe(ProbeRequest {}).await.unwrap().into_inner().ready, Some(true));
    driver.set_delay(&[("GetPluginInfo", 300)]).unwrap();
    let t = Instant::now();
    c.identity.get_plugin_info(GetPluginInfoRequest {}).await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(300), "delayed {:?}", t.elapsed());
    driver.set_delay(&[]).unwrap();

    // Registration as node-driver-registrar serves it.
    let reg = driver.registration_socket();
    assert_eq!(reg, dir.path().join("plugins_registry/csi.swiftlet.dev-reg.sock"));
    let ch = swiftlet::grpc::dial_unix(&reg, Duration::from_secs(5), "registration").await.unwrap();
    let mut r = RegistrationClient::new(ch);
    let pi = r.get_info(InfoRequest {}).await.expect("GetInfo").into_inner();
    assert_eq!(pi.r#type, "CSIPlugin");
    assert_eq!(pi.name, "csi.swiftlet.dev");
    assert_eq!(PathBuf::from(&pi.endpoint), opts.csi_socket);
    assert_eq!(pi.supported_versions, ["1.0.0"]);
    r.notify_registration_status(RegistrationStatus { plugin_registered: false, error: "boom".into() }).await.unwrap();
    r.notify_registration_status(RegistrationStatus { plugin_registered: true, error: String::new() }).await.unwrap();
    let calls = driver.calls();
    let failed = calls.iter().position(|l| l == "registration failed: boom").expect("the refusal logged");
    assert!(calls.iter().skip(failed).any(|l| l == "registered"), "{calls:?}");

    // A crash keeps the sockets; a restart serves anew; SIGTERM removes them.
    driver.kill();
    assert!(opts.csi_socket.exists() && reg.exists(), "a killed driver leaves its sockets");
    driver.restart().expect("restart");
    assert!(driver.running());
    let mut c = clients(&driver).await;
    c.identity.probe(ProbeRequest {}).await.expect("Probe after the restart");
    driver.stop().expect("stop");
    assert!(!opts.csi_socket.exists() && !reg.exists(), "a stopped driver removes its sockets");
}
