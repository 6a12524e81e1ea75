//! Who is signed in: operators' tokens checked against their hashes in
//! constant time, sessions held in memory by the hash of their cookie, a
//! CSRF token per session, and the same-origin check on every POST.
//!
//! Sessions live on the node that signed the operator in: behind a load
//! balancer the console needs sticky sessions, and a restart signs
//! everyone out (the token is all it takes to sign in again).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use hyper::HeaderMap;
use hyper::header::{COOKIE, HOST, ORIGIN};
use tokio::time::Instant;

use crate::domain::sha256_hex;
use crate::edge::constant_time_eq;

/// The cookie's name.
pub(super) const COOKIE_NAME: &str = "toolgate_console";
/// Sessions held at once; past it the oldest is signed out, so signing in
/// in a loop cannot grow memory.
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
    expires: Instant,
}

/// The operators and their sessions.
pub(super) struct Sessions {
    operators: Vec<Operator>,
    lifetime: Duration,
    /// By the sha256 of the cookie's value: the memory holds no cookie.
    held: Mutex<HashMap<String, Session>>,
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
    pub(super) fn new(operators: Vec<Operator>, lifetime: Duration) -> Self {
        Sessions {
            operators,
            lifetime,
            held: Mutex::new(HashMap::new()),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The operator whose token this is. Every operator's hash is compared,
    /// each in constant time, so the time taken says nothing of which
    /// matched.
    pub(super) fn operator(&self, token: &str) -> Option<String> {
        let presented = sha256_hex(token.as_bytes());
        let mut found = None;
        for operator in &self.operators {
            if constant_time_eq(presented.as_bytes(), operator.sha256.as_bytes()) {
                found = Some(operator.name.clone());
            }
        }
        found
    }

    /// A new session for `operator`: the cookie's value.
    pub(super) fn open(&self, operator: String) -> String {
        let cookie = random_token();
        let now = Instant::now();
        let mut held = self.held();
        held.retain(|_, session| session.expires > now);
        if held.len() >= MAXIMUM_SESSIONS
            && let Some(oldest) = held
                .iter()
                .min_by_key(|(_, session)| session.expires)
                .map(|(key, _)| key.clone())
        {
            held.remove(&oldest);
        }
        held.insert(
            sha256_hex(cookie.as_bytes()),
            Session {
                operator,
                csrf: random_token(),
                expires: now + self.lifetime,
            },
        );
        cookie
    }

    /// The live session the request's cookie names.
    pub(super) fn session(&self, headers: &HeaderMap) -> Option<Session> {
        let cookie = cookie(headers)?;
        let key = sha256_hex(cookie.as_bytes());
        let mut held = self.held();
        match held.get(&key) {
            Some(session) if session.expires > Instant::now() => Some(session.clone()),
            Some(_) => {
                held.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Ends the session the request's cookie names.
    pub(super) fn close(&self, headers: &HeaderMap) {
        if let Some(cookie) = cookie(headers) {
            self.held().remove(&sha256_hex(cookie.as_bytes()));
        }
    }

    /// How long a session lasts, for the cookie's `Max-Age`.
    pub(super) fn lifetime(&self) -> Duration {
        self.lifetime
    }
}

/// The console cookie's value, if the request carries it.
fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE_NAME)
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

    fn sessions() -> Sessions {
        Sessions::new(
            vec![Operator {
                name: "ana".into(),
                sha256: sha256_hex(b"right"),
            }],
            Duration::from_secs(60),
        )
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
        let sessions = sessions();
        assert_eq!(sessions.operator("right").as_deref(), Some("ana"));
        assert_eq!(sessions.operator("wrong"), None);
        assert_eq!(sessions.operator(""), None);
    }

    #[test]
    fn a_session_is_found_by_its_cookie_and_ends_when_closed() {
        let sessions = sessions();
        let cookie = sessions.open("ana".into());
        let headers = with(&[("cookie", &format!("a=b; {COOKIE_NAME}={cookie}"))]);
        let session = sessions.session(&headers).unwrap();
        assert_eq!(session.operator, "ana");
        assert!(csrf_matches(&session, Some(&session.csrf.clone())));
        assert!(!csrf_matches(&session, Some("forged")));
        assert!(!csrf_matches(&session, None));
        sessions.close(&headers);
        assert!(sessions.session(&headers).is_none());
        assert!(
            sessions
                .session(&with(&[("cookie", "toolgate_console=guess")]))
                .is_none()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_ends_with_its_lifetime() {
        let sessions = sessions();
        let cookie = sessions.open("ana".into());
        let headers = with(&[("cookie", &format!("{COOKIE_NAME}={cookie}"))]);
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(sessions.session(&headers).is_none());
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
