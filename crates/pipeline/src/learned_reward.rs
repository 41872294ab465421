//! Learned rewards run in this process: the scorer behind `[rewards.NAME] kind = "reward_model"`
//! (`stoke_reward::reward_model`), over a reward model `stoke rm` trained or any Hugging Face
//! `*ForSequenceClassification` folder with one label.
//!
//! What it is: [`LocalScorers`], the `ScorerSource` `stoke grpo` hands to reward building. It
//! loads each reward model folder once (frozen: no gradient is ever taken through it) and shares
//! it between the rewards that name it. [`LocalScorer`] turns each (prompt, completion) into the
//! ids `stoke rm` trains on for such a pair (`preference::data::scored_conversation`: the prompt
//! as a user turn, the completion as the assistant's, through the model's chat template), keeps
//! the last `max_position_embeddings` ids of a longer one (the scored token is the last), and
//! scores them in batches of [`BATCH`] rows with `Transformer::score_sequences`.
//!
//! A reward with `url` is scored by a server instead ([`RemoteScorer`]: `stoke serve --task
//! reward`, or vLLM serving the model): the ids are made here by the same rule and sent as token
//! ids to `/classify` with `use_activation: false` (raw logits), so the scores are the ones the
//! model gives in process. Connecting checks that the server answers, serves the named model
//! (or picks its first), and scores one label; each failure names the URL.
//!
//! A `process_reward` reward's PRM (a token classifier with two labels, `stoke prm`'s model) is
//! [`LocalStepScorer`]: loaded once per folder too, it scores each completion step by step with
//! `stoke_train::prm::score_traces` (the reward's `step_separator`, empty steps dropped, repeats
//! scored 0) in batches of [`BATCH`] traces, and returns each step's bytes and P(good).
//!
//! What it is not: the post-processing (aggregation, normalization, clipping: the verifier's).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use std::time::Duration;

use candle_core::Device;
use serde_json::{Value, json};
use stoke_model::Transformer;
use stoke_reward::StepScore;
use stoke_reward::process_reward::{ProcessRewardConfig, StepScorer};
use stoke_reward::reward_model::{RewardModelConfig, ScoreItem, ScorerSource, SequenceScorer};
use stoke_serve::client::Client;
use stoke_tokenizer::hf::Tokenizer;
use stoke_train::preference::data::scored_conversation;
use stoke_train::prm::{StepRule, score_traces};

/// Rows per forward pass.
pub const BATCH: usize = 16;

/// One reward model, loaded.
pub struct LocalScorer {
    model: Transformer,
    tokenizer: Tokenizer,
    dir: PathBuf,
}

impl LocalScorer {
    /// Loads `dir` (a sequence classifier with one label, with tokenizer files). Errors name the
    /// folder and what is wrong.
    pub fn load(dir: &Path) -> Result<LocalScorer, String> {
        let model =
            Transformer::load(dir, &Device::Cpu).map_err(|e| format!("{}: {e}", dir.display()))?;
        if model.is_token_classifier() {
            return Err(format!(
                "{} is a process reward model (a token classifier); `reward_model` takes a \
                 sequence classifier (`stoke rm`)",
                dir.display()
            ));
        }
        match model.config().score_labels {
            Some(1) => {}
            Some(n) => {
                return Err(format!(
                    "{}: a reward model has one label; this classifier has {n}",
                    dir.display()
                ));
            }
            None => {
                return Err(format!(
                    "{} is a causal LM, not a reward model (train one with `stoke rm`)",
                    dir.display()
                ));
            }
        }
        let tokenizer = Tokenizer::from_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(LocalScorer {
            model: model.into_frozen(),
            tokenizer,
            dir: dir.to_path_buf(),
        })
    }
}

impl SequenceScorer for LocalScorer {
    fn score(&self, items: &[ScoreItem<'_>]) -> Result<Vec<f64>, String> {
        let limit = self.model.config().max_position_embeddings;
        let rows = items
            .iter()
            .map(|item| {
                let ids = scored_conversation(&self.tokenizer, item.prompt, item.completion)?;
                Ok(ids[ids.len().saturating_sub(limit)..].to_vec())
            })
            .collect::<Result<Vec<Vec<u32>>, String>>()
            .map_err(|e| format!("{}: {e}", self.dir.display()))?;
        let mut scores = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(BATCH) {
            let refs: Vec<&[u32]> = chunk.iter().map(Vec::as_slice).collect();
            let values: Vec<f32> = self
                .model
                .score_sequences(&refs)
                .and_then(|t| Ok(t.flatten_all()?.to_vec1()?))
                .map_err(|e| format!("{}: scoring: {e}", self.dir.display()))?;
            scores.extend(values.into_iter().map(f64::from));
        }
        Ok(scores)
    }
}

/// One process reward model, loaded, with the rule that splits completions into steps.
pub struct LocalStepScorer {
    model: Arc<Transformer>,
    tokenizer: Arc<Tokenizer>,
    rule: StepRule,
    dir: PathBuf,
}

impl LocalStepScorer {
    /// Loads `dir` (a token classifier with two labels, with tokenizer files). Errors name the
    /// folder and what is wrong.
    pub fn load(dir: &Path, separator: &str) -> Result<LocalStepScorer, String> {
        let model =
            Transformer::load(dir, &Device::Cpu).map_err(|e| format!("{}: {e}", dir.display()))?;
        if !model.is_token_classifier() || model.config().score_labels != Some(2) {
            return Err(format!(
                "{} is not a process reward model (a token classifier with 2 labels, as `stoke \
                 prm` trains); a sequence classifier is a `reward_model`",
                dir.display()
            ));
        }
        let tokenizer = Tokenizer::from_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(LocalStepScorer {
            model: Arc::new(model.into_frozen()),
            tokenizer: Arc::new(tokenizer),
            rule: StepRule {
                separator: separator.to_string(),
            },
            dir: dir.to_path_buf(),
        })
    }

    /// The same model and tokenizer, splitting by `separator`.
    fn with_separator(&self, separator: &str) -> LocalStepScorer {
        LocalStepScorer {
            model: Arc::clone(&self.model),
            tokenizer: Arc::clone(&self.tokenizer),
            rule: StepRule {
                separator: separator.to_string(),
            },
            dir: self.dir.clone(),
        }
    }
}

impl StepScorer for LocalStepScorer {
    fn score_steps(&self, items: &[ScoreItem<'_>]) -> Result<Vec<Vec<StepScore>>, String> {
        let mut out = Vec::with_capacity(items.len());
        for chunk in items.chunks(BATCH) {
            let traces: Vec<(&str, &str)> =
                chunk.iter().map(|i| (i.prompt, i.completion)).collect();
            let scored = score_traces(&self.model, &self.tokenizer, &self.rule, &traces)
                .map_err(|e| format!("{}: scoring steps: {e}", self.dir.display()))?;
            out.extend(scored.into_iter().map(|trace| {
                trace
                    .steps
                    .iter()
                    .zip(&trace.scores)
                    .map(|(step, &score)| StepScore {
                        start: step.bytes.start,
                        end: step.bytes.end,
                        score,
                    })
                    .collect()
            }));
        }
        Ok(out)
    }
}

/// Loads each reward model folder once for the run's rewards.
#[derive(Default)]
pub struct LocalScorers {
    loaded: Mutex<BTreeMap<PathBuf, Arc<LocalScorer>>>,
    process: Mutex<BTreeMap<PathBuf, Arc<LocalStepScorer>>>,
}

impl ScorerSource for LocalScorers {
    fn scorer(&self, config: &RewardModelConfig) -> Result<Arc<dyn SequenceScorer>, String> {
        if let Some(url) = &config.url {
            return Ok(Arc::new(RemoteScorer::connect(url, config)?));
        }
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(scorer) = loaded.get(&config.model) {
            return Ok(Arc::clone(scorer) as Arc<dyn SequenceScorer>);
        }
        let scorer = Arc::new(LocalScorer::load(&config.model)?);
        loaded.insert(config.model.clone(), Arc::clone(&scorer));
        Ok(scorer)
    }

    fn step_scorer(&self, config: &ProcessRewardConfig) -> Result<Arc<dyn StepScorer>, String> {
        let mut loaded = self.process.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(scorer) = loaded.get(&config.model) {
            return Ok(Arc::new(scorer.with_separator(&config.step_separator)));
        }
        let scorer = Arc::new(LocalStepScorer::load(
            &config.model,
            &config.step_separator,
        )?);
        loaded.insert(config.model.clone(), Arc::clone(&scorer));
        Ok(scorer)
    }
}

/// A reward model on a server (see the module doc).
pub struct RemoteScorer {
    client: Client,
    served_model: String,
    tokenizer: Tokenizer,
    /// The server's context: longer rows keep their last ids.
    max_len: usize,
}

impl RemoteScorer {
    /// Reads the tokenizer of `config.model` and checks the server at `url`.
    pub fn connect(url: &str, config: &RewardModelConfig) -> Result<RemoteScorer, String> {
        let dir = &config.model;
        let tokenizer = Tokenizer::from_dir(dir).map_err(|e| {
            format!(
                "{} (the reward model's tokenizer, needed with `url`): {e}",
                dir.display()
            )
        })?;
        let client = Client::with_timeout(url, Some(Duration::from_secs_f64(config.timeout_s)));
        let (status, models) = client
            .get("/v1/models")
            .map_err(|e| format!("reward model server {url}: {e}"))?;
        if status != 200 {
            return Err(format!(
                "reward model server {url}: GET /v1/models answered {status}"
            ));
        }
        let served = models["data"].as_array().cloned().unwrap_or_default();
        let entry = match &config.served_model {
            Some(name) => served
                .iter()
                .find(|m| m["id"].as_str() == Some(name.as_str()))
                .ok_or_else(|| {
                    let names: Vec<&str> = served.iter().filter_map(|m| m["id"].as_str()).collect();
                    format!(
                        "reward model server {url} does not serve `{name}` (it serves {names:?})"
                    )
                })?,
            None => served
                .first()
                .ok_or_else(|| format!("reward model server {url} serves no model"))?,
        };
        let served_model = entry["id"].as_str().unwrap_or_default().to_string();
        let max_len = entry["max_model_len"]
            .as_u64()
            .map_or(usize::MAX, |n| n as usize);
        let scorer = RemoteScorer {
            client,
            served_model,
            tokenizer,
            max_len,
        };
        // One probe row: the server must score, with one label.
        let probe = scorer
            .tokenizer
            .encode("probe", true)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        let answer = scorer.classify(&[probe])?;
        let labels = answer[0]["num_classes"].as_u64().unwrap_or(0);
        if labels != 1 {
            return Err(format!(
                "reward model server {url}: `{}` scores {labels} labels; a reward model has one",
                scorer.served_model
            ));
        }
        Ok(scorer)
    }

    /// `/classify` on `rows` (raw logits): the answer's `data`, in row order.
    fn classify(&self, rows: &[Vec<u32>]) -> Result<Vec<Value>, String> {
        let url = self.client.url("/classify");
        let body = json!({
            "model": self.served_model,
            "input": rows,
            "use_activation": false,
        });
        let (status, answer) = self
            .client
            .post("/classify", &body)
            .map_err(|e| e.to_string())?;
        if status != 200 {
            let message = answer["error"]["message"]
                .as_str()
                .map_or_else(|| answer.to_string(), str::to_string);
            return Err(format!("{url} answered {status}: {message}"));
        }
        let mut data = answer["data"].as_array().cloned().unwrap_or_default();
        data.sort_by_key(|d| d["index"].as_u64().unwrap_or(u64::MAX));
        if data.len() != rows.len() {
            return Err(format!(
                "{url} answered {} scores for {} rows",
                data.len(),
                rows.len()
            ));
        }
        Ok(data)
    }
}

impl SequenceScorer for RemoteScorer {
    fn score(&self, items: &[ScoreItem<'_>]) -> Result<Vec<f64>, String> {
        let rows = items
            .iter()
            .map(|item| {
                let ids = scored_conversation(&self.tokenizer, item.prompt, item.completion)?;
                Ok(ids[ids.len().saturating_sub(self.max_len)..].to_vec())
            })
            .collect::<Result<Vec<Vec<u32>>, String>>()?;
        let data = self.classify(&rows)?;
        data.iter()
            .enumerate()
            .map(|(i, d)| {
                d["probs"][0].as_f64().ok_or_else(|| {
                    format!(
                        "{}: score {i} has no `probs[0]`: {d}",
                        self.client.url("/classify")
                    )
                })
            })
            .collect()
    }
}
