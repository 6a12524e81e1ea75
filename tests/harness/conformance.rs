//! The MCP conformance suite's client under test: toolgate's own HTTP
//! adapter (the egress dialer, the authenticator and the streamable-HTTP
//! session toolgate dials every HTTP server with), driven per scenario.
//!
//! The runner appends the server URL as the last argument and names the
//! scenario in `MCP_CONFORMANCE_SCENARIO` (and, for authorization
//! scenarios, the client's credentials in `MCP_CONFORMANCE_CONTEXT`). The
//! suite's servers listen on localhost over plain HTTP, so egress allows
//! exactly their origins and the loopback range. Exits 0 when the session
//! did what the scenario asks.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use toolgate::adapters::credentials::EnvFileResolver;
use toolgate::adapters::egress::{Dialer, EgressSettings};
use toolgate::adapters::mcp::auth::{AuthSettings, Authenticator, path_of};
use toolgate::adapters::mcp::client::Connection;
use toolgate::adapters::mcp::framing::Ceilings;
use toolgate::adapters::mcp::http::EgressClient;
use toolgate::domain::egress::{AllowEntry, AllowedCidrs, EgressAllowlist, EgressUrl, Scheme};
use toolgate::domain::mcp_server::AuthScheme;
use toolgate::domain::secret::CredentialRef;
use toolgate::ports::{EgressDialer, SystemClock};

const TIMEOUT: Duration = Duration::from_secs(20);

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// Egress that may reach exactly the origins of `urls`, over loopback.
fn dialer(urls: &[&str]) -> Result<Arc<Dialer>, Failure> {
    let mut entries = Vec::new();
    for url in urls {
        let parsed = EgressUrl::parse(url)?;
        let scheme = match parsed.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        entries.push(AllowEntry::parse(&format!(
            "{scheme}://{}:{}",
            parsed.host, parsed.port
        ))?);
    }
    Ok(Arc::new(Dialer::new(
        EgressSettings {
            allowlist: EgressAllowlist::new(entries),
            allowed_cidrs: AllowedCidrs::parse(&["127.0.0.1/32", "::1/128"])?,
            connect_timeout: TIMEOUT,
            tls_timeout: TIMEOUT,
        },
        None,
    )?))
}

/// A GET of a JSON document through egress.
async fn fetch_json(url: &str) -> Result<Value, Failure> {
    let dialed = dialer(&[url])?.dial(url).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(dialed.stream)).await?;
    tokio::spawn(connection);
    let host = match dialed.url.port {
        80 | 443 => dialed.url.host.clone(),
        port => format!("{}:{port}", dialed.url.host),
    };
    let request = hyper::Request::get(path_of(url))
        .header(hyper::header::HOST, host)
        .header(hyper::header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let body = Limited::new(response.into_body(), 1 << 20)
        .collect()
        .await
        .map_err(|error| error.to_string())?
        .to_bytes();
    Ok(serde_json::from_slice(&body)?)
}

/// The token endpoint the server's protected-resource metadata leads to.
async fn token_endpoint(server_url: &str) -> Result<String, Failure> {
    let parsed = EgressUrl::parse(server_url)?;
    let origin = format!("http://{}:{}", parsed.host, parsed.port);
    let resource = fetch_json(&format!(
        "{origin}/.well-known/oauth-protected-resource{}",
        path_of(server_url)
    ))
    .await?;
    let issuer = resource["authorization_servers"][0]
        .as_str()
        .ok_or("no authorization server in the resource metadata")?
        .trim_end_matches('/')
        .to_owned();
    let metadata = fetch_json(&format!("{issuer}/.well-known/oauth-authorization-server")).await?;
    Ok(metadata["token_endpoint"]
        .as_str()
        .ok_or("no token endpoint in the authorization server metadata")?
        .to_owned())
}

async fn run(scenario: &str, url: &str) -> Result<(), Failure> {
    let mut environment = BTreeMap::new();
    let mut auth = AuthSettings {
        scheme: AuthScheme::None,
        name: None,
        credential_ref: None,
        token_endpoint: None,
        token_scopes: Vec::new(),
    };
    let mut origins = vec![url.to_owned()];
    if scenario.starts_with("auth/client-credentials") {
        let context: Value =
            serde_json::from_str(&std::env::var("MCP_CONFORMANCE_CONTEXT").unwrap_or_default())?;
        let id = context["client_id"].as_str().unwrap_or_default();
        let secret = context["client_secret"].as_str().unwrap_or_default();
        environment.insert("CONFORMANCE_CLIENT".to_owned(), format!("{id}:{secret}"));
        let endpoint = token_endpoint(url).await?;
        origins.push(endpoint.clone());
        auth = AuthSettings {
            scheme: AuthScheme::Oauth2Client,
            name: None,
            credential_ref: Some(CredentialRef::parse("env:CONFORMANCE_CLIENT")?),
            token_endpoint: Some(endpoint),
            token_scopes: Vec::new(),
        };
    }
    let origins: Vec<&str> = origins.iter().map(String::as_str).collect();
    let dialer = dialer(&origins)?;
    let authenticator = Arc::new(Authenticator::new(
        auth,
        Arc::new(EnvFileResolver::new(environment)),
        dialer.clone(),
        Arc::new(SystemClock),
    ));
    let ceilings = Ceilings::new(1 << 20);
    let client = EgressClient::new(
        "conformance",
        dialer,
        authenticator,
        TIMEOUT,
        ceilings.clone(),
    );
    let connection = Connection::open_http("conformance", client, url, TIMEOUT, ceilings).await?;
    if scenario == "initialize" {
        // The scenario's server answers the handshake and nothing else.
        connection.close(Duration::from_secs(2)).await;
        return Ok(());
    }
    let tools = connection.list_tools(TIMEOUT).await?;
    let has = |name: &str| tools.iter().any(|tool| tool.name == name);
    let call = match scenario {
        "tools_call" if has("add_numbers") => Some(("add_numbers", json!({"a": 2, "b": 3}))),
        "sse-retry" if has("test_reconnection") => Some(("test_reconnection", json!({}))),
        _ => None,
    };
    match call {
        Some((name, Value::Object(arguments))) => {
            let answer = connection
                .call_tool(name, arguments, "conformance-key", TIMEOUT)
                .await?;
            println!("{}", serde_json::to_string(&answer.content)?);
        }
        _ => println!("{} tools", tools.len()),
    }
    connection.close(Duration::from_secs(2)).await;
    Ok(())
}

#[tokio::main]
async fn main() {
    let scenario = std::env::var("MCP_CONFORMANCE_SCENARIO").unwrap_or_default();
    let Some(url) = std::env::args().next_back() else {
        eprintln!("usage: conformance_client URL");
        std::process::exit(2);
    };
    if let Err(error) = run(&scenario, &url).await {
        eprintln!("{scenario}: {error}");
        std::process::exit(1);
    }
}
