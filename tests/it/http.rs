//! HTTP MCP upstreams: the scripted server in its streamable-HTTP mode,
//! reached through the egress dialer; the 401 ladder (gate 15); gates 11
//! and 12 over HTTP; authentication at connect; redirects, DNS rebinding
//! and TLS with a private CA.

use std::collections::BTreeSet;
use std::io::BufRead as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The operator's default ceilings, which tenant rows are held to.
const CEILINGS: toolgate::domain::mcp_server::TenantCeilings =
    toolgate::domain::mcp_server::TenantCeilings {
        maximum_output_bytes: toolgate::config::DEFAULT_MAXIMUM_OUTPUT_BYTES_CEILING,
        timeout_seconds: toolgate::config::DEFAULT_MAXIMUM_TIMEOUT_SECONDS,
    };

use serde_json::{Value, json};
use toolgate::adapters::credentials::EnvFileResolver;
use toolgate::adapters::egress::{Dialer, EgressSettings, Resolve};
use toolgate::adapters::mcp::{AuthSettings, HttpServerSettings, McpServerSet};
use toolgate::adapters::telemetry::MetricsRegistry;
use toolgate::domain::egress::{AllowEntry, AllowedCidrs, EgressAllowlist};
use toolgate::domain::mcp_server::{AuthScheme, ServerClassification};
use toolgate::domain::secret::CredentialRef;
use toolgate::domain::{
    IdempotencyClass, ReasonCode, RiskLevel, SideEffectClass, ToolOutcomeStatus,
};
use toolgate::ports::{BoxFuture, DialError, EgressDialer, Store, SystemClock};
use uuid::Uuid;

use crate::mcp::{Live, events, live_with, scripted_server, sqlite, status};
use crate::pipeline::{code, finished, text_of};

/// The scripted server serving streamable HTTP on a loopback port.
pub struct ScriptedHttp {
    child: Child,
    /// Its port.
    pub port: u16,
    /// Its token file, request log and the like.
    pub folder: tempfile::TempDir,
}

impl Drop for ScriptedHttp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_at(address: &str, folder: &Path, env: &[(&str, String)]) -> (Child, u16) {
    let mut child = Command::new(scripted_server())
        .env("SCRIPTED_HTTP", address)
        .env(
            "SCRIPTED_REQUESTS",
            folder.join("requests").display().to_string(),
        )
        .env(
            "SCRIPTED_CONNECTIONS",
            folder.join("connections").display().to_string(),
        )
        .envs(env.iter().map(|(name, value)| (*name, value)))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the scripted server starts");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the scripted server says where it listens");
    let port = line
        .trim()
        .strip_prefix("listening ")
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    (child, port)
}

impl ScriptedHttp {
    /// A server on a free port; `env` adds to the folder-based settings.
    pub fn start(env: &[(&str, String)]) -> Self {
        Self::start_with(|_| env.to_vec())
    }

    /// A server on a free port with settings that name files in its folder.
    pub fn start_with<'a>(env: impl FnOnce(&Path) -> Vec<(&'a str, String)>) -> Self {
        let folder = tempfile::tempdir().unwrap();
        let env = env(folder.path());
        let (child, port) = spawn_at("127.0.0.1:0", folder.path(), &env);
        ScriptedHttp {
            child,
            port,
            folder,
        }
    }

    /// The same server again on the same port (after it died).
    pub fn restart(&mut self, env: &[(&str, String)]) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let (child, port) = spawn_at(&format!("127.0.0.1:{}", self.port), self.folder.path(), env);
        assert_eq!(port, self.port);
        self.child = child;
    }

    /// The MCP endpoint.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// A file in its folder.
    pub fn path(&self, name: &str) -> PathBuf {
        self.folder.path().join(name)
    }

    /// Every request it has seen, as `METHOD PATH STATUS`.
    pub fn requests(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("requests"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// How many connections it has accepted.
    pub fn connections(&self) -> usize {
        std::fs::read_to_string(self.path("connections"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    /// The POSTs seen since `mark` requests.
    pub fn posts_since(&self, mark: usize) -> Vec<String> {
        self.requests()
            .into_iter()
            .skip(mark)
            .filter(|line| line.starts_with("POST"))
            .collect()
    }
}

/// A dialer that may reach the loopback ports given, over plain HTTP.
pub fn loopback_dialer(ports: &[u16]) -> Dialer {
    let entries = ports
        .iter()
        .map(|port| AllowEntry::parse(&format!("http://127.0.0.1:{port}")).unwrap())
        .collect();
    Dialer::new(
        EgressSettings {
            allowlist: EgressAllowlist::new(entries),
            allowed_cidrs: AllowedCidrs::parse(&["127.0.0.1/32"]).unwrap(),
            connect_timeout: Duration::from_secs(5),
            tls_timeout: Duration::from_secs(5),
        },
        None,
    )
    .unwrap()
}

/// An operator HTTP server named `server_id` at `url`.
pub fn http_server(
    server_id: &str,
    url: &str,
    auth: AuthSettings,
    classification: ServerClassification,
) -> HttpServerSettings {
    HttpServerSettings {
        server_id: server_id.into(),
        url: url.into(),
        auth,
        classification,
        connect_timeout: Duration::from_secs(10),
        request_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(900),
        enabled: true,
    }
}

pub fn no_auth() -> AuthSettings {
    AuthSettings {
        scheme: AuthScheme::None,
        name: None,
        credential_ref: None,
        token_endpoint: None,
        token_scopes: Vec::new(),
    }
}

fn bearer(file: &Path) -> AuthSettings {
    AuthSettings {
        scheme: AuthScheme::Bearer,
        name: None,
        credential_ref: Some(CredentialRef::parse(&format!("file:{}", file.display())).unwrap()),
        token_endpoint: None,
        token_scopes: Vec::new(),
    }
}

fn idempotent(server_id: &str) -> ServerClassification {
    ServerClassification {
        side_effect: SideEffectClass::ExternalRead,
        risk: RiskLevel::Low,
        idempotency: IdempotencyClass::Idempotent,
        required_scopes: BTreeSet::from([format!("mcp.{server_id}.use")]),
        timeout_seconds: 10,
        maximum_output_bytes: 65536,
    }
}

fn non_idempotent(server_id: &str) -> ServerClassification {
    let mut classification = ServerClassification::most_restrictive(10, 65536);
    classification.required_scopes = BTreeSet::from([format!("mcp.{server_id}.use")]);
    classification
}

/// A harness whose set holds `servers`, dialled through `dialer`.
async fn live_http(
    store: Arc<dyn Store>,
    servers: Vec<HttpServerSettings>,
    dialer: Arc<dyn EgressDialer>,
) -> Live {
    live_with(store.clone(), move |_| {
        McpServerSet::new(
            Vec::new(),
            Arc::new(EnvFileResolver::new(Default::default())),
            store,
            Arc::new(SystemClock),
            Arc::new(MetricsRegistry::default()),
        )
        .with_http(servers, dialer, Duration::from_secs(300), CEILINGS)
    })
    .await
}

/// A harness whose one server, `reads`, is the scripted `server`.
async fn live_reads(store: Arc<dyn Store>, server: &ScriptedHttp, auth: AuthSettings) -> Live {
    live_http(
        store,
        vec![http_server(
            "reads",
            &server.url(),
            auth,
            idempotent("reads"),
        )],
        Arc::new(loopback_dialer(&[server.port])),
    )
    .await
}

fn disconnected_codes(recorded: &[(String, Value)]) -> Vec<String> {
    recorded
        .iter()
        .filter(|(kind, _)| kind == "mcp.server.disconnected")
        .map(|(_, body)| body["reason_code"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Gate 11 over HTTP: a call to an HTTP server passes exactly the steps a
/// builtin call passes.
#[tokio::test]
async fn gate_11_an_http_mcp_call_passes_the_same_steps_as_a_builtin() {
    let server = ScriptedHttp::start(&[]);
    let (store, _db) = sqlite().await;
    let live = live_reads(store, &server, no_auth()).await;
    let prepared = live.prepare().await;
    assert!(
        prepared.registered.contains(&"mcp.reads.echo".to_owned()),
        "{prepared:?}"
    );
    let builtin = live.request("demo.echo", json!({"text": "hi"}));
    let builtin_id = builtin.call_id.clone();
    let outcome = live.harness.pipeline.call(builtin).await;
    assert_eq!(status(&outcome), ToolOutcomeStatus::Succeeded);
    let remote = live.request("mcp.reads.echo", json!({"text": "over http"}));
    let remote_id = remote.call_id.clone();
    let outcome = live.harness.pipeline.call(remote).await;
    assert_eq!(
        status(&outcome),
        ToolOutcomeStatus::Succeeded,
        "{outcome:?}"
    );
    assert!(text_of(finished(&outcome)).contains("over http"));
    let (builtin, remote) = (
        live.harness.recorder.sequence(&builtin_id),
        live.harness.recorder.sequence(&remote_id),
    );
    assert!(!remote.is_empty());
    assert_eq!(remote, builtin);
    let recorded = events(live.store.as_ref()).await;
    assert!(
        recorded
            .iter()
            .any(|(kind, body)| kind == "mcp.server.connected" && body["transport"] == "http"),
        "{recorded:?}"
    );
    live.servers.shutdown().await;
}

/// A server that answers every call with an event stream is not dialled
/// again for each: a stream read to its end leaves its connection kept for
/// the next request, as a JSON answer does.
#[tokio::test]
async fn calls_answered_with_streams_reuse_kept_connections() {
    // rmcp's service answers every request with an event stream unless told
    // to answer with JSON; the scripted server keeps that default.
    let server = ScriptedHttp::start(&[]);
    let (store, _db) = sqlite().await;
    let live = live_reads(store, &server, no_auth()).await;
    live.prepare().await;
    let outcome = live.call("mcp.reads.echo", json!({"text": "first"})).await;
    assert_eq!(
        status(&outcome),
        ToolOutcomeStatus::Succeeded,
        "{outcome:?}"
    );
    let (opened, posted) = (server.connections(), server.requests().len());
    assert!(opened > 0, "the server counts the connections it accepts");
    for n in 0..20 {
        let outcome = live
            .call("mcp.reads.echo", json!({"text": format!("call {n}")}))
            .await;
        assert_eq!(
            status(&outcome),
            ToolOutcomeStatus::Succeeded,
            "{outcome:?}"
        );
    }
    let answered_with_streams = server
        .requests()
        .iter()
        .skip(posted)
        .filter(|line| line.starts_with("POST /mcp 200"))
        .count();
    assert_eq!(answered_with_streams, 20, "{:?}", server.requests());
    assert_eq!(
        server.connections(),
        opened,
        "20 calls answered with streams dialled new connections"
    );
    live.servers.shutdown().await;
}

/// Gate 12 over HTTP: a server that drops the connection mid-call leaves
/// the call unavailable with `tool.server_unreachable`; once it is back the
/// next call redials and the run goes on.
#[tokio::test]
async fn gate_12_an_http_server_that_drops_mid_call_is_unavailable_and_the_run_goes_on() {
    let mut server = ScriptedHttp::start(&[]);
    let (store, _db) = sqlite().await;
    let live = live_reads(store.clone(), &server, no_auth()).await;
    live.prepare().await;
    let outcome = live.call("mcp.reads.die", json!({})).await;
    assert_eq!(
        status(&outcome),
        ToolOutcomeStatus::Unavailable,
        "{outcome:?}"
    );
    assert_eq!(code(&outcome), Some(ReasonCode::ToolServerUnreachable));
    // While it is down the run's other tools still answer.
    let outcome = live.call("demo.echo", json!({"text": "meanwhile"})).await;
    assert_eq!(status(&outcome), ToolOutcomeStatus::Succeeded);
    server.restart(&[]);
    let outcome = live
        .call("mcp.reads.echo", json!({"text": "still here"}))
        .await;
    assert_eq!(
        status(&outcome),
        ToolOutcomeStatus::Succeeded,
        "{outcome:?}"
    );
    let recorded = events(store.as_ref()).await;
    assert!(
        disconnected_codes(&recorded).contains(&"tool.server_unreachable".to_owned()),
        "{recorded:?}"
    );
    let connected = recorded
        .iter()
        .filter(|(kind, _)| kind == "mcp.server.connected")
        .count();
    assert_eq!(connected, 2, "the redial is a handshake too: {recorded:?}");
    live.servers.shutdown().await;
}

fn reauthentications(recorded: &[(String, Value)], server_id: &str) -> Vec<String> {
    recorded
        .iter()
        .filter(|(kind, body)| kind == "mcp.server.reauthenticated" && body["server"] == server_id)
        .map(|(_, body)| {
            assert_eq!(body["scheme"], "bearer");
            body["outcome"].as_str().unwrap_or_default().to_owned()
        })
        .collect()
}

/// Gate 15: the 401 ladder is bounded and routes through recovery. Against
/// the scripted server answering 401 whenever the bearer is not the token
/// of the moment: one re-authentication per server per session; an
/// idempotent call retried once; a non-idempotent call whose watermark is
/// set UNCERTAIN and never re-sent; a byte-identical new value stops the
/// ladder; after it, `tool.server_unauthorized` without dialling; and the
/// run goes on throughout.
#[tokio::test]
async fn gate_15_the_401_ladder_is_bounded_and_routes_through_recovery() {
    let server = ScriptedHttp::start_with(|folder| {
        vec![
            (
                "SCRIPTED_TOKEN_FILE",
                folder.join("token").display().to_string(),
            ),
            (
                "SCRIPTED_EFFECTS",
                folder.join("effects").display().to_string(),
            ),
        ]
    });
    let token = |value: &str| std::fs::write(server.path("token"), value).unwrap();
    token("t1");
    let (store, _db) = sqlite().await;
    let credentials = tempfile::tempdir().unwrap();
    let reads_credential = credentials.path().join("reads");
    let writes_credential = credentials.path().join("writes");
    let credential = |file: &Path, value: &str| std::fs::write(file, value).unwrap();
    credential(&reads_credential, "t1");
    credential(&writes_credential, "t1");
    let live = live_http(
        store.clone(),
        vec![
            http_server(
                "reads",
                &server.url(),
                bearer(&reads_credential),
                idempotent("reads"),
            ),
            http_server(
                "writes",
                &server.url(),
                bearer(&writes_credential),
                non_idempotent("writes"),
            ),
        ],
        Arc::new(loopback_dialer(&[server.port])),
    )
    .await;
    let prepared = live.prepare().await;
    assert!(
        prepared.registered.contains(&"mcp.reads.echo".to_owned())
            && prepared.registered.contains(&"mcp.writes.write".to_owned()),
        "{prepared:?}"
    );
    let run = Uuid::new_v4();
    let in_session = |session: Uuid, name: &str, arguments: Value| {
        let mut request = live.request(name, arguments);
        request.session_id = session;
        request.run_id = run;
        request
    };
    let call = |session: Uuid, name: &'static str, arguments: Value| {
        let request = in_session(session, name, arguments);
        async { live.harness.pipeline.call(request).await }
    };

    // Session A: the token rotates at both ends; one re-authentication, one
    // retry of the idempotent call.
    let a = Uuid::new_v4();
    let outcome = call(a, "mcp.reads.echo", json!({"text": "one"})).await;
    assert_eq!(
        status(&outcome),
        ToolOutcomeStatus::Succeeded,
        "{outcome:?}"
    );
    token("t2");
    credential(&reads_credential, "t2");
    let mark = server.requests().len();
    let outcome = call(a, "mcp.reads.echo", json!({"text": "two"})).await;
    assert_eq!(
        status(&outcome),
        ToolOutcomeStatus::Succeeded,
        "{outcome:?}"
    );
    assert!(text_of(finished(&outcome)).contains("two"));
    let posts = server.posts_since(mark);
    assert_eq!(
        posts,
        ["POST /mcp 401", "POST /mcp 200"],
        "held, renewed, retried once"
    );
    // A second 401 in the same session: the ladder is spent, no second
    // re-authentication, no retry.
    token("t3");
    let mark = server.requests().len();
    let outcome = call(a, "mcp.reads.echo", json!({"text": "three"})).await;
    assert_eq!(
        status(&outcome),
        ToolOutcomeStatus::Unavailable,
        "{outcome:?}"
    );
    assert_eq!(code(&outcome), Some(ReasonCode::ToolServerUnauthorized));
    assert_eq!(server.posts_since(mark), ["POST /mcp 401"]);
    // Every later call to the server in the session: the same, undialled.
    let mark = server.requests().len();
    let outcome = call(a, "mcp.reads.echo", json!({"text": "four"})).await;
    assert_eq!(code(&outcome), Some(ReasonCode::ToolServerUnauthorized));
    assert!(
        server.posts_since(mark).is_empty(),
        "{:?}",
        server.requests()
    );
    // The run goes on.
    let outcome = call(a, "demo.echo", json!({"text": "the run goes on"})).await;
    assert_eq!(
        status(&outcome),
        ToolOutcomeStatus::Succeeded,
        "{outcome:?}"
    );
    let recorded = events(store.as_ref()).await;
    assert_eq!(reauthentications(&recorded, "reads"), ["renewed"]);

    // Session B: a non-idempotent write meets a 401 after its watermark:
    // re-authenticated, not re-sent, UNCERTAIN; the server never ran it.
    let b = Uuid::new_v4();
    token("t4");
    credential(&writes_credential, "t4");
    let mark = server.requests().len();
    let outcome = call(b, "mcp.writes.write", json!({"line": "once"})).await;
    assert_eq!(
        status(&outcome),
        ToolOutcomeStatus::Uncertain,
        "{outcome:?}"
    );
    assert_eq!(code(&outcome), Some(ReasonCode::ToolOutcomeUnknown));
    assert_eq!(server.posts_since(mark), ["POST /mcp 401"], "never re-sent");
    assert!(!server.path("effects").exists(), "the server never ran it");
    // The renewed credential serves the session's next call.
    let outcome = call(b, "mcp.writes.echo", json!({"text": "renewed"})).await;
    assert_eq!(
        status(&outcome),
        ToolOutcomeStatus::Succeeded,
        "{outcome:?}"
    );
    let recorded = events(store.as_ref()).await;
    assert_eq!(reauthentications(&recorded, "writes"), ["renewed"]);

    // Session C: the server is back on C's credential, then rotates while
    // the credential does not: a byte-identical value stops the ladder.
    let c = Uuid::new_v4();
    token("t2");
    let outcome = call(c, "mcp.reads.echo", json!({"text": "redialled"})).await;
    assert_eq!(
        status(&outcome),
        ToolOutcomeStatus::Succeeded,
        "{outcome:?}"
    );
    token("t5");
    let mark = server.requests().len();
    let outcome = call(c, "mcp.reads.echo", json!({"text": "identical"})).await;
    assert_eq!(code(&outcome), Some(ReasonCode::ToolServerUnauthorized));
    assert_eq!(server.posts_since(mark), ["POST /mcp 401"], "no retry");
    let mark = server.requests().len();
    let outcome = call(c, "mcp.reads.echo", json!({"text": "again"})).await;
    assert_eq!(code(&outcome), Some(ReasonCode::ToolServerUnauthorized));
    assert!(
        server.posts_since(mark).is_empty(),
        "{:?}",
        server.requests()
    );
    let recorded = events(store.as_ref()).await;
    assert_eq!(
        reauthentications(&recorded, "reads"),
        ["renewed", "identical"]
    );
    // Nothing about the refusals reached the model: no server text.
    let message = serde_json::to_string(&finished(&outcome).outcome).unwrap();
    assert!(!message.contains("IGNORE"), "{message}");
    live.servers.shutdown().await;
}

/// A 401 at connect is terminal: `tool.auth_failed`, or
/// `tool.auth_unsupported` when the challenge asks for a user-delegated
/// OAuth flow; no tool registers and the session goes on.
#[tokio::test]
async fn a_401_at_connect_fails_the_server_with_a_stable_code() {
    for (challenge, expected) in [
        (None, ReasonCode::ToolAuthFailed),
        (Some("resource_metadata"), ReasonCode::ToolAuthUnsupported),
    ] {
        let folder = tempfile::tempdir().unwrap();
        let token_file = folder.path().join("token");
        std::fs::write(&token_file, "the-right-one").unwrap();
        let credential = folder.path().join("credential");
        std::fs::write(&credential, "a-wrong-one").unwrap();
        let mut env = vec![("SCRIPTED_TOKEN_FILE", token_file.display().to_string())];
        if let Some(challenge) = challenge {
            env.push(("SCRIPTED_CHALLENGE", challenge.to_owned()));
        }
        let server = ScriptedHttp::start(&env);
        let (store, _db) = sqlite().await;
        let live = live_reads(store.clone(), &server, bearer(&credential)).await;
        let prepared = live.prepare().await;
        assert!(
            !prepared
                .registered
                .iter()
                .any(|name| name.starts_with("mcp.reads.")),
            "{prepared:?}"
        );
        let recorded = events(store.as_ref()).await;
        assert_eq!(
            disconnected_codes(&recorded),
            [expected.as_str()],
            "{recorded:?}"
        );
        // One attempt, never a second with the same value.
        assert_eq!(server.posts_since(0).len(), 1, "{:?}", server.requests());
        let outcome = live.call("demo.echo", json!({"text": "goes on"})).await;
        assert_eq!(status(&outcome), ToolOutcomeStatus::Succeeded);
        if challenge.is_none() {
            // The secret is rotated: the next dial reads it again rather
            // than re-sending the value refused at connect.
            std::fs::write(&credential, "the-right-one").unwrap();
            let prepared = live.prepare().await;
            assert!(
                prepared.registered.contains(&"mcp.reads.echo".to_owned()),
                "{prepared:?}"
            );
        }
        live.servers.shutdown().await;
    }
}

/// `oauth2_client`: a client-credentials exchange at the token endpoint,
/// through egress, with the client's id and secret as HTTP Basic; the token
/// is the bearer of every request. A client the endpoint refuses fails the
/// connection with `tool.auth_failed`.
#[tokio::test]
async fn oauth2_client_credentials_are_exchanged_through_egress() {
    let folder = tempfile::tempdir().unwrap();
    let token_file = folder.path().join("token");
    std::fs::write(&token_file, "issued-token-1").unwrap();
    let server = ScriptedHttp::start(&[
        ("SCRIPTED_TOKEN_FILE", token_file.display().to_string()),
        ("SCRIPTED_CLIENT", "toolgate:s3cr3t".to_owned()),
    ]);
    for (client, expected) in [
        ("toolgate:s3cr3t", None),
        ("toolgate:wrong", Some("tool.auth_failed")),
    ] {
        let credential = folder.path().join("client");
        std::fs::write(&credential, client).unwrap();
        let auth = AuthSettings {
            scheme: AuthScheme::Oauth2Client,
            name: None,
            credential_ref: Some(
                CredentialRef::parse(&format!("file:{}", credential.display())).unwrap(),
            ),
            token_endpoint: Some(format!("http://127.0.0.1:{}/token", server.port)),
            token_scopes: vec!["mcp:read".into()],
        };
        let (store, _db) = sqlite().await;
        let live = live_reads(store.clone(), &server, auth).await;
        live.prepare().await;
        let recorded = events(store.as_ref()).await;
        match expected {
            None => {
                let outcome = live
                    .call("mcp.reads.echo", json!({"text": "tokened"}))
                    .await;
                assert_eq!(
                    status(&outcome),
                    ToolOutcomeStatus::Succeeded,
                    "{outcome:?}"
                );
            }
            Some(expected) => {
                assert_eq!(disconnected_codes(&recorded), [expected], "{recorded:?}");
            }
        }
        live.servers.shutdown().await;
    }
    let requests = server.requests();
    assert!(
        requests.contains(&"POST /token 200".to_owned()),
        "{requests:?}"
    );
    assert!(
        requests.contains(&"POST /token 401".to_owned()),
        "{requests:?}"
    );
    // The refused client never reached the MCP endpoint.
    assert!(
        !requests.iter().any(|line| line == "POST /mcp 401"),
        "{requests:?}"
    );
}

/// A redirect is never followed: the server is left out with
/// `tool.redirect_refused` and nothing else is requested.
#[tokio::test]
async fn a_redirect_is_refused_not_followed() {
    let server = ScriptedHttp::start(&[("SCRIPTED_REDIRECT", "1".to_owned())]);
    let (store, _db) = sqlite().await;
    let live = live_reads(store.clone(), &server, no_auth()).await;
    live.prepare().await;
    let recorded = events(store.as_ref()).await;
    assert_eq!(
        disconnected_codes(&recorded),
        ["tool.redirect_refused"],
        "{recorded:?}"
    );
    assert_eq!(server.requests(), ["POST /mcp 307"]);
    live.servers.shutdown().await;
}

/// A resolver scripted per call, counting its answers.
struct Scripted {
    answers: Vec<Vec<IpAddr>>,
    calls: AtomicUsize,
}

impl Resolve for Scripted {
    fn resolve<'a>(&'a self, _host: &'a str, _port: u16) -> BoxFuture<'a, Vec<IpAddr>> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        let answer = self
            .answers
            .get(call)
            .or(self.answers.last())
            .cloned()
            .unwrap_or_default();
        Box::pin(async move { answer })
    }
}

fn named_dialer(host: &str, port: u16, resolver: Arc<Scripted>, cidrs: &[&str]) -> Dialer {
    Dialer::new(
        EgressSettings {
            allowlist: EgressAllowlist::new(vec![
                AllowEntry::parse(&format!("http://{host}:{port}")).unwrap(),
            ]),
            allowed_cidrs: AllowedCidrs::parse(cidrs).unwrap(),
            connect_timeout: Duration::from_millis(500),
            tls_timeout: Duration::from_secs(2),
        },
        None,
    )
    .unwrap()
    .with_resolver(resolver)
}

/// DNS rebinding: a name is resolved once per dial and the connection goes
/// to the address that passed. A resolver that answers a public address and
/// then a loopback one never gets asked twice, and the loopback listener
/// never sees a connection; an answer that mixes the two is refused whole,
/// naming the rule and never the address.
#[tokio::test]
async fn dns_rebinding_cannot_turn_a_dial_to_a_refused_address() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            counter.fetch_add(1, Ordering::SeqCst);
        }
    });
    let public: IpAddr = "8.8.8.8".parse().unwrap();
    let loopback: IpAddr = "127.0.0.1".parse().unwrap();
    let url = format!("http://rebind.example:{port}/mcp");

    // Public first, loopback on any later lookup.
    let resolver = Arc::new(Scripted {
        answers: vec![vec![public], vec![loopback]],
        calls: AtomicUsize::new(0),
    });
    let dialer = named_dialer("rebind.example", port, resolver.clone(), &[]);
    let dialed = dialer.dial(&url).await;
    assert!(
        matches!(dialed, Err(DialError::Connect | DialError::Timeout)),
        "the public answer was dialled and (offline) failed: {:?}",
        dialed.as_ref().err()
    );
    assert_eq!(resolver.calls.load(Ordering::SeqCst), 1, "resolved once");

    // A mixed answer is what rebinding looks like: refused whole.
    let resolver = Arc::new(Scripted {
        answers: vec![vec![public, loopback]],
        calls: AtomicUsize::new(0),
    });
    let dialer = named_dialer("rebind.example", port, resolver, &[]);
    let refused = dialer.dial(&url).await.err().expect("refused");
    assert_eq!(refused.to_string(), "egress.address_refused: loopback");
    assert_eq!(refused.reason_code(), ReasonCode::ToolEgressRefused);

    // A private answer first is refused before any connection.
    for address in [
        "10.1.2.3",
        "169.254.169.254",
        "::ffff:127.0.0.1",
        "100.64.0.1",
    ] {
        let resolver = Arc::new(Scripted {
            answers: vec![vec![address.parse().unwrap()]],
            calls: AtomicUsize::new(0),
        });
        let dialer = named_dialer("rebind.example", port, resolver, &[]);
        let refused = dialer.dial(&url).await.err().expect("refused");
        assert!(
            refused.to_string().starts_with("egress.address_refused: ")
                && !refused.to_string().contains(address),
            "{address}: {refused}"
        );
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 0, "loopback never dialled");

    // Only an operator's explicit range opens it.
    let resolver = Arc::new(Scripted {
        answers: vec![vec![loopback]],
        calls: AtomicUsize::new(0),
    });
    let dialer = named_dialer("rebind.example", port, resolver, &["127.0.0.1/32"]);
    assert!(dialer.dial(&url).await.is_ok());
}

/// An HTTP server whose name resolves to a refused address is left out
/// with `tool.egress_refused`; a URL outside the allowlist likewise.
#[tokio::test]
async fn a_server_behind_a_refused_address_is_left_out() {
    let (store, _db) = sqlite().await;
    let resolver = Arc::new(Scripted {
        answers: vec![vec!["169.254.169.254".parse().unwrap()]],
        calls: AtomicUsize::new(0),
    });
    let dialer = named_dialer("metadata.example", 80, resolver, &[]);
    let live = live_http(
        store.clone(),
        vec![
            http_server(
                "reads",
                "http://metadata.example/mcp",
                no_auth(),
                idempotent("reads"),
            ),
            http_server(
                "writes",
                "https://not-allowed.example/mcp",
                no_auth(),
                idempotent("writes"),
            ),
        ],
        Arc::new(dialer),
    )
    .await;
    live.prepare().await;
    let recorded = events(store.as_ref()).await;
    assert_eq!(
        disconnected_codes(&recorded),
        ["tool.egress_refused", "tool.egress_refused"],
        "{recorded:?}"
    );
    live.servers.shutdown().await;
}

/// Writes a CA and a server certificate for `names` signed by it, with the
/// openssl command line; returns (ca.pem, cert.pem, key.pem).
fn certificates(folder: &Path, names: &str) -> (PathBuf, PathBuf, PathBuf) {
    let run = |args: &[&str]| {
        let status = Command::new("openssl")
            .args(args)
            .current_dir(folder)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("openssl runs");
        assert!(status.success(), "openssl {args:?}");
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=toolgate test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign",
    ]);
    run(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=server",
    ]);
    std::fs::write(
        folder.join("server.ext"),
        format!("subjectAltName={names}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"),
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "server.ext",
    ]);
    (
        folder.join("ca.pem"),
        folder.join("server.pem"),
        folder.join("server.key"),
    )
}

fn tls_dialer(port: u16, extra_ca: Option<&Path>) -> Dialer {
    Dialer::new(
        EgressSettings {
            allowlist: EgressAllowlist::new(vec![
                AllowEntry::parse(&format!("localhost:{port}")).unwrap(),
            ]),
            allowed_cidrs: AllowedCidrs::parse(&["127.0.0.1/32", "::1/128"]).unwrap(),
            connect_timeout: Duration::from_secs(5),
            tls_timeout: Duration::from_secs(5),
        },
        extra_ca,
    )
    .unwrap()
}

/// TLS with a private CA: an HTTPS server is discovered and called when the
/// operator trusts its CA with `extra_ca_file`; without it, or when the
/// certificate names another host, the handshake fails and nothing is sent.
#[tokio::test]
async fn tls_trusts_the_operators_ca_and_checks_the_name() {
    let pki = tempfile::tempdir().unwrap();
    let (ca, certificate, key) = certificates(pki.path(), "DNS:localhost,IP:127.0.0.1");
    let server = ScriptedHttp::start(&[
        ("SCRIPTED_TLS_CERT", certificate.display().to_string()),
        ("SCRIPTED_TLS_KEY", key.display().to_string()),
    ]);
    let url = format!("https://localhost:{}/mcp", server.port);

    let (store, _db) = sqlite().await;
    let live = live_http(
        store.clone(),
        vec![http_server("reads", &url, no_auth(), idempotent("reads"))],
        Arc::new(tls_dialer(server.port, Some(&ca))),
    )
    .await;
    live.prepare().await;
    let outcome = live
        .call("mcp.reads.echo", json!({"text": "over tls"}))
        .await;
    assert_eq!(
        status(&outcome),
        ToolOutcomeStatus::Succeeded,
        "{outcome:?}"
    );
    assert!(text_of(finished(&outcome)).contains("over tls"));
    live.servers.shutdown().await;

    // The public roots alone do not know the private CA.
    let refused = tls_dialer(server.port, None).dial(&url).await.err();
    assert!(matches!(refused, Some(DialError::Tls)), "{refused:?}");
    let (store, _db) = sqlite().await;
    let live = live_http(
        store.clone(),
        vec![http_server("reads", &url, no_auth(), idempotent("reads"))],
        Arc::new(tls_dialer(server.port, None)),
    )
    .await;
    live.prepare().await;
    let recorded = events(store.as_ref()).await;
    assert_eq!(disconnected_codes(&recorded), ["tool.server_unreachable"]);
    live.servers.shutdown().await;

    // A certificate for another name, from the trusted CA: refused.
    let other = tempfile::tempdir().unwrap();
    let (other_ca, other_certificate, other_key) = certificates(other.path(), "DNS:other.example");
    let mismatched = ScriptedHttp::start(&[
        ("SCRIPTED_TLS_CERT", other_certificate.display().to_string()),
        ("SCRIPTED_TLS_KEY", other_key.display().to_string()),
    ]);
    let url = format!("https://localhost:{}/mcp", mismatched.port);
    let refused = tls_dialer(mismatched.port, Some(&other_ca))
        .dial(&url)
        .await
        .err();
    assert!(matches!(refused, Some(DialError::Tls)), "{refused:?}");
    assert!(server.requests().iter().all(|line| !line.is_empty()));
    assert!(mismatched.requests().is_empty(), "nothing was sent");
}

/// A third-party server over streamable HTTP: the reference server
/// (`@modelcontextprotocol/server-everything` in its `streamableHttp`
/// mode) is discovered through egress and called through the pipeline.
#[tokio::test]
async fn the_reference_server_is_called_over_streamable_http() {
    let script = crate::mcp::third_party()
        .join("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let port = crate::support::free_port();
    let mut child = Command::new("node")
        .arg(&script)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node runs");
    let mut line = String::new();
    let mut stderr = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    while !line.contains("listening") {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "the reference server exited"
        );
    }
    let (store, _db) = sqlite().await;
    let live = live_http(
        store.clone(),
        vec![http_server(
            "everything",
            &format!("http://127.0.0.1:{port}/mcp"),
            no_auth(),
            idempotent("everything"),
        )],
        Arc::new(loopback_dialer(&[port])),
    )
    .await;
    let prepared = live.prepare().await;
    assert!(
        prepared
            .registered
            .contains(&"mcp.everything.get_sum".to_owned()),
        "{prepared:?}"
    );
    let outcome = live
        .call("mcp.everything.get_sum", json!({"a": 2, "b": 40}))
        .await;
    assert_eq!(
        status(&outcome),
        ToolOutcomeStatus::Succeeded,
        "{outcome:?}"
    );
    assert!(text_of(finished(&outcome)).contains("42"), "{outcome:?}");
    live.servers.shutdown().await;
    let _ = child.kill();
    let _ = child.wait();
}

fn offered(live: &Live, tenant: &str) -> Vec<String> {
    let pinned = live.harness.registry.specs_for_session(
        tenant,
        &toolgate::domain::AgentSpec {
            tools: vec!["mcp.*".into()],
        },
        &toolgate::domain::Principal {
            id: "user-1".into(),
            scopes: ["mcp.acme.use".to_owned()].into(),
        },
        &toolgate::domain::PolicyProfile::default(),
        &toolgate::domain::RuntimeEnvironment {
            targets: [toolgate::domain::TargetKind::McpServer].into(),
        },
    );
    pinned
        .advertised()
        .map(|tool| tool.tool.spec.name.clone())
        .collect()
}

/// A tenant's own server is prepared for that tenant's sessions only, and
/// offered only while it answers and is configured: one that stops
/// answering, or that the tenant removes, is withdrawn from new sessions.
#[tokio::test]
async fn a_tenant_server_is_offered_to_its_tenant_only_while_it_answers() {
    use toolgate::pipeline::prepare_mcp;
    use toolgate::ports::McpServerRow;
    let mut server = ScriptedHttp::start(&[]);
    let (store, _db) = sqlite().await;
    let dialer: Arc<dyn EgressDialer> = Arc::new(loopback_dialer(&[server.port]));
    let live = live_with(store.clone(), |_| {
        McpServerSet::new(
            Vec::new(),
            Arc::new(EnvFileResolver::new(Default::default())),
            store.clone(),
            Arc::new(SystemClock),
            Arc::new(MetricsRegistry::default()),
        )
        // Every preparation connects: no reuse window.
        .with_http(Vec::new(), dialer, Duration::ZERO, CEILINGS)
    })
    .await;
    let row = McpServerRow {
        server_id: "acme".into(),
        transport: toolgate::domain::mcp_server::Transport::Http,
        endpoint: server.url(),
        auth_scheme: AuthScheme::None,
        auth_name: None,
        credential_ref: None,
        token_endpoint: None,
        token_scopes: None,
        side_effect: SideEffectClass::ExternalRead,
        risk: RiskLevel::Low,
        idempotency: IdempotencyClass::ReadOnly,
        required_scopes: vec!["mcp.acme.use".into()],
        timeout_seconds: 10,
        maximum_output_bytes: 65536,
        enabled: true,
    };
    store
        .put_mcp_server(crate::pipeline::TENANT, &row, chrono::Utc::now())
        .await
        .unwrap();
    let prepare = |tenant: &'static str| {
        let live = &live;
        async move {
            prepare_mcp(
                &live.harness.registry,
                live.store.as_ref(),
                &SystemClock,
                tenant,
                None,
                live.servers.as_ref(),
            )
            .await
            .unwrap()
        }
    };
    let mine = prepare(crate::pipeline::TENANT).await;
    assert!(
        mine.registered.contains(&"mcp.acme.echo".to_owned()),
        "{mine:?}"
    );
    assert!(offered(&live, crate::pipeline::TENANT).contains(&"mcp.acme.echo".to_owned()));
    let theirs = prepare("tenant-b").await;
    assert!(theirs.registered.is_empty(), "{theirs:?}");
    assert!(offered(&live, "tenant-b").is_empty());
    // The tenant's row is its own: a preparation did not rewrite it as the
    // operator's, and another tenant does not see it.
    assert_eq!(store.tenant_mcp_servers("tenant-b").await.unwrap(), []);
    assert_eq!(
        store
            .tenant_mcp_servers(crate::pipeline::TENANT)
            .await
            .unwrap(),
        std::slice::from_ref(&row)
    );

    // It stops answering: new sessions are not offered its tools.
    drop(server.child.kill());
    let _ = server.child.wait();
    prepare(crate::pipeline::TENANT).await;
    assert!(offered(&live, crate::pipeline::TENANT).is_empty());
    // Back again, then removed by the tenant: withdrawn again.
    server.restart(&[]);
    let again = prepare(crate::pipeline::TENANT).await;
    assert!(
        offered(&live, crate::pipeline::TENANT).contains(&"mcp.acme.echo".to_owned()),
        "{again:?}"
    );
    assert!(
        store
            .delete_mcp_server(crate::pipeline::TENANT, "acme")
            .await
            .unwrap()
    );
    prepare(crate::pipeline::TENANT).await;
    assert!(offered(&live, crate::pipeline::TENANT).is_empty());
    live.servers.shutdown().await;
}

/// An answer past the call's hard output ceiling ends the call as output
/// too large, whatever the server sends it as; the server stays usable.
#[tokio::test]
async fn an_http_answer_past_the_ceiling_is_output_too_large() {
    let server = ScriptedHttp::start(&[("SCRIPTED_CATALOG", "probe".to_owned())]);
    let (store, _db) = sqlite().await;
    let live = live_reads(store, &server, no_auth()).await;
    live.prepare().await;
    // 65536 bytes allowed, 4 × that plus framing is the hard ceiling.
    let outcome = live.call("mcp.reads.huge", json!({"bytes": 4 << 20})).await;
    assert_eq!(
        code(&outcome),
        Some(ReasonCode::ToolOutputTooLarge),
        "{outcome:?}"
    );
    // The answer's head up to the ceiling is kept as the call's artifact.
    let kept = finished(&outcome)
        .content
        .iter()
        .find_map(|part| match part {
            toolgate::pipeline::RenderedPart::Artifact { bytes, .. } => Some(*bytes),
            _ => None,
        });
    assert!(
        kept.is_some_and(|bytes| bytes > 4 * 65536 && bytes < 1 << 20),
        "the runaway's head: {kept:?}"
    );
    let outcome = live.call("mcp.reads.huge", json!({"bytes": 1000})).await;
    assert_eq!(
        status(&outcome),
        ToolOutcomeStatus::Succeeded,
        "{outcome:?}"
    );
    live.servers.shutdown().await;
}

/// Of a name's addresses, one that never answers a connection does not use
/// up the dial's deadline: each is tried in its share of the time left.
#[tokio::test]
async fn an_address_that_never_answers_does_not_starve_the_next() {
    use tokio::net::{TcpListener, TcpSocket, TcpStream};
    // A listener whose accept queue is full: the kernel drops further SYNs,
    // so a connection to it hangs rather than failing.
    // The same port on two loopback addresses; another port if the second
    // is taken.
    let (_stuck, good, port) = loop {
        let stuck = TcpSocket::new_v4().unwrap();
        stuck.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let port = stuck.local_addr().unwrap().port();
        if let Ok(good) = TcpListener::bind(("127.0.0.1", port)).await {
            break (stuck.listen(0).unwrap(), good, port);
        }
    };
    let mut fillers = Vec::new();
    for _ in 0..4 {
        if let Ok(Ok(stream)) = tokio::time::timeout(
            Duration::from_millis(100),
            TcpStream::connect(("127.0.0.2", port)),
        )
        .await
        {
            fillers.push(stream);
        }
    }
    assert!(
        tokio::time::timeout(
            Duration::from_millis(300),
            TcpStream::connect(("127.0.0.2", port))
        )
        .await
        .is_err(),
        "a connection to the full listener hangs"
    );
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = good.accept().await {
            held.push(stream);
        }
    });
    let resolver = Arc::new(Scripted {
        answers: vec![vec![
            "127.0.0.2".parse().unwrap(),
            "127.0.0.1".parse().unwrap(),
        ]],
        calls: AtomicUsize::new(0),
    });
    // 500 ms for the whole dial: the stuck address gets half of it.
    let dialer = named_dialer("two.example", port, resolver, &["127.0.0.0/8"]);
    let dialed = dialer.dial(&format!("http://two.example:{port}/mcp")).await;
    assert!(dialed.is_ok(), "{:?}", dialed.err());
}

/// Preparations share eight general slots (`GENERAL_SLOTS`): ten operator
/// HTTP servers behind one address that accepts and never answers are
/// dialled eight at a time; the other two are dialled once slots are
/// given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preparations_hold_at_most_eight_handshakes_at_once() {
    use std::sync::Mutex;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Connections held open, and whether they are let go.
    let held: Arc<Mutex<(Vec<std::net::TcpStream>, bool)>> = Arc::default();
    let accepted = Arc::new(AtomicUsize::new(0));
    {
        let (held, accepted) = (held.clone(), accepted.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                accepted.fetch_add(1, Ordering::SeqCst);
                let mut held = held.lock().unwrap();
                if !held.1 {
                    held.0.push(stream);
                }
            }
        });
    }
    let servers: Vec<HttpServerSettings> = (0..10)
        .map(|index| {
            let mut server = http_server(
                &format!("silent{index}"),
                &format!("http://127.0.0.1:{port}/mcp"),
                no_auth(),
                idempotent(&format!("silent{index}")),
            );
            server.connect_timeout = Duration::from_secs(60);
            server.request_timeout = Duration::from_secs(60);
            server
        })
        .collect();
    let (store, _db) = sqlite().await;
    let set = Arc::new(
        McpServerSet::new(
            Vec::new(),
            Arc::new(EnvFileResolver::new(Default::default())),
            store,
            Arc::new(SystemClock),
            Arc::new(MetricsRegistry::default()),
        )
        .with_http(
            servers,
            Arc::new(loopback_dialer(&[port])),
            Duration::from_secs(300),
            CEILINGS,
        ),
    );
    let discovering = {
        let set = set.clone();
        tokio::spawn(async move {
            toolgate::ports::McpServers::discover(set.as_ref(), crate::pipeline::TENANT, None).await
        })
    };
    let waited = std::time::Instant::now();
    while accepted.load(Ordering::SeqCst) < 8 && waited.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A ninth would be dialled now if the slots let it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        8,
        "eight handshakes at once"
    );
    {
        let mut held = held.lock().unwrap();
        held.1 = true;
        held.0.clear();
    }
    let discoveries = tokio::time::timeout(Duration::from_secs(60), discovering)
        .await
        .expect("every handshake ends once the connections close")
        .unwrap();
    assert_eq!(discoveries.len(), 10);
    assert!(
        discoveries.iter().all(|discovery| matches!(
            discovery.outcome,
            toolgate::ports::DiscoveryOutcome::Failed { .. }
        )),
        "{:?}",
        discoveries.iter().map(|d| d.outcome).collect::<Vec<_>>()
    );
    assert!(
        accepted.load(Ordering::SeqCst) >= 10,
        "the other two dialled"
    );
    set.shutdown().await;
}

/// A server of 2026-07-28 alone (it refuses `initialize`) over HTTP: toolgate
/// asks it `server/discover`, lists and calls it request by request, each
/// carrying its revision, and no session is ever opened.
#[tokio::test]
async fn a_server_that_speaks_only_2026_is_discovered_and_called() {
    let server = ScriptedHttp::start(&[("SCRIPTED_MODERN_ONLY", "1".into())]);
    let (store, _db) = sqlite().await;
    let live = live_reads(store, &server, no_auth()).await;
    let prepared = live.prepare().await;
    assert!(
        prepared.registered.contains(&"mcp.reads.echo".to_owned()),
        "{prepared:?}"
    );
    let outcome = live.call("mcp.reads.echo", json!({"text": "modern"})).await;
    assert_eq!(
        status(&outcome),
        ToolOutcomeStatus::Succeeded,
        "{outcome:?}"
    );
    assert!(text_of(finished(&outcome)).contains("modern"));
    let requests = server.requests();
    assert!(
        requests.iter().any(|line| line.starts_with("POST")),
        "{requests:?}"
    );
    live.servers.shutdown().await;
}
