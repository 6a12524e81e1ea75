//! The tool registry: registration validation, resolution, and the pinned
//! sets sessions advertise.
//!
//! The registry keeps its own copy of each spec as registration made it
//! (forced trust applied), so nothing a tool implementation claims about
//! itself after registration is believed.

use std::collections::{BTreeMap, HashMap};
use std::sync::Weak;
use std::sync::{Arc, RwLock};

use serde::Serialize;

use crate::domain::names::{
    AUTHORED_SKILL_PREFIX, CONTROL_TOOLS, DomainOwner, NameError, domain_owner, is_identifier,
    validate_registry_name, wire_name,
};
use crate::domain::{
    AdvertisedSkill, AgentSpec, IdempotencyClass, PolicyProfile, Principal, RiskLevel,
    RuntimeEnvironment, SideEffectClass, SkillMetadata, TargetKind, ToolKind, ToolSource, ToolSpec,
    TrustLevel, canonicalize,
};
use crate::ports::Tool;

use super::validation::{CompiledSchema, SchemaCache, SchemaError, SchemaOrigin};

/// Registry-wide limits from configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegistryLimits {
    /// The global ceiling on any tool's `maximum_output_bytes`.
    pub maximum_output_bytes_ceiling: u64,
    /// The tool versions one tenant's own servers may hold registered at
    /// once, across the catalog versions its live sessions pin.
    pub tenant_catalog_tools: usize,
}

/// Why one spec was not registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RejectionReason {
    /// The name breaks the grammar.
    #[error("name: {0}")]
    Name(#[from] NameError),
    /// The domain is in no row of the partition table.
    #[error("domain {0} is not in the partition table")]
    UnknownDomain(String),
    /// A builtin in `mcp` or `device`.
    #[error("domain {0} is reserved and cannot hold a builtin")]
    ReservedDomain(String),
    /// A capability in a domain that holds only control tools.
    #[error("domain {0} holds only control tools")]
    ControlOnlyDomain(String),
    /// A control tool outside the closed set, or a member of the set
    /// registered as a capability.
    #[error("the control-tool set is closed at build time")]
    ControlSetClosed,
    /// A control tool with an outward side effect, idempotency or target.
    #[error(
        "a control tool must have side effect none, idempotency read_only or idempotent, and target in_process"
    )]
    ControlConstraint,
    /// An MCP tool outside `mcp.{server_id}.` or without a server.
    #[error("an MCP tool must be named mcp.{{server_id}}.name with its server_id set")]
    McpNamespace,
    /// A device tool outside `device.` or without a device.
    #[error("a device tool must be in the device domain with its device_id set")]
    DeviceNamespace,
    /// The target does not match the source (MCP and device targets belong
    /// to their sources only).
    #[error("target {target} does not fit source {tool_source}")]
    TargetSource {
        /// The declared target.
        target: TargetKind,
        /// The declared source.
        tool_source: ToolSource,
    },
    /// A pinned target used outside its pin, or a pinned name without it.
    #[error("target {0} is pinned to a fixed classification and name")]
    TargetPin(TargetKind),
    /// The input schema cannot be used.
    #[error("input_schema: {0}")]
    InputSchema(SchemaError),
    /// The output schema cannot be used.
    #[error("output_schema: {0}")]
    OutputSchema(SchemaError),
    /// Declared more output than the global ceiling permits.
    #[error("maximum_output_bytes {declared} exceeds the global ceiling {ceiling}")]
    OutputCeiling {
        /// The declared limit.
        declared: u64,
        /// The ceiling.
        ceiling: u64,
    },
    /// A zero limit or timeout.
    #[error("timeout_seconds and maximum_output_bytes must be positive")]
    ZeroLimit,
    /// The tenant's registered catalogs already hold its budget of tool
    /// versions (the versions its live sessions pin).
    #[error(
        "the tenant's servers' catalogs hold {budget} tool versions already; sessions pinning older versions must end first"
    )]
    TenantCatalogBudget {
        /// The budget.
        budget: usize,
    },
    /// `register_dynamic` accepts MCP and device tools only.
    #[error("source {0} cannot be registered at runtime")]
    SourceNotDynamic(ToolSource),
    /// A spec whose source differs from the registration's.
    #[error("spec source {declared} differs from the registering source {registering}")]
    SourceMismatch {
        /// What the spec says.
        declared: ToolSource,
        /// What registered it.
        registering: ToolSource,
    },
    /// The name and version are registered with a different declaration.
    #[error("name and version already registered with a different declaration")]
    Duplicate,
}

/// One rejected spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rejection {
    /// The spec's name as declared.
    pub name: String,
    /// Why, as text for operators.
    pub reason: String,
    /// Why, as a value for code.
    #[serde(skip)]
    pub cause: RejectionReason,
}

/// What one registration did: every acceptance and every rejection with its
/// reason, never just a count.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RegistrationReport {
    /// Names registered (or already registered identically).
    pub registered: Vec<String>,
    /// Specs refused.
    pub rejected: Vec<Rejection>,
}

impl std::fmt::Display for RegistrationReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} registered, {} rejected",
            self.registered.len(),
            self.rejected.len()
        )?;
        for rejection in &self.rejected {
            write!(f, "\n  {}: {}", rejection.name, rejection.reason)?;
        }
        Ok(())
    }
}

/// The build-time registration failed: toolgate must not start.
#[derive(Debug, thiserror::Error)]
#[error("builtin registration failed: {0}")]
pub struct StartupError(pub RegistrationReport);

/// `get` found nothing: the pipeline denies with `policy.matrix.unknown_tool`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no tool is registered under this name")]
pub struct ToolNotFound;

/// A tool as registration left it.
pub struct RegisteredTool {
    /// The effective spec (forced fields applied).
    pub spec: ToolSpec,
    /// The implementation.
    pub tool: Arc<dyn Tool>,
    /// The compiled input schema.
    pub input: Arc<CompiledSchema>,
    /// The compiled output schema, when declared.
    pub output: Option<Arc<CompiledSchema>>,
}

impl std::fmt::Debug for RegisteredTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredTool")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

/// One tool of a pinned set, with its provider-safe alias.
#[derive(Debug, Clone)]
pub struct PinnedTool {
    /// The registered tool at the version the session saw.
    pub tool: Arc<RegisteredTool>,
    /// The alias model APIs accept.
    pub wire_name: String,
}

/// The set a session advertised, fixed for the life of the session and
/// addressable by `tool_schema_sha256`.
#[derive(Debug)]
pub struct PinnedToolSet {
    tools: Vec<PinnedTool>,
    by_name: HashMap<String, usize>,
    by_wire_name: HashMap<String, usize>,
    tool_schema_sha256: String,
    tool_contract_sha256: String,
    wire_collisions: Vec<(String, String)>,
    skills: Arc<[AdvertisedSkill]>,
}

impl PinnedToolSet {
    /// This set with the skills its session is shown, each with the
    /// required tools the set does not hold. The contract hash then covers
    /// them too, so a session reloaded elsewhere is served only when its
    /// skills came out the same.
    pub fn with_skills(self: &Arc<Self>, skills: Vec<SkillMetadata>) -> Arc<PinnedToolSet> {
        if skills.is_empty() {
            return self.clone();
        }
        let advertised: Vec<AdvertisedSkill> = skills
            .into_iter()
            .map(|metadata| AdvertisedSkill {
                missing_tools: metadata
                    .required_tools
                    .iter()
                    .filter(|name| !self.by_name.contains_key(name.as_str()))
                    .cloned()
                    .collect(),
                metadata,
            })
            .collect();
        // The tenant's own skills, which its agents may write at any time,
        // are shown as they are when the session pins; they are no part of
        // what a reload must reproduce (one changed since is withdrawn at
        // load).
        let metadata: Vec<&SkillMetadata> = advertised
            .iter()
            .map(|skill| &skill.metadata)
            .filter(|metadata| !metadata.name.starts_with(AUTHORED_SKILL_PREFIX))
            .collect();
        let tool_contract_sha256 =
            digest(&serde_json::json!({"tools": self.tool_contract_sha256, "skills": metadata}));
        Arc::new(PinnedToolSet {
            tools: self.tools.clone(),
            by_name: self.by_name.clone(),
            by_wire_name: self.by_wire_name.clone(),
            tool_schema_sha256: self.tool_schema_sha256.clone(),
            tool_contract_sha256,
            wire_collisions: self.wire_collisions.clone(),
            skills: advertised.into(),
        })
    }

    /// The skills the session was shown, metadata only.
    pub fn skills(&self) -> &Arc<[AdvertisedSkill]> {
        &self.skills
    }

    /// The hash of the pinned declarations.
    pub fn tool_schema_sha256(&self) -> &str {
        &self.tool_schema_sha256
    }

    /// The hash of every pinned tool's whole spec: what a call is executed
    /// under (idempotency, timeout, output limits, trust, scopes), which the
    /// declarations the model sees leave out.
    pub fn tool_contract_sha256(&self) -> &str {
        &self.tool_contract_sha256
    }

    /// Every pinned tool, by name.
    pub fn tools(&self) -> &[PinnedTool] {
        &self.tools
    }

    /// What the model is shown: pinned tools whose spec is model-visible.
    pub fn advertised(&self) -> impl Iterator<Item = &PinnedTool> {
        self.tools
            .iter()
            .filter(|pinned| pinned.tool.spec.model_visible)
    }

    /// Resolves a registry name or its wire alias.
    pub fn resolve(&self, name: &str) -> Option<&PinnedTool> {
        self.by_name
            .get(name)
            .or_else(|| self.by_wire_name.get(name))
            .map(|index| &self.tools[*index])
    }

    /// Pairs of names left out because their wire aliases collided.
    pub fn wire_collisions(&self) -> &[(String, String)] {
        &self.wire_collisions
    }
}

/// Whose a registration is: everyone's (`None`: builtins and the
/// operator's MCP servers) or one tenant's (its own HTTP servers, which no
/// other tenant's session sees).
type Scope = Option<String>;

/// Every registration of one name, by scope and version.
type Registrations = BTreeMap<(Scope, String), Arc<RegisteredTool>>;

/// The registry.
pub struct ToolRegistry {
    limits: RegistryLimits,
    /// name -> (scope, version) -> tool; versions of MCP tools are catalog
    /// hashes.
    tools: RwLock<BTreeMap<String, Registrations>>,
    /// The newest registration of each name in each scope.
    latest: RwLock<HashMap<(Scope, String), Arc<RegisteredTool>>>,
    /// Pinned sets by hash while a session holds them, so identical pins
    /// share one set; a set no session holds is gone.
    pinned: RwLock<HashMap<String, Weak<PinnedToolSet>>>,
    schemas: SchemaCache,
}

impl ToolRegistry {
    /// A registry holding the build's tools. Any rejection is a startup error.
    pub fn with_builtins(
        limits: RegistryLimits,
        builtins: Vec<Arc<dyn Tool>>,
    ) -> Result<Self, StartupError> {
        let registry = ToolRegistry {
            limits,
            tools: RwLock::default(),
            latest: RwLock::default(),
            pinned: RwLock::default(),
            schemas: SchemaCache::default(),
        };
        let report = registry.register(builtins, None, None);
        if report.rejected.is_empty() {
            Ok(registry)
        } else {
            Err(StartupError(report))
        }
    }

    /// Registers tools discovered at runtime (MCP catalogs, device
    /// capabilities). Builtins and sandbox tools are refused: the build is
    /// their only source.
    pub fn register_dynamic(
        &self,
        tools: Vec<Arc<dyn Tool>>,
        source: ToolSource,
    ) -> RegistrationReport {
        self.register(tools, Some(source), None)
    }

    /// Registers tools of one tenant's own servers: only that tenant's
    /// sessions are offered them.
    pub fn register_for_tenant(
        &self,
        tenant_id: &str,
        tools: Vec<Arc<dyn Tool>>,
        source: ToolSource,
    ) -> RegistrationReport {
        self.register(tools, Some(source), Some(tenant_id.to_owned()))
    }

    /// Stops offering new sessions the MCP tools of `scope` that `keep`
    /// refuses: those of a server that failed a preparation or is no longer
    /// configured, and names a server no longer lists. Registered versions
    /// stay, so a pinned session and recovery still resolve what they
    /// recorded.
    pub fn withdraw_mcp(&self, scope: Option<&str>, keep: impl Fn(&ToolSpec) -> bool) {
        let scope: Scope = scope.map(str::to_owned);
        write(&self.latest).retain(|(tool_scope, _), tool| {
            *tool_scope != scope || tool.spec.source != ToolSource::Mcp || keep(&tool.spec)
        });
    }

    /// The tool under `name` registered for everyone, at `version` or the
    /// newest.
    pub fn get(
        &self,
        name: &str,
        version: Option<&str>,
    ) -> Result<Arc<RegisteredTool>, ToolNotFound> {
        self.get_for(None, name, version)
    }

    /// The tool under `name` as `tenant_id` sees it: everyone's, else the
    /// tenant's own; at `version` or the newest.
    pub fn get_for(
        &self,
        tenant_id: Option<&str>,
        name: &str,
        version: Option<&str>,
    ) -> Result<Arc<RegisteredTool>, ToolNotFound> {
        let scopes: Vec<Scope> = std::iter::once(None)
            .chain(tenant_id.map(|tenant| Some(tenant.to_owned())))
            .collect();
        let found = scopes.into_iter().find_map(|scope| match version {
            Some(version) => read(&self.tools)
                .get(name)
                .and_then(|versions| versions.get(&(scope, version.to_owned())))
                .cloned(),
            None => read(&self.latest).get(&(scope, name.to_owned())).cloned(),
        });
        found.ok_or(ToolNotFound)
    }

    /// Section 11.1's four filters, applied once; the result is pinned and
    /// stays addressable by its hash.
    pub fn specs_for_session(
        &self,
        tenant_id: &str,
        agent: &AgentSpec,
        principal: &Principal,
        profile: &PolicyProfile,
        environment: &RuntimeEnvironment,
    ) -> Arc<PinnedToolSet> {
        let latest = read(&self.latest);
        // Everyone's tools and the tenant's own; a name both hold (an
        // operator server given a tenant server's id later) is everyone's.
        let candidates: Vec<Arc<RegisteredTool>> = latest
            .iter()
            .filter(|((scope, name), _)| match scope {
                None => true,
                Some(tenant) => tenant == tenant_id && !latest.contains_key(&(None, name.clone())),
            })
            .map(|(_, tool)| tool)
            .filter(|tool| {
                let spec = &tool.spec;
                agent.enables(&spec.name)
                    && principal.missing_scopes(spec).is_empty()
                    && profile.permits(spec)
                    && environment.offers(spec.target_kind)
            })
            .cloned()
            .collect();
        let pinned = Arc::new(pin(candidates));
        let mut sets = write(&self.pinned);
        if let Some(held) = sets.get(&pinned.tool_schema_sha256).and_then(Weak::upgrade) {
            return held;
        }
        sets.retain(|_, set| set.strong_count() > 0);
        sets.insert(pinned.tool_schema_sha256.clone(), Arc::downgrade(&pinned));
        pinned
    }

    /// Drops what no session and no new session can use: registered
    /// versions that are not the newest of their name and that no pinned
    /// set holds, and the schemas only they were compiled for. A catalog
    /// that churns thus costs what its live sessions hold, not its history.
    /// Returns how many versions were dropped.
    pub fn collect(&self) -> usize {
        let mut dropped = 0;
        // Held by the map alone (no pinned set, not the newest): unused.
        write(&self.tools).retain(|_, versions| {
            versions.retain(|_, tool| {
                let used = Arc::strong_count(tool) > 1;
                dropped += usize::from(!used);
                used
            });
            !versions.is_empty()
        });
        write(&self.pinned).retain(|_, set| set.strong_count() > 0);
        self.schemas.collect();
        dropped
    }

    /// Registered versions, of every name and scope.
    pub fn versions(&self) -> usize {
        read(&self.tools).values().map(BTreeMap::len).sum()
    }

    /// A pin of exactly one registered version, as `tenant_id` sees it:
    /// what recovery resolves a row's tool against, since the row records
    /// the version it ran.
    pub fn pin_exact(
        &self,
        tenant_id: &str,
        name: &str,
        version: &str,
    ) -> Option<Arc<PinnedToolSet>> {
        let tool = self.get_for(Some(tenant_id), name, Some(version)).ok()?;
        Some(Arc::new(pin(vec![tool])))
    }

    /// The pinned set a session advertised, by its hash, while one holds it.
    pub fn pinned(&self, tool_schema_sha256: &str) -> Option<Arc<PinnedToolSet>> {
        read(&self.pinned)
            .get(tool_schema_sha256)
            .and_then(Weak::upgrade)
    }

    fn register(
        &self,
        tools: Vec<Arc<dyn Tool>>,
        dynamic: Option<ToolSource>,
        scope: Scope,
    ) -> RegistrationReport {
        let mut report = RegistrationReport::default();
        if let Some(budget) = self.over_tenant_budget(&tools, &scope) {
            for tool in tools {
                let name = tool.spec().name.clone();
                let cause = RejectionReason::TenantCatalogBudget { budget };
                report.rejected.push(Rejection {
                    name,
                    reason: cause.to_string(),
                    cause,
                });
            }
            return report;
        }
        for tool in tools {
            let declared = tool.spec().clone();
            let name = declared.name.clone();
            match self.admit(tool, declared, dynamic, &scope) {
                Ok(()) => report.registered.push(name),
                Err(cause) => report.rejected.push(Rejection {
                    name,
                    reason: cause.to_string(),
                    cause,
                }),
            }
        }
        report
    }

    /// The tenant's budget, when registering `tools` in a tenant's `scope`
    /// would leave it holding more tool versions than it allows: the
    /// versions its live sessions pin (held beyond the registry's own
    /// references) and what the new catalog adds. A version only the
    /// registry holds is what collection drops, and the newest is what
    /// `tools` replaces.
    fn over_tenant_budget(&self, tools: &[Arc<dyn Tool>], scope: &Scope) -> Option<usize> {
        let tenant = scope.as_ref()?;
        let budget = self.limits.tenant_catalog_tools;
        let registered = read(&self.tools);
        let latest = read(&self.latest);
        let pinned: usize = registered
            .iter()
            .flat_map(|(name, versions)| versions.iter().map(move |(key, tool)| (name, key, tool)))
            .filter(|(_, (tool_scope, _), _)| tool_scope.as_ref() == Some(tenant))
            .filter(|(name, (tool_scope, _), tool)| {
                let newest = latest
                    .get(&(tool_scope.clone(), (*name).clone()))
                    .is_some_and(|newest| Arc::ptr_eq(newest, tool));
                Arc::strong_count(tool) > 1 + usize::from(newest)
            })
            .count();
        // A version already registered (the same catalog again) adds nothing.
        let new = tools
            .iter()
            .filter(|tool| {
                let spec = tool.spec();
                registered.get(&spec.name).is_none_or(|versions| {
                    !versions.contains_key(&(scope.clone(), spec.version.clone()))
                })
            })
            .count();
        (pinned + new > budget).then_some(budget)
    }

    fn admit(
        &self,
        tool: Arc<dyn Tool>,
        mut spec: ToolSpec,
        dynamic: Option<ToolSource>,
        scope: &Scope,
    ) -> Result<(), RejectionReason> {
        match dynamic {
            Some(source @ (ToolSource::Builtin | ToolSource::Sandbox)) => {
                return Err(RejectionReason::SourceNotDynamic(source));
            }
            Some(registering) if spec.source != registering => {
                return Err(RejectionReason::SourceMismatch {
                    declared: spec.source,
                    registering,
                });
            }
            None if matches!(spec.source, ToolSource::Mcp | ToolSource::Device) => {
                return Err(RejectionReason::SourceMismatch {
                    declared: spec.source,
                    registering: ToolSource::Builtin,
                });
            }
            _ => {}
        }
        // Forced trust is overwritten, not validated: a server cannot declare
        // itself trustworthy.
        if let Some(forced) = spec.source.forced_output_trust() {
            spec.output_trust = forced;
        }
        validate_registry_name(&spec.name)?;
        check_namespace(&spec)?;
        check_kind(&spec)?;
        check_target(&spec)?;
        if spec.timeout_seconds == 0 || spec.maximum_output_bytes == 0 {
            return Err(RejectionReason::ZeroLimit);
        }
        if spec.maximum_output_bytes > self.limits.maximum_output_bytes_ceiling {
            return Err(RejectionReason::OutputCeiling {
                declared: spec.maximum_output_bytes,
                ceiling: self.limits.maximum_output_bytes_ceiling,
            });
        }
        let origin = match spec.source {
            ToolSource::Builtin | ToolSource::Sandbox => SchemaOrigin::Local,
            ToolSource::Mcp | ToolSource::Device => SchemaOrigin::Remote,
        };
        let input = self
            .schemas
            .get_or_compile(&spec.input_schema, origin)
            .map_err(RejectionReason::InputSchema)?;
        let output = match &spec.output_schema {
            Some(schema) => Some(
                self.schemas
                    .get_or_compile(schema, origin)
                    .map_err(RejectionReason::OutputSchema)?,
            ),
            None => None,
        };
        let registered = Arc::new(RegisteredTool {
            spec,
            tool,
            input,
            output,
        });
        let mut tools = write(&self.tools);
        let versions = tools.entry(registered.spec.name.clone()).or_default();
        let key = (scope.clone(), registered.spec.version.clone());
        if let Some(existing) = versions.get(&key) {
            // Re-discovering an identical catalog is not an error, and its
            // tool replaces the earlier one (whose server may since have
            // been replaced); a builtin registered twice, or a changed
            // declaration under one version, is an error.
            if dynamic.is_none() || existing.spec != registered.spec {
                return Err(RejectionReason::Duplicate);
            }
        }
        versions.insert(key, registered.clone());
        write(&self.latest).insert((scope.clone(), registered.spec.name.clone()), registered);
        Ok(())
    }
}

fn check_namespace(spec: &ToolSpec) -> Result<(), RejectionReason> {
    let domain = spec.domain().to_owned();
    match spec.source {
        ToolSource::Mcp => {
            let server = spec.server_id.as_deref().filter(|id| is_identifier(id));
            let prefix_ok = server.is_some_and(|id| {
                spec.name
                    .strip_prefix("mcp.")
                    .and_then(|rest| rest.strip_prefix(id))
                    .is_some_and(|rest| rest.starts_with('.') && !rest[1..].contains('.'))
            });
            if !prefix_ok || spec.device_id.is_some() {
                return Err(RejectionReason::McpNamespace);
            }
            Ok(())
        }
        ToolSource::Device => {
            if domain != "device" || spec.device_id.is_none() || spec.server_id.is_some() {
                return Err(RejectionReason::DeviceNamespace);
            }
            Ok(())
        }
        ToolSource::Builtin | ToolSource::Sandbox => {
            if spec.server_id.is_some() || spec.device_id.is_some() {
                return Err(RejectionReason::TargetSource {
                    target: spec.target_kind,
                    tool_source: spec.source,
                });
            }
            match domain_owner(&domain) {
                None => Err(RejectionReason::UnknownDomain(domain)),
                Some(DomainOwner::Mcp | DomainOwner::Device) => {
                    Err(RejectionReason::ReservedDomain(domain))
                }
                Some(DomainOwner::Control) if spec.kind != ToolKind::Control => {
                    Err(RejectionReason::ControlOnlyDomain(domain))
                }
                Some(DomainOwner::Builtin | DomainOwner::Control) => Ok(()),
            }
        }
    }
}

fn check_kind(spec: &ToolSpec) -> Result<(), RejectionReason> {
    let in_control_set = CONTROL_TOOLS.contains(&spec.name.as_str());
    match spec.kind {
        ToolKind::Capability if in_control_set => Err(RejectionReason::ControlSetClosed),
        ToolKind::Capability => Ok(()),
        ToolKind::Control if !in_control_set || spec.source != ToolSource::Builtin => {
            Err(RejectionReason::ControlSetClosed)
        }
        ToolKind::Control => {
            let constrained = spec.side_effect == SideEffectClass::None
                && matches!(
                    spec.idempotency,
                    IdempotencyClass::ReadOnly | IdempotencyClass::Idempotent
                )
                && spec.target_kind == TargetKind::InProcess;
            if constrained {
                Ok(())
            } else {
                Err(RejectionReason::ControlConstraint)
            }
        }
    }
}

fn check_target(spec: &ToolSpec) -> Result<(), RejectionReason> {
    let target = spec.target_kind;
    let fits_source = match target {
        TargetKind::McpServer => spec.source == ToolSource::Mcp,
        TargetKind::Device => spec.source == ToolSource::Device,
        TargetKind::Sandbox => spec.source == ToolSource::Sandbox,
        TargetKind::InProcess
        | TargetKind::WebProvider
        | TargetKind::BrowserProvider
        | TargetKind::UnsubscribeEndpoint => spec.source == ToolSource::Builtin,
    };
    if !fits_source {
        return Err(RejectionReason::TargetSource {
            target,
            tool_source: spec.source,
        });
    }
    // Pins enforced both ways: the target demands its classification, and
    // the pinned name demands its target.
    let pinned_ok = match target {
        TargetKind::WebProvider => {
            spec.side_effect == SideEffectClass::NetworkRead
                && spec.idempotency == IdempotencyClass::ReadOnly
                && spec.output_trust == TrustLevel::ExternalUntrusted
        }
        TargetKind::UnsubscribeEndpoint => {
            spec.name == UNSUBSCRIBE_TOOL
                && spec.side_effect == SideEffectClass::ExternalWrite
                && spec.risk == RiskLevel::Medium
                && spec.idempotency == IdempotencyClass::Idempotent
                && !spec.allow_parallel
        }
        _ => spec.name != UNSUBSCRIBE_TOOL,
    };
    if pinned_ok {
        Ok(())
    } else {
        Err(RejectionReason::TargetPin(target))
    }
}

/// The one builtin the unsubscribe target belongs to.
const UNSUBSCRIBE_TOOL: &str = "email.unsubscribe";

/// What the pinned-set hash is taken over: each tool's advertised identity.
#[derive(Serialize)]
struct PinnedDeclaration<'a> {
    name: &'a str,
    wire_name: &'a str,
    version: &'a str,
    description: &'a str,
    input_schema: &'a serde_json::Value,
    kind: ToolKind,
    source: ToolSource,
    side_effect: SideEffectClass,
    risk: RiskLevel,
    model_visible: bool,
}

fn pin(mut candidates: Vec<Arc<RegisteredTool>>) -> PinnedToolSet {
    candidates.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
    let mut by_wire: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (index, tool) in candidates.iter().enumerate() {
        by_wire
            .entry(wire_name(&tool.spec.name))
            .or_default()
            .push(index);
    }
    // Two names sharing an alias would make the alias ambiguous: both are
    // left out, as same-server name conflicts are, so neither order wins.
    let mut excluded = vec![false; candidates.len()];
    let mut wire_collisions = Vec::new();
    for indices in by_wire.values().filter(|indices| indices.len() > 1) {
        for pair in indices.windows(2) {
            wire_collisions.push((
                candidates[pair[0]].spec.name.clone(),
                candidates[pair[1]].spec.name.clone(),
            ));
        }
        for index in indices {
            excluded[*index] = true;
        }
    }
    let tools: Vec<PinnedTool> = candidates
        .into_iter()
        .zip(excluded)
        .filter(|(_, excluded)| !excluded)
        .map(|(tool, _)| PinnedTool {
            wire_name: wire_name(&tool.spec.name),
            tool,
        })
        .collect();
    let declarations: Vec<PinnedDeclaration<'_>> = tools
        .iter()
        .map(|pinned| {
            let spec = &pinned.tool.spec;
            PinnedDeclaration {
                name: &spec.name,
                wire_name: &pinned.wire_name,
                version: &spec.version,
                description: &spec.description,
                input_schema: &spec.input_schema,
                kind: spec.kind,
                source: spec.source,
                side_effect: spec.side_effect,
                risk: spec.risk,
                model_visible: spec.model_visible,
            }
        })
        .collect();
    // Specs were validated at registration, so their JSON always has a
    // canonical form; an empty hash input would only mean "no tools".
    let tool_schema_sha256 = digest(&declarations);
    let contract: Vec<(&str, &ToolSpec)> = tools
        .iter()
        .map(|pinned| (pinned.wire_name.as_str(), &pinned.tool.spec))
        .collect();
    let tool_contract_sha256 = digest(&contract);
    let by_name = tools
        .iter()
        .enumerate()
        .map(|(i, t)| (t.tool.spec.name.clone(), i))
        .collect();
    let by_wire_name = tools
        .iter()
        .enumerate()
        .map(|(i, t)| (t.wire_name.clone(), i))
        .collect();
    PinnedToolSet {
        tools,
        by_name,
        by_wire_name,
        tool_schema_sha256,
        tool_contract_sha256,
        wire_collisions,
        skills: Arc::new([]),
    }
}

/// The sha256 of a value's canonical JSON; empty when it has none (which
/// matches no recorded hash).
fn digest(value: &impl Serialize) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|value| canonicalize(value).ok())
        .map(|canonical| canonical.sha256)
        .unwrap_or_default()
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // Writers make single inserts, so a poisoned lock holds consistent data.
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests;
