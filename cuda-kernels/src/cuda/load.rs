//! Where each kernel module comes from, in order of preference:
//!
//! 1. `$INFERLOOP_KERNELS_PTX/<module>.ptx` when that variable is set (an explicit override:
//!    the CUDA emulator's stand-in modules, or PTX brought to a machine by hand);
//! 2. `<kernels dir>/sm_XY/<module>.cubin` for the device's exact architecture (SASS built by
//!    `make kernels-check` with ptxas: nothing left to compile on the device);
//! 3. `<kernels dir>/ptx/<module>.ptx` (PTX at the ISA of the oldest driver supported,
//!    JetPack 6.0's CUDA 12.2, for the lowest architecture CUDA 13 still targets: the driver
//!    JIT-compiles it), unless its `.version` is newer than this driver accepts;
//! 4. the device's own NVRTC (`libnvrtc.so.13` or `.so.12`), for its architecture.
//!
//! The kernels directory is `$INFERLOOP_KERNELS_DIR`, else the first of `<exe dir>/kernels`,
//! `<exe dir>/../lib/inferloop/kernels` and `/usr/lib/inferloop/kernels` that exists. A file
//! that is there but does not load is an error naming it: only an absent file falls through.

use std::path::{Path, PathBuf};

use cudarc::nvrtc::Ptx;
use serde::Serialize;

use super::GpuError;
use crate::nvrtc;

/// Environment variable naming a directory of `<module>.ptx` files that overrides the rest.
pub const PTX_DIR_ENV: &str = "INFERLOOP_KERNELS_PTX";
/// Environment variable naming the kernels directory (`sm_87/`, `sm_90/`, `ptx/`).
pub const KERNELS_DIR_ENV: &str = "INFERLOOP_KERNELS_DIR";
/// Where packages and images install the kernels.
pub const SYSTEM_KERNELS_DIR: &str = "/usr/lib/inferloop/kernels";

/// How one module was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    /// From [`PTX_DIR_ENV`].
    PtxOverride,
    /// A shipped cubin for the device's architecture.
    Cubin,
    /// The shipped PTX, JIT-compiled by the driver.
    Ptx,
    /// Compiled on the device by its NVRTC.
    Nvrtc,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::PtxOverride => "ptx-override",
            Origin::Cubin => "cubin",
            Origin::Ptx => "ptx",
            Origin::Nvrtc => "nvrtc",
        }
    }
}

/// Where one module came from: the file, or the NVRTC and target that compiled it.
#[derive(Debug, Clone, Serialize)]
pub struct ModuleSource {
    pub module: &'static str,
    pub origin: Origin,
    pub detail: String,
}

/// Where a [`super::Gpu`]'s kernels came from.
#[derive(Debug, Clone, Default, Serialize)]
pub struct KernelsFrom {
    /// The kernels directory searched, when one was found.
    pub dir: Option<PathBuf>,
    pub modules: Vec<ModuleSource>,
}

impl KernelsFrom {
    /// One line: each origin with its module count, e.g. `cubin sm_87 ×9 from /usr/lib/…`.
    pub fn summary(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        for o in [
            Origin::PtxOverride,
            Origin::Cubin,
            Origin::Ptx,
            Origin::Nvrtc,
        ] {
            let n = self.modules.iter().filter(|m| m.origin == o).count();
            if n > 0 {
                parts.push(format!("{} x{n}", o.as_str()));
            }
        }
        match &self.dir {
            Some(d) => format!("{} (kernels dir {})", parts.join(", "), d.display()),
            None => format!("{} (no kernels dir)", parts.join(", ")),
        }
    }
}

/// The kernels directory: [`KERNELS_DIR_ENV`] (an error when set and missing), else the
/// first that exists of next to the executable, the install prefix and the system path.
pub fn kernels_dir() -> Result<Option<PathBuf>, GpuError> {
    if let Some(d) = std::env::var_os(KERNELS_DIR_ENV).filter(|d| !d.is_empty()) {
        let d = PathBuf::from(d);
        if !d.is_dir() {
            return Err(GpuError::KernelsDir {
                path: d.display().to_string(),
            });
        }
        return Ok(Some(d));
    }
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf));
    let mut candidates = Vec::new();
    if let Some(e) = exe_dir {
        candidates.push(e.join("kernels"));
        candidates.push(e.join("../lib/inferloop/kernels"));
    }
    candidates.push(PathBuf::from(SYSTEM_KERNELS_DIR));
    Ok(candidates.into_iter().find(|d| d.is_dir()))
}

/// What the loader needs to know about the device.
pub struct Target {
    pub capability: (i32, i32),
    /// `cuDriverGetVersion`, e.g. 12020.
    pub driver: i32,
}

/// Reads `path` (binary for a cubin: NUL-terminated, since `cuModuleLoadData` takes no
/// length and the emulator's stand-ins are text).
fn read(module: &str, path: &Path, binary: bool) -> Result<Ptx, GpuError> {
    let err = |source| GpuError::ModuleFile {
        module: module.to_string(),
        path: path.display().to_string(),
        source,
    };
    if binary {
        let mut bytes = std::fs::read(path).map_err(err)?;
        bytes.push(0);
        Ok(Ptx::from_binary(bytes))
    } else {
        Ok(Ptx::from_src(std::fs::read_to_string(path).map_err(err)?))
    }
}

/// [`PTX_DIR_ENV`]'s directory, when set.
pub fn ptx_override() -> Option<PathBuf> {
    std::env::var_os(PTX_DIR_ENV)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
}

/// The module `name` (source `code`) for `target` from `override_dir` (see
/// [`ptx_override`]), else the kernels directory `dir`, else NVRTC; and where it came from.
pub fn module(
    name: &'static str,
    code: &str,
    target: &Target,
    override_dir: Option<&Path>,
    dir: Option<&Path>,
) -> Result<(Ptx, ModuleSource), GpuError> {
    let found = |origin, detail: String| ModuleSource {
        module: name,
        origin,
        detail,
    };
    if let Some(d) = override_dir {
        let path = d.join(format!("{name}.ptx"));
        let ptx = read(name, &path, false)?;
        return Ok((ptx, found(Origin::PtxOverride, path.display().to_string())));
    }
    if let Some(dir) = dir {
        let (major, minor) = target.capability;
        let cubin = dir.join(format!("sm_{major}{minor}/{name}.cubin"));
        if cubin.is_file() {
            let ptx = read(name, &cubin, true)?;
            return Ok((ptx, found(Origin::Cubin, cubin.display().to_string())));
        }
        let path = dir.join(format!("ptx/{name}.ptx"));
        if path.is_file() {
            let text = std::fs::read_to_string(&path).map_err(|source| GpuError::ModuleFile {
                module: name.to_string(),
                path: path.display().to_string(),
                source,
            })?;
            match (nvrtc::ptx_isa(&text), nvrtc::max_ptx_isa(target.driver)) {
                (Some(isa), Some(max)) if isa > max => tracing::warn!(
                    module = name,
                    path = %path.display(),
                    "PTX ISA {}.{} is newer than this driver ({}) takes ({}.{}); trying NVRTC",
                    isa.0, isa.1, target.driver, max.0, max.1
                ),
                _ => {
                    return Ok((
                        Ptx::from_src(text),
                        found(Origin::Ptx, path.display().to_string()),
                    ))
                }
            }
        }
    }
    let arch = nvrtc::arch_for(target.capability).map_err(|e| GpuError::NoModule {
        module: name.to_string(),
        dir: dir.map(|d| d.display().to_string()),
        source: Box::new(e),
    })?;
    let info = nvrtc::info().map_err(|e| GpuError::NoModule {
        module: name.to_string(),
        dir: dir.map(|d| d.display().to_string()),
        source: Box::new(e),
    })?;
    let ptx = nvrtc::compile(name, code, &arch, &[])?;
    let detail = format!("NVRTC {} ({}) for {arch}", info.version, info.library);
    Ok((ptx, found(Origin::Nvrtc, detail)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORIN: Target = Target {
        capability: (8, 7),
        driver: 12020,
    };

    fn origin(dir: &Path, target: &Target) -> Result<Origin, GpuError> {
        module("k", "", target, None, Some(dir)).map(|(_, m)| m.origin)
    }

    #[test]
    fn the_devices_cubin_then_the_shipped_ptx_then_nvrtc() {
        let dir = std::env::temp_dir().join(format!("inferloop-load-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["sm_87", "sm_90", "ptx"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        std::fs::write(dir.join("sm_90/k.cubin"), b"\x7fELF").unwrap();
        std::fs::write(dir.join("ptx/k.ptx"), ".version 8.2\n.target sm_75\n").unwrap();
        // Orin has no sm_87 cubin here: the PTX, which its CUDA 12.2 driver takes.
        assert_eq!(origin(&dir, &ORIN).unwrap(), Origin::Ptx);
        let h200 = Target {
            capability: (9, 0),
            driver: 13000,
        };
        assert_eq!(origin(&dir, &h200).unwrap(), Origin::Cubin);
        std::fs::write(dir.join("sm_87/k.cubin"), b"\x7fELF").unwrap();
        assert_eq!(origin(&dir, &ORIN).unwrap(), Origin::Cubin);
        // PTX newer than the driver takes is passed over for NVRTC, never handed to it.
        std::fs::remove_file(dir.join("sm_87/k.cubin")).unwrap();
        std::fs::write(dir.join("ptx/k.ptx"), ".version 8.5\n").unwrap();
        match origin(&dir, &ORIN) {
            Ok(o) => assert_eq!(o, Origin::Nvrtc),
            Err(GpuError::NoModule { module, .. }) => assert_eq!(module, "k"),
            Err(e) => panic!("{e}"),
        }
        // The override wins, and a file it lacks is an error naming it.
        let e = module("k", "", &ORIN, Some(&dir), Some(&dir))
            .err()
            .unwrap();
        assert!(
            e.to_string().contains("cannot read kernel module k from"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_summary_counts_each_origin() {
        let m = |module, origin| ModuleSource {
            module,
            origin,
            detail: String::new(),
        };
        let k = KernelsFrom {
            dir: Some(PathBuf::from("/usr/lib/inferloop/kernels")),
            modules: vec![
                m("a", Origin::Cubin),
                m("b", Origin::Cubin),
                m("c", Origin::Nvrtc),
            ],
        };
        assert_eq!(
            k.summary(),
            "cubin x2, nvrtc x1 (kernels dir /usr/lib/inferloop/kernels)"
        );
    }
}
