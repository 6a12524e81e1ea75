//! Skills as sessions see them: metadata only. Content enters a turn through
//! `skill.load`, never through the advertisement.

use serde::Serialize;

use super::tool::ToolSource;
use super::trust::TrustLevel;

/// The four fields a skill advertises, plus where it came from and the trust
/// its content carries when loaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkillMetadata {
    /// Its registry-style name, e.g. `mcp.acme.summarize`.
    pub name: String,
    /// A digest of its declaration, not any version the source claims.
    pub version: String,
    /// Its description, cut to the same bound as a tool's.
    pub description: String,
    /// Tools it expects, as registry names; checked at load, not at
    /// authoring.
    pub required_tools: Vec<String>,
    /// Where it came from.
    pub source: ToolSource,
    /// The server whose prompt it is, for an MCP skill.
    pub server_id: Option<String>,
    /// The trust its content carries: MCP prompts are EXTERNAL_UNTRUSTED.
    pub trust: TrustLevel,
    /// Whether an edit path may write it back; a remote prompt is read-only.
    pub read_only: bool,
}

/// A skill as one session was shown it: its metadata, and which of its
/// required tools the session did not pin (loaded anyway, with a
/// `skill.tool.missing` note).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdvertisedSkill {
    /// What the session was shown.
    pub metadata: SkillMetadata,
    /// Required tools the session's pinned set does not hold.
    pub missing_tools: Vec<String>,
}
