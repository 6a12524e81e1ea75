//! Sessions: opening one (discovery, the pinned set, its two hashes, the
//! record), holding it in memory while it is used, reloading and re-pinning
//! one this node does not hold (opened by another node on the same database,
//! or by this one before a restart), and ending those unused for a day.
//!
//! A session answers with its own error enum; what that becomes on a wire is
//! the edge's business.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio::time::Instant;
use uuid::Uuid;

use super::call::CallRequest;
use super::preparation::prepare_mcp;
use super::registry::{PinnedToolSet, ToolRegistry};
use crate::domain::names::{AUTHORED_SKILL_PREFIX, SKILL_LOAD};
use crate::domain::{
    AgentSpec, ArgumentTrust, MAXIMUM_LIST_ENTRIES, PolicyProfile, Principal, RuntimeEnvironment,
    SkillMetadata, TargetKind, ToolOutcomeStatus, ToolSource, TrustLevel, valid_identifier,
    valid_tenant_id,
};
use crate::ports::{
    CatalogStore, Clock, Labels, McpServers, Metrics, PlatformEvent, SessionRecord, SessionStore,
    SkillStore, StoreError,
};

/// A session unused this long has ended: it leaves memory and the store.
pub const SESSION_IDLE: Duration = Duration::from_secs(24 * 3600);
/// How often a session in use refreshes its `last_used_at` in the store.
const SESSION_TOUCH: Duration = Duration::from_secs(3600);
/// How often a session this node holds is checked against the store, so
/// one ended on another node ends here within this.
pub const SESSION_RECHECK: Duration = Duration::from_secs(5);

/// Why a session could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The tenant id breaks the rule where a tenant's records begin.
    #[error("tenant_id must be 1 to 128 letters, digits, '-' or '_'")]
    InvalidTenant,
    /// A principal id, scope or tool pattern is empty, too long, holds a
    /// control character, or there are too many.
    #[error(
        "principal.id, principal.scopes and agent.tools must be 1 to 256 bytes each, without control characters, at most 1,024 entries"
    )]
    InvalidIdentity,
    /// No open session has this id.
    #[error("no open session has this id")]
    Unknown,
    /// The id is open for another tenant, principal or agent.
    #[error("this session id is already open for another tenant, principal or agent")]
    Conflict,
    /// Every server answered and the pinned set is no longer the recorded one.
    #[error(
        "the tools this session pinned are no longer all offered as they were; open a new session"
    )]
    ToolsChanged,
    /// A server did not answer, so the set may only differ for now.
    #[error("a tool server this session pinned did not answer; retry")]
    ServersUnavailable,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What `open` is given.
#[derive(Debug, Clone)]
pub struct SessionRequest {
    /// The caller's id for the session.
    pub session_id: Uuid,
    /// Whose records its calls write.
    pub tenant_id: String,
    /// Who its calls act for.
    pub principal: Principal,
    /// What the agent may use.
    pub agent: AgentSpec,
}

/// Where a call sits: its session's run and step, its batch and deadline,
/// and the trust of what proposed it.
#[derive(Debug, Clone, Copy)]
pub struct CallPlace {
    /// The run.
    pub run_id: Uuid,
    /// The step every call of the batch (or turn) shares.
    pub step_number: i64,
    /// Minimum trust over the context that proposed the call.
    pub origin_trust: TrustLevel,
    /// The run's deadline.
    pub deadline_at: Option<DateTime<Utc>>,
    /// The batch the call was issued in; a bridge call has none.
    pub parallel_group: Option<Uuid>,
}

/// An open session: what its calls resolve against and act as.
pub struct Session {
    /// The session.
    pub session_id: Uuid,
    /// Its tenant.
    pub tenant_id: String,
    /// Who its calls act for.
    pub principal: Principal,
    /// What the agent may use.
    pub agent: AgentSpec,
    /// The set its calls resolve against.
    pub pinned: Arc<PinnedToolSet>,
    /// When a call, turn or listing last used it here.
    last_used: Mutex<Instant>,
    /// When this node last refreshed the store's `last_used_at`.
    touched: Mutex<Instant>,
    /// When this node last saw the session's record in the store.
    checked: Mutex<Instant>,
}

impl Session {
    /// One call of this session, as the pipeline takes it.
    pub fn call_request(
        &self,
        place: CallPlace,
        call_id: String,
        name: String,
        arguments: Value,
    ) -> CallRequest {
        CallRequest {
            tenant_id: self.tenant_id.clone(),
            session_id: self.session_id,
            run_id: place.run_id,
            step_number: place.step_number,
            call_id,
            name,
            arguments,
            principal: self.principal.clone(),
            agent: self.agent.clone(),
            pinned: self.pinned.clone(),
            origin_trust: place.origin_trust,
            argument_trust: ArgumentTrust::default(),
            deadline_at: place.deadline_at,
            parallel_group: place.parallel_group,
            recovering: None,
            caller: Default::default(),
        }
    }

    fn idle_for(&self) -> Duration {
        lock(&self.last_used).elapsed()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The parts sessions are built from.
pub struct SessionParts {
    /// What sessions pin from.
    pub registry: Arc<ToolRegistry>,
    /// The recorded sessions.
    pub sessions: Arc<dyn SessionStore>,
    /// Where a preparation records servers, catalogs and events.
    pub catalog: Arc<dyn CatalogStore>,
    /// The skills the tenant's agents wrote.
    pub authored: Arc<dyn SkillStore>,
    /// The configured MCP servers.
    pub mcp: Arc<dyn McpServers>,
    /// Where a pinned tool's counters are made to exist at zero.
    pub metrics: Arc<dyn Metrics>,
    /// Now.
    pub clock: Arc<dyn Clock>,
}

/// The sessions of this node.
pub struct Sessions {
    parts: SessionParts,
    open: Mutex<HashMap<Uuid, Arc<Session>>>,
}

/// Makes every counter a call of a pinned tool can move by its name alone
/// exist at zero (its calls by outcome, its UNCERTAIN calls, its
/// excerpts), so an alert on `increase(...) > 0` sees the first one. Its
/// failures by reason code appear with their first: one series per code
/// per tool would be mostly zeros.
fn count_from_zero(metrics: &dyn Metrics, pinned: &PinnedToolSet) {
    for pinned in pinned.tools() {
        let spec = &pinned.tool.spec;
        let tool: Labels = vec![
            ("name", spec.name.clone()),
            ("source", spec.source.as_str().to_owned()),
        ];
        for status in ToolOutcomeStatus::ALL {
            let mut labels = tool.clone();
            labels.push(("outcome_status", status.as_str().to_owned()));
            metrics.add("tool_calls_total", labels, 0);
        }
        metrics.add("tool_uncertain_total", tool.clone(), 0);
        metrics.add("tool_truncations_total", tool, 0);
    }
}

/// Whether a pinned set is the one a session recorded: both hashes, neither
/// empty (a hash that could not be taken matches nothing).
fn same_tools(recorded: &SessionRecord, pinned: &PinnedToolSet) -> bool {
    !pinned.tool_schema_sha256().is_empty()
        && !pinned.tool_contract_sha256().is_empty()
        && recorded.tool_schema_sha256 == pinned.tool_schema_sha256()
        && recorded.tool_contract_sha256 == pinned.tool_contract_sha256()
}

/// A recorded session whose tool set did not come out the same: changed for
/// good when every server answered, else perhaps only for now.
fn unreproduced(complete: bool) -> SessionError {
    if complete {
        SessionError::ToolsChanged
    } else {
        SessionError::ServersUnavailable
    }
}

fn idle_window() -> chrono::Duration {
    chrono::Duration::from_std(SESSION_IDLE).unwrap_or(chrono::Duration::MAX)
}

impl Sessions {
    /// Sessions over their parts.
    pub fn new(parts: SessionParts) -> Self {
        Sessions {
            parts,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// Opens a session: prepares the tenant's MCP servers, pins what the
    /// agent may use and records it. Opening an id again is idempotent as
    /// the same tenant, principal and agent, when the set comes out the same.
    pub async fn open(&self, request: SessionRequest) -> Result<Arc<Session>, SessionError> {
        if !valid_tenant_id(&request.tenant_id) {
            return Err(SessionError::InvalidTenant);
        }
        let lists_ok = request.principal.scopes.len() <= MAXIMUM_LIST_ENTRIES
            && request.agent.tools.len() <= MAXIMUM_LIST_ENTRIES;
        let entries_ok = valid_identifier(&request.principal.id)
            && request.principal.scopes.iter().all(|s| valid_identifier(s))
            && request.agent.tools.iter().all(|t| valid_identifier(t));
        if !(lists_ok && entries_ok) {
            return Err(SessionError::InvalidIdentity);
        }
        let (pinned, complete) = self
            .pin(&request.tenant_id, &request.principal, &request.agent)
            .await?;
        let now = self.parts.clock.now();
        let record = SessionRecord {
            session_id: request.session_id,
            tenant_id: request.tenant_id.clone(),
            principal: request.principal.clone(),
            agent: request.agent.clone(),
            tool_schema_sha256: pinned.tool_schema_sha256().to_owned(),
            tool_contract_sha256: pinned.tool_contract_sha256().to_owned(),
            tool_names: {
                let mut names: Vec<String> = pinned
                    .tools()
                    .iter()
                    .map(|pinned| pinned.tool.spec.name.clone())
                    .collect();
                names.sort();
                names
            },
            opened_at: now,
            last_used_at: now,
        };
        let recorded = self.parts.sessions.open_session(&record).await?;
        if (&recorded.tenant_id, &recorded.principal, &recorded.agent)
            != (&record.tenant_id, &record.principal, &record.agent)
        {
            return Err(SessionError::Conflict);
        }
        if !same_tools(&recorded, &pinned) {
            return Err(unreproduced(complete));
        }
        let session = Arc::new(Session {
            session_id: request.session_id,
            tenant_id: request.tenant_id,
            principal: request.principal,
            agent: request.agent,
            pinned,
            last_used: Mutex::new(Instant::now()),
            touched: Mutex::new(Instant::now()),
            checked: Mutex::new(Instant::now()),
        });
        lock(&self.open).insert(session.session_id, session.clone());
        Ok(session)
    }

    /// A session, from memory or else from the store, marked used. One
    /// held in memory is checked against the store every
    /// [`SESSION_RECHECK`]: ended on another node, it ends here too.
    pub async fn get(&self, id: Uuid) -> Result<Arc<Session>, SessionError> {
        let cached = lock(&self.open).get(&id).cloned();
        let session = match cached {
            Some(session) => {
                let due = lock(&session.checked).elapsed() >= SESSION_RECHECK;
                if due {
                    match self.parts.sessions.session(id).await {
                        Ok(Some(_)) => *lock(&session.checked) = Instant::now(),
                        Ok(None) => {
                            lock(&self.open).remove(&id);
                            return Err(SessionError::Unknown);
                        }
                        // The store not answering is no reason to stop a
                        // session; the next use looks again.
                        Err(failure) => {
                            tracing::warn!(error = %failure, "a session's record could not be read");
                        }
                    }
                }
                session
            }
            None => self.reload(id).await?,
        };
        *lock(&session.last_used) = Instant::now();
        let stale = {
            let mut touched = lock(&session.touched);
            let stale = touched.elapsed() >= SESSION_TOUCH;
            if stale {
                *touched = Instant::now();
            }
            stale
        };
        if stale
            && let Err(failure) = self
                .parts
                .sessions
                .touch_session(id, self.parts.clock.now())
                .await
        {
            tracing::warn!(error = %failure, "a session's last use was not recorded");
        }
        Ok(session)
    }

    /// A session this node does not hold. It is pinned again and served only
    /// if its tool set comes out the same.
    async fn reload(&self, id: Uuid) -> Result<Arc<Session>, SessionError> {
        let record = self
            .parts
            .sessions
            .session(id)
            .await?
            .ok_or(SessionError::Unknown)?;
        if record.last_used_at + idle_window() < self.parts.clock.now() {
            return Err(SessionError::Unknown);
        }
        let (pinned, complete) = self
            .pin(&record.tenant_id, &record.principal, &record.agent)
            .await?;
        if !same_tools(&record, &pinned) {
            return Err(unreproduced(complete));
        }
        let session = Arc::new(Session {
            session_id: id,
            tenant_id: record.tenant_id,
            principal: record.principal,
            agent: record.agent,
            pinned,
            last_used: Mutex::new(Instant::now()),
            touched: Mutex::new(Instant::now()),
            checked: Mutex::new(Instant::now()),
        });
        // Two requests may reload at once: the first one kept is everyone's.
        Ok(lock(&self.open).entry(id).or_insert(session).clone())
    }

    /// Prepares the tenant's MCP servers and pins what the agent may use;
    /// says whether every server answered.
    async fn pin(
        &self,
        tenant_id: &str,
        principal: &Principal,
        agent: &AgentSpec,
    ) -> Result<(Arc<PinnedToolSet>, bool), SessionError> {
        let prepared = prepare_mcp(
            &self.parts.registry,
            self.parts.catalog.as_ref(),
            self.parts.clock.as_ref(),
            tenant_id,
            Some(&principal.id),
            self.parts.mcp.as_ref(),
        )
        .await?;
        let complete = !prepared
            .events
            .iter()
            .any(|event| matches!(event, PlatformEvent::ServerDisconnected { .. }));
        let environment = RuntimeEnvironment {
            targets: [TargetKind::InProcess, TargetKind::McpServer].into(),
        };
        let pinned = self.parts.registry.specs_for_session(
            tenant_id,
            agent,
            principal,
            &PolicyProfile::default(),
            &environment,
        );
        // Skills are shown only where they can be loaded, only those the
        // agent's patterns enable, and only from a server the session pinned
        // a tool of (its principal holds the server's scopes); the first of
        // a name wins.
        let mut skills = Vec::new();
        if pinned.resolve(SKILL_LOAD).is_some() {
            let servers: HashSet<&str> = pinned
                .tools()
                .iter()
                .filter_map(|tool| tool.tool.spec.server_id.as_deref())
                .collect();
            let mut seen = HashSet::new();
            // The tenant's own skills, written by its agents: EXTERNAL_UNTRUSTED
            // at load, and editable by skill.manage.
            let authored = self
                .parts
                .authored
                .skills(tenant_id)
                .await?
                .into_iter()
                .map(|skill| SkillMetadata {
                    name: format!("{AUTHORED_SKILL_PREFIX}{}", skill.name),
                    version: skill.version,
                    description: skill.description,
                    required_tools: skill.required_tools,
                    source: ToolSource::Builtin,
                    server_id: None,
                    trust: TrustLevel::ExternalUntrusted,
                    read_only: false,
                });
            for skill in prepared.skills.into_iter().chain(authored) {
                let reachable = skill
                    .server_id
                    .as_deref()
                    .is_none_or(|server| servers.contains(server));
                if reachable && agent.enables(&skill.name) && seen.insert(skill.name.clone()) {
                    skills.push(skill);
                }
            }
        }
        count_from_zero(self.parts.metrics.as_ref(), &pinned);
        Ok((pinned.with_skills(skills), complete))
    }

    /// Ends a session, on every node, if the tenant, principal and agent
    /// given are the ones that opened it: its record goes, so no node
    /// reloads it, and this node forgets it. Whether it ended one.
    pub async fn end(
        &self,
        id: Uuid,
        tenant_id: &str,
        principal: &Principal,
        agent: &AgentSpec,
    ) -> Result<bool, SessionError> {
        let cached = lock(&self.open).get(&id).cloned();
        let owned = match cached {
            Some(session) => {
                (&session.tenant_id, &session.principal, &session.agent)
                    == (&tenant_id.to_owned(), principal, agent)
            }
            None => self
                .parts
                .sessions
                .session(id)
                .await?
                .is_some_and(|record| {
                    (&record.tenant_id, &record.principal, &record.agent)
                        == (&tenant_id.to_owned(), principal, agent)
                }),
        };
        if !owned {
            return Ok(false);
        }
        lock(&self.open).remove(&id);
        self.parts.sessions.end_session(tenant_id, id).await?;
        Ok(true)
    }

    /// Ends the sessions unused for [`SESSION_IDLE`]: from the store, and
    /// from memory unless `in_use` names them (an open turn does).
    pub async fn forget_idle(&self, in_use: &HashSet<Uuid>) {
        let before = self.parts.clock.now() - idle_window();
        if let Err(failure) = self.parts.sessions.forget_sessions(before).await {
            tracing::warn!(error = %failure, "ended sessions were not removed from the store");
        }
        lock(&self.open)
            .retain(|id, session| in_use.contains(id) || session.idle_for() < SESSION_IDLE);
        // What those sessions alone held (their pins' versions of a catalog
        // that has changed since) goes with them.
        let dropped = self.parts.registry.collect();
        if dropped > 0 {
            tracing::debug!(dropped, "tool versions no session uses were dropped");
        }
    }
}
