//! The front door's listeners: connections under the edge's caps and
//! deadlines, `Host` and `Origin` checked on TCP (DNS rebinding) before
//! anything else, the protected-resource metadata (RFC 9728) served to
//! anyone, and every request to the endpoint authenticated.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::http::uri::Authority;
use hyper::{Method, Request, StatusCode};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::auth::Refusal;
use super::handler::Methods;
use super::{Front, MCP_PATH, RESOURCE_METADATA_PATH};
use crate::edge::{GuardedBody, Reply, accept_until, error, reply, serve_connection_until};
use crate::ports::front::{FrontMethods, McpProtocol};

/// One listener's protocol side.
pub(super) struct Protocol {
    /// The protocol's server side (`adapters::mcp`), over the front
    /// door's methods.
    pub(super) mcp: Arc<dyn McpProtocol>,
    /// TCP, where `Host` and `Origin` are checked.
    tcp: bool,
}

impl Front {
    /// The methods the protocol's side calls, over this front door.
    pub fn methods(self: &Arc<Self>) -> Arc<dyn FrontMethods> {
        Arc::new(Methods::new(self.clone()))
    }

    /// Serves the front door on TCP until `shutdown` fires.
    pub async fn serve_tcp(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        mcp: Arc<dyn McpProtocol>,
        shutdown: CancellationToken,
    ) {
        let protocol = Arc::new(Protocol { mcp, tcp: true });
        accept_until(listener, "front door", shutdown, |stream| {
            self.clone().connection(stream, protocol.clone());
        })
        .await;
    }

    /// Serves the front door on a unix socket until `shutdown` fires.
    pub async fn serve_unix(
        self: Arc<Self>,
        listener: tokio::net::UnixListener,
        mcp: Arc<dyn McpProtocol>,
        shutdown: CancellationToken,
    ) {
        let protocol = Arc::new(Protocol { mcp, tcp: false });
        accept_until(listener, "front door socket", shutdown, |stream| {
            self.clone().connection(stream, protocol.clone());
        })
        .await;
    }

    fn connection<S>(self: Arc<Self>, stream: S, protocol: Arc<Protocol>)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let header_timeout = self.parts.settings.limits.header_timeout;
        // A full door asks a connection serving no request to close and
        // hands its place to this one; with none, this one is closed.
        let Some(place) = self
            .parts
            .connections
            .admit()
            .or_else(|| self.live.evict_idle())
        else {
            return;
        };
        let live = self.live.register(place);
        let close = live.close.clone();
        // An unauthenticated peer holds a place for a short time only: a
        // connection with no whole request head by then is closed.
        let first_request = self.parts.settings.first_request;
        let watched = Arc::downgrade(&live);
        tokio::spawn(async move {
            tokio::time::sleep(first_request).await;
            if let Some(live) = watched.upgrade()
                && !live.used()
            {
                live.close.cancel();
            }
        });
        tokio::spawn(serve_connection_until(
            stream,
            header_timeout,
            Vec::new(),
            close,
            move |request| {
                let (front, protocol) = (self.clone(), protocol.clone());
                let busy = live.begin();
                async move {
                    // Busy until the response's body is written: a streamed
                    // answer is still a request in progress.
                    GuardedBody::around(front.request(request, &protocol).await, busy)
                }
            },
        ));
    }

    async fn request(self: &Arc<Self>, request: Request<Incoming>, protocol: &Protocol) -> Reply {
        if protocol.tcp
            && let Some(refused) = self.rebinding_refusal(&request)
        {
            return refused;
        }
        let path = request.uri().path();
        if path == RESOURCE_METADATA_PATH || path == format!("{RESOURCE_METADATA_PATH}{MCP_PATH}") {
            return if request.method() == Method::GET {
                reply(StatusCode::OK, &self.resource_metadata(&request))
            } else {
                error(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "method_not_allowed",
                    "GET only",
                )
            };
        }
        if path != MCP_PATH {
            return error(
                StatusCode::NOT_FOUND,
                "not_found",
                "the MCP endpoint is /mcp",
            );
        }
        if self.parts.in_flight.draining() {
            let mut refused = error(
                StatusCode::SERVICE_UNAVAILABLE,
                "draining",
                "toolgate is shutting down; retry on another node",
            );
            refused
                .headers_mut()
                .insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("1"));
            return refused;
        }
        let caller = match self.parts.credentials.authenticate(request.headers()).await {
            Ok(caller) => caller,
            Err(refusal) => return self.unauthorized(&request, refusal),
        };
        self.mcp(request, caller, protocol).await
    }

    /// The refusal of a TCP request whose `Host` is not one the operator
    /// allows, or whose `Origin` is neither one of those hosts nor an origin
    /// the operator lists: a page a browser loaded from elsewhere cannot
    /// reach the endpoint through a name it rebinds.
    fn rebinding_refusal(&self, request: &Request<Incoming>) -> Option<Reply> {
        let settings = &self.parts.settings;
        let host = request
            .headers()
            .get(hyper::header::HOST)
            .and_then(|value| value.to_str().ok())
            // A host with user information names another host to anyone
            // who reads it differently.
            .filter(|value| !value.contains('@'))
            .and_then(|value| value.parse::<Authority>().ok());
        if !host.is_some_and(|authority| self.host_allowed(&authority)) {
            return Some(error(
                StatusCode::FORBIDDEN,
                "host_not_allowed",
                "the Host header is not one this endpoint answers to",
            ));
        }
        if let Some(origin) = request.headers().get(hyper::header::ORIGIN) {
            let origin = origin.to_str().unwrap_or_default().trim_end_matches('/');
            let listed = settings
                .allowed_origins
                .iter()
                .any(|allowed| allowed.trim_end_matches('/').eq_ignore_ascii_case(origin));
            let own = origin
                .split_once("://")
                .filter(|(scheme, _)| matches!(*scheme, "http" | "https"))
                .and_then(|(_, authority)| authority.parse::<Authority>().ok())
                .is_some_and(|authority| self.host_allowed(&authority));
            if !(listed || own) {
                return Some(error(
                    StatusCode::FORBIDDEN,
                    "origin_not_allowed",
                    "requests from this origin are not allowed",
                ));
            }
        }
        None
    }

    /// Whether `authority` names a host the endpoint answers to, port and
    /// all: an entry with a port matches that port only; one without
    /// matches no port (the scheme's own, behind a proxy) or the port the
    /// endpoint listens on, never any other.
    fn host_allowed(&self, authority: &Authority) -> bool {
        let settings = &self.parts.settings;
        let name = authority.host().trim_matches(['[', ']']);
        let port = authority.port_u16();
        settings.allowed_hosts.iter().any(|entry| {
            let (host, entry_port) = match entry.parse::<Authority>() {
                Ok(allowed) => (allowed.host().to_owned(), allowed.port_u16()),
                Err(_) => (entry.clone(), None),
            };
            let ports_match = match entry_port {
                Some(entry_port) => port == Some(entry_port),
                None => port.is_none() || port == settings.listen_port,
            };
            host.trim_matches(['[', ']']).eq_ignore_ascii_case(name) && ports_match
        })
    }

    /// The endpoint's URL: as configured, else as this request reached it.
    fn resource(&self, request: &Request<Incoming>) -> String {
        if let Some(resource) = &self.parts.settings.resource {
            return resource.clone();
        }
        let host = request
            .headers()
            .get(hyper::header::HOST)
            .and_then(|value| value.to_str().ok())
            .filter(|host| !host.is_empty() && host.bytes().all(|b| b.is_ascii_graphic()))
            .unwrap_or("localhost");
        format!("http://{host}{MCP_PATH}")
    }

    /// RFC 9728 §3.1: the metadata URL is the resource's with the
    /// well-known path inserted after its authority.
    fn resource_metadata_url(&self, request: &Request<Incoming>) -> String {
        let resource = self.resource(request);
        match resource.split_once("://") {
            Some((scheme, rest)) => {
                let (authority, path) = rest.find('/').map_or((rest, ""), |at| rest.split_at(at));
                format!("{scheme}://{authority}{RESOURCE_METADATA_PATH}{path}")
            }
            None => resource,
        }
    }

    fn resource_metadata(&self, request: &Request<Incoming>) -> serde_json::Value {
        let settings = &self.parts.settings;
        let mut metadata = json!({
            "resource": self.resource(request),
            "authorization_servers": settings.authorization_servers,
            "bearer_methods_supported": ["header"],
            "resource_name": "toolgate",
        });
        if !settings.scopes_supported.is_empty() {
            metadata["scopes_supported"] = json!(settings.scopes_supported);
        }
        metadata
    }

    /// 401 with the challenge MCP clients follow to the metadata.
    fn unauthorized(&self, request: &Request<Incoming>, refusal: Refusal) -> Reply {
        let metadata = self.resource_metadata_url(request);
        let challenge = match refusal {
            Refusal::Missing => format!("Bearer resource_metadata=\"{metadata}\""),
            Refusal::Invalid => format!(
                "Bearer resource_metadata=\"{metadata}\", error=\"invalid_token\", error_description=\"the credential is not valid\""
            ),
        };
        let mut refused = error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            match refusal {
                Refusal::Missing => "a bearer credential is required",
                Refusal::Invalid => "the credential is not valid",
            },
        );
        if let Ok(value) = HeaderValue::from_str(&challenge) {
            refused
                .headers_mut()
                .insert(hyper::header::WWW_AUTHENTICATE, value);
        }
        refused
    }
}
