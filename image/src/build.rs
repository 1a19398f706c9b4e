//! `inferloop-image build`: spec → staging tree → manifest → image, tarball and the manifest
//! beside them. Outputs appear only when all of them are complete (renamed into place).

use std::path::{Path, PathBuf};

use inferloop_manifest::{
    Artifact, Artifacts, DaemonPin, FileEntry, ImageInfo, Manifest, ModelPin, Placement, Tools,
    BAKED_PATH, SCHEMA_VERSION,
};

use crate::debian;
use crate::error::ImageError;
use crate::ota;
use crate::pack;
use crate::progress::Progress;
use crate::spec::{Base, ModelInput, OtaInput, Spec, CONFIG_PATH, DAEMON_PATH};
use crate::stage;
use crate::tools;
use crate::tree::{self, Specials};

/// File name of the manifest written beside the image.
pub const MANIFEST_FILE: &str = "manifest.json";
/// File name of the tarball.
pub const TARBALL_FILE: &str = "rootfs.tar.zst";

/// How to build, apart from the spec.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Every timestamp in the outputs (`SOURCE_DATE_EPOCH`).
    pub source_date_epoch: u64,
    pub progress: Progress,
    /// Where Debian bases are built and kept (default: `debian-cache` beside `out`).
    pub base_cache: Option<PathBuf>,
    /// Also write `rootfs.tar.zst` (a flasher's input; VM tests and bundles need only the
    /// image).
    pub tarball: bool,
}

/// File names of the kernel and initrd written beside an image with a Debian base.
pub const KERNEL_FILE: &str = "vmlinuz";
pub const INITRD_FILE: &str = "initrd.img";
/// The base's package list, copied beside the image.
pub const PACKAGES_FILE: &str = "debian-packages.txt";

/// What a build wrote.
#[derive(Debug, Clone)]
pub struct Built {
    pub image: PathBuf,
    pub tarball: Option<PathBuf>,
    pub manifest_path: PathBuf,
    /// The manifest beside the image (with `artifacts`).
    pub manifest: Manifest,
}

/// Builds the image described by `spec` into `out`.
pub fn build(spec: &Spec, out: &Path, opts: &BuildOptions) -> Result<Built, ImageError> {
    let progress = &opts.progress;
    let epoch = opts.source_date_epoch;
    std::fs::create_dir_all(out).map_err(ImageError::io(out))?;
    let work = tempfile::Builder::new()
        .prefix(".staging-")
        .tempdir_in(out)
        .map_err(ImageError::io(out))?;

    // Missing tools fail before any copying.
    let tools = Tools {
        mksquashfs: match spec.format {
            inferloop_manifest::ImageFormat::Squashfs => Some(tools::mksquashfs_version()?),
            inferloop_manifest::ImageFormat::Erofs => None,
        },
        mkfs_erofs: match spec.format {
            inferloop_manifest::ImageFormat::Erofs => Some(tools::mkfs_erofs_version(work.path())?),
            inferloop_manifest::ImageFormat::Squashfs => None,
        },
        zstd: Some(pack::zstd_version()),
    };

    let root = work.path().join("root");
    std::fs::create_dir(&root).map_err(ImageError::io(&root))?;
    tree::set_mode(&root, 0o755)?;

    let base = match &spec.base {
        Base::Debian(debian) => {
            let cache = match &opts.base_cache {
                Some(c) => c.clone(),
                None => out
                    .parent()
                    .unwrap_or_else(|| Path::new("."))
                    .join("debian-cache"),
            };
            Base::Dir(debian.ensure(&cache, epoch)?)
        }
        other => other.clone(),
    };
    tracing::info!(base = ?base, "staging the base root filesystem");
    stage::base(&base, &root)?;
    for overlay in &spec.overlays {
        tracing::info!(overlay = %overlay.display(), "applying the overlay");
        stage::overlay(overlay, &root, &stage::template_vars(spec))?;
        crate::sysusers::apply(overlay, &root)?;
    }

    let daemon_dest = tree::join(&root, DAEMON_PATH);
    tree::mkdir_p(daemon_dest.parent().unwrap_or(&root))?;
    replace_with_copy(&spec.daemon.path, &daemon_dest, 0o755)?;
    if let Some(dir) = &spec.daemon.kernels {
        let n = crate::kernels::install(dir, &root)?;
        tracing::info!(kernels = %dir.display(), files = n, "installing the CUDA kernels");
    }
    if let Some(input) = &spec.ota {
        tracing::info!(keyring = %input.keyring.display(), "installing the RAUC config and keyring");
        install_ota(spec, input, &root)?;
    }

    if let Some(gateway) = &spec.gateway {
        crate::gateway::install(
            gateway,
            &spec.daemon.target,
            &spec.version,
            &spec.board.name,
            &root,
            work.path(),
        )?;
    }

    for model in std::iter::once(&spec.model).chain(spec.draft_model.as_ref()) {
        if let ModelInput::Baked { file, .. } = model {
            let dest = tree::join(&root, &model.device_path());
            tree::mkdir_p(dest.parent().unwrap_or(&root))?;
            tracing::info!(model = %file.display(), "baking the model into the image");
            replace_with_copy(file, &dest, 0o644)?;
        }
    }

    let config_dest = tree::join(&root, CONFIG_PATH);
    if std::fs::symlink_metadata(&config_dest).is_ok() {
        return Err(ImageError::OverlayConflict {
            path: config_dest,
            message: format!(
                "{CONFIG_PATH} is generated from the spec's [config]; remove it from the base and overlay"
            ),
        });
    }
    tree::write_file(&config_dest, stage::config_text(spec).as_bytes(), 0o644)?;
    stage::mount_points(&root)?;

    let nodes = tree::walk(&root, Specials::Refuse)?;
    if nodes.iter().any(|n| n.path == BAKED_PATH) {
        return Err(ImageError::OverlayConflict {
            path: tree::join(&root, BAKED_PATH),
            message: format!(
                "{BAKED_PATH} is written by the builder; remove it from the base and overlay"
            ),
        });
    }
    let files = tree::entries(&nodes, BAKED_PATH, progress)?;
    let manifest = manifest_for(spec, epoch, tools, files)?;
    manifest.check_for_build(Path::new(BAKED_PATH))?;
    let baked = manifest.to_json_bytes();
    tree::write_file(&tree::join(&root, BAKED_PATH), &baked, 0o644)?;

    let nodes = tree::walk(&root, Specials::Refuse)?;
    let image_tmp = work.path().join(spec.format.file_name());
    tracing::info!(format = spec.format.as_str(), "packing the image");
    pack::image(
        spec.format,
        &root,
        &image_tmp,
        epoch,
        &baked,
        spec.squashfs_compression,
        progress,
    )?;
    let tar_tmp = work.path().join(TARBALL_FILE);
    let tarball = if opts.tarball {
        tracing::info!("writing the tarball");
        pack::tarball(&nodes, &tar_tmp, epoch, progress)?;
        Some(artifact(&tar_tmp, progress)?)
    } else {
        None
    };
    // Booting without a bootloader in the image (QEMU -kernel/-initrd) needs them outside.
    let mut extras = Vec::new();
    if matches!(spec.base, Base::Debian(_)) {
        let (kernel, initrd) =
            debian::kernel_files(&root)?.ok_or_else(|| ImageError::UnsupportedEntry {
                path: root.join("boot"),
                message: "a Debian base has no /boot/vmlinuz-*: add a linux-image package".into(),
            })?;
        for (from, name) in [
            (kernel, KERNEL_FILE),
            (initrd, INITRD_FILE),
            (tree::join(&root, debian::PACKAGES_PATH), PACKAGES_FILE),
        ] {
            let tmp = work.path().join(name);
            std::fs::copy(&from, &tmp).map_err(ImageError::io(&from))?;
            extras.push((tmp, out.join(name)));
        }
    }

    let beside = Manifest {
        artifacts: Some(Artifacts {
            image: artifact(&image_tmp, progress)?,
            tarball,
        }),
        ..manifest
    };
    let manifest_path = out.join(MANIFEST_FILE);
    beside.check_for_install(&manifest_path, Some(&spec.board.name))?;
    let manifest_tmp = work.path().join(MANIFEST_FILE);
    std::fs::write(&manifest_tmp, beside.to_json_bytes()).map_err(ImageError::io(&manifest_tmp))?;

    let image = out.join(spec.format.file_name());
    let tarball = opts.tarball.then(|| out.join(TARBALL_FILE));
    // A stale tarball beside a new image would not match its manifest.
    if tarball.is_none() {
        let stale = out.join(TARBALL_FILE);
        if stale.exists() {
            std::fs::remove_file(&stale).map_err(ImageError::io(&stale))?;
        }
    }
    let mut moves = vec![(image_tmp, image.clone())];
    if let Some(t) = &tarball {
        moves.push((tar_tmp, t.clone()));
    }
    moves.extend(extras);
    moves.push((manifest_tmp, manifest_path.clone()));
    for (from, to) in &moves {
        std::fs::rename(from, to).map_err(ImageError::io(to))?;
    }
    Ok(Built {
        image,
        tarball,
        manifest_path,
        manifest: beside,
    })
}

/// The manifest to bake, from the hashed file list and the spec.
fn manifest_for(
    spec: &Spec,
    epoch: u64,
    tools: Tools,
    files: Vec<FileEntry>,
) -> Result<Manifest, ImageError> {
    let find = |p: &str| files.iter().find(|e| e.path == p);
    let listed = |p: &str| -> Result<(String, u64), ImageError> {
        find(p)
            .and_then(|e| Some((e.sha256.clone()?, e.size)))
            .ok_or_else(|| ImageError::UnsupportedEntry {
                path: PathBuf::from(p),
                message: "was staged but is not a regular file in the image".into(),
            })
    };
    let (daemon_sha, daemon_size) = listed(DAEMON_PATH)?;
    let (config_sha, _) = listed(CONFIG_PATH)?;
    // A baked model's pin is what was staged (checked against the spec's sha256 and size
    // when given); a mounted one's is the spec's.
    let pin = |model: &ModelInput| -> Result<ModelPin, ImageError> {
        Ok(match model {
            ModelInput::Baked { file, sha256, size } => {
                let (actual_sha, actual_size) = listed(&model.device_path())?;
                if let Some(want) = size.filter(|w| *w != actual_size) {
                    return Err(ImageError::ModelMismatch {
                        path: file.clone(),
                        field: "size",
                        expected: want.to_string(),
                        actual: actual_size.to_string(),
                    });
                }
                if let Some(want) = sha256.as_ref().filter(|w| **w != actual_sha) {
                    return Err(ImageError::ModelMismatch {
                        path: file.clone(),
                        field: "sha256",
                        expected: want.clone(),
                        actual: actual_sha,
                    });
                }
                ModelPin {
                    path: model.device_path(),
                    sha256: actual_sha,
                    size: actual_size,
                    placement: Some(Placement::Baked),
                }
            }
            ModelInput::Mounted { path, sha256, size } => ModelPin {
                path: path.clone(),
                sha256: sha256.clone(),
                size: *size,
                placement: Some(Placement::Mounted),
            },
        })
    };
    let model = pin(&spec.model)?;
    let draft_model = spec.draft_model.as_ref().map(pin).transpose()?;
    Ok(Manifest {
        schema: SCHEMA_VERSION,
        model,
        draft_model,
        image: Some(ImageInfo {
            version: spec.version.clone(),
            compatible: spec.board.name.clone(),
            build_time: epoch,
            format: spec.format,
            daemon: DaemonPin {
                path: DAEMON_PATH.to_string(),
                sha256: daemon_sha,
                size: daemon_size,
                target: spec.daemon.target.clone(),
                version: spec.daemon.version.clone(),
            },
            config_sha256: config_sha,
            tools,
            files,
        }),
        artifacts: None,
    })
}

/// RAUC's config and keyring, and the qualification binary when the spec names one. They
/// are listed in the manifest like every other staged file.
fn install_ota(spec: &Spec, input: &OtaInput, root: &Path) -> Result<(), ImageError> {
    let conf = ota::system_conf(spec.board, &ota::ConfOverrides::default())?;
    let keyring = std::fs::read(&input.keyring).map_err(ImageError::io(&input.keyring))?;
    for (path, bytes) in [
        (ota::SYSTEM_CONF_PATH, conf.as_bytes()),
        (ota::KEYRING_PATH, keyring.as_slice()),
    ] {
        let dest = tree::join(root, path);
        // One source of truth: a second keyring in the overlay would silently win or lose.
        if std::fs::symlink_metadata(&dest).is_ok() {
            return Err(ImageError::OverlayConflict {
                path: dest,
                message: format!(
                    "{path} is generated from the spec's [ota]; remove it from the base and overlay"
                ),
            });
        }
        tree::write_file(&dest, bytes, 0o644)?;
    }
    if let Some(agent) = &input.agent {
        let dest = tree::join(root, ota::AGENT_PATH);
        tree::mkdir_p(dest.parent().unwrap_or(root))?;
        replace_with_copy(agent, &dest, 0o755)?;
    }
    if let Some(agent) = &input.fleet {
        let dest = tree::join(root, ota::AGENT_CONF_PATH);
        if std::fs::symlink_metadata(&dest).is_ok() {
            return Err(ImageError::OverlayConflict {
                path: dest,
                message: format!(
                    "{} is generated from the spec's [ota] server; remove it from the base and overlay",
                    ota::AGENT_CONF_PATH
                ),
            });
        }
        tree::mkdir_p(dest.parent().unwrap_or(root))?;
        tree::write_file(&dest, agent.render().as_bytes(), 0o644)?;
    }
    if let Some(qual) = &input.qual {
        let dest = tree::join(root, ota::QUAL_PATH);
        tree::mkdir_p(dest.parent().unwrap_or(root))?;
        replace_with_copy(qual, &dest, 0o755)?;
    }
    Ok(())
}

/// Copies `src` over whatever is at `dest` (a base's own file, say) with `mode`.
fn replace_with_copy(src: &Path, dest: &Path, mode: u32) -> Result<(), ImageError> {
    match std::fs::symlink_metadata(dest) {
        Ok(m) if m.is_dir() => {
            return Err(ImageError::OverlayConflict {
                path: dest.to_path_buf(),
                message: "is a directory in the base or overlay".into(),
            })
        }
        Ok(_) => std::fs::remove_file(dest).map_err(ImageError::io(dest))?,
        Err(_) => {}
    }
    std::fs::copy(src, dest).map_err(ImageError::io(src))?;
    tree::set_mode(dest, mode)
}

fn artifact(path: &Path, progress: &Progress) -> Result<Artifact, ImageError> {
    let size = std::fs::metadata(path).map_err(ImageError::io(path))?.len();
    let bar = progress.bytes(size, "hashing");
    let mut last = 0;
    let sha256 = inferloop_manifest::hash::sha256_file(path, |done, _| {
        bar.inc(done - last);
        last = done;
    })
    .map_err(ImageError::io(path))?;
    bar.finish_and_clear();
    Ok(Artifact {
        file: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        sha256,
        size,
    })
}
