//! `GET /v1/events` (the outbox as JSON lines or server-sent events,
//! optionally followed) and `GET /metrics`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::Response;
use hyper::body::Bytes;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use serde_json::json;

use super::listen::Routed;
use super::{ApiError, ControlApi};
use crate::edge::Reply;

/// Events one answer holds unless `limit` says otherwise.
const DEFAULT_EVENTS: i64 = 1000;
/// The largest `limit`.
const MAXIMUM_EVENTS: i64 = 10_000;

/// How often a followed event stream looks for new events.
const FOLLOW_POLL: Duration = Duration::from_millis(250);

/// A response body fed, frame by frame, from a channel: the followed event
/// stream. It ends when the sender is dropped.
struct Channel(tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for Channel {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|bytes| Ok(hyper::body::Frame::data(bytes))))
    }
}

impl ControlApi {
    /// The outbox from a cursor, as JSON lines or (with `Accept:
    /// text/event-stream`) server-sent events whose ids are the cursor. With
    /// `follow=true` the response stays open and new events are sent as
    /// they commit, until the reader goes or toolgate drains.
    pub(super) async fn events(self: &Arc<Self>, routed: Routed) -> Result<Reply, ApiError> {
        let query = &routed.query;
        let sse = routed
            .request
            .headers()
            .get(hyper::header::ACCEPT)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|accept| accept.contains("text/event-stream"));
        let follow = match query.get("follow") {
            None | Some("false") => false,
            Some("true") => true,
            Some(_) => return Err(ApiError::Invalid("follow must be true or false".into())),
        };
        let mut after = match query.get("after") {
            None => 0,
            Some(after) => after
                .parse::<i64>()
                .ok()
                .filter(|after| *after >= 0)
                .ok_or_else(|| ApiError::Invalid("after must be a non-negative integer".into()))?,
        };
        let limit = match query.get("limit") {
            None => DEFAULT_EVENTS,
            Some(limit) => limit
                .parse::<i64>()
                .ok()
                .filter(|limit| (1..=MAXIMUM_EVENTS).contains(limit))
                .ok_or_else(|| {
                    ApiError::Invalid(format!(
                        "limit must be an integer from 1 to {MAXIMUM_EVENTS}"
                    ))
                })?,
        };
        let tenant = query.optional_tenant()?;
        let media = if sse {
            "text/event-stream"
        } else {
            "application/x-ndjson"
        };
        let (lines, last) = self
            .event_lines(after, limit, tenant.as_deref(), sse)
            .await?;
        let body = if follow {
            after = last.unwrap_or(after);
            let (sender, receiver) = tokio::sync::mpsc::channel(16);
            let api = self.clone();
            tokio::spawn(async move {
                if sender.send(Bytes::from(lines)).await.is_err() {
                    return;
                }
                while !api.parts.in_flight.draining() {
                    // A reader that went away ends the poll at once, not at
                    // the next event.
                    tokio::select! {
                        _ = sender.closed() => return,
                        _ = tokio::time::sleep(FOLLOW_POLL) => {}
                    }
                    let Ok((lines, last)) =
                        api.event_lines(after, limit, tenant.as_deref(), sse).await
                    else {
                        return;
                    };
                    after = last.unwrap_or(after);
                    if !lines.is_empty() && sender.send(Bytes::from(lines)).await.is_err() {
                        return;
                    }
                }
            });
            Channel(receiver).boxed_unsync()
        } else {
            Full::new(Bytes::from(lines)).boxed_unsync()
        };
        let mut response = Response::new(body);
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(media));
        Ok(response)
    }

    /// Events after `after`, rendered, and the last id among them.
    async fn event_lines(
        &self,
        after: i64,
        limit: i64,
        tenant_id: Option<&str>,
        sse: bool,
    ) -> Result<(String, Option<i64>), ApiError> {
        let events = self
            .parts
            .events
            .events_after(after, limit, tenant_id)
            .await?;
        let last = events.last().map(|event| event.id);
        let mut lines = String::new();
        for event in events {
            let body = json!({
                "id": event.id,
                "event_type": event.event_type,
                "tenant_id": event.tenant_id,
                "payload": event.payload,
                "created_at": event.created_at,
            });
            if sse {
                // The id is the cursor a reconnecting reader sends back.
                lines.push_str(&format!(
                    "id: {}\nevent: {}\ndata: {body}\n\n",
                    event.id, event.event_type
                ));
            } else {
                lines.push_str(&body.to_string());
                lines.push('\n');
            }
        }
        Ok((lines, last))
    }

    /// The metrics exposition (also served by the operations listener).
    pub(super) async fn metrics(&self) -> Reply {
        let text = self.parts.metrics.render().await;
        let mut response = Response::new(Full::new(Bytes::from(text)).boxed_unsync());
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static(crate::ports::metrics::CONTENT_TYPE),
        );
        response
    }
}
