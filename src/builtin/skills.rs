//! `skill.manage`: the capability tool through which an agent writes its
//! tenant's skills (create, update, delete, list). It writes durable
//! tenant state that outlives the run, so it is a capability, not a control
//! tool: risk high, conditionally idempotent (a write carries the call's
//! idempotency key, and the same call again changes nothing), scope
//! `skill.write`, and a shipped policy rule denies it in a turn that saw
//! untrusted content. What it writes loads through `skill.load` as
//! EXTERNAL_UNTRUSTED: an agent wrote it.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::domain::names::{AUTHORED_SKILL_PREFIX, SKILL_MANAGE};
use crate::domain::{
    ContentPart, IdempotencyClass, RiskLevel, SideEffectClass, TargetKind, ToolFailure,
    ToolFailureKind, ToolKind, ToolResult, ToolSource, ToolSpec, TrustLevel, sha256_hex,
};
use crate::ports::{
    AuthoredSkill, BoxFuture, Clock, SkillStore, SkillWrite, SkillWritten, Tool,
    ToolExecutionContext,
};

/// The scope `skill.manage` requires.
pub const SKILL_WRITE_SCOPE: &str = "skill.write";

struct SkillManage {
    spec: ToolSpec,
    skills: Arc<dyn SkillStore>,
    clock: Arc<dyn Clock>,
}

/// `skill.manage`, writing to `skills`.
pub fn tool(skills: Arc<dyn SkillStore>, clock: Arc<dyn Clock>) -> Arc<dyn Tool> {
    Arc::new(SkillManage {
        spec: ToolSpec {
            name: SKILL_MANAGE.to_owned(),
            version: "1".to_owned(),
            description: "Creates, updates, deletes or lists this tenant's skills: short named \
                          texts that say how to do a task, loaded later with skill.load."
                .to_owned(),
            input_schema: json!({
                "type": "object",
                "required": ["action"],
                "properties": {
                    "action": {"type": "string", "enum": ["create", "update", "delete", "list"]},
                    "name": {"type": "string", "pattern": "^[a-z0-9_]{1,64}$"},
                    "description": {"type": "string", "minLength": 1, "maxLength": 1024},
                    "body": {"type": "string", "minLength": 1, "maxLength": 65536},
                    "required_tools": {"type": "array", "maxItems": 32,
                                       "items": {"type": "string", "maxLength": 256}}
                },
                "additionalProperties": false
            }),
            output_schema: None,
            // The tenant's own state, kept by toolgate: no third party.
            side_effect: SideEffectClass::WorkspaceWrite,
            risk: RiskLevel::High,
            idempotency: IdempotencyClass::ConditionallyIdempotent,
            required_scopes: [SKILL_WRITE_SCOPE.to_owned()].into(),
            timeout_seconds: 10,
            maximum_output_bytes: 256 * 1024,
            allow_parallel: false,
            kind: ToolKind::Capability,
            target_kind: TargetKind::InProcess,
            output_trust: TrustLevel::InternalTool,
            source: ToolSource::Builtin,
            server_id: None,
            device_id: None,
            deprecated: false,
            model_visible: true,
        },
        skills,
        clock,
    })
}

/// A failure that wrote nothing.
fn refused(kind: ToolFailureKind, detail: &str) -> ToolResult {
    ToolResult::failed(ToolFailure::new(kind, detail).not_applied())
}

/// A skill's version: a digest of what a session is shown and loads.
pub fn skill_version(description: &str, body: &str, required_tools: &[String]) -> String {
    sha256_hex(
        json!({"description": description, "body": body, "required_tools": required_tools})
            .to_string()
            .as_bytes(),
    )
}

impl Tool for SkillManage {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn execute<'a>(
        &'a self,
        arguments: Value,
        context: ToolExecutionContext,
    ) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            let text = |field: &str| arguments.get(field).and_then(Value::as_str);
            let action = text("action").unwrap_or_default();
            if action == "list" {
                return match self.skills.skills(&context.tenant_id).await {
                    Ok(skills) => {
                        let listed: Vec<Value> = skills
                            .iter()
                            .map(|skill| {
                                json!({"name": format!("{AUTHORED_SKILL_PREFIX}{}", skill.name),
                                       "description": skill.description,
                                       "version": skill.version})
                            })
                            .collect();
                        let mut result = ToolResult::ok(vec![ContentPart::Text {
                            text: json!({"skills": listed}).to_string(),
                        }]);
                        result.structured = json!({"skills": listed}).as_object().cloned();
                        result
                    }
                    Err(_) => refused(ToolFailureKind::Transport, "the skills could not be read"),
                };
            }
            let Some(name) = text("name") else {
                return refused(ToolFailureKind::InvalidArguments, "name is required");
            };
            if action == "delete" {
                // Deleting twice leaves what deleting once does.
                // Only its author deletes a skill.
                return match self
                    .skills
                    .delete_skill(&context.tenant_id, name, &context.principal.id)
                    .await
                {
                    Ok(true) => ToolResult::text(format!("skill {name} deleted")),
                    Ok(false) => ToolResult::text(format!(
                        "no skill {name} of yours exists (another principal's is theirs to delete)"
                    )),
                    Err(_) => ToolResult::failed(ToolFailure::new(
                        ToolFailureKind::Transport,
                        "the skill could not be deleted",
                    )),
                };
            }
            let (Some(description), Some(body)) = (text("description"), text("body")) else {
                return refused(
                    ToolFailureKind::InvalidArguments,
                    "create and update need description and body",
                );
            };
            let required_tools: Vec<String> = arguments
                .get("required_tools")
                .and_then(Value::as_array)
                .map(|tools| {
                    tools
                        .iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            let now = self.clock.now();
            let skill = AuthoredSkill {
                name: name.to_owned(),
                description: description.to_owned(),
                body: body.to_owned(),
                version: skill_version(description, body, &required_tools),
                required_tools,
                author: context.principal.id.clone(),
                written_by_key: context.idempotency_key.clone(),
                created_at: now,
                updated_at: now,
            };
            let mode = if action == "create" {
                SkillWrite::Create
            } else {
                SkillWrite::Update
            };
            match self
                .skills
                .put_skill(&context.tenant_id, &skill, mode)
                .await
            {
                Ok(SkillWritten::Written | SkillWritten::Repeated) => ToolResult::text(format!(
                    "skill {AUTHORED_SKILL_PREFIX}{name} written (version {})",
                    &skill.version[..12]
                )),
                Ok(SkillWritten::Exists) => refused(
                    ToolFailureKind::InvalidArguments,
                    "a skill of that name exists; update it instead",
                ),
                Ok(SkillWritten::OtherAuthor) => refused(
                    ToolFailureKind::Permission,
                    "that skill is another principal's; only its author changes it",
                ),
                Ok(SkillWritten::Missing) => refused(
                    ToolFailureKind::NotFound,
                    "no skill of that name exists; create it instead",
                ),
                // The write may or may not have committed; the same call
                // again (its key) is safe either way.
                Err(_) => ToolResult::failed(ToolFailure::new(
                    ToolFailureKind::Transport,
                    "the skill could not be written",
                )),
            }
        })
    }
}
