//! Offline validation of the deployment templates in deploy/ (no cluster needed):
//! - every Kubernetes manifest validates against Kubernetes 1.32's strict JSON schemas (unknown
//!   fields are errors), from fixtures/k8s (made by scripts/make_k8s_schemas.py);
//! - the manifests agree with each other: StatefulSets name an existing headless Service whose
//!   selector matches their pods, volumes name an existing claim or ConfigMap, ports exist, and
//!   the GRPO config in the ConfigMap loads and lists exactly one URL per rollout and reward
//!   replica, by their stable DNS names;
//! - a manifest with a misspelled field fails, so the check can fail;
//! - the Slurm template runs: with a stand-in `srun` that starts its tasks on this machine
//!   (numbered as Slurm numbers them), it trains the tiny model with 2 rollout and 1 reward
//!   servers through `stoke launch`, and refuses a task count that does not match.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use stoke_pipeline::config::GrpoConfig;
use yaml_rust2::{Yaml, YamlLoader};

mod common;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn to_json(yaml: &Yaml) -> Value {
    match yaml {
        Yaml::Real(text) => text.parse::<f64>().map_or(Value::Null, |v| json!(v)),
        Yaml::Integer(i) => json!(i),
        Yaml::String(s) => json!(s),
        Yaml::Boolean(b) => json!(b),
        Yaml::Array(items) => Value::Array(items.iter().map(to_json).collect()),
        Yaml::Hash(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let key = match k {
                        Yaml::String(s) => s.clone(),
                        other => format!("{other:?}"),
                    };
                    (key, to_json(v))
                })
                .collect(),
        ),
        Yaml::Null | Yaml::BadValue | Yaml::Alias(_) => Value::Null,
    }
}

/// Every document of every manifest: (file, document).
fn manifests() -> Vec<(String, Value)> {
    let dir = repo().join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "manifests missing in {}", dir.display());
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let docs =
            YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{name}: not YAML: {e}"));
        for doc in docs.iter().filter(|d| !d.is_null()) {
            out.push((name.clone(), to_json(doc)));
        }
    }
    out
}

fn schemas() -> Value {
    let path = repo().join("fixtures/k8s/schemas-v1.32.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The schema errors of `doc` (empty when it validates).
fn schema_errors(schemas: &Value, doc: &Value) -> Vec<String> {
    let key = format!(
        "{} {}",
        doc["apiVersion"].as_str().unwrap_or("?"),
        doc["kind"].as_str().unwrap_or("?")
    );
    let Some(kind) = schemas["kinds"].get(&key) else {
        return vec![format!(
            "no schema for {key} (add it to scripts/make_k8s_schemas.py)"
        )];
    };
    let mut schema = kind.clone();
    schema["$defs"] = schemas["$defs"].clone();
    let validator = jsonschema::validator_for(&schema).expect("the schema compiles");
    validator
        .iter_errors(doc)
        .map(|e| format!("{key} at {}: {e}", e.instance_path()))
        .collect()
}

#[test]
fn kubernetes_manifests_validate_against_the_strict_schemas() {
    let schemas = schemas();
    let mut failures = Vec::new();
    let mut kinds = Vec::new();
    for (file, doc) in manifests() {
        kinds.push(doc["kind"].as_str().unwrap_or("?").to_string());
        for error in schema_errors(&schemas, &doc) {
            failures.push(format!("{file}: {error}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for kind in [
        "PersistentVolumeClaim",
        "ConfigMap",
        "Service",
        "StatefulSet",
        "Job",
    ] {
        assert!(
            kinds.iter().any(|k| k == kind),
            "no {kind} in the manifests"
        );
    }
}

#[test]
fn a_misspelled_or_mistyped_field_fails_validation() {
    let schemas = schemas();
    let (_, statefulset) = manifests()
        .into_iter()
        .find(|(_, d)| d["kind"] == "StatefulSet")
        .unwrap();
    assert!(schema_errors(&schemas, &statefulset).is_empty());
    let mut typo = statefulset.clone();
    let replicas = typo["spec"]["replicas"].take();
    typo["spec"].as_object_mut().unwrap().remove("replicas");
    typo["spec"]["replica"] = replicas;
    assert!(
        !schema_errors(&schemas, &typo).is_empty(),
        "an unknown field passed"
    );
    let mut wrong_type = statefulset;
    wrong_type["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] =
        json!("eight thousand");
    assert!(
        !schema_errors(&schemas, &wrong_type).is_empty(),
        "a string port passed"
    );
}

fn by_kind<'a>(docs: &'a [(String, Value)], kind: &str) -> BTreeMap<String, &'a Value> {
    docs.iter()
        .filter(|(_, d)| d["kind"] == kind)
        .map(|(_, d)| (d["metadata"]["name"].as_str().unwrap().to_string(), d))
        .collect()
}

#[test]
fn the_manifests_agree_with_each_other_and_with_the_grpo_config() {
    let docs = manifests();
    let services = by_kind(&docs, "Service");
    let claims = by_kind(&docs, "PersistentVolumeClaim");
    let config_maps = by_kind(&docs, "ConfigMap");
    let statefulsets = by_kind(&docs, "StatefulSet");
    let jobs = by_kind(&docs, "Job");
    assert_eq!(jobs.len(), 1, "one trainer Job");

    let mut pod_specs: Vec<(&str, &Value)> = Vec::new();
    for (name, set) in &statefulsets {
        let service_name = set["spec"]["serviceName"].as_str().unwrap();
        let service = services
            .get(service_name)
            .unwrap_or_else(|| panic!("{name}: no Service {service_name}"));
        assert_eq!(
            service["spec"]["clusterIP"], "None",
            "{service_name} must be headless"
        );
        let labels = &set["spec"]["template"]["metadata"]["labels"];
        for (key, value) in service["spec"]["selector"].as_object().unwrap() {
            assert_eq!(
                &labels[key], value,
                "{service_name} selects no pod of {name}"
            );
        }
        for (key, value) in set["spec"]["selector"]["matchLabels"].as_object().unwrap() {
            assert_eq!(&labels[key], value, "{name}'s selector misses its pods");
        }
        let target = service["spec"]["ports"][0]["targetPort"].as_str().unwrap();
        let ports = set["spec"]["template"]["spec"]["containers"][0]["ports"]
            .as_array()
            .unwrap();
        assert!(
            ports.iter().any(|p| p["name"] == target),
            "{service_name}'s targetPort {target} is no port of {name}"
        );
        pod_specs.push((name, &set["spec"]["template"]["spec"]));
    }
    for (name, job) in &jobs {
        pod_specs.push((name, &job["spec"]["template"]["spec"]));
    }
    for (name, pod) in &pod_specs {
        for volume in pod["volumes"].as_array().unwrap() {
            if let Some(claim) = volume["persistentVolumeClaim"]["claimName"].as_str() {
                assert!(claims.contains_key(claim), "{name}: no claim {claim}");
                let modes = &claims[claim]["spec"]["accessModes"];
                assert!(
                    modes
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|m| m == "ReadWriteMany"),
                    "{claim} is shared by several pods: ReadWriteMany"
                );
            }
            if let Some(map) = volume["configMap"]["name"].as_str() {
                assert!(config_maps.contains_key(map), "{name}: no ConfigMap {map}");
            }
        }
        for container in pod["containers"].as_array().unwrap() {
            assert_eq!(container["command"], json!(["stoke"]), "{name}");
        }
    }

    // The config the trainer and reward servers read loads as a GRPO config, and addresses one
    // server per replica by its stable name on the container port.
    let text = config_maps["stoke-grpo"]["data"]["grpo.toml"]
        .as_str()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("grpo.toml");
    std::fs::write(&path, text).unwrap();
    let config = GrpoConfig::load(&path, &[]).expect("the ConfigMap's grpo.toml loads");
    let expected = |set: &str| -> Vec<String> {
        let sts = statefulsets[set];
        let replicas = sts["spec"]["replicas"].as_i64().unwrap();
        let service = sts["spec"]["serviceName"].as_str().unwrap();
        let port = sts["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
            .as_i64()
            .unwrap();
        (0..replicas)
            .map(|i| format!("http://{set}-{i}.{service}:{port}"))
            .collect()
    };
    let services = &config.settings.services;
    let rollout = services.rollout.as_ref().expect("[rollout] is remote");
    assert_eq!(rollout.pool.servers, expected("stoke-rollout"));
    assert!(
        rollout.weights_dir.starts_with("/shared"),
        "{:?}",
        rollout.weights_dir
    );
    assert!(config.model.starts_with("/shared"));
    assert!(config.out_dir.starts_with("/shared"));
    let reward = services.reward.as_ref().expect("[reward] is remote");
    assert_eq!(reward.servers, expected("stoke-reward"));
    let serve_args =
        &statefulsets["stoke-rollout"]["spec"]["template"]["spec"]["containers"][0]["args"];
    let args: Vec<&str> = serve_args
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let after = |flag: &str| args[args.iter().position(|a| *a == flag).unwrap() + 1];
    assert_eq!(Some(after("--served-model-name")), rollout.model.as_deref());
    assert_eq!(Path::new(after("--model")), config.model);
}

const SLURM_CONFIG: &str = r#"
[model]
path = "model"
[tasks]
kind = "jsonl"
path = "tasks.jsonl"
[grpo]
steps = 4
prompts_per_step = 2
group_size = 4
max_new_tokens = 6
mode = "async"
threads = 1
reward_workers = 1
[rewards.default]
kind = "instructions"
constraints = [{ type = "word_count", relation = "at_most", value = 3 }]
[out]
dir = "run"
"#;

/// A stand-in for `srun`: starts `--ntasks` copies of the command on this machine with Slurm's
/// task variables, waits for all, fails if any failed.
const FAKE_SRUN: &str = r#"#!/bin/bash
ntasks=1
while [ $# -gt 0 ]; do
    case "$1" in
        --ntasks=*) ntasks=${1#--ntasks=}; shift ;;
        --*) shift ;;
        *) break ;;
    esac
done
pids=()
for ((i = 0; i < ntasks; i++)); do
    SLURM_PROCID=$i SLURM_NTASKS=$ntasks SLURM_LOCALID=$i SLURM_JOB_ID=4242 "$@" &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
exit $status
"#;

#[test]
fn the_slurm_template_trains_with_a_local_stand_in_for_srun() {
    let dir = tempfile::tempdir().unwrap();
    let texts: Vec<String> = (0..40)
        .map(|i| format!("What is {i} + {}? It is {} .", i + 2, 2 * i + 2))
        .collect();
    common::tiny_chat_model(dir.path(), &texts);
    let tasks: String = (0..4)
        .map(|i| format!("{{\"prompt\": \"What is {i} + 2?\"}}\n"))
        .collect();
    std::fs::write(dir.path().join("tasks.jsonl"), tasks).unwrap();
    std::fs::write(dir.path().join("grpo.toml"), SLURM_CONFIG).unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::write(bin.join("srun"), FAKE_SRUN).unwrap();
    Command::new("chmod")
        .arg("+x")
        .arg(bin.join("srun"))
        .status()
        .unwrap();
    let stoke_dir = Path::new(env!("CARGO_BIN_EXE_stoke")).parent().unwrap();
    let path = format!(
        "{}:{}:{}",
        bin.display(),
        stoke_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let script = repo().join("deploy/slurm/grpo.sbatch");
    let run = |tasks: &str| {
        Command::new("bash")
            .arg(&script)
            .current_dir(dir.path())
            .env("PATH", &path)
            .env("ROLLOUT", "2")
            .env("REWARD", "1")
            .env("PORT", "0")
            .env(
                "STOKE_ARGS",
                "--advertise 127.0.0.1 --host 127.0.0.1 --kv-cache-gib 0.25 --quiet",
            )
            .env("SLURM_NTASKS", tasks)
            .env("SLURM_CPUS_PER_TASK", "1")
            .output()
            .unwrap()
    };
    let output = run("4");
    assert!(
        output.status.success(),
        "{}: {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("Slurm rank 0 of 4 (local 0) is the Trainer"),
        "{stderr}"
    );
    assert!(stderr.contains("is the Rollout(1)"), "{stderr}");
    assert!(stderr.contains("is the Reward(0)"), "{stderr}");
    let metrics = std::fs::read_to_string(dir.path().join("run/metrics.jsonl")).unwrap();
    let steps: Vec<Value> = metrics
        .lines()
        .filter(|l| l.contains("\"kind\":\"step\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(steps.len(), 4);
    assert_eq!(
        steps[3]["rollout_servers"]["servers"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert!(dir.path().join("rendezvous/4242/done").is_file());

    let refused = run("3");
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("4 tasks needed"));

    // Every #SBATCH line is an option sbatch has, with a value where it takes one.
    let known = [
        "job-name",
        "nodes",
        "ntasks",
        "ntasks-per-node",
        "cpus-per-task",
        "time",
        "output",
        "partition",
        "account",
        "gres",
        "mem",
        "exclusive",
    ];
    let text = std::fs::read_to_string(&script).unwrap();
    for line in text.lines().filter(|l| l.starts_with("#SBATCH")) {
        let option = line.trim_start_matches("#SBATCH").trim();
        let (name, value) = option
            .trim_start_matches("--")
            .split_once('=')
            .unwrap_or((option, ""));
        assert!(known.contains(&name), "unknown #SBATCH option {line:?}");
        assert!(
            !value.is_empty() || name == "exclusive",
            "{line:?} has no value"
        );
    }
}
