//! RAUC bundles: an `inferloop-image build` output signed into a `.raucb`, and a bundle
//! read back through `rauc info`.
//!
//! RAUC 1.8 does the signing and the checking; this module stages its input, gives it a
//! config with `check-purpose=codesign` (without it RAUC refuses codeSigning-only
//! certificates) and turns its output into [`BundleInfo`].

use std::fmt::Write as _;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use inferloop_board::BoardError;
use inferloop_manifest::Manifest;

use crate::build::MANIFEST_FILE;
use crate::error::ImageError;
use crate::progress::Progress;
use crate::spec::Spec;
use crate::tools::RAUC;

/// The file extension of RAUC bundles.
pub const EXTENSION: &str = "raucb";
/// The bundle's manifest file name, which `rauc bundle` rewrites in its input directory.
const MANIFEST_RAUCM: &str = "manifest.raucm";

/// RAUC's bundle formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BundleFormat {
    /// dm-verity protected payload: checked block by block as it is read on the box.
    #[default]
    Verity,
    /// Signature over the whole file, checked once before install; for kernels without
    /// device-mapper.
    Plain,
}

impl BundleFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Verity => "verity",
            Self::Plain => "plain",
        }
    }
}

impl std::str::FromStr for BundleFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "verity" => Ok(Self::Verity),
            "plain" => Ok(Self::Plain),
            other => Err(format!(
                "bundle format must be verity or plain, got {other:?}"
            )),
        }
    }
}

/// What to bundle and how to sign it.
#[derive(Debug, Clone, Copy)]
pub struct BundleRequest<'a> {
    /// An `inferloop-image build` output directory: the image and `manifest.json`.
    pub image_dir: &'a Path,
    /// When given, the build must be of this spec's board and version.
    pub spec: Option<&'a Spec>,
    pub cert: &'a Path,
    pub key: &'a Path,
    /// The CA the bundle must verify against; without it, the signing certificate itself.
    pub keyring: Option<&'a Path>,
    pub format: BundleFormat,
    pub out: &'a Path,
    /// Replace an existing `out`.
    pub force: bool,
}

/// A bundle written and verified.
#[derive(Debug, Clone)]
pub struct Bundled {
    pub path: PathBuf,
    pub size: u64,
    pub sha256: String,
    /// What `rauc info` read back from it.
    pub info: BundleInfo,
}

/// How `rauc info` should treat the signature.
#[derive(Debug, Clone, Copy)]
pub enum Trust<'a> {
    /// Verify against these CA certificates.
    Keyring(&'a Path),
    /// Verify against the signing certificate itself (RAUC's partial chain): proves the
    /// bundle was signed with it, not that any device trusts it.
    Signer(&'a Path),
    /// Read the bundle without checking the signature.
    NoVerify,
}

/// A bundle as `rauc info` reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BundleInfo {
    pub compatible: String,
    pub version: String,
    /// `verity`, `plain` or `crypt`.
    pub format: String,
    pub images: Vec<BundleImage>,
    /// Subject of the signing certificate; `None` when the signature was not verified.
    pub signer: Option<String>,
    /// Issuer of the signing certificate.
    pub issuer: Option<String>,
}

/// One image in a bundle.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BundleImage {
    /// The slot class it installs to (`rootfs`).
    pub slot_class: String,
    pub filename: String,
    pub size: Option<u64>,
    pub sha256: Option<String>,
}

/// Builds, verifies and renames into place the bundle `req` describes.
pub fn create(req: &BundleRequest, progress: &Progress) -> Result<Bundled, ImageError> {
    let input = |message: String| ImageError::BundleInput {
        path: req.image_dir.to_path_buf(),
        message,
    };
    let loaded = Manifest::load(&req.image_dir.join(MANIFEST_FILE))?;
    let manifest = loaded.manifest;
    let (Some(image), Some(artifacts)) = (&manifest.image, &manifest.artifacts) else {
        return Err(input(format!(
            "{} describes no built image (no image or artifacts section)",
            loaded.path.display()
        )));
    };
    if let Some(spec) = req.spec {
        if spec.board.name != image.compatible || spec.version != image.version {
            return Err(input(format!(
                "it holds {} version {}, but spec {} is {} version {}",
                image.compatible,
                image.version,
                spec.origin.display(),
                spec.board.name,
                spec.version
            )));
        }
    }
    let board = inferloop_board::profile::find(&image.compatible).map_err(|e| match e {
        BoardError::UnknownBoard { name, known } => ImageError::UnknownBoard { name, known },
        other => input(other.to_string()),
    })?;
    if board.ota.is_none() {
        return Err(ImageError::NoOta {
            board: board.name.clone(),
        });
    }
    let compatible = board.rauc_compatible();

    // The bundle must carry the bytes the manifest describes, not a later rebuild's.
    let image_file = req.image_dir.join(&artifacts.image.file);
    let size = std::fs::metadata(&image_file)
        .map_err(ImageError::io(&image_file))?
        .len();
    let sha256 = hash_file(&image_file, progress)?;
    if size != artifacts.image.size || sha256 != artifacts.image.sha256 {
        return Err(input(format!(
            "{} is not the image its manifest describes (size {size}, SHA-256 {sha256}; \
             expected {} and {}): rebuild it",
            image_file.display(),
            artifacts.image.size,
            artifacts.image.sha256
        )));
    }

    if req.out.exists() && !req.force {
        return Err(ImageError::BundleExists {
            path: req.out.to_path_buf(),
        });
    }
    let out_dir = match req.out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&out_dir).map_err(ImageError::io(&out_dir))?;
    // Beside the output, so the finished bundle is renamed into place, never copied.
    let work = tempfile::Builder::new()
        .prefix(".bundle-")
        .tempdir_in(&out_dir)
        .map_err(ImageError::io(&out_dir))?;
    let content = work.path().join("content");
    std::fs::create_dir(&content).map_err(ImageError::io(&content))?;
    let staged = content.join(&artifacts.image.file);
    // A hard link costs nothing for a multi-GiB image; RAUC only reads it.
    if std::fs::hard_link(&image_file, &staged).is_err() {
        std::fs::copy(&image_file, &staged).map_err(ImageError::io(&staged))?;
    }
    let raucm = content.join(MANIFEST_RAUCM);
    std::fs::write(
        &raucm,
        bundle_manifest(
            &compatible,
            &image.version,
            req.format,
            &artifacts.image.file,
        ),
    )
    .map_err(ImageError::io(&raucm))?;

    let conf = write_conf(work.path(), &compatible, false)?;
    let tmp_out = work.path().join("bundle.raucb");
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "--conf".as_ref(),
        conf.as_os_str(),
        "bundle".as_ref(),
        "--cert".as_ref(),
        req.cert.as_os_str(),
        "--key".as_ref(),
        req.key.as_os_str(),
        // The payload is a compressed filesystem image: compressing it again gains a few
        // KiB and costs most of the bundling time (200 MiB image: 7.5 s vs 2.3 s).
        "--mksquashfs-args=-noI -noD -noF -noX".as_ref(),
    ];
    if let Some(keyring) = req.keyring {
        // RAUC then refuses to sign with a certificate the keyring does not trust.
        args.extend(["--signing-keyring".as_ref(), keyring.as_os_str()]);
    }
    args.extend([content.as_os_str(), tmp_out.as_os_str()]);
    let spinner = progress.spinner(format!("rauc bundle ({})", req.format.as_str()));
    let result = RAUC.run(&args);
    spinner.finish_and_clear();
    result.map_err(|e| match e {
        ImageError::ToolFailed {
            tool,
            status,
            stderr,
        } => ImageError::ToolFailed {
            tool,
            status,
            stderr: rauc_reason(&stderr),
        },
        other => other,
    })?;

    let trust = match req.keyring {
        Some(k) => Trust::Keyring(k),
        None => Trust::Signer(req.cert),
    };
    let info = info(&tmp_out, trust)?;
    let expected = (
        compatible.as_str(),
        image.version.as_str(),
        req.format.as_str(),
    );
    if (
        info.compatible.as_str(),
        info.version.as_str(),
        info.format.as_str(),
    ) != expected
    {
        return Err(ImageError::BundleVerify {
            path: tmp_out,
            message: format!(
                "rauc info reads compatible {:?}, version {:?}, format {:?}; expected {expected:?}",
                info.compatible, info.version, info.format
            ),
        });
    }
    std::fs::rename(&tmp_out, req.out).map_err(ImageError::io(req.out))?;
    let size = std::fs::metadata(req.out)
        .map_err(ImageError::io(req.out))?
        .len();
    let sha256 = hash_file(req.out, progress)?;
    Ok(Bundled {
        path: req.out.to_path_buf(),
        size,
        sha256,
        info,
    })
}

/// The `manifest.raucm` RAUC signs: checksums and sizes are filled in by `rauc bundle`.
pub fn bundle_manifest(
    compatible: &str,
    version: &str,
    format: BundleFormat,
    image_file: &str,
) -> String {
    format!(
        "[update]\n\
         compatible={compatible}\n\
         version={version}\n\
         \n\
         [bundle]\n\
         format={}\n\
         \n\
         [image.{}]\n\
         filename={image_file}\n",
        format.as_str(),
        inferloop_board::profile::OTA_SLOT_CLASS
    )
}

/// A throwaway RAUC config: `rauc bundle` and `rauc info` need `check-purpose=codesign`,
/// which only a config file sets. `noop` because these commands never touch a bootloader.
fn write_conf(dir: &Path, compatible: &str, partial_chain: bool) -> Result<PathBuf, ImageError> {
    let path = dir.join("rauc.conf");
    let mut text = format!(
        "[system]\ncompatible={compatible}\nbootloader=noop\n\n[keyring]\ncheck-purpose=codesign\n"
    );
    if partial_chain {
        text.push_str("allow-partial-chain=true\n");
    }
    std::fs::write(&path, text).map_err(ImageError::io(&path))?;
    Ok(path)
}

/// Runs `rauc info` on `bundle` and parses what it prints. A signature that does not
/// verify is [`ImageError::BundleVerify`] with RAUC's reason.
pub fn info(bundle: &Path, trust: Trust) -> Result<BundleInfo, ImageError> {
    let dir = tempfile::tempdir().map_err(ImageError::io(std::env::temp_dir()))?;
    // `rauc info` does not compare the compatible; any value parses.
    let conf = write_conf(
        dir.path(),
        "inferloop-inspect",
        matches!(trust, Trust::Signer(_)),
    )?;
    let mut args: Vec<&std::ffi::OsStr> =
        vec!["--conf".as_ref(), conf.as_os_str(), "info".as_ref()];
    match trust {
        Trust::Keyring(k) | Trust::Signer(k) => args.extend(["--keyring".as_ref(), k.as_os_str()]),
        Trust::NoVerify => args.push("--no-verify".as_ref()),
    }
    args.push(bundle.as_os_str());
    let out = RAUC.run(&args).map_err(|e| match e {
        ImageError::ToolFailed { stderr, .. } => ImageError::BundleVerify {
            path: bundle.to_path_buf(),
            message: rauc_reason(&stderr),
        },
        other => other,
    })?;
    let info = parse_info(&String::from_utf8_lossy(&out.stdout));
    if info.compatible.is_empty() {
        return Err(ImageError::BundleVerify {
            path: bundle.to_path_buf(),
            message: "rauc info printed no Compatible line".into(),
        });
    }
    Ok(info)
}

/// RAUC's error without its informational `rauc-Message:` lines.
fn rauc_reason(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.contains("rauc-Message:") && !l.trim().is_empty())
        .collect();
    if lines.is_empty() {
        stderr.trim().to_string()
    } else {
        lines.join("; ")
    }
}

/// Parses the text `rauc info` (1.8) prints. Its JSON output leaves out the bundle format
/// and the signer, so the text is the one that has everything.
pub fn parse_info(text: &str) -> BundleInfo {
    let text = strip_ansi(text);
    let mut info = BundleInfo::default();
    let unquote = |v: &str| v.trim().trim_matches('\'').to_string();
    let mut in_chain = false;
    for line in text.lines() {
        let trimmed = line.trim();
        let field = |name: &str| trimmed.strip_prefix(name).map(str::trim);
        if let Some(v) = field("Compatible:") {
            info.compatible = unquote(v);
        } else if let Some(v) = field("Version:") {
            info.version = unquote(v);
        } else if let Some(v) = field("Bundle Format:") {
            info.format = v.to_string();
        } else if trimmed.starts_with('[') && trimmed.ends_with(']') && !in_chain {
            info.images.push(BundleImage {
                slot_class: trimmed[1..trimmed.len() - 1].to_string(),
                ..BundleImage::default()
            });
        } else if let (Some(v), Some(img)) = (field("Filename:"), info.images.last_mut()) {
            img.filename = v.to_string();
        } else if let (Some(v), Some(img)) = (field("Checksum:"), info.images.last_mut()) {
            img.sha256 = Some(v.to_string());
        } else if let (Some(v), Some(img)) = (field("Size:"), info.images.last_mut()) {
            img.size = v.parse().ok();
        } else if trimmed == "Certificate Chain:" {
            in_chain = true;
        } else if let Some(v) = field("0 Subject:").filter(|_| in_chain) {
            info.signer = Some(v.to_string());
        } else if let Some(v) = field("Issuer:").filter(|_| in_chain && info.issuer.is_none()) {
            info.issuer = Some(v.to_string());
        }
    }
    info
}

/// RAUC prints slot classes in bold even into a pipe.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters, ended by a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// True for a RAUC bundle: the `.raucb` extension, or a squashfs followed by a CMS
/// signature and its 8-byte big-endian length (how RAUC lays bundles out).
pub fn is_bundle(path: &Path) -> Result<bool, ImageError> {
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case(EXTENSION))
    {
        return Ok(true);
    }
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(_) => return Ok(false),
    };
    let len = file.metadata().map_err(ImageError::io(path))?.len();
    let mut magic = [0u8; 4];
    if len < 4096 || file.read_exact(&mut magic).is_err() || &magic != b"hsqs" {
        return Ok(false);
    }
    let mut tail = [0u8; 8];
    file.seek(SeekFrom::End(-8)).map_err(ImageError::io(path))?;
    file.read_exact(&mut tail).map_err(ImageError::io(path))?;
    let sig_len = u64::from_be_bytes(tail);
    if sig_len == 0 || sig_len >= len - 8 {
        return Ok(false);
    }
    let mut first = [0u8; 1];
    file.seek(SeekFrom::Start(len - 8 - sig_len))
        .map_err(ImageError::io(path))?;
    file.read_exact(&mut first).map_err(ImageError::io(path))?;
    // A DER SEQUENCE opens every CMS ContentInfo.
    Ok(first[0] == 0x30)
}

/// A bundle's facts as a two-column table.
pub fn render_info(path: &Path, info: &BundleInfo) -> String {
    let mut rows: Vec<(&str, String)> = vec![
        ("bundle", path.display().to_string()),
        ("compatible", info.compatible.clone()),
        ("version", info.version.clone()),
        ("format", info.format.clone()),
    ];
    for img in &info.images {
        rows.push((
            "image",
            format!(
                "{}  {}  {} B  {}",
                img.slot_class,
                img.filename,
                img.size.map_or("?".into(), |s| s.to_string()),
                img.sha256.as_deref().unwrap_or("-")
            ),
        ));
    }
    match &info.signer {
        Some(signer) => {
            rows.push(("signer", signer.clone()));
            if let Some(issuer) = &info.issuer {
                rows.push(("issuer", issuer.clone()));
            }
        }
        None => rows.push(("signer", "NOT VERIFIED (--no-verify)".into())),
    }
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (k, v) in rows {
        let _ = writeln!(out, "{k:<width$}  {v}");
    }
    out
}

fn hash_file(path: &Path, progress: &Progress) -> Result<String, ImageError> {
    let size = std::fs::metadata(path).map_err(ImageError::io(path))?.len();
    let bar = progress.bytes(size, "hashing");
    let mut last = 0;
    let sha = inferloop_manifest::hash::sha256_file(path, |done, _| {
        bar.inc(done - last);
        last = done;
    })
    .map_err(ImageError::io(path))?;
    bar.finish_and_clear();
    Ok(sha)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `rauc info` 1.8 on a verity bundle, as printed into a pipe.
    const VERITY_INFO: &str = "Compatible: \t'inferloop-jetson-orin-nx-16gb'\n\
        Version:    \t'1.2.3'\n\
        Description:\t'(null)'\n\
        Build:      \t'(null)'\n\
        Hooks:      \t''\n\
        Bundle Format: \tverity\n\
        \x20 Verity Salt: \t'9f96'\n\
        \x20 Verity Size: \t4096\n\
        \n\
        1 Image:\n\
        \x20 \x1b[1m[rootfs]\x1b[0m\n\
        \tFilename:  rootfs.squashfs\n\
        \tChecksum:  c608179e\n\
        \tSize:      20480\n\
        \tHooks:     \n\
        \n\
        Certificate Chain:\n\
        \x200 Subject: O = Dev, CN = signing\n\
        \x20  Issuer: O = Dev, CN = CA\n\
        \x20  SPKI sha256: 22:15\n\
        \x201 Subject: O = Dev, CN = CA\n\
        \x20  Issuer: O = Dev, CN = CA\n";

    #[test]
    fn rauc_info_text_gives_compatible_version_format_image_and_signer() {
        assert_eq!(
            parse_info(VERITY_INFO),
            BundleInfo {
                compatible: "inferloop-jetson-orin-nx-16gb".into(),
                version: "1.2.3".into(),
                format: "verity".into(),
                images: vec![BundleImage {
                    slot_class: "rootfs".into(),
                    filename: "rootfs.squashfs".into(),
                    size: Some(20480),
                    sha256: Some("c608179e".into()),
                }],
                signer: Some("O = Dev, CN = signing".into()),
                issuer: Some("O = Dev, CN = CA".into()),
            }
        );
    }

    #[test]
    fn unverified_info_has_no_signer() {
        let text = VERITY_INFO
            .split("Certificate Chain:")
            .next()
            .map(|head| format!("{head}Signature unverified\n"))
            .unwrap_or_default();
        let info = parse_info(&text);
        assert_eq!(info.signer, None);
        assert_eq!(info.images.len(), 1);
    }

    #[test]
    fn bundle_manifest_names_the_rootfs_image_and_format() {
        assert_eq!(
            bundle_manifest("inferloop-b", "1.0", BundleFormat::Plain, "rootfs.erofs"),
            "[update]\ncompatible=inferloop-b\nversion=1.0\n\n[bundle]\nformat=plain\n\n\
             [image.rootfs]\nfilename=rootfs.erofs\n"
        );
    }

    #[test]
    fn rauc_reason_drops_informational_lines() {
        let stderr = "rauc-Message: 16:49:05.683: Verifying bundle signature... \n\
                      signature verification failed: Verify error: unable to get local issuer certificate\n";
        assert_eq!(
            rauc_reason(stderr),
            "signature verification failed: Verify error: unable to get local issuer certificate"
        );
    }

    #[test]
    fn a_squashfs_image_is_not_a_bundle_but_a_raucb_name_is() {
        let dir = tempfile::tempdir().expect("tempdir");
        let image = dir.path().join("rootfs.squashfs");
        let mut bytes = b"hsqs".to_vec();
        bytes.resize(8192, 0);
        std::fs::write(&image, &bytes).expect("write");
        assert!(!is_bundle(&image).expect("reads"));
        // The same bytes with a 100-byte "signature" and its length appended.
        let mut signed = bytes.clone();
        signed.push(0x30);
        signed.extend([0u8; 99]);
        signed.extend(100u64.to_be_bytes());
        let unnamed = dir.path().join("update.bin");
        std::fs::write(&unnamed, signed).expect("write");
        assert!(is_bundle(&unnamed).expect("reads"));
        assert!(is_bundle(Path::new("/nonexistent/x.raucb")).expect("by name"));
    }
}
