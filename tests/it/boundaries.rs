//! The import-graph walk (design document gate 6, ARCHITECTURE.md §3).
//!
//! Parses every source file of the library with `syn`, builds the module
//! tree, collects every `use` item and every path reference (including paths
//! inside macro invocations and `macro_rules!` bodies), resolves each through
//! child modules, imports and `pub use` re-exports transitively, and checks
//! every module-to-module and module-to-crate edge against the boundary
//! table. A re-export is followed to where it points, so an item reached
//! through a helper counts as reached.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// Crates domain code may name (ARCHITECTURE.md: std, serde, sha2; plus the
/// serde family's JSON value, `thiserror` for the module's error enum as the
/// code standard requires, and Unicode normalization tables the canonical
/// form cannot do without).
const DOMAIN_CRATES: &[&str] = &[
    "std",
    "core",
    "alloc",
    "serde",
    "serde_json",
    "sha2",
    "thiserror",
    "unicode_normalization",
];

/// Crates owned by exactly one layer.
const OWNED_CRATES: &[(&str, &[&str])] = &[
    // Both sides, the client of servers and the front door's server side,
    // in adapters::mcp alone (design gate 13 as written).
    ("rmcp", &["adapters::mcp"]),
    ("sse_stream", &["adapters::mcp"]),
    ("sqlx", &["adapters::store"]),
    // TLS to the outside is egress's alone.
    ("rustls", &["adapters::egress"]),
    ("tokio_rustls", &["adapters::egress"]),
    ("webpki_roots", &["adapters::egress"]),
    ("jsonschema", &["pipeline"]),
];

/// A node of the import graph: one of our modules' layer, or a crate.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Node {
    /// A module of this crate, by its path from the root.
    Module(Vec<String>),
    /// An external crate.
    Crate(String),
}

/// One forbidden edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The module that makes the reference.
    pub from: String,
    /// What it reaches (a layer or a crate).
    pub to: String,
    /// The path as written.
    pub via: String,
    /// Source file and line.
    pub at: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} -> {} via `{}` at {}",
            self.from, self.to, self.via, self.at
        )
    }
}

struct Reference {
    segments: Vec<String>,
    leading_colon: bool,
    line: usize,
}

#[derive(Default)]
struct Module {
    file: PathBuf,
    children: BTreeSet<String>,
    /// Names brought in by `use`, to the path as written (relative to this
    /// module).
    aliases: BTreeMap<String, Reference>,
    /// `use x::*` targets, as written.
    globs: Vec<Reference>,
    /// Every path this module writes.
    references: Vec<Reference>,
}

/// The parsed crate.
pub struct Crate {
    modules: BTreeMap<Vec<String>, Module>,
    externs: BTreeSet<String>,
}

impl Crate {
    /// Parses the crate rooted at `lib_rs`; `externs` are the crate names its
    /// manifest declares (underscored).
    pub fn load(lib_rs: &Path, externs: BTreeSet<String>) -> Result<Crate, String> {
        let mut krate = Crate {
            modules: BTreeMap::new(),
            externs,
        };
        let text =
            std::fs::read_to_string(lib_rs).map_err(|e| format!("{}: {e}", lib_rs.display()))?;
        let file = syn::parse_file(&text).map_err(|e| format!("{}: {e}", lib_rs.display()))?;
        let dir = lib_rs.parent().unwrap_or(Path::new(".")).to_path_buf();
        krate.load_items(Vec::new(), lib_rs, &dir, &file.items)?;
        Ok(krate)
    }

    /// Loads a crate whose `src/` is `root` and whose manifest is beside it.
    pub fn load_package(package: &Path) -> Result<Crate, String> {
        let manifest =
            std::fs::read_to_string(package.join("Cargo.toml")).map_err(|e| e.to_string())?;
        let manifest: toml::Table = manifest
            .parse()
            .map_err(|e: toml::de::Error| e.to_string())?;
        let mut externs: BTreeSet<String> = ["std", "core", "alloc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        for section in ["dependencies", "dev-dependencies"] {
            if let Some(table) = manifest.get(section).and_then(|v| v.as_table()) {
                externs.extend(table.keys().map(|k| k.replace('-', "_")));
            }
        }
        Crate::load(&package.join("src/lib.rs"), externs)
    }

    fn load_items(
        &mut self,
        path: Vec<String>,
        file: &Path,
        child_dir: &Path,
        items: &[syn::Item],
    ) -> Result<(), String> {
        let mut module = Module {
            file: file.to_path_buf(),
            ..Module::default()
        };
        let mut collector = Collector {
            references: Vec::new(),
        };
        for item in items {
            match item {
                syn::Item::Mod(child) => {
                    let name = child.ident.to_string();
                    module.children.insert(name.clone());
                    let mut child_path = path.clone();
                    child_path.push(name.clone());
                    match &child.content {
                        Some((_, inline)) => {
                            self.load_items(child_path, file, &child_dir.join(&name), inline)?;
                        }
                        None => {
                            let flat = child_dir.join(format!("{name}.rs"));
                            let nested = child_dir.join(&name).join("mod.rs");
                            let (source, grand_dir) = if flat.exists() {
                                (flat, child_dir.join(&name))
                            } else if nested.exists() {
                                (nested, child_dir.join(&name))
                            } else {
                                return Err(format!(
                                    "{}: module {name} has no file",
                                    file.display()
                                ));
                            };
                            let text = std::fs::read_to_string(&source)
                                .map_err(|e| format!("{}: {e}", source.display()))?;
                            let parsed = syn::parse_file(&text)
                                .map_err(|e| format!("{}: {e}", source.display()))?;
                            self.load_items(child_path, &source, &grand_dir, &parsed.items)?;
                        }
                    }
                    // Attributes of the `mod` item belong to the parent.
                    for attribute in &child.attrs {
                        collector.visit_attribute(attribute);
                    }
                }
                syn::Item::Use(item_use) => {
                    let line = item_use.use_token.span.start().line;
                    let leading = item_use.leading_colon.is_some();
                    flatten_use(&item_use.tree, Vec::new(), leading, line, &mut module);
                }
                other => collector.visit_item(other),
            }
        }
        module.references.extend(collector.references);
        self.modules.insert(path, module);
        Ok(())
    }

    /// Every forbidden edge in the crate.
    pub fn violations(&self) -> Vec<Violation> {
        let mut found = Vec::new();
        for (path, module) in &self.modules {
            let from = layer(path);
            let alias_refs = module.aliases.values();
            for reference in module
                .references
                .iter()
                .chain(alias_refs)
                .chain(module.globs.iter())
            {
                let mut reached = Vec::new();
                self.resolve(path, reference, 0, &mut reached);
                for node in reached {
                    if let Some(to) = forbidden(&from, &node) {
                        found.push(Violation {
                            from: from.clone(),
                            to,
                            via: written(reference),
                            at: format!("{}:{}", module.file.display(), reference.line),
                        });
                    }
                }
            }
        }
        found.sort_by(|a, b| (&a.at, &a.via, &a.to).cmp(&(&b.at, &b.via, &b.to)));
        found.dedup();
        found
    }

    /// Resolves `reference`, written in module `context`, to every node it
    /// reaches: the module it names and, through re-exports, where they lead.
    fn resolve(
        &self,
        context: &[String],
        reference: &Reference,
        depth: usize,
        reached: &mut Vec<Node>,
    ) {
        if depth > 32 || reference.segments.is_empty() {
            return;
        }
        let segments = &reference.segments;
        let first = segments[0].as_str();
        let absolute: Vec<String> = if reference.leading_colon {
            reached.push(Node::Crate(first.to_owned()));
            return;
        } else {
            match first {
                "crate" => segments[1..].to_vec(),
                "self" => context
                    .iter()
                    .cloned()
                    .chain(segments[1..].iter().cloned())
                    .collect(),
                "super" => {
                    let supers = segments.iter().take_while(|s| *s == "super").count();
                    if supers > context.len() {
                        return;
                    }
                    let base = &context[..context.len() - supers];
                    base.iter()
                        .cloned()
                        .chain(segments[supers..].iter().cloned())
                        .collect()
                }
                "Self" => return,
                _ => {
                    let module = self.modules.get(context);
                    if module.is_some_and(|m| m.children.contains(first)) {
                        context
                            .iter()
                            .cloned()
                            .chain(segments.iter().cloned())
                            .collect()
                    } else if let Some(alias) = module.and_then(|m| m.aliases.get(first)) {
                        let joined = Reference {
                            segments: alias
                                .segments
                                .iter()
                                .chain(segments[1..].iter())
                                .cloned()
                                .collect(),
                            leading_colon: alias.leading_colon,
                            line: reference.line,
                        };
                        self.resolve(context, &joined, depth + 1, reached);
                        return;
                    } else if self.externs.contains(first) {
                        reached.push(Node::Crate(first.to_owned()));
                        return;
                    } else {
                        // A local item, generic or variable: not an edge.
                        return;
                    }
                }
            }
        };
        // The longest prefix naming a module, then what the rest names there.
        let mut prefix = absolute.len();
        while prefix > 0 && !self.modules.contains_key(&absolute[..prefix]) {
            prefix -= 1;
        }
        let target = absolute[..prefix].to_vec();
        reached.push(Node::Module(target.clone()));
        let Some(module) = self.modules.get(&target) else {
            return;
        };
        if let Some(name) = absolute.get(prefix) {
            if let Some(alias) = module.aliases.get(name) {
                let rest = Reference {
                    segments: alias
                        .segments
                        .iter()
                        .chain(absolute[prefix + 1..].iter())
                        .cloned()
                        .collect(),
                    leading_colon: alias.leading_colon,
                    line: reference.line,
                };
                self.resolve(&target, &rest, depth + 1, reached);
            } else {
                // A name not declared here may come through a glob re-export.
                for glob in &module.globs {
                    let through = Reference {
                        segments: glob
                            .segments
                            .iter()
                            .chain(absolute[prefix..].iter())
                            .cloned()
                            .collect(),
                        leading_colon: glob.leading_colon,
                        line: reference.line,
                    };
                    self.resolve(&target, &through, depth + 1, reached);
                }
            }
        }
    }
}

fn flatten_use(
    tree: &syn::UseTree,
    mut prefix: Vec<String>,
    leading: bool,
    line: usize,
    module: &mut Module,
) {
    match tree {
        syn::UseTree::Path(path) => {
            prefix.push(path.ident.to_string());
            flatten_use(&path.tree, prefix, leading, line, module);
        }
        syn::UseTree::Name(name) => {
            let ident = name.ident.to_string();
            let alias = if ident == "self" {
                prefix.last().cloned().unwrap_or_default()
            } else {
                ident.clone()
            };
            if ident != "self" {
                prefix.push(ident);
            }
            module.aliases.insert(
                alias,
                Reference {
                    segments: prefix,
                    leading_colon: leading,
                    line,
                },
            );
        }
        syn::UseTree::Rename(rename) => {
            let ident = rename.ident.to_string();
            if ident != "self" {
                prefix.push(ident);
            }
            let alias = rename.rename.to_string();
            if alias != "_" {
                module.aliases.insert(
                    alias,
                    Reference {
                        segments: prefix,
                        leading_colon: leading,
                        line,
                    },
                );
            } else {
                module.references.push(Reference {
                    segments: prefix,
                    leading_colon: leading,
                    line,
                });
            }
        }
        syn::UseTree::Glob(_) => {
            module.globs.push(Reference {
                segments: prefix,
                leading_colon: leading,
                line,
            });
        }
        syn::UseTree::Group(group) => {
            for item in &group.items {
                flatten_use(item, prefix.clone(), leading, line, module);
            }
        }
    }
}

struct Collector {
    references: Vec<Reference>,
}

impl Collector {
    /// Paths inside token streams (macro invocations and definitions): any
    /// `a::b` run, and `crate`/`super`/`self` heads.
    fn scan_tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut index = 0;
        while index < trees.len() {
            match &trees[index] {
                TokenTree::Group(group) => {
                    self.scan_tokens(group.stream());
                    index += 1;
                }
                TokenTree::Ident(ident) => {
                    let line = ident.span().start().line;
                    let leading_colon = index >= 2
                        && is_path_sep(&trees[index - 2], &trees[index - 1])
                        && !(index >= 3 && matches!(trees[index - 3], TokenTree::Ident(_)));
                    let mut segments = vec![ident.to_string()];
                    let mut next = index + 1;
                    while next + 1 < trees.len() && is_path_sep(&trees[next], &trees[next + 1]) {
                        match trees.get(next + 2) {
                            Some(TokenTree::Ident(segment)) => {
                                segments.push(segment.to_string());
                                next += 3;
                            }
                            _ => break,
                        }
                    }
                    if segments.len() > 1 || leading_colon {
                        self.references.push(Reference {
                            segments,
                            leading_colon,
                            line,
                        });
                    }
                    index = next.max(index + 1);
                }
                _ => index += 1,
            }
        }
    }
}

fn is_path_sep(a: &TokenTree, b: &TokenTree) -> bool {
    matches!((a, b), (TokenTree::Punct(p), TokenTree::Punct(q))
        if p.as_char() == ':' && q.as_char() == ':' && p.spacing() == proc_macro2::Spacing::Joint)
}

impl Collector {
    /// `<T as Trait>::item` names T and Trait, not a crate called `item`.
    fn visit_qualified<'ast>(&mut self, qself: Option<&'ast syn::QSelf>, path: &'ast syn::Path) {
        match qself {
            Some(qself) => {
                self.visit_qself(qself);
                // With `as Trait`, the leading segments are the trait's path.
                if qself.position > 0 {
                    let segments: Vec<String> = path
                        .segments
                        .iter()
                        .take(qself.position)
                        .map(|s| s.ident.to_string())
                        .collect();
                    let line = path
                        .segments
                        .first()
                        .map(|s| s.ident.span().start().line)
                        .unwrap_or(0);
                    if segments.len() > 1 || path.leading_colon.is_some() {
                        self.references.push(Reference {
                            segments,
                            leading_colon: path.leading_colon.is_some(),
                            line,
                        });
                    }
                }
                for segment in &path.segments {
                    self.visit_path_arguments(&segment.arguments);
                }
            }
            None => self.visit_path(path),
        }
    }
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.segments.len() > 1 || path.leading_colon.is_some() {
            let line = path
                .segments
                .first()
                .map(|s| s.ident.span().start().line)
                .unwrap_or(0);
            self.references.push(Reference {
                segments: path.segments.iter().map(|s| s.ident.to_string()).collect(),
                leading_colon: path.leading_colon.is_some(),
                line,
            });
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_expr_path(&mut self, node: &'ast syn::ExprPath) {
        self.visit_qualified(node.qself.as_ref(), &node.path);
    }

    fn visit_type_path(&mut self, node: &'ast syn::TypePath) {
        self.visit_qualified(node.qself.as_ref(), &node.path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        self.scan_tokens(mac.tokens.clone());
    }

    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {
        // Nested modules are walked as modules of their own.
    }

    fn visit_item_use(&mut self, item_use: &'ast syn::ItemUse) {
        // A `use` inside a block: every name it brings in is an edge.
        let mut scratch = Module::default();
        let line = item_use.use_token.span.start().line;
        flatten_use(
            &item_use.tree,
            Vec::new(),
            item_use.leading_colon.is_some(),
            line,
            &mut scratch,
        );
        self.references.extend(
            scratch
                .aliases
                .into_values()
                .chain(scratch.globs)
                .chain(scratch.references),
        );
    }
}

fn written(reference: &Reference) -> String {
    let joined = reference.segments.join("::");
    if reference.leading_colon {
        format!("::{joined}")
    } else {
        joined
    }
}

/// The boundary-table row a module belongs to.
fn layer(path: &[String]) -> String {
    match path {
        [] => "crate".to_owned(),
        [adapters, adapter, ..] if adapters == "adapters" => format!("adapters::{adapter}"),
        [top, ..] => top.clone(),
    }
}

/// Whether `from` may reach `node`; `Some(description)` when it may not.
fn forbidden(from: &str, node: &Node) -> Option<String> {
    match node {
        Node::Module(path) => {
            let to = layer(path);
            if module_edge_allowed(from, &to) {
                None
            } else {
                Some(to)
            }
        }
        Node::Crate(name) => {
            let name = name.as_str();
            if from == "domain" && !DOMAIN_CRATES.contains(&name) {
                return Some(format!("crate {name}"));
            }
            for (owned, owners) in OWNED_CRATES {
                if name == *owned && !owners.contains(&from) {
                    return Some(format!("crate {name}"));
                }
            }
            None
        }
    }
}

/// ARCHITECTURE.md §3's table, plus `config` (domain only: its rules must be
/// the ones the control API applies later) and the crate root, which only
/// declares modules.
fn module_edge_allowed(from: &str, to: &str) -> bool {
    if from == to || to == "crate" {
        return true;
    }
    let adapter = from.starts_with("adapters::");
    match from {
        "app" | "crate" => true,
        "domain" => false,
        "ports" => to == "domain",
        "pipeline" | "builtin" | "config" => {
            matches!(to, "ports" | "domain") && !(from == "config" && to == "ports")
        }
        // The API opens and closes turns through the bridge; the bridge never
        // uses the API. Every listener shares the edge's HTTP plumbing.
        "api" => matches!(to, "pipeline" | "ports" | "domain" | "bridge" | "edge"),
        "bridge" | "front" | "console" => {
            matches!(to, "pipeline" | "ports" | "domain" | "edge")
        }
        "edge" => matches!(to, "pipeline" | "ports" | "domain"),
        "adapters" => false,
        _ if adapter => matches!(to, "ports" | "domain"),
        // A module outside the table may use nothing until it has a row.
        _ => false,
    }
}

/// The walker's own tests, on throwaway crates: each forbidden shape is found.
mod walker {
    use super::*;

    /// Writes a throwaway crate and walks it.
    fn walk(files: &[(&str, &str)], externs: &[&str]) -> Vec<Violation> {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let full = dir.path().join(path);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(full, text).unwrap();
        }
        let externs = externs
            .iter()
            .map(|s| s.to_string())
            .chain(["std".to_string()])
            .collect();
        Crate::load(&dir.path().join("lib.rs"), externs)
            .unwrap()
            .violations()
    }

    const LIB: &str = "pub mod domain; pub mod ports; pub mod pipeline; pub mod adapters; pub mod api; pub mod app;";
    const ADAPTERS: &str = "pub mod mcp; pub mod store;";

    fn tree<'a>(overrides: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut files: BTreeMap<&str, &str> = [
            ("lib.rs", LIB),
            ("domain/mod.rs", "pub struct Spec;"),
            ("ports/mod.rs", "use crate::domain::Spec; pub trait Tool { fn spec(&self) -> &Spec; }"),
            ("pipeline/mod.rs", "use crate::ports::Tool; pub fn run(_: &dyn Tool) {}"),
            ("adapters/mod.rs", ADAPTERS),
            ("adapters/mcp.rs", "use rmcp::model::Tool as Remote; pub struct Client(pub Remote);"),
            ("adapters/store.rs", "pub struct Store;"),
            ("api/mod.rs", "pub fn serve() { crate::pipeline::run(todo()); } fn todo() -> &'static dyn crate::ports::Tool { loop {} }"),
            ("app.rs", "use crate::adapters::mcp::Client; pub fn wire(_: Client) {}"),
        ]
        .into_iter()
        .collect();
        files.extend(overrides.iter().copied());
        files.into_iter().collect()
    }

    #[test]
    fn a_clean_tree_has_no_violations() {
        assert_eq!(walk(&tree(&[]), &["rmcp"]), vec![]);
    }

    #[test]
    fn a_direct_forbidden_use_is_found() {
        let found = walk(
            &tree(&[(
                "domain/mod.rs",
                "use crate::pipeline::run; pub struct Spec;",
            )]),
            &["rmcp"],
        );
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            (found[0].from.as_str(), found[0].to.as_str()),
            ("domain", "pipeline")
        );
    }

    #[test]
    fn a_path_in_an_expression_is_found() {
        let pipeline = "use crate::ports::Tool; pub fn run(_: &dyn Tool) { let _ = super::adapters::store::Store; }";
        let found = walk(&tree(&[("pipeline/mod.rs", pipeline)]), &["rmcp"]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].to, "adapters::store");
        assert_eq!(found[0].via, "super::adapters::store::Store");
    }

    #[test]
    fn rmcp_through_a_helper_re_export_is_found() {
        // The helper in adapters::mcp re-exports an rmcp item; app names it
        // through the helper. app may use adapters, but not rmcp.
        let mcp = "pub use rmcp::model::Tool as Remote; pub struct Client(pub Remote);";
        let app = "pub fn wire() -> Option<crate::adapters::mcp::Remote> { None }";
        let found = walk(
            &tree(&[("adapters/mcp.rs", mcp), ("app.rs", app)]),
            &["rmcp"],
        );
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            (found[0].from.as_str(), found[0].to.as_str()),
            ("app", "crate rmcp")
        );
    }

    #[test]
    fn a_chain_of_re_exports_is_followed() {
        // api -> domain::helper (allowed) -> re-export of adapters::store.
        let domain = "pub mod helper; pub struct Spec;";
        let helper = "pub use crate::adapters::store::Store as Handy;";
        let api = "use crate::domain::helper::Handy; pub fn serve(_: Handy) {}";
        let found = walk(
            &tree(&[
                ("domain/mod.rs", domain),
                ("domain/helper.rs", helper),
                ("api/mod.rs", api),
            ]),
            &["rmcp"],
        );
        let edges: BTreeSet<(String, String)> = found
            .iter()
            .map(|v| (v.from.clone(), v.to.clone()))
            .collect();
        assert!(
            edges.contains(&("domain".into(), "adapters::store".into())),
            "{found:?}"
        );
        assert!(
            edges.contains(&("api".into(), "adapters::store".into())),
            "{found:?}"
        );
    }

    #[test]
    fn a_glob_re_export_is_followed() {
        let ports = "pub use crate::adapters::store::*; pub trait Tool {}";
        let pipeline = "pub fn run() { let _ = crate::ports::Store; }";
        let found = walk(
            &tree(&[("ports/mod.rs", ports), ("pipeline/mod.rs", pipeline)]),
            &["rmcp"],
        );
        let edges: BTreeSet<(String, String)> = found
            .iter()
            .map(|v| (v.from.clone(), v.to.clone()))
            .collect();
        assert!(
            edges.contains(&("pipeline".into(), "adapters::store".into())),
            "{found:?}"
        );
    }

    #[test]
    fn paths_inside_macros_are_found() {
        let api = "pub fn serve() { let _ = vec![rmcp::model::Tool::default()]; }";
        let found = walk(&tree(&[("api/mod.rs", api)]), &["rmcp"]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].to, "crate rmcp");
    }

    #[test]
    fn an_adapter_may_not_use_another() {
        let store = "pub struct Store(pub super::mcp::Client);";
        let found = walk(&tree(&[("adapters/store.rs", store)]), &["rmcp"]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            (found[0].from.as_str(), found[0].to.as_str()),
            ("adapters::store", "adapters::mcp")
        );
    }

    #[test]
    fn domain_may_name_only_its_crates() {
        let found = walk(
            &tree(&[(
                "domain/mod.rs",
                "pub struct Spec(pub tokio::sync::Mutex<()>);",
            )]),
            &["rmcp", "tokio"],
        );
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].to, "crate tokio");
    }

    #[test]
    fn the_bridge_may_not_use_the_api_nor_an_adapter() {
        let lib = "pub mod domain; pub mod ports; pub mod pipeline; pub mod adapters; pub mod api; pub mod bridge; pub mod app;";
        let bridge = "pub fn open() { crate::api::serve(); } pub fn dial(_: crate::adapters::store::Store) {}";
        let api = "pub fn serve() { crate::bridge::open(); }";
        let found = walk(
            &tree(&[
                ("lib.rs", lib),
                ("bridge/mod.rs", bridge),
                ("api/mod.rs", api),
            ]),
            &["rmcp"],
        );
        let edges: BTreeSet<(String, String)> = found
            .iter()
            .map(|v| (v.from.clone(), v.to.clone()))
            .collect();
        assert_eq!(
            edges,
            [
                ("bridge".to_owned(), "adapters::store".to_owned()),
                ("bridge".to_owned(), "api".to_owned()),
            ]
            .into(),
            "api -> bridge is allowed; bridge -> api and bridge -> adapters are not: {found:?}"
        );
    }

    #[test]
    fn a_module_outside_the_table_is_refused() {
        let lib = "pub mod domain; pub mod ports; pub mod pipeline; pub mod adapters; pub mod api; pub mod app; pub mod util;";
        let found = walk(
            &tree(&[
                ("lib.rs", lib),
                ("util.rs", "pub fn f(_: crate::domain::Spec) {}"),
            ]),
            &["rmcp"],
        );
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].from, "util");
    }
}

/// The real tree.
fn walk_this_crate() -> Vec<Violation> {
    let package = Path::new(env!("CARGO_MANIFEST_DIR"));
    Crate::load_package(package)
        .expect("the crate parses")
        .violations()
}

#[test]
fn gate_06_import_boundary_walk_passes() {
    let violations = walk_this_crate();
    let listed: Vec<String> = violations.iter().map(ToString::to_string).collect();
    assert!(
        violations.is_empty(),
        "forbidden edges:\n{}",
        listed.join("\n")
    );
}

#[test]
fn gate_13_no_rmcp_item_outside_adapters_mcp() {
    let rmcp: Vec<String> = walk_this_crate()
        .into_iter()
        .filter(|violation| violation.to == "crate rmcp")
        .map(|violation| violation.to_string())
        .collect();
    assert!(
        rmcp.is_empty(),
        "rmcp named outside adapters::mcp:\n{}",
        rmcp.join("\n")
    );
}

/// Every outbound TCP connection is egress's: no other file of the crate
/// opens one (the listeners of the edges accept, they do not dial).
#[test]
fn only_egress_dials_out() {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut pending = vec![source.clone()];
    let mut dialling = Vec::new();
    while let Some(folder) = pending.pop() {
        for entry in std::fs::read_dir(&folder).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            // Egress dials for tenants and servers; the trace exporter
            // dials the operator's own collector, named in the file; the
            // stdio relay, a client command run apart from `serve`, dials
            // the front door its user names.
            let own = path.starts_with(source.join("adapters/egress"))
                || path == source.join("adapters/telemetry/otlp.rs")
                || path == source.join("front/relay.rs");
            if !own
                && [
                    "TcpStream::connect",
                    "TcpSocket",
                    "lookup_host",
                    "ToSocketAddrs",
                ]
                .iter()
                .any(|dial| text.contains(dial))
            {
                dialling.push(path.display().to_string());
            }
        }
    }
    assert!(
        dialling.is_empty(),
        "dials outside adapters::egress: {dialling:?}"
    );
}

/// The sibling files of `src/bridge/` each name the ones they use through
/// `super::`; no two name each other (the request's route and a call's run
/// once did, through the refusal they shared).
#[test]
fn no_two_files_of_the_bridge_import_each_other() {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/bridge");
    let siblings: Vec<String> = std::fs::read_dir(&folder)
        .unwrap()
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            let stem = name.strip_suffix(".rs")?;
            (stem != "mod").then(|| stem.to_owned())
        })
        .collect();
    let uses = |file: &str| -> BTreeSet<String> {
        let text = std::fs::read_to_string(folder.join(format!("{file}.rs"))).unwrap();
        let mut named = BTreeSet::new();
        for (index, _) in text.match_indices("super::") {
            let rest = &text[index + "super::".len()..];
            let names = match rest.strip_prefix('{') {
                Some(group) => group.split('}').next().unwrap_or_default(),
                None => rest
                    .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .next()
                    .unwrap_or_default(),
            };
            for name in names.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
                if siblings.iter().any(|sibling| sibling == name) {
                    named.insert(name.to_owned());
                }
            }
        }
        named
    };
    let mut circles = Vec::new();
    for a in &siblings {
        for b in uses(a) {
            if a < &b && uses(&b).contains(a) {
                circles.push(format!("{a} <-> {b}"));
            }
        }
    }
    assert!(circles.is_empty(), "{circles:?}");
}
