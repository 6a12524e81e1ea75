//! Authentication to an HTTP MCP server, at use: the declared scheme
//! (`bearer`, `header`, `oauth2_client` or `none`), the reference resolved
//! through the credential resolver, and for `oauth2_client` a
//! client-credentials exchange at the token endpoint through egress, its
//! token kept with its expiry and exchanged again when fewer than sixty
//! seconds remain. No timer and no refresh token: expiry is checked where
//! the header is built. The value is revealed in one place, the header.

use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Utc};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Bytes;
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST, HeaderName, HeaderValue};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;

use super::grant::{Delegate, RegisteredClient};
use crate::domain::egress::{EgressUrl, Scheme};
use crate::domain::mcp_server::AuthScheme;
use crate::domain::secret::CredentialRef;
use crate::domain::{ReasonCode, SecretValue};
use crate::ports::{Clock, CredentialResolver, EgressDialer};

/// A token within this many seconds of its expiry is exchanged again.
const EXPIRY_SKEW_SECONDS: i64 = 60;
/// The largest token endpoint answer read.
const MAXIMUM_TOKEN_RESPONSE: usize = 64 << 10;

/// Why no credential could be had. Nothing a server said is in a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The reference did not resolve.
    #[error("the credential reference did not resolve")]
    Unresolved,
    /// The token endpoint could not be reached.
    #[error("the token endpoint could not be reached")]
    Unreachable,
    /// The token endpoint refused the client (invalid_client and the like).
    #[error("the token endpoint refused the client")]
    Refused,
    /// The token endpoint answered something that is not a token.
    #[error("the token endpoint's answer is not a token")]
    Malformed,
    /// The server takes each principal's own grant, which a connection
    /// shared by the tenant's sessions does not carry.
    #[error("the server takes each principal's own grant")]
    Delegated,
    /// The principal holds no grant at the server (or one its
    /// authorization server no longer honours): it consents first.
    #[error("the principal has not consented at the server")]
    ConsentRequired,
    /// No token of the principal's from the identity provider is held to
    /// exchange: it did not come through the front door with one, or it
    /// expired.
    #[error("no identity-provider token of the principal is held to exchange")]
    NoSubject,
}

impl AuthError {
    /// The code a connection or a call ends with when this is why it had
    /// no credential.
    pub fn reason_code(&self) -> ReasonCode {
        match self {
            AuthError::Unreachable => ReasonCode::ToolServerUnreachable,
            AuthError::Unresolved | AuthError::Refused | AuthError::Malformed => {
                ReasonCode::ToolAuthFailed
            }
            AuthError::Delegated => ReasonCode::ToolAuthUnsupported,
            AuthError::ConsentRequired => ReasonCode::ToolConsentRequired,
            AuthError::NoSubject => ReasonCode::ToolAuthFailed,
        }
    }
}

/// How one server authenticates us.
#[derive(Debug, Clone)]
pub struct AuthSettings {
    /// The declared scheme.
    pub scheme: AuthScheme,
    /// The header, for `header`.
    pub name: Option<String>,
    /// Where the token, or the client id and secret, live.
    pub credential_ref: Option<CredentialRef>,
    /// `oauth2_client` only.
    pub token_endpoint: Option<String>,
    /// `oauth2_client` only.
    pub token_scopes: Vec<String>,
}

#[derive(Clone, Debug)]
pub(super) struct Held {
    pub(super) value: SecretValue,
    pub(super) expires_at: Option<DateTime<Utc>>,
}

/// One server's credential, obtained at use.
pub struct Authenticator {
    settings: AuthSettings,
    /// For `oauth2_user`: whose grant this connection carries.
    delegate: Option<Delegate>,
    resolver: Arc<dyn CredentialResolver>,
    dialer: Arc<dyn EgressDialer>,
    clock: Arc<dyn Clock>,
    held: Mutex<Option<Held>>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("scheme", &self.settings.scheme)
            .finish_non_exhaustive()
    }
}

impl Authenticator {
    /// An authenticator for `settings`.
    pub fn new(
        settings: AuthSettings,
        resolver: Arc<dyn CredentialResolver>,
        dialer: Arc<dyn EgressDialer>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Authenticator {
            settings,
            delegate: None,
            resolver,
            dialer,
            clock,
            held: Mutex::new(None),
        }
    }

    /// The same, carrying `delegate`'s grant (`oauth2_user`).
    pub fn delegated(mut self, delegate: Delegate) -> Self {
        self.delegate = Some(delegate);
        self
    }

    /// The scheme, for events.
    pub fn scheme(&self) -> AuthScheme {
        self.settings.scheme
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Option<Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The value in use, for scrubbing what a server returns.
    pub fn current(&self) -> Option<SecretValue> {
        self.held().as_ref().map(|held| held.value.clone())
    }

    /// The header a request carries: the held value while it is fresh,
    /// else a new one.
    pub async fn header(&self) -> Result<Option<(HeaderName, HeaderValue)>, AuthError> {
        if self.settings.scheme == AuthScheme::None {
            return Ok(None);
        }
        // A principal's grant is read at every request: a revocation, on
        // any node, holds from the next one.
        let fresh = self
            .held()
            .clone()
            .filter(|_| self.delegate.is_none())
            .filter(|held| {
                held.expires_at.is_none_or(|expires_at| {
                    expires_at
                        .checked_sub_signed(chrono::Duration::seconds(EXPIRY_SKEW_SECONDS))
                        .is_some_and(|renew_at| renew_at > self.clock.now())
                })
            });
        let held = match fresh {
            Some(held) => held,
            None => {
                let held = self.obtain().await?;
                *self.held() = Some(held.clone());
                held
            }
        };
        self.render(&held.value).map(Some)
    }

    /// Drops the held value, so the next request resolves (or exchanges)
    /// it again: after the server refused it at connect, where no ladder
    /// runs, a rotated secret is read at the next dial.
    pub fn forget(&self) {
        *self.held() = None;
    }

    /// Ladder step 2: the held value is dropped and a new one obtained (a
    /// new exchange for `oauth2_client`, the reference resolved again for
    /// the others). Returns whether it differs from the value that failed:
    /// a byte-identical one ends the ladder.
    pub async fn renew(&self) -> Result<bool, AuthError> {
        let failed = self.held().take().map(|held| held.value);
        let renewed = self.obtain_after(failed.as_ref()).await?;
        let differs = failed.is_none_or(|failed| failed != renewed.value);
        *self.held() = Some(renewed);
        Ok(differs)
    }

    fn render(&self, value: &SecretValue) -> Result<(HeaderName, HeaderValue), AuthError> {
        let (name, text) = match self.settings.scheme {
            AuthScheme::Header => (
                self.settings
                    .name
                    .as_deref()
                    .and_then(|name| HeaderName::from_bytes(name.as_bytes()).ok())
                    .ok_or(AuthError::Malformed)?,
                // One of the two places a credential is revealed: the
                // request's header.
                value.reveal().to_owned(),
            ),
            _ => (AUTHORIZATION, format!("Bearer {}", value.reveal())),
        };
        let mut header = HeaderValue::from_str(&text).map_err(|_| AuthError::Malformed)?;
        header.set_sensitive(true);
        Ok((name, header))
    }

    async fn obtain(&self) -> Result<Held, AuthError> {
        self.obtain_after(None).await
    }

    /// A value, after the server refused `failed` (a grant's access token
    /// it refused is refreshed rather than sent again).
    async fn obtain_after(&self, failed: Option<&SecretValue>) -> Result<Held, AuthError> {
        // The reference names the client (none for toolgate's own client
        // document), which is never a bearer: only a principal's grant is.
        if self.settings.scheme == AuthScheme::Oauth2User {
            let delegate = self.delegate.as_ref().ok_or(AuthError::Delegated)?;
            // Unresolved, a grant given to toolgate's client document is
            // still refreshed; a registered client's refresh then fails.
            let client = match &self.settings.credential_ref {
                Some(reference) => match self.resolver.resolve(reference).await {
                    Ok(value) => RegisteredClient::Resolved(value),
                    Err(_) => RegisteredClient::Unresolved,
                },
                None => RegisteredClient::Unnamed,
            };
            return delegate
                .token(&client, self.dialer.as_ref(), self.clock.as_ref(), failed)
                .await;
        }
        let reference = self
            .settings
            .credential_ref
            .as_ref()
            .ok_or(AuthError::Unresolved)?;
        let value = self
            .resolver
            .resolve(reference)
            .await
            .map_err(|_| AuthError::Unresolved)?;
        if self.settings.scheme != AuthScheme::Oauth2Client {
            return Ok(Held {
                value,
                expires_at: None,
            });
        }
        self.exchange(&value).await
    }

    /// The client-credentials grant: the client id and secret (the
    /// resolved value, `id:secret`) as HTTP Basic authentication.
    async fn exchange(&self, client: &SecretValue) -> Result<Held, AuthError> {
        let endpoint = self
            .settings
            .token_endpoint
            .as_deref()
            .ok_or(AuthError::Unreachable)?;
        let mut body = "grant_type=client_credentials".to_owned();
        if !self.settings.token_scopes.is_empty() {
            body.push_str("&scope=");
            body.push_str(&form_encode(&self.settings.token_scopes.join(" ")));
        }
        let (id, secret) = client
            .reveal()
            .split_once(':')
            .ok_or(AuthError::Unresolved)?;
        let headers = vec![(AUTHORIZATION, basic(id, secret)?)];
        let (status, bytes) = send(
            self.dialer.as_ref(),
            Method::POST,
            endpoint,
            headers,
            Some(body),
            MAXIMUM_TOKEN_RESPONSE,
        )
        .await?;
        if status == StatusCode::BAD_REQUEST || status == StatusCode::UNAUTHORIZED {
            return Err(AuthError::Refused);
        }
        if !status.is_success() {
            return Err(AuthError::Unreachable);
        }
        token_answer(&bytes, self.clock.now())
    }
}

/// HTTP Basic authentication of a client (RFC 6749 §2.3.1: each part
/// form-encoded first), marked sensitive.
pub(super) fn basic(id: &str, secret: &str) -> Result<HeaderValue, AuthError> {
    let basic =
        crate::domain::base64(format!("{}:{}", form_encode(id), form_encode(secret)).as_bytes());
    let mut header =
        HeaderValue::from_str(&format!("Basic {basic}")).map_err(|_| AuthError::Malformed)?;
    header.set_sensitive(true);
    Ok(header)
}

/// One request through egress, on a connection of its own that ends with
/// it, bounded by [`TOKEN_EXCHANGE_TIMEOUT`] once connected: its status and
/// at most `limit` bytes of its body. A form body when `body` is given.
pub(super) async fn send(
    dialer: &dyn EgressDialer,
    method: Method,
    url: &str,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Option<String>,
    limit: usize,
) -> Result<(StatusCode, Bytes), AuthError> {
    let body = body.map(|body| ("application/x-www-form-urlencoded", body));
    let answer = request(dialer, method, url, headers, body, limit).await?;
    Ok((answer.status, answer.body))
}

/// What a [`request`] was answered with.
pub(super) struct Answer {
    pub(super) status: StatusCode,
    pub(super) headers: hyper::HeaderMap,
    pub(super) body: Bytes,
}

/// As [`send`], the body of its content type, the answer's headers kept.
pub(super) async fn request(
    dialer: &dyn EgressDialer,
    method: Method,
    url: &str,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Option<(&'static str, String)>,
    limit: usize,
) -> Result<Answer, AuthError> {
    let dialed = dialer.dial(url).await.map_err(|_| AuthError::Unreachable)?;
    let (mut sender, connection) = bounded(hyper::client::conn::http1::handshake(TokioIo::new(
        dialed.stream,
    )))
    .await?
    .map_err(|_| AuthError::Unreachable)?;
    let connection = tokio::spawn(connection);
    let mut request = Request::builder()
        .method(method)
        .uri(path_of(url))
        .header(HOST, host_of(&dialed.url));
    if !headers.iter().any(|(name, _)| name == ACCEPT) {
        request = request.header(ACCEPT, "application/json");
    }
    let body = match body {
        Some((content_type, body)) => {
            request = request.header(CONTENT_TYPE, content_type);
            body
        }
        None => String::new(),
    };
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let request = request
        .body(Full::new(Bytes::from(body)))
        .map_err(|_| AuthError::Malformed)?;
    let answered = bounded(async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|_| AuthError::Unreachable)?;
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, limit)
            .collect()
            .await
            .map_err(|_| AuthError::Malformed)?
            .to_bytes();
        Ok::<_, AuthError>(Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    })
    .await;
    connection.abort();
    answered?
}

/// The longest a token is held before it is asked for again, whatever its
/// endpoint says: every number from outside is clamped.
const MAXIMUM_TOKEN_LIFETIME_SECONDS: i64 = 24 * 60 * 60;

/// A token endpoint's answer, read at `now`: its access token, held until
/// `expires_in` (clamped to zero and [`MAXIMUM_TOKEN_LIFETIME_SECONDS`]; a
/// fractional or out-of-range number is clamped too, any other is refused).
pub(super) fn token_answer(bytes: &[u8], now: DateTime<Utc>) -> Result<Held, AuthError> {
    let token: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|_| AuthError::Malformed)?;
    let access = token
        .get("access_token")
        .and_then(serde_json::Value::as_str)
        .filter(|token| !token.is_empty())
        .ok_or(AuthError::Malformed)?;
    let expires_in = match token.get("expires_in") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::Number(number)) => {
            let seconds = number.as_f64().ok_or(AuthError::Malformed)?;
            // NaN cannot come from JSON; a float past i64 saturates in the
            // cast, and the clamp bounds it either way.
            Some((seconds as i64).clamp(0, MAXIMUM_TOKEN_LIFETIME_SECONDS))
        }
        Some(_) => return Err(AuthError::Malformed),
    };
    Ok(Held {
        value: SecretValue::new(access),
        expires_at: expires_in
            .and_then(|seconds| now.checked_add_signed(chrono::Duration::seconds(seconds))),
    })
}

/// The longest a token exchange may take once its connection is made (the
/// dialer bounds connecting and TLS): a token endpoint that accepts and
/// then stays silent fails the exchange instead of holding the call.
const TOKEN_EXCHANGE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `future` within [`TOKEN_EXCHANGE_TIMEOUT`].
async fn bounded<T>(future: impl Future<Output = T>) -> Result<T, AuthError> {
    tokio::time::timeout(TOKEN_EXCHANGE_TIMEOUT, future)
        .await
        .map_err(|_| AuthError::Unreachable)
}

/// The path and query of `url` (the request target of an origin-form
/// request): the authority ends at the first `/`, `?` or `#`, as
/// `EgressUrl::parse` reads it; a fragment is never sent.
pub fn path_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.split_once('#').map_or(rest, |(before, _)| before);
    match rest.find(['/', '?']) {
        Some(index) if rest[index..].starts_with('/') => rest[index..].to_owned(),
        Some(index) => format!("/{}", &rest[index..]),
        None => "/".to_owned(),
    }
}

/// `host[:port]` as a `Host` header names it: IPv6 bracketed, the
/// scheme's default port left out.
pub fn host_of(url: &EgressUrl) -> String {
    let host = if url.host.contains(':') {
        format!("[{}]", url.host)
    } else {
        url.host.clone()
    };
    match (url.scheme, url.port) {
        (Scheme::Https, 443) | (Scheme::Http, 80) => host,
        (_, port) => format!("{host}:{port}"),
    }
}

/// `application/x-www-form-urlencoded` for one value.
pub(super) fn form_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(char::from(byte));
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).unwrap()
    }

    #[test]
    fn an_expiry_from_outside_is_clamped() {
        let held = |body: &str| token_answer(body.as_bytes(), at());
        let expiry = |body: &str| held(body).unwrap().expires_at;
        let day = at() + chrono::Duration::seconds(MAXIMUM_TOKEN_LIFETIME_SECONDS);
        assert_eq!(
            expiry(r#"{"access_token":"t","expires_in":9223372036854775807}"#),
            Some(day)
        );
        assert_eq!(
            expiry(r#"{"access_token":"t","expires_in":1e300}"#),
            Some(day)
        );
        assert_eq!(
            expiry(r#"{"access_token":"t","expires_in":-5}"#),
            Some(at())
        );
        assert_eq!(
            expiry(r#"{"access_token":"t","expires_in":3600}"#),
            Some(at() + chrono::Duration::seconds(3600))
        );
        assert_eq!(expiry(r#"{"access_token":"t"}"#), None);
        assert_eq!(
            held(r#"{"access_token":"t","expires_in":"3600"}"#).unwrap_err(),
            AuthError::Malformed
        );
        assert_eq!(
            held(r#"{"access_token":""}"#).unwrap_err(),
            AuthError::Malformed
        );
    }

    proptest! {
        /// Whatever a token endpoint answers, reading it never panics, and
        /// a token it gives is held at most a day.
        #[test]
        fn any_token_answer_is_read_without_panicking(
            expires in proptest::num::f64::ANY,
            integer in any::<i64>(),
            text in ".{0,40}",
            shape in 0u8..5,
        ) {
            let body = match shape {
                0 => format!(r#"{{"access_token":"t","expires_in":{integer}}}"#),
                1 if expires.is_finite() => format!(r#"{{"access_token":"t","expires_in":{expires}}}"#),
                2 => format!(r#"{{"access_token":{},"expires_in":{integer}}}"#, serde_json::Value::String(text.clone())),
                3 => text.clone(),
                _ => format!(r#"{{"access_token":"t","expires_in":{}}}"#, serde_json::Value::String(text.clone())),
            };
            if let Ok(held) = token_answer(body.as_bytes(), at()) {
                let latest = at() + chrono::Duration::seconds(MAXIMUM_TOKEN_LIFETIME_SECONDS);
                prop_assert!(held.expires_at.is_none_or(|expires| expires >= at() && expires <= latest));
            }
        }
    }

    /// A clock the test sets.
    struct Manual(Mutex<DateTime<Utc>>);

    impl Manual {
        fn set(&self, now: DateTime<Utc>) {
            *self.0.lock().unwrap() = now;
        }
    }

    impl Clock for Manual {
        fn now(&self) -> DateTime<Utc> {
            *self.0.lock().unwrap()
        }
    }

    /// The client's id and secret, whatever the reference.
    struct Client;

    impl CredentialResolver for Client {
        fn resolve<'a>(
            &'a self,
            _: &'a CredentialRef,
        ) -> crate::ports::BoxFuture<'a, Result<SecretValue, crate::ports::CredentialError>>
        {
            Box::pin(async { Ok(SecretValue::new("toolgate:s3cr3t")) })
        }
    }

    /// A token endpoint in memory: every exchange answers a new token that
    /// expires in `TOKEN_LIFETIME` seconds, and is counted.
    struct TokenEndpoint(Arc<std::sync::atomic::AtomicUsize>);

    const TOKEN_LIFETIME: i64 = 120;

    impl EgressDialer for TokenEndpoint {
        fn dial<'a>(
            &'a self,
            url: &'a str,
        ) -> crate::ports::BoxFuture<'a, Result<crate::ports::Dialed, crate::ports::DialError>>
        {
            Box::pin(async move {
                let (client, server) = tokio::io::duplex(4096);
                let exchanges = self.0.clone();
                let answer = hyper::service::service_fn(move |_| {
                    let issued = exchanges.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    let body = format!(
                        r#"{{"access_token":"token-{issued}","expires_in":{TOKEN_LIFETIME}}}"#
                    );
                    async move {
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                            Bytes::from(body),
                        )))
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(server), answer),
                );
                Ok(crate::ports::Dialed {
                    stream: Box::new(client),
                    url: EgressUrl::parse(url).unwrap(),
                })
            })
        }
    }

    /// Decision 22: expiry is checked at use, and a token with sixty
    /// seconds or fewer left is exchanged again before it is sent.
    #[tokio::test]
    async fn an_oauth_token_is_exchanged_again_once_sixty_seconds_remain() {
        let issued = at();
        let clock = Arc::new(Manual(Mutex::new(issued)));
        let exchanges = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let authenticator = Authenticator::new(
            AuthSettings {
                scheme: AuthScheme::Oauth2Client,
                name: None,
                credential_ref: Some(CredentialRef::parse("env:CLIENT").unwrap()),
                token_endpoint: Some("http://auth.example.com/token".into()),
                token_scopes: Vec::new(),
            },
            Arc::new(Client),
            Arc::new(TokenEndpoint(exchanges.clone())),
            clock.clone(),
        );
        let bearer = || async {
            let (name, value) = authenticator.header().await.unwrap().unwrap();
            assert_eq!(name, AUTHORIZATION);
            value.to_str().unwrap().to_owned()
        };
        let exchanged = || exchanges.load(std::sync::atomic::Ordering::SeqCst);
        let after = |seconds: i64| issued + chrono::Duration::seconds(seconds);
        // The design's number, not the constant: a changed skew fails here.
        const SKEW: i64 = 60;
        assert_eq!(bearer().await, "Bearer token-1");
        // Held while more than sixty seconds remain.
        clock.set(after(TOKEN_LIFETIME - SKEW - 1));
        assert_eq!(bearer().await, "Bearer token-1");
        assert_eq!(exchanged(), 1);
        // Sixty left: exchanged again, not sent to expire on the way.
        clock.set(after(TOKEN_LIFETIME - SKEW));
        assert_eq!(bearer().await, "Bearer token-2");
        assert_eq!(exchanged(), 2);
        // The new token's expiry runs from its own exchange.
        clock.set(after(2 * (TOKEN_LIFETIME - SKEW) - 1));
        assert_eq!(bearer().await, "Bearer token-2");
        assert_eq!(exchanged(), 2);
    }

    #[test]
    fn base64_and_form_encoding_follow_their_rfcs() {
        assert_eq!(crate::domain::base64(b""), "");
        assert_eq!(crate::domain::base64(b"f"), "Zg==");
        assert_eq!(crate::domain::base64(b"fo"), "Zm8=");
        assert_eq!(crate::domain::base64(b"foo"), "Zm9v");
        assert_eq!(
            crate::domain::base64(b"client:s3cr3t"),
            "Y2xpZW50OnMzY3IzdA=="
        );
        assert_eq!(form_encode("read write:x/y"), "read+write%3Ax%2Fy");
        assert_eq!(path_of("https://a.example/t?x=1"), "/t?x=1");
        assert_eq!(path_of("https://a.example"), "/");
        assert_eq!(path_of("https://a.example?x=1"), "/?x=1");
        assert_eq!(path_of("https://a.example/t#frag"), "/t");
        assert_eq!(path_of("https://a.example#f/g"), "/");
    }
}
