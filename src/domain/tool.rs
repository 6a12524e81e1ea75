//! `ToolSpec`, completed, and the closed classifications it is built from.
//!
//! Section 8.1's twelve fields, the six additions and `model_visible`. The
//! registry decides whether a spec may be registered; this module only says
//! what a spec is.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::trust::TrustLevel;

closed_enum! {
    /// What a call does to the world outside the run.
    pub enum SideEffectClass {
        /// Nothing outside the run; control tools live here.
        None => "none",
        /// Reads the run's own workspace.
        WorkspaceRead => "workspace_read",
        /// Writes the run's own workspace.
        WorkspaceWrite => "workspace_write",
        /// Reads the public network (search, fetch).
        NetworkRead => "network_read",
        /// Reads a third-party system through its API.
        ExternalRead => "external_read",
        /// Changes a third-party system: the most restrictive class.
        ExternalWrite => "external_write",
    }
}

impl SideEffectClass {
    /// Whether the class has no effect another call could depend on, the
    /// condition parallel admission requires of every call in a batch.
    pub fn is_read_only(self) -> bool {
        matches!(
            self,
            SideEffectClass::None
                | SideEffectClass::WorkspaceRead
                | SideEffectClass::NetworkRead
                | SideEffectClass::ExternalRead
        )
    }
}

closed_enum! {
    /// How much harm a wrong call can do; ordered so that `max` is the most
    /// restrictive.
    pub enum RiskLevel {
        /// Harmless when wrong.
        Low => "low",
        /// Recoverable harm.
        Medium => "medium",
        /// Harm that needs a human to undo: the unclassified default.
        High => "high",
    }
}

closed_enum! {
    /// Whether repeating a call is safe: what recovery dispatches on.
    pub enum IdempotencyClass {
        /// Changes nothing.
        ReadOnly => "read_only",
        /// Repeating converges on the same state.
        Idempotent => "idempotent",
        /// Idempotent when the remote honours the idempotency key.
        ConditionallyIdempotent => "conditionally_idempotent",
        /// Every repetition is another effect: the unclassified default.
        NonIdempotent => "non_idempotent",
    }
}

closed_enum! {
    /// Whether a tool acts on the world or on the run.
    pub enum ToolKind {
        /// Acts on the world.
        Capability => "capability",
        /// Acts on the run; closed at build time.
        Control => "control",
    }
}

closed_enum! {
    /// Where a tool's code comes from, which decides its forced trust.
    pub enum ToolSource {
        /// Compiled into toolgate.
        Builtin => "builtin",
        /// Discovered from an MCP server.
        Mcp => "mcp",
        /// Declared by an attached device.
        Device => "device",
        /// Runs inside a sandbox.
        Sandbox => "sandbox",
    }
}

impl ToolSource {
    /// The trust the registry forces on this source, overwriting whatever was
    /// declared; `None` for builtins, whose declared value stands.
    pub fn forced_output_trust(self) -> Option<TrustLevel> {
        match self {
            ToolSource::Builtin => None,
            ToolSource::Mcp | ToolSource::Device | ToolSource::Sandbox => {
                Some(TrustLevel::ExternalUntrusted)
            }
        }
    }
}

closed_enum! {
    /// `ExecutionTarget.kind`: where step 10 sends the call.
    pub enum TargetKind {
        /// Runs inside toolgate; the only target a control tool may have.
        InProcess => "in_process",
        /// A sandbox of the run.
        Sandbox => "sandbox",
        /// An MCP server's transport.
        McpServer => "mcp_server",
        /// An attached device (reserved).
        Device => "device",
        /// The web search and fetch provider.
        WebProvider => "web_provider",
        /// The browser provider.
        BrowserProvider => "browser_provider",
        /// The public-HTTPS unsubscribe transport of `email.unsubscribe`.
        UnsubscribeEndpoint => "unsubscribe_endpoint",
    }
}

/// A tool's declaration: everything the pipeline needs to decide whether and
/// how a call may run. `output_trust` has no default on purpose: a spec that
/// does not say how far its output may be believed does not parse.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    /// The registry name, `domain.verb`.
    pub name: String,
    /// The declared version; for MCP tools, the server's catalog hash.
    pub version: String,
    /// What the model reads about the tool.
    pub description: String,
    /// JSON Schema draft 2020-12 for the arguments.
    pub input_schema: Value,
    /// JSON Schema for `ToolResult.structured`, when the tool returns one.
    pub output_schema: Option<Value>,
    /// Effect on the world; drives the watermark and parallel admission.
    pub side_effect: SideEffectClass,
    /// Drives the policy matrix.
    pub risk: RiskLevel,
    /// Drives recovery and the watermark.
    pub idempotency: IdempotencyClass,
    /// Scopes a principal must hold to call the tool.
    pub required_scopes: BTreeSet<String>,
    /// The declared timeout; the effective one is computed by the executor.
    pub timeout_seconds: u32,
    /// The per-tool output limit, under the registry's global ceiling.
    pub maximum_output_bytes: u64,
    /// Whether the tool may run beside others in a read-only batch.
    pub allow_parallel: bool,
    /// Capability or control.
    #[serde(default = "ToolSpec::default_kind")]
    pub kind: ToolKind,
    /// Where the call is executed.
    #[serde(default = "ToolSpec::default_target_kind")]
    pub target_kind: TargetKind,
    /// The highest trust the tool's output may carry.
    pub output_trust: TrustLevel,
    /// Where the tool comes from.
    #[serde(default = "ToolSpec::default_source")]
    pub source: ToolSource,
    /// Set when `source` is MCP.
    #[serde(default)]
    pub server_id: Option<String>,
    /// Set when `source` is DEVICE.
    #[serde(default)]
    pub device_id: Option<String>,
    /// Still callable, no longer recommended.
    #[serde(default)]
    pub deprecated: bool,
    /// False only for MCP tools marked application-only: pinned and callable
    /// by the application, never advertised to the model. Grants nothing.
    #[serde(default = "ToolSpec::default_model_visible")]
    pub model_visible: bool,
}

impl ToolSpec {
    fn default_kind() -> ToolKind {
        ToolKind::Capability
    }

    fn default_target_kind() -> TargetKind {
        TargetKind::InProcess
    }

    fn default_source() -> ToolSource {
        ToolSource::Builtin
    }

    fn default_model_visible() -> bool {
        true
    }

    /// The first name segment, which the partition table owns.
    pub fn domain(&self) -> &str {
        self.name.split('.').next().unwrap_or_default()
    }

    /// Whether the executor must commit the effect watermark before invoking
    /// the tool: every side effect but NONE (ADR-0040).
    pub fn needs_effect_watermark(&self) -> bool {
        self.side_effect != SideEffectClass::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec_json() -> Value {
        json!({
            "name": "demo.echo",
            "version": "1",
            "description": "Echoes its input.",
            "input_schema": {"type": "object"},
            "output_schema": null,
            "side_effect": "none",
            "risk": "low",
            "idempotency": "read_only",
            "required_scopes": [],
            "timeout_seconds": 5,
            "maximum_output_bytes": 4096,
            "allow_parallel": true,
            "output_trust": "internal_tool"
        })
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let spec: ToolSpec = serde_json::from_value(spec_json()).unwrap();
        assert_eq!(spec.kind, ToolKind::Capability);
        assert_eq!(spec.target_kind, TargetKind::InProcess);
        assert_eq!(spec.source, ToolSource::Builtin);
        assert!(spec.model_visible);
        assert!(!spec.deprecated);
        assert_eq!(spec.domain(), "demo");
    }

    #[test]
    fn output_trust_is_required() {
        let mut value = spec_json();
        value.as_object_mut().unwrap().remove("output_trust");
        let error = serde_json::from_value::<ToolSpec>(value).unwrap_err();
        assert!(error.to_string().contains("output_trust"), "{error}");
    }

    #[test]
    fn enums_are_closed_and_snake_case() {
        assert!("EXTERNAL_WRITE".parse::<SideEffectClass>().is_err());
        assert_eq!(
            "conditionally_idempotent"
                .parse::<IdempotencyClass>()
                .unwrap(),
            IdempotencyClass::ConditionallyIdempotent
        );
        for member in TargetKind::ALL {
            let json = serde_json::to_string(member).unwrap();
            assert_eq!(json, format!("\"{member}\""));
            assert_eq!(member.as_str().parse::<TargetKind>().unwrap(), *member);
        }
        assert!(RiskLevel::High > RiskLevel::Low);
    }

    #[test]
    fn forced_trust_covers_every_external_source() {
        assert_eq!(ToolSource::Builtin.forced_output_trust(), None);
        for source in [ToolSource::Mcp, ToolSource::Device, ToolSource::Sandbox] {
            assert_eq!(
                source.forced_output_trust(),
                Some(TrustLevel::ExternalUntrusted)
            );
        }
    }
}
