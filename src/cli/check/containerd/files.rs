//! The files containerd loads its config from, walked as containerd's `LoadConfig` walks them
//! (cmd/containerd/server/config): the root file, then each file's `imports` in order,
//! relative to that file's directory, a `*` globbed (Go's `filepath.Glob`), every file once.
//! `config dump` cannot answer "is this drop-in read?": on containerd >= 2.2 it starts from
//! the default config, whose `imports` holds `/etc/containerd/conf.d/*.toml`, and prints it
//! whatever the files say; containerd itself resolves only the files' own `imports`.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use super::super::node::Node;

/// One file containerd loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedFile {
    pub path: PathBuf,
    /// Its `version` (0 when absent).
    pub version: i64,
}

/// The config files as containerd walks them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileChain {
    pub root_exists: bool,
    /// Every file loaded, root first, in containerd's order.
    pub files: Vec<LoadedFile>,
    /// Every import pattern, resolved to an absolute path (relative ones against their file's
    /// directory).
    pub patterns: Vec<PathBuf>,
    /// Problems that stop containerd from starting (an imported file missing, a file that
    /// does not parse).
    pub errors: Vec<String>,
}

/// containerd's `LoadConfig` walk: the root file, then each file's `imports` in order
/// (relative to the file's directory; with a `*` a glob, else the path itself), each file
/// once.
pub fn walk_files(node: &dyn Node, root: &Path) -> FileChain {
    let mut chain = FileChain::default();
    let mut pending = vec![root.to_path_buf()];
    let mut loaded = BTreeSet::new();
    let mut first = true;
    while !pending.is_empty() {
        let path = pending.remove(0);
        if !loaded.insert(path.clone()) {
            continue;
        }
        let text = match node.read(&path) {
            Ok(t) => t,
            Err(e) if first && e.kind() == std::io::ErrorKind::NotFound => {
                // containerd runs with its defaults, which import nothing.
                return chain;
            }
            Err(e) => {
                chain.errors.push(format!("read {}: {e}", path.display()));
                continue;
            }
        };
        if first {
            chain.root_exists = true;
            first = false;
        }
        let table: toml::Table = match toml::from_str(&text) {
            Ok(t) => t,
            Err(e) => {
                chain
                    .errors
                    .push(format!("{} is not valid TOML: {e}", path.display()));
                continue;
            }
        };
        let version = table
            .get("version")
            .and_then(|v| v.as_integer())
            .unwrap_or(0);
        chain.files.push(LoadedFile {
            path: path.clone(),
            version,
        });
        let dir = path.parent().unwrap_or(Path::new("/")).to_path_buf();
        let imports = table.get("imports").and_then(|v| v.as_array());
        for import in imports.into_iter().flatten().filter_map(|v| v.as_str()) {
            let p = clean(&dir.join(import));
            chain.patterns.push(p.clone());
            if import.contains('*') {
                let mut matches = glob(node, &p);
                matches.sort();
                pending.extend(matches);
            } else {
                pending.push(p);
            }
        }
    }
    chain
}

/// Go's `filepath.Clean` for absolute paths: no `.`, `..` resolved lexically.
fn clean(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

/// Go's `filepath.Glob` for an absolute pattern whose wildcards are in its last component
/// (what containerd's drop-in patterns are); a wildcard in a directory component is matched
/// component by component.
fn glob(node: &dyn Node, pattern: &Path) -> Vec<PathBuf> {
    let mut current = vec![PathBuf::from("/")];
    for c in pattern.components().skip(1) {
        let part = c.as_os_str().to_string_lossy();
        let mut next = Vec::new();
        for dir in &current {
            if !part.contains(['*', '?', '[']) {
                let p = dir.join(&*part);
                if node.exists(&p) {
                    next.push(p);
                }
                continue;
            }
            for name in node.list_dir(dir).unwrap_or_default() {
                if glob_match(&part, &name) {
                    next.push(dir.join(name));
                }
            }
        }
        current = next;
    }
    current
}

/// Go's `filepath.Match` for one path component: `*`, `?`, `[...]` (with `^` negation and
/// ranges), `\` escapes.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    fn class(p: &[char], c: char) -> Option<(bool, usize)> {
        // p starts after '['; returns (matched, length of the class including ']').
        let mut i = 0;
        let negate = p.first() == Some(&'^');
        if negate {
            i += 1;
        }
        let mut matched = false;
        let mut first = true;
        while i < p.len() {
            if p[i] == ']' && !first {
                return Some((matched != negate, i + 1));
            }
            first = false;
            let mut lo = p[i];
            if lo == '\\' {
                i += 1;
                lo = *p.get(i)?;
            }
            let mut hi = lo;
            if p.get(i + 1) == Some(&'-') && p.get(i + 2).is_some_and(|c| *c != ']') {
                hi = p[i + 2];
                if hi == '\\' {
                    hi = *p.get(i + 3)?;
                    i += 1;
                }
                i += 2;
            }
            if lo <= c && c <= hi {
                matched = true;
            }
            i += 1;
        }
        None
    }
    fn go(p: &[char], n: &[char]) -> bool {
        match p.first() {
            None => n.is_empty(),
            Some('*') => (0..=n.len()).any(|k| go(&p[1..], &n[k..])),
            Some('?') => !n.is_empty() && go(&p[1..], &n[1..]),
            Some('[') => match (n.first(), class(&p[1..], *n.first().unwrap_or(&'\0'))) {
                (Some(_), Some((true, len))) => go(&p[1 + len..], &n[1..]),
                _ => false,
            },
            Some('\\') if p.len() > 1 => n.first() == Some(&p[1]) && go(&p[2..], &n[1..]),
            Some(c) => n.first() == Some(c) && go(&p[1..], &n[1..]),
        }
    }
    go(&p, &n)
}

/// Whether one of the resolved import patterns names `path` (which need not exist yet).
pub fn imports_path(patterns: &[PathBuf], path: &Path) -> bool {
    let path = clean(path);
    patterns.iter().any(|pat| {
        let pc: Vec<_> = pat.components().collect();
        let fc: Vec<_> = path.components().collect();
        pc.len() == fc.len()
            && pc.iter().zip(&fc).all(|(a, b)| {
                glob_match(
                    &a.as_os_str().to_string_lossy(),
                    &b.as_os_str().to_string_lossy(),
                )
            })
    })
}
