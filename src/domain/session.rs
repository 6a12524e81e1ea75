//! Who is calling and under what configuration: the inputs of
//! `specs_for_session`'s four filters.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::tool::{RiskLevel, TargetKind, ToolSpec};

/// Whether `tenant_id` is a tenant id toolgate accepts: 1 to 128 ASCII
/// letters, digits, `-` or `_`. Tenant ids name folders (artifacts) and
/// travel in URLs, so anything else is refused where it first arrives.
pub fn valid_tenant_id(tenant_id: &str) -> bool {
    (1..=128).contains(&tenant_id.len())
        && tenant_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The longest call id accepted: provider call ids are short; the id is
/// recorded on the row and carried by every event of the call.
pub const MAXIMUM_CALL_ID_BYTES: usize = 256;
/// The longest principal id, scope or agent tool pattern accepted.
pub const MAXIMUM_IDENTIFIER_BYTES: usize = 256;
/// The most scopes a principal, or tool patterns an agent, may carry.
pub const MAXIMUM_LIST_ENTRIES: usize = 1024;

/// Whether `call_id` is one toolgate records: 1 to 256 printable ASCII
/// characters (no space, no control character).
pub fn valid_call_id(call_id: &str) -> bool {
    (1..=MAXIMUM_CALL_ID_BYTES).contains(&call_id.len())
        && call_id.bytes().all(|b| b.is_ascii_graphic())
}

/// Whether an identifier a caller supplies (a principal id, a scope, an
/// agent's tool pattern) is bounded and free of control characters.
pub fn valid_identifier(text: &str) -> bool {
    (1..=MAXIMUM_IDENTIFIER_BYTES).contains(&text.len()) && !text.chars().any(char::is_control)
}

/// The authenticated party a session acts for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Principal {
    /// Stable identifier.
    pub id: String,
    /// Scopes held, e.g. `mcp.acme.use`.
    pub scopes: BTreeSet<String>,
}

impl Principal {
    /// The required scopes this principal lacks, in order.
    pub fn missing_scopes<'a>(&self, spec: &'a ToolSpec) -> Vec<&'a str> {
        spec.required_scopes
            .iter()
            .filter(|scope| !self.scopes.contains(*scope))
            .map(String::as_str)
            .collect()
    }
}

/// The agent's configuration: which tools it is built to use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// Globs over registry names (`*` matches any run of characters).
    pub tools: Vec<String>,
}

impl AgentSpec {
    /// Whether the agent enables `name`.
    pub fn enables(&self, name: &str) -> bool {
        self.tools.iter().any(|pattern| glob_matches(pattern, name))
    }
}

/// The policy profile's standing exclusions: tools it would deny on every
/// call are not advertised at all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyProfile {
    /// Globs over registry names that the profile always denies.
    #[serde(default)]
    pub denied_tools: Vec<String>,
    /// Tools riskier than this are not offered.
    #[serde(default = "PolicyProfile::default_maximum_risk")]
    pub maximum_risk: RiskLevel,
}

impl PolicyProfile {
    fn default_maximum_risk() -> RiskLevel {
        RiskLevel::High
    }

    /// Whether the profile permits offering `spec`.
    pub fn permits(&self, spec: &ToolSpec) -> bool {
        spec.risk <= self.maximum_risk
            && !self
                .denied_tools
                .iter()
                .any(|pattern| glob_matches(pattern, &spec.name))
    }
}

impl Default for PolicyProfile {
    fn default() -> Self {
        PolicyProfile {
            denied_tools: Vec::new(),
            maximum_risk: RiskLevel::High,
        }
    }
}

/// What this runtime can actually reach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeEnvironment {
    /// Execution targets present in this deployment.
    pub targets: BTreeSet<TargetKind>,
}

impl RuntimeEnvironment {
    /// Whether a tool targeting `target` can run here.
    pub fn offers(&self, target: TargetKind) -> bool {
        self.targets.contains(&target)
    }
}

/// `*` matches any run of characters (dots included); everything else is
/// literal. Iterative, so a hostile pattern costs O(pattern × name).
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    let (pattern, name) = (pattern.as_bytes(), name.as_bytes());
    let (mut p, mut n) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            backtrack = Some((p, n));
            p += 1;
        } else if p < pattern.len() && pattern[p] == name[n] {
            p += 1;
            n += 1;
        } else if let Some((star, matched)) = backtrack {
            p = star + 1;
            n = matched + 1;
            backtrack = Some((star, matched + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_ids_are_plain_segments() {
        for good in ["acme", "acme-eu_1", &"a".repeat(128)] {
            assert!(valid_tenant_id(good), "{good}");
        }
        for bad in ["", "acme corp", "a/b", "..", "é", "a&b", &"a".repeat(129)] {
            assert!(!valid_tenant_id(bad), "{bad}");
        }
    }

    #[test]
    fn globs() {
        assert!(glob_matches("*", "demo.echo"));
        assert!(glob_matches("demo.*", "demo.echo"));
        assert!(glob_matches(
            "mcp.*.read_resource",
            "mcp.acme.read_resource"
        ));
        assert!(glob_matches("demo.echo", "demo.echo"));
        assert!(!glob_matches("demo.echo", "demo.echoes"));
        assert!(!glob_matches("demo.*", "demos.echo"));
        assert!(glob_matches("*.*.*", "a.b.c"));
        assert!(!glob_matches("a*b", "acbd"));
    }
}
