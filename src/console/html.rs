//! The console's HTML: the one escaping function every value from a
//! record, a tenant or a server passes through, the page frame, and the
//! headers every answer carries (a CSP with no script source at all).

use std::fmt::Write as _;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Response, StatusCode};

use crate::edge::Reply;

/// The policy every answer carries: nothing runs, only this origin's
/// stylesheet and images load, forms post only here, no page frames it.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'self'; \
     img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The stylesheet, in the binary.
pub(super) const STYLESHEET: &str = include_str!("console.css");

/// Text made safe to place in an element or a quoted attribute: the five
/// characters HTML gives meaning to are written as references.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A query component, percent-encoded (then escaped where it is written
/// into an attribute).
pub(super) fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// JSON, indented, escaped, in a `pre`.
pub(super) fn json_block(value: &serde_json::Value) -> String {
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    format!("<pre>{}</pre>", escape(&text))
}

/// Who is signed in, for the frame.
pub(super) struct Frame<'a> {
    pub(super) operator: &'a str,
    pub(super) csrf: &'a str,
    /// The review queue's and the approvals' depths, when read.
    pub(super) depths: Option<crate::ports::QueueDepths>,
}

/// A queue's count beside its link, marked when something waits.
fn count(id: &str, depth: Option<i64>) -> String {
    match depth {
        Some(depth) => format!(
            " <span id=\"{id}\" class=\"count{waiting}\">{depth}</span>",
            waiting = if depth > 0 { " waiting" } else { "" },
        ),
        None => String::new(),
    }
}

/// An id as its first eight characters, the whole of it on hover.
pub(super) fn short_id(id: impl std::fmt::Display) -> String {
    let id = escape(&id.to_string());
    let short: String = id.chars().take(8).collect();
    if short.len() == id.len() {
        id
    } else {
        format!("<span class=\"id\" title=\"{id}\">{short}…</span>")
    }
}

/// A whole page: the navigation, who is signed in with a sign-out form,
/// and `body` (already escaped where it holds values).
pub(super) fn page(title: &str, frame: Option<&Frame<'_>>, body: &str) -> String {
    let navigation = match frame {
        Some(frame) => format!(
            "<header><strong>toolgate</strong>\
             <a href=\"/review\">Review queue{review}</a>\
             <a href=\"/approvals\">Approvals{approvals}</a>\
             <a href=\"/invocations\">Invocations</a>\
             <a href=\"/servers\">Servers</a>\
             <a href=\"/grants\">Grants</a>\
             <a href=\"/health\">Tool health</a>\
             <span class=\"who\">{operator}</span>\
             <form method=\"post\" action=\"/sign-out\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
             <button type=\"submit\">Sign out</button></form></header>",
            operator = escape(frame.operator),
            csrf = escape(frame.csrf),
            review = count(
                "review-count",
                frame.depths.as_ref().map(|d| d.unresolved_uncertain)
            ),
            approvals = count(
                "approvals-count",
                frame.depths.as_ref().map(|d| d.pending_approvals)
            ),
        ),
        None => "<header><strong>toolgate</strong></header>".to_owned(),
    };
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · toolgate</title>\
         <link rel=\"stylesheet\" href=\"/console.css\"></head>\
         <body>{navigation}<main><h1>{title}</h1>{body}</main></body></html>",
        title = escape(title),
    )
}

/// An answer with the headers every console answer carries.
pub(super) fn respond(status: StatusCode, content_type: &'static str, body: String) -> Reply {
    let mut response = Response::new(Full::new(Bytes::from(body)).boxed_unsync());
    *response.status_mut() = status;
    let headers = response.headers_mut();
    for (name, value) in [
        ("content-type", content_type),
        ("content-security-policy", CONTENT_SECURITY_POLICY),
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        // Not `no-referrer`: under it a browser sends `Origin: null` with
        // the console's own form posts, which the same-origin check refuses.
        ("referrer-policy", "same-origin"),
        ("cache-control", "no-store"),
        ("cross-origin-opener-policy", "same-origin"),
    ] {
        headers.insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    response
}

/// An HTML page.
pub(super) fn html(status: StatusCode, page: String) -> Reply {
    respond(status, "text/html; charset=utf-8", page)
}

/// A redirect after a form or to the sign-in page: 303, so the browser
/// follows with a GET.
pub(super) fn see_other(location: &str) -> Reply {
    let mut response = respond(
        StatusCode::SEE_OTHER,
        "text/plain; charset=utf-8",
        String::new(),
    );
    if let Ok(value) = HeaderValue::from_str(location) {
        response
            .headers_mut()
            .insert(hyper::header::LOCATION, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_text_stays_text() {
        assert_eq!(
            escape("\"><img src=x onerror=alert(1)>&'"),
            "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;&amp;&#39;"
        );
        let page = page("<script>alert(1)</script>", None, "");
        assert!(!page.contains("<script>"));
    }

    #[test]
    fn query_components_are_percent_encoded() {
        assert_eq!(encode("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
    }
}
