//! The consent pages of `oauth2_user` servers, for the people the front
//! door's principals are (not operators): `/consent`, where a person
//! proves which principal they are with the credential they hold and asks
//! a server for a grant (or ends one), and `/consent/callback`, where the
//! authorization server sends them back and they confirm, by a form of
//! this origin, what is granted to whom before the code is redeemed.
//!
//! The flow is bound twice: to the principal that proved itself, and to
//! the browser it began in (a cookie only that browser holds, named by the
//! flow, `SameSite=Lax` so that it comes back with the authorization
//! server's redirect, `__Host-` behind TLS so no other origin can plant
//! one). A link opened by someone else, or an answer planted in another
//! browser, grants nothing to anyone. The credential is read from the form
//! and never kept.

use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::{HeaderValue, SET_COOKIE};
use hyper::{Request, StatusCode};

use super::html::{self, escape};
use super::{ConsoleError, Fields, auth};
use crate::domain::SecretValue;
use crate::edge::Reply;
use crate::ports::consent::consent_cookie_name;
use crate::ports::{Consent, ConsentAnswer, ConsentError, Granted, Principals, Revoked};

/// The cookie a flow's browser holds, as set: behind TLS with the
/// `__Host-` prefix (only this origin, over TLS, can have set it).
fn cookie_name(flow_name: &str, secure: bool) -> String {
    if secure {
        format!("__Host-{flow_name}")
    } else {
        flow_name.to_owned()
    }
}

/// What the consent pages are served with.
pub struct ConsentParts {
    /// The flows and grants.
    pub consent: Arc<dyn Consent>,
    /// Who a front-door credential names.
    pub principals: Arc<dyn Principals>,
    /// How long a flow waits for its answer (the cookie's life).
    pub flow_lifetime: Duration,
}

fn page(status: StatusCode, title: &str, body: &str) -> Reply {
    html::html(status, html::page(title, None, body))
}

/// `GET /consent`: the form, with the server a link named.
pub(super) fn form_page(status: StatusCode, problem: Option<&str>, server: Option<&str>) -> Reply {
    let problem = problem
        .map(|text| format!("<p class=\"error\">{}</p>", escape(text)))
        .unwrap_or_default();
    let server = escape(server.unwrap_or_default());
    let body = format!(
        "<div class=\"signin\">{problem}\
         <p>A server asks for your consent to act with your own account there. \
         Say which principal you are with the credential your MCP client or agent uses \
         with toolgate; it is checked and not kept.</p>\
         <form method=\"post\" action=\"/consent\">\
         <label for=\"server\">Server</label>\
         <input type=\"text\" id=\"server\" name=\"server\" value=\"{server}\" required>\
         <label for=\"credential\">Your toolgate credential</label>\
         <input type=\"password\" id=\"credential\" name=\"credential\" autocomplete=\"off\" required>\
         <p><button type=\"submit\" id=\"connect\" name=\"action\" value=\"connect\">Connect your account</button> \
         <button type=\"submit\" id=\"revoke\" name=\"action\" value=\"revoke\">End its grant</button></p>\
         </form></div>"
    );
    page(status, "Consent", &body)
}

/// The status a consent failure is shown with.
fn status_of(error: &ConsentError) -> StatusCode {
    match error {
        ConsentError::NoSuchServer => StatusCode::NOT_FOUND,
        ConsentError::UnknownFlow | ConsentError::WrongIssuer => StatusCode::BAD_REQUEST,
        ConsentError::Refused => StatusCode::FORBIDDEN,
        ConsentError::Metadata(_) | ConsentError::NotRedeemed => StatusCode::BAD_GATEWAY,
        ConsentError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

fn failure(error: &ConsentError) -> Reply {
    let body = format!(
        "<p class=\"error\">{}</p><p><a href=\"/consent\">Back</a></p>",
        escape(&error.to_string())
    );
    page(status_of(error), "Consent refused", &body)
}

/// `reply` setting the flow's cookie `name` to `value` for `max_age`
/// seconds.
fn with_cookie(mut reply: Reply, name: &str, value: &str, max_age: u64, secure: bool) -> Reply {
    // `__Host-` needs `Path=/` and `Secure`.
    let (path, secure) = if secure {
        ("/", "; Secure")
    } else {
        ("/consent", "")
    };
    let cookie = format!(
        "{}={value}; Path={path}; HttpOnly; SameSite=Lax; Max-Age={max_age}{secure}",
        cookie_name(name, !secure.is_empty())
    );
    if let Ok(cookie) = HeaderValue::from_str(&cookie) {
        reply.headers_mut().insert(SET_COOKIE, cookie);
    }
    reply
}

/// `POST /consent`: the person proves a principal, then a flow begins (a
/// page with the authorization server's link: a form may not lead
/// elsewhere under the CSP) or the grant ends.
pub(super) async fn submit(
    parts: &ConsentParts,
    form: &Fields,
    secure_cookie: bool,
) -> Result<Reply, ConsoleError> {
    let server = form
        .get("server")
        .ok_or(ConsoleError::Invalid("server is required"))?;
    let credential = SecretValue::new(form.get("credential").unwrap_or_default());
    let Some(who) = parts.principals.principal(&credential).await else {
        tracing::warn!("consent refused: the credential names no principal");
        return Ok(form_page(
            StatusCode::UNAUTHORIZED,
            Some("That credential does not name a principal."),
            Some(server),
        ));
    };
    match form.get("action") {
        Some("revoke") => {
            let ended = parts
                .consent
                .end_grant(&who.tenant_id, &who.principal_id, server)
                .await;
            let message = match ended {
                Ok(Revoked::Ended { upstream: true }) => {
                    "The grant is ended, and revoked at the server's authorization server; \
                     the next call asks for consent again."
                }
                Ok(Revoked::Ended { upstream: false }) => {
                    "The grant is ended; the next call asks for consent again."
                }
                Ok(Revoked::NotHeld) => "You held no grant at that server.",
                Err(error) => return Ok(failure(&error)),
            };
            Ok(page(
                StatusCode::OK,
                "Consent",
                &format!("<p id=\"done\">{}</p>", escape(message)),
            ))
        }
        Some("connect") => match parts.consent.begin(&who, server).await {
            Ok(start) => {
                let scopes = if start.scopes.is_empty() {
                    "none named".to_owned()
                } else {
                    start.scopes.join(", ")
                };
                let body = format!(
                    "<p>Server <strong>{server}</strong> asks for access with your own account \
                     there, for principal <strong>{principal}</strong> of tenant \
                     <strong>{tenant}</strong>. Scopes: {scopes}.</p>\
                     <p>You will sign in at <strong>{origin}</strong>.</p>\
                     <p><a id=\"continue\" href=\"{url}\">Continue</a></p>",
                    server = escape(server),
                    principal = escape(&who.principal_id),
                    tenant = escape(&who.tenant_id),
                    scopes = escape(&scopes),
                    origin = escape(&start.authorization_origin),
                    url = escape(&start.authorization_url),
                );
                let reply = page(StatusCode::OK, "Consent", &body);
                Ok(with_cookie(
                    reply,
                    &start.cookie_name,
                    &start.browser,
                    parts.flow_lifetime.as_secs(),
                    secure_cookie,
                ))
            }
            Err(error) => Ok(failure(&error)),
        },
        _ => Err(ConsoleError::Invalid("action must be connect or revoke")),
    }
}

/// `GET /consent/client.json`: toolgate's Client ID Metadata Document, the
/// client an authorization server is told of by its URL.
pub(super) fn client_document(parts: &ConsentParts) -> Reply {
    let mut reply = crate::edge::reply(StatusCode::OK, &parts.consent.client_document());
    // Authorization servers may keep it for a while (they fetch it on
    // each authorization otherwise).
    reply.headers_mut().insert(
        hyper::header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=3600"),
    );
    reply
}

/// The answer a callback's query or confirmation form carries.
fn answer_of(fields: &Fields) -> ConsentAnswer {
    ConsentAnswer {
        state: fields.get("state").map(str::to_owned),
        code: fields.get("code").map(str::to_owned),
        iss: fields.get("iss").map(str::to_owned),
        error: fields.get("error").map(str::to_owned),
    }
}

/// `GET /consent/callback`: the authorization server's answer. Before any
/// code is redeemed, the person who began the flow, in the browser that
/// began it, confirms what is granted to whom: an answer planted in a
/// browser (a link a stranger sent) grants nothing without that click on
/// this origin. Any other answer (another browser's, a used or unknown
/// state, a refusal) is finished at once, which refuses it.
pub(super) async fn callback(
    parts: &ConsentParts,
    request: &Request<Incoming>,
    query: &Fields,
    secure_cookie: bool,
) -> Reply {
    let answer = answer_of(query);
    let flow_name = consent_cookie_name(answer.state.as_deref().unwrap_or_default());
    let browser = auth::cookie_named(request.headers(), &cookie_name(&flow_name, secure_cookie));
    if answer.error.is_none() {
        match parts.consent.pending(browser, &answer).await {
            Ok(Some(asked)) => return confirmation(&answer, &asked),
            Ok(None) => {}
            Err(error) => return failure(&error),
        }
    }
    finish(parts, browser, &answer, &flow_name, secure_cookie).await
}

/// The page that asks the person to confirm a grant, carrying the answer
/// in its form.
fn confirmation(answer: &ConsentAnswer, asked: &Granted) -> Reply {
    let hidden = |name: &str, value: Option<&str>| {
        value
            .map(|value| {
                format!(
                    "<input type=\"hidden\" name=\"{name}\" value=\"{}\">",
                    escape(value)
                )
            })
            .unwrap_or_default()
    };
    let body = format!(
        "<p>Let principal <strong>{principal}</strong> of tenant <strong>{tenant}</strong> \
         act with the account you just signed in with at server <strong>{server}</strong>?</p>\
         <form method=\"post\" action=\"/consent/callback\">{state}{code}{iss}\
         <p><button type=\"submit\" id=\"confirm\">Connect</button></p></form>\
         <p class=\"muted\">If you did not start this, close this page: nothing is granted.</p>",
        principal = escape(&asked.principal_id),
        tenant = escape(&asked.tenant_id),
        server = escape(&asked.server_id),
        state = hidden("state", answer.state.as_deref()),
        code = hidden("code", answer.code.as_deref()),
        iss = hidden("iss", answer.iss.as_deref()),
    );
    page(StatusCode::OK, "Confirm consent", &body)
}

/// `POST /consent/callback`: the confirmed answer, finished in the browser
/// that began it.
pub(super) async fn confirmed(
    parts: &ConsentParts,
    headers: &hyper::HeaderMap,
    form: &Fields,
    secure_cookie: bool,
) -> Reply {
    let answer = answer_of(form);
    let flow_name = consent_cookie_name(answer.state.as_deref().unwrap_or_default());
    let browser = auth::cookie_named(headers, &cookie_name(&flow_name, secure_cookie));
    finish(parts, browser, &answer, &flow_name, secure_cookie).await
}

/// Finishes the flow; its cookie is cleared either way.
async fn finish(
    parts: &ConsentParts,
    browser: Option<&str>,
    answer: &ConsentAnswer,
    flow_name: &str,
    secure_cookie: bool,
) -> Reply {
    let reply = match parts.consent.finish(browser, answer).await {
        Ok(granted) => page(
            StatusCode::OK,
            "Consent",
            &format!(
                "<p id=\"done\">Connected: server <strong>{}</strong> now acts with your \
                 account for principal <strong>{}</strong> of tenant <strong>{}</strong>. \
                 You may close this page.</p>",
                escape(&granted.server_id),
                escape(&granted.principal_id),
                escape(&granted.tenant_id)
            ),
        ),
        Err(error) => failure(&error),
    };
    with_cookie(reply, flow_name, "", 0, secure_cookie)
}
