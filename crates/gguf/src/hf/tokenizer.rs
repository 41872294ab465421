//! The tokenizer between GGUF and the Hugging Face layout: `tokenizer.json` and
//! `tokenizer_config.json` from the `tokenizer.*` keys, the way transformers 5.24 builds them
//! ([`tokenizer_files`]: byte-level BPE with the pre-tokenizer split its `tokenizer.ggml.pre`
//! names, or SentencePiece BPE with byte fallback and merges generated from the scores; control
//! tokens as special added tokens, the chat template and the special tokens), and back, the
//! `tokenizer.*` keys for a byte-level BPE `tokenizer.json` ([`tokenizer_metadata`]).
//!
//! Not a tokenizer: nothing here encodes or decodes text; `stoke-tokenizer` builds its tokenizer
//! from the JSON this returns. Not the model config (`config`) or tensor names (`names`).
//! Exporting a SentencePiece or other non-byte-level vocabulary is refused, not approximated.
//!
//! Invariants: the JSON built from a file is the one transformers builds from it (the tokenizer
//! crate's reference fixtures check the resulting ids); the file's `tokenizer.ggml.pre` travels
//! in `tokenizer_config.json` under [`PRE_TOKENIZER_KEY`], so an export names the same
//! pre-tokenizer; an export refuses a pre-tokenizer it does not recognize rather than naming one
//! that would tokenize differently.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Map, Value as Json, json};

use crate::error::GgufError;
use crate::read::{GgufFile, Value, unsupported};

/// GPT-2's byte -> printable character table (`bytes_to_unicode`).
fn byte_alphabet() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..256u32 {
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        table[b as usize] = if printable {
            char::from_u32(b).unwrap_or('\0')
        } else {
            extra += 1;
            char::from_u32(255 + extra).unwrap_or('\0')
        };
    }
    table
}

/// A token as a byte-level vocabulary spells it: as written when every character is in GPT-2's
/// byte alphabet, else its UTF-8 bytes through that alphabet (transformers' `byte_level_tokenizer`).
fn byte_level_spelling(token: &str) -> String {
    let alphabet = byte_alphabet();
    let in_alphabet = token.chars().all(|c| alphabet.contains(&c));
    if in_alphabet {
        token.to_string()
    } else {
        token.bytes().map(|b| alphabet[b as usize]).collect()
    }
}

const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const CL100K_SPLIT: &str = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// transformers' `GGUF_PRE_TOKENIZER_SPLITS`: the split regex a `tokenizer.ggml.pre` names. Any
/// other name keeps GPT-2's byte-level pre-tokenizer, as transformers does.
fn pre_tokenizer_split(pre: &str) -> Option<&'static str> {
    Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" | "dbrx" | "smaug-bpe" => LLAMA3_SPLIT,
        "tekken" => TEKKEN_SPLIT,
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" => QWEN2_SPLIT,
        "qwen35" => QWEN35_SPLIT,
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => GPT4O_SPLIT,
        _ => return None,
    })
}

/// llama.cpp token types.
const TOKEN_CONTROL: i64 = 3;
const TOKEN_USER_DEFINED: i64 = 4;

/// Key in the written `tokenizer_config.json` that keeps the file's `tokenizer.ggml.pre`, so an
/// export back to GGUF names the same pre-tokenizer.
pub const PRE_TOKENIZER_KEY: &str = "gguf_pre_tokenizer";

/// `tokenizer.json` and `tokenizer_config.json` for the tokenizer in `file`'s metadata.
pub fn tokenizer_files(file: &GgufFile) -> Result<(Json, Map<String, Json>), GgufError> {
    let model_key = "tokenizer.ggml.model";
    let kind = file
        .str(model_key)?
        .ok_or_else(|| file.missing(model_key))?;
    if kind != "gpt2" && kind != "llama" {
        return Err(unsupported(
            file,
            model_key,
            &format!("{kind:?}"),
            "\"gpt2\" (byte-level BPE), \"llama\" (SentencePiece BPE)",
        ));
    }
    let tokens = file
        .strings("tokenizer.ggml.tokens")?
        .ok_or_else(|| file.missing("tokenizer.ggml.tokens"))?;
    let types = file.ints("tokenizer.ggml.token_type")?.unwrap_or_default();
    if !types.is_empty() && types.len() != tokens.len() {
        return Err(GgufError::Malformed {
            path: file.path().to_path_buf(),
            what: "metadata key `tokenizer.ggml.token_type`".into(),
            message: format!("{} entries for {} tokens", types.len(), tokens.len()),
        });
    }
    let config = tokenizer_config(file, &tokens, kind)?;
    if kind == "llama" {
        // transformers builds these architectures' SentencePiece vocabularies differently (a
        // normalizer for Phi-3, respelled space tokens and merges by position for Gemma).
        let arch = file.str("general.architecture")?.unwrap_or_default();
        if matches!(arch, "phi3" | "gemma" | "gemma2" | "gemma3" | "gemma4") {
            return Err(unsupported(
                file,
                "general.architecture",
                &format!("{arch:?} with a SentencePiece vocabulary"),
                "SentencePiece vocabularies of other architectures (llama, mistral, ...)",
            ));
        }
        return Ok((
            sentencepiece_tokenizer(file, &tokens, &types, &config)?,
            config,
        ));
    }
    let merges = file
        .strings("tokenizer.ggml.merges")?
        .ok_or_else(|| file.missing("tokenizer.ggml.merges"))?;
    let alphabet = byte_alphabet();
    let spelled: std::collections::HashSet<char> = alphabet.iter().copied().collect();
    let in_alphabet = |t: &str| t.chars().all(|c| spelled.contains(&c));
    let mut vocab = Map::new();
    for (id, token) in tokens.iter().enumerate() {
        let key = byte_level_spelling(token);
        // A later duplicate replaces an earlier one, as a Python dict does.
        vocab.remove(&key);
        vocab.insert(key, json!(id));
    }
    let mut merge_pairs = Vec::with_capacity(merges.len());
    for (n, merge) in merges.iter().enumerate() {
        let Some((a, b)) = merge.split_once(' ') else {
            return Err(GgufError::Malformed {
                path: file.path().to_path_buf(),
                what: format!("metadata key `tokenizer.ggml.merges`, entry {n}"),
                message: format!("{merge:?} is not two tokens separated by a space"),
            });
        };
        merge_pairs.push(json!([a, b]));
    }
    let mut added = Vec::new();
    for (id, (token, &kind)) in tokens.iter().zip(&types).enumerate() {
        let special = kind == TOKEN_CONTROL && in_alphabet(token);
        if special || kind == TOKEN_USER_DEFINED {
            added.push(json!({
                "id": id, "content": token, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": special,
            }));
        }
    }
    let pre = file.str("tokenizer.ggml.pre")?;
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let pre_tokenizer = match pre.and_then(pre_tokenizer_split) {
        Some(split) => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": false},
            byte_level(false),
        ]}),
        None => byte_level(true),
    };
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor(&config, &|token: &str| {
            vocab.get(token).and_then(Json::as_u64).map(|id| id as usize)
        }),
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": merge_pairs,
        },
    });

    Ok((tokenizer, config))
}

/// `tokenizer_config.json` from the metadata: the special tokens by name, the add-BOS/EOS flags
/// (a SentencePiece vocabulary that does not say adds BOS, as llama.cpp and transformers do), the
/// chat template and the `tokenizer.ggml.pre` name.
fn tokenizer_config(
    file: &GgufFile,
    tokens: &[&str],
    kind: &str,
) -> Result<Map<String, Json>, GgufError> {
    let pre = file.str("tokenizer.ggml.pre")?;
    let mut config = Map::new();
    config.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
    for (name, key) in [
        ("bos_token", "tokenizer.ggml.bos_token_id"),
        ("eos_token", "tokenizer.ggml.eos_token_id"),
        ("unk_token", "tokenizer.ggml.unknown_token_id"),
        ("pad_token", "tokenizer.ggml.padding_token_id"),
    ] {
        let token = match file.uint(key)? {
            Some(id) => match tokens.get(id as usize) {
                // In a byte-level vocabulary the token is named as the vocabulary spells it (a
                // control token outside the byte alphabet, such as DeepSeek's
                // `<｜begin▁of▁sentence｜>`, is stored respelled, as transformers stores it).
                Some(t) if kind == "gpt2" => json!(byte_level_spelling(t)),
                Some(t) => json!(t),
                None => {
                    return Err(GgufError::Malformed {
                        path: file.path().to_path_buf(),
                        what: format!("metadata key `{key}`"),
                        message: format!(
                            "id {id} is outside the {}-token vocabulary",
                            tokens.len()
                        ),
                    });
                }
            },
            None => Json::Null,
        };
        config.insert(name.into(), token);
    }
    for (name, key) in [
        ("add_bos_token", "tokenizer.ggml.add_bos_token"),
        ("add_eos_token", "tokenizer.ggml.add_eos_token"),
    ] {
        if let Some(flag) = file.bool(key)? {
            config.insert(name.into(), json!(flag));
        }
    }
    if kind == "llama" && !config.contains_key("add_bos_token") {
        config.insert("add_bos_token".into(), json!(true));
    }
    if let Some(template) = file.str("tokenizer.chat_template")? {
        config.insert("chat_template".into(), json!(template));
    }
    if let Some(pre) = pre {
        config.insert(PRE_TOKENIZER_KEY.into(), json!(pre));
    }
    Ok(config)
}

/// transformers' post-processor for a tokenizer built from GGUF: BOS before and EOS after each
/// sequence as `add_bos_token` / `add_eos_token` say (the second sequence of a pair with type id
/// 1), with the ids the vocabulary gives those tokens.
fn post_processor(config: &Map<String, Json>, id_of: &dyn Fn(&str) -> Option<usize>) -> Json {
    let flag = |k: &str| config.get(k).and_then(Json::as_bool).unwrap_or(false);
    let special = |name: &str| -> Option<(String, usize)> {
        let token = config.get(name).and_then(Json::as_str)?;
        id_of(token).map(|id| (token.to_string(), id))
    };
    let mut special_tokens = Map::new();
    let mut template = |type_id: u32, sequence: &str| -> Vec<Json> {
        let mut parts = Vec::new();
        let bos = special("bos_token").filter(|_| flag("add_bos_token"));
        let eos = special("eos_token").filter(|_| flag("add_eos_token"));
        for (token, id) in bos.iter().chain(&eos) {
            special_tokens.insert(
                token.clone(),
                json!({"id": token, "ids": [id], "tokens": [token]}),
            );
        }
        if let Some((token, _)) = &bos {
            parts.push(json!({"SpecialToken": {"id": token, "type_id": type_id}}));
        }
        parts.push(json!({"Sequence": {"id": sequence, "type_id": type_id}}));
        if let Some((token, _)) = &eos {
            parts.push(json!({"SpecialToken": {"id": token, "type_id": type_id}}));
        }
        parts
    };
    let single = template(0, "A");
    let mut pair = template(0, "A");
    pair.extend(template(1, "B"));
    json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": special_tokens})
}

/// llama.cpp token type of the unknown token.
const TOKEN_UNKNOWN: i64 = 2;

/// transformers' `sentencepiece_tokenizer` for a GGUF: `LlamaTokenizer(vocab, merges)` where the
/// merges, when the file has none, are `generate_merges(vocab, scores)`: every split of every token
/// into two tokens of the vocabulary, ordered by the merged token's score (best first), then by the
/// pieces' lengths (longest first), ties in vocabulary order. BPE with byte fallback (`<0xNN>`
/// tokens), a Metaspace pre-tokenizer that puts `▁` before the first piece, and BOS (EOS) added by
/// the post-processor as `add_bos_token` (`add_eos_token`) say.
fn sentencepiece_tokenizer(
    file: &GgufFile,
    tokens: &[&str],
    types: &[i64],
    config: &Map<String, Json>,
) -> Result<Json, GgufError> {
    let scores: Vec<f64> = match file.get("tokenizer.ggml.scores") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_f64().ok_or_else(|| GgufError::KeyType {
                    path: file.path().to_path_buf(),
                    key: "tokenizer.ggml.scores".into(),
                    expected: "an array of numbers".into(),
                    found: v.type_name().into(),
                })
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(file.missing("tokenizer.ggml.scores")),
    };
    if scores.len() != tokens.len() {
        return Err(GgufError::Malformed {
            path: file.path().to_path_buf(),
            what: "metadata key `tokenizer.ggml.scores`".into(),
            message: format!("{} scores for {} tokens", scores.len(), tokens.len()),
        });
    }
    // Python dicts: a repeated token keeps its first position, and its last id and score.
    let mut vocab: HashMap<&str, usize> = HashMap::new();
    let mut score_of: HashMap<&str, f64> = HashMap::new();
    let mut order: Vec<&str> = Vec::new();
    for (id, (&token, &score)) in tokens.iter().zip(&scores).enumerate() {
        if vocab.insert(token, id).is_none() {
            order.push(token);
        }
        score_of.insert(token, score);
    }
    let merges: Vec<Json> = match file.strings("tokenizer.ggml.merges")? {
        Some(list) => list
            .iter()
            .map(|m| match m.split_once(' ') {
                Some((a, b)) => Ok(json!([a, b])),
                None => Err(GgufError::Malformed {
                    path: file.path().to_path_buf(),
                    what: "metadata key `tokenizer.ggml.merges`".into(),
                    message: format!("{m:?} is not two tokens separated by a space"),
                }),
            })
            .collect::<Result<_, _>>()?,
        None => {
            let mut merges: Vec<(&str, &str, f64)> = Vec::new();
            for &merged in &order {
                let mut local: Vec<(&str, &str, f64)> = merged
                    .char_indices()
                    .skip(1)
                    .map(|(at, _)| (&merged[..at], &merged[at..]))
                    .filter(|(l, r)| vocab.contains_key(l) && vocab.contains_key(r))
                    .map(|(l, r)| (l, r, score_of[merged]))
                    .collect();
                local.sort_by_key(|(l, r, _)| (vocab[l], vocab[r]));
                merges.extend(local);
            }
            // Python's sorted(..., reverse=True) is stable: equal keys keep their order, as here.
            merges.sort_by(|a, b| {
                b.2.total_cmp(&a.2)
                    .then(b.0.chars().count().cmp(&a.0.chars().count()))
                    .then(b.1.chars().count().cmp(&a.1.chars().count()))
            });
            merges.into_iter().map(|(l, r, _)| json!([l, r])).collect()
        }
    };
    let vocab_json: Map<String, Json> = vocab
        .iter()
        .map(|(t, &id)| ((*t).to_string(), json!(id)))
        .collect();
    // The class's own special tokens (unk, bos, eos, pad) and the file's control tokens are
    // special added tokens; user-defined ones are plain added tokens.
    let named: Vec<&str> = ["unk_token", "bos_token", "eos_token", "pad_token"]
        .iter()
        .filter_map(|k| config.get(*k).and_then(Json::as_str))
        .collect();
    let mut added = Vec::new();
    for (id, &token) in tokens.iter().enumerate() {
        let kind = types.get(id).copied().unwrap_or(1);
        let special = kind == TOKEN_CONTROL || kind == TOKEN_UNKNOWN || named.contains(&token);
        if (special || kind == TOKEN_USER_DEFINED) && vocab.get(token) == Some(&id) {
            added.push(json!({
                "id": id, "content": token, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": special,
            }));
        }
    }
    let post_processor = post_processor(config, &|token: &str| vocab.get(token).copied());
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": "first", "split": false},
        "post_processor": post_processor,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ]},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
            "ignore_merges": false, "vocab": vocab_json, "merges": merges,
        },
    }))
}

/// The `tokenizer.*` keys for a byte-level BPE `tokenizer.json`, with its `tokenizer_config.json`
/// (special tokens, chat template) and the model's `config.json` (vocabulary size, and the
/// special token ids where the tokenizer config names none).
pub fn tokenizer_metadata(
    tokenizer: &Json,
    tokenizer_config: &Json,
    config: &Json,
) -> Result<Vec<(String, Value)>, String> {
    let model = tokenizer.get("model").ok_or("tokenizer.json: no `model`")?;
    if model.get("type").and_then(Json::as_str) != Some("BPE") {
        return Err("tokenizer.json: only byte-level BPE tokenizers are exported to GGUF".into());
    }
    let vocab = model
        .get("vocab")
        .and_then(Json::as_object)
        .ok_or("tokenizer.json: `model.vocab` is not an object")?;
    let mut by_id: BTreeMap<u64, (String, i64)> = BTreeMap::new();
    for (token, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| format!("tokenizer.json: id of {token:?} is not an integer"))?;
        by_id.insert(id, (token.clone(), 1));
    }
    let added = tokenizer
        .get("added_tokens")
        .and_then(Json::as_array)
        .cloned()
        .unwrap_or_default();
    for entry in &added {
        let (Some(id), Some(content)) = (
            entry.get("id").and_then(Json::as_u64),
            entry.get("content").and_then(Json::as_str),
        ) else {
            return Err("tokenizer.json: an `added_tokens` entry lacks id or content".into());
        };
        let special = entry
            .get("special")
            .and_then(Json::as_bool)
            .unwrap_or(false);
        let kind = if special {
            TOKEN_CONTROL
        } else {
            TOKEN_USER_DEFINED
        };
        by_id.insert(id, (content.to_string(), kind));
    }
    let size = config
        .get("vocab_size")
        .and_then(Json::as_u64)
        .unwrap_or(0)
        .max(by_id.keys().next_back().map_or(0, |&m| m + 1));
    let mut tokens = Vec::with_capacity(size as usize);
    let mut types = Vec::with_capacity(size as usize);
    for id in 0..size {
        match by_id.get(&id) {
            Some((token, kind)) => {
                tokens.push(Value::String(token.clone()));
                types.push(Value::I32(*kind as i32));
            }
            // Rows of the embedding no token uses (vocabularies padded to a multiple of 64),
            // named as llama.cpp's converter names them.
            None => {
                tokens.push(Value::String(format!("[PAD{id}]")));
                types.push(Value::I32(5));
            }
        }
    }
    let merges: Vec<Value> = model
        .get("merges")
        .and_then(Json::as_array)
        .ok_or("tokenizer.json: `model.merges` is not a list")?
        .iter()
        .map(|m| match m {
            Json::String(s) => Ok(Value::String(s.clone())),
            Json::Array(pair) => match pair.as_slice() {
                [Json::String(a), Json::String(b)] => Ok(Value::String(format!("{a} {b}"))),
                _ => Err("tokenizer.json: a merge is not a pair of strings".to_string()),
            },
            _ => Err("tokenizer.json: a merge is not a string or pair".to_string()),
        })
        .collect::<Result<_, _>>()?;
    let pre = match tokenizer_config
        .get(PRE_TOKENIZER_KEY)
        .and_then(Json::as_str)
    {
        Some(pre) => pre.to_string(),
        None => detect_pre_tokenizer(tokenizer)?,
    };
    let mut meta: Vec<(String, Value)> = vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String(pre)),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens)),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        ("tokenizer.ggml.merges".into(), Value::Array(merges)),
    ];
    let id_of = |token: &str| -> Option<u64> {
        by_id
            .iter()
            .find(|(_, (t, _))| t == token)
            .map(|(&id, _)| id)
    };
    let token_field = |name: &str| -> Option<String> {
        match tokenizer_config.get(name)? {
            Json::String(s) => Some(s.clone()),
            Json::Object(o) => o.get("content").and_then(Json::as_str).map(String::from),
            _ => None,
        }
    };
    for (name, key, fallback) in [
        ("bos_token", "tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("eos_token", "tokenizer.ggml.eos_token_id", "eos_token_id"),
        ("unk_token", "tokenizer.ggml.unknown_token_id", ""),
        (
            "pad_token",
            "tokenizer.ggml.padding_token_id",
            "pad_token_id",
        ),
    ] {
        let id = token_field(name)
            .and_then(|t| id_of(&t))
            .or_else(|| match config.get(fallback) {
                Some(Json::Array(ids)) => ids.first().and_then(Json::as_u64),
                Some(v) => v.as_u64(),
                None => None,
            });
        if let Some(id) = id {
            meta.push((key.into(), Value::U32(id as u32)));
        }
    }
    if let Some(flag) = tokenizer_config
        .get("add_bos_token")
        .and_then(Json::as_bool)
    {
        meta.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(flag)));
    }
    if let Some(template) = tokenizer_config.get("chat_template").and_then(Json::as_str) {
        meta.push((
            "tokenizer.chat_template".into(),
            Value::String(template.into()),
        ));
    }
    Ok(meta)
}

/// The `tokenizer.ggml.pre` that names a `tokenizer.json`'s pre-tokenizer, for the shapes stoke
/// recognizes: GPT-2's byte-level regex alone, that regex after single digits (SmolLM), and the
/// split regexes of the table above.
fn detect_pre_tokenizer(tokenizer: &Json) -> Result<String, String> {
    let pre = tokenizer.get("pre_tokenizer").unwrap_or(&Json::Null);
    let kind = |v: &Json| v.get("type").and_then(Json::as_str).map(String::from);
    let byte_level_regex = |v: &Json| {
        kind(v).as_deref() == Some("ByteLevel") && v.get("use_regex") != Some(&json!(false))
    };
    if byte_level_regex(pre) {
        return Ok("gpt-2".into());
    }
    if kind(pre).as_deref() == Some("Sequence") {
        let parts = pre
            .get("pretokenizers")
            .and_then(Json::as_array)
            .cloned()
            .unwrap_or_default();
        if let [digits, byte_level] = parts.as_slice() {
            if kind(digits).as_deref() == Some("Digits")
                && digits.get("individual_digits") == Some(&json!(true))
                && byte_level_regex(byte_level)
            {
                return Ok("smollm".into());
            }
            let regex = digits.pointer("/pattern/Regex").and_then(Json::as_str);
            if kind(digits).as_deref() == Some("Split")
                && kind(byte_level).as_deref() == Some("ByteLevel")
            {
                for (name, split) in [
                    ("llama-bpe", LLAMA3_SPLIT),
                    // GPT-4's cl100k split (stoke's own tokenizer trainer uses it) is Llama 3's
                    // with possessive quantifiers and `\s*[\r\n]` for `\s*[\r\n]+`: the same
                    // pieces, since the possessive parts cannot give back anything the rest
                    // could match and a run of newlines is taken whole by both.
                    ("llama-bpe", CL100K_SPLIT),
                    ("qwen2", QWEN2_SPLIT),
                    ("qwen35", QWEN35_SPLIT),
                    ("tekken", TEKKEN_SPLIT),
                    ("gpt-4o", GPT4O_SPLIT),
                ] {
                    if regex == Some(split) {
                        return Ok(name.into());
                    }
                }
            }
        }
    }
    Err(format!(
        "tokenizer.json: its pre-tokenizer ({}) is not one llama.cpp names (GPT-2 byte-level, \
         SmolLM digits + byte-level, or the Llama 3 / Qwen2 / GPT-4o splits), so a GGUF could \
         not tokenize like it",
        serde_json::to_string(pre).unwrap_or_default()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_matches_gpt2() {
        let a = byte_alphabet();
        assert_eq!(a[b'!' as usize], '!');
        assert_eq!(a[b' ' as usize], 'Ġ');
        assert_eq!(a[b'\n' as usize], 'Ċ');
        assert_eq!(a[0], 'Ā');
        let distinct: std::collections::HashSet<char> = a.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }
}
