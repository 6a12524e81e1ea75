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
