//! ARCHITECTURE.md's module table is the rule, and the source is held to it: every `crate::`
//! path in `src/` must be one its module's row allows, every permission a row grants must be
//! used (so the table says what the code does, not what it once did), and every pair of
//! modules that import each other must be one the "cycles" list names. Paths between modules
//! are written `crate::…` (a `super::` never leaves its top-level module), which is what makes
//! a text scan enough here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The table: module → what it may import (`None`: everything). Paths are `a` or `a::b`.
fn table(doc: &str) -> BTreeMap<String, Option<Vec<String>>> {
    let section = doc.split("## Modules and what each may import").nth(1).expect("the modules section");
    let mut rows = BTreeMap::new();
    for line in section.lines().skip_while(|l| !l.starts_with("| module |")).skip(2) {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        assert_eq!(cells.len(), 3, "a table row of three cells: {line}");
        let module = ticked(cells[0]).next().unwrap_or_else(|| panic!("a module name: {line}"));
        let may = match cells[2] {
            "everything" => None,
            c => Some(
                ticked(c)
                    .filter(|p| p.chars().all(|ch| ch.is_ascii_lowercase() || ch == '_' || ch == ':'))
                    .collect(),
            ),
        };
        rows.insert(module.trim_end_matches('/').to_string(), may);
    }
    rows
}

/// The `code spans` of a cell.
fn ticked(cell: &str) -> impl Iterator<Item = String> + '_ {
    cell.split('`').skip(1).step_by(2).map(str::to_string)
}

/// Pairs the "cycles" list names: lines "- `a` and `b` import each other."
fn named_cycles(doc: &str) -> BTreeSet<(String, String)> {
    doc.lines()
        .filter(|l| l.starts_with("- ") && l.contains(" import each other"))
        .map(|l| {
            let m: Vec<String> = ticked(l).collect();
            assert!(m.len() >= 2, "a cycle names two modules: {l}");
            let (a, b) = (m[0].clone(), m[1].clone());
            if a < b { (a, b) } else { (b, a) }
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`None` for lib.rs and main.rs).
fn top_module(file: &Path) -> Option<String> {
    let rel = file.strip_prefix(root().join("src")).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main")).then(|| name.to_string())
}

/// Every path named after `crate::` in `code` (comment lines left out), braces expanded:
/// `crate::{a, b::{c, d}}` gives `a`, `b::c` and `b::d`.
fn crate_paths(code: &str) -> Vec<String> {
    let code: String =
        code.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    let mut out = Vec::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        let word_before = rest[..i].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_');
        rest = &rest[i + "crate::".len()..];
        if !word_before {
            tree("", rest, &mut out);
        }
    }
    out
}

/// Reads one use-tree at the start of `s` (a path, maybe ending in a brace group) under `prefix`.
fn tree(prefix: &str, s: &str, out: &mut Vec<String>) {
    let s = s.trim_start();
    if let Some(group) = s.strip_prefix('{') {
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    tree(prefix, &group[start..i], out);
                    return;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    tree(prefix, &group[start..i], out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        return;
    }
    let end = s.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(s.len());
    let path = s[..end].trim_end_matches(':');
    if path.is_empty() {
        return;
    }
    let full = if prefix.is_empty() { path.to_string() } else { format!("{prefix}::{path}") };
    if s[end..].starts_with('{') && s[..end].ends_with("::") {
        tree(&full, &s[end..], out);
    } else {
        out.push(full);
    }
}

/// Whether `path` (e.g. `meter::window::Window`) is under `allowed` (e.g. `meter::window`).
fn under(path: &str, allowed: &str) -> bool {
    path == allowed || path.starts_with(&format!("{allowed}::"))
}

#[test]
fn imports_follow_architecture_md() {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let rules = table(&doc);
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    files.sort();

    let mut errors = Vec::new();
    let mut used: BTreeSet<(String, String)> = BTreeSet::new();
    let mut edges: BTreeSet<(String, String)> = BTreeSet::new();
    for f in &files {
        let Some(module) = top_module(f) else { continue };
        let Some(may) = rules.get(&module) else {
            errors.push(format!("{}: module `{module}` has no row in the table", f.display()));
            continue;
        };
        let code = std::fs::read_to_string(f).unwrap();
        for path in crate_paths(&code) {
            let target = path.split("::").next().unwrap().to_string();
            if target == module || !rules.contains_key(&target) {
                continue; // its own items, or a crate-root item such as a macro
            }
            edges.insert((module.clone(), target));
            match may {
                None => {}
                Some(may) => match may.iter().find(|a| under(&path, a)) {
                    Some(a) => {
                        used.insert((module.clone(), a.clone()));
                    }
                    None => errors.push(format!(
                        "{}: `crate::{path}`, which `{module}`'s row does not allow ({may:?})",
                        f.strip_prefix(root()).unwrap().display()
                    )),
                },
            }
        }
    }
    for (module, may) in &rules {
        for a in may.iter().flatten() {
            if !used.contains(&(module.clone(), a.clone())) {
                errors.push(format!(
                    "`{module}` may import `{a}`, and no file of it does: drop it from the row"
                ));
            }
        }
    }
    let named = named_cycles(&doc);
    let mutual: BTreeSet<_> =
        edges.iter().filter(|(a, b)| a < b && edges.contains(&(b.clone(), a.clone()))).cloned().collect();
    for (a, b) in mutual.difference(&named) {
        errors.push(format!("`{a}` and `{b}` import each other, and the cycles list does not say so"));
    }
    for (a, b) in named.difference(&mutual) {
        errors.push(format!("the cycles list names `{a}` and `{b}`, which no longer import each other"));
    }
    assert!(errors.is_empty(), "ARCHITECTURE.md and src/ disagree:\n{}", errors.join("\n"));
}

#[test]
fn the_scan_reads_use_trees() {
    let code = "use crate::a::B;\nuse crate::{c, d::{e::F, g}};\n// crate::comment\nlet x = crate::h::i(1);\nnotcrate::j;";
    assert_eq!(crate_paths(code), ["a::B", "c", "d::e::F", "d::g", "h::i"]);
    assert!(under("meter::window::Window", "meter::window") && !under("meter::windows", "meter::window"));
}
