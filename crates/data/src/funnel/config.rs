//! The funnel's TOML file ([`FunnelFile`], unknown keys rejected) and the validated plan it
//! becomes ([`FunnelPlan`]): sources with their files listed, stages built (blocklists and dedup
//! state loaded), the mixture checked against the sources.
//!
//! Relative paths in the file are taken from the folder of the config file (`base_dir`), so a
//! config and its data can move together. See `configs/funnel.example.toml` for every key.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::FunnelError;
use super::input::{InputFormat, Source, SourceFile};
use super::mixture::{Mixture, MixtureFile};
use super::stage::{Stage, StageFile};
use super::tokenize::{TokenizeFile, TokenizeOutput};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunnelFile {
    pub run: RunFile,
    #[serde(rename = "source")]
    pub sources: Vec<SourceFile>,
    #[serde(default, rename = "stage")]
    pub stages: Vec<StageFile>,
    #[serde(default)]
    pub mixture: Option<MixtureFile>,
    /// Optional last step: the output as token shards (see [`super::tokenize`]).
    #[serde(default)]
    pub tokenize: Option<TokenizeFile>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunFile {
    /// Kept documents as JSONL; `.zst` at the end compresses them.
    pub output: PathBuf,
    /// Where `report.json`, `funnel.svg` and `removed/` go.
    pub report_dir: PathBuf,
    #[serde(default = "default_removed_samples")]
    pub removed_samples: usize,
    #[serde(default = "default_chunk_size")]
    pub chunk_size: usize,
    /// Worker threads; 0 uses every core.
    #[serde(default)]
    pub threads: usize,
    /// Stop at the first bad input record instead of counting it.
    #[serde(default)]
    pub strict: bool,
    /// Seeds the reservoir sampling of removed documents.
    #[serde(default)]
    pub seed: u64,
}

fn default_removed_samples() -> usize {
    20
}
fn default_chunk_size() -> usize {
    1024
}

/// A validated run, ready for [`super::pipeline::run`].
#[derive(Debug)]
pub struct FunnelPlan {
    pub sources: Vec<Source>,
    pub stages: Vec<Stage>,
    pub mixture: Option<Mixture>,
    pub tokenize: Option<TokenizeOutput>,
    pub output: PathBuf,
    pub report_dir: PathBuf,
    pub removed_samples: usize,
    pub chunk_size: usize,
    pub threads: usize,
    pub strict: bool,
    pub seed: u64,
}

impl FunnelFile {
    pub fn parse(text: &str) -> Result<Self, FunnelError> {
        toml::from_str(text).map_err(|e| FunnelError::Config(e.to_string()))
    }

    pub fn validate(self, base_dir: &Path) -> Result<FunnelPlan, FunnelError> {
        let config = |message: String| FunnelError::Config(message);
        if self.sources.is_empty() {
            return Err(config("at least one [[source]] is required".into()));
        }
        if self.run.chunk_size == 0 {
            return Err(config("run.chunk_size must be positive".into()));
        }
        let names: Vec<String> = self.sources.iter().map(|s| s.name.clone()).collect();
        for (i, name) in names.iter().enumerate() {
            if names[..i].contains(name) {
                return Err(config(format!("two sources are named {name:?}")));
            }
        }
        let has_extract = self
            .stages
            .iter()
            .any(|s| matches!(s, StageFile::Extract(_)));
        if let Some(html) = self
            .sources
            .iter()
            .find(|s| matches!(s.format, InputFormat::Html | InputFormat::Warc))
            && !has_extract
        {
            return Err(config(format!(
                "source {:?} reads HTML ({:?}) but no [[stage]] kind = \"extract\" turns it into text",
                html.name, html.format
            )));
        }
        let sources = self
            .sources
            .into_iter()
            .map(|s| s.validate(base_dir).map_err(config))
            .collect::<Result<Vec<_>, _>>()?;
        let stages = self
            .stages
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                s.validate(base_dir)
                    .map_err(|e| config(format!("stage {}: {e}", i + 1)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mixture = self
            .mixture
            .map(|m| m.validate(&names).map_err(config))
            .transpose()?;
        let tokenize = self
            .tokenize
            .map(|t| t.validate(base_dir).map_err(config))
            .transpose()?;
        Ok(FunnelPlan {
            sources,
            stages,
            mixture,
            tokenize,
            output: base_dir.join(self.run.output),
            report_dir: base_dir.join(self.run.report_dir),
            removed_samples: self.run.removed_samples,
            chunk_size: self.run.chunk_size,
            threads: self.run.threads,
            strict: self.run.strict,
            seed: self.run.seed,
        })
    }
}
