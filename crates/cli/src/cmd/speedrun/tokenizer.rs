//! Speedrun stage 2: a byte-level BPE tokenizer trained on the generated text, made into a chat
//! tokenizer.
//!
//! Writes `<out>/tokenizer/`: `tokenizer.json` (stoke's BPE trainer, GPT-4 pre-split pattern, the
//! three special tokens last), `tokenizer_config.json` (eos `<|im_end|>`, pad `<|endoftext|>`, and
//! a ChatML template whose assistant turns sit in `{% generation %}` blocks, so the SFT loss mask
//! covers exactly the assistant's reply and its `<|im_end|>`), and `generation_config.json`
//! (generation stops at `<|im_end|>` or `<|endoftext|>`). The model folders copy these files, so
//! `stoke generate --chat` works on them.
//!
//! Checked before returning: the directory loads, the template renders, and the assistant mask
//! of a sample conversation is neither empty nor everything.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use serde::Serialize;
use stoke_tokenizer::chat::{ChatMessage, ChatOptions};
use stoke_tokenizer::hf::Tokenizer;
use stoke_tokenizer::train::{TrainerConfig, WordCounts, train_bpe};

/// Ends every pretraining document.
pub const END_OF_TEXT: &str = "<|endoftext|>";
/// Opens a chat turn (followed by the role and a newline).
pub const TURN_START: &str = "<|im_start|>";
/// Closes a chat turn; the end-of-sequence token of chat generation.
pub const TURN_END: &str = "<|im_end|>";

/// ChatML with generation tags around the assistant's reply (including its `<|im_end|>`, which
/// the model must learn to emit). Jinja escapes (`'\n'`) keep the newlines exact under
/// `trim_blocks`.
pub const CHAT_TEMPLATE: &str = r"{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Figures for the summary and the report card.
#[derive(Clone, Debug, Serialize)]
pub struct TokenizerStats {
    pub dir: PathBuf,
    pub vocab_size: usize,
    pub merges: usize,
    pub special_tokens: Vec<String>,
    pub training_texts: usize,
    pub training_bytes: u64,
    /// Bytes of text per token over the training texts (compression).
    pub bytes_per_token: f64,
    pub seconds: f64,
    /// A sample document split into its tokens (for the report card).
    pub example_tokens: Vec<String>,
}

/// Trains the tokenizer on `texts` and writes the chat tokenizer folder `<out>/tokenizer`.
pub fn train_chat_tokenizer(
    texts: &[String],
    vocab_size: usize,
    out: &Path,
) -> anyhow::Result<(Tokenizer, TokenizerStats)> {
    let started = Instant::now();
    let dir = out.join("tokenizer");
    let special_tokens = vec![
        END_OF_TEXT.to_string(),
        TURN_START.to_string(),
        TURN_END.to_string(),
    ];
    let config = TrainerConfig::new(vocab_size, special_tokens.clone());
    let mut words = WordCounts::new(&config.pattern)?;
    words.add_texts(texts);
    let bpe = train_bpe(&words, &config, |_| {})?;
    bpe.save(&dir)?;
    let eos_ids: Vec<u32> = [TURN_END, END_OF_TEXT]
        .iter()
        .map(|t| {
            special_tokens
                .iter()
                .position(|s| s == t)
                .map(|i| (bpe.vocab.len() + i) as u32)
        })
        .collect::<Option<_>>()
        .context("special tokens missing after training")?;
    write_json(
        &dir.join("tokenizer_config.json"),
        &serde_json::json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": null,
            "eos_token": TURN_END,
            "pad_token": END_OF_TEXT,
            "add_bos_token": false,
            "model_max_length": 4096,
            "chat_template": CHAT_TEMPLATE,
        }),
    )?;
    write_json(
        &dir.join("generation_config.json"),
        &serde_json::json!({ "eos_token_id": eos_ids, "pad_token_id": eos_ids[1] }),
    )?;

    let tokenizer = Tokenizer::from_dir(&dir)
        .with_context(|| format!("loading the trained tokenizer from {}", dir.display()))?;
    check_chat_mask(&tokenizer)?;
    let (mut bytes, mut tokens) = (0u64, 0u64);
    for text in texts {
        bytes += text.len() as u64;
        tokens += tokenizer.encode(text, false)?.len() as u64;
    }
    let example_tokens = match texts.first() {
        Some(text) => tokenizer
            .encode(text, false)?
            .iter()
            .map(|&id| tokenizer.decode(&[id], false))
            .collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    let stats = TokenizerStats {
        dir,
        vocab_size: tokenizer.vocab_size(),
        merges: bpe.merges.len(),
        special_tokens,
        training_texts: texts.len(),
        training_bytes: bytes,
        bytes_per_token: bytes as f64 / tokens.max(1) as f64,
        seconds: started.elapsed().as_secs_f64(),
        example_tokens,
    };
    Ok((tokenizer, stats))
}

/// The SFT loss mask must cover the reply and nothing of the prompt.
fn check_chat_mask(tokenizer: &Tokenizer) -> anyhow::Result<()> {
    let messages = [
        ChatMessage::user("Mia has 2 apples. How many?"),
        ChatMessage::assistant("Mia has 2 apples.\n#### 2"),
    ];
    let encoding = tokenizer
        .apply_chat_template(&messages, &ChatOptions::default())
        .context("rendering a sample conversation with the speedrun's chat template")?;
    let masked = encoding.assistant_mask.iter().filter(|m| **m).count();
    if masked == 0 || masked == encoding.ids.len() {
        bail!(
            "the chat template's assistant mask covers {masked} of {} tokens",
            encoding.ids.len()
        );
    }
    Ok(())
}

fn write_json(path: &Path, value: &serde_json::Value) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
