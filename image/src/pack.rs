//! Packing the staging tree: the read-only image (mksquashfs or mkfs.erofs, every option
//! that affects bytes pinned) and the deterministic `rootfs.tar.zst`.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use inferloop_manifest::hash::sha256_bytes;
use inferloop_manifest::{FileKind, ImageFormat};

use crate::error::ImageError;
use crate::progress::Progress;
use crate::tools::{MKFS_EROFS, MKSQUASHFS};
use crate::tree::Node;

/// zstd level inside squashfs images (mksquashfs's own default, written out so a new
/// default cannot change the bytes).
pub const SQUASHFS_ZSTD_LEVEL: u32 = 15;
/// lz4hc level inside erofs images: erofs-utils 1.5 has no zstd.
pub const EROFS_LZ4HC_LEVEL: u32 = 12;
/// zstd level of `rootfs.tar.zst`: a fast level, since a baked model can be gigabytes of
/// barely compressible weights.
pub const TAR_ZSTD_LEVEL: i32 = 12;

/// A squashfs compressor chosen by the spec (`squashfs_compression`); the default is zstd
/// at [`SQUASHFS_ZSTD_LEVEL`]. Faster settings suit images that CI builds and throws away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SquashComp {
    Zstd(u32),
    Lz4,
}

impl SquashComp {
    /// `zstd`, `zstd:N` (1..=22) or `lz4`.
    pub fn parse(s: &str) -> Option<Self> {
        match s.split_once(':') {
            None if s == "zstd" => Some(Self::Zstd(SQUASHFS_ZSTD_LEVEL)),
            None if s == "lz4" => Some(Self::Lz4),
            Some(("zstd", n)) => n
                .parse()
                .ok()
                .filter(|n| (1..=22).contains(n))
                .map(Self::Zstd),
            _ => None,
        }
    }

    fn args(self) -> Vec<String> {
        match self {
            Self::Zstd(level) => vec![
                "-comp".into(),
                "zstd".into(),
                "-Xcompression-level".into(),
                level.to_string(),
            ],
            Self::Lz4 => vec!["-comp".into(), "lz4".into()],
        }
    }
}

/// Packs `root` into `out` as a squashfs or erofs image. `seed` (the baked manifest's
/// bytes) makes the erofs UUID unique per image yet reproducible.
pub fn image(
    format: ImageFormat,
    root: &Path,
    out: &Path,
    epoch: u64,
    seed: &[u8],
    squashfs: Option<SquashComp>,
    progress: &Progress,
) -> Result<(), ImageError> {
    if out.exists() {
        std::fs::remove_file(out).map_err(ImageError::io(out))?;
    }
    let spinner = progress.spinner(format!("packing {}", format.as_str()));
    let epoch = epoch.to_string();
    let result = match format {
        ImageFormat::Squashfs => {
            let comp = squashfs.unwrap_or(SquashComp::Zstd(SQUASHFS_ZSTD_LEVEL));
            let mut args: Vec<std::ffi::OsString> = vec![
                root.into(),
                out.into(),
                "-noappend".into(),
                "-no-xattrs".into(),
                "-all-root".into(),
                "-reproducible".into(),
            ];
            args.extend(comp.args().into_iter().map(Into::into));
            for a in [
                "-b",
                "131072",
                "-mkfs-time",
                &epoch,
                "-all-time",
                &epoch,
                "-quiet",
                "-no-progress",
            ] {
                args.push(a.into());
            }
            MKSQUASHFS.run(args)
        }
        ImageFormat::Erofs => {
            let comp = format!("-zlz4hc,{EROFS_LZ4HC_LEVEL}");
            let time = format!("-T{epoch}");
            let uuid = format!("-U{}", uuid_from(seed));
            MKFS_EROFS.run([
                comp.as_str(),
                time.as_str(),
                uuid.as_str(),
                "--all-root",
                // A negative tolerance leaves extended attributes out, as for squashfs.
                "-x-1",
                "--quiet",
                &out.to_string_lossy(),
                &root.to_string_lossy(),
            ])
        }
    };
    spinner.finish_and_clear();
    result.map(|_| ())
}

/// An RFC 9562 version-8 (custom) UUID from the first bytes of SHA-256(`seed`).
pub fn uuid_from(seed: &[u8]) -> String {
    let hex = sha256_bytes(seed);
    let mut b: Vec<char> = hex[..32].chars().collect();
    b[12] = '8';
    // Variant 10xx: the first hex digit of the fourth group is 8, 9, a or b.
    b[16] = match b[16] {
        '0' | '4' | '8' | 'c' => '8',
        '1' | '5' | '9' | 'd' => '9',
        '2' | '6' | 'a' | 'e' => 'a',
        _ => 'b',
    };
    let s: String = b.into_iter().collect();
    format!(
        "{}-{}-{}-{}-{}",
        &s[..8],
        &s[8..12],
        &s[12..16],
        &s[16..20],
        &s[20..32]
    )
}

/// Writes `nodes` (sorted, so parents come first) as a GNU tar compressed with zstd at
/// [`TAR_ZSTD_LEVEL`]: every entry uid/gid 0 (`root`), mtime `epoch`, modes as staged.
pub fn tarball(
    nodes: &[Node],
    out: &Path,
    epoch: u64,
    progress: &Progress,
) -> Result<(), ImageError> {
    let io = ImageError::io(out);
    let file = File::create(out).map_err(ImageError::io(out))?;
    let total = nodes
        .iter()
        .filter(|n| n.kind == FileKind::File)
        .map(|n| n.size)
        .sum();
    let bar = progress.bytes(total, "tarball");
    let mut encoder =
        zstd::Encoder::new(BufWriter::new(file), TAR_ZSTD_LEVEL).map_err(ImageError::io(out))?;
    encoder
        .include_checksum(true)
        .map_err(ImageError::io(out))?;
    let mut builder = tar::Builder::new(encoder);
    for node in nodes {
        let mut header = tar::Header::new_gnu();
        header.set_mtime(epoch);
        header.set_uid(0);
        header.set_gid(0);
        header.set_username("root").map_err(ImageError::io(out))?;
        header.set_groupname("root").map_err(ImageError::io(out))?;
        header.set_mode(node.mode);
        let rel = node.path.trim_start_matches('/');
        let result = match node.kind {
            FileKind::Dir => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                // The root is `./`: its mode belongs in the archive too.
                let name = if rel.is_empty() { "./" } else { rel };
                builder.append_data(&mut header, name, std::io::empty())
            }
            FileKind::File => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(node.size);
                let f = File::open(&node.abs).map_err(ImageError::io(&node.abs))?;
                builder.append_data(&mut header, rel, bar.wrap_read(f))
            }
            FileKind::Symlink => {
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_size(0);
                let target = node.target.as_deref().unwrap_or_default();
                builder.append_link(&mut header, rel, target)
            }
        };
        result.map_err(ImageError::io(&node.abs))?;
    }
    let encoder = builder.into_inner().map_err(ImageError::io(out))?;
    let mut writer = encoder.finish().map_err(ImageError::io(out))?;
    writer.flush().map_err(io)?;
    bar.finish_and_clear();
    Ok(())
}

/// The version of the zstd library compressing the tarball.
pub fn zstd_version() -> String {
    let v = zstd::zstd_safe::version_number();
    format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squashfs_compression_parses() {
        assert_eq!(SquashComp::parse("lz4"), Some(SquashComp::Lz4));
        assert_eq!(SquashComp::parse("zstd"), Some(SquashComp::Zstd(15)));
        assert_eq!(SquashComp::parse("zstd:3"), Some(SquashComp::Zstd(3)));
        assert_eq!(SquashComp::parse("zstd:0"), None);
        assert_eq!(SquashComp::parse("zstd:23"), None);
        assert_eq!(SquashComp::parse("gzip"), None);
    }

    #[test]
    fn uuid_is_stable_and_well_formed() {
        let a = uuid_from(b"manifest");
        assert_eq!(a, uuid_from(b"manifest"));
        assert_ne!(a, uuid_from(b"other manifest"));
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "8");
        assert!("89ab".contains(&a[19..20]), "{a}");
    }
}
