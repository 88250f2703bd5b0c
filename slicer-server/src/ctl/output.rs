//! How `steadyctl` prints: aligned tables and `name  value` summaries for people, JSON for
//! scripts, and the cell forms both share (keys in 16 hex digits, shares, loads).

use std::fmt::Write as _;

use serde::Serialize;
use steady_slice::SliceKey;

/// A column's alignment: text to the left, numbers to the right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Padded on the right.
    Left,
    /// Padded on the left.
    Right,
}

/// A table for people: a header of column names, then rows, each column as wide as its
/// widest cell, columns two spaces apart, no trailing spaces. Cells are printed as given:
/// text from outside (a job's name, an instance's address) goes through [`cell`] or
/// [`words`] first, so that whitespace or control characters (a job name may hold any)
/// break neither the layout nor the terminal.
#[derive(Debug, Clone)]
pub struct Table {
    columns: Vec<(&'static str, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these columns (name, alignment) and no rows yet.
    pub fn new(columns: &[(&'static str, Align)]) -> Self {
        Self { columns: columns.to_vec(), rows: Vec::new() }
    }

    /// Adds a row: one cell per column (missing cells are empty, extra ones dropped).
    pub fn row(&mut self, cells: impl IntoIterator<Item = String>) {
        let mut row: Vec<String> = cells.into_iter().take(self.columns.len()).collect();
        row.resize(self.columns.len(), String::new());
        self.rows.push(row);
    }

    /// How many rows it has.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether it has no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as text: the header line, then a line per row, each ending in a newline.
    pub fn render(&self) -> String {
        let widths: Vec<usize> = (0..self.columns.len())
            .map(|i| {
                let header = self.columns[i].0.chars().count();
                self.rows.iter().map(|r| r[i].chars().count()).fold(header, usize::max)
            })
            .collect();
        let mut out = String::new();
        let header: Vec<String> = self.columns.iter().map(|(name, _)| (*name).to_owned()).collect();
        for line in std::iter::once(&header).chain(&self.rows) {
            let mut text = String::new();
            for (i, cell) in line.iter().enumerate() {
                if i > 0 {
                    text.push_str("  ");
                }
                let pad = widths[i] - cell.chars().count();
                // The header's names are aligned as their column's cells are.
                match self.columns[i].1 {
                    Align::Left => {
                        text.push_str(cell);
                        text.extend(std::iter::repeat_n(' ', pad));
                    }
                    Align::Right => {
                        text.extend(std::iter::repeat_n(' ', pad));
                        text.push_str(cell);
                    }
                }
            }
            let _ = writeln!(out, "{}", text.trim_end());
        }
        out
    }
}

/// `name  value` lines, the names padded to the longest (a table without a header).
#[derive(Debug, Clone, Default)]
pub struct Summary {
    lines: Vec<(&'static str, String)>,
}

impl Summary {
    /// Adds a line.
    pub fn line(&mut self, name: &'static str, value: impl Into<String>) {
        self.lines.push((name, value.into()));
    }

    /// The lines as text, each ending in a newline.
    pub fn render(&self) -> String {
        let width = self.lines.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
        let mut out = String::new();
        for (name, value) in &self.lines {
            let _ = writeln!(out, "{}", format!("{name:<width$}  {value}").trim_end());
        }
        out
    }
}

/// `text` as a cell: as it is, or quoted and escaped when it is empty or holds
/// whitespace or control characters (which would break a table's columns, or reach the
/// terminal).
pub fn cell(text: &str) -> String {
    if text.is_empty() || text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        format!("{text:?}")
    } else {
        text.to_owned()
    }
}

/// A cell made of words (`count 8`, `3 5`): the words kept apart by single spaces, each
/// escaped as [`cell`] would.
pub fn words<I, S>(items: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let words: Vec<String> = items.into_iter().map(|w| cell(w.as_ref())).collect();
    if words.is_empty() {
        "-".to_owned()
    } else {
        words.join(" ")
    }
}

/// A slice key in 16 hex digits (`0000000000000000`), as tables and JSON print keys.
pub fn hex(key: SliceKey) -> String {
    format!("{:016x}", key.get())
}

/// A share of the key space as a percentage with two decimals (`25.00%`).
pub fn percent(share: f64) -> String {
    format!("{:.2}%", share * 100.0)
}

/// A load with two decimals, `-` when unknown.
pub fn load(load: Option<f64>) -> String {
    load.map_or_else(|| "-".to_owned(), |l| format!("{l:.2}"))
}

/// An optional value, `-` for none.
pub fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// `value` as pretty JSON with a final newline.
pub fn json<T: Serialize + ?Sized>(value: &T) -> String {
    let mut text = serde_json::to_string_pretty(value).expect("steadyctl's output serializes");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell_numbers_to_the_right() {
        let mut table =
            Table::new(&[("JOB", Align::Left), ("GENERATION", Align::Right), ("LEADER", Align::Left)]);
        table.row(["users".into(), "12".into(), "slicer-a".into()]);
        table.row(["a-much-longer-job".into(), "123456789012".into(), "-".into()]);
        assert_eq!(
            table.render(),
            "JOB                  GENERATION  LEADER\n\
             users                        12  slicer-a\n\
             a-much-longer-job  123456789012  -\n"
        );
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn an_empty_table_is_its_header_and_no_line_has_trailing_spaces() {
        let table = Table::new(&[("NAME", Align::Left), ("PAGES", Align::Left)]);
        assert_eq!(table.render(), "NAME  PAGES\n");
        assert!(table.is_empty());
        let mut table = Table::new(&[("NAME", Align::Left), ("PAGES", Align::Left)]);
        table.row(["a".into(), "-".into()]);
        table.row(["b".into()]);
        for line in table.render().lines() {
            assert_eq!(line, line.trim_end());
        }
        assert_eq!(table.render(), "NAME  PAGES\na     -\nb\n");
    }

    #[test]
    fn cells_that_would_break_the_layout_are_quoted_and_escaped() {
        assert_eq!(cell("users"), "users");
        assert_eq!(cell("two words"), "\"two words\"");
        assert_eq!(cell("evil\u{1b}[2J"), "\"evil\\u{1b}[2J\"");
        assert_eq!(cell("line\nbreak"), "\"line\\nbreak\"");
        assert_eq!(cell(""), "\"\"");
        assert_eq!(words(["count", "8"]), "count 8");
        assert_eq!(words(Vec::<String>::new()), "-");
        let mut table = Table::new(&[("JOB", Align::Left), ("N", Align::Right)]);
        table.row([cell("a b"), "1".into()]);
        assert_eq!(table.render(), "JOB    N\n\"a b\"  1\n");
    }

    #[test]
    fn keys_shares_and_loads() {
        assert_eq!(hex(SliceKey(0)), "0000000000000000");
        assert_eq!(hex(SliceKey(u64::MAX)), "ffffffffffffffff");
        assert_eq!(hex(SliceKey(1 << 62)), "4000000000000000");
        assert_eq!(percent(0.25), "25.00%");
        assert_eq!(percent(1.0 / 3.0), "33.33%");
        assert_eq!(load(Some(12.5)), "12.50");
        assert_eq!(load(None), "-");
        assert_eq!(or_dash(Some(12u64)), "12");
        assert_eq!(or_dash(None::<u64>), "-");
    }

    #[test]
    fn a_summary_pads_its_names() {
        let mut summary = Summary::default();
        summary.line("job", "users");
        summary.line("generation", "12");
        summary.line("drained", "");
        assert_eq!(summary.render(), "job         users\ngeneration  12\ndrained\n");
    }
}
