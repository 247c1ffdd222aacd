//! The layers of `src/` hold: every file imports only files of its own layer or of lower
//! ones, and no files import each other in a circle (docs/architecture.md).
//!
//! An import is a `crate::` or `super::` path outside test code (`#[cfg(test)]` items and
//! comments are left out), resolved to the file of the longest module it names. A module
//! and its submodules are one unit: a child may use its parent's helpers and the parent its
//! children, but siblings, cousins and layers may not import each other both ways. Written here
//! rather than taken from a crate: cargo-modules and cargo-depgraph draw crates and modules,
//! neither fails a build on a direction.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, lowest first; a top-level module not listed here fails the test.
const LAYERS: &[&[&str]] = &[
    &["error", "interrupt", "output"],
    &["oci"],
    &["engine"],
    &["inputs"],
    &["images"],
    &["plan"],
    &["make"],
    &["ship"],
    &["cli", "commands"],
    &["lib", "main"],
];

type Module = Vec<String>;

#[test]
fn every_import_runs_down_the_layers_and_none_runs_in_a_circle() {
    let files = sources(Path::new(env!("CARGO_MANIFEST_DIR")).join("src").as_path());
    let (upward, circles, edges) = judge(&files);
    assert!(
        upward.is_empty(),
        "imports that run up the layers:\n{}",
        upward.join("\n")
    );
    assert!(
        circles.is_empty(),
        "files that import each other in a circle:\n{circles:#?}"
    );
    assert!(edges > 100, "the walk found too few imports: {edges}");
}

/// Files are read and written through fs_err, whose errors name the path (std::fs says "No
/// such file or directory" and not which): no std::fs function outside test code. Types stay
/// std's (`File`, `Metadata`, `TryLockError`), and so does what fs_err does not wrap: the
/// lock files' `OpenOptions` (images/turn.rs, which names the path itself) and the ssh
/// folder's `DirBuilder` with its mode.
#[test]
fn files_are_opened_through_fs_err() {
    let files = sources(Path::new(env!("CARGO_MANIFEST_DIR")).join("src").as_path());
    let mut found = Vec::new();
    for (file, text) in &files {
        let code = strip_tests_and_comments(text);
        for (at, _) in code.match_indices("std::fs::") {
            let rest = &code[at + "std::fs::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let after = &rest[name.len()..];
            let function = name.starts_with(char::is_lowercase) && after.starts_with('(');
            let opens =
                name == "File" && (after.starts_with("::open(") || after.starts_with("::create("));
            let allowed = matches!(
                (file.as_str(), name.as_str()),
                ("images/turn.rs", "OpenOptions") | ("engine/ssh.rs", "DirBuilder")
            );
            if (function || opens || name == "OpenOptions" || name == "DirBuilder") && !allowed {
                found.push(format!(
                    "{file}: std::fs::{name}{}",
                    &after[..after.len().min(8)]
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "std::fs where fs_err serves:\n{}",
        found.join("\n")
    );
}

/// Every source file the README and docs/ name exists (they named 22 moved files when the
/// folders became the pipeline).
#[test]
fn the_docs_name_files_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    let mut missing = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for (at, _) in text.match_indices("src/") {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || matches!(c, '/' | '_' | '.'))
                .collect();
            let name = name.trim_end_matches('.');
            if name.ends_with(".rs") && !root.join(name).is_file() {
                missing.push(format!("{}: {name}", page.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "files the docs name that do not exist:\n{}",
        missing.join("\n")
    );
}

/// The check itself finds what it is for: an import up a layer, a circle of siblings, a
/// `{...}` group and `super::` paths; test code and comments do not count.
#[test]
fn the_check_finds_an_upward_import_and_a_circle() {
    let files: BTreeMap<String, String> = [
        ("lib.rs", "pub mod oci; pub mod plan;"),
        (
            "oci.rs",
            "pub mod a;\npub mod b;\n// crate::plan::x in a comment\n",
        ),
        ("oci/a.rs", "use super::b::Thing;\n"),
        ("oci/b.rs", "use crate::oci::{a::Other, digest};\n"),
        (
            "plan.rs",
            "#[cfg(test)]\nmod tests {\n    use crate::oci::a;\n}\n",
        ),
        ("plan/x.rs", "use crate::oci::Digest;\n"),
        ("oci/digest.rs", "fn f() { crate::plan::x::run() }\n"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let (upward, circles, _) = judge(&files);
    assert_eq!(upward, ["oci/digest.rs imports plan/x.rs (`plan::x::run`)"]);
    assert_eq!(
        circles,
        [vec!["oci/a.rs".to_string(), "oci/b.rs".to_string()]]
    );
}

/// The imports that run up the layers, the circles, and how many imports were resolved.
fn judge(files: &BTreeMap<String, String>) -> (Vec<String>, Vec<Vec<String>>, usize) {
    let modules: BTreeMap<Module, String> = files
        .keys()
        .map(|file| (module_of(file), file.clone()))
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut upward = Vec::new();
    let mut edges = 0;
    for (file, text) in files {
        let here = module_of(file);
        let layer = layer_of(&here, file);
        for path in imports(&strip_tests_and_comments(text), &here) {
            let Some(target) = resolve(&modules, &path) else {
                continue;
            };
            if target == *file {
                continue;
            }
            edges += 1;
            let target_layer = layer_of(&module_of(&target), &target);
            if target_layer > layer {
                upward.push(format!("{file} imports {target} (`{}`)", path.join("::")));
            }
            // A module and its own submodules are one unit (a parent declares its children
            // and they use its helpers): only circles between units are counted.
            let (a, b) = (module_of(file), module_of(&target));
            if !a.starts_with(&b) && !b.starts_with(&a) {
                graph.entry(file.clone()).or_default().insert(target);
            }
        }
    }
    upward.sort();
    upward.dedup();
    (upward, circles(&graph), edges)
}

/// Every `.rs` file under `root`, by its path relative to `root`.
fn sources(root: &Path) -> BTreeMap<String, String> {
    let mut files = BTreeMap::new();
    let mut folders = vec![PathBuf::from(root)];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let name = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_string();
                files.insert(name, std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    files
}

/// `make/compile/run.rs` is `make::compile::run`; `commands/mod.rs` is `commands`;
/// `lib.rs` is the crate root.
fn module_of(file: &str) -> Module {
    let mut parts: Module = file
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

fn layer_of(module: &Module, file: &str) -> usize {
    let top = module
        .first()
        .map(String::as_str)
        .unwrap_or(file.trim_end_matches(".rs"));
    LAYERS
        .iter()
        .position(|layer| layer.contains(&top))
        .unwrap_or_else(|| panic!("{file}: top-level module `{top}` is in no layer of LAYERS"))
}

/// The text without comments and without the items under `#[cfg(test)]`.
fn strip_tests_and_comments(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(|line| line.split("//").next().unwrap())
        .collect();
    let mut kept = String::new();
    let mut skip_depth: Option<i64> = None;
    let mut depth = 0i64;
    let mut armed = false;
    for line in lines {
        if skip_depth.is_none() && line.trim() == "#[cfg(test)]" {
            armed = true;
            continue;
        }
        let opens = line.matches('{').count() as i64;
        let closes = line.matches('}').count() as i64;
        if armed {
            armed = false;
            if opens == 0 {
                // A one-line item (`use ...;`, `mod tests;`).
                continue;
            }
            skip_depth = Some(depth);
        }
        depth += opens - closes;
        match skip_depth {
            Some(start) if depth <= start => skip_depth = None,
            Some(_) => {}
            None => {
                kept.push_str(line);
                kept.push('\n');
            }
        }
    }
    kept
}

/// The module paths `text` names through `crate::` and `super::`, a `{...}` group
/// expanded one level (`crate::a::{b, c::d}` names `a::b` and `a::c`).
fn imports(text: &str, here: &Module) -> Vec<Module> {
    let mut found = Vec::new();
    let bytes = text.as_bytes();
    for root in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(at) = text[from..].find(root) {
            let start = from + at;
            from = start + root.len();
            if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
                continue;
            }
            let mut base: Module = if root == "crate::" {
                Vec::new()
            } else {
                here[..here.len().saturating_sub(1)].to_vec()
            };
            let mut rest = &text[from..];
            loop {
                if let Some(tail) = rest.strip_prefix("super::") {
                    base.pop();
                    rest = tail;
                    continue;
                }
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if name.is_empty() {
                    break;
                }
                base.push(name.clone());
                rest = &rest[name.len()..];
                match rest.strip_prefix("::") {
                    Some(tail) => rest = tail,
                    None => break,
                }
            }
            if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                for item in group.split(',') {
                    let first: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !first.is_empty() && first != "self" {
                        let mut path = base.clone();
                        path.push(first);
                        found.push(path);
                    }
                }
            }
            found.push(base);
        }
    }
    found
}

/// The file of the longest module that `path` starts with.
fn resolve(modules: &BTreeMap<Module, String>, path: &Module) -> Option<String> {
    (1..=path.len())
        .rev()
        .find_map(|n| modules.get(&path[..n].to_vec()).cloned())
}

/// The strongly connected sets of more than one file (Tarjan's algorithm).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, file: &'a str) {
            let n = self.index.len();
            self.index.insert(file, n);
            self.low.insert(file, n);
            self.stack.push(file);
            for next in self.graph.get(file).into_iter().flatten() {
                if !self.index.contains_key(next.as_str()) {
                    self.visit(next);
                    let low = self.low[file].min(self.low[next.as_str()]);
                    self.low.insert(file, low);
                } else if self.stack.contains(&next.as_str()) {
                    let low = self.low[file].min(self.index[next.as_str()]);
                    self.low.insert(file, low);
                }
            }
            if self.low[file] == self.index[file] {
                let mut set = Vec::new();
                while let Some(top) = self.stack.pop() {
                    set.push(top.to_string());
                    if top == file {
                        break;
                    }
                }
                if set.len() > 1 {
                    set.sort();
                    self.found.push(set);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for file in graph.keys() {
        if !walk.index.contains_key(file.as_str()) {
            walk.visit(file);
        }
    }
    walk.found
}
