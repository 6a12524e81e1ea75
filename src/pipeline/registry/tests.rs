use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::*;
use crate::domain::ToolResult;
use crate::ports::{BoxFuture, ToolExecutionContext};

struct Fixed(ToolSpec);

impl Tool for Fixed {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    fn execute<'a>(&'a self, _: Value, _: ToolExecutionContext) -> BoxFuture<'a, ToolResult> {
        Box::pin(async { ToolResult::text("") })
    }
}

const LIMITS: RegistryLimits = RegistryLimits {
    maximum_output_bytes_ceiling: 1 << 20,
    tenant_catalog_tools: 10_000,
};

fn spec(name: &str) -> ToolSpec {
    serde_json::from_value(json!({
        "name": name, "version": "1", "description": "d",
        "input_schema": {"type": "object"}, "output_schema": null,
        "side_effect": "none", "risk": "low", "idempotency": "read_only",
        "required_scopes": [], "timeout_seconds": 5, "maximum_output_bytes": 1024,
        "allow_parallel": true, "output_trust": "internal_tool"
    }))
    .unwrap()
}

fn mcp(server: &str, remote: &str) -> ToolSpec {
    let mut spec = spec(&crate::domain::names::mcp_registry_name(server, remote));
    spec.source = ToolSource::Mcp;
    spec.server_id = Some(server.into());
    spec.target_kind = TargetKind::McpServer;
    spec
}

fn control(name: &str) -> ToolSpec {
    let mut spec = spec(name);
    spec.kind = ToolKind::Control;
    spec
}

fn tools(specs: impl IntoIterator<Item = ToolSpec>) -> Vec<Arc<dyn Tool>> {
    specs
        .into_iter()
        .map(|s| Arc::new(Fixed(s)) as Arc<dyn Tool>)
        .collect()
}

fn rejection(specs: impl IntoIterator<Item = ToolSpec>) -> RejectionReason {
    let error = ToolRegistry::with_builtins(LIMITS, tools(specs))
        .err()
        .expect("rejected");
    error.0.rejected[0].cause.clone()
}

fn everything() -> (AgentSpec, Principal, PolicyProfile, RuntimeEnvironment) {
    (
        AgentSpec {
            tools: vec!["*".into()],
        },
        Principal {
            id: "p".into(),
            scopes: BTreeSet::new(),
        },
        PolicyProfile::default(),
        RuntimeEnvironment {
            targets: TargetKind::ALL.iter().copied().collect(),
        },
    )
}

#[test]
fn control_tools_are_closed_and_constrained() {
    let registry = ToolRegistry::with_builtins(
        LIMITS,
        tools(
            [
                "conversation.ask_user",
                "delegate.run",
                "context.update_working_state",
                "skill.load",
                "tool.call",
            ]
            .map(control),
        ),
    );
    assert!(registry.is_ok());
    assert_eq!(
        rejection([control("conversation.summon")]),
        RejectionReason::ControlSetClosed
    );
    assert_eq!(
        rejection([spec("skill.load")]),
        RejectionReason::ControlSetClosed
    );
    assert_eq!(
        rejection([spec("conversation.chat")]),
        RejectionReason::ControlOnlyDomain("conversation".into())
    );
    let mut outward = control("delegate.run");
    outward.side_effect = SideEffectClass::ExternalWrite;
    assert_eq!(rejection([outward]), RejectionReason::ControlConstraint);
    let mut repeating = control("skill.load");
    repeating.idempotency = IdempotencyClass::NonIdempotent;
    assert_eq!(rejection([repeating]), RejectionReason::ControlConstraint);
    let mut remote = control("tool.call");
    remote.target_kind = TargetKind::WebProvider;
    assert!(matches!(
        rejection([remote]),
        RejectionReason::ControlConstraint | RejectionReason::TargetPin(_)
    ));
}

#[test]
fn target_pins_hold_both_ways() {
    let mut search = spec("web.search");
    search.target_kind = TargetKind::WebProvider;
    search.side_effect = SideEffectClass::NetworkRead;
    search.output_trust = TrustLevel::ExternalUntrusted;
    assert!(ToolRegistry::with_builtins(LIMITS, tools([search.clone()])).is_ok());
    let mut writing = search.clone();
    writing.side_effect = SideEffectClass::ExternalWrite;
    assert_eq!(
        rejection([writing]),
        RejectionReason::TargetPin(TargetKind::WebProvider)
    );
    let mut trusting = search;
    trusting.output_trust = TrustLevel::InternalTool;
    assert_eq!(
        rejection([trusting]),
        RejectionReason::TargetPin(TargetKind::WebProvider)
    );

    let mut unsubscribe = spec("email.unsubscribe");
    unsubscribe.target_kind = TargetKind::UnsubscribeEndpoint;
    unsubscribe.side_effect = SideEffectClass::ExternalWrite;
    unsubscribe.risk = RiskLevel::Medium;
    unsubscribe.idempotency = IdempotencyClass::Idempotent;
    unsubscribe.allow_parallel = false;
    assert!(ToolRegistry::with_builtins(LIMITS, tools([unsubscribe.clone()])).is_ok());
    // That name without that target, and that target under another name.
    let mut elsewhere = unsubscribe.clone();
    elsewhere.target_kind = TargetKind::InProcess;
    assert_eq!(
        rejection([elsewhere]),
        RejectionReason::TargetPin(TargetKind::InProcess)
    );
    let mut impostor = unsubscribe.clone();
    impostor.name = "email.send".into();
    assert_eq!(
        rejection([impostor]),
        RejectionReason::TargetPin(TargetKind::UnsubscribeEndpoint)
    );
    let mut parallel = unsubscribe;
    parallel.allow_parallel = true;
    assert_eq!(
        rejection([parallel]),
        RejectionReason::TargetPin(TargetKind::UnsubscribeEndpoint)
    );
}

#[test]
fn dynamic_registration_takes_mcp_and_devices_only() {
    let registry = ToolRegistry::with_builtins(LIMITS, Vec::new()).unwrap();
    let report = registry.register_dynamic(tools([spec("demo.sneaky")]), ToolSource::Builtin);
    assert_eq!(
        report.rejected[0].cause,
        RejectionReason::SourceNotDynamic(ToolSource::Builtin)
    );
    let report = registry.register_dynamic(tools([spec("demo.sneaky")]), ToolSource::Sandbox);
    assert_eq!(
        report.rejected[0].cause,
        RejectionReason::SourceNotDynamic(ToolSource::Sandbox)
    );
    // A builtin-declared spec arriving through the MCP path.
    let report = registry.register_dynamic(tools([spec("demo.sneaky")]), ToolSource::Mcp);
    assert!(matches!(
        report.rejected[0].cause,
        RejectionReason::SourceMismatch { .. }
    ));
    // An MCP spec named outside its server's namespace.
    let mut stray = mcp("acme", "x");
    stray.name = "mcp.other.x".into();
    let report = registry.register_dynamic(tools([stray]), ToolSource::Mcp);
    assert_eq!(report.rejected[0].cause, RejectionReason::McpNamespace);
    // MCP specs cannot come in as builtins either.
    assert!(matches!(
        rejection([mcp("acme", "x")]),
        RejectionReason::SourceMismatch { .. }
    ));
}

#[test]
fn the_report_lists_every_rejection() {
    let registry = ToolRegistry::with_builtins(LIMITS, Vec::new()).unwrap();
    let mut deep = mcp("acme", "deep");
    let mut schema = json!({"type": "string"});
    for _ in 0..10 {
        schema = json!({"type": "object", "properties": {"x": schema}});
    }
    deep.input_schema = schema;
    let report = registry.register_dynamic(
        tools([mcp("acme", "ok"), deep, mcp("acme", "Also OK")]),
        ToolSource::Mcp,
    );
    assert_eq!(report.registered, vec!["mcp.acme.ok", "mcp.acme.also_ok"]);
    assert_eq!(report.rejected.len(), 1);
    assert_eq!(report.rejected[0].name, "mcp.acme.deep");
    assert!(matches!(
        report.rejected[0].cause,
        RejectionReason::InputSchema(SchemaError::TooDeep { .. })
    ));
    assert!(report.to_string().contains("mcp.acme.deep"));
    // Re-discovering the same catalog is not a rejection.
    let again = registry.register_dynamic(tools([mcp("acme", "ok")]), ToolSource::Mcp);
    assert!(again.rejected.is_empty());
    // A changed declaration under the same version is.
    let mut changed = mcp("acme", "ok");
    changed.description = "changed".into();
    let changed = registry.register_dynamic(tools([changed]), ToolSource::Mcp);
    assert_eq!(changed.rejected[0].cause, RejectionReason::Duplicate);
    // A builtin registered twice is a startup error.
    assert_eq!(
        rejection([spec("demo.echo"), spec("demo.echo")]),
        RejectionReason::Duplicate
    );
}

#[test]
fn versions_are_kept_and_get_resolves_them() {
    let registry = ToolRegistry::with_builtins(LIMITS, Vec::new()).unwrap();
    let first = mcp("acme", "x");
    let mut second = mcp("acme", "x");
    second.version = "2".into();
    second.input_schema = json!({"type": "object", "properties": {"y": {}}});
    registry.register_dynamic(tools([first, second]), ToolSource::Mcp);
    assert_eq!(
        registry.get("mcp.acme.x", Some("1")).unwrap().spec.version,
        "1"
    );
    assert_eq!(registry.get("mcp.acme.x", None).unwrap().spec.version, "2");
    assert_eq!(registry.get("mcp.acme.y", None).unwrap_err(), ToolNotFound);
}

#[test]
fn specs_for_session_applies_the_four_filters() {
    let mut scoped = spec("demo.scoped");
    scoped.required_scopes = ["demo.use".to_owned()].into();
    let mut risky = spec("demo.risky");
    risky.risk = RiskLevel::High;
    let mut sandboxed = spec("sandbox.run_command");
    sandboxed.source = ToolSource::Sandbox;
    sandboxed.target_kind = TargetKind::Sandbox;
    let registry = ToolRegistry::with_builtins(
        LIMITS,
        tools([
            spec("demo.echo"),
            spec("workspace.read_text"),
            scoped,
            risky,
            sandboxed,
        ]),
    )
    .unwrap();
    let (_, principal, _, environment) = everything();
    let agent = AgentSpec {
        tools: vec!["demo.*".into(), "sandbox.*".into()],
    };
    let profile = PolicyProfile {
        denied_tools: vec!["demo.echo".into()],
        maximum_risk: RiskLevel::Medium,
    };
    let environment_without_sandbox = RuntimeEnvironment {
        targets: environment
            .targets
            .iter()
            .copied()
            .filter(|t| *t != TargetKind::Sandbox)
            .collect(),
    };
    let pinned = registry.specs_for_session(
        "tenant",
        &agent,
        &principal,
        &profile,
        &environment_without_sandbox,
    );
    let names: Vec<&str> = pinned
        .tools()
        .iter()
        .map(|t| t.tool.spec.name.as_str())
        .collect();
    // workspace: agent; scoped: principal; echo and risky: profile; sandbox: environment.
    assert_eq!(names, Vec::<&str>::new());

    let principal = Principal {
        id: "p".into(),
        scopes: ["demo.use".to_owned()].into(),
    };
    let pinned = registry.specs_for_session(
        "tenant",
        &agent,
        &principal,
        &PolicyProfile::default(),
        &environment,
    );
    let names: Vec<&str> = pinned
        .tools()
        .iter()
        .map(|t| t.tool.spec.name.as_str())
        .collect();
    assert_eq!(
        names,
        vec![
            "demo.echo",
            "demo.risky",
            "demo.scoped",
            "sandbox.run_command"
        ]
    );
}

#[test]
fn a_pinned_set_is_addressable_and_survives_new_registrations() {
    let registry = ToolRegistry::with_builtins(LIMITS, Vec::new()).unwrap();
    registry.register_dynamic(tools([mcp("acme", "read")]), ToolSource::Mcp);
    let (agent, principal, profile, environment) = everything();
    let pinned = registry.specs_for_session("tenant", &agent, &principal, &profile, &environment);
    let hash = pinned.tool_schema_sha256().to_owned();
    assert_eq!(hash.len(), 64);

    // The server changes its catalog: a new version, a new tool.
    let mut changed = mcp("acme", "read");
    changed.version = "2".into();
    changed.input_schema = json!({"type": "object", "properties": {"uri": {"type": "string"}}});
    registry.register_dynamic(tools([changed, mcp("acme", "write")]), ToolSource::Mcp);

    let resumed = registry.pinned(&hash).expect("the pin is addressable");
    assert_eq!(resumed.tools().len(), 1);
    assert_eq!(
        resumed.resolve("mcp.acme.read").unwrap().tool.spec.version,
        "1"
    );
    assert_eq!(
        resumed.resolve("mcp-acme-read").unwrap().tool.spec.name,
        "mcp.acme.read"
    );
    assert!(resumed.resolve("mcp.acme.write").is_none());

    let fresh = registry.specs_for_session("tenant", &agent, &principal, &profile, &environment);
    assert_ne!(fresh.tool_schema_sha256(), hash);
    assert_eq!(
        registry
            .specs_for_session("tenant", &agent, &principal, &profile, &environment)
            .tool_schema_sha256(),
        fresh.tool_schema_sha256()
    );
}

/// A catalog that changes ten times, each generation's sessions ended
/// before the next: the registry holds the newest generation and what
/// a live session pins, never the history.
#[test]
fn a_churning_catalog_costs_what_live_sessions_hold() {
    let registry = ToolRegistry::with_builtins(LIMITS, Vec::new()).unwrap();
    let (agent, principal, profile, environment) = everything();
    let generation = |version: usize| {
        let specs: Vec<ToolSpec> = (0..50)
            .map(|index| {
                let mut spec = mcp("acme", &format!("tool{index}"));
                spec.version = version.to_string();
                spec.input_schema = json!({"type": "object", "properties": {
                    format!("field{version}"): {"type": "string"}}});
                spec
            })
            .collect();
        registry.register_dynamic(tools(specs), ToolSource::Mcp);
    };
    generation(0);
    let kept = registry.specs_for_session("tenant", &agent, &principal, &profile, &environment);
    let mut current = None;
    for version in 1..=10 {
        generation(version);
        // The previous generation's session ends; the first stays open.
        current =
            Some(registry.specs_for_session("tenant", &agent, &principal, &profile, &environment));
        registry.collect();
        assert_eq!(
            registry.versions(),
            100,
            "generation {version}: the newest and the one the open session pins"
        );
    }
    assert_eq!(
        kept.resolve("mcp.acme.tool0").unwrap().tool.spec.version,
        "0"
    );
    drop(kept);
    drop(current);
    registry.collect();
    assert_eq!(
        registry.versions(),
        50,
        "the newest alone, for new sessions"
    );
    assert!(registry.schemas.len() <= 50);
}

/// What a tenant's churning catalog holds is bounded: versions whose
/// schemas did not change share one compiled schema, and past the tenant's
/// budget of pinned tool versions a new catalog version is refused (clearly,
/// per tool) until sessions pinning older ones end; other tenants and the
/// operator's servers are not held to it.
#[test]
fn a_tenants_pinned_catalogs_share_schemas_and_stay_within_its_budget() {
    let limits = RegistryLimits {
        tenant_catalog_tools: 120,
        ..LIMITS
    };
    let registry = ToolRegistry::with_builtins(limits, Vec::new()).unwrap();
    let (agent, principal, profile, environment) = everything();
    let generation = |tenant: &str, version: usize| {
        let specs: Vec<ToolSpec> = (0..50)
            .map(|index| {
                let mut spec = mcp("own", &format!("tool{index}"));
                spec.version = version.to_string();
                spec.description = format!("changed at every discovery: {version}");
                spec
            })
            .collect();
        registry.register_for_tenant(tenant, tools(specs), ToolSource::Mcp)
    };
    let mut sessions = Vec::new();
    for version in 0..2 {
        assert!(generation("t1", version).rejected.is_empty());
        sessions.push(registry.specs_for_session("t1", &agent, &principal, &profile, &environment));
    }
    // 100 pinned; a third version of 50 would hold 150.
    let refused = generation("t1", 2);
    assert!(refused.registered.is_empty());
    assert_eq!(refused.rejected.len(), 50);
    assert!(matches!(
        refused.rejected[0].cause,
        RejectionReason::TenantCatalogBudget { budget: 120 }
    ));
    // Another tenant has a budget of its own.
    assert!(generation("t2", 0).rejected.is_empty());
    // A session ends: the version it pinned no longer counts.
    sessions.remove(0);
    assert!(generation("t1", 2).rejected.is_empty());
    // Pinned too, the same catalog discovered again adds nothing.
    sessions.push(registry.specs_for_session("t1", &agent, &principal, &profile, &environment));
    assert!(generation("t1", 2).rejected.is_empty());
    // Every version declared the same input schema: compiled once.
    assert_eq!(registry.schemas.len(), 1);
}

#[test]
fn application_only_tools_are_pinned_but_not_advertised() {
    let registry = ToolRegistry::with_builtins(LIMITS, Vec::new()).unwrap();
    let mut hidden = mcp("gmail", "sync");
    hidden.model_visible = false;
    registry.register_dynamic(tools([hidden, mcp("gmail", "search")]), ToolSource::Mcp);
    let (agent, principal, profile, environment) = everything();
    let pinned = registry.specs_for_session("tenant", &agent, &principal, &profile, &environment);
    assert!(pinned.resolve("mcp.gmail.sync").is_some());
    let advertised: Vec<&str> = pinned
        .advertised()
        .map(|t| t.tool.spec.name.as_str())
        .collect();
    assert_eq!(advertised, vec!["mcp.gmail.search"]);
}

#[test]
fn colliding_wire_names_leave_both_out() {
    let long = mcp("acme_corporation_tools", &"a".repeat(48));
    assert!(long.name.len() > 64, "the test needs a shortened alias");
    let alias = crate::domain::names::wire_name(&long.name);
    let pinned = pin(vec![Arc::new(RegisteredTool {
        spec: long.clone(),
        tool: Arc::new(Fixed(long.clone())),
        input: Arc::new(CompiledSchema::compile(&long.input_schema, SchemaOrigin::Remote).unwrap()),
        output: None,
    })]);
    assert!(pinned.wire_collisions().is_empty());
    assert_eq!(pinned.resolve(&alias).unwrap().tool.spec.name, long.name);
    // Same alias twice (as a collision of hashes would produce).
    let twin = pin(vec![
        pinned.tools()[0].tool.clone(),
        pinned.tools()[0].tool.clone(),
    ]);
    assert_eq!(twin.tools().len(), 0);
    assert_eq!(twin.wire_collisions().len(), 1);
}
