//! The native backend's shipped CUDA kernels (`make kernels-check`'s `out/kernels/`: SASS
//! cubins per architecture in `sm_NN/`, PTX for the oldest supported driver in `ptx/`),
//! installed where the daemon's loader looks on a box: [`KERNELS_PATH`]. Only those files
//! are copied (not the build log or the tables beside them); the manifest then lists and
//! pins each one like any file of the image.

use std::path::{Path, PathBuf};

use crate::error::ImageError;
use crate::tree;

/// Where the daemon looks for its kernels (`inferloop_kernels::cuda::load`).
pub const KERNELS_PATH: &str = "/usr/lib/inferloop/kernels";

/// The files to install: (path relative to the kernels directory, source), sorted.
pub fn files(dir: &Path) -> Result<Vec<(String, PathBuf)>, ImageError> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(ImageError::io(dir))?;
    for entry in entries {
        let entry = entry.map_err(ImageError::io(dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let ext = match name.as_str() {
            "ptx" => "ptx",
            n if n.starts_with("sm_") && n[3..].bytes().all(|b| b.is_ascii_digit()) => "cubin",
            _ => continue,
        };
        let sub = entry.path();
        if !sub.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(&sub).map_err(ImageError::io(&sub))? {
            let f = f.map_err(ImageError::io(&sub))?;
            let path = f.path();
            if path.is_file() && path.extension().is_some_and(|e| e == ext) {
                let file = f.file_name().to_string_lossy().into_owned();
                out.push((format!("{name}/{file}"), path));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Checks a spec's `daemon.kernels`: a directory with PTX for every module, so a box whose
/// architecture has no cubin still loads through its driver's JIT.
pub fn check(dir: &Path) -> Result<usize, ImageError> {
    let invalid = |message: String| ImageError::SpecInvalid {
        field: "daemon.kernels",
        message,
    };
    if !dir.is_dir() {
        return Err(invalid(format!(
            "{} is not a directory (make kernels-check writes out/kernels)",
            dir.display()
        )));
    }
    let files = files(dir)?;
    if !files.iter().any(|(rel, _)| rel.starts_with("ptx/")) {
        return Err(invalid(format!(
            "{} has no ptx/*.ptx: the PTX every driver can load must ship",
            dir.display()
        )));
    }
    Ok(files.len())
}

/// Copies the kernels into `root`'s [`KERNELS_PATH`], read-only for everyone.
pub fn install(dir: &Path, root: &Path) -> Result<usize, ImageError> {
    let files = files(dir)?;
    let dest_dir = tree::join(root, KERNELS_PATH);
    for (rel, src) in &files {
        let dest = dest_dir.join(rel);
        tree::mkdir_p(dest.parent().unwrap_or(&dest_dir))?;
        std::fs::copy(src, &dest).map_err(ImageError::io(src))?;
        tree::set_mode(&dest, 0o644)?;
    }
    Ok(files.len())
}
