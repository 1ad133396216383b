//! Every relative link in the documentation leads somewhere.
//!
//! The pages checked are the workspace's `README.md`, every `docs/*.md`, and
//! every crate's `README.md` (a `README.md` beside a `Cargo.toml` below the
//! workspace root, outside `target/` and hidden folders). In each page, outside fenced code blocks
//! and code spans, every inline link or image (`[text](dest)`,
//! `![alt](dest)`) and every reference definition (`[id]: dest`) whose
//! destination has no URL scheme (`https:`, `mailto:`, ...) is resolved
//! against the page's folder (a destination starting with `/` against the
//! workspace root): the file or folder must exist. A `#anchor`, alone (this
//! page) or after a path to a Markdown file, must name one of that page's
//! headings as GitHub names them: the heading's text as rendered (code
//! spans, emphasis and link markup removed), lower-cased, every character
//! that is not a letter, a digit, `-` or `_` dropped, every space turned into
//! `-`, and `-1`, `-2`, ... added to repeats. Anchors into other files (e.g.
//! `#L10` in a source file) are not checked. Nothing is fetched: links with a
//! scheme are skipped.
//!
//! The checker is tested on pages written for the purpose (a missing file, a
//! missing heading, links inside code that must be ignored, GitHub's slugs),
//! then run on the workspace.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

/// The workspace root (the `tests` crate's parent).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .to_path_buf()
}

/// The pages to check under `root`: `README.md`, `docs/*.md`, and every
/// crate's `README.md` further down (beside a `Cargo.toml`, not in `target/`
/// or hidden folders), sorted.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let readme = root.join("README.md");
    if readme.is_file() {
        found.push(readme);
    }
    if let Ok(entries) = fs::read_dir(root.join("docs")) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|ext| ext == "md") && path.is_file() {
                found.push(path);
            }
        }
    }
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let Ok(entries) = fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if path.is_dir() {
                if !name.starts_with('.') && name != "target" {
                    folders.push(path);
                }
            } else if name == "README.md" && folder != root && folder.join("Cargo.toml").is_file() {
                found.push(path);
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

/// `line` with every code span replaced by spaces (so links inside code are
/// not links); an unclosed backtick run is left as it is, as Markdown does.
fn without_code_spans(line: &str) -> String {
    let bytes = line.as_bytes();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'`' {
            let run = bytes[i..].iter().take_while(|&&b| b == b'`').count();
            let fence = &line[i..i + run];
            if let Some(close) = find_closing_run(&line[i + run..], fence) {
                let end = i + run + close + run;
                out.extend(std::iter::repeat_n(' ', line[i..end].chars().count()));
                i = end;
                continue;
            }
            out.push_str(fence);
            i += run;
            continue;
        }
        let c = line[i..].chars().next().expect("inside the line");
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// Where in `rest` a backtick run exactly `fence` long starts.
fn find_closing_run(rest: &str, fence: &str) -> Option<usize> {
    let bytes = rest.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'`' {
            let run = bytes[i..].iter().take_while(|&&b| b == b'`').count();
            if run == fence.len() {
                return Some(i);
            }
            i += run;
        } else {
            i += 1;
        }
    }
    None
}

/// The lines of `text` outside fenced code blocks, with their numbers
/// (1-based).
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut lines = Vec::new();
    let mut fence: Option<(char, usize)> = None;
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = trimmed.chars().next().filter(|c| *c == '`' || *c == '~');
        let run = marker.map_or(0, |m| trimmed.chars().take_while(|&c| c == m).count());
        match (fence, marker) {
            (None, Some(m)) if run >= 3 => fence = Some((m, run)),
            (Some((m, open)), Some(c))
                if c == m && run >= open && trimmed[run..].trim().is_empty() =>
            {
                fence = None
            }
            (None, _) => lines.push((index + 1, line)),
            _ => {}
        }
    }
    lines
}

/// The destinations of the links on one line of prose (code spans already
/// blanked): inline links and images, and a reference definition.
fn link_destinations(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    let trimmed = line.trim_start();
    if line.len() - trimmed.len() <= 3
        && trimmed.starts_with('[')
        && let Some(close) = trimmed.find(']')
        && trimmed[close + 1..].starts_with(':')
    {
        let dest = trimmed[close + 2..].split_whitespace().next().unwrap_or("");
        if !dest.is_empty() {
            found.push(
                dest.trim_start_matches('<')
                    .trim_end_matches('>')
                    .to_string(),
            );
        }
    }
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let mut depth = 0usize;
        let mut end = after.len();
        for (i, c) in after.char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => {
                    end = i;
                    break;
                }
                ')' => depth -= 1,
                _ => {}
            }
        }
        let inside = after[..end].trim();
        let dest = if let Some(angle) = inside.strip_prefix('<') {
            angle.split('>').next().unwrap_or("").to_string()
        } else {
            inside.split_whitespace().next().unwrap_or("").to_string()
        };
        if !dest.is_empty() {
            found.push(dest);
        }
        rest = &after[end.min(after.len())..];
    }
    found
}

/// Whether `dest` has a URL scheme (`https:`, `mailto:`, ...).
fn has_scheme(dest: &str) -> bool {
    match dest.find(':') {
        Some(colon) => {
            let scheme = &dest[..colon];
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
                && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && !dest[..colon].contains('/')
        }
        None => false,
    }
}

/// A heading's text as GitHub renders it: code-span backticks, emphasis
/// markers, link and image markup and HTML tags removed.
fn rendered_heading(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '`' | '*' => {}
            '!' if chars.peek() == Some(&'[') => {}
            '[' => {}
            ']' if chars.peek() != Some(&'(') => {}
            ']' => {
                // Drop the destination: `](...)`.
                let mut depth = 0usize;
                for d in chars.by_ref() {
                    match d {
                        '(' => depth += 1,
                        ')' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                }
            }
            '<' => {
                for d in chars.by_ref() {
                    if d == '>' {
                        break;
                    }
                }
            }
            _ => out.push(c),
        }
    }
    out.trim().to_string()
}

/// GitHub's anchor for a heading's rendered text (without the repeat
/// suffix).
fn slug(rendered: &str) -> String {
    rendered
        .to_lowercase()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c)
            } else if c == ' ' {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// The anchors of every ATX heading (`#` to `######`) of `text` outside
/// fenced code, repeats numbered as GitHub numbers them.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut found = HashSet::new();
    for (_, line) in prose_lines(text) {
        let trimmed = line.trim_start();
        if line.len() - trimmed.len() > 3 {
            continue;
        }
        let level = trimmed.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&level) {
            continue;
        }
        let rest = &trimmed[level..];
        if !(rest.is_empty() || rest.starts_with(' ') || rest.starts_with('\t')) {
            continue;
        }
        let content = rest.trim().trim_end_matches('#').trim_end();
        let base = slug(&rendered_heading(content));
        let count = seen.entry(base.clone()).or_insert(0);
        let anchor = if *count == 0 {
            base.clone()
        } else {
            format!("{base}-{count}")
        };
        *count += 1;
        found.insert(anchor);
    }
    found
}

/// `%XX` escapes decoded (for paths with spaces and the like).
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && bytes[i + 1].is_ascii_hexdigit()
            && bytes[i + 2].is_ascii_hexdigit()
        {
            let byte = u8::from_str_radix(&text[i + 1..i + 3], 16).expect("two hex digits");
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `path` with `.` and `..` folded away (without touching the file system).
fn normalized(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The relative links checked in the pages under `root`, and every broken
/// one, one line each: `page:line: link -> why`.
fn check_links(root: &Path) -> (usize, Vec<String>) {
    let mut checked = 0;
    let mut broken = Vec::new();
    let mut anchor_cache: BTreeMap<PathBuf, HashSet<String>> = BTreeMap::new();
    for page in pages(root) {
        let text = fs::read_to_string(&page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        let shown = page
            .strip_prefix(root)
            .unwrap_or(&page)
            .display()
            .to_string();
        let folder = page.parent().expect("a page is in a folder");
        for (number, line) in prose_lines(&text) {
            for dest in link_destinations(&without_code_spans(line)) {
                if has_scheme(&dest) {
                    continue;
                }
                checked += 1;
                let (path_part, anchor) = match dest.split_once('#') {
                    Some((path, anchor)) => (path, Some(anchor)),
                    None => (dest.as_str(), None),
                };
                let path_part = path_part.split('?').next().unwrap_or("");
                let target = if path_part.is_empty() {
                    page.clone()
                } else if let Some(from_root) = path_part.strip_prefix('/') {
                    normalized(&root.join(percent_decoded(from_root)))
                } else {
                    normalized(&folder.join(percent_decoded(path_part)))
                };
                if !target.exists() {
                    broken.push(format!(
                        "{shown}:{number}: ({dest}) -> no such file or folder"
                    ));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                if target.extension().is_none_or(|ext| ext != "md") || !target.is_file() {
                    continue;
                }
                let known = anchor_cache
                    .entry(target.clone())
                    .or_insert_with(|| anchors(&fs::read_to_string(&target).unwrap_or_default()));
                let anchor = percent_decoded(anchor).to_lowercase();
                if !known.contains(&anchor) {
                    broken.push(format!(
                        "{shown}:{number}: ({dest}) -> no heading with anchor #{anchor} in {}",
                        target.strip_prefix(root).unwrap_or(&target).display()
                    ));
                }
            }
        }
    }
    (checked, broken)
}

/// The broken links of the pages under `root` ([`check_links`]).
fn broken_links(root: &Path) -> Vec<String> {
    check_links(root).1
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = workspace_root();
    let checked = pages(&root);
    for expected in ["README.md", "docs/control-abi.md", "hypervisor/README.md"] {
        assert!(
            checked.contains(&root.join(expected)),
            "{expected} is not among the pages checked: {checked:?}"
        );
    }
    let (links, broken) = check_links(&root);
    // The README's crate table and page list alone hold more than 20.
    assert!(
        links > 100,
        "only {links} relative links found: the parser lost them"
    );
    assert!(
        broken.is_empty(),
        "{} broken link(s):\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// A scratch workspace with `files` (path, text) written under it.
fn scratch(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let root = std::env::temp_dir().join(format!("doc-links-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    for (path, text) in files {
        let path = root.join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }
    root
}

#[test]
fn a_missing_file_and_a_missing_heading_are_reported() {
    let root = scratch(
        "broken",
        &[
            (
                "README.md",
                "# Top\n\nSee [the guide](docs/guide.md#setting-up), [gone](docs/gone.md),\n\
                 [bad anchor](docs/guide.md#nowhere) and [here](#top).\n",
            ),
            (
                "docs/guide.md",
                "# Guide\n\n## Setting up\n\nBack [home](../README.md#top).\n",
            ),
            ("crate/README.md", "[code](src/lib.rs) [self](#missing)\n"),
            ("crate/Cargo.toml", "[package]\n"),
            (
                "notes/README.md",
                "Not a crate's: [unchecked](nowhere.md)\n",
            ),
        ],
    );
    let broken = broken_links(&root);
    fs::remove_dir_all(&root).unwrap();
    assert_eq!(
        broken,
        [
            "README.md:3: (docs/gone.md) -> no such file or folder",
            "README.md:4: (docs/guide.md#nowhere) -> no heading with anchor #nowhere in docs/guide.md",
            "crate/README.md:1: (src/lib.rs) -> no such file or folder",
            "crate/README.md:1: (#missing) -> no heading with anchor #missing in crate/README.md",
        ]
    );
}

#[test]
fn links_in_code_urls_and_folders_are_handled() {
    let root = scratch(
        "code",
        &[
            (
                "README.md",
                "# Top\n\n```sh\n# not a heading\n[x](missing-in-fence.md)\n```\n\n\
                 `[y](missing-in-span.md)` [web](https://example.com/nothing) \
                 [mail](mailto:a@b.c) [dir](docs) [ref]\n\n[ref]: docs/page.md\n",
            ),
            ("docs/page.md", "# Page\n"),
        ],
    );
    let broken = broken_links(&root);
    let readme = fs::read_to_string(root.join("README.md")).unwrap();
    fs::remove_dir_all(&root).unwrap();
    assert!(broken.is_empty(), "{broken:?}");
    assert!(!anchors(&readme).contains("not-a-heading"));
}

#[test]
fn anchors_follow_githubs_rules() {
    let text = "# A `code` heading: with (punctuation), 2 vCPUs!\n\
                ## `--vm`: several VMs\n\
                ## Repeat\n## Repeat\n\
                ### [Linked](x.md) *emphasis* and snake_case\n\
                ####### not a heading\n";
    let found = anchors(text);
    for anchor in [
        "a-code-heading-with-punctuation-2-vcpus",
        "--vm-several-vms",
        "repeat",
        "repeat-1",
        "linked-emphasis-and-snake_case",
    ] {
        assert!(found.contains(anchor), "{anchor} missing from {found:?}");
    }
    assert_eq!(found.len(), 5, "{found:?}");
}
