//! The `judge` reward's two configuration layers: [`JudgeConfig`] (the `[rewards.NAME]` table,
//! unknown keys rejected) and [`JudgeSettings`] (validated, with the rubric read and the API
//! key looked up), which the verifier runs on.
//!
//! What this is not: the HTTP client (`transport.rs`) or the prompts (`prompt.rs`). Reading
//! `rubric_file` and the `api_key_env` variable happens here, once, when the reward is built;
//! a relative `rubric_file` is resolved by the caller (the run's config folder), not here.
//!
//! Invariant: every field is checked with an error naming it; a built `JudgeSettings` has at
//! least one `http(s)://` server, a non-empty rubric and a scale `lo < hi`.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// `[rewards.NAME] kind = "judge"`'s options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JudgeConfig {
    /// OpenAI-compatible servers (`stoke serve`, vLLM, a hosted API), tried in turn.
    pub urls: Vec<String>,
    /// The served model name sent as `model`; absent: the first id of `GET /v1/models`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default)]
    pub mode: JudgeMode,
    /// What the judge grades against (exactly one of `rubric` and `rubric_file`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rubric: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rubric_file: Option<PathBuf>,
    /// Pointwise: the judge's score range `[lo, hi]`, mapped to `[0, 1]`.
    #[serde(default = "default_scale")]
    pub scale: [f64; 2],
    /// Pairwise and listwise: judge both orders and combine them (position-bias control).
    #[serde(default = "default_true")]
    pub swap: bool,
    /// Judge requests in flight at once, over every group this reward scores.
    #[serde(default = "default_max_concurrency")]
    pub max_concurrency: usize,
    /// Seconds one request may take.
    #[serde(default = "default_timeout_s")]
    pub timeout_s: f64,
    /// Further attempts after a failed request, each on the next server.
    #[serde(default = "default_retries")]
    pub retries: usize,
    /// The judge's answer length (`max_tokens` of the request).
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
    #[serde(default)]
    pub temperature: f64,
    /// The environment variable holding the API key, sent as `Authorization: Bearer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Verdicts remembered (0: no cache).
    #[serde(default = "default_cache_size")]
    pub cache_size: usize,
}

fn default_scale() -> [f64; 2] {
    [1.0, 10.0]
}

fn default_true() -> bool {
    true
}

fn default_max_concurrency() -> usize {
    8
}

fn default_timeout_s() -> f64 {
    60.0
}

fn default_retries() -> usize {
    2
}

fn default_max_tokens() -> usize {
    256
}

fn default_cache_size() -> usize {
    4096
}

/// How the judge looks at a group of completions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JudgeMode {
    /// Each completion alone, on the scale.
    #[default]
    Pointwise,
    /// Pairs of completions of one prompt: which is better.
    Pairwise,
    /// All completions of one prompt at once: a ranking.
    Listwise,
}

impl JudgeMode {
    pub fn name(self) -> &'static str {
        match self {
            JudgeMode::Pointwise => "pointwise",
            JudgeMode::Pairwise => "pairwise",
            JudgeMode::Listwise => "listwise",
        }
    }
}

/// Validated options (see [`JudgeSettings::from_config`]).
#[derive(Clone, PartialEq)]
pub struct JudgeSettings {
    /// Base URLs without a trailing `/` or `/v1`.
    pub servers: Vec<String>,
    pub model: Option<String>,
    pub mode: JudgeMode,
    pub rubric: String,
    pub scale: (f64, f64),
    pub swap: bool,
    pub max_concurrency: usize,
    pub timeout: Duration,
    pub retries: usize,
    pub max_tokens: usize,
    pub temperature: f64,
    pub api_key: Option<String>,
    pub cache_size: usize,
}

impl std::fmt::Debug for JudgeSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The API key stays out of logs.
        f.debug_struct("JudgeSettings")
            .field("servers", &self.servers)
            .field("model", &self.model)
            .field("mode", &self.mode)
            .field("scale", &self.scale)
            .field("swap", &self.swap)
            .field("max_concurrency", &self.max_concurrency)
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .field("cache_size", &self.cache_size)
            .finish_non_exhaustive()
    }
}

/// Bounds that keep a typo from becoming a denial of service on the judge or on memory.
const MAX_CONCURRENCY: usize = 1024;
const MAX_RETRIES: usize = 100;
const MAX_TIMEOUT_S: f64 = 3600.0;
const MAX_ANSWER_TOKENS: usize = 1 << 20;
const MAX_CACHE: usize = 10_000_000;
const MAX_SCALE: f64 = 1e6;

impl JudgeSettings {
    /// Checks every field (errors name it), reads `rubric_file` and the `api_key_env` variable.
    pub fn from_config(config: &JudgeConfig) -> Result<Self, ConfigError> {
        if config.urls.is_empty() {
            return Err(ConfigError::invalid(
                "urls",
                "at least one judge server is required",
            ));
        }
        let servers = config
            .urls
            .iter()
            .enumerate()
            .map(|(index, url)| {
                base_url(url).map_err(|e| ConfigError::invalid(format!("urls[{index}]"), e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(model) = &config.model
            && model.trim().is_empty()
        {
            return Err(ConfigError::invalid(
                "model",
                "is empty (leave it out to use the server's first model)",
            ));
        }
        let rubric = match (&config.rubric, &config.rubric_file) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::invalid(
                    "rubric_file",
                    "give `rubric` or `rubric_file`, not both",
                ));
            }
            (None, None) => {
                return Err(ConfigError::invalid(
                    "rubric",
                    "a judge needs a rubric: `rubric = \"...\"` or `rubric_file = \"PATH\"`",
                ));
            }
            (Some(rubric), None) => rubric.clone(),
            (None, Some(path)) => std::fs::read_to_string(path).map_err(|e| {
                ConfigError::invalid(
                    "rubric_file",
                    format!("cannot read {}: {e}", path.display()),
                )
            })?,
        };
        if rubric.trim().is_empty() {
            let field = if config.rubric.is_some() {
                "rubric"
            } else {
                "rubric_file"
            };
            return Err(ConfigError::invalid(field, "the rubric is empty"));
        }
        let [lo, hi] = config.scale;
        if !(lo.is_finite() && hi.is_finite() && lo.abs() <= MAX_SCALE && hi.abs() <= MAX_SCALE) {
            return Err(ConfigError::invalid(
                "scale",
                format!("bounds must be finite numbers within ±{MAX_SCALE}, got [{lo}, {hi}]"),
            ));
        }
        if lo >= hi {
            return Err(ConfigError::invalid(
                "scale",
                format!("must be [lo, hi] with lo < hi, got [{lo}, {hi}]"),
            ));
        }
        if !(1..=MAX_CONCURRENCY).contains(&config.max_concurrency) {
            return Err(ConfigError::invalid(
                "max_concurrency",
                format!(
                    "must be in 1..={MAX_CONCURRENCY}, got {}",
                    config.max_concurrency
                ),
            ));
        }
        if !(config.timeout_s.is_finite()
            && config.timeout_s > 0.0
            && config.timeout_s <= MAX_TIMEOUT_S)
        {
            return Err(ConfigError::invalid(
                "timeout_s",
                format!(
                    "must be seconds in (0, {MAX_TIMEOUT_S}], got {}",
                    config.timeout_s
                ),
            ));
        }
        if config.retries > MAX_RETRIES {
            return Err(ConfigError::invalid(
                "retries",
                format!("must be at most {MAX_RETRIES}, got {}", config.retries),
            ));
        }
        if !(1..=MAX_ANSWER_TOKENS).contains(&config.max_tokens) {
            return Err(ConfigError::invalid(
                "max_tokens",
                format!(
                    "must be in 1..={MAX_ANSWER_TOKENS}, got {}",
                    config.max_tokens
                ),
            ));
        }
        if !(config.temperature.is_finite() && (0.0..=2.0).contains(&config.temperature)) {
            return Err(ConfigError::invalid(
                "temperature",
                format!("must be in [0, 2], got {}", config.temperature),
            ));
        }
        if config.cache_size > MAX_CACHE {
            return Err(ConfigError::invalid(
                "cache_size",
                format!("must be at most {MAX_CACHE}, got {}", config.cache_size),
            ));
        }
        let api_key = match &config.api_key_env {
            None => None,
            Some(name) if name.trim().is_empty() => {
                return Err(ConfigError::invalid("api_key_env", "is empty"));
            }
            Some(name) => match std::env::var(name) {
                Ok(key) if !key.trim().is_empty() => Some(key.trim().to_string()),
                _ => {
                    return Err(ConfigError::invalid(
                        "api_key_env",
                        format!("the environment variable `{name}` is not set (or empty)"),
                    ));
                }
            },
        };
        Ok(JudgeSettings {
            servers,
            model: config.model.as_ref().map(|m| m.trim().to_string()),
            mode: config.mode,
            rubric: rubric.trim().to_string(),
            scale: (lo, hi),
            swap: config.swap,
            max_concurrency: config.max_concurrency,
            timeout: Duration::from_secs_f64(config.timeout_s),
            retries: config.retries,
            max_tokens: config.max_tokens,
            temperature: config.temperature,
            api_key,
            cache_size: config.cache_size,
        })
    }
}

/// `http://host:port` from a configured URL (a trailing `/` or `/v1` dropped).
fn base_url(url: &str) -> Result<String, String> {
    let trimmed = url.trim().trim_end_matches('/');
    let trimmed = trimmed.strip_suffix("/v1").unwrap_or(trimmed);
    let rest = trimmed
        .strip_prefix("http://")
        .or_else(|| trimmed.strip_prefix("https://"))
        .ok_or_else(|| format!("`{url}` is not an http:// or https:// URL"))?;
    if rest.is_empty() || rest.starts_with('/') || rest.contains(char::is_whitespace) {
        return Err(format!("`{url}` has no host (or contains spaces)"));
    }
    Ok(trimmed.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(toml_body: &str) -> JudgeConfig {
        toml::from_str(toml_body).unwrap_or_else(|e| panic!("{toml_body}: {e}"))
    }

    fn error(toml_body: &str) -> String {
        JudgeSettings::from_config(&config(toml_body))
            .unwrap_err()
            .to_string()
    }

    const OK: &str = "urls = [\"http://127.0.0.1:8000/v1/\"]\nrubric = \"Be helpful.\"";

    #[test]
    fn defaults_are_the_documented_ones() {
        let settings = JudgeSettings::from_config(&config(OK)).unwrap();
        assert_eq!(settings.servers, vec!["http://127.0.0.1:8000".to_string()]);
        assert_eq!(settings.mode, JudgeMode::Pointwise);
        assert_eq!(settings.scale, (1.0, 10.0));
        assert!(settings.swap);
        assert_eq!(settings.max_concurrency, 8);
        assert_eq!(settings.timeout, Duration::from_secs(60));
        assert_eq!(settings.retries, 2);
        assert_eq!(settings.max_tokens, 256);
        assert_eq!(settings.temperature, 0.0);
        assert_eq!(settings.cache_size, 4096);
        assert_eq!(settings.model, None);
        assert_eq!(settings.api_key, None);
    }

    #[test]
    fn each_bad_field_is_named_in_its_error() {
        let cases = [
            ("urls = []\nrubric = \"r\"", "`urls`"),
            ("urls = [\"ftp://x\"]\nrubric = \"r\"", "`urls[0]`"),
            (
                "urls = [\"http://a\", \"http://\"]\nrubric = \"r\"",
                "`urls[1]`",
            ),
            ("urls = [\"http://a\"]", "`rubric`"),
            ("urls = [\"http://a\"]\nrubric = \"  \"", "`rubric`"),
            (
                "urls = [\"http://a\"]\nrubric = \"r\"\nrubric_file = \"r.md\"",
                "`rubric_file`",
            ),
            (
                "urls = [\"http://a\"]\nrubric_file = \"/no/such/rubric.md\"",
                "`rubric_file`",
            ),
            (
                "urls = [\"http://a\"]\nrubric = \"r\"\nmodel = \"\"",
                "`model`",
            ),
            (
                "urls = [\"http://a\"]\nrubric = \"r\"\nscale = [10, 1]",
                "`scale`",
            ),
            (
                "urls = [\"http://a\"]\nrubric = \"r\"\nscale = [1, 1e300]",
                "`scale`",
            ),
            (
                "urls = [\"http://a\"]\nrubric = \"r\"\nmax_concurrency = 0",
                "`max_concurrency`",
            ),
            (
                "urls = [\"http://a\"]\nrubric = \"r\"\ntimeout_s = 0",
                "`timeout_s`",
            ),
            (
                "urls = [\"http://a\"]\nrubric = \"r\"\ntimeout_s = nan",
                "`timeout_s`",
            ),
            (
                "urls = [\"http://a\"]\nrubric = \"r\"\nretries = 1000",
                "`retries`",
            ),
            (
                "urls = [\"http://a\"]\nrubric = \"r\"\nmax_tokens = 0",
                "`max_tokens`",
            ),
            (
                "urls = [\"http://a\"]\nrubric = \"r\"\ntemperature = -1",
                "`temperature`",
            ),
            (
                "urls = [\"http://a\"]\nrubric = \"r\"\ncache_size = 100000000",
                "`cache_size`",
            ),
            (
                "urls = [\"http://a\"]\nrubric = \"r\"\napi_key_env = \"STOKE_JUDGE_TEST_UNSET_KEY\"",
                "`api_key_env`",
            ),
        ];
        for (body, field) in cases {
            let message = error(body);
            assert!(message.contains(field), "{body}: {message}");
        }
    }

    #[test]
    fn a_rubric_file_is_read() {
        let dir = std::env::temp_dir().join(format!("stoke-judge-rubric-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rubric.md");
        std::fs::write(&path, "  Grade correctness first.\n").unwrap();
        let body = format!("urls = [\"https://judge.example\"]\nrubric_file = {path:?}");
        let settings = JudgeSettings::from_config(&config(&body)).unwrap();
        assert_eq!(settings.rubric, "Grade correctness first.");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unknown_keys_and_modes_are_rejected() {
        let unknown = toml::from_str::<JudgeConfig>(&format!("{OK}\nurl = \"http://a\""))
            .unwrap_err()
            .to_string();
        assert!(unknown.contains("unknown field"), "{unknown}");
        let mode = toml::from_str::<JudgeConfig>(&format!("{OK}\nmode = \"tournament\""))
            .unwrap_err()
            .to_string();
        assert!(mode.contains("tournament"), "{mode}");
    }
}
