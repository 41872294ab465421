//! `stoke convert IN OUT`: between a GGUF file and the Hugging Face folder layout.
//!
//! - IN a `.gguf` file: OUT becomes a Hugging Face folder (config.json, f32 safetensors,
//!   generation_config.json, tokenizer.json and tokenizer_config.json with the chat template),
//!   the model and tokenizer transformers' own GGUF loader builds from the same file.
//! - IN a model folder: OUT becomes a GGUF file for llama.cpp, weights in `--type` (f16 by
//!   default, as llama.cpp's converter; f32, bf16 or q8_0), with the folder's tokenizer.
//!
//! Nothing is half written: both outputs are assembled under a temporary name and renamed.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use stoke_gguf::GgmlType;
use stoke_model::Transformer;

/// Weight type of a GGUF export.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum GgufType {
    F32,
    F16,
    Bf16,
    #[value(name = "q8_0")]
    Q8_0,
}

impl GgufType {
    /// The type's name as GGUF and llama.cpp spell it.
    pub fn name(self) -> &'static str {
        match self {
            GgufType::F32 => "F32",
            GgufType::F16 => "F16",
            GgufType::Bf16 => "BF16",
            GgufType::Q8_0 => "Q8_0",
        }
    }

    pub fn ggml(self) -> GgmlType {
        match self {
            GgufType::F32 => GgmlType::F32,
            GgufType::F16 => GgmlType::F16,
            GgufType::Bf16 => GgmlType::BF16,
            GgufType::Q8_0 => GgmlType::Q8_0,
        }
    }
}

#[derive(Args)]
pub struct ConvertArgs {
    /// A GGUF file, or a Hugging Face model folder.
    input: PathBuf,
    /// The folder (from GGUF) or the .gguf file (from a folder) to write.
    output: PathBuf,
    /// Weight type when writing GGUF.
    #[arg(long = "type", value_enum, default_value = "f16")]
    dtype: GgufType,
    /// Replace an existing output.
    #[arg(long)]
    force: bool,
}

pub fn run(args: ConvertArgs) -> anyhow::Result<()> {
    if args.output.exists() && !args.force {
        bail!(
            "{} exists; pass --force to replace it",
            args.output.display()
        );
    }
    let model = Transformer::load(&args.input, &candle_core::Device::Cpu)
        .with_context(|| format!("loading {}", args.input.display()))?;
    if stoke_gguf::is_gguf(&args.input) {
        model
            .save_with_tokenizer(&args.output, Some(&args.input))
            .with_context(|| format!("writing {}", args.output.display()))?;
        println!(
            "converted {} (GGUF) to the Hugging Face folder {}",
            args.input.display(),
            args.output.display()
        );
    } else {
        write_gguf(&model, &args.input, &args.output, args.dtype, None)?;
    }
    Ok(())
}

/// Writes `model` (loaded from `source`, whose tokenizer it takes) as a GGUF file.
pub fn write_gguf(
    model: &Transformer,
    source: &std::path::Path,
    out: &std::path::Path,
    dtype: GgufType,
    name: Option<&str>,
) -> anyhow::Result<()> {
    let name = name.map(String::from).unwrap_or_else(|| {
        out.file_stem()
            .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned())
    });
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    model
        .save_gguf(out, source, dtype.ggml(), &name)
        .with_context(|| format!("writing {}", out.display()))?;
    let mtp = model.config().num_mtp_layers;
    if mtp > 0 {
        println!(
            "note: the model's {mtp} multi-token prediction module(s) are not in the GGUF \
             (llama.cpp's deepseek2 has no place for them, and its own converter leaves them \
             out); the Hugging Face folder keeps them"
        );
    }
    println!(
        "wrote {} ({} weights) from {}",
        out.display(),
        dtype.name(),
        source.display()
    );
    Ok(())
}
