//! Who is signed in: operators' tokens checked against their hashes in
//! constant time, sign-ins kept in the store by the hash of their cookie, a
//! CSRF token per session, and the same-origin check on every POST.
//!
//! A sign-in is the store's, not a node's: it survives a restart and works
//! on every node behind a load balancer. The store holds only the cookie's
//! hash, and the CSRF token is derived from the cookie, so nothing in the
//! store can be presented by a browser.

use std::sync::Arc;
use std::time::Duration;

use hyper::HeaderMap;
use hyper::header::{COOKIE, HOST, ORIGIN};

use crate::domain::sha256_hex;
use crate::edge::constant_time_eq;
use crate::ports::{Clock, ConsoleSignIn, ConsoleSignInStore, StoreError};

/// The cookie's name.
pub(super) const COOKIE_NAME: &str = "toolgate_console";
/// Sign-ins kept at once; past it the one ending soonest is signed out, so
/// signing in in a loop cannot grow the store.
const MAXIMUM_SESSIONS: usize = 1024;

/// An operator who may sign in: a name and the sha256 of their token.
#[derive(Debug, Clone)]
pub struct Operator {
    /// Recorded as the approver or resolver of what they decide.
    pub name: String,
    /// Lowercase hex sha256 of the token.
    pub sha256: String,
}

/// One signed-in browser.
#[derive(Debug, Clone)]
pub(super) struct Session {
    /// Whose.
    pub(super) operator: String,
    /// What each of its forms carries.
    pub(super) csrf: String,
}

/// The operators and their sign-ins.
pub(super) struct Sessions {
    operators: Vec<Operator>,
    lifetime: Duration,
    sign_ins: Arc<dyn ConsoleSignInStore>,
    clock: Arc<dyn Clock>,
}

/// 244 random bits, hex: two v4 UUIDs, which come from the operating
/// system's CSPRNG.
fn random_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

impl Sessions {
    pub(super) fn new(
        operators: Vec<Operator>,
        lifetime: Duration,
        sign_ins: Arc<dyn ConsoleSignInStore>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Sessions {
            operators,
            lifetime,
            sign_ins,
            clock,
        }
    }

    /// The operator whose token this is.
    pub(super) fn operator(&self, token: &str) -> Option<String> {
        operator_of(&self.operators, token)
    }

    /// A new sign-in for `operator`: the cookie's value.
    pub(super) async fn open(&self, operator: String) -> Result<String, StoreError> {
        let cookie = random_token();
        let now = self.clock.now();
        let lifetime = chrono::Duration::from_std(self.lifetime).unwrap_or(chrono::Duration::MAX);
        let sign_in = ConsoleSignIn {
            cookie_sha256: sha256_hex(cookie.as_bytes()),
            operator,
            signed_in_at: now,
            expires_at: now.checked_add_signed(lifetime).unwrap_or(now),
        };
        self.sign_ins.sign_in(&sign_in, MAXIMUM_SESSIONS).await?;
        Ok(cookie)
    }

    /// The live session the request's cookie names. An operator no longer
    /// configured is signed in no more.
    pub(super) async fn session(&self, headers: &HeaderMap) -> Result<Option<Session>, StoreError> {
        let Some(cookie) = cookie(headers) else {
            return Ok(None);
        };
        let found = self
            .sign_ins
            .signed_in(&sha256_hex(cookie.as_bytes()), self.clock.now())
            .await?;
        Ok(found
            .filter(|sign_in| {
                self.operators
                    .iter()
                    .any(|operator| operator.name == sign_in.operator)
            })
            .map(|sign_in| Session {
                operator: sign_in.operator,
                csrf: csrf_of(cookie),
            }))
    }

    /// Ends the sign-in the request's cookie names.
    pub(super) async fn close(&self, headers: &HeaderMap) -> Result<(), StoreError> {
        match cookie(headers) {
            Some(cookie) => self.sign_ins.sign_out(&sha256_hex(cookie.as_bytes())).await,
            None => Ok(()),
        }
    }

    /// How long a session lasts, for the cookie's `Max-Age`.
    pub(super) fn lifetime(&self) -> Duration {
        self.lifetime
    }
}

/// The operator whose token this is. Every operator's hash is compared,
/// each in constant time, so the time taken says nothing of which matched.
fn operator_of(operators: &[Operator], token: &str) -> Option<String> {
    let presented = sha256_hex(token.as_bytes());
    let mut found = None;
    for operator in operators {
        if constant_time_eq(presented.as_bytes(), operator.sha256.as_bytes()) {
            found = Some(operator.name.clone());
        }
    }
    found
}

/// A session's CSRF token: derived from its cookie, which another site can
/// neither read nor guess, and never the key the store holds.
fn csrf_of(cookie: &str) -> String {
    sha256_hex(format!("toolgate console csrf\n{cookie}").as_bytes())
}

/// The console cookie's value, if the request carries it.
fn cookie(headers: &HeaderMap) -> Option<&str> {
    cookie_named(headers, COOKIE_NAME)
}

/// The value of the cookie `name`, if the request carries it.
pub(super) fn cookie_named<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(found, _)| *found == name)
        .map(|(_, value)| value)
        .filter(|value| !value.is_empty())
}

/// Whether a state-changing request comes from the console's own pages.
/// A browser names where a request comes from (`Sec-Fetch-Site`,
/// `Origin`); a request it says is cross-site is refused whatever else it
/// carries. A client that names neither is not a browser another site can
/// drive, and still needs the CSRF token.
pub(super) fn same_origin(headers: &HeaderMap) -> bool {
    let header = |name| headers.get(name).map(|value| value.to_str().unwrap_or(""));
    if let Some(site) = header("sec-fetch-site")
        && site != "same-origin"
    {
        return false;
    }
    match header(ORIGIN.as_str()) {
        None => true,
        Some(origin) => {
            // Behind a proxy that terminates TLS the scheme the browser
            // used is not this listener's; the host is what must match.
            let host = origin
                .strip_prefix("https://")
                .or_else(|| origin.strip_prefix("http://"));
            match (host, header(HOST.as_str())) {
                (Some(host), Some(expected)) => {
                    !host.is_empty() && host.eq_ignore_ascii_case(expected)
                }
                _ => false,
            }
        }
    }
}

/// Whether the form's CSRF token is the session's.
pub(super) fn csrf_matches(session: &Session, presented: Option<&str>) -> bool {
    presented.is_some_and(|token| constant_time_eq(token.as_bytes(), session.csrf.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn operators() -> Vec<Operator> {
        vec![Operator {
            name: "ana".into(),
            sha256: sha256_hex(b"right"),
        }]
    }

    fn with(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn only_a_configured_token_names_an_operator() {
        let operators = operators();
        assert_eq!(operator_of(&operators, "right").as_deref(), Some("ana"));
        assert_eq!(operator_of(&operators, "wrong"), None);
        assert_eq!(operator_of(&operators, ""), None);
    }

    #[test]
    fn the_csrf_token_is_the_cookies_own_and_checked_whole() {
        let session = Session {
            operator: "ana".into(),
            csrf: csrf_of("cookie-one"),
        };
        assert_ne!(csrf_of("cookie-one"), csrf_of("cookie-two"));
        assert_ne!(csrf_of("cookie-one"), sha256_hex(b"cookie-one"));
        assert!(csrf_matches(&session, Some(&csrf_of("cookie-one"))));
        assert!(!csrf_matches(&session, Some(&csrf_of("cookie-two"))));
        assert!(!csrf_matches(&session, Some("forged")));
        assert!(!csrf_matches(&session, None));
        let headers = with(&[("cookie", &format!("a=b; {COOKIE_NAME}=value"))]);
        assert_eq!(cookie(&headers), Some("value"));
        assert_eq!(
            cookie(&with(&[("cookie", &format!("{COOKIE_NAME}="))])),
            None
        );
    }

    #[test]
    fn cross_site_requests_are_told_apart() {
        let host = ("host", "127.0.0.1:8767");
        assert!(same_origin(&with(&[host])));
        assert!(same_origin(&with(&[
            host,
            ("origin", "http://127.0.0.1:8767"),
            ("sec-fetch-site", "same-origin"),
        ])));
        assert!(same_origin(&with(&[
            host,
            ("origin", "https://127.0.0.1:8767")
        ])));
        assert!(!same_origin(&with(&[
            host,
            ("origin", "http://evil.example")
        ])));
        assert!(!same_origin(&with(&[host, ("origin", "null")])));
        assert!(!same_origin(&with(&[
            host,
            ("sec-fetch-site", "cross-site")
        ])));
        assert!(!same_origin(&with(&[
            host,
            ("sec-fetch-site", "same-site")
        ])));
        assert!(!same_origin(&with(&[("origin", "http://127.0.0.1:8767")])));
    }
}
