//! JSON reward: extract JSON from the completion (a ```json fence, any ``` fence holding JSON,
//! else the first balanced `{...}` or `[...]`), parse it, and validate it against a JSON Schema
//! with the `jsonschema` crate.
//!
//! Config (`kind = "json_schema"`):
//! - `scoring`: `"binary"` (default: 1 when the document is valid, else 0) or `"fraction"`
//!   (fraction of checks passed: the document parses, each property the schema declares is
//!   present when required and valid when present, and the whole document is valid).
//! - `schema` (JSON value, optional): a schema for every sample; a sample's own `schema` field
//!   takes precedence.
//!
//! Schema `pattern`s run on the `regex` crate (linear time), not on a backtracking engine, and
//! no `$ref` is fetched over the network (the crate's HTTP features are off).
//!
//! Invariants: extraction is one scan with a nesting limit of `MAX_JSON_DEPTH`; a schema that does
//! not compile is `UnparseableGold`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ConfigError;
use crate::verifier::{Check, Details, Outcome, RewardInput, RewardOutcome, Verifier, clip_detail};

/// Deepest nesting of extracted JSON (serde_json itself stops at 128).
const MAX_JSON_DEPTH: usize = 100;
/// Most opening brackets tried as the start of the JSON value.
const MAX_CANDIDATES: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JsonScoring {
    #[default]
    Binary,
    Fraction,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JsonSchemaConfig {
    pub scoring: JsonScoring,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
}

pub struct JsonSchemaVerifier {
    scoring: JsonScoring,
    schema: Option<Value>,
}

fn compile(schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::options()
        .with_pattern_options(jsonschema::PatternOptions::regex())
        .build(schema)
        .map_err(|e| e.to_string())
}

/// The first balanced JSON object or array in `text` (string-aware), if any.
pub fn first_balanced_json(text: &str) -> Option<&str> {
    let bytes = text.as_bytes();
    let mut search_from = 0;
    let mut attempts = 0;
    while let Some(offset) = bytes[search_from..]
        .iter()
        .position(|b| *b == b'{' || *b == b'[')
    {
        let start = search_from + offset;
        attempts += 1;
        if attempts > MAX_CANDIDATES {
            return None;
        }
        let mut stack: Vec<u8> = Vec::new();
        let mut in_string = false;
        let mut escaped = false;
        let mut end = None;
        for (index, &byte) in bytes[start..].iter().enumerate() {
            if in_string {
                match byte {
                    _ if escaped => escaped = false,
                    b'\\' => escaped = true,
                    b'"' => in_string = false,
                    _ => {}
                }
                continue;
            }
            match byte {
                b'"' => in_string = true,
                b'{' | b'[' => {
                    stack.push(byte);
                    if stack.len() > MAX_JSON_DEPTH {
                        break;
                    }
                }
                b'}' | b']' => {
                    let expected = if byte == b'}' { b'{' } else { b'[' };
                    if stack.pop() != Some(expected) {
                        break;
                    }
                    if stack.is_empty() {
                        end = Some(start + index + 1);
                        break;
                    }
                }
                _ => {}
            }
        }
        match end {
            Some(end) => return Some(&text[start..end]),
            // An unbalanced candidate: try the next bracket (at most MAX_CANDIDATES times, so
            // a megabyte of stray brackets costs a bounded number of scans).
            None => search_from = start + 1,
        }
        if search_from >= bytes.len() {
            break;
        }
    }
    None
}

/// The JSON text of a completion: a fenced block that parses, else the first balanced value.
pub fn extract_json(completion: &str) -> Option<&str> {
    let mut rest = completion;
    while let Some(open) = rest.find("```") {
        let after = &rest[open + 3..];
        let body_start = after.find('\n').map_or(after.len(), |n| n + 1);
        let body = &after[body_start..];
        let Some(close) = body.find("```") else { break };
        let block = body[..close].trim();
        if block.starts_with('{') || block.starts_with('[') {
            return Some(block);
        }
        rest = &body[close + 3..];
    }
    first_balanced_json(completion)
}

impl JsonSchemaVerifier {
    pub fn new(config: &JsonSchemaConfig) -> Result<Self, ConfigError> {
        if let Some(schema) = &config.schema {
            compile(schema).map_err(|e| ConfigError::invalid("schema", e))?;
        }
        Ok(Self {
            scoring: config.scoring,
            schema: config.schema.clone(),
        })
    }

    /// Per-property checks for `fraction` scoring.
    fn property_checks(schema: &Value, document: &Value) -> Vec<Check> {
        let mut checks = Vec::new();
        let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
            return checks;
        };
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for (name, subschema) in properties {
            let value = document.get(name);
            let passed = match value {
                None => !required.contains(&name.as_str()),
                Some(value) => compile(subschema)
                    .map(|v| v.is_valid(value))
                    .unwrap_or(false),
            };
            checks.push(Check {
                name: format!("property {name}"),
                passed,
            });
        }
        checks
    }
}

impl Verifier for JsonSchemaVerifier {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        let Some(schema) = input.reference.schema.as_ref().or(self.schema.as_ref()) else {
            return RewardOutcome::missing("schema");
        };
        let validator = match compile(schema) {
            Ok(validator) => validator,
            Err(error) => {
                return RewardOutcome::failed(Outcome::UnparseableGold, format!("schema: {error}"));
            }
        };
        let Some(json_text) = extract_json(input.completion) else {
            return RewardOutcome::failed(Outcome::FormatError, "no JSON object or array found");
        };
        let mut details = Details {
            extracted: Some(clip_detail(json_text)),
            ..Details::default()
        };
        let document: Value = match serde_json::from_str(json_text) {
            Ok(document) => document,
            Err(error) => {
                details.reason = Some(format!("JSON does not parse: {error}"));
                return RewardOutcome::new(0.0, Outcome::FormatError, details);
            }
        };
        let errors: Vec<String> = validator
            .iter_errors(&document)
            .take(20)
            .map(|e| e.to_string())
            .collect();
        let valid = errors.is_empty();
        if !valid {
            details.reason = Some(errors.join("; "));
        }
        let mut checks = vec![Check {
            name: "parses".into(),
            passed: true,
        }];
        checks.extend(Self::property_checks(schema, &document));
        checks.push(Check {
            name: "schema".into(),
            passed: valid,
        });
        let passed = checks.iter().filter(|c| c.passed).count();
        let total = checks.len();
        details.passed = Some(passed);
        details.total = Some(total);
        details.checks = checks;
        match (self.scoring, valid) {
            (_, true) => RewardOutcome::correct(details),
            (JsonScoring::Binary, false) => RewardOutcome::wrong(details),
            (JsonScoring::Fraction, false) => {
                RewardOutcome::new(passed as f64 / total as f64, Outcome::Partial, details)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verifier::Reference;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
            "required": ["name", "age"]
        })
    }

    fn score(scoring: JsonScoring, completion: &str) -> RewardOutcome {
        let reference = Reference {
            schema: Some(schema()),
            ..Reference::default()
        };
        let verifier = JsonSchemaVerifier::new(&JsonSchemaConfig {
            scoring,
            schema: None,
        })
        .unwrap();
        verifier.score(&RewardInput::new("", completion, &reference))
    }

    #[test]
    fn fenced_json_is_extracted_and_validated() {
        let outcome = score(
            JsonScoring::Binary,
            "Here:\n```json\n{\"name\": \"a\", \"age\": 3}\n```",
        );
        assert_eq!(outcome.outcome, Outcome::Correct);
    }

    #[test]
    fn first_balanced_object_is_found_in_prose() {
        let outcome = score(
            JsonScoring::Binary,
            "sure {\"name\": \"}{\", \"age\": 1} done {",
        );
        assert_eq!(outcome.outcome, Outcome::Correct, "{outcome:?}");
    }

    #[test]
    fn invalid_document_fails_binary_and_scores_fraction() {
        let binary = score(JsonScoring::Binary, "{\"name\": \"a\", \"age\": -1}");
        assert_eq!((binary.score, binary.outcome), (0.0, Outcome::Wrong));
        let fraction = score(JsonScoring::Fraction, "{\"name\": \"a\", \"age\": -1}");
        // parses + name + (age fails) + (schema fails) = 2 of 4.
        assert_eq!((fraction.score, fraction.outcome), (0.5, Outcome::Partial));
    }

    #[test]
    fn syntax_errors_and_missing_json_are_format_errors() {
        assert_eq!(
            score(JsonScoring::Binary, "{\"name\": 'a'}").outcome,
            Outcome::FormatError
        );
        assert_eq!(
            score(JsonScoring::Binary, "no json here").outcome,
            Outcome::FormatError
        );
    }

    #[test]
    fn broken_schema_is_unparseable_gold() {
        let reference = Reference {
            schema: Some(json!({"type": 12})),
            ..Reference::default()
        };
        let verifier = JsonSchemaVerifier::new(&JsonSchemaConfig::default()).unwrap();
        let outcome = verifier.score(&RewardInput::new("", "{}", &reference));
        assert_eq!(outcome.outcome, Outcome::UnparseableGold);
    }
}
