//! The documentation holds together: every `stoke` command has a chapter or section in the book
//! (`docs/`), every relative markdown link in the README, the book and `bench/` points at a file
//! that exists, and no tracked text file names a path of one development machine (a virtual
//! environment, a cargo target folder, a scratch folder under `/work`, `/root`, `/home`, `/tmp`).
//!
//! What it is not: a markdown renderer. Anchors (`#section`) are not checked, only the file a
//! link points at; links inside code (fenced blocks and backtick spans) are not links.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

// ---------------------------------------------------------------------------------------------
// (a) every command has a page or a section
// ---------------------------------------------------------------------------------------------

/// The subcommands `stoke --help` lists under "Commands:" (clap's own `help` left out).
fn stoke_subcommands() -> Vec<String> {
    let output = Command::new(env!("CARGO_BIN_EXE_stoke"))
        .arg("--help")
        .output()
        .expect("run stoke --help");
    assert!(output.status.success(), "stoke --help failed");
    parse_commands(&String::from_utf8_lossy(&output.stdout))
}

/// Command names from clap's help text: the two-space-indented first words of the lines between
/// "Commands:" and the next blank line (deeper-indented lines continue a description).
fn parse_commands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| line.trim() != "Commands:")
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .filter(|line| line.starts_with("  ") && !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// The markdown files under `dir`, recursively, in a stable order.
fn markdown_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&current) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The lines of a markdown text outside fenced code blocks.
fn prose_lines(text: &str) -> Vec<&str> {
    let mut in_fence = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if !in_fence {
            lines.push(line);
        }
    }
    lines
}

/// Whether a heading names `stoke <command>` as a whole word (`stoke r1` is not `stoke rft`).
fn heading_names_command(heading: &str, command: &str) -> bool {
    let needle = format!("stoke {command}");
    heading.match_indices(&needle).any(|(at, _)| {
        let next = heading[at + needle.len()..].chars().next();
        !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    })
}

#[test]
fn every_stoke_command_has_a_page_or_a_section_in_the_book() {
    let commands = stoke_subcommands();
    assert!(
        commands.iter().any(|c| c == "train") && commands.len() > 10,
        "could not read the command list from stoke --help: {commands:?}"
    );
    let mut headings = Vec::new();
    for file in markdown_files(&repo_root().join("docs/src")) {
        let text = std::fs::read_to_string(&file).unwrap();
        for line in prose_lines(&text) {
            if line.starts_with('#') {
                headings.push(line.to_string());
            }
        }
    }
    let missing: Vec<&String> = commands
        .iter()
        .filter(|c| !headings.iter().any(|h| heading_names_command(h, c)))
        .collect();
    assert!(
        missing.is_empty(),
        "commands without a heading naming `stoke <command>` in docs/src: {missing:?}"
    );
}

#[test]
fn every_page_of_the_book_is_in_its_summary() {
    let src = repo_root().join("docs/src");
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).unwrap();
    let listed: BTreeSet<PathBuf> = links(&summary)
        .into_iter()
        .map(|target| src.join(target))
        .collect();
    let orphans: Vec<PathBuf> = markdown_files(&src)
        .into_iter()
        .filter(|f| !f.ends_with("SUMMARY.md") && !listed.contains(f))
        .collect();
    assert!(
        orphans.is_empty(),
        "pages missing from SUMMARY.md: {orphans:?}"
    );
}

#[test]
fn a_heading_names_a_command_only_as_a_whole_word() {
    assert!(heading_names_command("# Recipes: `stoke r1`", "r1"));
    assert!(heading_names_command(
        "## The data funnel: `stoke data run`",
        "data"
    ));
    assert!(!heading_names_command("# Recipes: `stoke rft`", "r1"));
    assert!(!heading_names_command("# `stoke reward-server`", "reward"));
    let help = "Usage: stoke <COMMAND>\n\nCommands:\n  score   Print\n          more\n  help  Print this\n\nOptions:\n  -h\n";
    assert_eq!(parse_commands(help), vec!["score".to_string()]);
}

// ---------------------------------------------------------------------------------------------
// (b) relative links resolve
// ---------------------------------------------------------------------------------------------

/// The targets of the inline links `[text](target)` of a markdown text, outside code.
fn links(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose_lines(text) {
        // Drop code spans: text between backticks is code, not a link.
        let prose: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, part)| part)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("");
            targets.push(target.to_string());
            rest = &after[end..];
        }
    }
    targets
}

/// The links of `file` whose target is a relative path that does not exist (anchors ignored).
fn broken_links(file: &Path, root: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let folder = file.parent().unwrap();
    links(&text)
        .into_iter()
        .filter(|target| {
            let is_external = target.contains("://") || target.starts_with("mailto:");
            let path = target.split('#').next().unwrap_or("");
            if is_external || path.is_empty() {
                return false;
            }
            let resolved = match path.strip_prefix('/') {
                Some(from_root) => root.join(from_root),
                None => folder.join(path),
            };
            !resolved.exists()
        })
        .collect()
}

#[test]
fn every_relative_link_in_the_readme_the_book_and_bench_resolves() {
    let root = repo_root();
    let mut files = vec![root.join("README.md")];
    files.extend(markdown_files(&root.join("docs/src")));
    files.extend(markdown_files(&root.join("bench")));
    assert!(files.len() > 10, "found only {files:?}");
    let broken: Vec<String> = files
        .iter()
        .flat_map(|file| {
            let shown = file
                .strip_prefix(&root)
                .unwrap_or(file)
                .display()
                .to_string();
            broken_links(file, &root)
                .into_iter()
                .map(move |target| format!("{shown}: {target}"))
        })
        .collect();
    assert!(
        broken.is_empty(),
        "links to missing files:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_link_checker_reports_a_link_to_a_missing_file_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("there.md"), "# there\n").unwrap();
    let page = dir.path().join("page.md");
    std::fs::write(
        &page,
        "[ok](there.md#a) [gone](missing.md) [web](https://example.com/x.md) [self](#top)\n\
         `[code](not-a-link.md)`\n```\n[fenced](also-not.md)\n```\n",
    )
    .unwrap();
    assert_eq!(
        broken_links(&page, dir.path()),
        vec!["missing.md".to_string()]
    );
}

// ---------------------------------------------------------------------------------------------
// (c) no path of one machine
// ---------------------------------------------------------------------------------------------

/// Roots under which a path belongs to one machine or one person: a scratch or project folder
/// (`/work`, `/tmp`, `/mnt`), a home (`/root`, `/home`, `/Users`).
const MACHINE_ROOTS: &[&str] = &["work", "tmp", "mnt", "root", "home", "Users"];

/// Paths that match but are not a development machine's, each with why it stays. An entry
/// applies to the files under `file_prefix` and the paths starting with `path_prefix`.
/// System paths (`/proc/...`, `/usr/bin/env`, `/dev/null`, `/etc/...`, `/var/tmp/...`) are not
/// flagged at all: they are absolute on every machine, so they never reach this list.
struct Allowed {
    file_prefix: &'static str,
    path_prefix: &'static str,
    reason: &'static str,
}

const ALLOWED: &[Allowed] = &[
    Allowed {
        file_prefix: "crates/cli/tests/docs.rs",
        path_prefix: "",
        reason: "this test: its allow-list and the examples that show the check can fail",
    },
    Allowed {
        file_prefix: "fixtures/vllm/exchange.jsonl",
        path_prefix: "/work/",
        reason: "a recording of a real vLLM server's answers, kept byte for byte; vLLM reports \
                 the folder it loaded the model from as `root`",
    },
    Allowed {
        file_prefix: "crates/pipeline/tests/",
        path_prefix: "/tmp/grpo-",
        reason: "the nominal origin of a config parsed from a string: a name for error \
                 messages and relative paths, never created or read",
    },
];

/// Characters that end a path in prose, shell, TOML, JSON and code.
fn is_delimiter(c: char) -> bool {
    c.is_whitespace() || "\"'`()[]<>{},;=:|\\".contains(c)
}

/// The machine paths in `text`: (line number, path). A path is a token that starts with `/`, a
/// root of [`MACHINE_ROOTS`] and a letter (`/work/venv`), or that names a virtual environment by
/// an absolute path (`/opt/venv/bin`), or a custom cargo target folder (`target-bench/release`).
fn machine_paths(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate() {
        for token in line.split(is_delimiter).filter(|t| !t.is_empty()) {
            let under_root = MACHINE_ROOTS.iter().any(|root| {
                token
                    .strip_prefix('/')
                    .and_then(|t| t.strip_prefix(root))
                    .and_then(|t| t.strip_prefix('/'))
                    .is_some_and(|t| t.starts_with(|c: char| c.is_ascii_alphabetic()))
            });
            let absolute_venv =
                token.starts_with('/') && (token.contains("/venv/") || token.contains("-venv/"));
            let target_folder = token.split('/').collect::<Vec<_>>().windows(2).any(|w| {
                w[0].len() > "target-".len()
                    && w[0].starts_with("target-")
                    && (w[1] == "release" || w[1] == "debug")
            });
            if under_root || absolute_venv || target_folder {
                found.push((number + 1, token.to_string()));
            }
        }
    }
    found
}

/// Tracked files (`git ls-files`); without git, every file under the root except build output,
/// run folders and version control.
fn tracked_files(root: &Path) -> Vec<PathBuf> {
    let listed = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["ls-files", "-z"])
        .output()
        .ok()
        .filter(|o| o.status.success() && !o.stdout.is_empty());
    if let Some(output) = listed {
        return output
            .stdout
            .split(|b| *b == 0)
            .filter(|name| !name.is_empty())
            .map(|name| PathBuf::from(String::from_utf8_lossy(name).into_owned()))
            .collect();
    }
    let mut found = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(root.join(&relative)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = relative.join(&name);
            let skipped = name == ".git" || name.starts_with("target") || name == "runs";
            if entry.path().is_dir() {
                if !skipped {
                    pending.push(path);
                }
            } else {
                found.push(path);
            }
        }
    }
    found
}

#[test]
fn no_tracked_text_file_names_a_path_of_one_development_machine() {
    let root = repo_root();
    let files = tracked_files(&root);
    assert!(files.len() > 100, "found only {} files", files.len());
    let mut offences = Vec::new();
    let mut allowances_used = BTreeSet::new();
    for file in &files {
        let Ok(bytes) = std::fs::read(root.join(file)) else {
            continue; // listed by git but deleted in the work tree
        };
        let Ok(text) = std::str::from_utf8(&bytes) else {
            continue; // not text
        };
        if text.contains('\0') {
            continue;
        }
        let shown = file.to_string_lossy().replace('\\', "/");
        for (line, path) in machine_paths(text) {
            let allowance = ALLOWED
                .iter()
                .position(|a| shown.starts_with(a.file_prefix) && path.starts_with(a.path_prefix));
            match allowance {
                Some(index) => {
                    allowances_used.insert(index);
                }
                None => offences.push(format!("{shown}:{line}: {path}")),
            }
        }
    }
    assert!(
        offences.is_empty(),
        "paths of one machine (use $VENV, $STOKE_TARGET, $SCRATCH, a relative path or the \
         system temp folder):\n{}",
        offences.join("\n")
    );
    let unused: Vec<&str> = (0..ALLOWED.len())
        .filter(|i| !allowances_used.contains(i))
        .map(|i| ALLOWED[i].reason)
        .collect();
    assert!(
        unused.is_empty(),
        "allow-list entries that match nothing any more: {unused:?}"
    );
}

#[test]
fn the_path_check_flags_venvs_scratch_and_target_folders_but_not_system_paths() {
    let venv = format!("/{}/venv/bin/python bench/x.py", MACHINE_ROOTS[0]);
    let scratch = format!("model = \"/{}/smollm2/hf\"", MACHINE_ROOTS[1]);
    let home = format!("see /{}/alice/notes", MACHINE_ROOTS[4]);
    let flagged = [
        venv.as_str(),
        scratch.as_str(),
        home.as_str(),
        "/opt/venv/bin/pip install x",
        "--stoke target-bench/release/examples/bench_train",
    ];
    for text in flagged {
        assert_eq!(machine_paths(text).len(), 1, "not flagged: {text}");
    }
    let clean = [
        "#!/usr/bin/env bash",
        "cat /proc/self/status > /dev/null",
        "probe /var/tmp/stoke-redteam and /proc/1/root/..",
        "tokenizer = \"../work/tok\"",
        "WORK=${1:-${TMPDIR:-/tmp}/moe-balance}",
        "$VENV/bin/python bench/x.py --model $SCRATCH/smollm2/hf",
        "RAYON_NUM_THREADS=2 $STOKE_TARGET/release/stoke",
        "https://example.com/home/page",
    ];
    for text in clean {
        assert_eq!(machine_paths(text), vec![], "flagged: {text}");
    }
}
