//! What a front-door client reads of what its calls kept: a result names
//! each artifact by a `resource_link` (`toolgate://runs/{run}/artifacts/{id}`),
//! an image or audio block comes inline while the call's output limit holds
//! it, and `resources/read` streams an artifact to the principal whose run
//! made it, to no one else.

use http_body_util::BodyExt as _;
use hyper::StatusCode;
use hyper::body::{Bytes, Frame};
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt as _;
use uuid::Uuid;

use super::{Caller, Front, rpc_error};
use crate::domain::{OPAQUE_MEDIA_TYPE, TrustLevel, base64, shown_media_type};
use crate::edge::Reply;
use crate::pipeline::artifacts::OpenArtifact;

/// Where every artifact link starts.
const RUNS: &str = "toolgate://runs/";

/// JSON-RPC's code for a resource that is not there (or not the caller's),
/// as the MCP specification gives it.
const RESOURCE_NOT_FOUND: i64 = -32002;

/// How much of an artifact a read sends per frame; a multiple of three, so
/// each frame's base64 stands alone.
const CHUNK: usize = 48 << 10;

/// The link of a run's artifact.
pub fn artifact_uri(run_id: Uuid, artifact_id: &str) -> String {
    format!("{RUNS}{run_id}/artifacts/{artifact_id}")
}

/// The run and artifact a link names; `None` for anything else.
pub fn artifact_address(uri: &str) -> Option<(Uuid, Uuid)> {
    let (run, artifact) = uri.strip_prefix(RUNS)?.split_once("/artifacts/")?;
    // Only the form toolgate writes: hyphenated, lower-case.
    let canonical = |text: &str| {
        text.parse::<Uuid>()
            .ok()
            .filter(|id| id.hyphenated().to_string() == text)
    };
    Some((canonical(run)?, canonical(artifact)?))
}

/// The media type a client is told: an image, audio, plain text or JSON
/// type as stored; anything else, and anything a browser could run, as
/// opaque bytes.
pub fn served_media_type(media_type: &str) -> &str {
    match media_type {
        // What toolgate itself keeps (the whole of a text result), and
        // a server's blocks kept as the JSON they came as.
        "text/plain; charset=utf-8" | "text/plain" | "application/json" => media_type,
        _ => shown_media_type(media_type).unwrap_or(OPAQUE_MEDIA_TYPE),
    }
}

/// A result's link to one artifact of `run_id`.
pub fn link(
    run_id: Uuid,
    artifact_id: &str,
    media_type: &str,
    bytes: u64,
    trust: TrustLevel,
) -> Value {
    json!({
        "type": "resource_link",
        "uri": artifact_uri(run_id, artifact_id),
        "name": format!("artifact-{artifact_id}"),
        "title": format!("Artifact {artifact_id} ({bytes} bytes)"),
        "mimeType": served_media_type(media_type),
        "size": bytes,
        "_meta": {"toolgate/trust": trust},
    })
}

/// The inline block a linked artifact of this media type may become.
fn inline_kind(media_type: &str) -> Option<&'static str> {
    if media_type.starts_with("image/") {
        Some("image")
    } else if media_type.starts_with("audio/") {
        Some("audio")
    } else {
        None
    }
}

impl Front {
    /// Puts the images and audio a result links to inline, in order, each
    /// that fits what those before it left of `budget` (the call's output
    /// limit); the rest stay links. An artifact that cannot be read stays
    /// a link.
    pub(super) async fn inline_artifacts(&self, result: &mut Value, tenant_id: &str, budget: u64) {
        let Some(blocks) = result.get_mut("content").and_then(Value::as_array_mut) else {
            return;
        };
        let mut left = budget;
        for block in blocks.iter_mut() {
            if block.get("type").and_then(Value::as_str) != Some("resource_link") {
                continue;
            }
            let media_type = block
                .get("mimeType")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let Some(kind) = inline_kind(media_type) else {
                continue;
            };
            let size = block
                .get("size")
                .and_then(Value::as_u64)
                .unwrap_or(u64::MAX);
            let Some((run_id, artifact_id)) = block
                .get("uri")
                .and_then(Value::as_str)
                .and_then(artifact_address)
            else {
                continue;
            };
            if size > left {
                continue;
            }
            let Ok(Some(open)) = self
                .parts
                .artifacts
                .open_in_run(tenant_id, run_id, artifact_id)
                .await
            else {
                continue;
            };
            let mut bytes = Vec::new();
            let mut reader = open.reader.take(size.saturating_add(1));
            if reader.read_to_end(&mut bytes).await.is_err() || bytes.len() as u64 != size {
                continue;
            }
            left -= size;
            *block = json!({
                "type": kind,
                "data": base64(&bytes),
                "mimeType": media_type,
                "_meta": {
                    "toolgate/trust": block.pointer("/_meta/toolgate~1trust").cloned().unwrap_or(Value::Null),
                    "toolgate/artifact": block.get("uri").cloned().unwrap_or(Value::Null),
                },
            });
        }
    }

    /// `resources/read` of an artifact link: the bytes, base64, streamed
    /// as they are read, when the link's run is the caller's principal's
    /// and holds the artifact. Anything else is one answer: not found.
    pub(super) async fn read_resource(
        &self,
        caller: &Caller,
        id: Value,
        params: Option<&Value>,
        stateless: bool,
    ) -> Reply {
        let Some(uri) = params
            .and_then(|params| params.get("uri"))
            .and_then(Value::as_str)
        else {
            return rpc_error(
                StatusCode::OK,
                id,
                -32602,
                "Invalid params: resources/read names a uri",
            );
        };
        let not_found = |id| {
            rpc_error(
                StatusCode::OK,
                id,
                RESOURCE_NOT_FOUND,
                "Resource not found: no artifact of yours has this uri",
            )
        };
        let Some((run_id, artifact_id)) = artifact_address(uri) else {
            return not_found(id);
        };
        let open = self
            .parts
            .artifacts
            .open_for_principal(&caller.tenant_id, &caller.principal.id, run_id, artifact_id)
            .await;
        match open {
            Ok(Some(open)) => streamed(id, uri, open, stateless),
            Ok(None) => not_found(id),
            Err(error) => {
                tracing::warn!(error = %error, "an artifact could not be read for the front door");
                rpc_error(
                    StatusCode::OK,
                    id,
                    -32603,
                    "the artifact could not be read; retry",
                )
            }
        }
    }
}

/// A `ReadResourceResult` whose one blob is the artifact's bytes, encoded
/// as they are read. Its length is stated, so a read that fails midway is
/// a body cut short, never a result that parses.
fn streamed(id: Value, uri: &str, open: OpenArtifact, stateless: bool) -> Reply {
    let OpenArtifact { artifact, reader } = open;
    // The blob's place in the answer, by a marker no request can forge.
    let marker = format!("blob-{}", Uuid::new_v4().simple());
    let mut result = json!({
        "contents": [{
            "uri": uri,
            "mimeType": served_media_type(&artifact.media_type),
            "blob": marker,
            "_meta": {"toolgate/trust": artifact.trust},
        }],
    });
    // Without sessions a result says it is complete; rmcp takes that off
    // for the others, and this answer does not pass through rmcp.
    if stateless {
        super::render::completed(&mut result, true);
    }
    let answer = json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string();
    let Some((head, tail)) = answer.split_once(&format!("\"{marker}\"")) else {
        return rpc_error(
            StatusCode::OK,
            Value::Null,
            -32603,
            "the artifact could not be read",
        );
    };
    let (head, tail) = (format!("{head}\""), format!("\"{tail}"));
    let size = u64::try_from(artifact.bytes).unwrap_or(0);
    let length = head.len() as u64 + size.div_ceil(3) * 4 + tail.len() as u64;
    let body = futures::stream::unfold(
        Stream::Head {
            head,
            reader,
            tail,
            left: size,
        },
        |state| async move {
            match state {
                Stream::Head {
                    head,
                    reader,
                    tail,
                    left,
                } => Some((
                    Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(head))),
                    Stream::Blob { reader, tail, left },
                )),
                Stream::Blob {
                    mut reader,
                    tail,
                    left,
                } => {
                    if left == 0 {
                        return Some((Ok(Frame::data(Bytes::from(tail))), Stream::Done));
                    }
                    let want = usize::try_from(left).map_or(CHUNK, |left| left.min(CHUNK));
                    let mut buffer = vec![0u8; want];
                    // A chunk is read whole, so only the last one is short
                    // of a multiple of three.
                    match reader.read_exact(&mut buffer).await {
                        Ok(_) => Some((
                            Ok(Frame::data(Bytes::from(base64(&buffer)))),
                            Stream::Blob {
                                reader,
                                tail,
                                left: left - want as u64,
                            },
                        )),
                        // Cut short: the stated length is not met, so the
                        // client sees a broken answer, never a wrong one.
                        Err(_) => None,
                    }
                }
                Stream::Done => None,
            }
        },
    );
    let mut response = hyper::Response::new(http_body_util::StreamBody::new(body).boxed_unsync());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(CONTENT_LENGTH, HeaderValue::from(length));
    response
}

/// Where a streamed read is.
enum Stream {
    Head {
        head: String,
        reader: crate::ports::ArtifactReader,
        tail: String,
        left: u64,
    },
    Blob {
        reader: crate::ports::ArtifactReader,
        tail: String,
        left: u64,
    },
    Done,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_names_its_run_and_artifact_and_nothing_else_is_one() {
        let (run, artifact) = (Uuid::new_v4(), Uuid::new_v4());
        let uri = artifact_uri(run, &artifact.to_string());
        assert_eq!(artifact_address(&uri), Some((run, artifact)));
        for refused in [
            format!("toolgate://runs/{run}/artifacts/{}", artifact.simple()),
            format!(
                "toolgate://runs/{}/artifacts/{artifact}",
                run.to_string().to_uppercase()
            ),
            format!("toolgate://runs/{run}/artifacts/{artifact}/x"),
            format!("toolgate://runs/{run}/../artifacts/{artifact}"),
            format!("file:///runs/{run}/artifacts/{artifact}"),
            format!("toolgate://runs/{run}/artifacts/"),
            String::new(),
        ] {
            assert_eq!(artifact_address(&refused), None, "{refused}");
        }
    }

    #[test]
    fn media_types_that_could_run_are_opaque() {
        for shown in [
            "image/png",
            "audio/wav",
            "text/plain",
            "text/plain; charset=utf-8",
            "application/json",
        ] {
            assert_eq!(served_media_type(shown), shown);
        }
        for opaque in [
            "text/html",
            "image/svg+xml",
            "application/javascript",
            "image/png; charset=x",
            "IMAGE/PNG",
            "application/x-sh",
        ] {
            assert_eq!(
                served_media_type(opaque),
                "application/octet-stream",
                "{opaque}"
            );
        }
    }
}
