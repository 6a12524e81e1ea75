//! The egress dialer: the one place toolgate opens a connection to the
//! outside on a tenant's or a server's behalf.
//!
//! The allowlist is checked first; then the host is resolved once (an IP
//! literal, in any spelling, is an address and is not resolved), every
//! address is classified, and the connection is made to an address that
//! passed, never by resolving again: no window in which a second DNS answer
//! can point the connection somewhere else. Addresses the rules refuse
//! (loopback, private, link-local and the rest) are dialled only when the
//! operator allows their range explicitly. `https` gets TLS with rustls
//! against the public roots and the operator's own CAs, with the URL's host
//! as the server name. No proxy is consulted: nothing here reads the
//! environment.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::domain::egress::{
    AllowedCidrs, EgressAllowlist, EgressUrl, Scheme, parse_ip_literal, permitted,
};
use crate::ports::{BoxFuture, DialError, Dialed, EgressDialer, EgressStream};

/// Why the dialer could not be built.
#[derive(Debug, thiserror::Error)]
pub enum EgressSetupError {
    /// The extra CA file could not be read or holds no certificate.
    #[error("egress.extra_ca_file: {0}")]
    ExtraCa(String),
    /// The TLS configuration was refused.
    #[error("TLS configuration: {0}")]
    Tls(String),
}

/// What the dialer is configured with.
#[derive(Debug, Clone)]
pub struct EgressSettings {
    /// Which URLs may be dialled at all.
    pub allowlist: EgressAllowlist,
    /// Address ranges dialled although the address rules refuse them.
    pub allowed_cidrs: AllowedCidrs,
    /// One deadline for resolving and connecting together.
    pub connect_timeout: Duration,
    /// Deadline for the TLS handshake.
    pub tls_timeout: Duration,
}

/// Resolves a host name to its addresses, once per dial.
pub trait Resolve: Send + Sync {
    /// The addresses of `host`.
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> BoxFuture<'a, Vec<IpAddr>>;
}

/// The system's resolver.
#[derive(Debug, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> BoxFuture<'a, Vec<IpAddr>> {
        Box::pin(async move {
            tokio::net::lookup_host((host, port))
                .await
                .map(|addresses| addresses.map(|address| address.ip()).collect())
                .unwrap_or_default()
        })
    }
}

/// The dialer.
pub struct Dialer {
    settings: EgressSettings,
    resolver: Arc<dyn Resolve>,
    tls: tokio_rustls::TlsConnector,
}

/// The trust roots: the public web PKI, plus the operator's own CAs.
fn tls_config(extra_ca_file: Option<&Path>) -> Result<rustls::ClientConfig, EgressSetupError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(file) = extra_ca_file {
        let certificates: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(file)
            .map_err(|error| EgressSetupError::ExtraCa(error.to_string()))?
            .collect::<Result<_, _>>()
            .map_err(|error| EgressSetupError::ExtraCa(error.to_string()))?;
        if certificates.is_empty() {
            return Err(EgressSetupError::ExtraCa(
                "no certificate in the file".into(),
            ));
        }
        for certificate in certificates {
            roots
                .add(certificate)
                .map_err(|error| EgressSetupError::ExtraCa(error.to_string()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| EgressSetupError::Tls(error.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

impl Dialer {
    /// A dialer with the system resolver, trusting the public roots and the
    /// CAs in `extra_ca_file`.
    pub fn new(
        settings: EgressSettings,
        extra_ca_file: Option<&Path>,
    ) -> Result<Self, EgressSetupError> {
        let tls = tokio_rustls::TlsConnector::from(Arc::new(tls_config(extra_ca_file)?));
        Ok(Dialer {
            settings,
            resolver: Arc::new(SystemResolver),
            tls,
        })
    }

    /// The same dialer resolving through `resolver`.
    pub fn with_resolver(mut self, resolver: Arc<dyn Resolve>) -> Self {
        self.resolver = resolver;
        self
    }

    /// The addresses `url` may be dialled at: its literal address, or what
    /// its name resolves to, once, by `deadline`; refused when any of them
    /// is refused.
    async fn addresses(
        &self,
        url: &EgressUrl,
        deadline: Instant,
    ) -> Result<Vec<IpAddr>, DialError> {
        let addresses = match parse_ip_literal(&url.host) {
            Some(address) => vec![address],
            None => tokio::time::timeout_at(deadline, self.resolver.resolve(&url.host, url.port))
                .await
                .map_err(|_| DialError::Timeout)?,
        };
        if addresses.is_empty() {
            return Err(DialError::Unresolved);
        }
        // A name that resolves to a refused address among permitted ones is
        // refused whole: the mix is what a rebinding answer looks like.
        for address in &addresses {
            permitted(*address, &self.settings.allowed_cidrs)
                .map_err(|refusal| DialError::AddressRefused(refusal.as_str()))?;
        }
        Ok(addresses)
    }

    /// A connection to the first of `addresses` that accepts one by
    /// `deadline`. Each attempt gets an equal share of the time left, so an
    /// address that never answers cannot use up the others' time.
    async fn connect(
        &self,
        addresses: &[IpAddr],
        port: u16,
        deadline: Instant,
    ) -> Result<TcpStream, DialError> {
        let mut timed_out = false;
        for (tried, address) in addresses.iter().enumerate() {
            let left = deadline.saturating_duration_since(Instant::now());
            let untried = u32::try_from(addresses.len() - tried).unwrap_or(u32::MAX);
            let share = left / untried.max(1);
            match tokio::time::timeout(share, TcpStream::connect(SocketAddr::new(*address, port)))
                .await
            {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
                }
                Ok(Err(_)) => {}
                Err(_) => timed_out = true,
            }
        }
        Err(if timed_out {
            DialError::Timeout
        } else {
            DialError::Connect
        })
    }
}

impl EgressDialer for Dialer {
    fn dial<'a>(&'a self, url: &'a str) -> BoxFuture<'a, Result<Dialed, DialError>> {
        Box::pin(async move {
            let url = self.settings.allowlist.check(url)?;
            // One deadline for resolving and connecting together.
            let deadline = Instant::now() + self.settings.connect_timeout;
            let addresses = self.addresses(&url, deadline).await?;
            let tcp = self.connect(&addresses, url.port, deadline).await?;
            let stream: Box<dyn EgressStream> = match url.scheme {
                Scheme::Http => Box::new(tcp),
                Scheme::Https => {
                    let name = match parse_ip_literal(&url.host) {
                        Some(address) => ServerName::IpAddress(address.into()),
                        None => {
                            ServerName::try_from(url.host.clone()).map_err(|_| DialError::Tls)?
                        }
                    };
                    let tls = tokio::time::timeout(
                        self.settings.tls_timeout,
                        self.tls.connect(name, tcp),
                    )
                    .await
                    .map_err(|_| DialError::Timeout)?
                    .map_err(|_| DialError::Tls)?;
                    Box::new(tls)
                }
            };
            Ok(Dialed { stream, url })
        })
    }
}
