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
    /// Tools it expects; checked at load, not at authoring.
    pub required_tools: Vec<String>,
    /// Where it came from.
    pub source: ToolSource,
    /// The trust its content carries: MCP prompts are EXTERNAL_UNTRUSTED.
    pub trust: TrustLevel,
    /// Whether an edit path may write it back; a remote prompt is read-only.
    pub read_only: bool,
}
