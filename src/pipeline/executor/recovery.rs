//! The recovery table applied to rows this worker took over, and the
//! sweep that takes them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use uuid::Uuid;

use super::decide::{Recovery, asks_for_approval, ending_code, recovery, settled_without_the_tool};
use super::{Pipeline, in_progress};
use crate::domain::policy::PolicyDecision;
use crate::domain::{AgentSpec, ReasonCode, ToolOutcomeStatus, ToolSource};
use crate::pipeline::call::{CallOutcome, CallRequest, CallerTerms, RecoveryReport, SweepBounds};
use crate::pipeline::preparation::register_discoveries;
use crate::pipeline::records::{ended_event, recorded};
use crate::pipeline::registry::RegisteredTool;
use crate::ports::{Claim, Held, PlatformEvent, StoreError, TerminalRecord};

impl Pipeline {
    /// The recovery table, for a row this worker now holds, as
    /// [`recovery`] decides it. Authority was re-checked by steps 1 to 6 of
    /// this same call.
    pub(super) async fn recover_row(
        &self,
        request: &CallRequest,
        tool: &Arc<RegisteredTool>,
        row: Held,
        decision: PolicyDecision,
    ) -> Result<CallOutcome, StoreError> {
        let expired = row
            .identity
            .deadline_at
            .is_some_and(|deadline| deadline <= self.clock.now());
        let approved = if asks_for_approval(&row, decision, expired) {
            Some(self.approved(&row).await?)
        } else {
            None
        };
        match recovery(&row, decision, expired, approved) {
            Recovery::ReopenApproval(code) => {
                let approval_id = Uuid::new_v4();
                let reopened = self
                    .invocations
                    .reopen_approval(
                        &row.identity.tenant_id,
                        row.identity.id,
                        row.fence,
                        approval_id,
                        code,
                        self.clock.now(),
                    )
                    .await?;
                if !reopened {
                    return self.reread(request, row.identity.id).await;
                }
                Ok(CallOutcome::Pending {
                    invocation_id: row.identity.id,
                    approval_id,
                })
            }
            Recovery::End(code) => self.end_held(&row, code).await,
            Recovery::Claim => self.claim_then_run(request, tool, row).await,
            Recovery::Run => self.run_claimed(request, tool, row).await,
        }
    }

    /// Ends a row this worker holds with `code` and no result, then reports
    /// what the row says (another writer's record wins over ours).
    pub(super) async fn end_held(
        &self,
        row: &Held,
        code: ReasonCode,
    ) -> Result<CallOutcome, StoreError> {
        let terminal = TerminalRecord::without_result(code);
        let event = ended_event(row, code);
        self.invocations
            .complete_invocation(
                &row.identity.tenant_id,
                row.identity.id,
                row.fence,
                &terminal,
                &[event],
                self.clock.now(),
            )
            .await?;
        Ok(
            match self
                .invocations
                .invocation(&row.identity.tenant_id, row.identity.id)
                .await?
            {
                Some(current) if current.status().is_terminal() => recorded(&current),
                _ => in_progress(&row.identity.tool_name),
            },
        )
    }

    /// Recovery: takes over the rows of dead workers within `bounds` (what
    /// one sweep takes is bounded in rows and in time; the next takes the
    /// rest), and re-enters the one pipeline function with each. What
    /// the table settles without the tool is settled first, before any
    /// server is prepared; servers are prepared only for the tenants of rows
    /// that must run again and whose tools no session has registered.
    pub async fn recover(&self, bounds: SweepBounds) -> Result<RecoveryReport, StoreError> {
        let mut report = RecoveryReport::default();
        // The tenants prepared in this sweep, each with its servers that
        // did not answer.
        let mut prepared: HashMap<String, HashSet<String>> = HashMap::new();
        let ends = tokio::time::Instant::now() + bounds.time;
        for _ in 0..bounds.rounds.max(1) {
            if !self.lease.is_live() || tokio::time::Instant::now() >= ends {
                break;
            }
            let claim = Claim {
                worker_id: self.lease.worker_id(),
                now: self.clock.now(),
            };
            let rows = self.invocations.claim_expired(claim, bounds.batch).await?;
            if rows.is_empty() {
                break;
            }
            report.taken += rows.len();
            let (settled, rest): (Vec<_>, Vec<_>) = rows
                .into_iter()
                .partition(|held| settled_without_the_tool(held));
            let mut outcomes = futures::future::join_all(
                settled.into_iter().map(|row| self.recover_one(row, None)),
            )
            .await;
            let wanting: HashSet<String> = rest
                .iter()
                .filter(|row| {
                    row.identity.tool_source == ToolSource::Mcp
                        && !prepared.contains_key(&row.identity.tenant_id)
                        && self
                            .registry
                            .pin_exact(
                                &row.identity.tenant_id,
                                &row.identity.tool_name,
                                &row.identity.tool_version,
                            )
                            .is_none()
                })
                .map(|row| row.identity.tenant_id.clone())
                .collect();
            let discovered = futures::future::join_all(
                wanting
                    .into_iter()
                    .map(|tenant| async move { (self.prepare_servers(&tenant).await, tenant) }),
            )
            .await;
            prepared.extend(discovered.into_iter().map(|(down, tenant)| (tenant, down)));
            // The rows are independent; none waits behind another's tool.
            outcomes.extend(
                futures::future::join_all(rest.into_iter().map(|row| {
                    let down = prepared.get(&row.identity.tenant_id);
                    self.recover_one(row, down)
                }))
                .await,
            );
            for outcome in outcomes {
                if outcome?.status() == Some(ToolOutcomeStatus::Uncertain) {
                    report.uncertain += 1;
                }
            }
        }
        Ok(report)
    }

    /// Registers a tenant's MCP tools for recovery; returns the servers
    /// that did not answer.
    pub(super) async fn prepare_servers(&self, tenant: &str) -> HashSet<String> {
        let Some(servers) = &self.mcp else {
            return HashSet::new();
        };
        let discoveries = servers.discover(tenant, None).await;
        let (_, record) = register_discoveries(&self.registry, tenant, discoveries);
        record
            .events
            .iter()
            .filter_map(|event| match event {
                PlatformEvent::ServerDisconnected { server_id, .. } => Some(server_id.clone()),
                _ => None,
            })
            .collect()
    }

    pub(super) async fn recover_one(
        &self,
        row: Held,
        unreachable: Option<&HashSet<String>>,
    ) -> Result<CallOutcome, StoreError> {
        if settled_without_the_tool(&row) {
            // The table's answer does not depend on the tool or on current
            // authority: it is settled now, without waiting for a server.
            return self.end_held(&row, ReasonCode::ToolOutcomeUnknown).await;
        }
        let pinned = self.registry.pin_exact(
            &row.identity.tenant_id,
            &row.identity.tool_name,
            &row.identity.tool_version,
        );
        let Some(pinned) = pinned else {
            // Nothing can run it again: its server did not answer, or the
            // build or the server no longer has the tool (at this version).
            let server_down = row
                .identity
                .server_id
                .as_ref()
                .is_some_and(|server| unreachable.is_some_and(|down| down.contains(server)));
            let otherwise = if server_down {
                ReasonCode::ToolServerUnreachable
            } else {
                ReasonCode::ToolWithdrawn
            };
            let code = ending_code(&row, otherwise);
            return self.end_held(&row, code).await;
        };
        let request = CallRequest {
            tenant_id: row.identity.tenant_id.clone(),
            session_id: row.identity.session_id,
            run_id: row.identity.run_id,
            step_number: row.identity.step_number,
            call_id: row.identity.call_id.clone(),
            name: row.identity.tool_name.clone(),
            arguments: row.identity.arguments.clone(),
            principal: row.identity.principal.clone(),
            agent: AgentSpec {
                tools: vec![row.identity.tool_name.clone()],
            },
            pinned,
            origin_trust: row.identity.origin_trust,
            argument_trust: row.identity.argument_trust.clone(),
            deadline_at: row.identity.deadline_at,
            parallel_group: row.identity.parallel_group,
            recovering: Some(row.fence),
            caller: CallerTerms::default(),
        };
        Ok(self.call(request).await)
    }
}
