//! One decoder per row the store reads, for both backends. Each reads
//! columns through [`Columns`] (PostgreSQL has native UUIDs, times and
//! JSON; SQLite keeps them as text and microseconds); a `tool_invocations`
//! row's flat columns become the typed row in one pure step that refuses a
//! row no transition could have written.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::{parse, parse_optional};
use crate::domain::{InvocationStatus, ToolOutcomeStatus};
use crate::ports::{
    ApprovalRecord, ArtifactRecord, AuthoredSkill, BreakerTally, CallIdentity, CatalogEntry,
    CatalogRow, Claim, ConsentFlow, ConsoleSignIn, Ended, EventRecord, Held, InvocationRecord,
    InvocationState, McpServerRow, NewInvocation, RunOwner, SessionRecord, StoreError,
    StoredArtifact, Suspension, ToolHealth, UpstreamGrant,
};

/// A row's columns as values, however the backend stores them.
pub(super) trait Columns {
    /// A text column.
    fn text(&self, column: &str) -> Result<String, StoreError>;
    /// A nullable text column.
    fn optional_text(&self, column: &str) -> Result<Option<String>, StoreError>;
    /// A 64-bit integer column.
    fn integer(&self, column: &str) -> Result<i64, StoreError>;
    /// A nullable 64-bit integer column.
    fn optional_integer(&self, column: &str) -> Result<Option<i64>, StoreError>;
    /// A nullable floating-point column.
    fn optional_float(&self, column: &str) -> Result<Option<f64>, StoreError>;
    /// A boolean column.
    fn flag(&self, column: &str) -> Result<bool, StoreError>;
    /// A UUID column.
    fn uuid(&self, column: &str) -> Result<Uuid, StoreError>;
    /// A nullable UUID column.
    fn optional_uuid(&self, column: &str) -> Result<Option<Uuid>, StoreError>;
    /// A time column.
    fn time(&self, column: &str) -> Result<DateTime<Utc>, StoreError>;
    /// A nullable time column.
    fn optional_time(&self, column: &str) -> Result<Option<DateTime<Utc>>, StoreError>;
    /// A JSON column.
    fn json(&self, column: &str) -> Result<Value, StoreError>;
    /// A nullable JSON column.
    fn optional_json(&self, column: &str) -> Result<Option<Value>, StoreError>;
}

/// The columns that say where a row is, as stored.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct StateColumns {
    pub(super) status: InvocationStatus,
    pub(super) worker_id: Option<Uuid>,
    pub(super) approval_id: Option<Uuid>,
    pub(super) suspended_kind: Option<String>,
    pub(super) suspended_ref: Option<String>,
    pub(super) outcome_status: Option<ToolOutcomeStatus>,
    pub(super) completed_at: Option<DateTime<Utc>>,
    pub(super) result: Option<Value>,
    pub(super) error: Option<Value>,
    pub(super) output_bytes: Option<i64>,
    pub(super) truncated: bool,
    pub(super) artifact_id: Option<Uuid>,
}

impl StateColumns {
    /// The state these columns hold, or why no transition leaves a row so.
    pub(super) fn state(self) -> Result<InvocationState, StoreError> {
        let invalid = |why: &str| Err(StoreError::Decode(format!("tool_invocations: {why}")));
        let suspension = match (self.suspended_kind, self.suspended_ref) {
            (Some(kind), Some(reference)) => Some(Suspension {
                kind: parse(&kind, "suspended_kind")?,
                reference,
            }),
            (None, None) => None,
            _ => return invalid("a suspension without its kind or reference"),
        };
        if !self.status.is_terminal() && self.outcome_status.is_some() {
            return invalid("an outcome on a row not ended");
        }
        match self.status {
            InvocationStatus::Proposed => invalid("a proposed row is never stored"),
            InvocationStatus::WaitingForApproval => match (self.approval_id, suspension) {
                (Some(approval_id), None) => Ok(InvocationState::Waiting { approval_id }),
                _ => invalid("a waiting row without its approval"),
            },
            InvocationStatus::Authorized => match suspension {
                None => Ok(InvocationState::Authorized {
                    worker: self.worker_id,
                }),
                Some(_) => invalid("an authorized row suspended"),
            },
            InvocationStatus::Running => match suspension {
                None => Ok(InvocationState::Running {
                    worker: self.worker_id,
                }),
                Some(suspension) if self.worker_id.is_none() => {
                    Ok(InvocationState::Suspended(suspension))
                }
                Some(_) => invalid("a suspended row still held"),
            },
            status => {
                let (Some(outcome_status), Some(completed_at)) =
                    (self.outcome_status, self.completed_at)
                else {
                    return invalid("an ended row without its outcome or completion");
                };
                if outcome_status.invocation_status() != status {
                    return invalid("an ended row whose status is not its outcome's");
                }
                Ok(InvocationState::Ended(Box::new(Ended {
                    status,
                    outcome_status,
                    completed_at,
                    result: self.result,
                    error: self.error,
                    output_bytes: self.output_bytes,
                    truncated: self.truncated,
                    artifact_id: self.artifact_id,
                    suspension,
                    worker: self.worker_id,
                })))
            }
        }
    }
}

/// A `tool_invocations` row, every column of it.
pub(super) fn invocation(row: &impl Columns) -> Result<InvocationRecord, StoreError> {
    let state = StateColumns {
        status: parse(&row.text("status")?, "status")?,
        worker_id: row.optional_uuid("worker_id")?,
        approval_id: row.optional_uuid("approval_id")?,
        suspended_kind: row.optional_text("suspended_kind")?,
        suspended_ref: row.optional_text("suspended_ref")?,
        outcome_status: parse_optional(row.optional_text("outcome_status")?, "outcome_status")?,
        completed_at: row.optional_time("completed_at")?,
        result: row.optional_json("result")?,
        error: row.optional_json("error")?,
        output_bytes: row.optional_integer("output_bytes")?,
        truncated: row.flag("truncated")?,
        artifact_id: row.optional_uuid("artifact_id")?,
    }
    .state()?;
    Ok(InvocationRecord {
        identity: CallIdentity {
            id: row.uuid("id")?,
            tenant_id: row.text("tenant_id")?,
            session_id: row.uuid("session_id")?,
            run_id: row.uuid("run_id")?,
            step_number: row.integer("step_number")?,
            call_id: row.text("call_id")?,
            tool_name: row.text("tool_name")?,
            tool_version: row.text("tool_version")?,
            tool_source: parse(&row.text("tool_source")?, "tool_source")?,
            server_id: row.optional_text("server_id")?,
            arguments: row.json("arguments")?,
            arguments_hash: row.text("arguments_hash")?,
            idempotency_key: row.text("idempotency_key")?,
            idempotency_class: parse(&row.text("idempotency_class")?, "idempotency_class")?,
            side_effect: parse(&row.text("side_effect")?, "side_effect")?,
            principal: serde_json::from_value(row.json("principal")?)
                .map_err(|e| StoreError::Decode(format!("principal: {e}")))?,
            origin_trust: parse(&row.text("origin_trust")?, "origin_trust")?,
            // A row written before labels were kept has none: every argument
            // the model's.
            argument_trust: row
                .optional_json("argument_trust")?
                .map(serde_json::from_value)
                .transpose()
                .map_err(|e| StoreError::Decode(format!("argument_trust: {e}")))?
                .unwrap_or_default(),
            parallel_group: row.optional_uuid("parallel_group")?,
            deadline_at: row.optional_time("deadline_at")?,
        },
        approval_id: row.optional_uuid("approval_id")?,
        effect_sent_at: row.optional_time("effect_sent_at")?,
        attempt_number: i32::try_from(row.integer("attempt_number")?)
            .map_err(|_| StoreError::Decode("attempt_number: out of range".into()))?,
        lease_epoch: row.integer("lease_epoch")?,
        reason_code: parse_optional(row.optional_text("reason_code")?, "reason_code")?,
        created_at: row.time("created_at")?,
        started_at: row.optional_time("started_at")?,
        state,
    })
}

/// The row an intent inserts for `new` under `claim`, as [`invocation`]
/// decodes it read back: its times whole microseconds, as both stores keep
/// them. Neither store's intent returns its row: reading or returning it
/// cost a statement's work and a decode every call.
pub(super) fn inserted(new: &NewInvocation, claim: Claim) -> Result<InvocationRecord, StoreError> {
    let kept = |at: DateTime<Utc>| {
        DateTime::from_timestamp_micros(at.timestamp_micros())
            .ok_or_else(|| StoreError::Decode("an intent's time: out of range".into()))
    };
    let now = kept(claim.now)?;
    let status = new.start.status();
    let reason_code = new.start.reason_code();
    let state = StateColumns {
        status,
        worker_id: Some(claim.worker_id),
        approval_id: new.start.approval_id(),
        suspended_kind: None,
        suspended_ref: None,
        outcome_status: status.outcome_status(reason_code),
        completed_at: status.is_terminal().then_some(now),
        result: None,
        error: None,
        output_bytes: None,
        truncated: false,
        artifact_id: None,
    }
    .state()?;
    let mut identity = new.identity.clone();
    identity.deadline_at = identity.deadline_at.map(kept).transpose()?;
    Ok(InvocationRecord {
        identity,
        approval_id: new.start.approval_id(),
        effect_sent_at: None,
        attempt_number: 1,
        lease_epoch: 0,
        reason_code,
        created_at: now,
        started_at: (status == InvocationStatus::Running).then_some(now),
        state,
    })
}

/// A row the store just claimed for a worker: held, or the store is wrong.
/// A `runs` row.
pub(super) fn run_owner(row: &impl Columns) -> Result<RunOwner, StoreError> {
    Ok(RunOwner {
        run_id: row.uuid("run_id")?,
        tenant_id: row.text("tenant_id")?,
        principal_id: row.text("principal_id")?,
        session_id: row.uuid("session_id")?,
        opened_at: row.time("opened_at")?,
    })
}

/// An artifact's row and its run's owner, by id within a tenant.
pub(super) const ARTIFACT_WITH_OWNER: &str = "SELECT a.id, a.run_id, a.media_type, a.bytes, a.trust, \
     r.principal_id FROM artifacts a LEFT JOIN runs r \
     ON r.tenant_id = a.tenant_id AND r.run_id = a.run_id \
     WHERE a.id = $1 AND a.tenant_id = $2";

pub(super) fn artifact(row: &impl Columns) -> Result<ArtifactRecord, StoreError> {
    Ok(ArtifactRecord {
        artifact: StoredArtifact {
            id: row.uuid("id")?,
            media_type: row.text("media_type")?,
            bytes: row.integer("bytes")?,
            trust: parse(&row.text("trust")?, "trust")?,
        },
        run_id: row.uuid("run_id")?,
        run_principal_id: row.optional_text("principal_id")?,
    })
}

/// An agent-written skill.
pub(super) fn authored_skill(row: &impl Columns) -> Result<AuthoredSkill, StoreError> {
    Ok(AuthoredSkill {
        name: row.text("name")?,
        description: row.text("description")?,
        body: row.text("body")?,
        required_tools: serde_json::from_value(row.json("required_tools")?)
            .map_err(|e| StoreError::Decode(format!("required_tools: {e}")))?,
        version: row.text("version")?,
        author: row.text("author")?,
        written_by_key: row.text("written_by_key")?,
        created_at: row.time("created_at")?,
        updated_at: row.time("updated_at")?,
    })
}

/// One tool of a server's recorded catalog.
pub(super) fn catalog_row(row: &impl Columns) -> Result<CatalogRow, StoreError> {
    Ok(CatalogRow {
        catalog_hash: row.text("catalog_hash")?,
        entry: CatalogEntry {
            remote_name: row.text("remote_name")?,
            registry_name: row.text("registry_name")?,
            input_schema: row.json("input_schema")?,
        },
        discovered_at: row.time("discovered_at")?,
        withdrawn_at: row.optional_time("withdrawn_at")?,
    })
}

/// An event of the outbox.
pub(super) fn event_record(row: &impl Columns) -> Result<EventRecord, StoreError> {
    Ok(EventRecord {
        id: row.integer("id")?,
        tenant_id: row.optional_text("tenant_id")?,
        event_type: row.text("event_type")?,
        payload: row.json("payload")?,
        created_at: row.time("created_at")?,
    })
}

/// A run's tally of identical calls: the counts by outcome, then the
/// evidence base and the synthesis step, each a row of its own with the
/// count NULL (`toolgate_tally`'s columns, and SQLite's query's).
pub(super) fn breaker_tally(rows: &[impl Columns]) -> Result<BreakerTally, StoreError> {
    let mut tally = BreakerTally::default();
    for row in rows {
        if let Some(step) = row.optional_integer("t_synthesis")? {
            tally.synthesis_after_step = Some(step);
            continue;
        }
        if let Some(base) = row.optional_integer("t_base")? {
            tally.evidence_base = base;
            continue;
        }
        tally.counts.push((
            parse(&row.text("t_status")?, "outcome_status")?,
            parse_optional(row.optional_text("t_code")?, "reason_code")?,
            row.integer("t_count")?,
        ));
    }
    Ok(tally)
}

/// Each tool's health: its counts and latencies (`rows`), with the
/// failures by reason that `failed` lists for it.
pub(super) fn tool_health(
    rows: &[impl Columns],
    failed: &[impl Columns],
) -> Result<Vec<ToolHealth>, StoreError> {
    let failed = failed
        .iter()
        .map(|row| {
            Ok((
                row.text("tool_name")?,
                row.text("reason_code")?,
                row.integer("failures")?,
            ))
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    rows.iter()
        .map(|row| {
            let tool_name = row.text("tool_name")?;
            Ok(ToolHealth {
                failures: failed
                    .iter()
                    .filter(|(tool, _, _)| *tool == tool_name)
                    .map(|(_, code, n)| (code.clone(), *n))
                    .collect(),
                calls: row.integer("calls")?,
                uncertain: row.integer("uncertain")?,
                p50_ms: row.optional_float("p50_ms")?,
                p99_ms: row.optional_float("p99_ms")?,
                tool_name,
            })
        })
        .collect()
}

pub(super) fn console_sign_in(row: &impl Columns) -> Result<ConsoleSignIn, StoreError> {
    Ok(ConsoleSignIn {
        cookie_sha256: row.text("cookie_sha256")?,
        operator: row.text("operator")?,
        signed_in_at: row.time("signed_in_at")?,
        expires_at: row.time("expires_at")?,
    })
}

/// A list of strings kept as JSON.
fn strings(row: &impl Columns, column: &str) -> Result<Vec<String>, StoreError> {
    serde_json::from_value(row.json(column)?)
        .map_err(|e| StoreError::Decode(format!("{column}: {e}")))
}

/// An `upstream_grants` row.
pub(super) fn upstream_grant(row: &impl Columns) -> Result<UpstreamGrant, StoreError> {
    Ok(UpstreamGrant {
        tenant_id: row.text("tenant_id")?,
        principal_id: row.text("principal_id")?,
        server_id: row.text("server_id")?,
        issuer: row.text("issuer")?,
        scopes: strings(row, "scopes")?,
        sealed_tokens: row.text("sealed_tokens")?,
        granted_at: row.time("granted_at")?,
        last_used_at: row.optional_time("last_used_at")?,
    })
}

/// A `consent_flows` row.
pub(super) fn consent_flow(row: &impl Columns) -> Result<ConsentFlow, StoreError> {
    Ok(ConsentFlow {
        state_sha256: row.text("state_sha256")?,
        tenant_id: row.text("tenant_id")?,
        principal_id: row.text("principal_id")?,
        server_id: row.text("server_id")?,
        browser_sha256: row.text("browser_sha256")?,
        sealed_verifier: row.text("sealed_verifier")?,
        issuer: row.text("issuer")?,
        iss_required: row.flag("iss_required")?,
        token_endpoint: row.text("token_endpoint")?,
        resource: row.text("resource")?,
        scopes: strings(row, "scopes")?,
        started_at: row.time("started_at")?,
        expires_at: row.time("expires_at")?,
        client_document: row.optional_text("client_document")?,
        revocation_endpoint: row.optional_text("revocation_endpoint")?,
    })
}

pub(super) fn held(row: InvocationRecord) -> Result<Held, StoreError> {
    row.held().map_err(|_| {
        StoreError::Decode("tool_invocations: a claimed row without its worker".into())
    })
}

/// A `sessions` row.
pub(super) fn session_row(row: &impl Columns) -> Result<SessionRecord, StoreError> {
    let json = |column: &str| -> Result<Value, StoreError> { row.json(column) };
    Ok(SessionRecord {
        session_id: row.uuid("session_id")?,
        tenant_id: row.text("tenant_id")?,
        principal: serde_json::from_value(json("principal")?)
            .map_err(|e| StoreError::Decode(format!("principal: {e}")))?,
        agent: serde_json::from_value(json("agent")?)
            .map_err(|e| StoreError::Decode(format!("agent: {e}")))?,
        tool_schema_sha256: row.text("tool_schema_sha256")?,
        tool_contract_sha256: row.text("tool_contract_sha256")?,
        tool_names: serde_json::from_value(json("tool_names")?)
            .map_err(|e| StoreError::Decode(format!("tool_names: {e}")))?,
        opened_at: row.time("opened_at")?,
        last_used_at: row.time("last_used_at")?,
    })
}

/// An `mcp_servers` row (a tenant's server); scopes that do not read as a
/// list of strings read as none.
pub(super) fn server_row(row: &impl Columns) -> Result<McpServerRow, StoreError> {
    let scopes = |value: Option<Value>| -> Vec<String> {
        value
            .and_then(|value| serde_json::from_value(value).ok())
            .unwrap_or_default()
    };
    Ok(McpServerRow {
        server_id: row.text("server_id")?,
        transport: parse(&row.text("transport")?, "transport")?,
        endpoint: row.text("endpoint")?,
        auth_scheme: parse(&row.text("auth_scheme")?, "auth_scheme")?,
        auth_name: row.optional_text("auth_name")?,
        credential_ref: row.optional_text("credential_ref")?,
        token_endpoint: row.optional_text("token_endpoint")?,
        token_scopes: row
            .optional_json("token_scopes")
            .unwrap_or(None)
            .map(|value| scopes(Some(value))),
        side_effect: parse(&row.text("side_effect")?, "side_effect")?,
        risk: parse(&row.text("risk")?, "risk")?,
        idempotency: parse(&row.text("idempotency")?, "idempotency")?,
        required_scopes: scopes(row.optional_json("required_scopes").unwrap_or(None)),
        timeout_seconds: u32::try_from(row.integer("timeout_seconds")?).unwrap_or_default(),
        maximum_output_bytes: u64::try_from(row.integer("maximum_output_bytes")?)
            .unwrap_or_default(),
        enabled: row.flag("enabled")?,
    })
}

/// An `approvals` row.
pub(super) fn approval<C: Columns + ?Sized>(row: &C) -> Result<ApprovalRecord, StoreError> {
    Ok(ApprovalRecord {
        id: row.uuid("id")?,
        tenant_id: row.text("tenant_id")?,
        invocation_id: row.uuid("invocation_id")?,
        tool_name: row.text("tool_name")?,
        reason_code: parse(&row.text("reason_code")?, "reason_code")?,
        status: parse(&row.text("status")?, "status")?,
        approver: row.optional_text("approver")?,
        requested_at: row.time("requested_at")?,
        decided_at: row.optional_time("decided_at")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::SuspensionKind;

    fn columns(status: InvocationStatus) -> StateColumns {
        StateColumns {
            status,
            worker_id: None,
            approval_id: None,
            suspended_kind: None,
            suspended_ref: None,
            outcome_status: None,
            completed_at: None,
            result: None,
            error: None,
            output_bytes: None,
            truncated: false,
            artifact_id: None,
        }
    }

    #[test]
    fn rows_no_transition_writes_are_refused() {
        let worker = Some(Uuid::new_v4());
        let approval = Some(Uuid::new_v4());
        let now = Some(Utc::now());
        let refused = [
            columns(InvocationStatus::Proposed),
            columns(InvocationStatus::WaitingForApproval),
            StateColumns {
                suspended_kind: Some("user_input".into()),
                ..columns(InvocationStatus::Running)
            },
            StateColumns {
                suspended_kind: Some("user_input".into()),
                suspended_ref: Some("q".into()),
                worker_id: worker,
                ..columns(InvocationStatus::Running)
            },
            StateColumns {
                suspended_kind: Some("user_input".into()),
                suspended_ref: Some("q".into()),
                approval_id: approval,
                ..columns(InvocationStatus::WaitingForApproval)
            },
            StateColumns {
                outcome_status: Some(ToolOutcomeStatus::Succeeded),
                ..columns(InvocationStatus::Running)
            },
            StateColumns {
                completed_at: now,
                ..columns(InvocationStatus::Succeeded)
            },
            StateColumns {
                outcome_status: Some(ToolOutcomeStatus::Failed),
                ..columns(InvocationStatus::Failed)
            },
            StateColumns {
                outcome_status: Some(ToolOutcomeStatus::Failed),
                completed_at: now,
                ..columns(InvocationStatus::Succeeded)
            },
        ];
        for row in refused {
            assert!(
                matches!(row.clone().state(), Err(StoreError::Decode(_))),
                "{row:?}"
            );
        }
    }

    #[test]
    fn each_state_carries_what_is_valid_in_it() {
        let worker = Uuid::new_v4();
        let approval = Uuid::new_v4();
        let now = Utc::now();
        let suspension = Suspension {
            kind: SuspensionKind::ChildRun,
            reference: "r".into(),
        };
        let cases = [
            (
                StateColumns {
                    approval_id: Some(approval),
                    worker_id: Some(worker),
                    ..columns(InvocationStatus::WaitingForApproval)
                },
                InvocationState::Waiting {
                    approval_id: approval,
                },
            ),
            (
                StateColumns {
                    worker_id: Some(worker),
                    approval_id: Some(approval),
                    ..columns(InvocationStatus::Authorized)
                },
                InvocationState::Authorized {
                    worker: Some(worker),
                },
            ),
            (
                columns(InvocationStatus::Running),
                InvocationState::Running { worker: None },
            ),
            (
                StateColumns {
                    suspended_kind: Some("child_run".into()),
                    suspended_ref: Some("r".into()),
                    ..columns(InvocationStatus::Running)
                },
                InvocationState::Suspended(suspension.clone()),
            ),
            (
                StateColumns {
                    suspended_kind: Some("child_run".into()),
                    suspended_ref: Some("r".into()),
                    outcome_status: Some(ToolOutcomeStatus::Succeeded),
                    completed_at: Some(now),
                    output_bytes: Some(3),
                    ..columns(InvocationStatus::Succeeded)
                },
                InvocationState::Ended(Box::new(Ended {
                    status: InvocationStatus::Succeeded,
                    outcome_status: ToolOutcomeStatus::Succeeded,
                    completed_at: now,
                    result: None,
                    error: None,
                    output_bytes: Some(3),
                    truncated: false,
                    artifact_id: None,
                    suspension: Some(suspension),
                    worker: None,
                })),
            ),
        ];
        for (row, state) in cases {
            assert_eq!(row.state().expect("a valid row"), state);
        }
    }
}
