//! What a server's answers become: text, artifacts, the fixed failures a
//! call ends with when it never reached the server, and the specs of what
//! toolgate itself adds to a server (the resource reader, prompts as skills).

use std::collections::HashMap;

use serde_json::{Value, json};

use super::catalog::{MAXIMUM_DESCRIPTION_BYTES, RemoteTool, cut};
use super::client::{RemoteCall, RemotePrompt};
use crate::domain::mcp_server::ServerClassification;
use crate::domain::names::mcp_registry_name;
use crate::domain::{
    ContentPart, IdempotencyClass, OPAQUE_MEDIA_TYPE, ReasonCode, RiskLevel, SideEffectClass,
    SkillMetadata, TargetKind, ToolFailure, ToolFailureKind, ToolKind, ToolResult, ToolSource,
    ToolSpec, TrustLevel, canonicalize, sha256_hex, shown_media_type,
};
use crate::ports::ToolExecutionContext;

/// The synthetic resource tool's remote name.
pub const READ_RESOURCE: &str = "read_resource";

pub(super) fn by_name(tools: Vec<RemoteTool>) -> HashMap<String, RemoteTool> {
    tools
        .into_iter()
        .map(|tool| (tool.name.clone(), tool))
        .collect()
}

pub(super) fn withdrawn() -> ToolResult {
    ToolResult::failed(
        ToolFailure::new(
            ToolFailureKind::NotFound,
            "the pinned declaration was withdrawn",
        )
        .with_reason_code(ReasonCode::ToolWithdrawn)
        .not_applied(),
    )
}

/// Nothing was dispatched: the failure is proven not to have had an effect.
pub(super) fn unreachable(reason_code: ReasonCode) -> ToolResult {
    ToolResult::failed(
        ToolFailure::new(
            ToolFailureKind::Transport,
            "the server could not be reached",
        )
        .with_reason_code(reason_code)
        .not_applied(),
    )
}

/// Decision 26's proof: a structured result of exactly
/// `{"effect_status": "not_applied"}` and nothing else.
pub(super) fn proves_not_applied(structured: Option<&Value>) -> bool {
    structured.and_then(Value::as_object).is_some_and(|object| {
        object.len() == 1 && object.get("effect_status") == Some(&json!("not_applied"))
    })
}

pub(super) async fn render_call(call: RemoteCall, context: &ToolExecutionContext) -> ToolResult {
    if call.is_error {
        let text: Vec<&str> = call
            .content
            .iter()
            .filter_map(|block| block.get("text").and_then(Value::as_str))
            .collect();
        let mut failure = ToolFailure::new(
            ToolFailureKind::UpstreamError,
            "the server reported a failed call",
        );
        if !text.is_empty() {
            failure = failure.with_external_text(text.join("\n"));
        }
        if proves_not_applied(call.structured.as_ref()) {
            failure = failure.not_applied();
        }
        return ToolResult::failed(failure);
    }
    let mut blocks = call.content;
    if blocks.is_empty()
        && let Some(structured) = &call.structured
    {
        blocks.push(json!({"type": "text", "text": structured.to_string()}));
    }
    let mut result = render_blocks(blocks, context).await;
    // The structured result travels as data too (a script reads it as a
    // value); only an object is one, per the protocol.
    if result.failure.is_none()
        && let Some(Value::Object(structured)) = call.structured
    {
        result.structured = Some(structured);
    }
    result
}

/// Text blocks become text; anything else (images, audio, blobs) becomes an
/// artifact of the run, never inline bytes.
///
/// Every block counts toward the call's output: past the hard ceiling (four
/// times `maximum_output_bytes`) the call is output too large and nothing is
/// written.
pub(super) async fn render_blocks(
    blocks: Vec<Value>,
    context: &ToolExecutionContext,
) -> ToolResult {
    let ceiling = context.maximum_output_bytes.saturating_mul(4);
    let total: u64 = blocks
        .iter()
        .map(|block| {
            let size = block
                .get("text")
                .or_else(|| block.pointer("/resource/text"))
                .and_then(Value::as_str)
                .map_or_else(|| block.to_string().len(), str::len);
            u64::try_from(size).unwrap_or(u64::MAX)
        })
        .sum();
    if total > ceiling {
        return ToolResult::failed(ToolFailure::new(
            ToolFailureKind::OutputTooLarge,
            "the server's content crossed the hard output ceiling",
        ));
    }
    let mut content = Vec::with_capacity(blocks.len());
    for block in blocks {
        let text = block
            .get("text")
            .or_else(|| block.pointer("/resource/text"))
            .and_then(Value::as_str);
        match text {
            Some(text) => content.push(ContentPart::Text {
                text: text.to_owned(),
            }),
            None => {
                // An image, audio or blob is stored as its bytes with its
                // media type; any other block as the JSON it came as.
                let (media_type, bytes) = match binary(&block) {
                    Some((media_type, bytes)) => (media_type, bytes),
                    None => ("application/json", block.to_string().into_bytes()),
                };
                match context
                    .artifacts
                    .write(media_type, TrustLevel::ExternalUntrusted, bytes)
                    .await
                {
                    Ok(reference) => content.push(ContentPart::Artifact(reference)),
                    Err(error) => {
                        return ToolResult::failed(ToolFailure::new(
                            ToolFailureKind::Internal,
                            error.to_string(),
                        ));
                    }
                }
            }
        }
    }
    ToolResult::ok(content)
}

/// A binary block's media type and bytes: an image or audio block
/// (`data`, `mimeType`) or a resource's blob (`blob`, `mimeType`), its
/// base64 decoded. `None` when the block carries no base64 payload.
fn binary(block: &Value) -> Option<(&str, Vec<u8>)> {
    let holder = block
        .get("resource")
        .filter(|resource| resource.get("blob").is_some())
        .unwrap_or(block);
    let data = holder
        .get("data")
        .or_else(|| holder.get("blob"))?
        .as_str()?;
    let bytes = base64_decode(data)?;
    let declared = holder.get("mimeType").and_then(Value::as_str);
    Some((served_media_type(declared), bytes))
}

/// The media type an artifact of a server's binary is served with: the
/// server's, when it names an image or audio format a browser shows as
/// such and never runs; anything else (SVG, HTML, a malformed type) as
/// opaque bytes.
fn served_media_type(declared: Option<&str>) -> &str {
    declared
        .and_then(shown_media_type)
        .unwrap_or(OPAQUE_MEDIA_TYPE)
}

/// Standard base64 (RFC 4648 §4, padding optional); `None` when the text
/// is not that.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let unpadded = text
        .strip_suffix("==")
        .or_else(|| text.strip_suffix('='))
        .unwrap_or(text);
    if unpadded.len() % 4 == 1 {
        return None;
    }
    let mut bytes = Vec::with_capacity(unpadded.len() / 4 * 3 + 2);
    let (mut buffer, mut bits) = (0u32, 0u32);
    for symbol in unpadded.bytes() {
        let value = match symbol {
            b'A'..=b'Z' => symbol - b'A',
            b'a'..=b'z' => symbol - b'a' + 26,
            b'0'..=b'9' => symbol - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        buffer = (buffer << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            bytes.push((buffer >> bits) as u8);
            buffer &= (1 << bits) - 1;
        }
    }
    Some(bytes)
}

pub(super) fn read_resource_spec(
    server_id: &str,
    catalog_hash: &str,
    classification: &ServerClassification,
) -> ToolSpec {
    ToolSpec {
        name: mcp_registry_name(server_id, READ_RESOURCE),
        version: catalog_hash.to_owned(),
        description:
            "Reads one of this server's advertised resources by URI; an empty URI lists them."
                .to_owned(),
        input_schema: json!({
            "type": "object",
            "properties": {"uri": {"type": "string"}},
            "required": ["uri"],
            "additionalProperties": false
        }),
        output_schema: None,
        side_effect: SideEffectClass::ExternalRead,
        risk: RiskLevel::Low,
        idempotency: IdempotencyClass::ReadOnly,
        required_scopes: classification.required_scopes.clone(),
        timeout_seconds: classification.timeout_seconds,
        maximum_output_bytes: classification.maximum_output_bytes,
        allow_parallel: false,
        kind: ToolKind::Capability,
        target_kind: TargetKind::McpServer,
        output_trust: TrustLevel::ExternalUntrusted,
        source: ToolSource::Mcp,
        server_id: Some(server_id.to_owned()),
        device_id: None,
        deprecated: false,
        model_visible: true,
    }
}

pub(super) fn skill_metadata(server_id: &str, prompt: &RemotePrompt) -> SkillMetadata {
    let declaration = json!({
        "name": prompt.name,
        "description": prompt.description,
        "arguments": prompt.arguments.iter().map(|argument| json!({
            "name": argument.name, "description": argument.description,
            "required": argument.required})).collect::<Vec<_>>(),
        "required_tools": prompt.required_tools,
    });
    let version = match canonicalize(declaration.clone()) {
        Ok(canonical) => canonical.sha256,
        Err(_) => sha256_hex(declaration.to_string().as_bytes()),
    };
    SkillMetadata {
        name: mcp_registry_name(server_id, &prompt.name),
        version,
        description: cut(
            prompt.description.as_deref().unwrap_or_default(),
            MAXIMUM_DESCRIPTION_BYTES,
        )
        .to_owned(),
        // A prompt names its own server's tools, by the server's names.
        required_tools: prompt
            .required_tools
            .iter()
            .map(|remote_name| mcp_registry_name(server_id, remote_name))
            .collect(),
        source: ToolSource::Mcp,
        server_id: Some(server_id.to_owned()),
        trust: TrustLevel::ExternalUntrusted,
        read_only: true,
    }
}

/// Ladder step 5: the server refused our credential and the session keeps
/// it refused. `never_sent` when this call was answered without dialling.
pub(super) fn unauthorized(never_sent: bool) -> ToolResult {
    let failure = ToolFailure::new(
        ToolFailureKind::Transport,
        "the server refused our credential",
    )
    .with_reason_code(ReasonCode::ToolServerUnauthorized);
    ToolResult::failed(if never_sent {
        failure.not_applied()
    } else {
        failure
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_reads_as_rfc_4648_says() {
        for (text, bytes) in [
            ("", &b""[..]),
            ("Zg==", b"f"),
            ("Zm8=", b"fo"),
            ("Zm9v", b"foo"),
            ("Zm9vYg", b"foob"),
            ("Zm9vYmFy", b"foobar"),
            ("+/8=", &[0xfb, 0xff]),
        ] {
            assert_eq!(base64_decode(text).as_deref(), Some(bytes), "{text}");
        }
        for refused in ["Z", "Zm9v!", "Zm 9v", "Zm9vY"] {
            assert_eq!(base64_decode(refused), None, "{refused}");
        }
    }

    #[test]
    fn binary_blocks_are_their_bytes_with_a_media_type_that_cannot_run() {
        let image = json!({"type": "image", "data": "iVBORw==", "mimeType": "image/png"});
        assert_eq!(
            binary(&image),
            Some(("image/png", vec![0x89, 0x50, 0x4e, 0x47]))
        );
        let blob = json!({"type": "resource",
                          "resource": {"uri": "file:///a", "blob": "AAE=", "mimeType": "audio/wav"}});
        assert_eq!(binary(&blob), Some(("audio/wav", vec![0, 1])));
        for hostile in [
            "text/html",
            "image/svg+xml",
            "image/png; charset=x",
            "IMAGE/PNG",
        ] {
            let block = json!({"type": "image", "data": "AA==", "mimeType": hostile});
            assert_eq!(
                binary(&block).map(|(media, _)| media),
                Some("application/octet-stream"),
                "{hostile}"
            );
        }
        assert_eq!(binary(&json!({"type": "resource_link", "uri": "x"})), None);
        assert_eq!(
            binary(&json!({"type": "image", "data": "not base64!"})),
            None
        );
    }
}
