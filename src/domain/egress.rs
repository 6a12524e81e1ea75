//! The egress allowlist as a pure rule: which URLs toolgate may dial.
//!
//! Name matching, and the reading of a host that is an address in any
//! spelling (so `0x7f.1` is 127.0.0.1 here exactly as it would be to a
//! resolver). Resolving and dialing belong to `adapters::egress`, which
//! calls this same check first and classifies every address with
//! [`classify`], so configuration validation and the dialer cannot disagree
//! about a URL.

use std::fmt;

use serde::{Deserialize, Serialize};

pub use super::addresses::{
    AllowedCidrs, HostKind, Refusal, classify, parse_host, parse_ip_literal, permitted,
};

/// A URL reduced to what egress decides on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressUrl {
    /// `http` or `https`.
    pub scheme: Scheme,
    /// Lowercase host name or IP literal (IPv6 without brackets).
    pub host: String,
    /// Explicit or the scheme's default.
    pub port: u16,
}

/// The schemes an MCP HTTP server or token endpoint may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scheme {
    /// Plain HTTP; only where an allowlist entry names it explicitly.
    Http,
    /// HTTPS, the default.
    Https,
}

impl Scheme {
    fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

/// Why a URL cannot be dialed. Never echoes the URL: it may carry a token in
/// its query or user information.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    /// Not `http://` or `https://`.
    #[error("URL scheme must be http or https")]
    Scheme,
    /// Credentials inside the URL.
    #[error("URL must not carry user information")]
    UserInfo,
    /// Empty or malformed host.
    #[error("URL host is missing or malformed")]
    Host,
    /// Port not a number in 1..=65535.
    #[error("URL port is malformed")]
    Port,
    /// No allowlist entry matches.
    #[error("URL is not permitted by the egress allowlist")]
    NotAllowed,
}

impl EgressUrl {
    /// Parses the parts egress decides on, refusing what it must never dial.
    pub fn parse(url: &str) -> Result<Self, EgressError> {
        let (scheme, rest) = split_scheme(url)?;
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let authority = &rest[..authority_end];
        if authority.contains('@') {
            return Err(EgressError::UserInfo);
        }
        let (host, port) = split_host_port(authority)?;
        let port = match port {
            Some(port) => port,
            None => scheme.default_port(),
        };
        // An address in an odd spelling is that address, here as to any
        // resolver; its canonical form is what the allowlist and the
        // address rules see.
        let host = match parse_host(&host) {
            HostKind::Ip(address) => address.to_string(),
            HostKind::Name => host,
            HostKind::Malformed => return Err(EgressError::Host),
        };
        Ok(EgressUrl { scheme, host, port })
    }
}

fn split_scheme(url: &str) -> Result<(Scheme, &str), EgressError> {
    let (scheme, rest) = url.split_once("://").ok_or(EgressError::Scheme)?;
    let scheme = if scheme.eq_ignore_ascii_case("https") {
        Scheme::Https
    } else if scheme.eq_ignore_ascii_case("http") {
        Scheme::Http
    } else {
        return Err(EgressError::Scheme);
    };
    Ok((scheme, rest))
}

fn split_host_port(authority: &str) -> Result<(String, Option<u16>), EgressError> {
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']').ok_or(EgressError::Host)?;
        if host.is_empty()
            || !host
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        {
            return Err(EgressError::Host);
        }
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or(EgressError::Port)?),
        };
        (host.to_ascii_lowercase(), port)
    } else {
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        };
        let valid = !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
            && !host.starts_with(['.', '-'])
            && !host.contains("..");
        if !valid {
            return Err(EgressError::Host);
        }
        (host.to_ascii_lowercase(), port)
    };
    let port = match port {
        None => None,
        Some(text) => match text.parse::<u16>() {
            Ok(port) if port > 0 && text.bytes().all(|b| b.is_ascii_digit()) => Some(port),
            _ => return Err(EgressError::Port),
        },
    };
    Ok((host, port))
}

/// One allowlist entry: `host`, `*.domain` (subdomains only), either with an
/// optional `:port`, and an optional `http://` or `https://` prefix (https
/// when omitted). Written as that text wherever it is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AllowEntry {
    scheme: Scheme,
    host: HostPattern,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    Exact(String),
    /// Matches names ending in `.{suffix}`, never the suffix itself.
    Subdomains(String),
}

impl AllowEntry {
    /// Parses an entry.
    pub fn parse(entry: &str) -> Result<Self, EgressError> {
        let (scheme, rest) = if entry.contains("://") {
            split_scheme(entry)?
        } else {
            (Scheme::Https, entry)
        };
        if rest.contains(['/', '?', '#', '@']) {
            return Err(EgressError::Host);
        }
        let (host, wildcard) = match rest.strip_prefix("*.") {
            Some(suffix) => (suffix, true),
            None => (rest, false),
        };
        let (host, port) = split_host_port(host)?;
        let host = if wildcard {
            HostPattern::Subdomains(host)
        } else {
            HostPattern::Exact(host)
        };
        Ok(AllowEntry { scheme, host, port })
    }

    fn permits(&self, url: &EgressUrl) -> bool {
        let port = self.port.unwrap_or(self.scheme.default_port());
        let host = match &self.host {
            HostPattern::Exact(host) => url.host == *host,
            HostPattern::Subdomains(suffix) => url
                .host
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        };
        self.scheme == url.scheme && port == url.port && host
    }
}

impl TryFrom<String> for AllowEntry {
    type Error = EgressError;

    fn try_from(entry: String) -> Result<Self, Self::Error> {
        AllowEntry::parse(&entry)
    }
}

impl From<AllowEntry> for String {
    fn from(entry: AllowEntry) -> String {
        entry.to_string()
    }
}

impl fmt::Display for AllowEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        let host = match &self.host {
            HostPattern::Exact(host) => host.clone(),
            HostPattern::Subdomains(suffix) => format!("*.{suffix}"),
        };
        match self.port {
            Some(port) => write!(f, "{scheme}://{host}:{port}"),
            None => write!(f, "{scheme}://{host}"),
        }
    }
}

/// The allowlist. Empty permits nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressAllowlist {
    entries: Vec<AllowEntry>,
}

impl EgressAllowlist {
    /// An allowlist of parsed entries.
    pub fn new(entries: Vec<AllowEntry>) -> Self {
        EgressAllowlist { entries }
    }

    /// Parses `url` and checks it against the entries.
    pub fn check(&self, url: &str) -> Result<EgressUrl, EgressError> {
        let parsed = EgressUrl::parse(url)?;
        if self.entries.iter().any(|entry| entry.permits(&parsed)) {
            Ok(parsed)
        } else {
            Err(EgressError::NotAllowed)
        }
    }
}

/// Whether `url` is HTTPS, or HTTP to this machine's loopback: what RFC
/// 8414 and OAuth 2.1 allow an authorization server's endpoints, and where
/// an authorization server fetches a client's metadata document.
pub fn secure_or_loopback(url: &str) -> bool {
    let Some((scheme, rest)) = url.split_once("://") else {
        return false;
    };
    if scheme == "https" {
        return true;
    }
    if scheme != "http" {
        return false;
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let host = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => host.split(':').next().unwrap_or_default(),
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|address| address.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowlist(entries: &[&str]) -> EgressAllowlist {
        EgressAllowlist::new(
            entries
                .iter()
                .map(|e| AllowEntry::parse(e).unwrap())
                .collect(),
        )
    }

    #[test]
    fn exact_hosts_default_to_https_443() {
        let list = allowlist(&["auth.example.com"]);
        assert!(list.check("https://auth.example.com/oauth/token").is_ok());
        assert!(list.check("https://AUTH.example.com:443/x").is_ok());
        assert_eq!(
            list.check("http://auth.example.com/"),
            Err(EgressError::NotAllowed)
        );
        assert_eq!(
            list.check("https://auth.example.com:8443/"),
            Err(EgressError::NotAllowed)
        );
        assert_eq!(
            list.check("https://evil.auth.example.com/"),
            Err(EgressError::NotAllowed)
        );
        assert_eq!(
            list.check("https://auth.example.com.evil.net/"),
            Err(EgressError::NotAllowed)
        );
    }

    #[test]
    fn wildcards_match_subdomains_only() {
        let list = allowlist(&["*.example.com", "http://127.0.0.1:8080", "[::1]:9000"]);
        assert!(list.check("https://api.example.com").is_ok());
        assert!(list.check("https://a.b.example.com/x").is_ok());
        assert_eq!(
            list.check("https://example.com"),
            Err(EgressError::NotAllowed)
        );
        assert_eq!(
            list.check("https://badexample.com"),
            Err(EgressError::NotAllowed)
        );
        assert!(list.check("http://127.0.0.1:8080/mcp").is_ok());
        assert!(list.check("https://[::1]:9000/mcp").is_ok());
    }

    #[test]
    fn refuses_what_must_never_be_dialed() {
        let list = allowlist(&["example.com"]);
        assert_eq!(
            list.check("https://user:pw@example.com/"),
            Err(EgressError::UserInfo)
        );
        assert_eq!(list.check("ftp://example.com/"), Err(EgressError::Scheme));
        assert_eq!(list.check("example.com"), Err(EgressError::Scheme));
        assert_eq!(list.check("https:///x"), Err(EgressError::Host));
        assert_eq!(list.check("https://example.com:0/"), Err(EgressError::Port));
        assert_eq!(
            list.check("https://example.com:+1/"),
            Err(EgressError::Port)
        );
        assert_eq!(
            EgressAllowlist::default().check("https://example.com"),
            Err(EgressError::NotAllowed)
        );
    }

    #[test]
    fn errors_never_echo_the_url() {
        let error = allowlist(&[])
            .check("https://user:sk-secret@example.com/")
            .unwrap_err();
        assert!(!error.to_string().contains("sk-secret"));
    }

    #[test]
    fn an_authorization_server_is_https_or_loopback() {
        for good in [
            "https://as.example.com/authorize",
            "http://127.0.0.1:8080/token",
            "http://localhost/token",
            "http://[::1]:9/x",
        ] {
            assert!(secure_or_loopback(good), "{good}");
        }
        for bad in [
            "http://as.example.com/token",
            "http://127.0.0.1.evil.example/x",
            "http://localhost.evil.example/x",
            "ftp://127.0.0.1/x",
            "http://10.0.0.1/x",
        ] {
            assert!(!secure_or_loopback(bad), "{bad}");
        }
    }
}
