//! The workspace's shape, as `docs/layout.md` states it: dependencies point one way, the std-only
//! crates stay std-only, each kind of user compiles only their part (a channel user no
//! server side, a backend's Slicelet no etcd client, CLI or assigner), the shared types
//! sit below the balancer, and no crate's modules import one another in a circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The names in a manifest's `[dependencies]` table (not dev or build dependencies).
fn dependencies(krate: &str) -> BTreeSet<String> {
    table(krate, "[dependencies]").into_keys().collect()
}

/// Each dependency in the manifest table `name` (`"[dependencies]"`,
/// `"[build-dependencies]"`...) of `krate`, with its line.
fn table(krate: &str, name: &str) -> BTreeMap<String, String> {
    let manifest = std::fs::read_to_string(workspace().join(krate).join("Cargo.toml")).unwrap();
    let mut in_table = false;
    let mut lines = BTreeMap::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_table = line == name;
        } else if in_table && !line.is_empty() && !line.starts_with('#') {
            let dependency = line.split(['=', '.', ' ']).next().unwrap();
            lines.insert(dependency.to_owned(), line.to_owned());
        }
    }
    lines
}

#[test]
fn the_model_and_assigner_crates_depend_on_std_and_the_model_only() {
    assert_eq!(dependencies("subset"), BTreeSet::new());
    let slice = dependencies("slice");
    let allowed: BTreeSet<String> = ["xxhash-rust", "serde"].map(String::from).into();
    assert!(slice.is_subset(&allowed), "steady-slice depends on {slice:?}");
    // The assigner is plain computation over the model: no runtime, no RPC, no store; serde
    // only as an option, for reading a job spec.
    let assigner = dependencies("assigner");
    let allowed: BTreeSet<String> = ["steady-slice", "serde"].map(String::from).into();
    assert!(assigner.is_subset(&allowed), "steady-assigner depends on {assigner:?}");
    let serde = table("assigner", "[dependencies]").remove("serde").unwrap_or_default();
    assert!(
        serde.is_empty() || serde.contains("optional = true"),
        "steady-assigner: serde must stay optional"
    );
}

#[test]
fn the_test_support_crate_is_std_only_by_default_and_the_etcd_client_is_an_optional_feature_of_the_slicer() {
    // steady-testing starts etcd as a process and asks it over plain HTTP: any crate's
    // tests can use it without compiling an etcd client. Every dependency it has (the
    // certificate maker, tokio, tonic and the protobuf code generator, rustix's clock) is
    // optional, behind its `tls`, `tokio`, `grpc`, `proxy` and `clock` features.
    for kind in ["[dependencies]", "[build-dependencies]"] {
        for (name, line) in table("testing", kind) {
            assert!(line.contains("optional = true"), "steady-testing: {name} must stay optional: {line}");
        }
    }
    assert!(dependencies("testing").contains("rcgen"), "the `tls` feature's certificates");
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
    for krate in ["balance", "tonic", "slice", "core", "proto"] {
        let deps = dependencies(krate);
        for server in
            ["steady-slicer", "steady-slicelet", "steady-assigner", "steady-discovery", "etcd-client"]
        {
            assert!(!deps.contains(server), "{krate} depends on {server}");
        }
    }
    assert!(!dependencies("balance").contains("tonic"), "the tower balancer must not need tonic");
}

#[test]
fn the_shared_types_sit_below_the_balancer_and_no_server_side_or_discovery_crate_depends_on_it() {
    // Membership views, backoff and configuration errors: std and the frozen PRNG only,
    // and the OpenTelemetry API behind the optional `metrics` feature.
    let core = dependencies("core");
    let allowed: BTreeSet<String> = ["steady-subset", "opentelemetry"].map(String::from).into();
    assert!(core.is_subset(&allowed), "steady-core depends on {core:?}");
    let manifest = std::fs::read_to_string(workspace().join("core/Cargo.toml")).unwrap();
    let otel = manifest.lines().find(|l| l.starts_with("opentelemetry")).expect("the metrics feature's API");
    assert!(otel.contains("optional = true"), "the OpenTelemetry API must stay optional: {otel}");
    // The protocol, the Slicelet, the control plane and discovery share what they need
    // through steady-core and steady-proto, never through the client balancer or channel.
    for krate in ["core", "proto", "slicelet", "slicer", "slicer-server", "discovery"] {
        let deps = dependencies(krate);
        for client in ["steady-balance", "steady-tonic"] {
            assert!(!deps.contains(client), "{krate} depends on {client}");
        }
    }
}

/// The packages in `package`'s normal dependency tree with its default features, as
/// cargo resolves it (`cargo tree -e normal`), so transitive dependencies count too.
fn normal_tree(package: &str) -> BTreeSet<String> {
    let output = Command::new(env!("CARGO"))
        .current_dir(workspace())
        .args(["tree", "--offline", "-e", "normal", "--prefix", "none", "--format", "{p}", "-p", package])
        .output()
        .expect("cargo runs");
    assert!(output.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(String::from)
        .collect()
}

/// Without features: a backend of an exclusive job turns on `exclusive`, which brings an
/// etcd client (its Slicelet talks to etcd itself, as Slicer's talk to their lock
/// service); every other backend compiles none.
#[test]
fn a_backend_that_adds_the_slicelet_compiles_no_etcd_client_cli_assigner_or_client_balancer() {
    let manifest = std::fs::read_to_string(workspace().join("slicelet/Cargo.toml")).unwrap();
    assert!(
        manifest.contains("exclusive = [\"dep:etcd-client\"]"),
        "the etcd client is the `exclusive` feature's"
    );
    let tree = normal_tree("steady-slicelet");
    assert!(tree.contains("tonic") && tree.contains("steady-proto"), "{tree:?}");
    for unwanted in [
        "etcd-client",
        "steady-etcd",
        "clap",
        "steady-assigner",
        "steady-slicer",
        "steady-balance",
        "steady-tonic",
        "steady-discovery",
    ] {
        assert!(!tree.contains(unwanted), "steady-slicelet's dependency tree holds {unwanted}");
    }
}

#[test]
fn a_client_that_adds_the_channel_compiles_no_server_side_etcd_client_or_cli() {
    let tree = normal_tree("steady-tonic");
    assert!(tree.contains("steady-balance"), "{tree:?}");
    for unwanted in ["etcd-client", "clap", "steady-assigner", "steady-slicer", "steady-slicelet"] {
        assert!(!tree.contains(unwanted), "steady-tonic's dependency tree holds {unwanted}");
    }
}

#[test]
fn the_control_plane_is_a_library_and_its_binary_a_crate_apart() {
    // steady-slicer is what a program embedding the control plane links: no binary, no
    // command-line parser, no HTTP server or metrics SDK of its own.
    let slicer = dependencies("slicer");
    for unwanted in ["clap", "hyper", "hyper-util", "http-body-util", "opentelemetry_sdk", "steady-discovery"]
    {
        assert!(!slicer.contains(unwanted), "steady-slicer depends on {unwanted}");
    }
    let manifest = std::fs::read_to_string(workspace().join("slicer/Cargo.toml")).unwrap();
    assert!(!manifest.contains("[[bin]]"), "steady-slicer declares a binary");
    assert!(!workspace().join("slicer/src/bin").exists(), "steady-slicer has src/bin");
    assert!(manifest.contains("default = [\"etcd\", \"assigner\"]"), "steady-slicer's default features");
    let tree = normal_tree("steady-slicer");
    for unwanted in ["clap", "opentelemetry_sdk", "steady-discovery", "steady-slicer-server"] {
        assert!(!tree.contains(unwanted), "steady-slicer's dependency tree holds {unwanted}");
    }
    // The operator's binary keeps its name, in steady-slicer-server.
    let server = std::fs::read_to_string(workspace().join("slicer-server/Cargo.toml")).unwrap();
    assert!(server.contains("[[bin]]\nname = \"steady-slicer\""), "steady-slicer-server's binary");
    assert!(workspace().join("slicer-server/src/bin/steady-slicer.rs").is_file());
    // No library depends on the binary's crate (the lab, a tool, may).
    for member in members() {
        if member != "slicer-server" && !UNPUBLISHED.contains(&member.as_str()) {
            let deps = dependencies(&member);
            assert!(!deps.contains("steady-slicer-server"), "{member} depends on steady-slicer-server");
        }
    }
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

/// The workspace's members, from the root manifest's `members` list.
fn members() -> Vec<String> {
    let manifest = std::fs::read_to_string(workspace().join("Cargo.toml")).unwrap();
    let list = manifest.split("members = [").nth(1).unwrap().split(']').next().unwrap();
    list.split(',').map(|m| m.trim().trim_matches('"').to_owned()).filter(|m| !m.is_empty()).collect()
}

/// Each module of the crate whose sources are under `root` (binaries' own crates under
/// `src/bin` left out), by path (`""` the crate root), with its source.
fn modules_of(root: &Path) -> BTreeMap<String, String> {
    let mut sources = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path != root.join("bin") {
                    stack.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(root).unwrap().with_extension("");
            let mut segments: Vec<String> =
                relative.iter().map(|s| s.to_string_lossy().into_owned()).collect();
            if matches!(segments.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                segments.pop();
            }
            sources.insert(segments.join("::"), std::fs::read_to_string(&path).unwrap());
        }
    }
    sources
}

/// The import graph of a crate's modules, and the first circle in it if there is one.
fn import_graph(root: &Path) -> (BTreeMap<String, BTreeSet<String>>, Option<String>) {
    let sources = modules_of(root);
    let modules: BTreeSet<String> = sources.keys().cloned().collect();
    let graph: BTreeMap<String, BTreeSet<String>> =
        sources.iter().map(|(m, s)| (m.clone(), imports(m, s, &modules))).collect();
    // Depth-first search for a back edge; a parent declaring its children is not an import.
    fn visit<'a>(
        m: &'a str,
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<String> {
        if done.contains(m) {
            return None;
        }
        if let Some(at) = path.iter().position(|p| *p == m) {
            return Some(path[at..].join(" -> ") + " -> " + m);
        }
        path.push(m);
        for next in &graph[m] {
            let nested = next.starts_with(&format!("{m}::")) || m.is_empty();
            if !nested {
                if let Some(circle) = visit(next, graph, path, done) {
                    return Some(circle);
                }
            }
        }
        path.pop();
        done.insert(m);
        None
    }
    let mut done = BTreeSet::new();
    let circle = graph.keys().find_map(|m| visit(m, &graph, &mut Vec::new(), &mut done));
    (graph, circle)
}

#[test]
fn no_crate_s_modules_import_one_another_in_a_circle() {
    let members = members();
    assert!(members.len() >= 12 && members.contains(&"slicer".to_owned()), "{members:?}");
    let mut checked = 0;
    let mut circles = Vec::new();
    for member in &members {
        let root = workspace().join(member).join("src");
        if root.is_dir() {
            if let (_, Some(circle)) = import_graph(&root) {
                circles.push(format!("{member}: {circle}"));
            }
            checked += 1;
        }
    }
    assert!(checked >= 12, "only {checked} crates checked");
    assert!(circles.is_empty(), "import circles:\n{}", circles.join("\n"));
}

#[test]
fn the_circle_check_finds_a_circle_between_two_modules() {
    let dir = std::env::temp_dir().join(format!("steady-layout-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("store")).unwrap();
    std::fs::write(dir.join("lib.rs"), "mod store;\n").unwrap();
    std::fs::write(dir.join("store/mod.rs"), "mod a;\nmod b;\n").unwrap();
    std::fs::write(dir.join("store/a.rs"), "use super::b::B;\npub struct A;\n").unwrap();
    std::fs::write(dir.join("store/b.rs"), "use crate::store::a::A;\npub struct B;\n").unwrap();
    let (_, circle) = import_graph(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    let circle = circle.expect("a imports b and b imports a");
    assert!(circle.contains("store::a") && circle.contains("store::b"), "{circle}");
}

#[test]
fn the_balancer_s_request_side_never_reaches_into_the_control_task() {
    let (graph, _) = import_graph(&workspace().join("balance/src"));
    assert!(graph.contains_key("route::table") && graph.contains_key("control"), "{:?}", graph.keys());
    for (m, targets) in &graph {
        if m.starts_with("route") {
            assert!(targets.iter().all(|t| !t.starts_with("control")), "{m} imports {targets:?}");
        }
    }
}

#[test]
fn rudolph_s_mode_is_a_client_crate_of_its_own_with_no_control_plane() {
    // A frontend that assigns its keys itself links the balancer and the assigner (std
    // only), never the server side, a store, discovery or the RPC stack; and the client
    // crates do not link it.
    let local = dependencies("local");
    for needed in ["steady-balance", "steady-assigner"] {
        assert!(local.contains(needed), "steady-local does not depend on {needed}");
    }
    for forbidden in
        ["steady-slicer", "steady-slicelet", "steady-discovery", "etcd-client", "tonic", "steady-tonic"]
    {
        assert!(!local.contains(forbidden), "steady-local depends on {forbidden}");
    }
    for krate in ["balance", "tonic"] {
        assert!(!dependencies(krate).contains("steady-local"), "{krate} depends on steady-local");
    }
}

#[test]
fn discovery_feeds_the_balancer_and_needs_neither_tonic_nor_the_server_side() {
    // Job views and identities are plain data for the balancer: a discovery source must
    // not pull in the balancer, the channel, the RPC stack or the slicer; its clients are
    // optional.
    let discovery = dependencies("discovery");
    for forbidden in
        ["tonic", "steady-balance", "steady-tonic", "steady-slicer", "steady-slicelet", "steady-assigner"]
    {
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
    // tonic: the one etcd-client speaks, named directly for a TLS handshake of steady's
    // own that says why a connection failed (the client itself only times out). tower:
    // the service trait of the channel over the cluster's members that etcd-client calls
    // through (already in the tree under tonic and etcd-client).
    let allowed: BTreeSet<String> =
        ["etcd-client", "tonic", "tokio", "tower", "tracing"].map(String::from).into();
    assert!(deps.is_subset(&allowed), "steady-etcd depends on {deps:?}");
    for user in ["slicer", "discovery"] {
        let manifest = std::fs::read_to_string(workspace().join(user).join("Cargo.toml")).unwrap();
        let line =
            manifest.lines().find(|l| l.starts_with("steady-etcd")).unwrap_or_else(|| panic!("{user}"));
        assert!(line.contains("optional = true"), "{user}: steady-etcd must stay optional: {line}");
    }
}

/// The value of `key` in a manifest's `[package]` table, as written (`None` if absent).
fn package_field(manifest: &str, key: &str) -> Option<String> {
    let package = manifest.split("\n[").next().unwrap_or_default();
    package.lines().find_map(|line| {
        let (name, value) = line.split_once('=')?;
        (name.trim() == key).then(|| value.trim().to_owned())
    })
}

/// The crates that are not published: tools, benchmarks, tests, examples and test support.
const UNPUBLISHED: [&str; 5] = ["lab", "benches", "tests", "examples", "testing"];

#[test]
fn every_library_crate_carries_what_crates_io_needs_and_only_tools_and_tests_stay_unpublished() {
    for member in members() {
        let manifest = std::fs::read_to_string(workspace().join(&member).join("Cargo.toml")).unwrap();
        let field = |key: &str| package_field(&manifest, key);
        // Every crate, published or not, builds with the workspace's rust-version.
        assert_eq!(field("rust-version.workspace").as_deref(), Some("true"), "{member}: rust-version");
        if UNPUBLISHED.contains(&member.as_str()) {
            assert_eq!(field("publish").as_deref(), Some("false"), "{member} must not be published");
            continue;
        }
        assert_eq!(field("publish"), None, "{member} is a library: it is published");
        for key in ["description", "license.workspace", "repository.workspace", "version.workspace"] {
            assert!(field(key).is_some(), "{member}: no {key}");
        }
        assert_eq!(field("readme").as_deref(), Some("\"README.md\""), "{member}: readme");
        let readme = std::fs::read_to_string(workspace().join(&member).join("README.md"))
            .unwrap_or_else(|e| panic!("{member}/README.md: {e}"));
        assert!(readme.starts_with(&format!("# {}", field("name").unwrap().trim_matches('"'))), "{member}");
        for license in ["LICENSE-MIT", "LICENSE-APACHE"] {
            assert!(workspace().join(&member).join(license).is_file(), "{member}: no {license}");
        }
        let list = |key: &str| -> Vec<String> {
            let value = field(key).unwrap_or_else(|| panic!("{member}: no {key}"));
            value.trim_matches(['[', ']']).split(',').map(|s| s.trim().trim_matches('"').to_owned()).collect()
        };
        let keywords = list("keywords");
        assert!((1..=5).contains(&keywords.len()), "{member}: 1 to 5 keywords: {keywords:?}");
        for keyword in &keywords {
            let valid = keyword.len() <= 20
                && keyword.starts_with(|c: char| c.is_ascii_alphabetic())
                && keyword.chars().all(|c| c.is_ascii_alphanumeric() || "-_+".contains(c));
            assert!(valid, "{member}: keyword {keyword:?}");
        }
        assert!((1..=5).contains(&list("categories").len()), "{member}: 1 to 5 categories");
    }
}

#[test]
fn the_published_crates_use_the_test_support_crate_only_in_their_tests() {
    // steady-testing is never published: a published crate that depended on it (for more
    // than its own tests) could not be packaged.
    for member in members() {
        if UNPUBLISHED.contains(&member.as_str()) {
            continue;
        }
        for kind in ["[dependencies]", "[build-dependencies]"] {
            assert!(
                !table(&member, kind).contains_key("steady-testing"),
                "{member}: steady-testing in {kind}"
            );
        }
    }
}

/// Every file under `dir`, recursively, in a stable order; build output and the folders of
/// git and of fuzzing runs left out.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    const SKIPPED: [&str; 5] = ["target", ".git", "corpus", "artifacts", "node_modules"];
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if !path.is_dir() {
                files.push(path);
            } else if !path.file_name().is_some_and(|n| SKIPPED.contains(&&*n.to_string_lossy())) {
                stack.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    files_under(dir).into_iter().filter(|path| path.extension().is_some_and(|e| e == "rs")).collect()
}

/// The names of the functions `source` defines (`fn name`), wherever they are.
fn functions(source: &str) -> BTreeSet<&str> {
    source
        .match_indices("fn ")
        .filter(|(at, _)| !source[..*at].ends_with(|c: char| c.is_alphanumeric() || c == '_'))
        .map(|(at, _)| {
            let rest = &source[at + 3..];
            &rest[..rest.find(|c: char| !c.is_alphanumeric() && c != '_').unwrap_or(rest.len())]
        })
        .collect()
}

#[test]
fn test_helpers_live_in_the_test_support_crate_only() {
    // One home for the bounded waits, the echo service and its loopback servers:
    // steady-testing. No other crate defines a wait of the same name again, compiles the
    // echo protocol, or borrows another crate's test module by path.
    let waits = [
        "eventually",
        "eventually_within",
        "eventually_blocking",
        "holds_within",
        "within",
        "wait_until",
        "poll_until",
    ];
    let mut found = Vec::new();
    let mut scanned = 0;
    for member in members().into_iter().filter(|m| m != "testing") {
        for file in rust_files(&workspace().join(&member)) {
            let source = std::fs::read_to_string(&file).unwrap();
            let name = file.strip_prefix(workspace()).unwrap().display().to_string();
            scanned += 1;
            for wait in functions(&source).into_iter().filter(|f| waits.contains(f)) {
                found.push(format!("{name}: fn {wait}"));
            }
            if source.contains("steady.echo.v1\")") {
                found.push(format!("{name}: compiles the echo protocol"));
            }
            if source.contains("#[path = \"../../") {
                found.push(format!("{name}: a test module of another crate"));
            }
        }
        if workspace().join(&member).join("proto/echo.proto").exists() {
            found.push(format!("{member}/proto/echo.proto"));
        }
    }
    assert!(scanned > 100, "only {scanned} files scanned");
    assert!(workspace().join("testing/proto/echo.proto").is_file(), "the echo protocol's home");
    assert!(found.is_empty(), "test helpers outside steady-testing:\n{}", found.join("\n"));
}

#[test]
fn the_helper_check_finds_a_wait_defined_again() {
    // Built so that this file does not define what it checks for.
    let source =
        ["/// Polls.\nasync f", "n eventually(what: &str) {}\nf", "n eventually_soon() {}\nlet defn within;"]
            .concat();
    assert_eq!(functions(&source), BTreeSet::from(["eventually", "eventually_soon"]));
}

#[test]
fn every_published_workspace_dependency_names_its_version() {
    let manifest = std::fs::read_to_string(workspace().join("Cargo.toml")).unwrap();
    let table = manifest.split("[workspace.package]").nth(1).expect("a [workspace.package] table");
    let version = package_field(table, "version").expect("the workspace's version");
    let paths: Vec<&str> =
        manifest.lines().filter(|l| l.starts_with("steady-") && l.contains("path =")).collect();
    assert!(paths.len() >= 12, "{paths:?}");
    for line in paths {
        if line.starts_with("steady-testing ") {
            // A dev-dependency only: without a version, packaging drops it.
            assert!(!line.contains("version"), "{line}");
        } else {
            assert!(line.contains(&format!("version = {version}")), "no version {version}: {line}");
        }
    }
}

/// Every text file of the repository that a reader or a build sees (sources, manifests,
/// docs, protos, scripts), by path relative to the workspace, with its text.
fn repository_texts() -> Vec<(String, String)> {
    const EXTENSIONS: [&str; 8] = ["rs", "md", "toml", "proto", "sh", "html", "yml", "txt"];
    let root = workspace();
    files_under(&root)
        .into_iter()
        .filter(|path| {
            path.extension().is_some_and(|e| EXTENSIONS.contains(&&*e.to_string_lossy()))
                || path.parent().is_some_and(|p| p.file_name().is_some_and(|n| n == ".ci"))
        })
        .map(|path| {
            let relative = path.strip_prefix(&root).unwrap().to_string_lossy().into_owned();
            (relative, std::fs::read_to_string(&path).unwrap_or_default())
        })
        .collect()
}

/// What in `text` cites a document that is not in the repository: the team's design brief
/// by section, or a source document by its number.
fn outside_citations(text: &str) -> Vec<String> {
    // Spelled in pieces so that this file does not cite what it forbids.
    let brief = ["DES", "IGN"].concat();
    let section = '\u{a7}';
    let seeds = ["seeds", "/"].concat();
    let mut found = Vec::new();
    for line in text.lines() {
        let cites_the_brief = line
            .match_indices(&brief)
            .any(|(at, _)| !line[at + brief.len()..].starts_with(|c: char| c.is_ascii_alphabetic()));
        let cites_a_seed = line.to_ascii_lowercase().match_indices("seed").any(|(at, _)| {
            let rest = line[at + 4..].trim_start_matches([' ', '_']);
            // The source documents are numbered with three digits; a PRNG's seed is not.
            let digits = rest.chars().take_while(char::is_ascii_digit).count();
            digits == 3
        });
        if cites_the_brief || cites_a_seed || line.contains(section) || line.contains(&seeds) {
            found.push(line.trim().to_owned());
        }
    }
    found
}

#[test]
fn the_repository_stands_alone_and_cites_papers_by_title_never_an_outside_document_by_number() {
    let texts = repository_texts();
    assert!(texts.len() > 100 && texts.iter().any(|(p, _)| p == "README.md"), "{} files", texts.len());
    let cited: Vec<String> = texts
        .iter()
        .flat_map(|(path, text)| {
            outside_citations(text).into_iter().map(move |line| format!("{path}: {line}"))
        })
        .collect();
    assert!(cited.is_empty(), "citations of documents outside the repository:\n{}", cited.join("\n"));
}

#[test]
fn the_citation_check_finds_the_brief_a_seed_and_a_section_sign() {
    let brief = ["DES", "IGN"].concat();
    assert_eq!(outside_citations(&format!("Target ({brief} \u{a7}5): fast")).len(), 1);
    assert_eq!(outside_citations(&format!("see {brief}.md")).len(), 1);
    let seed = ["se", "ed"].concat();
    assert_eq!(outside_citations(&format!("Slicer's algorithm ({seed} 000, 4.4.1)")).len(), 1);
    assert_eq!(outside_citations(&format!("the file 003_2bec.txt under {seed}s/")).len(), 1);
    assert_eq!(outside_citations("Slicer \u{a7}5.2.3's reaction experiment").len(), 1);
    // Ordinary words and seeds of a PRNG are not citations.
    assert!(outside_citations("the design of the lot table; seeded by the round; SEED = 7").is_empty());
    assert!(outside_citations("a PRNG with seed 1234 or seed 42").is_empty());
    assert!(outside_citations("Slicer (OSDI 2016), section 4.4.1").is_empty());
}

/// The names a library crate re-exports from another steady crate (`pub use steady_x::{..}`
/// anywhere in its sources), as `steady_x::Name`.
fn re_exports(krate: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for source in modules_of(&workspace().join(krate).join("src")).into_values() {
        for (at, _) in source.match_indices("pub use steady_") {
            let statement = &source[at + "pub use ".len()..];
            let statement: String =
                statement[..statement.find(';').unwrap()].split_whitespace().collect::<Vec<_>>().join(" ");
            // `home::path::{A, B as C}` or `home::path::A`.
            let (prefix, list) = match statement.split_once('{') {
                Some((prefix, list)) => (prefix.to_owned(), list.trim_end_matches('}').to_owned()),
                None => match statement.rsplit_once("::") {
                    Some((prefix, name)) => (format!("{prefix}::"), name.to_owned()),
                    None => (String::new(), statement.clone()),
                },
            };
            for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                names.insert(format!("{prefix}{name}"));
            }
        }
    }
    names
}

#[test]
fn a_crate_re_exports_another_s_type_only_where_its_own_api_takes_or_returns_it() {
    // One path per type: the home crate's. A re-export stays only where the crate's own
    // signatures use the type, so that its users need no second dependency to name it;
    // nothing is kept only because it once lived elsewhere, and nothing is deprecated.
    let api: BTreeMap<&str, Vec<&str>> = BTreeMap::from([
        // The assigners take and return assignments of slice keys.
        ("assigner", vec!["steady_slice::Assignment", "steady_slice::SliceKey"]),
        // The balancer follows assignments, routes by slice key, takes job views (of
        // tasks in zones), its own zone and the frontends' per-zone sizes, a backoff, and
        // reports configuration errors.
        (
            "balance",
            vec![
                "steady_core::Backoff",
                "steady_core::ConfigError",
                "steady_core::JobView",
                "steady_core::Locality",
                "steady_core::Task",
                "steady_core::TaskState",
                "steady_core::Zone",
                "steady_core::ZoneSizes",
                "steady_slice::Assignment",
                "steady_slice::SliceKey",
            ],
        ),
        // Discovery yields job views of tasks in zones; its registry connects to etcd
        // with steady-etcd's access.
        (
            "discovery",
            vec![
                "steady_core::JobView",
                "steady_core::Locality",
                "steady_core::Task",
                "steady_core::TaskState",
                "steady_core::Zone",
                "steady_core::ZoneError",
                "steady_etcd::ConnectError",
                "steady_etcd::EtcdAccess",
                "steady_etcd::EtcdTls",
            ],
        ),
        // Rudolph's mode runs an assigner over tasks and hands out its assignments.
        (
            "local",
            vec![
                "steady_assigner::Assigner",
                "steady_assigner::Assignment",
                "steady_assigner::ReplicaLimits",
                "steady_assigner::Rotation",
                "steady_assigner::SliceKey",
                "steady_assigner::TaskState",
                "steady_assigner::Tasks",
            ],
        ),
        // A Slicelet is built for a job's consistency mode, and says which.
        ("slicelet", vec!["steady_slice::guard::Consistency"]),
        // The etcd store is configured with steady-etcd's access; an Assigner with a job's
        // consistency mode, which a store error names.
        (
            "slicer",
            vec![
                "steady_etcd::ConnectError",
                "steady_etcd::EtcdAccess",
                "steady_etcd::EtcdTls",
                "steady_slice::guard::Consistency",
            ],
        ),
        // The channel follows the Watch client's stream, or an A119 server by its
        // configuration, and reads the key header by default.
        (
            "tonic",
            vec![
                "steady_proto::DEFAULT_KEY_HEADER",
                "steady_proto::autosharding::AutoshardingConfig",
                "steady_proto::WatchError",
                "steady_proto::watch_assignments",
            ],
        ),
    ]);
    let mut found = Vec::new();
    for member in members().into_iter().filter(|m| !UNPUBLISHED.contains(&m.as_str())) {
        let expected: BTreeSet<String> =
            api.get(member.as_str()).into_iter().flatten().map(|s| s.to_string()).collect();
        let actual = re_exports(&member);
        if actual != expected {
            found.push(format!(
                "{member}: re-exports {:?} beyond its API, lacks {:?}",
                actual.difference(&expected).collect::<Vec<_>>(),
                expected.difference(&actual).collect::<Vec<_>>()
            ));
        }
        for (module, source) in modules_of(&workspace().join(&member).join("src")) {
            if source.contains("#[deprecated") {
                found.push(format!("{member}::{module} keeps a deprecated item"));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}
