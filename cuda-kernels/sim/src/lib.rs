//! The CUDA emulator: every kernel source of `inferloop-kernels` compiled for the host CPU
//! with `cpp/cuda_sim.hpp` in front, plus `cpp/driver.cpp` as a stand-in `libcuda.so.1`, so
//! that the GPU tests, `golden --device cuda` and the daemon's CUDA forward pass run on a
//! machine with no GPU. It checks what can go wrong without hardware (indexing, bounds,
//! reductions, barriers, launch geometry, the host side's buffers and arguments), not speed.
//! Nothing that ships depends on it: the `cuda-sim` tool builds it, and a process picks it
//! up through `LD_LIBRARY_PATH` and [`inferloop_kernels::cuda::PTX_DIR_ENV`].
//!
//! A kernel file is turned into C++ by two rewrites: each inline PTX statement the kernels
//! use becomes a call to its emulation (any other inline PTX is an error naming the line),
//! and each `extern "C" __global__` kernel gets a `SIM_ENTRY` the driver looks up.

use std::path::{Path, PathBuf};
use std::process::Command;

use inferloop_kernels::kernels::{Source, SOURCES};

/// The prelude, the shared ABI and the stand-in driver.
pub const PRELUDE: &str = include_str!("../cpp/cuda_sim.hpp");
pub const ABI: &str = include_str!("../cpp/sim_abi.h");
/// The device profiles (`INFERLOOP_SIM_PROFILE`: `orin-nx`, the default, or `h200`).
pub const PROFILE: &str = include_str!("../cpp/sim_profile.hpp");
pub const DRIVER: &str = include_str!("../cpp/driver.cpp");

/// The first line of a module's stand-in PTX file; the driver dlopens the path after it.
pub const MODULE_TAG: &str = "//inferloop-cuda-sim ";

/// Inline PTX statements with an emulation: (instruction text, function).
const PTX_CALLS: &[(&str, &str)] = &[
    ("cvt.f32.f16 %0, %1;", "sim_cvt_f32_f16"),
    ("cvt.rn.f16.f32 %0, %1;", "sim_cvt_rn_f16_f32"),
];

/// Inline PTX statements with several outputs: (instruction text, function). The statement
/// becomes `function(out0, .., in0, ..);`, the outputs taken by reference.
const PTX_STMTS: &[(&str, &str)] = &[(
    "ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];",
    "sim_ld_global_v4_u32",
)];

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("{file}.cu line {line}: {what}")]
    Source {
        file: String,
        line: usize,
        what: String,
    },
    #[error("{file}.cu has no extern \"C\" __global__ kernel")]
    NoKernel { file: String },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("{cxx} failed on {file} (exit {status}):\n{log}")]
    Compile {
        cxx: String,
        file: String,
        status: String,
        log: String,
    },
}

/// A kernel file as the host compiler sees it: its C++ and its entry points.
#[derive(Debug, Clone)]
pub struct Translated {
    pub cpp: String,
    pub entries: Vec<String>,
}

/// Rewrites one kernel source into a translation unit for the emulator.
pub fn translate(src: &Source) -> Result<Translated, SimError> {
    let body = rewrite_asm(src.name, src.code)?;
    let entries = kernel_entries(src.own);
    if entries.is_empty() {
        return Err(SimError::NoKernel {
            file: src.name.to_string(),
        });
    }
    let mut cpp = String::from("#include \"cuda_sim.hpp\"\n");
    cpp.push_str(&format!("#line 1 \"{}.cu\"\n", src.name));
    cpp.push_str(&body);
    cpp.push_str("\n// cuda-sim entries\n");
    for e in &entries {
        cpp.push_str(&format!("SIM_ENTRY({e})\n"));
    }
    Ok(Translated { cpp, entries })
}

fn line_of(code: &str, at: usize) -> usize {
    code[..at].matches('\n').count() + 1
}

/// Replaces `asm("<instruction>" : "=c"(out) : "c"(in));` with `out = <call>(in);`.
fn rewrite_asm(file: &str, code: &str) -> Result<String, SimError> {
    let err = |at: usize, what: String| SimError::Source {
        file: file.to_string(),
        line: line_of(code, at),
        what,
    };
    let mut out = String::with_capacity(code.len());
    let mut rest = 0;
    while let Some(found) = code[rest..].find("asm") {
        let at = rest + found;
        let before_ok = code[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        let tail = code[at + 3..].trim_start();
        let is_stmt = before_ok
            && (tail.starts_with('(') || tail.starts_with("volatile"))
            && !code[..at].ends_with("//");
        if !is_stmt {
            out.push_str(&code[rest..at + 3]);
            rest = at + 3;
            continue;
        }
        let open = at + 3 + code[at + 3..].find('(').unwrap_or(0);
        let close = matching_paren(code, open).ok_or_else(|| err(at, "unclosed asm(".into()))?;
        let inner = &code[open + 1..close];
        let parts: Vec<&str> = split_top(inner, ':');
        let [insn, outs, ins] = parts.as_slice() else {
            return Err(err(
                at,
                format!("inline PTX the emulator cannot read: asm({inner})"),
            ));
        };
        let insn = insn.trim().trim_matches('"');
        let unreadable = || {
            err(
                at,
                format!("asm operands the emulator cannot read: {outs} : {ins}"),
            )
        };
        let stmt = if let Some(&(_, call)) = PTX_CALLS.iter().find(|(i, _)| *i == insn) {
            let (Some(o), Some(i)) = (operand(outs), operand(ins)) else {
                return Err(unreadable());
            };
            format!("{o} = {call}({i});")
        } else if let Some(&(_, call)) = PTX_STMTS.iter().find(|(i, _)| *i == insn) {
            let args: Option<Vec<&str>> = split_top(outs, ',')
                .into_iter()
                .chain(split_top(ins, ','))
                .map(operand)
                .collect();
            format!("{call}({});", args.ok_or_else(unreadable)?.join(", "))
        } else {
            return Err(err(
                at,
                format!("inline PTX `{insn}` has no emulation in cuda-sim"),
            ));
        };
        let semi = code[close + 1..]
            .find(';')
            .filter(|&s| code[close + 1..close + 1 + s].trim().is_empty())
            .ok_or_else(|| err(at, "asm(...) not followed by ';'".into()))?;
        out.push_str(&code[rest..at]);
        out.push_str(&stmt);
        // Keep line numbers: the statement is one line in every kernel, but be safe.
        out.push_str(&"\n".repeat(code[at..close].matches('\n').count()));
        rest = close + 1 + semi + 1;
    }
    out.push_str(&code[rest..]);
    Ok(out)
}

/// The index of the `)` closing the `(` at `open`, skipping string literals.
fn matching_paren(code: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_str = false;
    let bytes = code.as_bytes();
    let mut i = open;
    while i < bytes.len() {
        let c = bytes[i];
        if in_str {
            if c == b'\\' {
                i += 1;
            } else if c == b'"' {
                in_str = false;
            }
        } else if c == b'"' {
            in_str = true;
        } else if c == b'(' {
            depth += 1;
        } else if c == b')' {
            depth -= 1;
            if depth == 0 {
                return Some(i);
            }
        }
        i += 1;
    }
    None
}

/// Splits on `sep` outside parentheses and string literals.
fn split_top(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut in_str, mut start) = (0i32, false, 0);
    for (i, c) in s.char_indices() {
        match c {
            '"' => in_str = !in_str,
            '(' if !in_str => depth += 1,
            ')' if !in_str => depth -= 1,
            c if c == sep && !in_str && depth == 0 => {
                parts.push(&s[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// The expression of the one operand in `"c"(expr)` (or `"=c"(expr)`).
fn operand(s: &str) -> Option<&str> {
    let s = s.trim();
    if split_top(s, ',').len() != 1 || !s.starts_with('"') {
        return None;
    }
    let open = s.find('(')?;
    let close = matching_paren(s, open)?;
    (close == s.len() - 1).then(|| s[open + 1..close].trim())
}

/// The names of the `extern "C" __global__` kernels, in file order.
pub fn kernel_entries(code: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (at, _) in code.match_indices("extern \"C\" __global__") {
        let mut rest = code[at..]
            .trim_start_matches("extern \"C\" __global__")
            .trim_start();
        rest = rest.strip_prefix("void").unwrap_or(rest).trim_start();
        if let Some(after) = rest.strip_prefix("__launch_bounds__") {
            let open = after.find('(').unwrap_or(0);
            rest = matching_paren(after, open)
                .map(|c| after[c + 1..].trim_start())
                .unwrap_or(after);
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            names.push(name);
        }
    }
    names
}

/// What [`build`] made.
#[derive(Debug)]
pub struct Built {
    /// Put first on `LD_LIBRARY_PATH`: holds `libcuda.so.1`.
    pub lib_dir: PathBuf,
    /// Set as [`inferloop_kernels::cuda::PTX_DIR_ENV`]: one stand-in `<kernel>.ptx` per module.
    pub modules_dir: PathBuf,
    /// Every emulated kernel entry, `module.entry`.
    pub entries: Vec<String>,
    /// What the compiler warned about (empty when nothing).
    pub warnings: String,
}

fn write(path: &Path, text: &str) -> Result<(), SimError> {
    std::fs::write(path, text).map_err(|source| SimError::Io {
        what: "cannot write",
        path: path.display().to_string(),
        source,
    })
}

/// Runs one compile; what it printed on success (warnings) comes back.
fn compile(cxx: &str, args: &[&str], file: &Path, out: &Path) -> Result<String, SimError> {
    let output = Command::new(cxx)
        .args(args)
        .arg("-o")
        .arg(out)
        .arg(file)
        .output()
        .map_err(|source| SimError::Io {
            what: "cannot run",
            path: cxx.to_string(),
            source,
        })?;
    if !output.status.success() {
        return Err(SimError::Compile {
            cxx: cxx.to_string(),
            file: file.display().to_string(),
            status: output.status.to_string(),
            log: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stderr).into_owned())
}

/// Flags shared by the modules and the driver. No contraction and no fast math, so every
/// float operation is the one rounding the kernel's text asks for: the same rule as the
/// `--fmad=false` every NVRTC compile passes ([`inferloop_kernels::nvrtc::FMAD_OFF`]), so
/// an `a*b+c` rounds twice here, on the GPU and in the twin. Wrapping signed arithmetic and
/// no strict aliasing, as the kernels' pointer casts assume on a GPU.
const CXX_FLAGS: &[&str] = &[
    "-std=c++17",
    "-O3",
    // Built and run on the same machine; about twice as fast as the baseline ISA.
    "-march=native",
    "-g",
    "-fPIC",
    "-shared",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-fwrapv",
    "-fno-strict-aliasing",
    "-Wall",
    "-Wno-unused-function",
    "-Wno-unknown-pragmas",
];

/// Flags for the kernel modules only: UBSan's checks of what faults or is undefined on a
/// GPU as well (a misaligned load, an index past a fixed-size array such as a shared one,
/// a shift by the type's width or more), each fatal at its first occurrence.
const MODULE_FLAGS: &[&str] = &[
    "-fsanitize=alignment,bounds,shift,vla-bound",
    "-fno-sanitize-recover=all",
];

/// Builds the emulator for every kernel of [`SOURCES`] under `out` with the C++ compiler
/// `cxx`.
pub fn build(out: &Path, cxx: &str) -> Result<Built, SimError> {
    build_with(out, cxx, SOURCES)
}

fn create_dir(d: &Path) -> Result<(), SimError> {
    std::fs::create_dir_all(d).map_err(|source| SimError::Io {
        what: "cannot create",
        path: d.display().to_string(),
        source,
    })
}

/// [`build`] for the given kernel sources (the emulator's own tests add theirs).
pub fn build_with(out: &Path, cxx: &str, sources: &[Source]) -> Result<Built, SimError> {
    let src_dir = out.join("src");
    let lib_dir = out.join("lib");
    let modules_dir = std::path::absolute(out.join("modules")).map_err(|source| SimError::Io {
        what: "cannot resolve",
        path: out.display().to_string(),
        source,
    })?;
    for d in [&src_dir, &lib_dir, &modules_dir] {
        create_dir(d)?;
    }
    write(&src_dir.join("cuda_sim.hpp"), PRELUDE)?;
    write(&src_dir.join("sim_abi.h"), ABI)?;
    write(&src_dir.join("sim_profile.hpp"), PROFILE)?;
    write(&src_dir.join("driver.cpp"), DRIVER)?;
    let include = format!("-I{}", src_dir.display());
    let mut flags: Vec<&str> = CXX_FLAGS.to_vec();
    flags.push(&include);
    let mut module_flags = flags.clone();
    module_flags.extend(MODULE_FLAGS);

    let mut units = Vec::new();
    for s in sources {
        let t = translate(s)?;
        let cpp = src_dir.join(format!("{}.cpp", s.name));
        write(&cpp, &t.cpp)?;
        units.push((s.name, t, cpp, modules_dir.join(format!("{}.so", s.name))));
    }
    // One compiler process per file, all at once: the build is a few seconds on two cores.
    let driver = lib_dir.join("libcuda.so.1");
    let mut driver_flags = flags.clone();
    driver_flags.extend(["-Wl,-soname,libcuda.so.1", "-ldl"]);
    let driver_src = src_dir.join("driver.cpp");
    let logs = std::thread::scope(|scope| {
        let mut jobs = vec![scope.spawn(|| compile(cxx, &driver_flags, &driver_src, &driver))];
        for (_, _, cpp, so) in &units {
            let flags = &module_flags;
            jobs.push(scope.spawn(move || compile(cxx, flags, cpp, so)));
        }
        jobs.into_iter()
            .map(|j| j.join().expect("a compile thread panicked"))
            .collect::<Result<Vec<String>, SimError>>()
    })?;
    let warnings: String = logs.concat();
    let link = lib_dir.join("libcuda.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("libcuda.so.1", &link).map_err(|source| SimError::Io {
        what: "cannot link",
        path: link.display().to_string(),
        source,
    })?;

    let mut entries = Vec::new();
    for (name, t, _, so) in &units {
        write(
            &modules_dir.join(format!("{name}.ptx")),
            &format!("{MODULE_TAG}{}\n", so.display()),
        )?;
        entries.extend(t.entries.iter().map(|e| format!("{name}.{e}")));
    }
    Ok(Built {
        lib_dir,
        modules_dir,
        entries,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_file_translates_and_names_its_entries() {
        for s in SOURCES {
            let t = translate(s).unwrap();
            assert!(!t.cpp.contains("asm("), "{}: inline PTX left", s.name);
            for e in &t.entries {
                assert!(t.cpp.contains(&format!("SIM_ENTRY({e})")));
            }
        }
        let gemv = translate(inferloop_kernels::kernels::source("q8_gemv").unwrap()).unwrap();
        assert_eq!(gemv.entries, ["q8_gemv_f32", "q8_gemv_q8"]);
        let attn = translate(inferloop_kernels::kernels::source("attention").unwrap()).unwrap();
        assert_eq!(attn.entries, ["attn_partial_f16", "attn_combine_f32"]);
    }

    #[test]
    fn host_and_device_compiles_agree_on_contraction() {
        assert!(CXX_FLAGS.contains(&"-ffp-contract=off"));
        assert!(!CXX_FLAGS
            .iter()
            .any(|f| f.contains("fast-math") && !f.contains("no-")));
        let o = inferloop_kernels::nvrtc::options("compute_87", &[]);
        assert!(
            o.iter().any(|f| f == inferloop_kernels::nvrtc::FMAD_OFF),
            "{o:?}"
        );
    }

    #[test]
    fn inline_ptx_becomes_calls_and_keeps_its_operands() {
        let code = "x;\n    asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(x[src + i]));\n";
        let out = rewrite_asm("t", code).unwrap();
        assert_eq!(out, "x;\n    h = sim_cvt_rn_f16_f32(x[src + i]);\n");
        let code = "float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h)); return f;";
        assert_eq!(
            rewrite_asm("t", code).unwrap(),
            "float f; f = sim_cvt_f32_f16(h); return f;"
        );
        let code = "asm volatile(\"ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\"\n : \"=r\"(r.a), \"=r\"(r.b), \"=r\"(r.c), \"=r\"(r.d) : \"l\"(w + a));";
        assert_eq!(
            rewrite_asm("t", code).unwrap(),
            "sim_ld_global_v4_u32(r.a, r.b, r.c, r.d, w + a);\n"
        );
        // Words containing "asm" are not statements.
        assert_eq!(
            rewrite_asm("t", "int plasma = 1;").unwrap(),
            "int plasma = 1;"
        );
    }

    #[test]
    fn unknown_inline_ptx_is_an_error_naming_the_line() {
        let code = "a;\nb;\n asm(\"mov.u32 %0, %%laneid;\" : \"=r\"(l));\n";
        let e = rewrite_asm("k", code).unwrap_err().to_string();
        assert!(e.starts_with("k.cu line 3:"), "{e}");
        let code = "asm(\"add.f32 %0, %1, %2;\" : \"=f\"(a) : \"f\"(b));";
        let e = rewrite_asm("k", code).unwrap_err().to_string();
        assert!(e.contains("no emulation"), "{e}");
    }
}
