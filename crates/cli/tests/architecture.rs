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
