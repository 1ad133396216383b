//! The hypervisor's top-level folders depend on each other one way: no
//! import circle between `arch`, `runtime`, `control`, `devices`, `drivers`,
//! `exit`, `platform`, `stage2`, `vm`, `vocabulary` and the top-level files.
//!
//! # How
//!
//! Every `.rs` file under `src/` is read; comments are dropped; every path
//! that starts with `crate::` (in `use` lines and inline, `crate::{a, b}`
//! groups included) gives an edge from the file's top-level module to the
//! path's first segment when that is another top-level module. The strongly
//! connected components of that graph (Tarjan) with more than one module
//! are the circles; each is reported with the files that make its edges.
//! Besides: `vocabulary` imports nothing of the crate, and the VM runtime
//! (`runtime`) never names the machine layer (`arch`), which implements its
//! `Hardware` trait.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// Edges between top-level modules, each with the files that make it.
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// The text without `//` comments (doc comments included).
fn strip_comments(text: &str) -> String {
    text.lines()
        .map(|line| line.find("//").map_or(line, |at| &line[..at]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first segments of every `crate::` path in `code`.
fn crate_roots(code: &str) -> Vec<String> {
    let mut roots = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        // `crate::` only as a whole word (not `foo_crate::`).
        let word_start = at == 0
            || !rest[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_');
        rest = &rest[at + "crate::".len()..];
        if !word_start {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // The items of the group at depth 0.
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        roots.push(first_segment(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    item.push(c);
                }
            }
            roots.push(first_segment(&item));
        } else {
            roots.push(first_segment(rest));
        }
    }
    roots.retain(|root| !root.is_empty());
    roots
}

/// The identifier at the start of `path` (after blanks).
fn first_segment(path: &str) -> String {
    path.trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The folder graph of `files` (path relative to `src/`, text).
fn folder_graph(files: &[(String, String)]) -> Graph {
    let top = |path: &str| -> String {
        let first = path.split('/').next().unwrap_or(path);
        first.strip_suffix(".rs").unwrap_or(first).to_string()
    };
    let modules: BTreeSet<String> = files
        .iter()
        .map(|(path, _)| top(path))
        .filter(|m| m != "lib" && m != "main")
        .collect();
    let mut graph = Graph::new();
    for (path, text) in files {
        let from = top(path);
        if !modules.contains(&from) {
            continue;
        }
        graph.entry(from.clone()).or_default();
        for to in crate_roots(&strip_comments(text)) {
            if to != from && modules.contains(&to) {
                graph
                    .entry(from.clone())
                    .or_default()
                    .entry(to)
                    .or_default()
                    .insert(path.clone());
            }
        }
    }
    graph
}

/// The strongly connected components of `graph` with more than one module
/// (Tarjan's algorithm).
fn circles(graph: &Graph) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, node: &'a str) {
        let n = s.index.len();
        s.index.insert(node, n);
        s.low.insert(node, n);
        s.stack.push(node);
        s.on_stack.insert(node);
        let graph = s.graph;
        for next in graph.get(node).into_iter().flat_map(|edges| edges.keys()) {
            let next = next.as_str();
            if !s.index.contains_key(next) {
                visit(s, next);
                let low = s.low[node].min(s.low[next]);
                s.low.insert(node, low);
            } else if s.on_stack.contains(next) {
                let low = s.low[node].min(s.index[next]);
                s.low.insert(node, low);
            }
        }
        if s.low[node] == s.index[node] {
            let mut component = Vec::new();
            while let Some(top) = s.stack.pop() {
                s.on_stack.remove(top);
                component.push(top.to_string());
                if top == node {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !state.index.contains_key(node.as_str()) {
            visit(&mut state, node);
        }
    }
    state.found
}

/// Every `.rs` file under `dir`, as (path relative to `root`, text).
fn read_sources(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .expect("read src/")
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            read_sources(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path
                .strip_prefix(root)
                .expect("under src/")
                .to_string_lossy()
                .replace('\\', "/");
            out.push((
                relative,
                fs::read_to_string(&path).expect("read a source file"),
            ));
        }
    }
}

fn hypervisor_graph() -> Graph {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    read_sources(&root, &root, &mut files);
    folder_graph(&files)
}

/// A circle with the files that make each of its edges.
fn describe(graph: &Graph, circle: &[String]) -> String {
    let mut text = format!("import circle between {circle:?}:\n");
    for from in circle {
        for (to, files) in &graph[from] {
            if circle.contains(to) {
                text += &format!("  {from} -> {to}: {files:?}\n");
            }
        }
    }
    text
}

#[test]
fn top_level_folders_have_no_import_circle() {
    let graph = hypervisor_graph();
    assert!(graph.contains_key("arch") && graph.contains_key("runtime"));
    let found = circles(&graph);
    let report: String = found.iter().map(|c| describe(&graph, c)).collect();
    assert!(found.is_empty(), "{report}");
}

#[test]
fn vocabulary_is_a_leaf_and_the_runtime_does_not_name_the_machine_layer() {
    let graph = hypervisor_graph();
    assert_eq!(graph.get("vocabulary").map(BTreeMap::len), Some(0));
    let runtime = &graph["runtime"];
    assert!(!runtime.contains_key("arch"), "{:?}", runtime.get("arch"));
}

#[test]
fn the_check_finds_a_circle_through_three_folders_and_groups() {
    let file = |path: &str, text: &str| (path.to_string(), text.to_string());
    let files = [
        file("lib.rs", "pub mod a; pub mod b; pub mod c; pub mod d;"),
        file(
            "a/mod.rs",
            "use crate::b::Thing;\n// use crate::d::NotAnEdge;",
        ),
        file("b.rs", "fn f() { crate::c::call(); }"),
        file("c/x.rs", "use crate::{d, a::More};"),
        file("d.rs", "use alloc::vec::Vec; use my_crate::a;"),
    ];
    let graph = folder_graph(&files);
    assert_eq!(circles(&graph), vec![vec!["a", "b", "c"]]);
    assert!(graph["d"].is_empty());
    assert!(!graph["a"].contains_key("d"));
}
