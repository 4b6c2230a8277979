//! Rules over the repository's own files, not the binary: the gateway's data-plane folders
//! import only downward (docs/architecture.md), and sources cite only what a reader of the
//! repository can open (a docs page, a module), never the documents the project came from,
//! issue numbers or benchmark rounds. The README and docs pages are checked by `readme.rs`.

use std::path::{Path, PathBuf};

/// The gateway's data-plane folders, lowest first: each may import its own and lower ones.
const LAYERS: [&str; 5] = ["plumbing", "telemetry", "edge", "upstream", "pipeline"];

/// Phrases that point outside the repository.
const OUTSIDE: [&str; 10] = [
    "seed 0",
    "seed-0",
    "seeds/",
    "../shared",
    "STYLE.md",
    "ARCHITECTURE.md",
    "issue 1",
    "issue 2",
    "issue 3",
    "issue #",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// Every `*.rs` file under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if !name.starts_with("target") && name != ".git" && name != "node_modules" {
                    pending.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out
}

/// The gateway modules a line of code names through `crate::` (`crate::edge::…` and
/// `crate::{edge, pipeline}`), comments left out.
fn crate_paths(line: &str) -> Vec<&str> {
    let code = line.split("//").next().unwrap_or("");
    let mut names = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or("");
            names.extend(group.split(',').filter_map(|p| p.trim().split("::").next()));
        } else {
            names.extend(
                rest.split(|c: char| !c.is_alphanumeric() && c != '_')
                    .next(),
            );
        }
    }
    names
}

#[test]
fn data_plane_folders_import_only_downward() {
    let src = root().join("gateway/src");
    let mut upward = Vec::new();
    for (rank, layer) in LAYERS.iter().enumerate() {
        for file in rust_files(&src.join(layer)) {
            let text = std::fs::read_to_string(&file).unwrap();
            for (n, line) in text.lines().enumerate() {
                for name in crate_paths(line) {
                    let above = LAYERS
                        .iter()
                        .position(|l| *l == name)
                        .is_some_and(|r| r > rank);
                    if above {
                        let file = file.strip_prefix(&src).unwrap_or(&file).display();
                        upward.push(format!("{file}:{}: {layer} -> {name}", n + 1));
                    }
                }
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports running back up (order {LAYERS:?}):\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_layering_check_sees_both_import_forms() {
    assert_eq!(
        crate_paths("use crate::pipeline::step::Step;"),
        ["pipeline"]
    );
    assert_eq!(
        crate_paths("use crate::{edge, pipeline::x, plumbing};"),
        ["edge", "pipeline", "plumbing"]
    );
    assert!(crate_paths("// see crate::pipeline").is_empty());
}

#[test]
fn sources_cite_only_what_is_in_the_repository() {
    let root = root();
    let mut found = Vec::new();
    // This file and the readme test list the phrases themselves.
    let lists = [
        root.join("tests/e2e/repository.rs"),
        root.join("tests/e2e/readme.rs"),
    ];
    for file in rust_files(&root).into_iter().filter(|f| !lists.contains(f)) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            for phrase in OUTSIDE {
                if line.contains(phrase) || line.contains(", round ") {
                    let file = file.strip_prefix(&root).unwrap_or(&file).display();
                    found.push(format!("{file}:{}: {}", n + 1, line.trim()));
                    break;
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "citations of what the repository does not hold:\n{}",
        found.join("\n")
    );
}
