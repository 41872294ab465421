//! A Hugging Face tokenizer directory, loaded the way `transformers.AutoTokenizer` reads it.
//!
//! `tokenizer.json` (required) is loaded by the `tokenizers` crate, which does all encoding and
//! decoding. Around it this module reads the files transformers uses to name the special tokens and
//! the chat template:
//! - `tokenizer_config.json`: `bos_token`, `eos_token`, `pad_token`, `unk_token` (a string or an
//!   `{"content": ...}` object), `add_bos_token`, `chat_template` (a string, or a list of
//!   `{"name", "template"}` entries);
//! - `special_tokens_map.json`: the same token fields, used only where `tokenizer_config.json`
//!   lacks the key (a key present there, even as null, wins), as transformers 5.24 does;
//! - `generation_config.json`: `eos_token_id` (an int or a list), `pad_token_id`;
//! - `chat_template.jinja`: newer transformers save the default template here; it replaces a
//!   `chat_template` string from `tokenizer_config.json`; `additional_chat_templates/*.jinja` add
//!   named templates.
//!
//! These are foreign files with dozens of fields, so unknown fields are ignored (unlike stoke's
//! own configs); every field that is read is checked, and errors name the file and the field.
//!
//! Not here: chat-template rendering (`chat`), BPE training (`train`), metrics (`metrics`). Only
//! the step that needs this type, tokenizing a rendered conversation (`ChatTemplate::encode`), is
//! defined here, so that `chat` does not name `Tokenizer`.
//!
//! Invariants: every id this type returns (`eos_token_ids`, `pad_token_id`, ...) is in the
//! vocabulary; `decode` never silently drops an id (an id outside the vocabulary is an error, where
//! the `tokenizers` crate would skip it).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value as Json;
use stoke_types::TokenId;

use crate::chat::{
    ChatEncoding, ChatMessage, ChatOptions, ChatTemplate, TemplateTokens, spans_to_token_mask,
};
use crate::error::TokenizerError;

/// Name transformers gives the template stored as a plain string or in `chat_template.jinja`.
pub const DEFAULT_TEMPLATE_NAME: &str = "default";

/// Name of the template transformers picks when tools are passed and the tokenizer has one.
pub const TOOL_USE_TEMPLATE_NAME: &str = "tool_use";

/// Where a tokenizer's parts came from: the folder (for `chat_template.jinja` files; none for a
/// GGUF) and each config object with the path errors name.
struct Sources<'a> {
    dir: Option<&'a Path>,
    config: (serde_json::Map<String, Json>, std::path::PathBuf),
    special_map: (serde_json::Map<String, Json>, std::path::PathBuf),
    generation: (serde_json::Map<String, Json>, std::path::PathBuf),
}

/// The eos id of a GGUF's metadata, which transformers also writes to the generation config.
fn config_eos_id(file: &stoke_gguf::GgufFile) -> Option<u64> {
    file.uint("tokenizer.ggml.eos_token_id").ok().flatten()
}

/// A loaded tokenizer directory: the `tokenizers` model plus the special tokens and chat templates
/// named by its config files.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    tokens: TemplateTokens,
    eos_token_ids: Vec<TokenId>,
    pad_token_id: Option<TokenId>,
    add_bos_token: Option<bool>,
    /// Each template of the directory, compiled, or its compile error kept until it is used:
    /// transformers compiles templates lazily, so a tokenizer whose template minijinja rejects
    /// still loads for plain encoding.
    chat_templates: BTreeMap<String, Result<ChatTemplate, String>>,
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json` and whichever of the optional config files are present; or,
    /// when `dir` is a file, the GGUF tokenizer its metadata describes (see [`Tokenizer::from_gguf`]).
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizerError> {
        if dir.is_file() {
            return Self::from_gguf(dir);
        }
        let tokenizer_path = dir.join("tokenizer.json");
        let text = read_required(&tokenizer_path)?;
        let inner: tokenizers::Tokenizer = serde_json::from_str(&text)
            .map_err(|err| TokenizerError::json(&tokenizer_path, &err))?;

        let config_path = dir.join("tokenizer_config.json");
        let config = read_json_object(&config_path)?;
        let map_path = dir.join("special_tokens_map.json");
        let special_map = read_json_object(&map_path)?;
        let generation_path = dir.join("generation_config.json");
        let generation = read_json_object(&generation_path)?;
        Self::from_parts(
            inner,
            Sources {
                dir: Some(dir),
                config: (config, config_path),
                special_map: (special_map, map_path),
                generation: (generation, generation_path),
            },
        )
    }

    /// The tokenizer described by a GGUF file's `tokenizer.*` metadata, built as transformers
    /// 5.24 builds it (`stoke_gguf::hf::tokenizer_files`): byte-level or SentencePiece BPE with the
    /// file's vocabulary, merges (or scores), pre-tokenizer split, special tokens and chat
    /// template. Errors name the file and the metadata key.
    pub fn from_gguf(path: &Path) -> Result<Self, TokenizerError> {
        let gguf_error = |e: stoke_gguf::GgufError| TokenizerError::Gguf {
            message: e.to_string(),
        };
        let file = stoke_gguf::GgufFile::open(path).map_err(gguf_error)?;
        let (tokenizer_json, config) =
            stoke_gguf::hf::tokenizer_files(&file).map_err(gguf_error)?;
        let inner: tokenizers::Tokenizer =
            serde_json::from_value(tokenizer_json).map_err(|e| TokenizerError::Field {
                path: path.to_path_buf(),
                field: "tokenizer.ggml.*".into(),
                message: format!("the vocabulary does not make a tokenizer: {e}"),
            })?;
        let mut generation = serde_json::Map::new();
        if let Some(id) = config_eos_id(&file) {
            generation.insert("eos_token_id".into(), Json::from(id));
        }
        Self::from_parts(
            inner,
            Sources {
                dir: None,
                config: (config, path.to_path_buf()),
                special_map: (serde_json::Map::new(), path.to_path_buf()),
                generation: (generation, path.to_path_buf()),
            },
        )
    }

    fn from_parts(
        inner: tokenizers::Tokenizer,
        sources: Sources<'_>,
    ) -> Result<Self, TokenizerError> {
        let Sources {
            dir,
            config: (config, config_path),
            special_map: (special_map, map_path),
            generation: (generation, generation_path),
        } = sources;

        // The file each token field is read from: tokenizer_config.json where it has the key.
        let file_of = |field: &str| {
            if config.contains_key(field) {
                (&config, config_path.as_path())
            } else {
                (&special_map, map_path.as_path())
            }
        };
        let mut tokens = TemplateTokens::default();
        for (field, slot) in [
            ("bos_token", &mut tokens.bos),
            ("eos_token", &mut tokens.eos),
            ("pad_token", &mut tokens.pad),
            ("unk_token", &mut tokens.unk),
        ] {
            let (map, path) = file_of(field);
            *slot = token_field(map, path, field)?;
        }
        // bos/eos/pad must name real tokens; unk is only passed to templates as text.
        if let Some(bos) = &tokens.bos {
            id_of(&inner, bos, file_of("bos_token").1, "bos_token")?;
        }
        let mut eos_token_ids = Vec::new();
        if let Some(eos) = &tokens.eos {
            eos_token_ids.push(id_of(&inner, eos, file_of("eos_token").1, "eos_token")?);
        }
        for id in id_list_field(&generation, &generation_path, "eos_token_id", &inner)? {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
        let pad_token_id = match &tokens.pad {
            Some(pad) => Some(id_of(&inner, pad, file_of("pad_token").1, "pad_token")?),
            None => id_list_field(&generation, &generation_path, "pad_token_id", &inner)?
                .first()
                .copied(),
        };
        let add_bos_token = match config.get("add_bos_token") {
            None | Some(Json::Null) => None,
            Some(Json::Bool(b)) => Some(*b),
            Some(other) => return Err(field_error(&config_path, "add_bos_token", other, "a bool")),
        };
        let end_of_turn: Vec<String> = eos_token_ids
            .iter()
            .filter_map(|&id| inner.id_to_token(id))
            .collect();
        let chat_templates =
            load_chat_templates(dir, &config, &config_path, &tokens, &end_of_turn)?;
        Ok(Tokenizer {
            inner,
            tokens,
            eos_token_ids,
            pad_token_id,
            add_bos_token,
            chat_templates,
        })
    }

    /// Token ids of `text`. With `add_special_tokens`, the post-processor of `tokenizer.json`
    /// adds what it is configured to add (e.g. Llama 3's `<|begin_of_text|>`); transformers does
    /// the same for fast tokenizers, so `add_bos_token` from the config is reported by
    /// [`Tokenizer::add_bos_token`] but does not change encoding.
    pub fn encode(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<TokenId>, TokenizerError> {
        Ok(self
            .encode_with_offsets(text, add_special_tokens)?
            .get_ids()
            .to_vec())
    }

    /// The full `tokenizers` encoding (ids plus byte offsets into `text`), for callers that map
    /// characters to tokens, such as the chat template's assistant mask.
    pub fn encode_with_offsets(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<tokenizers::Encoding, TokenizerError> {
        self.inner
            .encode(text, add_special_tokens)
            .map_err(|err| TokenizerError::Encode {
                message: err.to_string(),
            })
    }

    /// The text of `ids`. Fails on the first id that is not in the vocabulary, naming it.
    pub fn decode(
        &self,
        ids: &[TokenId],
        skip_special_tokens: bool,
    ) -> Result<String, TokenizerError> {
        self.check_ids(ids)?;
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|err| TokenizerError::Decode {
                message: err.to_string(),
            })
    }

    /// A fresh incremental detokenizer; feed it ids with [`DecodeStream::step`].
    pub fn decode_stream(&self, skip_special_tokens: bool) -> DecodeStream {
        DecodeStream::new(skip_special_tokens)
    }

    /// Number of ids, added tokens included (ids run from 0 to `vocab_size() - 1`, possibly with
    /// holes that `id_to_token` reports as `None`).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_to_id(&self, token: &str) -> Option<TokenId> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: TokenId) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The first id the two tokenizers map to different tokens (or that only one of them has),
    /// with each one's token: `None` when they share one vocabulary, as a teacher and its
    /// student must.
    pub fn first_vocabulary_difference(
        &self,
        other: &Tokenizer,
    ) -> Option<(TokenId, Option<String>, Option<String>)> {
        let size = self.vocab_size().max(other.vocab_size()) as TokenId;
        (0..size)
            .map(|id| (id, self.id_to_token(id), other.id_to_token(id)))
            .find(|(_, a, b)| a != b)
    }

    /// The beginning-of-sequence token text, if the config names one.
    pub fn bos_token(&self) -> Option<&str> {
        self.tokens.bos.as_deref()
    }

    pub fn bos_token_id(&self) -> Option<TokenId> {
        self.bos_token().and_then(|t| self.token_to_id(t))
    }

    /// The end-of-sequence token text from the token config (generation may stop on more ids).
    pub fn eos_token(&self) -> Option<&str> {
        self.tokens.eos.as_deref()
    }

    /// Every id that ends generation: the config's `eos_token` first, then the ids of
    /// `generation_config.json`'s `eos_token_id`, without duplicates.
    pub fn eos_token_ids(&self) -> Vec<TokenId> {
        self.eos_token_ids.clone()
    }

    /// The padding id: the config's `pad_token`, else `generation_config.json`'s `pad_token_id`.
    pub fn pad_token_id(&self) -> Option<TokenId> {
        self.pad_token_id
    }

    /// `add_bos_token` from `tokenizer_config.json`, if set (informational, see `encode`).
    pub fn add_bos_token(&self) -> Option<bool> {
        self.add_bos_token
    }

    /// The default chat template; `None` also when it failed to compile
    /// ([`Tokenizer::default_chat_template`] says why).
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.default_chat_template().ok()
    }

    /// The default chat template (named "default"), or why there is none usable (absent, or a
    /// compile error). Like transformers, a directory whose templates are all named otherwise
    /// has no default.
    pub fn default_chat_template(&self) -> Result<&ChatTemplate, TokenizerError> {
        self.chat_template_checked(DEFAULT_TEMPLATE_NAME)
            .map_err(|err| match err {
                TokenizerError::NoChatTemplate { .. } => {
                    TokenizerError::NoChatTemplate { name: None }
                }
                other => other,
            })
    }

    /// A chat template by name (e.g. "tool_use" in tokenizers that ship several).
    pub fn chat_template_named(&self, name: &str) -> Option<&ChatTemplate> {
        self.chat_template_checked(name).ok()
    }

    fn chat_template_checked(&self, name: &str) -> Result<&ChatTemplate, TokenizerError> {
        match self.chat_templates.get(name) {
            Some(Ok(template)) => Ok(template),
            Some(Err(message)) => Err(TokenizerError::Template {
                template: name.to_string(),
                message: message.clone(),
            }),
            None => Err(TokenizerError::NoChatTemplate {
                name: Some(name.to_string()),
            }),
        }
    }

    /// Names of all chat templates, sorted.
    pub fn chat_template_names(&self) -> Vec<&str> {
        self.chat_templates.keys().map(String::as_str).collect()
    }

    /// Compiles a template that is not in the tokenizer directory (e.g. a variant with
    /// `{% generation %}` tags) with this tokenizer's special tokens.
    pub fn chat_template_from_source(
        &self,
        name: &str,
        source: &str,
    ) -> Result<ChatTemplate, TokenizerError> {
        ChatTemplate::new(name, source, self.tokens.clone(), self.end_of_turn_tokens())
    }

    /// The texts of the eos tokens, which close a turn in chat templates.
    fn end_of_turn_tokens(&self) -> Vec<String> {
        self.eos_token_ids
            .iter()
            .filter_map(|&id| self.inner.id_to_token(id))
            .collect()
    }

    /// Renders `messages` and tokenizes the text, as transformers'
    /// `apply_chat_template(..., tokenize=True, return_assistant_tokens_mask=True)` does, with the
    /// template transformers would pick: "tool_use" when the options carry a `tools` variable that
    /// is not none and the directory has such a template, else the default.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        options: &ChatOptions,
    ) -> Result<ChatEncoding, TokenizerError> {
        self.chat_template_for(options)?
            .encode(self, messages, options)
    }

    /// The template [`Tokenizer::apply_chat_template`] renders with these options: "tool_use"
    /// when they carry a `tools` variable that is not none and the directory has such a
    /// template, else the default.
    pub fn chat_template_for(
        &self,
        options: &ChatOptions,
    ) -> Result<&ChatTemplate, TokenizerError> {
        let has_tools = options
            .variables
            .get("tools")
            .is_some_and(|tools| !tools.is_none());
        if has_tools && self.chat_templates.contains_key(TOOL_USE_TEMPLATE_NAME) {
            self.chat_template_checked(TOOL_USE_TEMPLATE_NAME)
        } else {
            self.default_chat_template()
        }
    }

    fn check_ids(&self, ids: &[TokenId]) -> Result<(), TokenizerError> {
        match ids.iter().find(|&&id| self.inner.id_to_token(id).is_none()) {
            Some(&id) => Err(TokenizerError::UnknownTokenId {
                id,
                vocab_size: self.vocab_size(),
            }),
            None => Ok(()),
        }
    }
}

/// Tokenizing a rendered conversation: the half of a chat template that needs the tokenizer.
impl ChatTemplate {
    /// Renders and tokenizes `messages`; the mask marks the assistant turns.
    pub fn encode(
        &self,
        tokenizer: &Tokenizer,
        messages: &[ChatMessage],
        options: &ChatOptions,
    ) -> Result<ChatEncoding, TokenizerError> {
        let rendered = self.render(messages, options)?;
        let encoding = tokenizer.encode_with_offsets(&rendered.text, false)?;
        let assistant_mask = spans_to_token_mask(&encoding, &rendered.assistant_spans);
        Ok(ChatEncoding {
            text: rendered.text,
            ids: encoding.get_ids().to_vec(),
            assistant_mask,
        })
    }
}

/// Incremental detokenizer for streaming generation: each [`DecodeStream::step`] returns the text
/// that the ids so far add to what was already returned, or `None` while the new id only holds
/// part of a character (byte-level BPE splits multi-byte UTF-8 characters across tokens) or
/// otherwise changes nothing visible. Concatenating every returned piece gives
/// `decode(all_ids)` (minus a trailing incomplete character, which [`DecodeStream::finish`]
/// returns as U+FFFD).
///
/// The state is owned and the tokenizer is passed to each call, so one shared tokenizer can serve
/// many concurrent streams. The work per step is bounded: only the ids since the last complete
/// piece are decoded again (the algorithm of the `tokenizers` crate's `DecodeStream`).
#[derive(Debug, Clone)]
pub struct DecodeStream {
    skip_special_tokens: bool,
    ids: Vec<TokenId>,
    prefix: String,
    prefix_index: usize,
}

impl DecodeStream {
    pub fn new(skip_special_tokens: bool) -> Self {
        DecodeStream {
            skip_special_tokens,
            ids: Vec::new(),
            prefix: String::new(),
            prefix_index: 0,
        }
    }

    /// Adds one generated id; returns the new text, if any became complete.
    pub fn step(
        &mut self,
        tokenizer: &Tokenizer,
        id: TokenId,
    ) -> Result<Option<String>, TokenizerError> {
        tokenizer.check_ids(&[id])?;
        tokenizers::step_decode_stream(
            &tokenizer.inner,
            vec![id],
            self.skip_special_tokens,
            &mut self.ids,
            &mut self.prefix,
            &mut self.prefix_index,
        )
        .map_err(|err| TokenizerError::Decode {
            message: err.to_string(),
        })
    }

    /// Ends the stream: returns text still held back (an incomplete character decodes to
    /// U+FFFD, as in `decode`), or `None` if everything was already returned.
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<Option<String>, TokenizerError> {
        let text = tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        let pending = text
            .get(self.prefix.len()..)
            .unwrap_or_default()
            .to_string();
        *self = DecodeStream::new(self.skip_special_tokens);
        Ok(if pending.is_empty() {
            None
        } else {
            Some(pending)
        })
    }
}

fn read_required(path: &Path) -> Result<String, TokenizerError> {
    if !path.exists() {
        return Err(TokenizerError::MissingFile {
            path: path.to_path_buf(),
        });
    }
    read_text(path)
}

fn read_text(path: &Path) -> Result<String, TokenizerError> {
    std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The top-level object of an optional JSON file (empty when the file is absent).
fn read_json_object(path: &Path) -> Result<serde_json::Map<String, Json>, TokenizerError> {
    if !path.exists() {
        return Ok(serde_json::Map::new());
    }
    let text = read_text(path)?;
    match serde_json::from_str::<Json>(&text).map_err(|err| TokenizerError::json(path, &err))? {
        Json::Object(map) => Ok(map),
        other => Err(TokenizerError::Field {
            path: path.to_path_buf(),
            field: "(top level)".into(),
            message: format!("expected a JSON object, found {}", json_kind(&other)),
        }),
    }
}

/// A special-token field: a string, an `{"content": "..."}` object (transformers' serialized
/// `AddedToken`), or null/absent.
fn token_field(
    map: &serde_json::Map<String, Json>,
    path: &Path,
    field: &str,
) -> Result<Option<String>, TokenizerError> {
    match map.get(field) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(Json::Object(obj)) => match obj.get("content") {
            Some(Json::String(s)) => Ok(Some(s.clone())),
            _ => Err(TokenizerError::Field {
                path: path.to_path_buf(),
                field: format!("{field}.content"),
                message: "expected a string with the token's text".into(),
            }),
        },
        Some(other) => Err(field_error(
            path,
            field,
            other,
            "a string or an object with `content`",
        )),
    }
}

fn id_of(
    inner: &tokenizers::Tokenizer,
    token: &str,
    path: &Path,
    field: &str,
) -> Result<TokenId, TokenizerError> {
    inner
        .token_to_id(token)
        .ok_or_else(|| TokenizerError::Field {
            path: path.to_path_buf(),
            field: field.to_string(),
            message: format!("token {token:?} is not in the vocabulary of tokenizer.json"),
        })
}

/// A field holding a token id or a list of them (generation_config's `eos_token_id`).
fn id_list_field(
    map: &serde_json::Map<String, Json>,
    path: &Path,
    field: &str,
    inner: &tokenizers::Tokenizer,
) -> Result<Vec<TokenId>, TokenizerError> {
    let values: Vec<&Json> = match map.get(field) {
        None | Some(Json::Null) => return Ok(Vec::new()),
        Some(Json::Array(items)) => items.iter().collect(),
        Some(single) => vec![single],
    };
    let mut ids = Vec::with_capacity(values.len());
    for value in values {
        let id = value
            .as_u64()
            .and_then(|v| TokenId::try_from(v).ok())
            .ok_or_else(|| field_error(path, field, value, "a token id or a list of token ids"))?;
        if inner.id_to_token(id).is_none() {
            return Err(TokenizerError::Field {
                path: path.to_path_buf(),
                field: field.to_string(),
                message: format!(
                    "token id {id} is not in the vocabulary (size {})",
                    inner.get_vocab_size(true)
                ),
            });
        }
        ids.push(id);
    }
    Ok(ids)
}

fn field_error(path: &Path, field: &str, found: &Json, expected: &str) -> TokenizerError {
    TokenizerError::Field {
        path: path.to_path_buf(),
        field: field.to_string(),
        message: format!("expected {expected}, found {}", json_kind(found)),
    }
}

fn json_kind(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "a bool",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "an object",
    }
}

/// Collects the chat templates: `tokenizer_config.json`'s `chat_template`, then
/// `chat_template.jinja` (replacing the default), then `additional_chat_templates/*.jinja`.
fn load_chat_templates(
    dir: Option<&Path>,
    config: &serde_json::Map<String, Json>,
    config_path: &Path,
    tokens: &TemplateTokens,
    end_of_turn: &[String],
) -> Result<BTreeMap<String, Result<ChatTemplate, String>>, TokenizerError> {
    let mut sources: BTreeMap<String, String> = BTreeMap::new();
    match config.get("chat_template") {
        None | Some(Json::Null) => {}
        Some(Json::String(source)) => {
            sources.insert(DEFAULT_TEMPLATE_NAME.into(), source.clone());
        }
        Some(Json::Array(entries)) => {
            for (index, entry) in entries.iter().enumerate() {
                let name = entry.get("name").and_then(Json::as_str);
                let source = entry.get("template").and_then(Json::as_str);
                match (name, source) {
                    (Some(name), Some(source)) => {
                        sources.insert(name.to_string(), source.to_string());
                    }
                    _ => {
                        return Err(TokenizerError::Field {
                            path: config_path.to_path_buf(),
                            field: format!("chat_template[{index}]"),
                            message: "expected an object with string fields `name` and `template`"
                                .into(),
                        });
                    }
                }
            }
        }
        Some(other) => {
            return Err(field_error(
                config_path,
                "chat_template",
                other,
                "a string or a list of named templates",
            ));
        }
    }
    // A GGUF has no folder: its one template is the metadata's.
    let Some(dir) = dir else {
        return Ok(compile_templates(sources, tokens, end_of_turn));
    };
    let jinja_path = dir.join("chat_template.jinja");
    if jinja_path.exists() {
        sources.insert(DEFAULT_TEMPLATE_NAME.into(), read_text(&jinja_path)?);
    }
    let extra_dir = dir.join("additional_chat_templates");
    if extra_dir.is_dir() {
        let entries = std::fs::read_dir(&extra_dir).map_err(|source| TokenizerError::Io {
            path: extra_dir.clone(),
            source,
        })?;
        for entry in entries {
            let path = entry
                .map_err(|source| TokenizerError::Io {
                    path: extra_dir.clone(),
                    source,
                })?
                .path();
            if path.extension().and_then(|e| e.to_str()) == Some("jinja")
                && let Some(name) = path.file_stem().and_then(|s| s.to_str())
            {
                sources.insert(name.to_string(), read_text(&path)?);
            }
        }
    }
    Ok(compile_templates(sources, tokens, end_of_turn))
}

/// Each template compiled, or its compile error kept until the template is used.
fn compile_templates(
    sources: BTreeMap<String, String>,
    tokens: &TemplateTokens,
    end_of_turn: &[String],
) -> BTreeMap<String, Result<ChatTemplate, String>> {
    sources
        .into_iter()
        .map(|(name, source)| {
            let compiled = ChatTemplate::new(&name, &source, tokens.clone(), end_of_turn.to_vec());
            let kept = compiled.map_err(|err| match err {
                TokenizerError::Template { message, .. } => message,
                other => other.to_string(),
            });
            (name, kept)
        })
        .collect()
}
