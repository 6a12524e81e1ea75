//! The operators' web console (ARCHITECTURE.md §2.4): server-rendered
//! pages over what the stores record — the review queue, approvals, the
//! invocations and each one's story, servers, tool health, each tenant's
//! `oauth2_user` grants — and the decisions an operator makes there
//! (resolve an UNCERTAIN call, decide an approval, end a grant), through
//! the same pipeline service and store ports the control API uses. It also
//! serves the consent pages, for principals rather than operators.
//!
//! Operators sign in with a token (kept as its hash) and hold a session
//! cookie (`HttpOnly`, `SameSite=Strict`, `Secure` behind TLS); every POST
//! carries the session's CSRF token and must not come from another site.
//! No page runs script: the CSP allows none, and every value from a
//! record, a tenant or a server is escaped by [`html::escape`]. Knows
//! nothing of the adapters, the control API, the bridge or the front door.

mod auth;
mod consent;
mod html;
mod pages;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use tokio_util::sync::CancellationToken;

pub use auth::Operator;
pub use consent::ConsentParts;
pub use html::{CONTENT_SECURITY_POLICY, escape};

use crate::edge::{
    BodyError, ConnectionCap, EdgeLimits, InFlight, Reply, accept_until, serve_connection,
};
use crate::pipeline::approvals::Approvals;
use crate::ports::{Clock, ConsoleSignInStore, OperatorStore, ReviewStore, StoreError};

/// What the console is configured with.
#[derive(Debug, Clone)]
pub struct ConsoleSettings {
    /// Body size, header and body deadlines.
    pub limits: EdgeLimits,
    /// Send the cookie with `Secure`: the console is reached over TLS.
    pub secure_cookie: bool,
    /// How long a sign-in lasts.
    pub session_lifetime: Duration,
}

/// The parts a console is built from.
pub struct ConsoleParts {
    /// Decides approvals, waking whoever holds the call.
    pub approvals: Arc<Approvals>,
    /// Resolves review items.
    pub reviews: Arc<dyn ReviewStore>,
    /// The operator's lists, across tenants.
    pub operator: Arc<dyn OperatorStore>,
    /// Who may sign in.
    pub operators: Vec<Operator>,
    /// Where sign-ins are kept, for every node.
    pub sign_ins: Arc<dyn ConsoleSignInStore>,
    /// The MCP servers, asked whether each is connected now.
    pub servers: Arc<dyn crate::ports::McpServers>,
    /// Each principal's `oauth2_user` grants, listed.
    pub grants: Arc<dyn crate::ports::GrantStore>,
    /// Ends them, and revokes them upstream.
    pub revocation: Arc<dyn crate::ports::Revocation>,
    /// Requests in flight on every edge, for the drain.
    pub in_flight: Arc<InFlight>,
    /// Connections held at once.
    pub connections: ConnectionCap,
    /// Now, for what a decision records.
    pub clock: Arc<dyn Clock>,
    /// Limits and the cookie.
    pub settings: ConsoleSettings,
    /// The consent pages of `oauth2_user` servers, when consent is
    /// configured.
    pub consent: Option<ConsentParts>,
}

/// The console.
pub struct Console {
    parts: ConsoleParts,
    sessions: auth::Sessions,
}

/// Every way a console request can fail, each with one page
/// ([`ConsoleError::reply`], the one rescue point).
#[derive(Debug, thiserror::Error)]
enum ConsoleError {
    /// A filter, form field or path is not one the console takes; the
    /// message names which, never its value.
    #[error("{0}")]
    Invalid(&'static str),
    /// No such page or record.
    #[error("no such page or record")]
    NotFound,
    /// A POST from another site, or without the session's CSRF token.
    #[error("the request did not come from this console's own page")]
    Forged,
    /// The record is no longer in the state the decision needs.
    #[error("{0}")]
    Conflict(&'static str),
    /// toolgate is draining and takes no decisions.
    #[error("toolgate is shutting down")]
    Draining,
    /// The body was refused.
    #[error(transparent)]
    Body(#[from] BodyError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ConsoleError {
    /// The one error page. A store failure is logged for the operator; the
    /// page says only that the store did not answer.
    fn reply(self) -> Reply {
        let status = match &self {
            ConsoleError::Invalid(_) => StatusCode::BAD_REQUEST,
            ConsoleError::NotFound => StatusCode::NOT_FOUND,
            ConsoleError::Forged => StatusCode::FORBIDDEN,
            ConsoleError::Conflict(_) => StatusCode::CONFLICT,
            ConsoleError::Draining => StatusCode::SERVICE_UNAVAILABLE,
            ConsoleError::Body(BodyError::TooLarge) => StatusCode::PAYLOAD_TOO_LARGE,
            ConsoleError::Body(_) => StatusCode::BAD_REQUEST,
            ConsoleError::Store(failure) => {
                tracing::error!(error = %failure, "the store failed a console request");
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        let message = match &self {
            ConsoleError::Store(_) => "the store did not answer".to_owned(),
            other => other.to_string(),
        };
        let body = format!(
            "<p class=\"error\">{}</p><p><a href=\"/\">Back</a></p>",
            escape(&message)
        );
        html::html(status, html::page("Refused", None, &body))
    }
}

/// A request's query or form: percent-decoded, each key at most once.
#[derive(Debug, Default)]
struct Fields(HashMap<String, String>);

impl Fields {
    /// Reads `a=b&c=d` (`+` as a space).
    fn parse(text: &str) -> Result<Fields, ConsoleError> {
        let mut map = HashMap::new();
        for pair in text.split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let (Some(name), Some(value)) = (decode(name), decode(value)) else {
                return Err(ConsoleError::Invalid(
                    "a field is not valid percent-encoding",
                ));
            };
            if map.insert(name, value).is_some() {
                return Err(ConsoleError::Invalid("a field is given more than once"));
            }
        }
        Ok(Fields(map))
    }

    /// A value, if given and not empty (an empty filter is no filter).
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
}

/// Percent-decodes one form component, `+` as a space.
fn decode(component: &str) -> Option<String> {
    let bytes = component.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while let Some(&byte) = bytes.get(index) {
        match byte {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(index + 1..index + 3)?).ok()?;
                if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return None;
                }
                decoded.push(u8::from_str_radix(hex, 16).ok()?);
                index += 3;
            }
            b'+' => {
                decoded.push(b' ');
                index += 1;
            }
            byte => {
                decoded.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8(decoded).ok()
}

impl Console {
    /// The console over its parts.
    pub fn new(parts: ConsoleParts) -> Arc<Self> {
        let sessions = auth::Sessions::new(
            parts.operators.clone(),
            parts.settings.session_lifetime,
            parts.sign_ins.clone(),
            parts.clock.clone(),
        );
        Arc::new(Console { parts, sessions })
    }

    /// Serves the console on `listener` until `shutdown` fires.
    pub async fn serve_tcp(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        shutdown: CancellationToken,
    ) {
        accept_until(listener, "console", shutdown, |stream| {
            // Past the cap the connection is closed as soon as accepted.
            let Some(permit) = self.parts.connections.admit() else {
                return;
            };
            let console = self.clone();
            let header_timeout = self.parts.settings.limits.header_timeout;
            tokio::spawn(serve_connection(
                stream,
                header_timeout,
                vec![permit],
                move |request| {
                    let console = console.clone();
                    async move {
                        let in_flight = console.parts.in_flight.clone();
                        in_flight
                            .track(async move { console.route(request).await })
                            .await
                    }
                },
            ));
        })
        .await;
    }

    /// The route table, and the rescue point.
    async fn route(&self, request: Request<Incoming>) -> Reply {
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let query = match Fields::parse(request.uri().query().unwrap_or_default()) {
            Ok(query) => query,
            Err(refused) => return refused.reply(),
        };
        match (&method, segments.as_slice()) {
            (&Method::GET, ["console.css"]) => {
                return html::respond(
                    StatusCode::OK,
                    "text/css; charset=utf-8",
                    html::STYLESHEET.to_owned(),
                );
            }
            (&Method::GET, ["sign-in"]) => {
                return pages::sign_in_page(StatusCode::OK, None, query.get("next"));
            }
            (&Method::POST, ["sign-in"]) => {
                return self
                    .sign_in(request)
                    .await
                    .unwrap_or_else(ConsoleError::reply);
            }
            (_, ["consent", ..]) => {
                return self
                    .consent(&method, &segments, request, &query)
                    .await
                    .unwrap_or_else(ConsoleError::reply);
            }
            _ => {}
        }
        let session = match self.sessions.session(request.headers()).await {
            Ok(session) => session,
            Err(error) => return ConsoleError::Store(error).reply(),
        };
        let Some(session) = session else {
            // An approval's page, where a client sends its user, is where
            // signing in leads back to.
            return match (&method, segments.as_slice()) {
                (&Method::GET, ["approvals", _, _]) if pages::local_path(&path) => {
                    html::see_other(&format!("/sign-in?next={}", html::encode(&path)))
                }
                _ => html::see_other("/sign-in"),
            };
        };
        let result = if method == Method::POST {
            self.post(&session, &segments, request).await
        } else if method == Method::GET {
            self.get(&session, &segments, &query).await
        } else {
            Err(ConsoleError::NotFound)
        };
        result.unwrap_or_else(ConsoleError::reply)
    }

    /// The pages.
    async fn get(
        &self,
        session: &auth::Session,
        segments: &[&str],
        query: &Fields,
    ) -> Result<Reply, ConsoleError> {
        // The queues' depths in the navigation: a count the store cannot
        // give now is left out, never a page refused for it.
        let depths = self.parts.reviews.queue_depths().await.ok();
        let frame = html::Frame {
            operator: &session.operator,
            csrf: &session.csrf,
            depths,
        };
        let body = match segments {
            [""] => return Ok(html::see_other("/review")),
            ["review"] => self.review_page(&frame, query).await?,
            ["approvals"] => self.approvals_page(&frame, query).await?,
            ["approvals", tenant, id] => self.approval_page(&frame, tenant, id).await?,
            ["invocations"] => self.invocations_page(query).await?,
            ["invocations", id] => self.story_page(id).await?,
            ["servers"] => self.servers_page(query).await?,
            ["grants"] => self.grants_page(&frame, query).await?,
            ["health"] => self.health_page(query).await?,
            _ => return Err(ConsoleError::NotFound),
        };
        let title = match segments {
            ["review"] => "Review queue",
            ["approvals"] => "Approvals",
            ["approvals", _, _] => "Approval",
            ["invocations"] => "Invocations",
            ["invocations", _] => "Invocation",
            ["servers"] => "Servers",
            ["grants"] => "Grants",
            _ => "Tool health",
        };
        Ok(html::html(
            StatusCode::OK,
            html::page(title, Some(&frame), &body),
        ))
    }

    /// The decisions: every one from this console's own page, with the
    /// session's CSRF token; none while draining.
    async fn post(
        &self,
        session: &auth::Session,
        segments: &[&str],
        request: Request<Incoming>,
    ) -> Result<Reply, ConsoleError> {
        if !auth::same_origin(request.headers()) {
            return Err(ConsoleError::Forged);
        }
        let headers = request.headers().clone();
        let form = self.form(request).await?;
        if !auth::csrf_matches(session, form.get("csrf")) {
            return Err(ConsoleError::Forged);
        }
        if segments == ["sign-out"] {
            self.sessions.close(&headers).await?;
            return Ok(self.with_cookie(html::see_other("/sign-in"), "", 0));
        }
        if self.parts.in_flight.draining() {
            return Err(ConsoleError::Draining);
        }
        match segments {
            ["review", tenant, id] => self.resolve(session, tenant, id, &form).await,
            ["approvals", tenant, id] => self.decide(session, tenant, id, &form).await,
            ["grants", tenant, server] => self.end_grant(session, tenant, server, &form).await,
            _ => Err(ConsoleError::NotFound),
        }
    }

    /// The consent pages: for principals, not operators, so no console
    /// session is asked for; a POST must come from this page.
    async fn consent(
        &self,
        method: &Method,
        segments: &[&str],
        request: Request<Incoming>,
        query: &Fields,
    ) -> Result<Reply, ConsoleError> {
        let parts = self.parts.consent.as_ref().ok_or(ConsoleError::NotFound)?;
        let secure = self.parts.settings.secure_cookie;
        match (method, segments) {
            (&Method::GET, ["consent"]) => Ok(consent::form_page(
                StatusCode::OK,
                None,
                query.get("server"),
            )),
            (&Method::GET, ["consent", "client.json"]) => Ok(consent::client_document(parts)),
            (&Method::GET, ["consent", "callback"]) => {
                Ok(consent::callback(parts, &request, query, secure).await)
            }
            (&Method::POST, ["consent"]) => {
                if !auth::same_origin(request.headers()) {
                    return Err(ConsoleError::Forged);
                }
                if self.parts.in_flight.draining() {
                    return Err(ConsoleError::Draining);
                }
                let form = self.form(request).await?;
                consent::submit(parts, &form, secure).await
            }
            (&Method::POST, ["consent", "callback"]) => {
                if !auth::same_origin(request.headers()) {
                    return Err(ConsoleError::Forged);
                }
                let headers = request.headers().clone();
                let form = self.form(request).await?;
                Ok(consent::confirmed(parts, &headers, &form, secure).await)
            }
            _ => Err(ConsoleError::NotFound),
        }
    }

    /// `POST /sign-in`: a configured token opens a session.
    async fn sign_in(&self, request: Request<Incoming>) -> Result<Reply, ConsoleError> {
        if !auth::same_origin(request.headers()) {
            return Err(ConsoleError::Forged);
        }
        let form = self.form(request).await?;
        let Some(operator) = form.get("token").and_then(|t| self.sessions.operator(t)) else {
            // Which of the two was wrong is not said, and the token is
            // never logged.
            tracing::warn!("console sign-in refused");
            return Ok(pages::sign_in_page(
                StatusCode::UNAUTHORIZED,
                Some("That token does not sign anyone in."),
                form.get("next"),
            ));
        };
        tracing::info!(operator = %operator, "console sign-in");
        let cookie = self.sessions.open(operator).await?;
        let lifetime = self.sessions.lifetime().as_secs();
        // Only a path of this console, never another site.
        let next = form
            .get("next")
            .filter(|next| pages::local_path(next))
            .unwrap_or("/review");
        Ok(self.with_cookie(html::see_other(next), &cookie, lifetime))
    }

    /// `reply` setting the session cookie to `value` for `max_age` seconds
    /// (0 clears it).
    fn with_cookie(&self, mut reply: Reply, value: &str, max_age: u64) -> Reply {
        let secure = if self.parts.settings.secure_cookie {
            "; Secure"
        } else {
            ""
        };
        let cookie = format!(
            "{}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}",
            auth::COOKIE_NAME
        );
        if let Ok(cookie) = hyper::header::HeaderValue::from_str(&cookie) {
            reply
                .headers_mut()
                .insert(hyper::header::SET_COOKIE, cookie);
        }
        reply
    }

    /// A form body within the edge's size limit and deadline.
    async fn form(&self, request: Request<Incoming>) -> Result<Fields, ConsoleError> {
        let bytes =
            crate::edge::body_bytes(request.into_body(), &self.parts.settings.limits).await?;
        let text = std::str::from_utf8(&bytes)
            .map_err(|_| ConsoleError::Invalid("the form is not UTF-8"))?;
        Fields::parse(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_are_decoded_once_each() {
        let fields = Fields::parse("a=x+y%21&b=&c=%3Cb%3E").unwrap();
        assert_eq!(fields.get("a"), Some("x y!"));
        assert_eq!(fields.get("b"), None);
        assert_eq!(fields.get("c"), Some("<b>"));
        assert!(Fields::parse("a=1&a=2").is_err());
        assert!(Fields::parse("a=%zz").is_err());
        assert!(Fields::parse("a=%C3").is_err());
    }

    #[test]
    fn signing_in_leads_back_only_to_this_consoles_paths() {
        assert!(pages::local_path(
            "/approvals/tenant-a/0b6e5a8e-3f57-4d2f-9a51-2c1d6f0e8a11"
        ));
        for elsewhere in [
            "//evil.example/x",
            "https://evil.example/",
            "/\\evil.example",
            "approvals",
            "/approvals?x=1",
            "/a\"><script>",
            "",
        ] {
            assert!(!pages::local_path(elsewhere), "{elsewhere}");
        }
    }
}
