//! `demo.*`: one tool per idempotency class, for tests and the quickstart.
//! Their effects are lines in files under one folder, so a test can count
//! from outside the process what happened.
//!
//! | tool | class | effect |
//! |---|---|---|
//! | `demo.echo` | read only | none |
//! | `demo.wait` | read only | none; answers after the milliseconds it is given |
//! | `demo.set_value` | idempotent | overwrites `values/{key}` |
//! | `demo.keyed_write` | conditionally idempotent | appends to `keyed.log` unless the idempotency key is already there |
//! | `demo.external_write` | non-idempotent | appends to `external.log` |

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};

use crate::domain::{
    IdempotencyClass, RiskLevel, SideEffectClass, TargetKind, ToolFailure, ToolFailureKind,
    ToolKind, ToolResult, ToolSource, ToolSpec, TrustLevel,
};
use crate::ports::{BoxFuture, Tool, ToolExecutionContext};

/// The demo tools, writing under `directory`.
pub fn tools(directory: &Path) -> Vec<Arc<dyn Tool>> {
    let directory = directory.to_path_buf();
    vec![
        Arc::new(Demo {
            spec: echo_spec(),
            directory: directory.clone(),
            action: Action::Echo,
        }),
        Arc::new(Wait(wait_spec())),
        Arc::new(Demo {
            spec: set_value_spec(),
            directory: directory.clone(),
            action: Action::SetValue,
        }),
        Arc::new(Demo {
            spec: keyed_write_spec(),
            directory: directory.clone(),
            action: Action::KeyedWrite,
        }),
        Arc::new(Demo {
            spec: external_write_spec(),
            directory,
            action: Action::ExternalWrite,
        }),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Echo,
    SetValue,
    KeyedWrite,
    ExternalWrite,
}

struct Demo {
    spec: ToolSpec,
    directory: PathBuf,
    action: Action,
}

fn spec(
    name: &str,
    description: &str,
    input_schema: Value,
    side_effect: SideEffectClass,
    risk: RiskLevel,
    idempotency: IdempotencyClass,
    output_trust: TrustLevel,
) -> ToolSpec {
    ToolSpec {
        name: name.to_owned(),
        version: "1".to_owned(),
        description: description.to_owned(),
        input_schema,
        output_schema: None,
        side_effect,
        risk,
        idempotency,
        required_scopes: ["demo.use".to_owned()].into(),
        timeout_seconds: 10,
        maximum_output_bytes: 64 * 1024,
        allow_parallel: side_effect.is_read_only(),
        kind: ToolKind::Capability,
        target_kind: TargetKind::InProcess,
        output_trust,
        source: ToolSource::Builtin,
        server_id: None,
        device_id: None,
        deprecated: false,
        model_visible: true,
    }
}

fn echo_spec() -> ToolSpec {
    // The text is the model's own, so it comes back untrusted.
    spec(
        "demo.echo",
        "Returns the text it is given.",
        json!({"type": "object", "required": ["text"], "properties": {"text": {"type": "string", "maxLength": 65536}}}),
        SideEffectClass::None,
        RiskLevel::Low,
        IdempotencyClass::ReadOnly,
        TrustLevel::ExternalUntrusted,
    )
}

/// The longest `demo.wait` waits: half its timeout.
const MAXIMUM_WAIT_MILLISECONDS: u64 = 5_000;

fn wait_spec() -> ToolSpec {
    // A slow read, so a batch's parallelism can be seen from outside.
    spec(
        "demo.wait",
        "Answers after the given number of milliseconds.",
        json!({"type": "object", "required": ["milliseconds"],
               "properties": {"milliseconds": {"type": "integer", "minimum": 0,
                                               "maximum": MAXIMUM_WAIT_MILLISECONDS}},
               "additionalProperties": false}),
        SideEffectClass::None,
        RiskLevel::Low,
        IdempotencyClass::ReadOnly,
        TrustLevel::Platform,
    )
}

fn set_value_spec() -> ToolSpec {
    spec(
        "demo.set_value",
        "Sets a named value; setting it again to the same value changes nothing.",
        json!({"type": "object", "required": ["key", "value"], "properties": {
            "key": {"type": "string", "pattern": "^[a-z0-9_]{1,64}$"},
            "value": {"type": "string", "maxLength": 4096}
        }}),
        SideEffectClass::ExternalWrite,
        RiskLevel::Low,
        IdempotencyClass::Idempotent,
        TrustLevel::InternalTool,
    )
}

fn keyed_write_spec() -> ToolSpec {
    spec(
        "demo.keyed_write",
        "Appends a line to a remote log that deduplicates on the idempotency key.",
        json!({"type": "object", "required": ["line"], "properties": {"line": {"type": "string", "maxLength": 4096}}}),
        SideEffectClass::ExternalWrite,
        RiskLevel::Medium,
        IdempotencyClass::ConditionallyIdempotent,
        TrustLevel::InternalTool,
    )
}

fn external_write_spec() -> ToolSpec {
    spec(
        "demo.external_write",
        "Appends a line to a remote log. Every call is another line.",
        json!({"type": "object", "required": ["line"], "properties": {"line": {"type": "string", "maxLength": 4096}}}),
        SideEffectClass::ExternalWrite,
        RiskLevel::Medium,
        IdempotencyClass::NonIdempotent,
        TrustLevel::InternalTool,
    )
}

fn text_argument<'a>(arguments: &'a Value, name: &str) -> &'a str {
    // Validated against the schema before execution; absent cannot happen.
    arguments
        .get(name)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn append(path: &Path, line: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    // One line per effect, whatever the model put in it.
    writeln!(file, "{}", line.replace(['\n', '\r'], " "))?;
    file.sync_all()
}

fn run(action: Action, directory: &Path, arguments: &Value, key: &str) -> std::io::Result<String> {
    match action {
        Action::Echo => Ok(text_argument(arguments, "text").to_owned()),
        Action::SetValue => {
            let path = directory
                .join("values")
                .join(text_argument(arguments, "key"));
            std::fs::create_dir_all(directory.join("values"))?;
            std::fs::write(&path, text_argument(arguments, "value"))?;
            Ok("set".to_owned())
        }
        Action::KeyedWrite => {
            let path = directory.join("keyed.log");
            let seen = std::fs::read_to_string(&path).unwrap_or_default();
            if seen.lines().any(|line| line.starts_with(key)) {
                return Ok("already written".to_owned());
            }
            append(
                &path,
                &format!("{key} {}", text_argument(arguments, "line")),
            )?;
            Ok("written".to_owned())
        }
        Action::ExternalWrite => {
            append(
                &directory.join("external.log"),
                text_argument(arguments, "line"),
            )?;
            Ok("written".to_owned())
        }
    }
}

impl Tool for Demo {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn execute<'a>(
        &'a self,
        arguments: Value,
        context: ToolExecutionContext,
    ) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            // The effect boundary: the executor has set the watermark already
            // for any side effect; marking again is a no-op and keeps the rule
            // local to the tool that has the effect.
            if self.spec.needs_effect_watermark()
                && let Err(error) = context.mark_effect_sent.mark_effect_sent().await
            {
                return ToolResult::failed(ToolFailure::new(
                    ToolFailureKind::Internal,
                    error.to_string(),
                ));
            }
            let (action, directory, key) = (
                self.action,
                self.directory.clone(),
                context.idempotency_key.clone(),
            );
            // Echo touches no file: it answers at once rather than paying a
            // hand-off to the blocking pool and back.
            let ran = if action == Action::Echo {
                Ok(run(action, &directory, &arguments, &key))
            } else {
                tokio::task::spawn_blocking(move || run(action, &directory, &arguments, &key)).await
            };
            match ran {
                Ok(Ok(text)) => ToolResult::text(text),
                Ok(Err(error)) => ToolResult::failed(ToolFailure::new(
                    ToolFailureKind::Internal,
                    format!("demo write failed: {}", error.kind()),
                )),
                Err(_) => ToolResult::failed(ToolFailure::new(
                    ToolFailureKind::Internal,
                    "demo task was interrupted",
                )),
            }
        })
    }
}

/// `demo.wait`: touches nothing, answers late (or when cancelled).
struct Wait(ToolSpec);

impl Tool for Wait {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    fn execute<'a>(
        &'a self,
        arguments: Value,
        context: ToolExecutionContext,
    ) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            let milliseconds = arguments
                .get("milliseconds")
                .and_then(Value::as_u64)
                .unwrap_or_default()
                .min(MAXIMUM_WAIT_MILLISECONDS);
            tokio::select! {
                () = tokio::time::sleep(std::time::Duration::from_millis(milliseconds)) => {
                    ToolResult::text(format!("waited {milliseconds} ms"))
                }
                () = context.cancellation.cancelled() => ToolResult::failed(ToolFailure::new(
                    ToolFailureKind::Timeout,
                    "the wait was cancelled",
                )),
            }
        })
    }
}
