//! Prints criterion's last results as ratios to each group's baseline.
//!
//! `cargo run --release -p steady-benches --bin bench-ratios -- [GROUP_PREFIX] [BASELINE]`
//! (defaults: `subset` and `naive_ring`). Run after `cargo bench -p steady-benches`.

use std::path::PathBuf;

use steady_benches::report::{load, ratio_table};

fn main() {
    let mut args = std::env::args().skip(1);
    let prefix = args.next().unwrap_or_else(|| "subset".to_owned());
    let baseline = args.next().unwrap_or_else(|| "naive_ring".to_owned());
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"))
        .join("criterion");
    let estimates = load(&dir, &prefix);
    if estimates.is_empty() {
        eprintln!("no criterion results for groups starting with {prefix:?} under {}", dir.display());
        std::process::exit(1);
    }
    print!("{}", ratio_table(&estimates, &baseline));
}
