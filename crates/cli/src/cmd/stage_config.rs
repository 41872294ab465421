//! A config table that a recipe (`stoke rft`, `stoke r1`) embeds: written inline as a TOML table
//! (`[cold_start]`) or as the path of a file of its own (`cold_start = "sft.toml"`), holding the
//! config of another command (`stoke train`, `stoke grpo`).
//!
//! The recipe owns a few keys of an embedded config (where it writes, which data it trains on):
//! an inline table must not set them (they would have no effect, so writing one is a mistake and
//! is refused, naming the key), while a referenced file, which must be a complete config of its
//! own, has them replaced (with a note on stderr). Keys the recipe only defaults (the model of a
//! stage: the previous stage's output) are set when absent.
//!
//! What it is not: no parsing of the embedded config (the owning command's file types do that,
//! and name unknown keys); relative paths inside resolve against [`StageTable::base`] (the
//! recipe's folder for inline tables, the referenced file's folder for files).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

/// How a stage is written in the recipe's file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StageEntry {
    /// The path of a TOML file (relative to the recipe's file).
    File(PathBuf),
    Inline(toml::Table),
}

/// An embedded config, read.
#[derive(Clone, Debug, PartialEq)]
pub struct StageTable {
    pub table: toml::Table,
    /// Folder that relative paths inside the table are relative to.
    pub base: PathBuf,
    /// Where the table came from, for messages: `r1.toml [cold_start]` or the file's path.
    pub origin: String,
    pub from_file: bool,
}

impl StageTable {
    /// Reads `entry` as found under `key` of the recipe file `recipe` (in folder `base`).
    pub fn load(
        entry: StageEntry,
        key: &str,
        recipe: &Path,
        base: &Path,
    ) -> anyhow::Result<StageTable> {
        match entry {
            StageEntry::Inline(table) => Ok(StageTable {
                table,
                base: base.to_path_buf(),
                origin: format!("{} [{key}]", recipe.display()),
                from_file: false,
            }),
            StageEntry::File(path) => {
                let path = base.join(path);
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("{key} = {}: cannot read it", path.display()))?;
                let table: toml::Table =
                    toml::from_str(&text).with_context(|| format!("{key} = {}", path.display()))?;
                let folder = path.parent().unwrap_or(Path::new(".")).to_path_buf();
                Ok(StageTable {
                    table,
                    base: folder,
                    origin: path.display().to_string(),
                    from_file: true,
                })
            }
        }
    }

    /// Sets a key the recipe owns (see the module doc): refused in an inline table, replaced in a
    /// file. `key` is a dotted path (`data.train`).
    pub fn set_owned(&mut self, key: &str, value: toml::Value, why: &str) -> anyhow::Result<()> {
        let (table, last) = self.parent_of(key)?;
        if let Some(previous) = table.get(last) {
            if !self.from_file {
                bail!(
                    "{}: `{key}` is set by the recipe ({why}); remove it",
                    self.origin
                );
            }
            if previous != &value {
                eprintln!(
                    "note: {}: `{key}` is replaced by the recipe ({why}): {value}",
                    self.origin
                );
            }
        }
        let (table, last) = self.parent_of_mut(key)?;
        table.insert(last.to_string(), value);
        Ok(())
    }

    /// Sets `key` when the table does not.
    pub fn set_default(&mut self, key: &str, value: toml::Value) -> anyhow::Result<()> {
        let (table, last) = self.parent_of_mut(key)?;
        table.entry(last.to_string()).or_insert(value);
        Ok(())
    }

    /// Whether any of `keys` (dotted paths) is set.
    pub fn has_any(&self, keys: &[&str]) -> bool {
        keys.iter().any(|key| {
            self.parent_of(key)
                .is_ok_and(|(t, last)| t.contains_key(last))
        })
    }

    /// The table holding the last part of `key`, and that part; missing tables count as empty.
    fn parent_of<'k>(&self, key: &'k str) -> anyhow::Result<(&toml::Table, &'k str)> {
        static EMPTY: std::sync::OnceLock<toml::Table> = std::sync::OnceLock::new();
        let parts: Vec<&str> = key.split('.').collect();
        let mut table = &self.table;
        for part in &parts[..parts.len() - 1] {
            table = match table.get(*part) {
                None => EMPTY.get_or_init(toml::Table::new),
                Some(toml::Value::Table(inner)) => inner,
                Some(_) => bail!("{}: `{part}` must be a table", self.origin),
            };
        }
        Ok((table, parts[parts.len() - 1]))
    }

    fn parent_of_mut<'k>(&mut self, key: &'k str) -> anyhow::Result<(&mut toml::Table, &'k str)> {
        let origin = self.origin.clone();
        let parts: Vec<&str> = key.split('.').collect();
        let mut table = &mut self.table;
        for part in &parts[..parts.len() - 1] {
            let entry = table
                .entry(part.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            table = match entry {
                toml::Value::Table(inner) => inner,
                _ => bail!("{origin}: `{part}` must be a table"),
            };
        }
        Ok((table, parts[parts.len() - 1]))
    }
}

/// A path as a TOML string value.
pub fn path_value(path: &Path) -> toml::Value {
    toml::Value::String(path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inline(text: &str) -> StageTable {
        StageTable {
            table: toml::from_str(text).unwrap(),
            base: PathBuf::from("/base"),
            origin: "r1.toml [stage]".into(),
            from_file: false,
        }
    }

    #[test]
    fn an_inline_table_may_not_set_an_owned_key() {
        let mut stage = inline("[data]\ntrain = [\"x.jsonl\"]\n");
        let error = stage
            .set_owned("data.train", toml::Value::Array(vec![]), "the sampled file")
            .unwrap_err();
        assert!(error.to_string().contains("`data.train`"), "{error}");
        assert!(error.to_string().contains("r1.toml [stage]"), "{error}");
    }

    #[test]
    fn a_file_has_owned_keys_replaced_and_defaults_only_fill_gaps() {
        let mut stage = inline("output_dir = \"old\"\n[model]\npretrained = \"mine\"\n");
        stage.from_file = true;
        stage
            .set_owned(
                "output_dir",
                path_value(Path::new("/out/1")),
                "stage folder",
            )
            .unwrap();
        stage
            .set_default("model.pretrained", path_value(Path::new("/prev")))
            .unwrap();
        stage
            .set_default("data.kind", toml::Value::String("chat".into()))
            .unwrap();
        assert_eq!(stage.table["output_dir"].as_str(), Some("/out/1"));
        assert_eq!(stage.table["model"]["pretrained"].as_str(), Some("mine"));
        assert_eq!(stage.table["data"]["kind"].as_str(), Some("chat"));
        assert!(stage.has_any(&["model.preset", "model.pretrained"]));
        assert!(!stage.has_any(&["model.preset", "training.steps"]));
    }
}
