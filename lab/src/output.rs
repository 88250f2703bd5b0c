//! Where the lab writes the files a command makes when the user names no place for them.
//!
//! Every default output (`resize`'s and `slicer`'s SVG, `cache`'s and `zones`' figures) goes
//! to one folder, so that running the quick start leaves the checkout as it was: the directory
//! named by the environment variable `STEADY_LAB_OUT` when it is set, else
//! `target/steady-lab/` in the workspace (which git ignores with the rest of `target/`),
//! whatever directory the lab runs from. The figures under `docs/` are regenerated only
//! when a command is told to write there (`--figures docs/figures`, `--out docs/...`).

use std::io;
use std::path::PathBuf;

/// The environment variable that moves the default output folder.
const OUT_VAR: &str = "STEADY_LAB_OUT";

/// The folder default outputs go to.
fn folder() -> PathBuf {
    match std::env::var_os(OUT_VAR) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        // The lab is a tool of this workspace, never installed apart from it.
        _ => {
            let lab = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
            lab.parent().unwrap_or(lab).join("target").join("steady-lab")
        }
    }
}

/// `explicit` when the user named a path (used as it is), else `name` in the default
/// folder, which is created if it is missing.
pub(crate) fn or_default(explicit: &Option<PathBuf>, name: &str) -> io::Result<PathBuf> {
    match explicit {
        Some(path) => Ok(path.clone()),
        None => {
            let folder = folder();
            std::fs::create_dir_all(&folder)?;
            Ok(folder.join(name))
        }
    }
}
