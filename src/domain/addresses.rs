//! SSRF egress guard: decide whether an IP address may be dialled, and read
//! every spelling a URL host can use for an address.
//!
//! The guard has two halves:
//!
//! * [`classify`] (and [`permitted`], which adds an operator allow-list)
//!   judges an address. It must be applied to every address the dialer is
//!   about to `connect()` to, including every address a name resolved to,
//!   because a name (`localhost`, `127.0.0.1.nip.io`, an attacker's DNS
//!   record) can point anywhere.
//! * [`parse_host`] / [`parse_ip_literal`] recognise a host that *is* an
//!   address, however it is spelled (`2130706433`, `0x7f.1`, `0177.0.0.1`,
//!   `１２７.０.０.１`, `[::ffff:127.0.0.1]`, ...). This matters because other
//!   software in the path (a WHATWG URL parser, libc's `inet_aton` inside
//!   `getaddrinfo`, a proxy) will read such a host as an address, so the
//!   guard must never mistake it for a name that merely needs resolving.
//!
//! Everything here is pure `std` (and serde, for the operator's list as
//! written), allocation-light and panic-free on any input.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

// ---------------------------------------------------------------------------
// Refusal reasons
// ---------------------------------------------------------------------------

/// Why an address may not be dialled. A closed set: each variant has a stable
/// snake_case name ([`Refusal::as_str`]) suitable for logs, metrics and error
/// messages, and `Display` prints exactly that name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// `127.0.0.0/8`, `::1`: the dialling host itself, where admin ports and
    /// sidecars listen on the assumption that only local code can reach them.
    Loopback,
    /// `0.0.0.0`, `::`: "any address"; Linux and the BSDs deliver a
    /// `connect()` to it to the local host, so it is loopback in disguise.
    Unspecified,
    /// RFC 1918 `10/8`, `172.16/12`, `192.168/16`: internal networks.
    Private,
    /// RFC 6598 `100.64.0.0/10`: carrier-grade NAT space, also used for
    /// internal services by some clouds (Alibaba's metadata is
    /// `100.100.100.200`).
    SharedAddressSpace,
    /// `169.254/16`, `fe80::/10`: link-local. Holds the cloud metadata
    /// services (`169.254.169.254` on AWS/GCP/Azure/OCI, `169.254.170.2` for
    /// ECS task credentials), the classic SSRF prize.
    LinkLocal,
    /// `fc00::/7`: IPv6 unique local addresses, the IPv6 analogue of RFC 1918.
    /// Holds AWS's IPv6 metadata endpoint `fd00:ec2::254`.
    UniqueLocal,
    /// `224/4`, `ff00::/8`: multicast is never a unicast TCP/HTTP peer, and
    /// reaching it would probe local-segment services.
    Multicast,
    /// `255.255.255.255`: limited broadcast, the local segment.
    Broadcast,
    /// Documentation ranges, never routed: `192.0.2/24`, `198.51.100/24`,
    /// `203.0.113/24` (RFC 5737), `2001:db8::/32` (RFC 3849), `3fff::/20`
    /// (RFC 9637). A dial to them only succeeds on a misconfigured network.
    Documentation,
    /// Benchmarking ranges `198.18.0.0/15` (RFC 2544), `2001:2::/48`
    /// (RFC 5180): lab space, often reused internally.
    Benchmarking,
    /// Everything else that is not public unicast: IPv4 `0.0.0.0/8` "this
    /// network" (apart from `0.0.0.0`), `192.0.0.0/24` IETF protocol
    /// assignments, `192.88.99.0/24` 6to4 relay anycast (deprecated, RFC
    /// 7526), `240.0.0.0/4` future use; IPv6 `100::/64` discard-only,
    /// `2001::/23` IETF protocol assignments, every IPv6 address outside the
    /// global unicast block `2000::/3`, and the tunnelling/translation forms
    /// refused wholesale (see [`classify`]).
    Reserved,
    /// `fec0::/10`: deprecated IPv6 site-local (RFC 3879), still honoured as
    /// internal by old stacks.
    SiteLocal,
}

impl Refusal {
    /// Every rule, so callers can e.g. pre-register a metric per reason.
    pub const ALL: [Refusal; 12] = [
        Refusal::Loopback,
        Refusal::Unspecified,
        Refusal::Private,
        Refusal::SharedAddressSpace,
        Refusal::LinkLocal,
        Refusal::UniqueLocal,
        Refusal::Multicast,
        Refusal::Broadcast,
        Refusal::Documentation,
        Refusal::Benchmarking,
        Refusal::Reserved,
        Refusal::SiteLocal,
    ];

    /// The stable name of the rule. Part of the external contract (logs,
    /// metrics, error bodies): never rename one.
    pub fn as_str(&self) -> &'static str {
        match self {
            Refusal::Loopback => "loopback",
            Refusal::Unspecified => "unspecified",
            Refusal::Private => "private",
            Refusal::SharedAddressSpace => "carrier_grade_nat",
            Refusal::LinkLocal => "link_local",
            Refusal::UniqueLocal => "unique_local",
            Refusal::Multicast => "multicast",
            Refusal::Broadcast => "broadcast",
            Refusal::Documentation => "documentation",
            Refusal::Benchmarking => "benchmarking",
            Refusal::Reserved => "reserved",
            Refusal::SiteLocal => "site_local",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::error::Error for Refusal {}

// ---------------------------------------------------------------------------
// Classification
// ---------------------------------------------------------------------------

/// Whether `address` lies in `network/len`. `len` 0 matches everything.
fn v4_in(address: u32, network: Ipv4Addr, len: u32) -> bool {
    // checked_shl: a shift by 32 (len 0) is None, i.e. an all-zero mask.
    let mask = u32::MAX.checked_shl(32 - len.min(32)).unwrap_or(0);
    address & mask == u32::from(network) & mask
}

/// Whether `address` lies in `network/len`. `len` 0 matches everything.
fn v6_in(address: u128, network: Ipv6Addr, len: u32) -> bool {
    let mask = u128::MAX.checked_shl(128 - len.min(128)).unwrap_or(0);
    address & mask == u128::from(network) & mask
}

/// IPv4 rules, scanned in order; the first match wins, so a narrower rule
/// sits before any wider rule containing it. Anything unmatched is public.
const V4_RULES: &[(Ipv4Addr, u32, Refusal)] = &[
    // 0.0.0.0 itself is "any": a connect() to it lands on the local host.
    (Ipv4Addr::new(0, 0, 0, 0), 32, Refusal::Unspecified),
    // RFC 1122 "this network": never a valid destination.
    (Ipv4Addr::new(0, 0, 0, 0), 8, Refusal::Reserved),
    (Ipv4Addr::new(10, 0, 0, 0), 8, Refusal::Private),
    (
        Ipv4Addr::new(100, 64, 0, 0),
        10,
        Refusal::SharedAddressSpace,
    ),
    (Ipv4Addr::new(127, 0, 0, 0), 8, Refusal::Loopback),
    (Ipv4Addr::new(169, 254, 0, 0), 16, Refusal::LinkLocal),
    (Ipv4Addr::new(172, 16, 0, 0), 12, Refusal::Private),
    // RFC 6890 IETF protocol assignments: DS-Lite B4 (192.0.0.0/29), NAT64
    // discovery (192.0.0.170/171), PCP/TURN anycast... none is a web peer.
    (Ipv4Addr::new(192, 0, 0, 0), 24, Refusal::Reserved),
    (Ipv4Addr::new(192, 0, 2, 0), 24, Refusal::Documentation),
    // 6to4 relay anycast (deprecated by RFC 7526): a tunnel entry, not a host.
    (Ipv4Addr::new(192, 88, 99, 0), 24, Refusal::Reserved),
    (Ipv4Addr::new(192, 168, 0, 0), 16, Refusal::Private),
    (Ipv4Addr::new(198, 18, 0, 0), 15, Refusal::Benchmarking),
    (Ipv4Addr::new(198, 51, 100, 0), 24, Refusal::Documentation),
    (Ipv4Addr::new(203, 0, 113, 0), 24, Refusal::Documentation),
    (Ipv4Addr::new(224, 0, 0, 0), 4, Refusal::Multicast),
    // Before 240/4, which contains it, so it gets its own name.
    (Ipv4Addr::new(255, 255, 255, 255), 32, Refusal::Broadcast),
    // RFC 1112 "future use": unroutable on the Internet, yet some stacks and
    // clouds use it internally.
    (Ipv4Addr::new(240, 0, 0, 0), 4, Refusal::Reserved),
];

/// IPv6 rules that apply after the special cases in [`classify_v6`] (the
/// unspecified and loopback addresses and the forms embedding IPv4). Scanned
/// in order, first match wins. Whatever is left must still be inside the
/// global unicast block `2000::/3` to pass.
const V6_RULES: &[(Ipv6Addr, u32, Refusal)] = &[
    // RFC 6666 discard-only prefix (a black hole); also outside 2000::/3,
    // but named here so the intent is visible.
    (
        Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0),
        64,
        Refusal::Reserved,
    ),
    // Before 2001::/23, which contains it.
    (
        Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 0),
        48,
        Refusal::Benchmarking,
    ),
    (
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0),
        32,
        Refusal::Documentation,
    ),
    // RFC 2928 IETF protocol assignments (ORCHID identifiers, AMT, AS112,
    // PCP/TURN anycast...): identifiers and infrastructure anycast, not web
    // peers. Teredo (2001::/32) is dealt with before this table.
    (
        Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0),
        23,
        Refusal::Reserved,
    ),
    (
        Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0),
        20,
        Refusal::Documentation,
    ),
    (
        Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0),
        7,
        Refusal::UniqueLocal,
    ),
    (
        Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0),
        10,
        Refusal::LinkLocal,
    ),
    (
        Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0),
        10,
        Refusal::SiteLocal,
    ),
    (
        Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0),
        8,
        Refusal::Multicast,
    ),
];

/// The only IPv6 block IANA hands out as global unicast (RFC 4291 §2.4);
/// everything outside it is special, reserved or unallocated.
const GLOBAL_UNICAST: Ipv6Addr = Ipv6Addr::new(0x2000, 0, 0, 0, 0, 0, 0, 0);

// Prefixes of the IPv6 forms that carry an IPv4 destination.
/// `::ffff:0:0/96`, IPv4-mapped (RFC 4291 §2.5.5.2).
const V4_MAPPED: Ipv6Addr = Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0);
/// `::ffff:0:0:0/96`, IPv4-translated (SIIT, RFC 2765).
const V4_TRANSLATED: Ipv6Addr = Ipv6Addr::new(0, 0, 0, 0, 0xffff, 0, 0, 0);
/// `::/96`, IPv4-compatible (deprecated, RFC 4291 §2.5.5.1).
const V4_COMPATIBLE: Ipv6Addr = Ipv6Addr::UNSPECIFIED;
/// `64:ff9b::/96`, the NAT64 well-known prefix (RFC 6052).
const NAT64_WELL_KNOWN: Ipv6Addr = Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0);
/// `64:ff9b:1::/48`, the NAT64 local-use prefix (RFC 8215).
const NAT64_LOCAL_USE: Ipv6Addr = Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0);
/// `2002::/16`, 6to4 (RFC 3056).
const SIX_TO_FOUR: Ipv6Addr = Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0);
/// `2001::/32`, Teredo (RFC 4380).
const TEREDO: Ipv6Addr = Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0);

/// Decides whether `address` may be dialled: `Ok(())` for a public unicast
/// address, otherwise the rule that refuses it.
///
/// IPv6 addresses that carry an IPv4 destination are judged by that IPv4
/// address first, so `::ffff:127.0.0.1` is refused as `loopback`, exactly
/// like `127.0.0.1`:
///
/// * IPv4-mapped `::ffff:a.b.c.d`: a dual-stack socket sends it over IPv4 to
///   `a.b.c.d`, so it passes exactly when the IPv4 address passes.
/// * NAT64 well-known prefix `64:ff9b::a.b.c.d`: the translator forwards to
///   `a.b.c.d`; it is the normal way an IPv6-only host reaches IPv4, so it
///   too passes exactly when the IPv4 address passes.
/// * IPv4-compatible `::a.b.c.d` (the whole `::/96` apart from `::` and
///   `::1`), IPv4-translated `::ffff:0:a.b.c.d`, NAT64 local-use
///   `64:ff9b:1::/48` (IPv4 in the last 32 bits, the usual /96 layout),
///   6to4 `2002:AABB:CCDD::/48` (IPv4 in bits 16..48) and Teredo
///   `2001:0:SSSS:SSSS:…:~CCCC:~CCCC` (server in bits 32..64, client as the
///   complement of the last 32 bits): a refused embedded address refuses the
///   whole address under its rule; otherwise the address is still refused as
///   `reserved`. These are deprecated or site-specific tunnels whose real
///   destination the socket layer cannot see (a local-use NAT64 prefix may
///   place the IPv4 address elsewhere than the last 32 bits), and no public
///   web service needs to be dialled through them. An operator who does use
///   local-use NAT64 can list the prefix in [`AllowedCidrs`].
/// * ISATAP interface identifiers (`…:0:5efe:a.b.c.d` or `…:200:5efe:…`)
///   under an otherwise public prefix: refused when the embedded address is
///   refused, since an ISATAP-configured host tunnels them to it over IPv4.
pub fn classify(address: IpAddr) -> Result<(), Refusal> {
    match address {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(address: Ipv4Addr) -> Result<(), Refusal> {
    let bits = u32::from(address);
    match V4_RULES
        .iter()
        .find(|&&(network, len, _)| v4_in(bits, network, len))
    {
        Some(&(_, _, refusal)) => Err(refusal),
        None => Ok(()),
    }
}

/// For a tunnelling/translation form: refused under the embedded address's
/// rule if that is refused, otherwise refused wholesale as `reserved`.
fn embedded_then_reserved(embedded: Result<(), Refusal>) -> Result<(), Refusal> {
    embedded?;
    Err(Refusal::Reserved)
}

fn classify_v6(address: Ipv6Addr) -> Result<(), Refusal> {
    let bits = u128::from(address);
    // The last 32 bits, where most forms put their IPv4 address.
    let low_v4 = Ipv4Addr::from(bits as u32);

    // Exact addresses first: both sit inside ::/96 and must keep their names.
    if address == Ipv6Addr::UNSPECIFIED {
        return Err(Refusal::Unspecified);
    }
    if address == Ipv6Addr::LOCALHOST {
        return Err(Refusal::Loopback);
    }

    // Forms that carry an IPv4 destination (see the doc of `classify`).
    if v6_in(bits, V4_MAPPED, 96) || v6_in(bits, NAT64_WELL_KNOWN, 96) {
        return classify_v4(low_v4);
    }
    if v6_in(bits, V4_COMPATIBLE, 96)
        || v6_in(bits, V4_TRANSLATED, 96)
        || v6_in(bits, NAT64_LOCAL_USE, 48)
    {
        return embedded_then_reserved(classify_v4(low_v4));
    }
    if v6_in(bits, SIX_TO_FOUR, 16) {
        let relay_target = Ipv4Addr::from((bits >> 80) as u32);
        return embedded_then_reserved(classify_v4(relay_target));
    }
    if v6_in(bits, TEREDO, 32) {
        // The client address is stored inverted (RFC 4380 §4) so that NATs
        // rewriting payload addresses leave it alone.
        let client = Ipv4Addr::from(!(bits as u32));
        let server = Ipv4Addr::from((bits >> 64) as u32);
        return embedded_then_reserved(classify_v4(client).and(classify_v4(server)));
    }

    if let Some(&(_, _, refusal)) = V6_RULES
        .iter()
        .find(|&&(network, len, _)| v6_in(bits, network, len))
    {
        return Err(refusal);
    }
    if !v6_in(bits, GLOBAL_UNICAST, 3) {
        return Err(Refusal::Reserved);
    }

    // ISATAP (RFC 5214) interface identifier: 0000:5efe or 0200:5efe (the
    // u/g bits may vary, hence the mask) followed by an IPv4 address.
    if (bits >> 32) as u32 & 0xfcff_ffff == 0x0000_5efe {
        classify_v4(low_v4)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Operator allow-list
// ---------------------------------------------------------------------------

/// Networks the operator explicitly allows despite [`classify`] (for example
/// a sidecar on `127.0.0.1/32`). Entries are stored with IPv4-mapped IPv6
/// networks rewritten as IPv4, so `::ffff:10.0.0.0/104` and `10.0.0.0/8` are
/// the same entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedCidrs(Vec<(IpAddr, u8)>);

impl AllowedCidrs {
    /// Parses entries such as `"127.0.0.0/8"`, `"::1/128"`, or `"10.1.2.3"`
    /// (a bare address means a single host, /32 or /128).
    ///
    /// Deliberately strict, because a typo here silently opens the guard:
    /// addresses must be in the canonical std syntax (no `127.1`, no octal,
    /// no brackets or zone ids), the prefix must be plain decimal within
    /// range, and an entry with bits set past its prefix (`10.1.2.3/8`) is
    /// refused rather than silently widened. Surrounding whitespace is
    /// ignored. The error names the offending entry.
    pub fn parse(entries: &[&str]) -> Result<Self, String> {
        entries
            .iter()
            .map(|entry| parse_cidr(entry))
            .collect::<Result<Vec<_>, _>>()
            .map(AllowedCidrs)
    }

    /// Whether `address` falls in any entry. An IPv4-mapped IPv6 address
    /// (`::ffff:a.b.c.d`) is matched as the IPv4 address it really is, so it
    /// matches IPv4 entries and never an IPv6 entry such as `::/0`.
    pub fn contains(&self, address: IpAddr) -> bool {
        let address = unmap(address);
        self.0
            .iter()
            .any(|&(network, len)| match (network, address) {
                (IpAddr::V4(network), IpAddr::V4(a)) => v4_in(u32::from(a), network, len.into()),
                (IpAddr::V6(network), IpAddr::V6(a)) => v6_in(u128::from(a), network, len.into()),
                _ => false,
            })
    }
}

/// Written as a list of entries (`["10.0.0.0/8", "::1"]`), each read by
/// [`AllowedCidrs::parse`]'s rules; a refused entry fails at its own index
/// with a message that does not repeat it.
impl<'de> serde::Deserialize<'de> for AllowedCidrs {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// One entry, refused where it stands in the list.
        struct Entry((IpAddr, u8));
        impl<'de> serde::Deserialize<'de> for Entry {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                parse_cidr(&text).map(Entry).map_err(|_| {
                    serde::de::Error::custom(
                        "must be an address or a CIDR range (10.0.0.0/8, ::1/128)",
                    )
                })
            }
        }
        let entries = Vec::<Entry>::deserialize(deserializer)?;
        Ok(AllowedCidrs(
            entries.into_iter().map(|Entry(entry)| entry).collect(),
        ))
    }
}

impl serde::Serialize for AllowedCidrs {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(
            self.0
                .iter()
                .map(|(network, length)| format!("{network}/{length}")),
        )
    }
}

/// Rewrites an IPv4-mapped IPv6 address as the IPv4 address it stands for.
fn unmap(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
        v4 => v4,
    }
}

fn parse_cidr(entry: &str) -> Result<(IpAddr, u8), String> {
    let text = entry.trim();
    let (address_text, len_text) = match text.split_once('/') {
        Some((address, len)) => (address, Some(len)),
        None => (text, None),
    };
    let address: IpAddr = address_text
        .parse()
        .map_err(|_| format!("allowed CIDR {entry:?}: {address_text:?} is not an IP address"))?;
    let max_len: u8 = if address.is_ipv4() { 32 } else { 128 };
    let len = match len_text {
        None => max_len,
        Some(len_text) => {
            // u8::from_str would accept "+8"; insist on plain digits.
            let parsed = if !len_text.is_empty() && len_text.bytes().all(|b| b.is_ascii_digit()) {
                len_text.parse::<u8>().ok()
            } else {
                None
            };
            match parsed {
                Some(len) if len <= max_len => len,
                _ => {
                    return Err(format!(
                        "allowed CIDR {entry:?}: prefix length must be 0..={max_len}"
                    ));
                }
            }
        }
    };
    let host_bits_set = match address {
        IpAddr::V4(a) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            u32::from(a) & !mask != 0
        }
        IpAddr::V6(a) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            u128::from(a) & !mask != 0
        }
    };
    if host_bits_set {
        return Err(format!(
            "allowed CIDR {entry:?}: address has bits set beyond the /{len} prefix"
        ));
    }
    // Store IPv4-mapped networks as IPv4 so they meet unmapped addresses.
    if let IpAddr::V6(v6) = address
        && let Some(v4) = v6.to_ipv4_mapped()
        && len >= 96
    {
        return Ok((IpAddr::V4(v4), len - 96));
    }
    Ok((address, len))
}

/// The dialer's rule: an address may be dialled if the operator allowed it
/// explicitly or it is public ([`classify`]). On refusal, the rule that
/// refused it.
pub fn permitted(address: IpAddr, allowed: &AllowedCidrs) -> Result<(), Refusal> {
    if allowed.contains(address) {
        return Ok(());
    }
    classify(address)
}

// ---------------------------------------------------------------------------
// Host spellings
// ---------------------------------------------------------------------------

/// What a URL host string is, as far as the dialer is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostKind {
    /// The host is an address, in one of its many spellings.
    Ip(IpAddr),
    /// The host is a name, to be resolved; every resolved address must still
    /// pass the guard.
    Name,
    /// Neither: a would-be address that does not parse (`256.0.0.1`,
    /// `0x100000000`, `fe80::1%eth0`), whitespace, forbidden characters,
    /// empty labels. Parsers disagree on such hosts, so the only safe answer
    /// is to refuse them.
    Malformed,
}

/// Returns the address a URL host denotes, or `None` if it does not denote
/// one. See [`parse_host`], which this wraps, for the spellings recognised.
///
/// `None` covers both real names and malformed hosts: a caller that goes on
/// to resolve a `None` host must use [`parse_host`] (or its own URL parser's
/// verdict) to refuse malformed ones rather than resolve them.
pub fn parse_ip_literal(host: &str) -> Option<IpAddr> {
    match parse_host(host) {
        HostKind::Ip(address) => Some(address),
        HostKind::Name | HostKind::Malformed => None,
    }
}

/// Classifies a URL host string (without port) as an address, a name, or
/// malformed, reading addresses the way the WHATWG URL standard does, which
/// also accepts everything glibc's `inet_aton` accepts:
///
/// * IPv6 in brackets (`[::1]`) or bare (`::1`), including embedded IPv4
///   (`::ffff:127.0.0.1`). Zone ids (`fe80::1%eth0`, `[fe80::1%25eth0]`) are
///   malformed: the WHATWG standard forbids them and their meaning depends on
///   the dialling host's interfaces.
/// * IPv4 with 1 to 4 parts, each decimal, octal (leading `0`) or hex (`0x`,
///   any case), mixed freely; a final part fills all remaining bytes
///   (`127.1` is `127.0.0.1`, `127.0.1` too, `2130706433` likewise); one
///   trailing dot is allowed. As in the WHATWG standard, `0x` alone is the
///   number 0, so `0x` and `0x.0x.0x.0x` are `0.0.0.0` (glibc rejects them;
///   reading them as an address is the safer union).
/// * Percent-encoding (`127%2E0.0.1`) and the Unicode compatibility
///   characters that IDNA maps onto digits, hex letters, `x` or dots
///   (`１２７.０.０.１`, `127。0。0。1`, `①②⑦.⓪.⓪.①`, `𝟏𝟐𝟕.0.0.1`, `0ｘ7f.1`), and
///   the invisible characters IDNA deletes (soft hyphen, zero-width space,
///   variation selectors...), as a WHATWG parser applies them before
///   looking for an address. The table covers every such character known to
///   the `idna` crate (Unicode 16); it may over-recognise a few unassigned
///   code points, which only makes the guard stricter.
///
/// A host whose last label is a number (`example.123`, `1.2.3.4.5`,
/// `256.0.0.1`) but which is not a valid address is [`HostKind::Malformed`],
/// as it is a failure, not a name, for a WHATWG parser. Anything else is a
/// [`HostKind::Name`] (`example.com`, `1e3`, `0x7g`, `127.0.0.1.nip.io`).
pub fn parse_host(host: &str) -> HostKind {
    // Brackets are only for IPv6, and the WHATWG parser reads their contents
    // raw (no percent-decoding, no IDNA), so handle them before anything else.
    if let Some(inner) = host.strip_prefix('[') {
        return match inner.strip_suffix(']').and_then(parse_ipv6) {
            Some(v6) => HostKind::Ip(IpAddr::V6(v6)),
            None => HostKind::Malformed,
        };
    }
    // Parsers disagree about whitespace and control characters: a WHATWG
    // parser strips tab/CR/LF anywhere ("12\t7.0.0.1" is 127.0.0.1), while
    // inet_aton stops at the first space and accepts what came before
    // ("127.0.0.1 x" is 127.0.0.1). No single reading is safe.
    if host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return HostKind::Malformed;
    }
    // A colon is forbidden in names, so this is an unbracketed IPv6 literal
    // or nothing valid (e.g. a host with its port still attached).
    if host.contains(':') {
        return match parse_ipv6(host) {
            Some(v6) => HostKind::Ip(IpAddr::V6(v6)),
            None => HostKind::Malformed,
        };
    }

    // What a WHATWG parser does to a non-bracketed host before looking for
    // an IPv4 address: percent-decode, then IDNA-map (lowercasing included).
    let Some(decoded) = percent_decode(host) else {
        return HostKind::Malformed;
    };
    let mut folded = String::with_capacity(decoded.len());
    for c in decoded.chars() {
        fold_char(c, &mut folded);
    }
    if folded.is_empty()
        || folded
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || is_forbidden_in_domain(c))
    {
        return HostKind::Malformed;
    }

    // The WHATWG rule: if the last label is a number, the host must be an
    // IPv4 address or it is invalid; it is never a name.
    if ends_in_number(&folded) {
        return match parse_ipv4(&folded) {
            Some(v4) => HostKind::Ip(IpAddr::V4(v4)),
            None => HostKind::Malformed,
        };
    }
    // A name may end in one dot (the DNS root) but has no empty labels.
    let without_root = folded.strip_suffix('.').unwrap_or(&folded);
    if without_root.is_empty() || without_root.split('.').any(str::is_empty) {
        return HostKind::Malformed;
    }
    HostKind::Name
}

/// Parses IPv6 text with std's strict parser, which is the WHATWG syntax:
/// `%` (a zone id) is rejected, as are non-ASCII digits.
fn parse_ipv6(text: &str) -> Option<Ipv6Addr> {
    text.parse().ok()
}

/// Characters that make a domain invalid for a WHATWG parser ("forbidden
/// domain code points" other than controls and space, checked separately).
fn is_forbidden_in_domain(c: char) -> bool {
    matches!(
        c,
        '#' | '/' | ':' | '<' | '>' | '?' | '@' | '[' | '\\' | ']' | '^' | '|' | '%'
    )
}

/// Percent-decodes `%XX` sequences; a `%` not followed by two hex digits is
/// kept (and later rejected as forbidden), as in the WHATWG standard. `None`
/// if the result is not UTF-8: a WHATWG parser would put U+FFFD there, which
/// no valid host contains.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&byte) = bytes.get(i) {
        if byte == b'%' {
            let high = bytes.get(i + 1).and_then(|&b| char::from(b).to_digit(16));
            let low = bytes.get(i + 2).and_then(|&b| char::from(b).to_digit(16));
            if let (Some(high), Some(low)) = (high, low) {
                // Two hex digits make at most 0xff, so the cast is lossless.
                out.push((high * 16 + low) as u8);
                i += 3;
                continue;
            }
        }
        out.push(byte);
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// How IDNA (UTS #46) maps one character, restricted to what can change
/// whether a host is an IPv4 address: characters mapped to digits, to the hex
/// letters or `x`, to `.`, or deleted. Others are kept (ASCII is lowercased).
fn fold_char(c: char, out: &mut String) {
    let cp = u32::from(c);
    // `offset % modulus` stays below 26, so the additions cannot overflow.
    let letter = |offset: u32| char::from(b'a' + (offset % 26) as u8);
    let digit = |offset: u32| char::from(b'0' + (offset % 10) as u8);
    let mapped: Option<char> = match cp {
        0x00..=0x7f => Some(c.to_ascii_lowercase()),
        // Deleted ("ignored") by IDNA: soft hyphen, combining grapheme joiner,
        // Hangul fillers, Khmer inherent vowels, Mongolian variation
        // selectors, zero-width space, invisible operators, deprecated format
        // characters, variation selectors, BOM, shorthand format controls,
        // musical formatting controls.
        0xad
        | 0x34f
        | 0x115f
        | 0x1160
        | 0x17b4
        | 0x17b5
        | 0x180b..=0x180f
        | 0x200b
        | 0x2060..=0x2064
        | 0x206a..=0x206f
        | 0x3164
        | 0xfe00..=0xfe0f
        | 0xfeff
        | 0xffa0
        | 0x1bca0..=0x1bca3
        | 0x1d173..=0x1d17a
        | 0xe0100..=0xe01ef => None,
        // Ideographic and halfwidth ideographic full stops.
        0x3002 | 0xff61 => Some('.'),
        // Fullwidth ASCII (including the fullwidth full stop U+FF0E).
        0xff01..=0xff5e => char::from_u32(cp - 0xfee0).map(|a| a.to_ascii_lowercase()),
        // Superscript and subscript digits.
        0xb9 => Some('1'),
        0xb2 | 0xb3 => Some(digit(cp - 0xb0)),
        0x2070 | 0x2074..=0x2079 => Some(digit(cp - 0x2070)),
        0x2080..=0x2089 => Some(digit(cp - 0x2080)),
        0x24ea => Some('0'), // circled digit zero
        // Circled letters; squared, outlined and mathematical letters, each
        // block running A–Z then (where present) a–z.
        0x24b6..=0x24e9 => Some(letter(cp - 0x24b6)),
        0x1f130..=0x1f149 => Some(letter(cp - 0x1f130)),
        0x1ccd6..=0x1ccef => Some(letter(cp - 0x1ccd6)),
        0x1d400..=0x1d6a3 => Some(letter(cp - 0x1d400)),
        // Outlined, mathematical and segmented digits.
        0x1ccf0..=0x1ccf9 => Some(digit(cp - 0x1ccf0)),
        0x1d7ce..=0x1d7ff => Some(digit(cp - 0x1d7ce)),
        0x1fbf0..=0x1fbf9 => Some(digit(cp - 0x1fbf0)),
        // Single letterlike, modifier and Roman-numeral characters that map
        // onto a hex letter or x.
        0xaa | 0x1d2c | 0x1d43 | 0x2090 => Some('a'),
        0x1d2e | 0x1d47 | 0x212c => Some('b'),
        0x1d9c | 0x2102 | 0x212d | 0x216d | 0x217d | 0xa7f2 | 0x1f12b => Some('c'),
        0x1d30 | 0x1d48 | 0x2145 | 0x2146 | 0x216e | 0x217e => Some('d'),
        0x1d31 | 0x1d49 | 0x2091 | 0x212f | 0x2130 | 0x2147 => Some('e'),
        0x1da0 | 0x2131 | 0xa7f3 => Some('f'),
        0x2e3 | 0x2093 | 0x2169 | 0x2179 => Some('x'),
        // Characters mapped to several characters.
        0x2460..=0x2473 => return push_number(out, cp - 0x2460 + 1), // ①..⑳
        0x3251..=0x325f => return push_number(out, cp - 0x3251 + 21), // ㉑..㉟
        0x32b1..=0x32bf => return push_number(out, cp - 0x32b1 + 36), // ㊱..㊿
        0x213b => return out.push_str("fax"),
        0x3372 => return out.push_str("da"),
        0x33c4 => return out.push_str("cc"),
        0x33c5 | 0x1f12d => return out.push_str("cd"),
        0x33c8 => return out.push_str("db"),
        0xfb00 => return out.push_str("ff"),
        _ => Some(c),
    };
    if let Some(m) = mapped {
        out.push(m);
    }
}

fn push_number(out: &mut String, n: u32) {
    out.push_str(&n.to_string());
}

/// The WHATWG "ends in a number" test: is the last label (ignoring one
/// trailing dot) all decimal digits, or a valid IPv4 number in any radix?
fn ends_in_number(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    let last = host.rsplit('.').next().unwrap_or(host);
    if !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    parse_ipv4_number(last).is_some()
}

/// Parses one IPv4 part: decimal, octal after a leading `0`, hex after `0x`.
/// As in the WHATWG standard, a bare `0x` is 0. Values too large for any
/// part saturate (and are then rejected by range checks) instead of
/// overflowing. `None` if a character is not a digit of the radix.
fn parse_ipv4_number(part: &str) -> Option<u64> {
    if part.is_empty() {
        return None;
    }
    let (digits, radix) =
        if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            (hex, 16)
        } else if let Some(octal) = part.strip_prefix('0')
            && !octal.is_empty()
        {
            (octal, 8)
        } else {
            (part, 10)
        };
    let mut value: u64 = 0;
    for c in digits.chars() {
        let d = c.to_digit(radix)?;
        value = value
            .saturating_mul(u64::from(radix))
            .saturating_add(u64::from(d));
    }
    Some(value)
}

/// The WHATWG IPv4 parser (a superset of glibc's inet_aton): 1 to 4 parts,
/// all but the last at most 255, the last filling the remaining bytes.
fn parse_ipv4(host: &str) -> Option<Ipv4Addr> {
    // One trailing dot is allowed ("127.0.0.1."), as for names.
    let host = host.strip_suffix('.').unwrap_or(host);
    let mut numbers = [0u64; 4];
    let mut count = 0;
    for part in host.split('.') {
        let slot = numbers.get_mut(count)?; // a fifth part: not an address
        *slot = parse_ipv4_number(part)?;
        count += 1;
    }
    let (&last, init) = numbers.get(..count)?.split_last()?;
    if init.iter().any(|&n| n > 255) {
        return None;
    }
    // With n parts the last one spans 5 - n bytes: 4 bytes for "2130706433",
    // 3 for the "1" of "127.1", 2 for "127.0.1", 1 for a dotted quad.
    let last_bytes = 5 - count as u32;
    if last >= 1u64 << (8 * last_bytes) {
        return None;
    }
    let mut value = last;
    for (i, &n) in init.iter().enumerate() {
        value |= n << (8 * (3 - i as u32));
    }
    u32::try_from(value).ok().map(Ipv4Addr::from)
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests;
