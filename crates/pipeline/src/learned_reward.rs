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
//! What it is not: a server client (a reward model on other machines is a later piece) or the
//! post-processing (normalization, clipping: the verifier's).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use candle_core::Device;
use stoke_model::Transformer;
use stoke_reward::reward_model::{RewardModelConfig, ScoreItem, ScorerSource, SequenceScorer};
use stoke_tokenizer::hf::Tokenizer;
use stoke_train::preference::data::scored_conversation;

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

/// Loads each reward model folder once for the run's rewards.
#[derive(Default)]
pub struct LocalScorers {
    loaded: Mutex<BTreeMap<PathBuf, Arc<LocalScorer>>>,
}

impl ScorerSource for LocalScorers {
    fn scorer(&self, config: &RewardModelConfig) -> Result<Arc<dyn SequenceScorer>, String> {
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(scorer) = loaded.get(&config.model) {
            return Ok(Arc::clone(scorer) as Arc<dyn SequenceScorer>);
        }
        let scorer = Arc::new(LocalScorer::load(&config.model)?);
        loaded.insert(config.model.clone(), Arc::clone(&scorer));
        Ok(scorer)
    }
}
