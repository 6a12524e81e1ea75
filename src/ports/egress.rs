//! The one way out: every outbound connection toolgate makes on a tenant's
//! or a server's behalf (an MCP endpoint, an OAuth token endpoint) is opened
//! by an [`EgressDialer`], and nothing else in the crate opens one.

use tokio::io::{AsyncRead, AsyncWrite};

use super::tool::BoxFuture;
use crate::domain::ReasonCode;
use crate::domain::egress::{EgressError, EgressUrl};

/// A dialled connection: TCP, with TLS on top for `https`.
pub trait EgressStream: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> EgressStream for T {}

/// Why a URL was not dialled. Messages name the rule or the stage, never the
/// URL, the host or the address: a URL may carry a token, and which address
/// a name resolved to is the operator's business, not a caller's.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DialError {
    /// The URL is malformed or the allowlist does not permit it.
    #[error(transparent)]
    Url(#[from] EgressError),
    /// An address the host is or resolved to is one egress never dials.
    #[error("egress.address_refused: {0}")]
    AddressRefused(&'static str),
    /// The host has no address.
    #[error("the host did not resolve")]
    Unresolved,
    /// The connection failed.
    #[error("the connection failed")]
    Connect,
    /// Connecting or the TLS handshake outlasted its deadline.
    #[error("the connection timed out")]
    Timeout,
    /// The TLS handshake failed (an untrusted or mismatched certificate).
    #[error("the TLS handshake failed")]
    Tls,
}

impl DialError {
    /// The outcome a failed dial ends a call with.
    pub fn reason_code(&self) -> ReasonCode {
        match self {
            DialError::Url(_) | DialError::AddressRefused(_) => ReasonCode::ToolEgressRefused,
            DialError::Unresolved | DialError::Connect | DialError::Timeout | DialError::Tls => {
                ReasonCode::ToolServerUnreachable
            }
        }
    }
}

/// A dialled URL: the connection, and the URL as egress read it (its host
/// is the TLS name and the `Host` header).
pub struct Dialed {
    /// The connection.
    pub stream: Box<dyn EgressStream>,
    /// The URL.
    pub url: EgressUrl,
}

/// Opens connections to the outside.
pub trait EgressDialer: Send + Sync {
    /// Checks `url` against the allowlist, resolves its host once, refuses
    /// unless every address passes the address rules, connects to a passing
    /// address (never resolving again), and for `https` completes TLS with
    /// the URL's host as the server name.
    fn dial<'a>(&'a self, url: &'a str) -> BoxFuture<'a, Result<Dialed, DialError>>;
}
