//! `stoke export`: the release step. A model folder becomes a Hugging Face folder ready to
//! publish: weights (f32 safetensors), config, generation config, tokenizer files and chat
//! template, and a model card (`README.md`) with the training lineage (the run folders given,
//! in the order given: each stage's kind, starting model, data and length, read from its
//! `config.toml` and `metrics.jsonl`) and evaluation figures (`stoke eval run` output folders:
//! every metric with its standard error).
//!
//! With `--gguf TYPE` (f32, f16, bf16, q8_0) `--out` is instead a single GGUF file for llama.cpp
//! (`stoke convert` writes the same file); the lineage and eval figures go in the card only.
//!
//! Refuses a model with a non-finite weight, naming the tensor and the count. Nothing is half
//! written: the folder is assembled under a temporary name next to `--out` and renamed at the
//! end; an existing `--out` is only replaced with `--force`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use stoke_model::Transformer;

#[derive(Args)]
pub struct ExportArgs {
    /// The model folder to release (config.json, safetensors, tokenizer files).
    #[arg(long)]
    model: PathBuf,
    /// The release folder to write.
    #[arg(long)]
    out: PathBuf,
    /// Run folders the model came from, oldest first (stoke train / dpo / grpo output folders,
    /// or a speedrun folder, whose stage folders are read in the order they ran).
    #[arg(long = "lineage")]
    lineage: Vec<PathBuf>,
    /// `stoke eval run` output folders whose results go in the card.
    #[arg(long = "eval")]
    eval: Vec<PathBuf>,
    /// The model's name in the card (default: the --out folder's name).
    #[arg(long)]
    name: Option<String>,
    /// Replace an existing --out folder.
    #[arg(long)]
    force: bool,
    /// Write `--out` as one GGUF file with weights of this type instead of a folder.
    #[arg(long, value_enum)]
    gguf: Option<super::convert::GgufType>,
}

pub fn run(args: ExportArgs) -> anyhow::Result<()> {
    let model = Transformer::load(&args.model, &candle_core::Device::Cpu)
        .with_context(|| format!("loading the model {}", args.model.display()))?;
    check_finite(&model, &args.model)?;
    if args.out.exists() && !args.force {
        bail!("{} exists; pass --force to replace it", args.out.display());
    }
    let name = args.name.clone().unwrap_or_else(|| {
        args.out
            .file_name()
            .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned())
    });
    if let Some(dtype) = args.gguf {
        return super::convert::write_gguf(&model, &args.model, &args.out, dtype, Some(&name));
    }
    let card = model_card(&name, &model, &args.model, &args.lineage, &args.eval)?;
    let parent = args
        .out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let staging = parent.join(format!(
        ".{}.export-{}",
        args.out
            .file_name()
            .map_or_else(|| "model".into(), |n| n.to_string_lossy()),
        std::process::id()
    ));
    let result = (|| -> anyhow::Result<()> {
        model
            .save_with_tokenizer(&staging, Some(&args.model))
            .with_context(|| format!("writing {}", staging.display()))?;
        std::fs::write(staging.join("README.md"), &card)
            .with_context(|| format!("writing {}", staging.join("README.md").display()))?;
        if args.out.exists() {
            std::fs::remove_dir_all(&args.out)
                .with_context(|| format!("replacing {}", args.out.display()))?;
        }
        std::fs::rename(&staging, &args.out)
            .with_context(|| format!("moving the export to {}", args.out.display()))?;
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    result?;
    println!(
        "exported {} to {}",
        args.model.display(),
        args.out.display()
    );
    Ok(())
}

/// Every parameter finite, or an error naming the first bad tensor.
fn check_finite(model: &Transformer, dir: &Path) -> anyhow::Result<()> {
    for (name, var) in model.parameters() {
        let values: Vec<f32> = var
            .as_tensor()
            .to_dtype(candle_core::DType::F32)?
            .flatten_all()?
            .to_vec1()?;
        let bad = values.iter().filter(|v| !v.is_finite()).count();
        if bad > 0 {
            let first = values.iter().position(|v| !v.is_finite()).unwrap_or(0);
            bail!(
                "{}: tensor {name} has {bad} non-finite value(s) (the first at flat index \
                 {first}); refusing to export a broken model",
                dir.display()
            );
        }
    }
    Ok(())
}

/// The stage folders of a lineage entry: itself when it holds a config.toml, else the folders
/// below it that do (a speedrun keeps its preference runs one level deeper, in
/// `preference/<loss>/`), in the order their configs were written. A stage folder is not
/// searched further (its checkpoints hold copies of its config).
fn stages(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if dir.join("config.toml").is_file() {
        return Ok(vec![dir.to_path_buf()]);
    }
    fn search(
        dir: &Path,
        depth: usize,
        found: &mut Vec<(std::time::SystemTime, PathBuf)>,
    ) -> anyhow::Result<()> {
        for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if !path.is_dir() {
                continue;
            }
            let config = path.join("config.toml");
            if config.is_file() {
                let written = std::fs::metadata(&config)?.modified()?;
                found.push((written, path));
            } else if depth > 1 {
                search(&path, depth - 1, found)?;
            }
        }
        Ok(())
    }
    let mut found = Vec::new();
    search(dir, 3, &mut found)?;
    if found.is_empty() {
        bail!(
            "{}: no config.toml in it or its sub-folders (not a run folder)",
            dir.display()
        );
    }
    found.sort();
    Ok(found.into_iter().map(|(_, p)| p).collect())
}

fn text(value: Option<&toml::Value>) -> Option<String> {
    match value? {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Array(items) => Some(
            items
                .iter()
                .filter_map(|v| v.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        ),
        other => Some(other.to_string()),
    }
}

/// A preference stage's kind: the objective (`[objective] kind`, DPO when absent) and its loss.
fn preference_kind(get: &dyn Fn(&str, &str) -> Option<String>) -> String {
    let objective = get("objective", "kind").unwrap_or_else(|| "dpo".into());
    let loss = match objective.as_str() {
        "dpo" => get("dpo", "loss_type").or_else(|| Some("sigmoid".into())),
        "cpo" | "kto" => get(&objective, "loss_type"),
        _ => None,
    };
    let name = objective.to_uppercase();
    match loss {
        Some(loss) => format!("preference optimization ({name}, {loss})"),
        None => format!("preference optimization ({name})"),
    }
}

/// A `[lora]` table as the card shows it: rank, alpha, target modules (and rsLoRA when on).
fn lora_description(lora: &toml::Value) -> String {
    let get = |key: &str| text(lora.get(key)).unwrap_or_else(|| "-".into());
    let rslora = lora.get("use_rslora").and_then(toml::Value::as_bool) == Some(true);
    format!(
        "LoRA (rank {}, alpha {}, target modules {}{})",
        get("r"),
        get("lora_alpha"),
        get("target_modules"),
        if rslora { ", rsLoRA" } else { "" }
    )
}

/// One stage's line: its kind (with its LoRA adapters, if any), what it started from, its data
/// and how long it ran.
fn stage_line(dir: &Path) -> anyhow::Result<String> {
    let path = dir.join("config.toml");
    let table: toml::Table = toml::from_str(
        &std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("parsing {}", path.display()))?;
    let get = |section: &str, key: &str| text(table.get(section).and_then(|s| s.get(key)));
    let (kind, data, steps) = if table.contains_key("grpo") {
        (
            "GRPO (reinforcement learning with verifiable rewards)".to_string(),
            get("tasks", "path")
                .or_else(|| get("tasks", "kind"))
                .unwrap_or_default(),
            get("training", "steps").or_else(|| get("grpo", "steps")),
        )
    } else if table.contains_key("objective") || table.contains_key("dpo") {
        (
            preference_kind(&get),
            get("data", "train").unwrap_or_default(),
            get("training", "steps"),
        )
    } else {
        let kind = match get("data", "kind").as_deref() {
            Some("chat") => "supervised fine-tuning (chat)",
            _ => "pretraining (token shards)",
        };
        let kind = if table.contains_key("distill") {
            format!(
                "logit distillation from {}",
                get("distill", "teacher").unwrap_or_default()
            )
        } else {
            kind.to_string()
        };
        (
            kind,
            get("data", "train").unwrap_or_default(),
            get("training", "steps"),
        )
    };
    let from = get("model", "path")
        .or_else(|| get("model", "pretrained"))
        .or_else(|| get("model", "config").map(|c| format!("random initialization ({c})")))
        .or_else(|| get("model", "preset").map(|p| format!("random initialization ({p})")))
        .unwrap_or_else(|| "-".into());
    let kind = match table.get("lora") {
        Some(lora) => format!("{kind}, {}", lora_description(lora)),
        None => kind,
    };
    let title = text(table.get("title")).unwrap_or_else(|| dir.display().to_string());
    let mut line = format!(
        "| {} | {kind} | {from} | {data} | {} |",
        title.replace('|', "/"),
        steps.unwrap_or_else(|| "-".into())
    );
    line = line.replace('\n', " ");
    Ok(line)
}

fn model_card(
    name: &str,
    model: &Transformer,
    model_dir: &Path,
    lineage: &[PathBuf],
    evals: &[PathBuf],
) -> anyhow::Result<String> {
    let c = model.config();
    let parameters: usize = model
        .parameters()
        .iter()
        .map(|(_, v)| v.as_tensor().elem_count())
        .sum();
    let mut card = String::new();
    let _ = writeln!(
        card,
        "---\nlibrary_name: transformers\npipeline_tag: text-generation\ntags:\n- stoke\n---\n"
    );
    let _ = writeln!(card, "# {name}\n");
    let _ = writeln!(
        card,
        "Exported by `stoke export` from `{}`.\n",
        model_dir.display()
    );
    let _ = writeln!(card, "## Model\n\n| | |\n|---|---|");
    let architecture = format!("{:?}", c.architecture);
    for (key, value) in [
        ("architecture", architecture),
        ("parameters", format!("{parameters}")),
        ("layers", c.num_hidden_layers.to_string()),
        ("hidden size", c.hidden_size.to_string()),
        (
            "attention heads (key/value)",
            format!("{} ({})", c.num_attention_heads, c.num_key_value_heads),
        ),
        ("vocabulary", c.vocab_size.to_string()),
        ("context", c.max_position_embeddings.to_string()),
    ] {
        let _ = writeln!(card, "| {key} | {value} |");
    }
    if !lineage.is_empty() {
        let _ = writeln!(
            card,
            "\n## Training lineage\n\nStages in the order they ran:\n\n| stage | kind | started from | data | steps |\n|---|---|---|---|---|"
        );
        for dir in lineage {
            for stage in stages(dir)? {
                let _ = writeln!(card, "{}", stage_line(&stage)?);
            }
        }
    }
    if !evals.is_empty() {
        let _ = writeln!(
            card,
            "\n## Evaluation\n\n`stoke eval run`, each metric with its standard error:\n\n| task | items | metric | value |\n|---|---|---|---|"
        );
        for dir in evals {
            let path = dir.join("results.json");
            let results: Vec<stoke_eval::TaskResult> = serde_json::from_str(
                &std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()))?,
            )
            .with_context(|| format!("parsing {}", path.display()))?;
            for r in &results {
                for (metric, m) in &r.metrics {
                    let _ = writeln!(
                        card,
                        "| {} | {} | {metric} | {:.4} ± {:.4} |",
                        r.task, r.items, m.value, m.stderr
                    );
                }
            }
        }
    }
    let _ = writeln!(
        card,
        "\n## Use\n\nA Hugging Face folder (safetensors, config, tokenizer, chat template): \
         `transformers.AutoModelForCausalLM.from_pretrained(\"{name}\")`, or `stoke generate \
         --model {name} --chat --prompt ...`."
    );
    Ok(card)
}
