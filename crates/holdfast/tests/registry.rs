//! The store registry ([`holdfast::stores::Store`]) against everything
//! outside the compiler's reach that must list every store: the store's
//! folder and its file contract, its conformance suite, its cargo feature,
//! the front page and the store pages, and the servers CI installs. Inside
//! the crates, each list is a `match` on `Store` without a wildcard (URL
//! dispatch, URL option tables, the test kit's server packages, `verify
//! --spawn`, the bench's floors), so a store added to the registry fails to
//! compile there; these tests name what a build cannot see.

use std::path::{Path, PathBuf};

use holdfast::stores::Store;

/// The workspace root, from this crate's manifest directory.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("cannot read {path}: {e}"))
}

/// Where a store's code lives: a leaf store in `stores/`, RedLock (a store
/// built of other stores) in `composites/`.
fn folder(store: Store) -> String {
    let area = if store == Store::RedLock { "composites" } else { "stores" };
    format!("crates/holdfast/src/{area}/{}", store.feature())
}

/// The files every leaf store's folder holds (docs/design.md, "A store
/// folder"): the type and its `Backend` impl, its URL and options, its
/// error mapping, its admin calls, and its page.
const STORE_FILES: [&str; 5] = ["mod.rs", "config.rs", "error.rs", "admin.rs", "docs.md"];

#[test]
fn every_store_folder_follows_the_file_contract() {
    let mut missing = Vec::new();
    for store in Store::ALL {
        let dir = folder(store);
        let files: &[&str] = if store == Store::RedLock { &["mod.rs", "config.rs"] } else { &STORE_FILES };
        for file in files {
            if !root().join(&dir).join(file).is_file() {
                missing.push(format!("{dir}/{file}"));
            }
        }
    }
    assert!(missing.is_empty(), "store folders miss files of the file contract: {missing:?}");
}

#[test]
fn every_store_runs_the_conformance_suite() {
    let main = read("crates/holdfast/tests/conformance/main.rs");
    for store in Store::ALL {
        let name = store.feature();
        let suite = read(&format!("crates/holdfast/tests/conformance/{name}.rs"));
        assert!(suite.contains("conformance_suite!"), "tests/conformance/{name}.rs does not run the suite");
        assert!(main.contains(&format!("\nmod {name};")), "tests/conformance/main.rs does not declare `mod {name};`");
    }
}

#[test]
fn every_store_is_a_cargo_feature_in_all_backends() {
    let manifest = read("crates/holdfast/Cargo.toml");
    let all = manifest.lines().find(|l| l.starts_with("all-backends")).expect("an all-backends feature");
    for store in Store::ALL {
        let feature = store.feature();
        assert!(manifest.lines().any(|l| l.starts_with(&format!("{feature} ="))), "no cargo feature `{feature}`");
        assert!(all.contains(&format!("\"{feature}\"")), "all-backends does not enable `{feature}`");
    }
}

#[test]
fn every_store_is_on_the_front_page_and_the_store_pages() {
    let readme = read("README.md");
    let stores_page = read("docs/stores.md");
    let guarantees = read("docs/guarantees.md");
    for store in Store::ALL {
        // Both pages name a store by its first scheme.
        let scheme = store.schemes()[0];
        assert!(readme.contains(&format!("`{scheme}://")), "README.md does not list `{scheme}://`");
        assert!(guarantees.contains(&format!("`{scheme}://`")), "docs/guarantees.md has no section for `{scheme}://`");
        if store != Store::RedLock {
            let page = format!("src/stores/{}/docs.md", store.feature());
            assert!(stores_page.contains(&page), "docs/stores.md does not link {page}");
        }
    }
}

#[test]
fn ci_installs_every_store_server() {
    let ci = read(".ci/run");
    let install: String = ci
        .lines()
        .skip_while(|l| !l.starts_with("apt-get install"))
        .take_while(|l| l.trim_end().ends_with('\\') || l.starts_with("apt-get install") || l.starts_with("  "))
        .collect::<Vec<_>>()
        .join(" ");
    let words: Vec<&str> = install.split_whitespace().collect();
    for store in Store::ALL {
        for package in holdfast_testkit::servers::packages(store) {
            assert!(words.contains(package), ".ci/run does not install {package} (the {store:?} tests need it)");
        }
    }
    for tool in holdfast_testkit::servers::TOOLS {
        assert!(words.contains(tool), ".ci/run does not install {tool}");
    }
}
