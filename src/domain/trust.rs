//! Trust labels and the two rules that combine them.
//!
//! Owns the total order over [`TrustLevel`], so "may only lower" and "minimum
//! over the request" are one comparison each. Knows nothing of where labels
//! come from: callers construct them (design document, Decision 9).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

closed_enum! {
    /// A trust label, declared from least to most trusted so that the derived
    /// `Ord` is the trust order: `a < b` means `a` is less trusted than `b`.
    pub enum TrustLevel {
        /// Anything a third party or a model wrote: tool output from outside,
        /// model-produced arguments, fetched pages.
        ExternalUntrusted => "external_untrusted",
        /// Output of a builtin tool reading platform-held data.
        InternalTool => "internal_tool",
        /// What the user said.
        User => "user",
        /// Operator-authored configuration (skills, policy files).
        TrustedConfiguration => "trusted_configuration",
        /// The runtime itself: calls no model proposed.
        Platform => "platform",
    }
}

impl TrustLevel {
    /// The trust a result carries when a tool asks for `requested` on a spec
    /// declaring `self`: a tool may lower its trust, never raise it.
    pub fn clamp_lower(self, requested: Option<TrustLevel>) -> TrustLevel {
        match requested {
            Some(requested) => self.min(requested),
            None => self,
        }
    }

    /// `origin_trust`: the minimum label over the context items of the request
    /// that produced a call. A call with no model request behind it (the
    /// runtime's own) is `Platform`.
    pub fn origin(items: impl IntoIterator<Item = TrustLevel>) -> TrustLevel {
        items.into_iter().min().unwrap_or(TrustLevel::Platform)
    }
}

/// Per-argument trust, carried from where a call is constructed and never
/// inferred by matching argument text against context (Decision 9). An
/// argument nobody labelled is `ExternalUntrusted`: the model produced it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArgumentTrust {
    labels: BTreeMap<String, TrustLevel>,
}

impl ArgumentTrust {
    /// The label of a top-level argument.
    pub fn of(&self, argument: &str) -> TrustLevel {
        self.labels
            .get(argument)
            .copied()
            .unwrap_or(TrustLevel::ExternalUntrusted)
    }

    /// Records that `source` contributed to `argument`. Where several sources
    /// contributed, the lowest label stands, so a label can only go down once
    /// an untrusted item has touched the field.
    pub fn contributed(&mut self, argument: impl Into<String>, source: TrustLevel) {
        self.labels
            .entry(argument.into())
            .and_modify(|label| *label = (*label).min(source))
            .or_insert(source);
    }

    /// The lowest label over the named arguments; an empty request is
    /// `ExternalUntrusted` since nothing vouches for it.
    pub fn minimum<'a>(&self, arguments: impl IntoIterator<Item = &'a str>) -> TrustLevel {
        arguments
            .into_iter()
            .map(|name| self.of(name))
            .min()
            .unwrap_or(TrustLevel::ExternalUntrusted)
    }
}

/// The most labels one call may carry.
pub const MAXIMUM_ARGUMENT_LABELS: usize = 256;
/// The longest JSON pointer a label may name.
pub const MAXIMUM_POINTER_BYTES: usize = 1024;

/// Why a caller's argument labels were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgumentLabelError {
    /// A key is not a JSON pointer into the arguments.
    #[error(
        "argument_trust keys are JSON pointers into the arguments (\"/name\" or deeper, `~0` and \
         `~1` escaped), at most 1024 bytes"
    )]
    Pointer,
    /// Too many labels.
    #[error("argument_trust holds at most 256 labels")]
    TooMany,
}

impl ArgumentTrust {
    /// The labels a caller gives by JSON pointer (RFC 6901) into the
    /// arguments. A label at an argument's own pointer (`/recipient`) is
    /// that argument's; one deeper (`/recipient/0`) can only lower it: where
    /// an untrusted item contributed, the lower label stands, and a part
    /// labelled never vouches for the whole.
    pub fn from_pointers<'a>(
        labels: impl IntoIterator<Item = (&'a str, TrustLevel)>,
    ) -> Result<ArgumentTrust, ArgumentLabelError> {
        let mut whole = Vec::new();
        let mut parts = Vec::new();
        for (count, (pointer, label)) in labels.into_iter().enumerate() {
            if count >= MAXIMUM_ARGUMENT_LABELS {
                return Err(ArgumentLabelError::TooMany);
            }
            let (argument, deeper) = top_segment(pointer)?;
            if deeper {
                parts.push((argument, label));
            } else {
                whole.push((argument, label));
            }
        }
        let mut trust = ArgumentTrust::default();
        for (argument, label) in whole {
            trust.contributed(argument, label);
        }
        for (argument, label) in parts {
            if trust.labels.contains_key(&argument) {
                trust.contributed(argument, label);
            }
        }
        Ok(trust)
    }

    /// Every argument a label was given for, with its label.
    pub fn labels(&self) -> &BTreeMap<String, TrustLevel> {
        &self.labels
    }
}

/// The argument a JSON pointer starts in, unescaped, and whether it points
/// deeper than the argument itself.
fn top_segment(pointer: &str) -> Result<(String, bool), ArgumentLabelError> {
    if pointer.len() > MAXIMUM_POINTER_BYTES || pointer.chars().any(char::is_control) {
        return Err(ArgumentLabelError::Pointer);
    }
    let rest = pointer
        .strip_prefix('/')
        .ok_or(ArgumentLabelError::Pointer)?;
    let (segment, deeper) = match rest.split_once('/') {
        Some((segment, _)) => (segment, true),
        None => (rest, false),
    };
    let mut argument = String::with_capacity(segment.len());
    let mut characters = segment.chars();
    while let Some(character) = characters.next() {
        match character {
            '~' => match characters.next() {
                Some('0') => argument.push('~'),
                Some('1') => argument.push('/'),
                _ => return Err(ArgumentLabelError::Pointer),
            },
            other => argument.push(other),
        }
    }
    Ok((argument, deeper))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_least_trusted_first() {
        for pair in TrustLevel::ALL.windows(2) {
            assert!(
                pair[0] < pair[1],
                "{:?} should be below {:?}",
                pair[0],
                pair[1]
            );
        }
    }

    #[test]
    fn clamp_only_lowers() {
        let declared = TrustLevel::InternalTool;
        assert_eq!(
            declared.clamp_lower(Some(TrustLevel::ExternalUntrusted)),
            TrustLevel::ExternalUntrusted
        );
        assert_eq!(declared.clamp_lower(Some(TrustLevel::Platform)), declared);
        assert_eq!(declared.clamp_lower(None), declared);
    }

    #[test]
    fn origin_is_the_minimum_and_platform_when_empty() {
        assert_eq!(TrustLevel::origin([]), TrustLevel::Platform);
        assert_eq!(
            TrustLevel::origin([
                TrustLevel::User,
                TrustLevel::ExternalUntrusted,
                TrustLevel::Platform
            ]),
            TrustLevel::ExternalUntrusted
        );
    }

    #[test]
    fn labels_by_pointer_raise_a_whole_argument_and_parts_only_lower() {
        use TrustLevel::*;
        let trust = ArgumentTrust::from_pointers([
            ("/recipient", User),
            ("/subject", User),
            ("/subject/0", ExternalUntrusted),
            ("/cc/0", User),
            ("/a~1b", User),
            ("/t~0", Platform),
        ])
        .unwrap();
        assert_eq!(trust.of("recipient"), User);
        assert_eq!(trust.of("subject"), ExternalUntrusted, "a part lowers");
        assert_eq!(trust.of("cc"), ExternalUntrusted, "a part never raises");
        assert_eq!(trust.of("a/b"), User);
        assert_eq!(trust.of("t~"), Platform);
        assert_eq!(trust.of("body"), ExternalUntrusted, "unlabelled");
        for bad in ["recipient", "", "/a~2", "/a~", "/a\n"] {
            assert_eq!(
                ArgumentTrust::from_pointers([(bad, User)]),
                Err(ArgumentLabelError::Pointer),
                "{bad:?}"
            );
        }
        let long = format!("/{}", "a".repeat(MAXIMUM_POINTER_BYTES));
        assert!(ArgumentTrust::from_pointers([(long.as_str(), User)]).is_err());
        let many: Vec<String> = (0..=MAXIMUM_ARGUMENT_LABELS)
            .map(|i| format!("/a{i}"))
            .collect();
        assert_eq!(
            ArgumentTrust::from_pointers(many.iter().map(|p| (p.as_str(), User))),
            Err(ArgumentLabelError::TooMany)
        );
    }

    #[test]
    fn arguments_default_to_untrusted_and_only_lower() {
        let mut trust = ArgumentTrust::default();
        assert_eq!(trust.of("path"), TrustLevel::ExternalUntrusted);
        trust.contributed("path", TrustLevel::User);
        assert_eq!(trust.of("path"), TrustLevel::User);
        trust.contributed("path", TrustLevel::ExternalUntrusted);
        trust.contributed("path", TrustLevel::Platform);
        assert_eq!(trust.of("path"), TrustLevel::ExternalUntrusted);
        assert_eq!(
            trust.minimum(["path", "other"]),
            TrustLevel::ExternalUntrusted
        );
    }

    #[test]
    fn serializations_are_stable() {
        for level in TrustLevel::ALL {
            let json = serde_json::to_string(level).unwrap();
            assert_eq!(json, format!("\"{}\"", level.as_str()));
        }
    }
}
