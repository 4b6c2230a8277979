//! The README's and the docs pages' commands, verbatim, against the embedded default: every
//! ```` ```sh test ```` block (README.md first, then the pages in `RUNNABLE`, in order) runs
//! with `bash -euo pipefail` while `portcullis` (no `--config`) serves on its default ports
//! from a temp directory, with `PORTCULLIS_ADMIN_TOKEN` set and the binary on PATH. The
//! blocks check their own key outputs (`grep`, `curl -f`); a block that fails fails the test
//! with its output.
//!
//! Also here: every relative link in README.md and docs/*.md points at a file that exists
//! (and, with a `#fragment`, at a heading of that file), and none of them cites anything
//! outside the repository.
//!
//! The default ports (8080, 8081, 9000) are outside the kernel's ephemeral range that every
//! other test draws its ports from, so only another run of this test can hold them: it
//! waits (bounded) for them to be free.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use portcullis_testkit::gateway::raw_get_status;
use portcullis_testkit::process::{ChildGuard, READY_ATTEMPTS, READY_POLL};

use crate::common::BIN;

const README: &str = include_str!("../../README.md");
/// Docs pages whose `sh test` blocks run after the README's, in this order.
const RUNNABLE: [(&str, &str); 1] = [("docs/admin.md", include_str!("../../docs/admin.md"))];
const DEFAULT_PORTS: [u16; 3] = [8080, 8081, 9000];
const TOKEN: &str = "readme-test-admin-token-0123456789";
/// One block's bound: the retry demo waits a second, the rest are single requests.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(60);

/// The bodies of the ```` ```sh test ```` blocks, in order.
fn test_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match current.as_mut() {
            None if line.trim_end() == "```sh test" => current = Some(String::new()),
            None => {}
            Some(_) if line.trim_end() == "```" => blocks.extend(current.take()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    blocks
}

fn ports_free() -> bool {
    DEFAULT_PORTS
        .iter()
        .all(|port| TcpListener::bind(("127.0.0.1", *port)).is_ok())
}

/// The repository root.
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// README.md and every docs/*.md, as (path relative to the root, text).
fn pages() -> Vec<(PathBuf, String)> {
    let root = repo_root();
    let mut pages = vec![(PathBuf::from("README.md"), README.to_owned())];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    for path in docs {
        let text = std::fs::read_to_string(&path).unwrap();
        pages.push((path.strip_prefix(&root).unwrap().to_path_buf(), text));
    }
    pages
}

/// The targets of the inline links `[text](target)` and images `![alt](target)` of a
/// Markdown text, outside code spans and fenced blocks.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Code spans are the odd-numbered pieces between backticks.
        for (i, piece) in line.split('`').enumerate() {
            if i % 2 == 1 {
                continue;
            }
            let mut rest = piece;
            while let Some(at) = rest.find("](") {
                rest = &rest[at + 2..];
                let end = rest.find(')').unwrap_or(rest.len());
                targets.push(rest[..end].trim().to_owned());
                rest = &rest[end..];
            }
        }
    }
    targets
}

/// GitHub's anchor of a heading: lower case, spaces to `-`, other punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown text's headings (outside fenced blocks).
fn anchors(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            found.push(anchor(line.trim_start_matches('#')));
        }
    }
    found
}

#[test]
fn readme_and_docs_refer_to_nothing_outside_the_repository() {
    let outside = [
        "../shared",
        "/work/",
        "seeds/",
        "seed 0",
        "STYLE.md",
        "ARCHITECTURE.md",
        "issue 1",
        "issue #",
        ", round ",
    ];
    for (path, text) in pages() {
        for needle in outside {
            assert!(
                !text.contains(needle),
                "{} mentions {needle:?}",
                path.display()
            );
        }
    }
    assert!(
        test_blocks(README).len() >= 4,
        "README lost its tested blocks"
    );
}

#[test]
fn relative_links_point_at_files_that_exist() {
    let root = repo_root();
    let mut broken = Vec::new();
    let mut checked = 0;
    for (path, text) in pages() {
        let dir = root.join(path.parent().unwrap());
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, fragment) = match target.split_once('#') {
                Some((file, fragment)) => (file, Some(fragment)),
                None => (target.as_str(), None),
            };
            let resolved = if file.is_empty() {
                root.join(&path)
            } else {
                dir.join(file)
            };
            checked += 1;
            if !resolved.exists() {
                broken.push(format!("{}: {target} (no such file)", path.display()));
                continue;
            }
            if let Some(fragment) = fragment {
                let text = std::fs::read_to_string(&resolved).unwrap_or_default();
                if !anchors(&text).iter().any(|a| a == fragment) {
                    broken.push(format!("{}: {target} (no such heading)", path.display()));
                }
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} links found: is the reader broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn link_reader_skips_code_and_reads_anchors() {
    let text = "see [a](docs/a.md#x-y) and `[no](code.md)`\n```\n[no](fenced.md)\n```\n![p](p.png)";
    assert_eq!(link_targets(text), ["docs/a.md#x-y", "p.png"]);
    assert_eq!(
        anchors("# Title\n## When Redis or the database goes away\n### `[server.tls]`, TLS\n"),
        [
            "title",
            "when-redis-or-the-database-goes-away",
            "servertls-tls"
        ]
    );
}

#[tokio::test]
async fn readme_commands_work_verbatim_on_the_embedded_default() {
    let mut blocks = test_blocks(README);
    for (_, page) in RUNNABLE {
        blocks.extend(test_blocks(page));
    }
    assert!(!blocks.is_empty());
    let mut free = ports_free();
    for _ in 0..(READY_ATTEMPTS * 3) {
        if free {
            break;
        }
        tokio::time::sleep(READY_POLL).await;
        free = ports_free();
    }
    assert!(
        free,
        "the embedded default's ports {DEFAULT_PORTS:?} stay busy; stop what holds them"
    );

    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("gateway.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.current_dir(dir.path())
        .env("PORTCULLIS_ADMIN_TOKEN", TOKEN)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    let mut gateway = ChildGuard::spawn("portcullis", cmd).unwrap();
    let logs = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let mut healthy = false;
    for _ in 0..READY_ATTEMPTS {
        if logs().contains("portcullis listening")
            && raw_get_status(([127, 0, 0, 1], 8080).into(), "/healthz").await == Some(200)
        {
            healthy = true;
            break;
        }
        if !gateway.is_running() {
            break;
        }
        tokio::time::sleep(READY_POLL).await;
    }
    assert!(healthy, "embedded default did not start:\n{}", logs());

    let bin_dir = Path::new(BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for block in &blocks {
        let mut bash = tokio::process::Command::new("bash");
        bash.args(["-euo", "pipefail", "-c", block])
            .current_dir(dir.path())
            .env("PATH", &path)
            .env("PORTCULLIS_ADMIN_TOKEN", TOKEN)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let output = tokio::time::timeout(BLOCK_TIMEOUT, bash.output())
            .await
            .unwrap_or_else(|_| panic!("block timed out:\n{block}"))
            .unwrap();
        assert!(
            output.status.success(),
            "block failed ({}):\n{block}\n--- stdout\n{}\n--- stderr\n{}\n--- gateway\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            logs()
        );
    }
    // What the README says about the database file and the retry demo.
    assert!(dir.path().join("portcullis.db").exists());
    assert!(logs().contains("retrying upstream request"), "{}", logs());

    gateway.signal("TERM");
    let status = gateway.wait_exit(Duration::from_secs(15)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        logs()
    );
}

#[test]
fn finds_only_the_marked_blocks() {
    let text = "a\n```sh test\none\ntwo\n```\n```sh\nnot me\n```\n```sh test\nthree\n```\n";
    assert_eq!(test_blocks(text), vec!["one\ntwo\n", "three\n"]);
}
