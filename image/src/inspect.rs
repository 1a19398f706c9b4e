//! `inferloop-image inspect`: a manifest as a table for people.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use inferloop_manifest::time::utc;
use inferloop_manifest::{FileKind, Loaded, Manifest};

use crate::build::MANIFEST_FILE;
use crate::error::ImageError;
use crate::verify::detect_format;

/// Loads the manifest `file` names: a manifest itself, or an image with `manifest.json`
/// beside it.
pub fn load(file: &Path) -> Result<Loaded, ImageError> {
    let path: PathBuf = if detect_format(file)?.is_some() {
        file.parent()
            .unwrap_or_else(|| Path::new("."))
            .join(MANIFEST_FILE)
    } else {
        file.to_path_buf()
    };
    Ok(Manifest::load(&path)?)
}

/// The manifest as a two-column summary followed by the file table.
pub fn render(loaded: &Loaded) -> String {
    let m = &loaded.manifest;
    let mut rows: Vec<(&str, String)> = vec![
        ("manifest", loaded.path.display().to_string()),
        ("schema", m.schema.to_string()),
    ];
    if let Some(img) = &m.image {
        rows.push(("version", img.version.clone()));
        rows.push(("compatible", img.compatible.clone()));
        rows.push((
            "build_time",
            format!("{} ({})", img.build_time, utc(img.build_time)),
        ));
        rows.push(("format", img.format.as_str().to_string()));
        rows.push((
            "daemon",
            format!(
                "{}  {}  {}  {} B",
                img.daemon.path, img.daemon.version, img.daemon.target, img.daemon.size
            ),
        ));
        rows.push(("daemon sha256", img.daemon.sha256.clone()));
    }
    rows.push((
        "model",
        format!(
            "{}  {}  {} B",
            m.model.path,
            m.model.placement.map_or("-", |p| p.as_str()),
            m.model.size
        ),
    ));
    rows.push(("model sha256", m.model.sha256.clone()));
    if let Some(draft) = &m.draft_model {
        rows.push((
            "draft model",
            format!(
                "{}  {}  {} B",
                draft.path,
                draft.placement.map_or("-", |p| p.as_str()),
                draft.size
            ),
        ));
        rows.push(("draft model sha256", draft.sha256.clone()));
    }
    if let Some(img) = &m.image {
        rows.push(("config sha256", img.config_sha256.clone()));
        let tools: Vec<String> = [
            ("mksquashfs", &img.tools.mksquashfs),
            ("mkfs.erofs", &img.tools.mkfs_erofs),
            ("zstd", &img.tools.zstd),
        ]
        .into_iter()
        .filter_map(|(name, v)| v.as_ref().map(|v| format!("{name} {v}")))
        .collect();
        rows.push(("tools", tools.join(", ")));
    }
    match &m.artifacts {
        Some(a) => {
            for (label, art) in [("image", Some(&a.image)), ("tarball", a.tarball.as_ref())] {
                if let Some(art) = art {
                    rows.push((
                        label,
                        format!("{}  {} B  {}", art.file, art.size, art.sha256),
                    ));
                }
            }
        }
        None if m.image.is_some() => rows.push(("image", "(baked copy: no artifacts)".into())),
        None => {}
    }

    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (k, v) in &rows {
        let _ = writeln!(out, "{k:<width$}  {v}");
    }
    if let Some(img) = &m.image {
        let size_w = img
            .files
            .iter()
            .map(|e| e.size.to_string().len())
            .max()
            .unwrap_or(4)
            .max(4);
        let _ = writeln!(out, "\n{} entries", img.files.len());
        let _ = writeln!(
            out,
            "{:<7}  {:<4}  {:>size_w$}  {:<16}  PATH",
            "KIND", "MODE", "SIZE", "SHA-256"
        );
        for e in &img.files {
            let sha = match e.kind {
                FileKind::File => e.sha256.as_deref().map_or("-", |s| &s[..16.min(s.len())]),
                _ => "-",
            };
            let path = match &e.target {
                Some(t) => format!("{} -> {t}", e.path),
                None => e.path.clone(),
            };
            let _ = writeln!(
                out,
                "{:<7}  {:04o}  {:>size_w$}  {:<16}  {}",
                e.kind.as_str(),
                e.mode,
                e.size,
                sha,
                path
            );
        }
    }
    out
}
