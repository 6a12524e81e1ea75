//! The canonical form of validated arguments and its sha256.
//!
//! Keys sorted by code point, no whitespace, NFC strings, integers as
//! integers, other numbers in shortest round-trip form, NaN, infinities and
//! negative zero refused. The idempotency key, deduplication and the breaker
//! all key on this hash, so it must be canonical in fact, not in intent.

use std::borrow::Cow;
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
    /// A string or key holds U+0000, which no store records as text.
    #[error("{path}: a string holds the character U+0000")]
    Nul { path: String },
}

/// Whether any string or key of `value` holds U+0000: arguments that no
/// store can record as they are, refused before anything is written.
pub fn holds_nul(value: &Value) -> bool {
    match value {
        Value::String(text) => text.contains('\0'),
        Value::Array(items) => items.iter().any(holds_nul),
        Value::Object(map) => map
            .iter()
            .any(|(key, item)| key.contains('\0') || holds_nul(item)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

/// The canonical document, its UTF-8 text and that text's hash.
#[derive(Debug, Clone, PartialEq)]
pub struct CanonicalArguments {
    /// The document with every string NFC-normalized and every integral
    /// number an integer: what is hashed is what is executed.
    pub value: Value,
    /// The canonical serialization.
    pub text: String,
    /// Lowercase hex sha256 of `text`: `normalized_arguments_hash`.
    pub sha256: String,
}

/// Produces the canonical form of `value`, taking it so that the common case
/// (already normalized) moves it into the result without a copy.
pub fn canonicalize(value: Value) -> Result<CanonicalArguments, CanonicalError> {
    let mut writer = Writer {
        out: String::with_capacity(256),
        path: Vec::new(),
        changed: false,
    };
    writer.value(&value, 0)?;
    let Writer {
        out: text, changed, ..
    } = writer;
    let value = if changed { normalized(value) } else { value };
    let sha256 = sha256_hex(text.as_bytes());
    Ok(CanonicalArguments {
        value,
        text,
        sha256,
    })
}

/// Unpadded base64url of `bytes` (RFC 4648 §5), as PKCE and JOSE write it.
pub fn base64url(bytes: &[u8]) -> String {
    base64(bytes)
        .trim_end_matches('=')
        .chars()
        .map(|c| match c {
            '+' => '-',
            '/' => '_',
            c => c,
        })
        .collect()
}

/// The bytes of unpadded base64url `text` (RFC 4648 §5, as JOSE writes
/// it), or `None` when it is not that.
pub fn base64url_decode(text: &str) -> Option<Vec<u8>> {
    let sextet = |byte: u8| match byte {
        b'A'..=b'Z' => Some(byte - b'A'),
        b'a'..=b'z' => Some(byte - b'a' + 26),
        b'0'..=b'9' => Some(byte - b'0' + 52),
        b'-' => Some(62),
        b'_' => Some(63),
        _ => None,
    };
    if text.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for chunk in text.as_bytes().chunks(4) {
        let mut n = 0u32;
        for (index, byte) in chunk.iter().enumerate() {
            n |= u32::from(sextet(*byte)?) << (18 - 6 * index);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
}

/// Lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Standard base64 of `bytes`, with padding (RFC 4648 §4).
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (index, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if index <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(DIGITS[usize::from(byte >> 4)] as char);
        out.push(DIGITS[usize::from(byte & 0x0f)] as char);
    }
    out
}

/// Whether `text` is already NFC; ASCII always is.
fn is_nfc(text: &str) -> bool {
    text.is_ascii() || is_nfc_quick(text.chars()) == IsNormalized::Yes
}

fn nfc(text: &str) -> Cow<'_, str> {
    if is_nfc(text) {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(text.nfc().collect())
    }
}

/// One step of the path to the current place, kept borrowed so that the
/// JSON pointer is only built when something fails.
enum Segment<'a> {
    Key(Cow<'a, str>),
    Index(usize),
}

struct Writer<'a> {
    out: String,
    path: Vec<Segment<'a>>,
    /// Whether the normalized document differs from the input.
    changed: bool,
}

impl<'a> Writer<'a> {
    fn pointer(&self) -> String {
        if self.path.is_empty() {
            return "/".to_owned();
        }
        let mut pointer = String::new();
        for segment in &self.path {
            pointer.push('/');
            match segment {
                Segment::Key(key) => pointer.push_str(&key.replace('~', "~0").replace('/', "~1")),
                Segment::Index(index) => pointer.push_str(&index.to_string()),
            }
        }
        pointer
    }

    fn value(&mut self, value: &'a Value, depth: usize) -> Result<(), CanonicalError> {
        if depth > MAXIMUM_DEPTH {
            return Err(CanonicalError::TooDeep {
                path: self.pointer(),
            });
        }
        match value {
            Value::Null => self.out.push_str("null"),
            Value::Bool(flag) => self.out.push_str(if *flag { "true" } else { "false" }),
            Value::Number(number) => self.number(number)?,
            Value::String(text) => {
                if text.contains('\0') {
                    return Err(CanonicalError::Nul {
                        path: self.pointer(),
                    });
                }
                let text = nfc(text);
                self.changed |= matches!(text, Cow::Owned(_));
                write_string(&text, &mut self.out);
            }
            Value::Array(items) => {
                self.out.push('[');
                for (index, item) in items.iter().enumerate() {
                    if index > 0 {
                        self.out.push(',');
                    }
                    self.path.push(Segment::Index(index));
                    self.value(item, depth + 1)?;
                    self.path.pop();
                }
                self.out.push(']');
            }
            Value::Object(map) => self.object(map, depth)?,
        }
        Ok(())
    }

    fn object(&mut self, map: &'a Map<String, Value>, depth: usize) -> Result<(), CanonicalError> {
        let mut entries: Vec<(Cow<'a, str>, &'a Value)> =
            map.iter().map(|(k, v)| (nfc(k), v)).collect();
        let renamed = entries.iter().any(|(key, _)| matches!(key, Cow::Owned(_)));
        self.changed |= renamed;
        // serde_json's map is usually already in code-point order; sort only
        // when it is not (another map implementation, or renamed keys).
        let sorted = entries.windows(2).all(|pair| pair[0].0 < pair[1].0);
        if !sorted {
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            if entries.windows(2).any(|pair| pair[0].0 == pair[1].0) {
                return Err(CanonicalError::DuplicateKey {
                    path: self.pointer(),
                });
            }
        }
        self.out.push('{');
        for (index, (key, item)) in entries.into_iter().enumerate() {
            if index > 0 {
                self.out.push(',');
            }
            if key.contains('\0') {
                return Err(CanonicalError::Nul {
                    path: self.pointer(),
                });
            }
            write_string(&key, &mut self.out);
            self.out.push(':');
            self.path.push(Segment::Key(key));
            self.value(item, depth + 1)?;
            self.path.pop();
        }
        self.out.push('}');
        Ok(())
    }

    fn number(&mut self, number: &Number) -> Result<(), CanonicalError> {
        if number.is_i64() || number.is_u64() {
            let _ = write!(self.out, "{number}");
            return Ok(());
        }
        let float = number.as_f64().unwrap_or(f64::NAN);
        if !float.is_finite() {
            return Err(CanonicalError::NonFinite {
                path: self.pointer(),
            });
        }
        if float == 0.0 && float.is_sign_negative() {
            return Err(CanonicalError::NegativeZero {
                path: self.pointer(),
            });
        }
        match integral(float) {
            // An integral float is an integer (JSON Schema agrees), so 1.0
            // and 1 hash alike.
            Some(integer) => {
                self.changed = true;
                let _ = write!(self.out, "{integer}");
            }
            // serde_json renders floats shortest-round-trip.
            None => {
                let _ = write!(self.out, "{number}");
            }
        }
        Ok(())
    }
}

/// The integer an integral float denotes exactly, if it does.
fn integral(float: f64) -> Option<i64> {
    (float.fract() == 0.0 && float.abs() <= MAXIMUM_EXACT_INTEGER).then_some(float as i64)
}

/// The normalized document; only built when it differs from the input. The
/// writer has already checked it, so nothing here can fail.
fn normalized(value: Value) -> Value {
    match value {
        Value::String(text) => Value::String(nfc(&text).into_owned()),
        Value::Number(number) => match number
            .as_f64()
            .filter(|_| !number.is_i64() && !number.is_u64())
            .and_then(integral)
        {
            Some(integer) => Value::Number(Number::from(integer)),
            None => Value::Number(number),
        },
        Value::Array(items) => Value::Array(items.into_iter().map(normalized).collect()),
        Value::Object(map) => {
            let sorted: BTreeMap<String, Value> = map
                .into_iter()
                .map(|(key, item)| (nfc(&key).into_owned(), normalized(item)))
                .collect();
            Value::Object(sorted.into_iter().collect())
        }
        other => other,
    }
}

fn write_string(text: &str, out: &mut String) {
    out.push('"');
    let bytes = text.as_bytes();
    let mut start = 0;
    for (index, &byte) in bytes.iter().enumerate() {
        let escape = match byte {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0x00..=0x1f => "",
            _ => continue,
        };
        out.push_str(&text[start..index]);
        if escape.is_empty() {
            let _ = write!(out, "\\u{byte:04x}");
        } else {
            out.push_str(escape);
        }
        start = index + 1;
    }
    out.push_str(&text[start..]);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(value: Value) -> String {
        canonicalize(value).unwrap().text
    }

    /// What PostgreSQL's `jsonb` refuses and SQLite would keep never
    /// becomes arguments: a lone surrogate or a number past a double does
    /// not parse, so every door refuses it as bad JSON, the same on both
    /// stores; U+0000 parses and is refused here.
    #[test]
    fn texts_one_store_refuses_never_become_arguments() {
        for refused in [
            r#"{"t":"\ud800"}"#,
            r#"{"t":"\udc00x"}"#,
            r#"{"n":1e400}"#,
            r#"{"n":-1e400}"#,
        ] {
            assert!(serde_json::from_str::<Value>(refused).is_err(), "{refused}");
        }
        let nul: Value = serde_json::from_str(r#"{"t":"a\u0000b"}"#).unwrap();
        assert!(holds_nul(&nul));
        assert!(canonicalize(nul).is_err());
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
        assert_eq!(
            text(json!([1, -7, 1.0, 2.5, 0.1, 1e21, 18446744073709551615u64])),
            "[1,-7,1,2.5,0.1,1e+21,18446744073709551615]"
        );
    }

    #[test]
    fn integral_floats_become_integers_in_the_value_too() {
        let canonical = canonicalize(json!({"a": 2.0, "b": [0.5]})).unwrap();
        assert_eq!(canonical.value, json!({"a": 2, "b": [0.5]}));
        assert!(canonical.value["a"].is_i64());
    }

    #[test]
    fn strings_are_nfc_and_minimally_escaped() {
        let decomposed = "e\u{301}";
        let canonical = canonicalize(json!({ decomposed: decomposed })).unwrap();
        assert_eq!(canonical.value, json!({"\u{e9}": "\u{e9}"}));
        assert_eq!(canonical.text, "{\"\u{e9}\":\"\u{e9}\"}");
        assert_eq!(
            text(json!("a\"b\\c\n\u{1}\u{7f}")),
            "\"a\\\"b\\\\c\\n\\u0001\u{7f}\""
        );
    }

    #[test]
    fn negative_zero_is_refused_with_its_path() {
        let value: Value = serde_json::from_str(r#"{"a":[1,-0.0]}"#).unwrap();
        let error = canonicalize(value).unwrap_err();
        assert_eq!(
            error,
            CanonicalError::NegativeZero {
                path: "/a/1".into()
            }
        );
    }

    #[test]
    fn base64url_round_trips() {
        for length in 0..40u8 {
            let bytes: Vec<u8> = (0..length).map(|b| b.wrapping_mul(37) ^ 0xfb).collect();
            let text = base64url(&bytes);
            assert!(!text.contains(['=', '+', '/']), "{text}");
            assert_eq!(base64url_decode(&text), Some(bytes));
        }
    }

    #[test]
    fn base64url_decodes_what_jose_writes() {
        assert_eq!(
            base64url_decode("eyJhIjoxfQ").as_deref(),
            Some(&b"{\"a\":1}"[..])
        );
        assert_eq!(base64url_decode("_-8").as_deref(), Some(&[0xff, 0xef][..]));
        assert_eq!(base64url_decode("").as_deref(), Some(&[][..]));
        for bad in ["a", "ab=c", "a+bc", "abcde"] {
            assert!(base64url_decode(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn nul_in_a_string_or_key_is_refused() {
        for value in [
            json!({"a": "x\u{0}y"}),
            json!({"a\u{0}": 1}),
            json!([["\u{0}"]]),
        ] {
            assert!(holds_nul(&value), "{value}");
            assert!(matches!(
                canonicalize(value),
                Err(CanonicalError::Nul { .. })
            ));
        }
        assert!(!holds_nul(&json!({"a": "x\\u0000", "b": [1, null]})));
    }

    #[test]
    fn keys_equal_after_nfc_are_refused() {
        let value = json!({"\u{e9}": 1, "e\u{301}": 2});
        assert!(matches!(
            canonicalize(value),
            Err(CanonicalError::DuplicateKey { .. })
        ));
    }

    #[test]
    fn hash_is_sha256_of_the_text() {
        let canonical = canonicalize(json!({})).unwrap();
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
        assert!(matches!(
            canonicalize(value),
            Err(CanonicalError::TooDeep { .. })
        ));
    }
}
