//! Compiling a kernel source to PTX with NVRTC, loaded at run time by its versioned names
//! only (the device's own `libnvrtc.so.13` or `.so.12`; a PyPI wheel's in CI, found through
//! `LD_LIBRARY_PATH`). cudarc's own loader tries the unversioned `libnvrtc.so` first (a
//! development symlink that may name another toolkit) and never `.so.13`, so this module
//! opens the library itself.
//!
//! Every compile passes [`FMAD_OFF`]: NVRTC contracts `a*b+c` into one fused multiply-add by
//! default, which rounds once where the CPU twin rounds twice, so bit-exactness would hang on
//! how each kernel happens to be written. The CUDA emulator compiles with
//! `-ffp-contract=off`, the same rule.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

use cudarc::nvrtc::Ptx;
use libloading::Library;

/// The option that turns contraction off; always passed (see the module comment).
pub const FMAD_OFF: &str = "--fmad=false";

/// Environment variable naming an NVRTC library file to load instead of the search below.
pub const NVRTC_LIB_ENV: &str = "INFERLOOP_NVRTC";

/// The names searched, newest first. Never the unversioned `libnvrtc.so`.
pub const LIB_NAMES: &[&str] = &["libnvrtc.so.13", "libnvrtc.so.12"];

/// The oldest architecture the shipped PTX targets: the lowest CUDA 13 still compiles for
/// (it dropped sm_5x..sm_7.2), new enough for `dp4a` and the f16 conversions the kernels use.
pub const BASELINE_ARCH: (i32, i32) = (7, 5);

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("no NVRTC library found: none of {} is on the library path (JetPack ships libnvrtc.so.12 under /usr/local/cuda/lib64; `make kernels-check` installs one from PyPI){}", LIB_NAMES.join(", "), .0)]
    NoNvrtc(String),
    #[error("NVRTC {version} has no target at or below {arch} (it supports {supported})")]
    NoArch {
        version: String,
        arch: String,
        supported: String,
    },
    #[error("NVRTC could not compile {name}.cu for {arch}: {log}")]
    Compile {
        name: String,
        arch: String,
        log: String,
    },
}

type Program = *mut c_void;

/// The NVRTC entry points used, resolved once.
struct Api {
    _lib: Library,
    file: String,
    version: (i32, i32),
    archs: Vec<i32>,
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int,
    ptx_size: unsafe extern "C" fn(Program, *mut usize) -> c_int,
    ptx: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> c_int,
    log: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
    destroy: unsafe extern "C" fn(*mut Program) -> c_int,
    error_string: unsafe extern "C" fn(c_int) -> *const c_char,
}

// SAFETY: NVRTC's entry points are thread-safe for distinct programs; the struct only
// holds function pointers and the library that keeps them valid.
unsafe impl Send for Api {}
unsafe impl Sync for Api {}

/// The library names in the order they are tried: [`NVRTC_LIB_ENV`] alone when set.
pub fn candidates() -> Vec<String> {
    match std::env::var(NVRTC_LIB_ENV) {
        Ok(path) if !path.is_empty() => vec![path],
        _ => LIB_NAMES.iter().map(|s| s.to_string()).collect(),
    }
}

fn load() -> Result<Api, String> {
    let mut tried = Vec::new();
    for name in candidates() {
        // SAFETY: loading NVRTC runs no initialisers with preconditions.
        match unsafe { Library::new(&name) } {
            Ok(lib) => return resolve(lib, name).map_err(|e| format!(": {e}")),
            Err(e) => {
                // libloading's own text is "dlopen failed"; the loader's reason is its source.
                let why = std::error::Error::source(&e).map_or(e.to_string(), |s| s.to_string());
                tried.push(why);
            }
        }
    }
    Err(format!(" ({})", tried.join("; ")))
}

fn resolve(lib: Library, file: String) -> Result<Api, libloading::Error> {
    // SAFETY: the signatures are NVRTC's (nvrtc.h, unchanged since CUDA 11); the pointers
    // stay valid while `_lib` lives, and it lives as long as `Api`.
    unsafe {
        let version_fn =
            *lib.get::<unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int>(b"nvrtcVersion\0")?;
        let (mut major, mut minor) = (0, 0);
        version_fn(&mut major, &mut minor);
        let n_archs =
            *lib.get::<unsafe extern "C" fn(*mut c_int) -> c_int>(b"nvrtcGetNumSupportedArchs\0")?;
        let archs_fn =
            *lib.get::<unsafe extern "C" fn(*mut c_int) -> c_int>(b"nvrtcGetSupportedArchs\0")?;
        let mut n = 0;
        n_archs(&mut n);
        let mut archs = vec![0; usize::try_from(n).unwrap_or(0)];
        if !archs.is_empty() {
            archs_fn(archs.as_mut_ptr());
        }
        Ok(Api {
            file,
            version: (major, minor),
            archs,
            create: *lib.get(b"nvrtcCreateProgram\0")?,
            compile: *lib.get(b"nvrtcCompileProgram\0")?,
            ptx_size: *lib.get(b"nvrtcGetPTXSize\0")?,
            ptx: *lib.get(b"nvrtcGetPTX\0")?,
            log_size: *lib.get(b"nvrtcGetProgramLogSize\0")?,
            log: *lib.get(b"nvrtcGetProgramLog\0")?,
            destroy: *lib.get(b"nvrtcDestroyProgram\0")?,
            error_string: *lib.get(b"nvrtcGetErrorString\0")?,
            _lib: lib,
        })
    }
}

fn api() -> Result<&'static Api, CompileError> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(load)
        .as_ref()
        .map_err(|e| CompileError::NoNvrtc(e.clone()))
}

/// Whether libnvrtc can be loaded.
pub fn nvrtc_present() -> bool {
    api().is_ok()
}

/// The loaded NVRTC: its version, the file it came from, the architectures it compiles for
/// (`75` for compute_75 …).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Info {
    pub version: String,
    pub major: i32,
    pub library: String,
    pub archs: Vec<i32>,
}

/// The loaded NVRTC, or why there is none.
pub fn info() -> Result<Info, CompileError> {
    let a = api()?;
    Ok(Info {
        version: format!("{}.{}", a.version.0, a.version.1),
        major: a.version.0,
        library: a.file.clone(),
        archs: a.archs.clone(),
    })
}

/// `compute_XY` for a compute capability, e.g. (8, 7) for Orin.
pub fn arch_name(major: i32, minor: i32) -> String {
    format!("compute_{major}{minor}")
}

/// The architecture to compile for on a device of compute capability `cc` with the loaded
/// NVRTC: the device's own when NVRTC lists it, else the newest it lists below the device's
/// (a driver JIT-compiles older PTX for a newer GPU). CUDA 13's list starts at 7.5.
pub fn arch_for(cc: (i32, i32)) -> Result<String, CompileError> {
    let a = api()?;
    pick_arch(&a.archs, cc).ok_or_else(|| CompileError::NoArch {
        version: format!("{}.{}", a.version.0, a.version.1),
        arch: arch_name(cc.0, cc.1),
        supported: format!("{:?}", a.archs),
    })
}

/// [`arch_for`] over a supported list (`[75, 80, 86, 87, 89, 90, …]`).
pub fn pick_arch(supported: &[i32], cc: (i32, i32)) -> Option<String> {
    let want = cc.0 * 10 + cc.1;
    let best = supported.iter().copied().filter(|&a| a <= want).max()?;
    Some(format!("compute_{best}"))
}

/// The options every compile passes: the architecture, [`FMAD_OFF`], then `extra`.
pub fn options(arch: &str, extra: &[String]) -> Vec<String> {
    let mut o = vec![format!("--gpu-architecture={arch}"), FMAD_OFF.to_string()];
    o.extend(extra.iter().cloned());
    o
}

/// Definitions older NVRTC releases declare but leave undefined without CUDA's headers
/// (which PyPI's NVRTC and a bare JetPack lack): NVRTC 12.2 compiles `__dp4a` to a call of
/// an unresolved `.extern .func`, which ptxas and the driver then refuse. Each is the
/// intrinsic's one PTX instruction, as in CUDA's own `sm_61_intrinsics.hpp`.
const SHIMS: &[(&str, &str)] = &[(
    "_Z6__dp4aiii",
    "__device__ int __dp4a(int a, int b, int c) { int r; \
     asm(\"dp4a.s32.s32 %0, %1, %2, %3;\" : \"=r\"(r) : \"r\"(a), \"r\"(b), \"r\"(c)); return r; }\n",
)];

/// Compiles `code` (the file `name`.cu) to PTX for `arch` (`compute_87` …). `extra` adds
/// options, e.g. `-DQ8_GEMV_ROWS_PER_BLOCK=4` for tuning. Where the NVRTC leaves an
/// intrinsic of [`SHIMS`] undefined, compiles again with its definition in front.
pub fn compile(name: &str, code: &str, arch: &str, extra: &[String]) -> Result<Ptx, CompileError> {
    let opts = options(arch, extra);
    let ptx = compile_raw(name, code, &opts)?;
    let missing: Vec<&str> = SHIMS
        .iter()
        .filter(|(sym, _)| {
            ptx.contains(&format!(".extern .func  (.param .b32 func_retval0) {sym}"))
        })
        .map(|(_, def)| *def)
        .collect();
    if missing.is_empty() {
        return Ok(Ptx::from_src(ptx));
    }
    let shimmed = format!("{}#line 1 \"{name}.cu\"\n{code}", missing.concat());
    compile_raw(name, &shimmed, &opts).map(Ptx::from_src)
}

/// Compiles with exactly `opts` (no [`FMAD_OFF`] added): for tests that show what it changes.
pub fn compile_raw(name: &str, code: &str, opts: &[String]) -> Result<String, CompileError> {
    let a = api()?;
    let arch = opts
        .iter()
        .find_map(|o| o.strip_prefix("--gpu-architecture="))
        .unwrap_or("default")
        .to_string();
    let fail = |log: String| CompileError::Compile {
        name: name.to_string(),
        arch: arch.clone(),
        log,
    };
    let c = |s: &str| CString::new(s).map_err(|_| fail(format!("a NUL byte in {s:?}")));
    let (src, file) = (c(code)?, c(&format!("{name}.cu"))?);
    let copts = opts.iter().map(|o| c(o)).collect::<Result<Vec<_>, _>>()?;
    let ptrs: Vec<*const c_char> = copts.iter().map(|o| o.as_ptr()).collect();
    let mut prog: Program = std::ptr::null_mut();
    // SAFETY: every pointer is a live NUL-terminated string; `prog` is destroyed below.
    unsafe {
        let rc = (a.create)(
            &mut prog,
            src.as_ptr(),
            file.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        );
        if rc != 0 {
            return Err(fail(a.error(rc)));
        }
        let n = c_int::try_from(ptrs.len()).unwrap_or(c_int::MAX);
        let rc = (a.compile)(prog, n, ptrs.as_ptr());
        let result = if rc != 0 {
            Err(fail(format!(
                "{}: {}",
                a.error(rc),
                a.text(prog, a.log_size, a.log)
            )))
        } else {
            Ok(a.text(prog, a.ptx_size, a.ptx))
        };
        (a.destroy)(&mut prog);
        result
    }
}

impl Api {
    fn error(&self, rc: c_int) -> String {
        // SAFETY: nvrtcGetErrorString returns a static string for any code.
        let s = unsafe { (self.error_string)(rc) };
        if s.is_null() {
            return format!("NVRTC error {rc}");
        }
        // SAFETY: non-null, NUL-terminated, static.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }

    /// A program's log or PTX through its size and copy calls, without the trailing NUL.
    unsafe fn text(
        &self,
        prog: Program,
        size: unsafe extern "C" fn(Program, *mut usize) -> c_int,
        get: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
    ) -> String {
        let mut n = 0usize;
        if size(prog, &mut n) != 0 || n == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; n];
        if get(prog, buf.as_mut_ptr().cast()) != 0 {
            return String::new();
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    }
}

/// The PTX ISA version a file declares (`.version 8.2` → (8, 2)).
pub fn ptx_isa(ptx: &str) -> Option<(u32, u32)> {
    let line = ptx
        .lines()
        .find_map(|l| l.trim().strip_prefix(".version"))?;
    let (a, b) = line.trim().split_once('.')?;
    Some((a.parse().ok()?, b.trim().parse().ok()?))
}

/// The newest PTX ISA a driver of `cuDriverGetVersion` value `v` JIT-compiles (PTX ISA
/// release notes), or `None` when the driver is newer than this table (it takes them all).
pub fn max_ptx_isa(driver: i32) -> Option<(u32, u32)> {
    let (major, minor) = (driver / 1000, (driver % 1000) / 10);
    let isa = match (major, minor) {
        (11, m) => (7, m.min(8) as u32),
        (12, 0..=5) => (8, minor as u32),
        (12, 6) => (8, 5),
        (12, 7) => (8, 6),
        (12, 8) => (8, 7),
        (12, 9) => (8, 8),
        (13, 0) => (9, 0),
        _ if major < 11 => (6, 0),
        _ => return None,
    };
    Some(isa)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contraction_is_off_in_every_compile() {
        let o = options("compute_87", &["-DX=1".into()]);
        assert_eq!(o, ["--gpu-architecture=compute_87", FMAD_OFF, "-DX=1"]);
    }

    #[test]
    fn the_devices_arch_or_the_newest_below_it() {
        let cuda13 = [75, 80, 86, 87, 89, 90, 100, 120];
        assert_eq!(pick_arch(&cuda13, (8, 7)).as_deref(), Some("compute_87"));
        assert_eq!(pick_arch(&cuda13, (8, 8)).as_deref(), Some("compute_87"));
        // CUDA 13 dropped everything below 7.5: a Pascal or Volta part has no target.
        assert_eq!(pick_arch(&cuda13, (6, 1)), None);
        assert_eq!(pick_arch(&cuda13, (7, 2)), None);
        let cuda122 = [50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90];
        assert_eq!(pick_arch(&cuda122, (10, 0)).as_deref(), Some("compute_90"));
        assert_eq!(pick_arch(&cuda122, (6, 1)).as_deref(), Some("compute_61"));
    }

    #[test]
    fn ptx_versions_are_read_and_matched_to_drivers() {
        let ptx = "//\n// Generated by NVIDIA NVVM Compiler\n\n.version 8.2\n.target sm_75\n";
        assert_eq!(ptx_isa(ptx), Some((8, 2)));
        assert_eq!(ptx_isa("//inferloop-cuda-sim /x.so\n"), None);
        // JetPack 6.0 is CUDA 12.2: PTX 8.2 and older, not NVRTC 12.6's 8.5.
        assert_eq!(max_ptx_isa(12020), Some((8, 2)));
        assert_eq!(max_ptx_isa(12060), Some((8, 5)));
        assert_eq!(max_ptx_isa(13000), Some((9, 0)));
        assert_eq!(max_ptx_isa(14000), None);
    }

    #[test]
    fn the_unversioned_library_is_never_searched() {
        assert!(LIB_NAMES.iter().all(|n| n.rsplit('.').next() != Some("so")));
        assert_eq!(LIB_NAMES, ["libnvrtc.so.13", "libnvrtc.so.12"]);
    }
}
