//! The canonical form of validated arguments and its sha256.
//!
//! Keys sorted by code point, no whitespace, NFC strings, integers as
//! integers, other numbers in shortest round-trip form, NaN, infinities and
//! negative zero refused. The idempotency key, deduplication and the breaker
//! all key on this hash, so it must be canonical in fact, not in intent.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Map, Number, Value};
use sha2::{Digest, Sha256};
use unicode_normalization::{IsNormalized, UnicodeNormalization, is_nfc_quick};

/// Nesting beyond this is refused rather than recursed into.
pub const MAXIMUM_DEPTH: usize = 128;

/// Integral floats up to this magnitude are exact in f64 and render as integers.
const MAXIMUM_EXACT_INTEGER: f64 = 9_007_199_254_740_992.0;

/// Why a document has no canonical form. Each names the JSON pointer of the
/// offending place and never the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CanonicalError {
    /// NaN or an infinity.
    #[error("{path}: number is not finite")]
    NonFinite { path: String },
    /// -0.0, which has no canonical spelling distinct from 0.
    #[error("{path}: negative zero is not allowed")]
    NegativeZero { path: String },
    /// Two keys that are equal after NFC normalization.
    #[error("{path}: two keys are equal after Unicode normalization")]
    DuplicateKey { path: String },
    /// Nested deeper than [`MAXIMUM_DEPTH`].
    #[error("{path}: nested deeper than {MAXIMUM_DEPTH}")]
    TooDeep { path: String },
}

/// The canonical document, its UTF-8 text and that text's hash.
#[derive(Debug, Clone, PartialEq)]
pub struct CanonicalArguments {
    /// The document with every string NFC-normalized.
    pub value: Value,
    /// The canonical serialization.
    pub text: String,
    /// Lowercase hex sha256 of `text`: `normalized_arguments_hash`.
    pub sha256: String,
}

/// Produces the canonical form of `value`.
pub fn canonicalize(value: &Value) -> Result<CanonicalArguments, CanonicalError> {
    let mut text = String::with_capacity(256);
    let mut path = String::new();
    let value = write_value(value, &mut text, &mut path, 0)?;
    let sha256 = sha256_hex(text.as_bytes());
    Ok(CanonicalArguments { value, text, sha256 })
}

/// Lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

fn nfc(text: &str) -> String {
    // Most strings are already NFC; the quick check avoids re-collecting them.
    match is_nfc_quick(text.chars()) {
        IsNormalized::Yes => text.to_owned(),
        IsNormalized::No | IsNormalized::Maybe => text.nfc().collect(),
    }
}

fn write_value(
    value: &Value,
    out: &mut String,
    path: &mut String,
    depth: usize,
) -> Result<Value, CanonicalError> {
    if depth > MAXIMUM_DEPTH {
        return Err(CanonicalError::TooDeep { path: pointer(path) });
    }
    match value {
        Value::Null => {
            out.push_str("null");
            Ok(Value::Null)
        }
        Value::Bool(flag) => {
            out.push_str(if *flag { "true" } else { "false" });
            Ok(Value::Bool(*flag))
        }
        Value::Number(number) => write_number(number, out, path).map(Value::Number),
        Value::String(text) => {
            let text = nfc(text);
            write_string(&text, out);
            Ok(Value::String(text))
        }
        Value::Array(items) => {
            out.push('[');
            let mut normalized = Vec::with_capacity(items.len());
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                let mark = path.len();
                let _ = write!(path, "/{index}");
                normalized.push(write_value(item, out, path, depth + 1)?);
                path.truncate(mark);
            }
            out.push(']');
            Ok(Value::Array(normalized))
        }
        Value::Object(map) => {
            let mut sorted: BTreeMap<String, &Value> = BTreeMap::new();
            for (key, item) in map {
                if sorted.insert(nfc(key), item).is_some() {
                    return Err(CanonicalError::DuplicateKey { path: pointer(path) });
                }
            }
            out.push('{');
            let mut normalized = Map::with_capacity(sorted.len());
            for (index, (key, item)) in sorted.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_string(&key, out);
                out.push(':');
                let mark = path.len();
                path.push('/');
                path.push_str(&key.replace('~', "~0").replace('/', "~1"));
                let item = write_value(item, out, path, depth + 1)?;
                path.truncate(mark);
                normalized.insert(key, item);
            }
            out.push('}');
            Ok(Value::Object(normalized))
        }
    }
}

fn write_number(number: &Number, out: &mut String, path: &str) -> Result<Number, CanonicalError> {
    if number.is_i64() || number.is_u64() {
        let _ = write!(out, "{number}");
        return Ok(number.clone());
    }
    let float = number.as_f64().unwrap_or(f64::NAN);
    if !float.is_finite() {
        return Err(CanonicalError::NonFinite { path: pointer(path) });
    }
    if float == 0.0 && float.is_sign_negative() {
        return Err(CanonicalError::NegativeZero { path: pointer(path) });
    }
    if float.fract() == 0.0 && float.abs() <= MAXIMUM_EXACT_INTEGER {
        // An integral float is an integer (JSON Schema agrees), so 1.0 and 1
        // hash alike.
        let integer = float as i64;
        let _ = write!(out, "{integer}");
        return Ok(Number::from(integer));
    }
    // serde_json renders floats shortest-round-trip.
    let _ = write!(out, "{number}");
    Ok(number.clone())
}

fn write_string(text: &str, out: &mut String) {
    out.push('"');
    for ch in text.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn pointer(path: &str) -> String {
    if path.is_empty() { "/".to_owned() } else { path.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(value: Value) -> String {
        canonicalize(&value).unwrap().text
    }

    #[test]
    fn sorts_keys_by_code_point_without_whitespace() {
        assert_eq!(
            text(json!({"b": 1, "a": [true, null], "É": "x", "Z": {}})),
            r#"{"Z":{},"a":[true,null],"b":1,"É":"x"}"#
        );
    }

    #[test]
    fn integers_stay_integers_and_floats_are_shortest() {
        assert_eq!(text(json!([1, -7, 1.0, 2.5, 0.1, 1e21, 18446744073709551615u64])),
            "[1,-7,1,2.5,0.1,1e+21,18446744073709551615]");
    }

    #[test]
    fn strings_are_nfc_and_minimally_escaped() {
        let decomposed = "e\u{301}";
        let canonical = canonicalize(&json!({ decomposed: decomposed })).unwrap();
        assert_eq!(canonical.text, "{\"\u{e9}\":\"\u{e9}\"}");
        assert_eq!(text(json!("a\"b\\c\n\u{1}\u{7f}")), "\"a\\\"b\\\\c\\n\\u0001\u{7f}\"");
    }

    #[test]
    fn negative_zero_is_refused_with_its_path() {
        let value: Value = serde_json::from_str(r#"{"a":[1,-0.0]}"#).unwrap();
        let error = canonicalize(&value).unwrap_err();
        assert_eq!(error, CanonicalError::NegativeZero { path: "/a/1".into() });
    }

    #[test]
    fn keys_equal_after_nfc_are_refused() {
        let value = json!({"\u{e9}": 1, "e\u{301}": 2});
        assert!(matches!(canonicalize(&value), Err(CanonicalError::DuplicateKey { .. })));
    }

    #[test]
    fn hash_is_sha256_of_the_text() {
        let canonical = canonicalize(&json!({})).unwrap();
        assert_eq!(canonical.text, "{}");
        assert_eq!(
            canonical.sha256,
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }

    #[test]
    fn depth_is_bounded() {
        let mut value = json!(1);
        for _ in 0..(MAXIMUM_DEPTH + 2) {
            value = json!([value]);
        }
        assert!(matches!(canonicalize(&value), Err(CanonicalError::TooDeep { .. })));
    }
}
