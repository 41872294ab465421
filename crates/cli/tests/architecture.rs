//! The crate dependency graph follows `crates/README.md`: dependencies point from later crates to
//! earlier ones only, and each crate depends only on the crates its row allows. Read from
//! `cargo metadata`, so a new `stoke-*` dependency that breaks the layering fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// Allowed normal (non-dev) dependencies between stoke crates; mirrors the table in
/// `crates/README.md` and `../shared/design/architecture.md`.
fn allowed() -> BTreeMap<&'static str, BTreeSet<&'static str>> {
    let table: &[(&str, &[&str])] = &[
        ("stoke-types", &[]),
        // The GGUF format (read, write, HF translation): no stoke dependencies.
        ("stoke-gguf", &[]),
        ("stoke-sandbox", &["stoke-types"]),
        ("stoke-reward", &["stoke-types", "stoke-sandbox"]),
        ("stoke-data", &["stoke-types"]),
        ("stoke-tokenizer", &["stoke-types", "stoke-gguf"]),
        // Environments speak chat messages (tokenizer), run tools in the sandbox and hold the
        // tasks' reference data (reward); the episode runner that drives them is the pipeline's.
        (
            "stoke-env",
            &[
                "stoke-types",
                "stoke-sandbox",
                "stoke-reward",
                "stoke-tokenizer",
            ],
        ),
        ("stoke-ops", &["stoke-types"]),
        ("stoke-model", &["stoke-types", "stoke-gguf", "stoke-ops"]),
        ("stoke-optim", &[]),
        (
            "stoke-rollout",
            &["stoke-types", "stoke-ops", "stoke-model", "stoke-tokenizer"],
        ),
        // The trainer samples from the student for on-policy distillation (`[distill] lmbda`).
        (
            "stoke-train",
            &[
                "stoke-types",
                "stoke-ops",
                "stoke-model",
                "stoke-optim",
                "stoke-data",
                "stoke-tokenizer",
                "stoke-rollout",
            ],
        ),
        // The eval harness grades with the reward crate's verifiers, whose code kinds need a
        // sandbox the harness is handed.
        (
            "stoke-eval",
            &[
                "stoke-types",
                "stoke-sandbox",
                "stoke-ops",
                "stoke-model",
                "stoke-tokenizer",
                "stoke-rollout",
                "stoke-reward",
                "stoke-data",
            ],
        ),
        (
            "stoke-serve",
            &[
                "stoke-types",
                "stoke-ops",
                "stoke-model",
                "stoke-tokenizer",
                "stoke-rollout",
            ],
        ),
        // The pipeline holds the policy (model), its tokenizer, the optimizer settings and the
        // PTX shards directly, besides the three modules' crates; its held-out evaluation runs
        // through the eval harness (one evaluator in the codebase); remote rollout talks to
        // inference servers through stoke-serve's client.
        (
            "stoke-pipeline",
            &[
                "stoke-types",
                "stoke-ops",
                "stoke-model",
                "stoke-optim",
                "stoke-data",
                "stoke-tokenizer",
                "stoke-rollout",
                "stoke-reward",
                "stoke-train",
                "stoke-eval",
                "stoke-serve",
                "stoke-env",
            ],
        ),
        (
            "stoke-cli",
            &[
                "stoke-types",
                "stoke-gguf",
                "stoke-sandbox",
                "stoke-reward",
                "stoke-data",
                "stoke-tokenizer",
                "stoke-ops",
                "stoke-model",
                "stoke-rollout",
                "stoke-optim",
                "stoke-train",
                "stoke-pipeline",
                "stoke-eval",
                "stoke-serve",
                "stoke-env",
            ],
        ),
    ];
    table
        .iter()
        .map(|(krate, deps)| (*krate, deps.iter().copied().collect()))
        .collect()
}

#[test]
fn stoke_crates_depend_only_on_allowed_crates() {
    let output = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
    let allowed = allowed();
    let packages = metadata["packages"].as_array().expect("packages array");
    let mut seen = BTreeSet::new();
    for package in packages {
        let name = package["name"].as_str().expect("package name");
        seen.insert(name.to_string());
        let permitted = allowed
            .get(name)
            .unwrap_or_else(|| panic!("crate {name} is not in the layering table; add it"));
        for dep in package["dependencies"]
            .as_array()
            .expect("dependencies array")
        {
            let dep_name = dep["name"].as_str().expect("dependency name");
            let is_normal = dep["kind"].is_null();
            if dep_name.starts_with("stoke-") && is_normal {
                assert!(
                    permitted.contains(dep_name),
                    "{name} depends on {dep_name}, which the layering does not allow"
                );
            }
        }
    }
    for krate in allowed.keys() {
        assert!(
            seen.contains(*krate),
            "layering table names {krate}, which is not in the workspace"
        );
    }
}

// Module cycles inside a crate.
//
// Within each crate, the top-level modules (`crate::a`, `crate::b`, ...) must form an acyclic
// graph, where a -> b means some file of `a` (`a.rs`, `a/mod.rs`, `a/**/*.rs`) names a path under
// `b`. The scan is textual and deliberately simple:
//
// - comments, string/char literals and `#[cfg(test)] mod` items (inline blocks, and the files of
//   out-of-line ones) are blanked first: tests may reach anywhere;
// - a reference is a path starting `crate::`, `$crate::`, `super::`, `self::` or a child module
//   declared in the file (`mod x;` then `x::...`), with `{...}` groups expanded to their first
//   segments; a path to a crate-root item (`crate::Foo`) counts as a reference to the module the
//   root `use`s it from (`pub use read::GgufFile;` makes `crate::GgufFile` point at `read`);
// - `use super::*` in a top-level module and other globs over the root are not followed, and
//   `#[path]` attributes and inline non-test modules are not modelled (the tree has none that
//   matter; a new one would be missed, not wrongly reported).
//
// Any cycle found here fails the test, naming every edge on it with the file, line and path that
// made it. (The eleven cycles found when the check landed were broken by choosing which module
// owns the shared type, usually a small new module both use; none is allowed.)

use std::path::{Path, PathBuf};

/// One source file of a crate: its module path (`["hf", "names"]`; the root is `[]`) and its
/// code with comments, literals and test modules blanked.
struct SourceFile {
    relative: String,
    module: Vec<String>,
    code: String,
}

/// An edge of the module graph with the first reference that made it.
#[derive(Clone)]
struct Evidence {
    file: String,
    line: usize,
    path: String,
}

/// The module path a file under `src/` defines, or `None` for a binary under `src/bin`.
fn module_path(relative: &Path) -> Option<Vec<String>> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    let file = parts.pop()?;
    let stem = file.strip_suffix(".rs")?;
    let root_file = parts.is_empty() && (stem == "lib" || stem == "main");
    if stem != "mod" && !root_file {
        parts.push(stem.to_string());
    }
    Some(parts)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `source` with comments, string literals (plain, byte, raw) and char literals replaced by
/// spaces; newlines are kept so line numbers still hold.
fn strip_comments_and_literals(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let starts_token = i == 0 || !is_ident(chars[i - 1]);
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if starts_token
            && (c == 'r' || (c == 'b' && next == Some('r')))
            && raw_string_hashes(&chars, i + if c == 'b' { 2 } else { 1 }).is_some()
        {
            let open = i + if c == 'b' { 2 } else { 1 };
            let hashes = raw_string_hashes(&chars, open).unwrap_or(0);
            let mut j = open + hashes + 1;
            while j < chars.len()
                && !(chars[j] == '"' && (1..=hashes).all(|h| chars.get(j + h) == Some(&'#')))
            {
                j += 1;
            }
            let end = (j + 1 + hashes).min(chars.len());
            out.extend(chars[i..end].iter().map(|&c| blank(c)));
            i = end;
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a), which stays.
            let end = if next == Some('\\') {
                (i + 2..chars.len()).find(|&j| chars[j] == '\'')
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(end) => {
                    out.extend(std::iter::repeat_n(' ', end + 1 - i));
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The number of `#`s of a raw string whose `#...#"` starts at `at`, if one does.
fn raw_string_hashes(chars: &[char], at: usize) -> Option<usize> {
    let hashes = chars[at.min(chars.len())..]
        .iter()
        .take_while(|&&c| c == '#')
        .count();
    (chars.get(at + hashes) == Some(&'"')).then_some(hashes)
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    PathSep,
    Punct(char),
}

/// Identifiers, `::` and single punctuation characters, each with its 1-based line.
fn tokenize(code: &str) -> Vec<(Token, usize)> {
    let chars: Vec<char> = code.chars().collect();
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let ident: String = chars[start..i].iter().collect();
            tokens.push((Token::Ident(ident), line));
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            tokens.push((Token::PathSep, line));
            i += 2;
        } else {
            tokens.push((Token::Punct(c), line));
            i += 1;
        }
    }
    tokens
}

/// `code` with every `#[cfg(test)]` module item blanked (its attribute, header and body), and the
/// names of those declared out of line (`#[cfg(test)] mod tests;`).
fn blank_test_modules(code: &str) -> (String, Vec<String>) {
    const ATTRIBUTE: &str = "#[cfg(test)]";
    let mut code: Vec<char> = code.chars().collect();
    let mut out_of_line = Vec::new();
    let mut from = 0;
    loop {
        let text: String = code[from..].iter().collect();
        let Some(found) = text.find(ATTRIBUTE) else {
            break;
        };
        let start = from + text[..found].chars().count();
        let mut i = start + ATTRIBUTE.chars().count();
        // Further attributes, then an optional visibility, then `mod name`.
        let skip_space = |i: &mut usize, code: &[char]| {
            while *i < code.len() && code[*i].is_whitespace() {
                *i += 1;
            }
        };
        loop {
            skip_space(&mut i, &code);
            if code.get(i) == Some(&'#') {
                let mut depth = 0;
                while i < code.len() {
                    match code[i] {
                        '[' => depth += 1,
                        ']' => {
                            depth -= 1;
                            if depth == 0 {
                                i += 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
            } else {
                break;
            }
        }
        let word = |i: usize, code: &[char]| -> String {
            code[i..]
                .iter()
                .take_while(|c| c.is_alphanumeric() || **c == '_')
                .collect()
        };
        if word(i, &code) == "pub" {
            i += 3;
            skip_space(&mut i, &code);
            if code.get(i) == Some(&'(') {
                while i < code.len() && code[i] != ')' {
                    i += 1;
                }
                i += 1;
            }
            skip_space(&mut i, &code);
        }
        if word(i, &code) != "mod" {
            from = start + 1;
            continue;
        }
        i += 3;
        skip_space(&mut i, &code);
        let name = word(i, &code);
        i += name.chars().count();
        skip_space(&mut i, &code);
        let end = match code.get(i) {
            Some(';') => {
                out_of_line.push(name);
                i + 1
            }
            Some('{') => {
                let mut depth = 0;
                let mut j = i;
                while j < code.len() {
                    match code[j] {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
                (j + 1).min(code.len())
            }
            _ => {
                from = start + 1;
                continue;
            }
        };
        for c in &mut code[start..end] {
            if *c != '\n' {
                *c = ' ';
            }
        }
        from = end;
    }
    (code.into_iter().collect(), out_of_line)
}

/// The crate's source files under `src`, test modules left out.
fn crate_sources(src: &Path) -> Vec<SourceFile> {
    let mut paths = Vec::new();
    rust_files(src, &mut paths);
    let mut files = Vec::new();
    let mut test_modules: Vec<Vec<String>> = Vec::new();
    for path in paths {
        let relative = path.strip_prefix(src).expect("under src");
        let Some(module) = module_path(relative) else {
            continue;
        };
        let source = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let (code, tests) = blank_test_modules(&strip_comments_and_literals(&source));
        for name in tests {
            let mut test_module = module.clone();
            test_module.push(name);
            test_modules.push(test_module);
        }
        files.push(SourceFile {
            relative: format!("src/{}", relative.display()),
            module,
            code,
        });
    }
    files.retain(|f| !test_modules.iter().any(|t| f.module.starts_with(t)));
    files
}

/// The first segments of the path or `{...}` group at `tokens[at]` (`self` in a group is `None`,
/// the base itself; a glob is left out).
fn first_segments(tokens: &[(Token, usize)], at: usize) -> Vec<Option<String>> {
    match tokens.get(at) {
        Some((Token::Ident(name), _)) if name == "self" => vec![None],
        Some((Token::Ident(name), _)) => vec![Some(name.clone())],
        Some((Token::Punct('{'), _)) => {
            let mut segments = Vec::new();
            let mut depth = 0;
            let mut element_start = true;
            for (token, _) in &tokens[at..] {
                match token {
                    Token::Punct('{') => {
                        depth += 1;
                        element_start = depth == 1;
                        continue;
                    }
                    Token::Punct('}') => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    Token::Punct(',') if depth == 1 => {
                        element_start = true;
                        continue;
                    }
                    Token::Ident(name) if element_start && depth == 1 => {
                        segments.push((name != "self").then(|| name.clone()));
                    }
                    _ => {}
                }
                element_start = false;
            }
            segments
        }
        _ => Vec::new(),
    }
}

/// Every module path (`base + segment`) a file of module `module` names, with its line and the
/// path's text. `children` are the modules declared in the file (`mod x;`).
fn references(
    module: &[String],
    code: &str,
    children: &BTreeSet<String>,
) -> Vec<(Vec<String>, usize, String)> {
    let tokens = tokenize(code);
    let mut found = Vec::new();
    for (i, (token, line)) in tokens.iter().enumerate() {
        let Token::Ident(name) = token else { continue };
        if i > 0 && tokens[i - 1].0 == Token::PathSep {
            continue;
        }
        if tokens.get(i + 1).map(|t| &t.0) != Some(&Token::PathSep) {
            continue;
        }
        let (mut base, mut rest) = match name.as_str() {
            "crate" => (Vec::new(), i + 2),
            "self" => (module.to_vec(), i + 2),
            "super" => (module[..module.len().saturating_sub(1)].to_vec(), i + 2),
            child if children.contains(child) => (module.to_vec(), i),
            _ => continue,
        };
        while matches!(&tokens.get(rest).map(|t| &t.0), Some(Token::Ident(s)) if s == "super")
            && tokens.get(rest + 1).map(|t| &t.0) == Some(&Token::PathSep)
        {
            base.pop();
            rest += 2;
        }
        let text = if rest > i {
            let prefix: Vec<&str> = tokens[i..rest]
                .iter()
                .filter_map(|(t, _)| match t {
                    Token::Ident(s) => Some(s.as_str()),
                    _ => None,
                })
                .collect();
            format!("{}::", prefix.join("::"))
        } else {
            String::new()
        };
        for segment in first_segments(&tokens, rest) {
            let mut target = base.clone();
            let shown = match &segment {
                Some(s) => {
                    target.push(s.clone());
                    format!("{text}{s}")
                }
                None => format!("{text}self"),
            };
            found.push((target, *line, shown));
        }
    }
    found
}

/// The names the crate root brings in with `use` (any visibility), each with the top-level module
/// it comes from: `pub use read::{GgufFile, Value};` gives `GgufFile -> read`, `Value -> read`.
fn root_imports(root: &str, top_level: &BTreeSet<String>) -> BTreeMap<String, String> {
    let tokens = tokenize(root);
    let mut imports = BTreeMap::new();
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i].0 != Token::Ident("use".into()) {
            i += 1;
            continue;
        }
        let end = (i..tokens.len())
            .find(|&j| tokens[j].0 == Token::Punct(';'))
            .unwrap_or(tokens.len());
        let mut j = i + 1;
        if matches!(&tokens[j].0, Token::Ident(s) if s == "crate" || s == "self") {
            j += 2;
        }
        if let Some((Token::Ident(module), _)) = tokens.get(j)
            && top_level.contains(module)
        {
            for k in j + 1..end {
                let followed_by_end = matches!(
                    tokens.get(k + 1).map(|t| &t.0),
                    Some(Token::Punct(',' | '}' | ';'))
                );
                if let Token::Ident(name) = &tokens[k].0
                    && followed_by_end
                    && name != "self"
                {
                    imports.insert(name.clone(), module.clone());
                }
            }
        }
        i = end;
    }
    imports
}

/// The edges between the crate's top-level modules, each with its first piece of evidence.
fn top_level_edges(files: &[SourceFile]) -> BTreeMap<(String, String), Evidence> {
    let top_level: BTreeSet<String> = files
        .iter()
        .filter_map(|f| f.module.first().cloned())
        .collect();
    let mut children: BTreeMap<Vec<String>, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        if let Some((last, parent)) = file.module.split_last() {
            children
                .entry(parent.to_vec())
                .or_default()
                .insert(last.clone());
        }
    }
    let imports = files
        .iter()
        .filter(|f| f.module.is_empty())
        .flat_map(|f| root_imports(&f.code, &top_level))
        .collect::<BTreeMap<_, _>>();
    let no_children = BTreeSet::new();
    let mut edges = BTreeMap::new();
    for file in files {
        let Some(from) = file.module.first() else {
            continue; // The root declares and re-exports the modules; it is no sibling.
        };
        let declared = children.get(&file.module).unwrap_or(&no_children);
        for (target, line, path) in references(&file.module, &file.code, declared) {
            let to = match target.first() {
                Some(first) if top_level.contains(first) => first.clone(),
                Some(first) if target.len() == 1 => match imports.get(first) {
                    Some(module) => module.clone(),
                    None => continue,
                },
                _ => continue,
            };
            if &to != from {
                edges.entry((from.clone(), to)).or_insert_with(|| Evidence {
                    file: file.relative.clone(),
                    line,
                    path,
                });
            }
        }
    }
    edges
}

/// The strongly connected components of more than one module (Tarjan), each sorted.
fn cycles(edges: &BTreeMap<(String, String), Evidence>) -> Vec<Vec<String>> {
    let mut graph: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        graph.entry(from).or_default().push(to);
        graph.entry(to).or_default();
    }
    struct Tarjan<'a> {
        graph: &'a BTreeMap<&'a str, Vec<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        components: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, node: &'a str) {
            let n = self.index.len();
            self.index.insert(node, n);
            self.low.insert(node, n);
            self.stack.push(node);
            for &next in &self.graph[node] {
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node, low);
                } else if self.stack.contains(&next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = Vec::new();
                while let Some(top) = self.stack.pop() {
                    component.push(top.to_string());
                    if top == node {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.components.push(component);
                }
            }
        }
    }
    let mut tarjan = Tarjan {
        graph: &graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        components: Vec::new(),
    };
    for &node in graph.keys() {
        if !tarjan.index.contains_key(node) {
            tarjan.visit(node);
        }
    }
    tarjan.components.sort();
    tarjan.components
}

/// One cycle through `component` (its first module back to itself), each edge with its evidence.
fn describe_cycle(component: &[String], edges: &BTreeMap<(String, String), Evidence>) -> String {
    // Breadth-first from the first module to any module with an edge back to it.
    let start = &component[0];
    let mut previous: BTreeMap<&String, &String> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    let mut last = None;
    while let Some(node) = queue.pop_front() {
        if edges.contains_key(&(node.clone(), start.clone())) {
            last = Some(node);
            break;
        }
        for next in component {
            if next != start
                && !previous.contains_key(next)
                && edges.contains_key(&(node.clone(), next.clone()))
            {
                previous.insert(next, node);
                queue.push_back(next);
            }
        }
    }
    let mut path = vec![start.clone()];
    let mut node = last.expect("a strongly connected component has a cycle");
    let mut back = vec![node.clone()];
    while node != start {
        node = previous[node];
        back.push(node.clone());
    }
    back.pop();
    back.reverse();
    path.extend(back);
    path.push(start.clone());
    let steps: Vec<String> = path
        .windows(2)
        .map(|pair| {
            let e = &edges[&(pair[0].clone(), pair[1].clone())];
            format!(
                "  {} -> {}: {}:{} names `{}`",
                pair[0], pair[1], e.file, e.line, e.path
            )
        })
        .collect();
    format!("{}\n{}", path.join(" -> "), steps.join("\n"))
}

/// The module cycles of the crate whose sources are under `src`, as (sorted modules, description).
fn module_cycles(src: &Path) -> Vec<(Vec<String>, String)> {
    let files = crate_sources(src);
    let edges = top_level_edges(&files);
    cycles(&edges)
        .into_iter()
        .map(|component| {
            let description = describe_cycle(&component, &edges);
            (component, description)
        })
        .collect()
}

#[test]
fn no_crate_has_a_cycle_among_its_top_level_modules() {
    let crates_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut crate_dirs: Vec<PathBuf> = std::fs::read_dir(&crates_dir)
        .expect("read crates/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.join("src").is_dir())
        .collect();
    crate_dirs.sort();
    assert!(crate_dirs.len() > 10, "found crates: {crate_dirs:?}");
    let mut failures = Vec::new();
    for dir in &crate_dirs {
        let name = dir
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        for (component, description) in module_cycles(&dir.join("src")) {
            failures.push(format!(
                "crates/{name}, strongly connected {component:?}: {description}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "module import cycles:\n{}",
        failures.join("\n")
    );
}

/// Writes `files` (path under `src/`, contents) into a fresh temporary crate and returns its `src`.
fn fake_crate(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for (path, contents) in files {
        let path = dir.path().join("src").join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, contents).expect("write");
    }
    dir
}

/// A crate of three modules where `a` uses `b` and `b` uses `c`; `c`'s file is the variable part.
fn three_modules(c: &str) -> tempfile::TempDir {
    fake_crate(&[
        (
            "lib.rs",
            "mod a;\nmod b;\nmod c;\npub use a::Thing;\nuse c::helper;\n",
        ),
        (
            "a.rs",
            "mod inner;\nuse crate::b::{self, Other};\npub struct Thing;\n",
        ),
        // A child naming its parent and its parent's sibling is fine.
        (
            "a/inner.rs",
            "use super::Thing;\nfn f() { let _ = super::super::b::Other; }\n",
        ),
        ("b.rs", "pub struct Other;\nfn g() { crate::c::helper() }\n"),
        ("c.rs", c),
    ])
}

#[test]
fn module_cycle_check_reports_a_planted_cycle_and_accepts_an_acyclic_tree() {
    // Acyclic: c names a only in a comment, a string, a raw string and its tests.
    let acyclic = three_modules(
        "pub fn helper() {}\n\
         // crate::a::Thing\n\
         /* crate::a::Thing */\n\
         const S: &str = \"crate::a::Thing\";\n\
         const R: &str = r#\"crate::a::\"Thing\"#;\n\
         const Q: char = '\"';\n\
         fn h<'a>(x: &'a str) -> &'a str { x }\n\
         #[cfg(test)]\n\
         mod tests {\n    use crate::a::Thing;\n    fn t() { let _ = Thing; }\n}\n",
    );
    let found = module_cycles(&acyclic.path().join("src"));
    assert!(found.is_empty(), "reported {found:?}");

    // A path in code closes the cycle a -> b -> c -> a.
    let direct = three_modules("pub fn helper() { let _ = crate::a::Thing; }\n");
    let found = module_cycles(&direct.path().join("src"));
    assert_eq!(found.len(), 1, "{found:?}");
    let (modules, description) = &found[0];
    assert_eq!(modules, &["a", "b", "c"]);
    assert!(description.starts_with("a -> b -> c -> a"), "{description}");
    assert!(
        description.contains("c -> a: src/c.rs:1 names `crate::a`"),
        "{description}"
    );

    // So does a root item the root imports from `a`, and a `super::` group.
    for c in [
        "use crate::Thing;\npub fn helper() {}\n",
        "use super::{a::Thing, b};\npub fn helper() {}\n",
    ] {
        let tree = three_modules(c);
        let found = module_cycles(&tree.path().join("src"));
        assert_eq!(found.len(), 1, "{c}: {found:?}");
        assert_eq!(found[0].0, ["a", "b", "c"], "{c}");
    }

    // An out-of-line test module may reach anywhere: b's tests naming a close no cycle, while
    // the same path in b's own code does.
    let with_tests = |b: &str| {
        fake_crate(&[
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a.rs", "use crate::b::X;\npub struct Y;\n"),
            ("b.rs", b),
            ("b/tests.rs", "use crate::a::Y;\n"),
        ])
    };
    let tree = with_tests("pub struct X;\n#[cfg(test)]\nmod tests;\n");
    assert!(module_cycles(&tree.path().join("src")).is_empty());
    let tree = with_tests("pub struct X;\nmod tests;\n");
    assert_eq!(module_cycles(&tree.path().join("src"))[0].0, ["a", "b"]);
}
