//! The five control tools. `tool.call` is the wrapper the pipeline unwraps
//! (it never executes); `conversation.ask_user` and `delegate.run` suspend
//! the call until their answer arrives; `context.update_working_state` and
//! `skill.load` complete at once. They run the full pipeline like any tool;
//! their effect is on the run, and the invocation row is their record.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::domain::names::{AUTHORED_SKILL_PREFIX, SKILL_LOAD, UPDATE_WORKING_STATE};
use crate::domain::{
    ContentPart, IdempotencyClass, ReasonCode, RiskLevel, SideEffectClass, SkillMetadata,
    TargetKind, ToolFailure, ToolFailureKind, ToolKind, ToolResult, ToolSource, ToolSpec,
    TrustLevel,
};
use crate::ports::{
    BoxFuture, Clock, EventStore, LoadedSkill, McpServers, PlatformEvent, SkillStore, Tool,
    ToolExecutionContext,
};

fn spec(name: &str, description: &str, input_schema: Value, output_trust: TrustLevel) -> ToolSpec {
    ToolSpec {
        name: name.to_owned(),
        version: "1".to_owned(),
        description: description.to_owned(),
        input_schema,
        output_schema: None,
        side_effect: SideEffectClass::None,
        risk: RiskLevel::Low,
        idempotency: IdempotencyClass::ReadOnly,
        required_scopes: Default::default(),
        timeout_seconds: 30,
        maximum_output_bytes: 256 * 1024,
        allow_parallel: false,
        kind: ToolKind::Control,
        target_kind: TargetKind::InProcess,
        output_trust,
        source: ToolSource::Builtin,
        server_id: None,
        device_id: None,
        deprecated: false,
        model_visible: true,
    }
}

/// `tool.call`: reaches a deferred tool of the pinned set. The pipeline
/// unwraps it before step 1, so `execute` is never reached.
struct ToolCall(ToolSpec);

impl Tool for ToolCall {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    fn execute<'a>(&'a self, _: Value, _: ToolExecutionContext) -> BoxFuture<'a, ToolResult> {
        Box::pin(async {
            ToolResult::failed(
                ToolFailure::new(ToolFailureKind::Internal, "tool.call reached execution")
                    .not_applied(),
            )
        })
    }
}

/// `conversation.ask_user` and `delegate.run`: the pipeline suspends them
/// at step 10 (the row waits, RUNNING with its marker, for the reply or the
/// child's result), so `execute` is never reached.
struct Suspending(ToolSpec);

impl Tool for Suspending {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    fn execute<'a>(&'a self, _: Value, _: ToolExecutionContext) -> BoxFuture<'a, ToolResult> {
        Box::pin(async {
            ToolResult::failed(
                ToolFailure::new(
                    ToolFailureKind::Internal,
                    "a suspending tool reached execution",
                )
                .not_applied(),
            )
        })
    }
}

/// The largest working state, measured on its JSON serialization.
pub const WORKING_STATE_MAXIMUM_BYTES: usize = 64 * 1024;

/// `context.update_working_state`: replaces the run's working state. The
/// state is the call's recorded arguments, committed with its row; the run's
/// latest succeeded update is what `GET /v1/runs/{id}/working_state`
/// returns. A state past [`WORKING_STATE_MAXIMUM_BYTES`] is refused and the
/// previous one stays.
struct UpdateWorkingState(ToolSpec);

impl Tool for UpdateWorkingState {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    fn execute<'a>(
        &'a self,
        arguments: Value,
        _: ToolExecutionContext,
    ) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            let bytes = arguments
                .get("state")
                .map(|state| state.to_string().len())
                .unwrap_or_default();
            if bytes > WORKING_STATE_MAXIMUM_BYTES {
                return ToolResult::failed(
                    ToolFailure::new(
                        ToolFailureKind::InvalidArguments,
                        format!(
                            "the working state is {bytes} bytes; at most {WORKING_STATE_MAXIMUM_BYTES}"
                        ),
                    )
                    .not_applied(),
                );
            }
            ToolResult::text(format!("working state recorded ({bytes} bytes)"))
        })
    }
}

/// `skill.load`: a skill its session was shown, labelled with the trust its
/// source carries (an MCP prompt is EXTERNAL_UNTRUSTED). A skill naming tools
/// the session did not pin loads anyway: the model is told which, and a
/// `skill.tool.missing` event is recorded.
struct SkillLoad {
    spec: ToolSpec,
    skills: Arc<dyn McpServers>,
    authored: Arc<dyn SkillStore>,
    events: Arc<dyn EventStore>,
    clock: Arc<dyn Clock>,
}

impl SkillLoad {
    /// A skill the tenant's agents wrote: its text now, labelled
    /// EXTERNAL_UNTRUSTED (an agent wrote it), with its version.
    async fn load_authored(
        &self,
        tenant_id: &str,
        name: &str,
    ) -> Result<(String, String), ToolFailure> {
        let short = name.strip_prefix(AUTHORED_SKILL_PREFIX).unwrap_or(name);
        let skills = self.authored.skills(tenant_id).await.map_err(|_| {
            ToolFailure::new(ToolFailureKind::Transport, "the skill could not be read")
        })?;
        skills
            .into_iter()
            .find(|skill| skill.name == short)
            .map(|skill| (skill.body, skill.version))
            .ok_or_else(|| {
                ToolFailure::new(ToolFailureKind::NotFound, "the skill was deleted")
                    .with_reason_code(ReasonCode::ToolWithdrawn)
                    .not_applied()
            })
    }
}

impl Tool for SkillLoad {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn execute<'a>(
        &'a self,
        arguments: Value,
        context: ToolExecutionContext,
    ) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            let name = arguments
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let Some(advertised) = context
                .skills
                .iter()
                .find(|skill| skill.metadata.name == name)
            else {
                return ToolResult::failed(
                    ToolFailure::new(
                        ToolFailureKind::NotFound,
                        "this session was not shown a skill by that name",
                    )
                    .not_applied(),
                );
            };
            let parameters: Map<String, Value> = arguments
                .get("arguments")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let loaded = if advertised.metadata.name.starts_with(AUTHORED_SKILL_PREFIX) {
                match self.load_authored(&context.tenant_id, name).await {
                    Ok((text, version)) => LoadedSkill {
                        metadata: SkillMetadata {
                            version,
                            ..advertised.metadata.clone()
                        },
                        text,
                    },
                    Err(failure) => return ToolResult::failed(failure),
                }
            } else {
                match self
                    .skills
                    .load_skill(&context.tenant_id, name, parameters)
                    .await
                {
                    Ok(loaded) => loaded,
                    Err(failure) => return ToolResult::failed(failure),
                }
            };
            // The skill changed since the session was shown it.
            if loaded.metadata.version != advertised.metadata.version {
                return ToolResult::failed(
                    ToolFailure::new(
                        ToolFailureKind::NotFound,
                        "the skill changed since this session was shown it",
                    )
                    .with_reason_code(ReasonCode::ToolWithdrawn)
                    .not_applied(),
                );
            }
            let mut content = vec![ContentPart::Text { text: loaded.text }];
            if !advertised.missing_tools.is_empty() {
                content.push(ContentPart::Text {
                    text: format!(
                        "skill.tool.missing: this session does not offer {}",
                        advertised.missing_tools.join(", ")
                    ),
                });
                let event = PlatformEvent::SkillToolMissing {
                    session_id: context.session_id,
                    skill: advertised.metadata.name.clone(),
                    missing_tools: advertised.missing_tools.clone(),
                };
                if let Err(error) = self
                    .events
                    .record_event(Some(&context.tenant_id), &event, self.clock.now())
                    .await
                {
                    tracing::warn!(error = %error, "a skill.tool.missing note was not recorded");
                }
            }
            let mut result = ToolResult::ok(content);
            result.output_trust = Some(loaded.metadata.trust);
            result
        })
    }
}

/// The control tools; `skills` serves `skill.load`, which records its notes
/// in `events`. Their nested `arguments` and `state` objects are the
/// caller's own, so those stay open where every other object schema is
/// closed.
pub fn tools(
    skills: Arc<dyn McpServers>,
    authored: Arc<dyn SkillStore>,
    events: Arc<dyn EventStore>,
    clock: Arc<dyn Clock>,
) -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(ToolCall(spec(
            "tool.call",
            "Calls a deferred tool of this session by name.",
            json!({"type": "object", "required": ["name", "arguments"],
                   "properties": {"name": {"type": "string", "maxLength": 256},
                                  "arguments": {"type": "object", "additionalProperties": true}},
                   "additionalProperties": false}),
            TrustLevel::ExternalUntrusted,
        ))),
        Arc::new(Suspending(spec(
            "conversation.ask_user",
            "Asks the user a question; the run waits for the reply.",
            json!({"type": "object", "required": ["question"],
                   "properties": {"question": {"type": "string", "maxLength": 4096}},
                   "additionalProperties": false}),
            TrustLevel::User,
        ))),
        Arc::new(Suspending(spec(
            "delegate.run",
            "Runs a child agent on a brief; the run waits for its result.",
            json!({"type": "object", "required": ["brief"],
                   "properties": {"brief": {"type": "string", "maxLength": 16384}},
                   "additionalProperties": false}),
            TrustLevel::ExternalUntrusted,
        ))),
        Arc::new(UpdateWorkingState(spec(
            UPDATE_WORKING_STATE,
            "Replaces the run's working state.",
            json!({"type": "object", "required": ["state"],
                   "properties": {"state": {"type": "object", "additionalProperties": true}},
                   "additionalProperties": false}),
            TrustLevel::Platform,
        ))),
        Arc::new(SkillLoad {
            spec: spec(
                SKILL_LOAD,
                "Loads a skill this session advertises into the turn.",
                json!({"type": "object", "required": ["name"],
                       "properties": {"name": {"type": "string", "maxLength": 256},
                                      "arguments": {"type": "object", "additionalProperties": true}},
                       "additionalProperties": false}),
                TrustLevel::ExternalUntrusted,
            ),
            skills,
            authored,
            events,
            clock,
        }),
    ]
}
