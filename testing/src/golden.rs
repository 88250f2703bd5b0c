//! Golden files: a frozen contract written out as text, compared line by line with what
//! the code computes now (`slice/tests/golden.rs`, `tests/tests/golden.rs`).

use std::path::Path;

/// Compares `computed` with the checked-in file at `path`, line by line; with
/// `STEADY_BLESS` set in the environment, writes it instead (to add vectors only).
///
/// # Panics
///
/// On the first line that differs, when lines were added or removed, or when the file
/// cannot be read: each means the frozen contract changed.
pub fn check_golden_file(path: &Path, computed: &str) {
    let name = path.display();
    if std::env::var_os("STEADY_BLESS").is_some() {
        std::fs::write(path, computed).unwrap();
        return;
    }
    let recorded = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{name}: {e} (create it with STEADY_BLESS=1)"));
    let recorded: Vec<&str> = recorded.lines().collect();
    let computed: Vec<&str> = computed.lines().collect();
    for (line, (want, got)) in recorded.iter().zip(&computed).enumerate() {
        assert_eq!(got, want, "{name} line {}: the frozen contract changed", line + 1);
    }
    assert_eq!(computed.len(), recorded.len(), "{name}: vectors added or removed");
}
