//! `oauth2_user`: the authorization-code flow with PKCE (S256) that asks a
//! person's upstream account for a grant, and the grant's custody.
//!
//! Discovery follows the MCP authorization specification: the server's
//! protected-resource metadata (RFC 9728) where its 401 to a request
//! without a token says (`WWW-Authenticate: Bearer resource_metadata=…`),
//! else at the path-inserted well-known URL, then the root; its first
//! authorization server, whose metadata (RFC 8414, then OpenID discovery)
//! must name that issuer and offer S256. Toolgate is the client the
//! server's `credential_ref` names (pre-registered), or else its own
//! Client ID Metadata Document, which the authorization server must say
//! it takes; it never registers itself dynamically.
//! The request carries a single-use `state`, the exact redirect URI and
//! the resource indicator (RFC 8707) naming the server; the answer's `iss`
//! (RFC 9207) must be the issuer asked, and its state must be one this
//! browser began. Every metadata and token request is dialled through
//! egress. The verifier and the tokens are sealed before they are stored.

use std::sync::Arc;
use std::time::Duration;

use hyper::header::{ACCEPT, AUTHORIZATION, HeaderValue, WWW_AUTHENTICATE};
use hyper::{Method, StatusCode};
use serde_json::Value;
use sha2::Digest as _;

use super::auth::{AuthError, basic, form_encode, request, send, token_answer};
use super::grant::{Custody, Tokens, same_resource};
use super::server::HttpServerSettings;
use super::servers::McpServerSet;
use crate::domain::egress::secure_or_loopback;
use crate::domain::{SecretValue, sha256_hex};
use crate::ports::{
    BoxFuture, Clock, Consent, ConsentAnswer, ConsentError, ConsentFlow, ConsentStart,
    CredentialResolver, Delegator, EgressDialer, GrantStore, Granted, Revocation, Revoked,
    UpstreamGrant,
};

/// The largest metadata document or token answer read.
const MAXIMUM_DOCUMENT: usize = 64 << 10;
/// Flows one principal may have outstanding; past it the oldest goes.
const OUTSTANDING_FLOWS: usize = 16;

/// How consent is served.
#[derive(Debug, Clone)]
pub struct ConsentSettings {
    /// Where the authorization server sends the person back: the consent
    /// pages' public origin and `/consent/callback`, registered exactly.
    pub redirect_uri: String,
    /// How long a flow waits for its answer.
    pub flow_lifetime: Duration,
    /// Toolgate's Client ID Metadata Document's URL (the consent pages'
    /// `/consent/client.json`): its client id where a server names no
    /// registered client.
    pub client_document: String,
}

/// Who toolgate is to an authorization server.
enum Client {
    /// Registered there: its id and secret (empty for a public client).
    Registered { id: String, secret: String },
    /// Its Client ID Metadata Document's URL: a public client.
    Document(String),
}

impl Client {
    /// The client authentication a token or revocation request carries:
    /// HTTP Basic for a confidential client, else its id in the form.
    fn authenticate(
        &self,
        body: &mut String,
        headers: &mut Vec<(hyper::header::HeaderName, HeaderValue)>,
    ) -> Result<(), AuthError> {
        let (id, secret) = match self {
            Client::Registered { id, secret } => (id.as_str(), secret.as_str()),
            Client::Document(url) => (url.as_str(), ""),
        };
        if secret.is_empty() {
            body.push_str("&client_id=");
            body.push_str(&form_encode(id));
        } else {
            headers.push((AUTHORIZATION, basic(id, secret)?));
        }
        Ok(())
    }

    fn id(&self) -> &str {
        match self {
            Client::Registered { id, .. } => id,
            Client::Document(url) => url,
        }
    }

    /// The document's URL, when it is toolgate's own document.
    fn document(&self) -> Option<String> {
        match self {
            Client::Registered { .. } => None,
            Client::Document(url) => Some(url.clone()),
        }
    }
}

/// The consent flows and grants of every `oauth2_user` server of a runtime.
pub struct Delegations {
    servers: Arc<McpServerSet>,
    custody: Custody,
    resolver: Arc<dyn CredentialResolver>,
    clock: Arc<dyn Clock>,
    settings: ConsentSettings,
}

impl Delegations {
    /// Consent over `servers`' `oauth2_user` servers, keeping grants in
    /// `custody`.
    pub fn new(
        servers: Arc<McpServerSet>,
        custody: Custody,
        resolver: Arc<dyn CredentialResolver>,
        clock: Arc<dyn Clock>,
        settings: ConsentSettings,
    ) -> Self {
        Delegations {
            servers,
            custody,
            resolver,
            clock,
            settings,
        }
    }

    async fn server(
        &self,
        tenant_id: &str,
        server_id: &str,
    ) -> Result<HttpServerSettings, ConsentError> {
        self.servers
            .delegated(tenant_id, server_id)
            .await
            .ok_or(ConsentError::NoSuchServer)
    }

    /// The client the server's reference names (its id and secret, empty
    /// for a public client); none when it names none.
    async fn registered(
        &self,
        settings: &HttpServerSettings,
    ) -> Result<Option<Client>, ConsentError> {
        let Some(reference) = settings.auth.credential_ref.as_ref() else {
            return Ok(None);
        };
        let value = self
            .resolver
            .resolve(reference)
            .await
            .map_err(|_| ConsentError::Unavailable("the client's credential"))?;
        let (id, secret) = value
            .reveal()
            .split_once(':')
            .ok_or(ConsentError::Unavailable("the client's credential"))?;
        if id.is_empty() {
            return Err(ConsentError::Unavailable("the client's credential"));
        }
        Ok(Some(Client::Registered {
            id: id.to_owned(),
            secret: secret.to_owned(),
        }))
    }

    /// The client a flow or a grant was begun as: toolgate's document when
    /// it says so, else the server's registered client.
    async fn client_of(
        &self,
        settings: &HttpServerSettings,
        document: Option<&str>,
    ) -> Result<Client, ConsentError> {
        match document {
            Some(url) => Ok(Client::Document(url.to_owned())),
            None => self
                .registered(settings)
                .await?
                .ok_or(ConsentError::Unavailable("the client's credential")),
        }
    }
}

/// 244 random bits as hex: two v4 UUIDs, from the operating system's
/// CSPRNG. Within PKCE's verifier alphabet and length.
fn random_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// What a verifier is sealed for: its own flow.
fn verifier_context(state_sha256: &str) -> Vec<u8> {
    format!("toolgate consent verifier\0{state_sha256}").into_bytes()
}

/// `scheme://authority` and the path (no query or fragment) of `url`.
fn split_url(url: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    if scheme != "https" && scheme != "http" {
        return None;
    }
    let end = rest.find(['?', '#']).unwrap_or(rest.len());
    let rest = &rest[..end];
    let authority = rest.find('/').unwrap_or(rest.len());
    let origin_end = scheme.len() + 3 + authority;
    Some((&url[..origin_end], rest[authority..].trim_end_matches('/')))
}

/// What discovery found.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AuthorizationServer {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    /// Where it revokes tokens (RFC 7009), if it says.
    revocation_endpoint: Option<String>,
    /// Whether it takes a Client ID Metadata Document's URL as a client id.
    client_documents: bool,
    resource: String,
    iss_required: bool,
    /// What the server's challenge asked for, else what its metadata
    /// offers.
    scopes: Vec<String>,
}

/// The `Bearer` challenge's parameters among a `WWW-Authenticate` value's
/// challenges (RFC 9110 §11.6.1), names lowercased; none when it has no
/// `Bearer` challenge. What it cannot read is skipped to the next comma.
fn bearer_challenge(value: &str) -> Option<Vec<(String, String)>> {
    let token_end = |text: &str| {
        text.find(|c: char| !(c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)))
            .unwrap_or(text.len())
    };
    let mut rest = value;
    let mut bearer: Option<Vec<(String, String)>> = None;
    let mut current_is_bearer = false;
    loop {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        let end = token_end(rest);
        if end == 0 {
            // Not a token (another scheme's token68, a stray character):
            // skipped to the next element.
            match rest.find(',') {
                Some(comma) => {
                    rest = &rest[comma..];
                    continue;
                }
                None => break,
            }
        }
        let token = &rest[..end];
        let after = rest[end..].trim_start_matches([' ', '\t']);
        if let Some(after) = after.strip_prefix('=') {
            let after = after.trim_start_matches([' ', '\t']);
            let (parameter, remaining) = if let Some(quoted) = after.strip_prefix('"') {
                let mut text = String::new();
                let mut chars = quoted.char_indices();
                let mut closed = None;
                while let Some((at, c)) = chars.next() {
                    match c {
                        '\\' => match chars.next() {
                            Some((_, escaped)) => text.push(escaped),
                            None => break,
                        },
                        '"' => {
                            closed = Some(at + 1);
                            break;
                        }
                        c => text.push(c),
                    }
                }
                let Some(closed) = closed else { break };
                (text, &quoted[closed..])
            } else {
                let end = after.find([',', ' ', '\t']).unwrap_or(after.len());
                (after[..end].to_owned(), &after[end..])
            };
            if current_is_bearer && let Some(parameters) = bearer.as_mut() {
                parameters.push((token.to_ascii_lowercase(), parameter));
            }
            rest = remaining;
        } else {
            current_is_bearer = token.eq_ignore_ascii_case("bearer");
            if current_is_bearer && bearer.is_none() {
                bearer = Some(Vec::new());
            }
            rest = after;
        }
    }
    bearer
}

/// What the server's 401 to a request without a token says: its
/// protected-resource metadata's URL and the scopes it asks for.
#[derive(Debug, Default, PartialEq, Eq)]
struct Challenge {
    resource_metadata: Option<String>,
    scopes: Vec<String>,
}

/// The first thing a client sends: what the server's 401 answers.
const PROBE: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"toolgate","version":"consent"}}}"#;

/// Asks the server, without a token, what its 401 says (the MCP
/// authorization specification's first step): no challenge when it answers
/// anything else, or cannot be reached (the well-known URLs are tried).
async fn challenge(dialer: &dyn EgressDialer, server_url: &str) -> Challenge {
    let accept = HeaderValue::from_static("application/json, text/event-stream");
    let Ok(answer) = request(
        dialer,
        Method::POST,
        server_url,
        vec![(ACCEPT, accept)],
        Some(("application/json", PROBE.to_owned())),
        MAXIMUM_DOCUMENT,
    )
    .await
    else {
        return Challenge::default();
    };
    if answer.status != StatusCode::UNAUTHORIZED {
        return Challenge::default();
    }
    let parameters: Vec<(String, String)> = answer
        .headers
        .get_all(WWW_AUTHENTICATE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .filter_map(bearer_challenge)
        .flatten()
        .collect();
    let named = |name: &str| {
        parameters
            .iter()
            .find(|(given, _)| given == name)
            .map(|(_, value)| value.clone())
    };
    Challenge {
        resource_metadata: named("resource_metadata")
            .filter(|url| secure_or_loopback(url) && !url.contains('#')),
        scopes: named("scope")
            .map(|scope| scope_list(&scope))
            .unwrap_or_default(),
    }
}

/// A metadata document at `url`: `None` when it is not there (any status
/// but 200), an error when it cannot be had or read.
async fn document(dialer: &dyn EgressDialer, url: &str) -> Result<Option<Value>, ConsentError> {
    let (status, bytes) = send(dialer, Method::GET, url, Vec::new(), None, MAXIMUM_DOCUMENT)
        .await
        .map_err(|error| match error {
            AuthError::Malformed => ConsentError::Metadata("a document is too large"),
            _ => ConsentError::Unavailable("the server's authorization metadata"),
        })?;
    if status != StatusCode::OK {
        return Ok(None);
    }
    serde_json::from_slice::<Value>(&bytes)
        .ok()
        .filter(Value::is_object)
        .map(Some)
        .ok_or(ConsentError::Metadata("a document is not a JSON object"))
}

/// The first of `candidates` that is there.
async fn first_document(
    dialer: &dyn EgressDialer,
    candidates: impl IntoIterator<Item = String>,
) -> Result<Option<Value>, ConsentError> {
    for candidate in candidates {
        if let Some(found) = document(dialer, &candidate).await? {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

/// A space-separated scope parameter's scopes.
fn scope_list(scope: &str) -> Vec<String> {
    scope
        .split(' ')
        .filter(|scope| !scope.is_empty())
        .map(str::to_owned)
        .collect()
}

fn text_field<'a>(document: &'a Value, name: &str) -> Option<&'a str> {
    document.get(name).and_then(Value::as_str)
}

fn strings(document: &Value, name: &str) -> Vec<String> {
    document
        .get(name)
        .and_then(Value::as_array)
        .map(|values| {
            values
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// An endpoint a person's browser or toolgate is sent to: absolute, HTTPS
/// (or HTTP on loopback), no fragment.
fn endpoint(document: &Value, name: &str) -> Result<String, ConsentError> {
    text_field(document, name)
        .filter(|url| secure_or_loopback(url) && !url.contains('#'))
        .map(str::to_owned)
        .ok_or(ConsentError::Metadata(
            "an endpoint is missing or not a URL",
        ))
}

/// The server's authorization server, by its metadata.
async fn discover(
    dialer: &dyn EgressDialer,
    server_url: &str,
) -> Result<AuthorizationServer, ConsentError> {
    let (origin, path) = split_url(server_url).ok_or(ConsentError::Metadata("the server's URL"))?;
    let challenge = challenge(dialer, server_url).await;
    // What the 401 names comes first; one that cannot be had (egress
    // refuses it, it does not answer, it is not a document) leaves the
    // well-known URLs to try.
    let mut resource_metadata = match &challenge.resource_metadata {
        Some(named) => document(dialer, named).await.ok().flatten(),
        None => None,
    };
    if resource_metadata.is_none() {
        let well_known = [
            format!("{origin}/.well-known/oauth-protected-resource{path}"),
            format!("{origin}/.well-known/oauth-protected-resource"),
        ];
        resource_metadata = first_document(dialer, well_known).await?;
    }
    let resource_metadata = resource_metadata.ok_or(ConsentError::Metadata(
        "the server publishes no protected-resource metadata",
    ))?;
    // RFC 9728 §3.3: the metadata is the server's own only when it names
    // the server.
    let resource = text_field(&resource_metadata, "resource")
        .filter(|resource| same_resource(resource, server_url))
        .ok_or(ConsentError::Metadata(
            "the protected-resource metadata names another resource",
        ))?
        .to_owned();
    let issuer = strings(&resource_metadata, "authorization_servers")
        .into_iter()
        .next()
        .ok_or(ConsentError::Metadata("no authorization server is named"))?;
    if !secure_or_loopback(&issuer) {
        return Err(ConsentError::Metadata(
            "the issuer is not an https URL (nor http on loopback)",
        ));
    }
    let (issuer_origin, issuer_path) =
        split_url(&issuer).ok_or(ConsentError::Metadata("the issuer is not a URL"))?;
    let metadata = first_document(
        dialer,
        [
            format!("{issuer_origin}/.well-known/oauth-authorization-server{issuer_path}"),
            format!("{issuer_origin}/.well-known/openid-configuration{issuer_path}"),
            format!("{issuer_origin}{issuer_path}/.well-known/openid-configuration"),
        ],
    )
    .await?;
    let metadata = metadata.ok_or(ConsentError::Metadata(
        "the authorization server publishes no metadata",
    ))?;
    // RFC 8414 §3.3: a document naming another issuer is not this one's.
    if text_field(&metadata, "issuer") != Some(issuer.as_str()) {
        return Err(ConsentError::Metadata(
            "the authorization server's metadata names another issuer",
        ));
    }
    if !strings(&metadata, "code_challenge_methods_supported")
        .iter()
        .any(|method| method == "S256")
    {
        return Err(ConsentError::Metadata(
            "the authorization server does not offer PKCE with S256",
        ));
    }
    // The MCP specification's order: what the challenge asked for, else
    // all the metadata offers.
    let mut scopes = if challenge.scopes.is_empty() {
        strings(&resource_metadata, "scopes_supported")
    } else {
        challenge.scopes
    };
    scopes.retain(|scope| !scope.is_empty() && !scope.contains(' '));
    let revocation_endpoint = match metadata.get("revocation_endpoint") {
        None | Some(Value::Null) => None,
        Some(_) => Some(endpoint(&metadata, "revocation_endpoint")?),
    };
    Ok(AuthorizationServer {
        authorization_endpoint: endpoint(&metadata, "authorization_endpoint")?,
        token_endpoint: endpoint(&metadata, "token_endpoint")?,
        revocation_endpoint,
        client_documents: metadata
            .get("client_id_metadata_document_supported")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        iss_required: metadata
            .get("authorization_response_iss_parameter_supported")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        issuer,
        resource,
        scopes,
    })
}

/// `base?name=value&…`, each value form-encoded.
fn with_query(base: &str, pairs: &[(&str, &str)]) -> String {
    let mut url = base.to_owned();
    let mut separator = if base.contains('?') { '&' } else { '?' };
    for (name, value) in pairs {
        url.push(separator);
        url.push_str(name);
        url.push('=');
        url.push_str(&form_encode(value));
        separator = '&';
    }
    url
}

impl Consent for Delegations {
    fn begin<'a>(
        &'a self,
        who: &'a Delegator,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<ConsentStart, ConsentError>> {
        Box::pin(async move {
            let settings = self.server(&who.tenant_id, server_id).await?;
            let registered = self.registered(&settings).await?;
            let dialer = self.servers.dialer();
            let found = discover(dialer.as_ref(), &settings.url).await?;
            // Toolgate's own document only where the authorization server
            // says it takes one: dynamic registration is never attempted.
            let client = match registered {
                Some(client) => client,
                None if found.client_documents => {
                    Client::Document(self.settings.client_document.clone())
                }
                None => {
                    return Err(ConsentError::Metadata(
                        "the authorization server takes no client ID metadata document: \
                         register toolgate there and name the client in credential_ref",
                    ));
                }
            };
            let scopes = if settings.auth.token_scopes.is_empty() {
                found.scopes.clone()
            } else {
                settings.auth.token_scopes.clone()
            };
            let state = random_token();
            let verifier = random_token();
            let browser = random_token();
            let state_sha256 = sha256_hex(state.as_bytes());
            let sealed_verifier = self
                .custody
                .sealer
                .seal(
                    &verifier_context(&state_sha256),
                    &SecretValue::new(verifier.clone()),
                )
                .map_err(|_| ConsentError::Unavailable("randomness"))?;
            let challenge = crate::domain::base64url(&sha2::Sha256::digest(verifier.as_bytes()));
            let now = self.clock.now();
            let lifetime = chrono::Duration::from_std(self.settings.flow_lifetime)
                .unwrap_or(chrono::Duration::minutes(10));
            let flow = ConsentFlow {
                state_sha256,
                tenant_id: who.tenant_id.clone(),
                principal_id: who.principal_id.clone(),
                server_id: settings.server_id.clone(),
                browser_sha256: sha256_hex(browser.as_bytes()),
                sealed_verifier,
                issuer: found.issuer.clone(),
                iss_required: found.iss_required,
                token_endpoint: found.token_endpoint.clone(),
                resource: found.resource.clone(),
                scopes: scopes.clone(),
                started_at: now,
                expires_at: now + lifetime,
                client_document: client.document(),
                revocation_endpoint: found.revocation_endpoint.clone(),
            };
            self.custody
                .grants
                .begin_consent(&flow, OUTSTANDING_FLOWS)
                .await
                .map_err(|_| ConsentError::Unavailable("the store"))?;
            let scope = scopes.join(" ");
            let mut pairs = vec![
                ("response_type", "code"),
                ("client_id", client.id()),
                ("redirect_uri", self.settings.redirect_uri.as_str()),
                ("state", state.as_str()),
                ("code_challenge", challenge.as_str()),
                ("code_challenge_method", "S256"),
                ("resource", found.resource.as_str()),
            ];
            if !scope.is_empty() {
                pairs.push(("scope", scope.as_str()));
            }
            let authorization_origin = split_url(&found.authorization_endpoint)
                .map(|(origin, _)| origin.to_owned())
                .unwrap_or_default();
            tracing::info!(
                tenant = %who.tenant_id,
                principal = %who.principal_id,
                server = %settings.server_id,
                "consent begun"
            );
            Ok(ConsentStart {
                authorization_url: with_query(&found.authorization_endpoint, &pairs),
                authorization_origin,
                cookie_name: crate::ports::consent::consent_cookie_name(&state),
                browser,
                scopes,
            })
        })
    }

    fn pending<'a>(
        &'a self,
        browser: Option<&'a str>,
        answer: &'a ConsentAnswer,
    ) -> BoxFuture<'a, Result<Option<Granted>, ConsentError>> {
        Box::pin(async move {
            let Some(state) = answer.state.as_deref() else {
                return Ok(None);
            };
            let flow = self
                .custody
                .grants
                .consent_flow(&sha256_hex(state.as_bytes()), self.clock.now())
                .await
                .map_err(|_| ConsentError::Unavailable("the store"))?;
            Ok(flow
                .filter(|flow| {
                    browser.map(|browser| sha256_hex(browser.as_bytes()))
                        == Some(flow.browser_sha256.clone())
                })
                .map(|flow| Granted {
                    tenant_id: flow.tenant_id,
                    principal_id: flow.principal_id,
                    server_id: flow.server_id,
                }))
        })
    }

    fn finish<'a>(
        &'a self,
        browser: Option<&'a str>,
        answer: &'a ConsentAnswer,
    ) -> BoxFuture<'a, Result<Granted, ConsentError>> {
        Box::pin(async move {
            let state = answer.state.as_deref().ok_or(ConsentError::UnknownFlow)?;
            let now = self.clock.now();
            let flow = self
                .custody
                .grants
                .take_consent(&sha256_hex(state.as_bytes()), now)
                .await
                .map_err(|_| ConsentError::Unavailable("the store"))?
                .ok_or(ConsentError::UnknownFlow)?;
            // Only the browser that began the flow finishes it: a link
            // opened elsewhere, or an answer planted in another browser,
            // grants nothing to anyone.
            if browser.map(|browser| sha256_hex(browser.as_bytes()))
                != Some(flow.browser_sha256.clone())
            {
                tracing::warn!(
                    tenant = %flow.tenant_id,
                    server = %flow.server_id,
                    "a consent answer arrived in a browser that did not begin it; refused"
                );
                return Err(ConsentError::UnknownFlow);
            }
            match answer.iss.as_deref() {
                Some(iss) if iss != flow.issuer => return Err(ConsentError::WrongIssuer),
                None if flow.iss_required => return Err(ConsentError::WrongIssuer),
                _ => {}
            }
            if answer.error.is_some() {
                return Err(ConsentError::Refused);
            }
            let code = answer.code.as_deref().ok_or(ConsentError::NotRedeemed)?;
            let settings = self.server(&flow.tenant_id, &flow.server_id).await?;
            let client = self
                .client_of(&settings, flow.client_document.as_deref())
                .await?;
            let verifier = self
                .custody
                .sealer
                .open(&verifier_context(&flow.state_sha256), &flow.sealed_verifier)
                .map_err(|_| ConsentError::UnknownFlow)?;
            let mut body = with_query(
                "",
                &[
                    ("grant_type", "authorization_code"),
                    ("code", code),
                    ("redirect_uri", self.settings.redirect_uri.as_str()),
                    ("code_verifier", verifier.reveal()),
                    ("resource", flow.resource.as_str()),
                ],
            );
            body.remove(0);
            let mut headers = Vec::new();
            client
                .authenticate(&mut body, &mut headers)
                .map_err(|_| ConsentError::NotRedeemed)?;
            let dialer = self.servers.dialer();
            let (status, bytes) = send(
                dialer.as_ref(),
                Method::POST,
                &flow.token_endpoint,
                headers,
                Some(body),
                MAXIMUM_DOCUMENT,
            )
            .await
            .map_err(|_| ConsentError::Unavailable("the authorization server"))?;
            if !status.is_success() {
                return Err(ConsentError::NotRedeemed);
            }
            let held = token_answer(&bytes, now).map_err(|_| ConsentError::NotRedeemed)?;
            let answer: Value =
                serde_json::from_slice(&bytes).map_err(|_| ConsentError::NotRedeemed)?;
            let refresh_token = text_field(&answer, "refresh_token")
                .filter(|token| !token.is_empty())
                .map(str::to_owned);
            let scopes = text_field(&answer, "scope")
                .map(scope_list)
                .unwrap_or(flow.scopes.clone());
            let tokens = Tokens {
                access_token: held.value.reveal().to_owned(),
                refresh_token,
                expires_at: held.expires_at,
                token_endpoint: flow.token_endpoint.clone(),
                resource: flow.resource.clone(),
                client_document: flow.client_document.clone(),
                revocation_endpoint: flow.revocation_endpoint.clone(),
            };
            let mut grant = UpstreamGrant {
                tenant_id: flow.tenant_id.clone(),
                principal_id: flow.principal_id.clone(),
                server_id: flow.server_id.clone(),
                issuer: flow.issuer.clone(),
                scopes,
                sealed_tokens: String::new(),
                granted_at: now,
                last_used_at: None,
            };
            grant.sealed_tokens = self
                .custody
                .seal(&grant, &tokens)
                .map_err(|_| ConsentError::Unavailable("randomness"))?;
            self.custody
                .grants
                .save_grant(&grant)
                .await
                .map_err(|_| ConsentError::Unavailable("the store"))?;
            tracing::info!(
                tenant = %grant.tenant_id,
                principal = %grant.principal_id,
                server = %grant.server_id,
                "consent granted"
            );
            Ok(Granted {
                tenant_id: grant.tenant_id,
                principal_id: grant.principal_id,
                server_id: grant.server_id,
            })
        })
    }

    fn client_document(&self) -> Value {
        serde_json::json!({
            "client_id": self.settings.client_document,
            "client_name": "toolgate",
            "redirect_uris": [self.settings.redirect_uri],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        })
    }
}

impl Revocation for Delegations {
    fn end_grant<'a>(
        &'a self,
        tenant_id: &'a str,
        principal_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<Revoked, ConsentError>> {
        Box::pin(async move {
            let Some(grant) = revoke_here(
                self.custody.grants.as_ref(),
                tenant_id,
                principal_id,
                server_id,
            )
            .await?
            else {
                return Ok(Revoked::NotHeld);
            };
            let upstream = self.revoke_upstream(&grant).await;
            tracing::info!(
                tenant = %tenant_id,
                principal = %principal_id,
                server = %server_id,
                upstream,
                "grant revoked"
            );
            Ok(Revoked::Ended { upstream })
        })
    }
}

/// Deletes the grant from the store: the one deleted.
async fn revoke_here(
    grants: &dyn GrantStore,
    tenant_id: &str,
    principal_id: &str,
    server_id: &str,
) -> Result<Option<UpstreamGrant>, ConsentError> {
    grants
        .revoke_grant(tenant_id, principal_id, server_id)
        .await
        .map_err(|_| ConsentError::Unavailable("the store"))
}

impl Delegations {
    /// Revokes a deleted grant's tokens at its authorization server (RFC
    /// 7009): its refresh token, then its access token (a server need not
    /// end the access tokens of a refresh token it revokes), as the client
    /// it was granted to. A registered client's secret goes only to the
    /// server the grant was given for: not to one whose row has been
    /// pointed elsewhere since. Whether the server took every revocation;
    /// best effort, the grant is already ended here.
    async fn revoke_upstream(&self, grant: &UpstreamGrant) -> bool {
        let Ok(tokens) = self.custody.open(grant) else {
            return false;
        };
        let Some(endpoint) = tokens.revocation_endpoint.as_deref() else {
            return false;
        };
        let client = match tokens.client_document.as_deref() {
            Some(url) => Client::Document(url.to_owned()),
            None => {
                let settings = self
                    .servers
                    .delegated(&grant.tenant_id, &grant.server_id)
                    .await
                    .filter(|settings| same_resource(&tokens.resource, &settings.url));
                let Some(settings) = settings else {
                    return false;
                };
                match self.registered(&settings).await {
                    Ok(Some(client)) => client,
                    _ => return false,
                }
            }
        };
        let mut revoked = true;
        if let Some(refresh) = tokens.refresh_token.as_deref() {
            revoked &= self
                .revoke_token(grant, endpoint, &client, refresh, "refresh_token")
                .await;
        }
        revoked
            & self
                .revoke_token(
                    grant,
                    endpoint,
                    &client,
                    &tokens.access_token,
                    "access_token",
                )
                .await
    }

    /// One token's revocation at `endpoint`: whether it was answered 200.
    async fn revoke_token(
        &self,
        grant: &UpstreamGrant,
        endpoint: &str,
        client: &Client,
        token: &str,
        hint: &str,
    ) -> bool {
        let mut body = format!("token={}&token_type_hint={hint}", form_encode(token));
        let mut headers = Vec::new();
        if client.authenticate(&mut body, &mut headers).is_err() {
            return false;
        }
        let dialer = self.servers.dialer();
        let answered = send(
            dialer.as_ref(),
            Method::POST,
            endpoint,
            headers,
            Some(body),
            MAXIMUM_DOCUMENT,
        )
        .await;
        match answered {
            Ok((status, _)) if status == StatusCode::OK => true,
            Ok((status, _)) => {
                tracing::warn!(
                    tenant = %grant.tenant_id,
                    server = %grant.server_id,
                    status = status.as_u16(),
                    "the authorization server did not take a grant's revocation; it is ended here"
                );
                false
            }
            Err(_) => {
                tracing::warn!(
                    tenant = %grant.tenant_id,
                    server = %grant.server_id,
                    "the authorization server could not be reached to revoke a grant; it is ended here"
                );
                false
            }
        }
    }
}

/// Grants ended where consent is not served (no key to open them): deleted
/// here only.
pub struct StoredGrants(pub Arc<dyn GrantStore>);

impl Revocation for StoredGrants {
    fn end_grant<'a>(
        &'a self,
        tenant_id: &'a str,
        principal_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<Revoked, ConsentError>> {
        Box::pin(async move {
            Ok(
                match revoke_here(self.0.as_ref(), tenant_id, principal_id, server_id).await? {
                    Some(_) => Revoked::Ended { upstream: false },
                    None => Revoked::NotHeld,
                },
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_splits_into_origin_and_path() {
        assert_eq!(
            split_url("https://mcp.example.com/v1/mcp?x=1#f"),
            Some(("https://mcp.example.com", "/v1/mcp"))
        );
        assert_eq!(
            split_url("http://127.0.0.1:8080"),
            Some(("http://127.0.0.1:8080", ""))
        );
        assert_eq!(
            split_url("https://as.example.com/"),
            Some(("https://as.example.com", ""))
        );
        assert_eq!(split_url("ftp://x/y"), None);
        assert_eq!(split_url("no-scheme"), None);
    }

    #[test]
    fn the_bearer_challenges_parameters_are_read_among_others() {
        let read = |value: &str| bearer_challenge(value);
        assert_eq!(
            read(
                r#"Bearer error="invalid_token", resource_metadata="https://mcp.example.com/.well-known/x", scope="a b""#
            ),
            Some(vec![
                ("error".into(), "invalid_token".into()),
                (
                    "resource_metadata".into(),
                    "https://mcp.example.com/.well-known/x".into()
                ),
                ("scope".into(), "a b".into()),
            ])
        );
        // Another scheme's parameters first, a token parameter, an escaped
        // quote, odd spacing and case.
        assert_eq!(
            read(
                r#"Basic realm="x, y", BEARER  Resource_Metadata = "https://a/\"q\"" , scope=read"#
            ),
            Some(vec![
                ("resource_metadata".into(), "https://a/\"q\"".into()),
                ("scope".into(), "read".into()),
            ])
        );
        assert_eq!(read(r#"Basic realm="x""#), None);
        // Another scheme's token68 (`/` is not a token character) does not
        // hide the challenge after it.
        assert_eq!(
            read(r#"Negotiate a/b+c=, Bearer resource_metadata="https://a/m""#),
            Some(vec![("resource_metadata".into(), "https://a/m".into())])
        );
        assert_eq!(read("Bearer"), Some(vec![]));
        // Unterminated and malformed: what was read before, no panic.
        assert_eq!(
            read(r#"Bearer scope="a", resource_metadata="https://a"#),
            Some(vec![("scope".into(), "a".into())])
        );
        for hostile in [
            "",
            "=",
            ",,,",
            "Bearer =x",
            "Bearer \"",
            "\u{0}Bearer",
            "Bearer a=\"\\",
        ] {
            let _ = read(hostile);
        }
    }

    #[test]
    fn a_query_is_appended_encoded() {
        assert_eq!(
            with_query(
                "https://as/authorize",
                &[("a", "b c"), ("r", "https://x/y")]
            ),
            "https://as/authorize?a=b+c&r=https%3A%2F%2Fx%2Fy"
        );
        assert_eq!(
            with_query("https://as/a?t=1", &[("s", "&")]),
            "https://as/a?t=1&s=%26"
        );
    }
}
