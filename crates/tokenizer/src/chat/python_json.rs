//! The `tojson` filter of Hugging Face chat templates: Python's
//! `json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)`
//! reproduced on minijinja values.
//!
//! transformers replaces jinja2's `tojson` (which HTML-escapes `<`, `>`, `&`, `'`) with this, and
//! templates print tool schemas and tool-call arguments through it, so the exact bytes matter for
//! token ids: Python's default separators are `", "` and `": "` (`","` between items once an
//! indent is set), non-ASCII text is written as is, maps keep their insertion order, and floats
//! print as Python's `repr` does (`1.0`, `1e-07`, `1e+16`).
//! Not covered: objects Python itself cannot serialize (undefined values, functions) are errors,
//! as they are in transformers.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// Layout options of `json.dumps`.
struct Layout {
    ensure_ascii: bool,
    /// The text repeated once per nesting level, or `None` for a single line.
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
}

/// The minijinja filter: `value | tojson(indent=2, sort_keys=true, ...)`.
pub(crate) fn tojson_filter(value: &Value, kwargs: Kwargs) -> Result<String, Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent_value: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;

    let indent = match indent_value {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::String => {
            Some(v.as_str().unwrap_or_default().to_string())
        }
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(usize::try_from(n).unwrap_or(0))),
            None => {
                return Err(invalid(
                    "tojson: indent must be an integer, a string or none",
                ));
            }
        },
    };
    let (item_separator, key_separator) = match separators {
        Some(pair) if !pair.is_none() => {
            let item = pair.get_item_by_index(0)?;
            let key = pair.get_item_by_index(1)?;
            match (item.as_str(), key.as_str()) {
                (Some(item), Some(key)) => (item.to_string(), key.to_string()),
                _ => return Err(invalid("tojson: separators must be a pair of strings")),
            }
        }
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let layout = Layout {
        ensure_ascii: ensure_ascii.unwrap_or(false),
        indent,
        item_separator,
        key_separator,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    write_value(&mut out, value, &layout, 0)?;
    Ok(out)
}

/// `json.dumps` with transformers' defaults (for tests of the serializer itself).
#[cfg(test)]
fn dumps(value: &Value) -> Result<String, Error> {
    let layout = Layout {
        ensure_ascii: false,
        indent: None,
        item_separator: ", ".into(),
        key_separator: ": ".into(),
        sort_keys: false,
    };
    let mut out = String::new();
    write_value(&mut out, value, &layout, 0)?;
    Ok(out)
}

fn invalid(message: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, message.to_string())
}

fn write_value(
    out: &mut String,
    value: &Value,
    layout: &Layout,
    depth: usize,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&number_repr(value)?),
        ValueKind::String => {
            write_string(out, value.as_str().unwrap_or_default(), layout.ensure_ascii)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, '[', ']', items.len(), layout, depth, |out, index| {
                write_value(out, &items[index], layout, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((map_key(&key)?, item));
            }
            if layout.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, '{', '}', entries.len(), layout, depth, |out, index| {
                let (key, item) = &entries[index];
                write_string(out, key, layout.ensure_ascii);
                out.push_str(&layout.key_separator);
                write_value(out, item, layout, depth + 1)
            })?;
        }
        other => {
            return Err(invalid(&format!(
                "tojson: a value of kind {other} is not JSON serializable"
            )));
        }
    }
    Ok(())
}

fn write_container(
    out: &mut String,
    open: char,
    close: char,
    len: usize,
    layout: &Layout,
    depth: usize,
    mut write_item: impl FnMut(&mut String, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    for index in 0..len {
        if index > 0 {
            out.push_str(&layout.item_separator);
        }
        if let Some(indent) = &layout.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth + 1));
        }
        write_item(out, index)?;
    }
    if let Some(indent) = &layout.indent {
        out.push('\n');
        out.push_str(&indent.repeat(depth));
    }
    out.push(close);
    Ok(())
}

/// Python converts non-string keys of basic types to strings; anything else is a TypeError.
fn map_key(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::Number => number_repr(key),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_string()),
        ValueKind::None => Ok("null".to_string()),
        other => Err(invalid(&format!(
            "tojson: keys must be str, int, float, bool or None, not {other}"
        ))),
    }
}

/// JSON string escaping as Python's encoder does: `"`, `\`, and control characters below U+0020
/// (`\n`, `\r`, `\t`, `\b`, `\f` in short form, others as `\u00XX`); with `ensure_ascii`, every
/// non-ASCII character as `\uXXXX` (surrogate pairs above U+FFFF).
fn write_string(out: &mut String, text: &str, ensure_ascii: bool) {
    out.push('"');
    for ch in text.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn number_repr(value: &Value) -> Result<String, Error> {
    if value.is_integer() {
        // Display of an integer value is its decimal digits, for i64, u64 and i128 alike.
        return Ok(value.to_string());
    }
    let float = f64::try_from(value.clone())?;
    Ok(python_float_repr(float))
}

/// Python's `float.__repr__` as json.dumps writes it: the shortest digits that round-trip, fixed
/// notation for decimal exponents in [-4, 16), scientific (`1e-07`, `1.5e+16`) outside it.
pub(crate) fn python_float_repr(value: f64) -> String {
    if value.is_nan() {
        return "NaN".into();
    }
    if value.is_infinite() {
        return if value > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    if value == 0.0 {
        return if value.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.2345e-7".
    let scientific = format!("{value:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if negative { "-" } else { "" };
    if (-4..16).contains(&exponent) {
        let point = exponent + 1; // position of the decimal point within `digits`
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat(point.unsigned_abs() as usize), digits)
        } else if point as usize >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            let (int_part, frac_part) = digits.split_at(point as usize);
            format!("{int_part}.{frac_part}")
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1);
        let mantissa = if rest.is_empty() {
            first.to_string()
        } else {
            format!("{first}.{rest}")
        };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exp_sign}{:02}", exponent.unsigned_abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minijinja::value::Serde;

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e-7, "1e-07"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1234567890123456.0, "1234567890123456.0"),
            (1.5e300, "1.5e+300"),
            (123.456, "123.456"),
        ];
        for (value, expected) in cases {
            assert_eq!(python_float_repr(value), expected, "repr of {value}");
        }
    }

    #[test]
    fn dumps_uses_python_separators_and_keeps_non_ascii() {
        let value = Value::from(Serde(serde_json::json!({"a": [1, 2.0, "é\n"], "b": null})));
        let text = dumps(&value).expect("serializable");
        assert_eq!(text, r#"{"a": [1, 2.0, "é\n"], "b": null}"#);
    }
}
