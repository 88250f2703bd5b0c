//! The workspace's shape, as DESIGN §1 states it: dependencies point one way, the std-only
//! crates stay std-only, a channel user compiles no server side, and the balancer's
//! modules import one another without a circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The names in a manifest's `[dependencies]` table (not dev or build dependencies).
fn dependencies(krate: &str) -> BTreeSet<String> {
    let manifest = std::fs::read_to_string(workspace().join(krate).join("Cargo.toml")).unwrap();
    let mut in_table = false;
    let mut names = BTreeSet::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_table = line == "[dependencies]";
        } else if in_table && !line.is_empty() && !line.starts_with('#') {
            let name = line.split(['=', '.', ' ']).next().unwrap();
            names.insert(name.to_owned());
        }
    }
    names
}

#[test]
fn the_model_and_assigner_crates_depend_on_std_and_the_model_only() {
    assert_eq!(dependencies("subset"), BTreeSet::new());
    let slice = dependencies("slice");
    let allowed: BTreeSet<String> = ["xxhash-rust", "serde"].map(String::from).into();
    assert!(slice.is_subset(&allowed), "steady-slice depends on {slice:?}");
    // The assigner is plain computation over the model: no runtime, no RPC, no store.
    let assigner = dependencies("assigner");
    let allowed: BTreeSet<String> = ["steady-slice"].map(String::from).into();
    assert!(assigner.is_subset(&allowed), "steady-assigner depends on {assigner:?}");
}

#[test]
fn the_test_support_crate_is_std_only_and_the_etcd_client_is_an_optional_feature_of_the_slicer() {
    // steady-testing starts etcd as a process and asks it over plain HTTP: any crate's
    // tests can use it without compiling an etcd client.
    assert_eq!(dependencies("testing"), BTreeSet::new());
    let manifest = std::fs::read_to_string(workspace().join("slicer/Cargo.toml")).unwrap();
    let etcd = manifest.lines().find(|l| l.starts_with("etcd-client")).expect("slicer uses etcd-client");
    assert!(etcd.contains("optional = true"), "etcd-client must stay optional: {etcd}");
    assert!(
        manifest.contains("etcd = [\"dep:etcd-client\", \"dep:steady-etcd\"]"),
        "the `etcd` feature brings etcd-client"
    );
}

#[test]
fn the_client_crates_never_depend_on_the_server_side() {
    for krate in ["balance", "tonic-integration", "slice"] {
        let deps = dependencies(krate);
        for server in ["steady-slicer", "steady-assigner", "steady-discovery", "etcd-client"] {
            assert!(!deps.contains(server), "{krate} depends on {server}");
        }
    }
    assert!(!dependencies("balance").contains("tonic"), "the tower balancer must not need tonic");
}

/// Every `crate::a::b` or `super::x` path in a module, resolved to the longest module
/// of `modules` it names (test modules left out).
fn imports(module: &str, source: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let source = source.split("#[cfg(test)]\nmod tests").next().unwrap();
    let parent: Vec<&str> = module.split("::").filter(|s| !s.is_empty()).collect();
    let mut out = BTreeSet::new();
    for (at, _) in source.match_indices("crate::").chain(source.match_indices("super::")) {
        let path: String =
            source[at..].chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
        let mut segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
        if segments[0] == "super" {
            segments = parent[..parent.len().saturating_sub(1)]
                .iter()
                .copied()
                .chain(segments[1..].iter().copied())
                .collect();
        } else {
            segments.remove(0);
        }
        let target =
            (1..=segments.len()).rev().map(|k| segments[..k].join("::")).find(|m| modules.contains(m));
        if let Some(target) = target.filter(|t| t != module) {
            out.insert(target);
        }
    }
    out
}

#[test]
fn the_balancer_modules_import_one_another_without_a_circle() {
    let root = workspace().join("balance/src");
    let mut sources = BTreeMap::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let relative = path.strip_prefix(&root).unwrap().with_extension("");
            let mut segments: Vec<String> =
                relative.iter().map(|s| s.to_string_lossy().into_owned()).collect();
            if matches!(segments.last().map(String::as_str), Some("mod" | "lib")) {
                segments.pop();
            }
            sources.insert(segments.join("::"), std::fs::read_to_string(&path).unwrap());
        }
    }
    assert!(sources.contains_key("route::table") && sources.contains_key("control"), "{:?}", sources.keys());
    let modules: BTreeSet<String> = sources.keys().cloned().collect();
    let graph: BTreeMap<&str, BTreeSet<String>> =
        sources.iter().map(|(m, s)| (m.as_str(), imports(m, s, &modules))).collect();
    // Depth-first search for a back edge; a parent declaring its children is not an import.
    fn visit<'a>(
        m: &'a str,
        graph: &'a BTreeMap<&str, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) {
        if done.contains(m) {
            return;
        }
        if let Some(at) = path.iter().position(|p| *p == m) {
            panic!("import circle: {}", path[at..].join(" -> ") + " -> " + m);
        }
        path.push(m);
        for next in &graph[m] {
            let nested = next.starts_with(&format!("{m}::")) || m.is_empty();
            if !nested {
                visit(next, graph, path, done);
            }
        }
        path.pop();
        done.insert(m);
    }
    let mut done = BTreeSet::new();
    for m in graph.keys() {
        visit(m, &graph, &mut Vec::new(), &mut done);
    }
    // The two halves: the request side never reaches into the control task.
    for (m, targets) in &graph {
        if m.starts_with("route") {
            assert!(targets.iter().all(|t| !t.starts_with("control")), "{m} imports {targets:?}");
        }
    }
}

#[test]
fn discovery_feeds_the_balancer_and_needs_neither_tonic_nor_the_server_side() {
    // Job views and identities are plain data for the balancer: a discovery source must
    // not pull in the channel, the RPC stack or the slicer; its clients are optional.
    let discovery = dependencies("discovery");
    for forbidden in ["tonic", "steady-tonic", "steady-slicer", "steady-assigner"] {
        assert!(!discovery.contains(forbidden), "steady-discovery depends on {forbidden}");
    }
    let manifest = std::fs::read_to_string(workspace().join("discovery/Cargo.toml")).unwrap();
    for client in ["etcd-client", "hickory-resolver"] {
        let line = manifest.lines().find(|l| l.starts_with(client)).unwrap_or_else(|| panic!("no {client}"));
        assert!(line.contains("optional = true"), "{client} must stay optional: {line}");
    }
}

#[test]
fn the_shared_etcd_crate_needs_only_the_etcd_client_and_tokio_and_is_optional_for_its_users() {
    let deps = dependencies("etcd");
    let allowed: BTreeSet<String> = ["etcd-client", "tokio", "tracing"].map(String::from).into();
    assert!(deps.is_subset(&allowed), "steady-etcd depends on {deps:?}");
    for user in ["slicer", "discovery"] {
        let manifest = std::fs::read_to_string(workspace().join(user).join("Cargo.toml")).unwrap();
        let line =
            manifest.lines().find(|l| l.starts_with("steady-etcd")).unwrap_or_else(|| panic!("{user}"));
        assert!(line.contains("optional = true"), "{user}: steady-etcd must stay optional: {line}");
    }
}
