//! The table-level plumbing every command's config goes through (`stoke train`, `stoke grpo`,
//! `stoke dpo`): TOML text to a table, renamed keys moved to their new names, `--set`
//! overrides ([`prepare_table`] does both in the one order every command uses), the folder
//! relative paths resolve against ([`base_dir`]), the typed file struct with key-path errors,
//! and the resume check's comparison of two resolved configs.
//!
//! Renamed keys: the sections every command shares use one vocabulary (`[optimizer]
//! clip_grad_norm`, `[checkpoint] every / keep`, `[eval] every`). A key under its old name is
//! still read for one release: [`migrate_renamed`] moves it to the new name and prints a
//! deprecation warning naming both (a file that sets both is refused, naming both).
//!
//! What it is not: defaults or validation (each command's resolve step), or file discovery.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::ConfigError;

/// A key that moved: `old` (dotted path) is read as `new` for one release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Renamed {
    pub old: &'static str,
    pub new: &'static str,
}

/// The starting model's one name, for every command (a model folder or a GGUF file).
pub const MODEL_PATH: &str = "model.path";

/// Clipping's one name, for every command.
pub const CLIP_GRAD_NORM: &str = "optimizer.clip_grad_norm";

/// The clip norm `optimizer.clip_grad_norm` asks for: unset is 1.0 (TRL's and the trainers'
/// default), 0 turns clipping off.
pub fn clip_grad_norm(value: Option<f64>) -> Option<f64> {
    match value {
        None => Some(1.0),
        Some(0.0) => None,
        Some(c) => Some(c),
    }
}

/// Parses TOML text (`origin` names it in errors).
pub fn parse_table(text: &str, origin: &Path) -> Result<toml::Table, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Syntax {
        path: origin.to_path_buf(),
        message: e.to_string(),
    })
}

/// Reads and parses a TOML file.
pub fn read_table(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_table(&text, path)
}

/// A parsed config table made ready to deserialise, the same way for every command: renamed
/// keys moved to their new names (a warning printed for each), then the `--set` overrides
/// applied, old names in them rewritten first (so an override of an old name replaces the
/// file's value instead of clashing with it).
pub fn prepare_table(
    mut table: toml::Table,
    origin: &str,
    sets: &[String],
    renamed: &[Renamed],
) -> Result<toml::Table, ConfigError> {
    migrate_renamed_with_warnings(&mut table, renamed, origin)?;
    super::file::apply_overrides(&mut table, &rename_sets(sets, renamed))?;
    Ok(table)
}

/// The folder a config file's relative paths are resolved against: the file's own (`.` for a
/// bare file name).
pub fn base_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// A key error's message without the "in `table`" context lines toml adds (the key path already
/// says where), on one line.
pub fn without_context_lines(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with("in `"))
        .collect::<Vec<&str>>()
        .join(" ")
}

/// Deserialises a table into a file struct, naming the offending key by its dotted path.
pub fn from_table<T: DeserializeOwned>(table: toml::Table, origin: &str) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| ConfigError::Key {
        file: origin.to_string(),
        key: e.path().to_string(),
        message: e.inner().to_string(),
    })
}

/// The table at a dotted path, if every part exists and is a table.
fn table_at<'a>(table: &'a mut toml::Table, parts: &[&str]) -> Option<&'a mut toml::Table> {
    let mut current = table;
    for part in parts {
        current = match current.get_mut(*part) {
            Some(toml::Value::Table(t)) => t,
            _ => return None,
        };
    }
    Some(current)
}

/// The table at the dotted path `parts` under `table`, creating missing tables. Err: the dotted
/// prefix that names a value instead of a table (`--set` and the renames both walk this way).
pub(super) fn table_at_or_insert<'a>(
    table: &'a mut toml::Table,
    parts: &[&str],
) -> Result<&'a mut toml::Table, String> {
    let mut current = table;
    for (depth, part) in parts.iter().enumerate() {
        let entry = current
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        current = match entry {
            toml::Value::Table(t) => t,
            _ => return Err(parts[..=depth].join(".")),
        };
    }
    Ok(current)
}

/// Moves every `old` key present to its `new` name (creating tables as needed) and returns one
/// deprecation message per moved key; both names set is an error naming them.
pub fn migrate_renamed(
    table: &mut toml::Table,
    renamed: &[Renamed],
    origin: &str,
) -> Result<Vec<String>, ConfigError> {
    let mut messages = Vec::new();
    for rename in renamed {
        let old: Vec<&str> = rename.old.split('.').collect();
        let Some((old_leaf, old_parents)) = old.split_last() else {
            continue;
        };
        let Some(value) = table_at(table, old_parents).and_then(|t| t.remove(*old_leaf)) else {
            continue;
        };
        // A table the move left empty goes too (`[out] dir` -> `output_dir` leaves no `[out]`).
        for depth in (1..=old_parents.len()).rev() {
            let (leaf, parents) = (old_parents[depth - 1], &old_parents[..depth - 1]);
            let Some(parent) = table_at(table, parents) else {
                break;
            };
            if parent
                .get(leaf)
                .and_then(toml::Value::as_table)
                .is_some_and(|t| t.is_empty())
            {
                parent.remove(leaf);
            } else {
                break;
            }
        }
        let new: Vec<&str> = rename.new.split('.').collect();
        let Some((new_leaf, new_parents)) = new.split_last() else {
            continue;
        };
        let current =
            table_at_or_insert(table, new_parents).map_err(|prefix| ConfigError::Key {
                file: origin.to_string(),
                key: rename.new.to_string(),
                message: format!("`{prefix}` is a value, not a table"),
            })?;
        if current.contains_key(*new_leaf) {
            return Err(ConfigError::Key {
                file: origin.to_string(),
                key: rename.old.to_string(),
                message: format!(
                    "renamed to `{}`, which is also set; keep only `{}`",
                    rename.new, rename.new
                ),
            });
        }
        current.insert(new_leaf.to_string(), value);
        messages.push(format!(
            "{origin}: `{}` is deprecated; it is read as `{}` (use that name, the old one goes \
             in the next release)",
            rename.old, rename.new
        ));
    }
    Ok(messages)
}

/// [`migrate_renamed`], printing each deprecation as a warning on stderr.
pub fn migrate_renamed_with_warnings(
    table: &mut toml::Table,
    renamed: &[Renamed],
    origin: &str,
) -> Result<(), ConfigError> {
    for message in migrate_renamed(table, renamed, origin)? {
        eprintln!("warning: {message}");
    }
    Ok(())
}

/// `--set key=value` arguments with renamed keys written under their new names (a warning
/// printed for each), so an override of an old name replaces the file's value instead of
/// clashing with it.
pub fn rename_sets(sets: &[String], renamed: &[Renamed]) -> Vec<String> {
    sets.iter()
        .map(|arg| {
            let Some((key, value)) = arg.split_once('=') else {
                return arg.clone();
            };
            match renamed.iter().find(|r| r.old == key.trim()) {
                Some(r) => {
                    eprintln!(
                        "warning: --set {}: `{}` is deprecated; it is read as `{}`",
                        arg, r.old, r.new
                    );
                    format!("{}={value}", r.new)
                }
                None => arg.clone(),
            }
        })
        .collect()
}

/// `(key, saved, current)` for every dotted key whose value differs between two resolved
/// configs (their file forms), leaving out `free` keys (an entry ending in `.` frees a whole
/// section). The resume check of every command.
pub fn differences<T: Serialize>(
    saved: &T,
    current: &T,
    free: &[&str],
) -> Vec<(String, String, String)> {
    let flatten = |config: &T| {
        let mut out = BTreeMap::new();
        if let Ok(value) = toml::Value::try_from(config) {
            flatten_into("", &value, &mut out);
        }
        out
    };
    let (a, b) = (flatten(saved), flatten(current));
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let is_free = |key: &str| {
        free.iter()
            .any(|f| key == *f || (f.ends_with('.') && key.starts_with(f)))
    };
    keys.into_iter()
        .filter(|key| !is_free(key))
        .filter(|key| a.get(*key) != b.get(*key))
        .map(|key| {
            let show = |v: Option<&String>| v.cloned().unwrap_or_else(|| "(unset)".into());
            (key.clone(), show(a.get(key)), show(b.get(key)))
        })
        .collect()
}

fn flatten_into(prefix: &str, value: &toml::Value, out: &mut BTreeMap<String, String>) {
    match value {
        toml::Value::Table(table) => {
            for (k, v) in table {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten_into(&key, v, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RENAMED: &[Renamed] = &[
        Renamed {
            old: "training.clip_norm",
            new: "optimizer.clip_grad_norm",
        },
        Renamed {
            old: "training.keep_last",
            new: "checkpoint.keep",
        },
    ];

    #[test]
    fn old_names_move_to_the_new_ones_with_a_message_each() {
        let mut table = parse_table(
            "[training]\nsteps = 3\nclip_norm = 0.5\nkeep_last = 4\n",
            Path::new("t.toml"),
        )
        .expect("parses");
        let messages = migrate_renamed(&mut table, RENAMED, "t.toml").expect("migrates");
        assert_eq!(messages.len(), 2);
        assert!(
            messages[0].contains("`training.clip_norm` is deprecated"),
            "{}",
            messages[0]
        );
        assert!(messages[0].contains("`optimizer.clip_grad_norm`"));
        assert_eq!(table["optimizer"]["clip_grad_norm"].as_float(), Some(0.5));
        assert_eq!(table["checkpoint"]["keep"].as_integer(), Some(4));
        assert!(table["training"].get("clip_norm").is_none());
        assert_eq!(table["training"]["steps"].as_integer(), Some(3));
    }

    #[test]
    fn both_names_set_is_refused_naming_both() {
        let mut table = parse_table(
            "[training]\nclip_norm = 0.5\n[optimizer]\nclip_grad_norm = 1.0\n",
            Path::new("t.toml"),
        )
        .expect("parses");
        let error = migrate_renamed(&mut table, RENAMED, "t.toml")
            .expect_err("refused")
            .to_string();
        assert!(error.contains("training.clip_norm"), "{error}");
        assert!(error.contains("optimizer.clip_grad_norm"), "{error}");
    }

    #[test]
    fn new_names_alone_give_no_message() {
        let mut table = parse_table("[optimizer]\nclip_grad_norm = 1.0\n", Path::new("t.toml"))
            .expect("parses");
        assert!(
            migrate_renamed(&mut table, RENAMED, "t.toml")
                .expect("ok")
                .is_empty()
        );
    }

    #[test]
    fn overrides_of_old_names_are_written_under_the_new_ones() {
        let sets = vec![
            "training.clip_norm=0.5".to_string(),
            "training.steps=3".to_string(),
        ];
        assert_eq!(
            rename_sets(&sets, RENAMED),
            vec![
                "optimizer.clip_grad_norm=0.5".to_string(),
                "training.steps=3".to_string()
            ]
        );
    }

    #[test]
    fn differences_skip_free_keys_and_sections() {
        #[derive(Serialize)]
        struct C {
            a: u32,
            b: u32,
            eval: BTreeMap<String, u32>,
        }
        let x = C {
            a: 1,
            b: 2,
            eval: [("every".to_string(), 5)].into(),
        };
        let y = C {
            a: 1,
            b: 3,
            eval: [("every".to_string(), 9)].into(),
        };
        assert_eq!(
            differences(&x, &y, &["eval."]),
            vec![("b".into(), "2".into(), "3".into())]
        );
        assert!(differences(&x, &y, &["b", "eval."]).is_empty());
    }
}
