use super::*;
use Refusal::*;

/// What the guard should conclude about a URL host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    /// An address that passes `classify`.
    Pass,
    /// An address refused under this rule.
    No(Refusal),
    /// A host name (to be resolved, then checked).
    Name,
    /// Neither name nor address: the caller must refuse it.
    Bad,
}
use Want::*;

fn verdict(host: &str) -> Want {
    match parse_host(host) {
        HostKind::Ip(address) => match classify(address) {
            Ok(()) => Pass,
            Err(refusal) => No(refusal),
        },
        HostKind::Name => Name,
        HostKind::Malformed => Bad,
    }
}

/// Each row: a host as it appears in a URL, and what the guard must say.
const CASES: &[(&str, Want)] = &[
    // --- Public addresses that must pass.
    ("8.8.8.8", Pass),
    ("1.1.1.1", Pass),
    ("93.184.215.14", Pass),
    ("[2606:4700:4700::1111]", Pass),
    ("[2001:4860:4860::8888]", Pass),
    ("2001:4860:4860::8888", Pass),
    ("[::ffff:8.8.8.8]", Pass),
    ("[64:ff9b::8.8.8.8]", Pass),
    ("[64:ff9b::101:101]", Pass),
    ("[3fff:1000::1]", Pass),
    ("192.88.98.255", Pass),
    ("192.0.1.0", Pass),
    // --- IPv4 rules and their boundaries.
    ("0.0.0.0", No(Unspecified)),
    ("0.0.0.1", No(Reserved)),
    ("0.255.255.255", No(Reserved)),
    ("1.0.0.0", Pass),
    ("9.255.255.255", Pass),
    ("10.0.0.0", No(Private)),
    ("10.255.255.255", No(Private)),
    ("11.0.0.0", Pass),
    ("100.63.255.255", Pass),
    ("100.64.0.0", No(SharedAddressSpace)),
    ("100.100.100.200", No(SharedAddressSpace)),
    ("100.127.255.255", No(SharedAddressSpace)),
    ("100.128.0.0", Pass),
    ("126.255.255.255", Pass),
    ("127.0.0.0", No(Loopback)),
    ("127.0.0.1", No(Loopback)),
    ("127.255.255.255", No(Loopback)),
    ("128.0.0.0", Pass),
    ("169.253.255.255", Pass),
    ("169.254.0.0", No(LinkLocal)),
    ("169.254.169.254", No(LinkLocal)),
    ("169.254.170.2", No(LinkLocal)),
    ("169.255.0.0", Pass),
    ("172.15.255.255", Pass),
    ("172.16.0.0", No(Private)),
    ("172.31.255.255", No(Private)),
    ("172.32.0.0", Pass),
    ("192.0.0.0", No(Reserved)),
    ("192.0.0.170", No(Reserved)),
    ("192.0.2.1", No(Documentation)),
    ("198.51.100.7", No(Documentation)),
    ("203.0.113.255", No(Documentation)),
    ("192.88.99.1", No(Reserved)),
    ("192.167.255.255", Pass),
    ("192.168.0.0", No(Private)),
    ("192.168.255.255", No(Private)),
    ("192.169.0.0", Pass),
    ("198.17.255.255", Pass),
    ("198.18.0.0", No(Benchmarking)),
    ("198.19.255.255", No(Benchmarking)),
    ("198.20.0.0", Pass),
    ("223.255.255.255", Pass),
    ("224.0.0.0", No(Multicast)),
    ("239.255.255.255", No(Multicast)),
    ("240.0.0.0", No(Reserved)),
    ("255.255.255.254", No(Reserved)),
    ("255.255.255.255", No(Broadcast)),
    // --- IPv6 rules.
    ("[::]", No(Unspecified)),
    ("[::1]", No(Loopback)),
    ("::1", No(Loopback)),
    ("[0:0:0:0:0:0:0:1]", No(Loopback)),
    ("[fe80::1]", No(LinkLocal)),
    ("[febf:ffff::1]", No(LinkLocal)),
    ("[fec0::1]", No(SiteLocal)),
    ("[feff::1]", No(SiteLocal)),
    ("[fc00::1]", No(UniqueLocal)),
    ("[fd00:ec2::254]", No(UniqueLocal)),
    ("[ff02::1]", No(Multicast)),
    ("[ff05::1:3]", No(Multicast)),
    ("[2001:db8::1]", No(Documentation)),
    ("[3fff::1]", No(Documentation)),
    ("[3fff:fff:ffff::1]", No(Documentation)),
    ("[2001:2::1]", No(Benchmarking)),
    ("[2001:2:0:ffff::1]", No(Benchmarking)),
    ("[2001:2:1::1]", No(Reserved)),
    ("[2001:20::1]", No(Reserved)),
    ("[100::1]", No(Reserved)),
    ("[100:0:0:1::1]", No(Reserved)),
    ("[5f00::1]", No(Reserved)),
    ("[1fff:ffff::1]", No(Reserved)),
    ("[4000::1]", No(Reserved)),
    ("[::2]", No(Reserved)),
    // --- IPv6 forms embedding a refused IPv4 address.
    ("[::ffff:127.0.0.1]", No(Loopback)),
    ("[::ffff:7f00:1]", No(Loopback)),
    ("[::FFFF:127.0.0.1]", No(Loopback)),
    ("[::ffff:10.0.0.1]", No(Private)),
    ("[::ffff:169.254.169.254]", No(LinkLocal)),
    ("[::ffff:0.0.0.0]", No(Unspecified)),
    ("[::ffff:100.64.0.1]", No(SharedAddressSpace)),
    ("[::ffff:224.0.0.1]", No(Multicast)),
    ("[::ffff:255.255.255.255]", No(Broadcast)),
    ("[::ffff:198.18.0.1]", No(Benchmarking)),
    ("[::ffff:192.0.2.1]", No(Documentation)),
    ("[::ffff:240.0.0.1]", No(Reserved)),
    ("[::127.0.0.1]", No(Loopback)),
    ("[::10.0.0.1]", No(Private)),
    ("[::169.254.169.254]", No(LinkLocal)),
    ("[::8.8.8.8]", No(Reserved)),
    ("[::ffff:0:127.0.0.1]", No(Loopback)),
    ("[::ffff:0:8.8.8.8]", No(Reserved)),
    ("[64:ff9b::127.0.0.1]", No(Loopback)),
    ("[64:ff9b::a9fe:a9fe]", No(LinkLocal)),
    ("[64:ff9b::192.168.1.1]", No(Private)),
    ("[64:ff9b:1::7f00:1]", No(Loopback)),
    ("[64:ff9b:1::808:808]", No(Reserved)),
    ("[2002:7f00:1::]", No(Loopback)),
    ("[2002:a9fe:a9fe::1]", No(LinkLocal)),
    ("[2002:c0a8:101::]", No(Private)),
    ("[2002:808:808::1]", No(Reserved)),
    // Teredo: client 127.0.0.1 (stored as ~7f00:0001), public server.
    ("[2001:0:4136:e378:8000:63bf:80ff:fffe]", No(Loopback)),
    // Teredo: client 169.254.169.254 (~a9fe:a9fe).
    ("[2001:0:4136:e378::5601:5601]", No(LinkLocal)),
    // Teredo: RFC 4380's own example, client 192.0.2.45.
    ("[2001:0:4136:e378:8000:63bf:3fff:fdd2]", No(Documentation)),
    // Teredo: private server 10.0.0.1, public client 8.8.8.8.
    ("[2001:0:a00:1:8000:63bf:f7f7:f7f7]", No(Private)),
    // Teredo: both public, still refused wholesale.
    ("[2001:0:4136:e378:8000:63bf:f7f7:f7f7]", No(Reserved)),
    // ISATAP interface identifiers under public prefixes.
    ("[2606:4700::5efe:7f00:1]", No(Loopback)),
    ("[2606:4700::200:5efe:a00:1]", No(Private)),
    ("[2606:4700::200:5efe:808:808]", Pass),
    // --- Odd IPv4 spellings of refused addresses.
    ("2130706433", No(Loopback)),
    ("0x7f000001", No(Loopback)),
    ("0X7F000001", No(Loopback)),
    ("0x7f.0.0.1", No(Loopback)),
    ("0X7F.1", No(Loopback)),
    ("0177.0.0.1", No(Loopback)),
    ("017700000001", No(Loopback)),
    ("127.1", No(Loopback)),
    ("127.0.1", No(Loopback)),
    ("127.0.0.1.", No(Loopback)),
    ("127.1.", No(Loopback)),
    ("0x7f.0x0.0.01", No(Loopback)),
    ("0177.0x0.1", No(Loopback)),
    ("00000177.0.0.0x00000001", No(Loopback)),
    ("0xa9fea9fe", No(LinkLocal)),
    ("2852039166", No(LinkLocal)),
    ("0251.0376.0251.0376", No(LinkLocal)),
    ("169.254.43518", No(LinkLocal)),
    ("169.16689662", No(LinkLocal)),
    ("0xA9.0xFE.0xA9.0xFE", No(LinkLocal)),
    ("3232235777", No(Private)),
    ("0300.0250.0.1", No(Private)),
    ("0xc0.0xa8.1", No(Private)),
    ("10.1", No(Private)),
    ("0", No(Unspecified)),
    ("0.0", No(Unspecified)),
    ("0x", No(Unspecified)),
    ("0x.0x.0x.0x", No(Unspecified)),
    ("4294967295", No(Broadcast)),
    ("0xffffffff", No(Broadcast)),
    ("0xe0000000", No(Multicast)),
    ("100.64.1", No(SharedAddressSpace)),
    ("198.18.1", No(Benchmarking)),
    // Odd spellings of public addresses still pass.
    ("134744072", Pass),
    ("0x08080808", Pass),
    ("010.010.010.010", Pass),
    ("8.8.8.8.", Pass),
    // --- Percent-encoding and Unicode that a WHATWG parser folds away.
    ("%31%32%37.0.0.1", No(Loopback)),
    ("127%2e0%2E0%2e1", No(Loopback)),
    ("１２７.０.０.１", No(Loopback)),
    ("127。0。0。1", No(Loopback)),
    ("127．0．0．1", No(Loopback)),
    ("①②⑦.⓪.⓪.①", No(Loopback)),
    ("𝟏𝟐𝟕.0.0.1", No(Loopback)),
    ("12\u{ad}7.0.0.1", No(Loopback)),
    ("127.0.0.1\u{200b}", No(Loopback)),
    ("０ｘ７ｆ.１", No(Loopback)),
    ("0ⓧ7ⓕ.1", No(Loopback)),
    ("⑩.①", No(Private)),
    ("%EF%BC%91%EF%BC%92%EF%BC%97.0.0.1", No(Loopback)),
    // --- Names.
    ("example.com", Name),
    ("EXAMPLE.COM", Name),
    ("example.com.", Name),
    ("localhost", Name),
    ("1e3", Name),
    ("0x7g", Name),
    ("0xdead.beef", Name),
    ("127.0.0.1.nip.io", Name),
    ("0x7f000001.example", Name),
    ("xn--bcher-kva.example", Name),
    ("bücher.example", Name),
    ("a-1.b-2", Name),
    ("1.2.3.4x", Name),
    // --- Malformed: the caller must refuse, not resolve.
    ("", Bad),
    (".", Bad),
    ("256.0.0.1", Bad),
    ("1.256.0.0", Bad),
    ("1.2.65536", Bad),
    ("1.16777216", Bad),
    ("0x100000000", Bad),
    ("4294967296", Bad),
    ("99999999999999999999999999", Bad),
    ("1.2.3.4.5", Bad),
    ("127..1", Bad),
    ("127.0.0.1..", Bad),
    ("08", Bad),
    ("09.0.0.1", Bad),
    ("0xdead.0xbeef", Bad),
    ("example.123", Bad),
    ("example.0x", Bad),
    ("a..b", Bad),
    ("fe80::1%eth0", Bad),
    ("[fe80::1%25eth0]", Bad),
    ("[fe80::1%eth0]", Bad),
    ("[::1", Bad),
    ("::1]", Bad),
    ("[example.com]", Bad),
    ("[127.0.0.1]", Bad),
    ("[::ffff:0177.0.0.1]", Bad),
    ("127.0.0.1:80", Bad),
    ("127.0.0.1 ", Bad),
    (" 127.0.0.1", Bad),
    ("127.0.0.1\tx", Bad),
    ("12\n7.0.0.1", Bad),
    ("127.0.0.1/", Bad),
    ("user@127.0.0.1", Bad),
    ("%zz", Bad),
    ("%2F", Bad),
    ("%ff", Bad),
    ("%3a%3a1", Bad),
    ("１２７.０.０.１／", Bad),
    ("127\u{3000}.0.0.1", Bad),
];

#[test]
fn host_table() {
    assert!(CASES.len() >= 100, "only {} rows", CASES.len());
    let failures: Vec<String> = CASES
        .iter()
        .filter_map(|&(host, want)| {
            let got = verdict(host);
            (got != want).then(|| format!("{host:?}: want {want:?}, got {got:?}"))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn table_covers_every_rule() {
    for refusal in Refusal::ALL {
        assert!(
            CASES.iter().any(|&(_, want)| want == No(refusal)),
            "no row exercises {refusal}"
        );
    }
}

/// Spellings must not just be refused, they must decode to the exact
/// address another parser would connect to.
#[test]
fn spellings_decode_exactly() {
    let cases: &[(&str, &str)] = &[
        ("2130706433", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("127.0.1", "127.0.0.1"),
        ("127.1.2", "127.1.0.2"),
        ("1.2.3", "1.2.0.3"),
        ("1.2", "1.0.0.2"),
        ("1.0x10203", "1.1.2.3"),
        ("1.2.0x304", "1.2.3.4"),
        ("0x1.0x2.0x3.0x4", "1.2.3.4"),
        ("01.02.03.04", "1.2.3.4"),
        ("0.0.0.0x", "0.0.0.0"),
        ("1.2.3.4.", "1.2.3.4"),
        ("255.255.255.255", "255.255.255.255"),
        ("255.0xffffff", "255.255.255.255"),
        ("037777777777", "255.255.255.255"),
        ("1.2.3.0377", "1.2.3.255"),
        ("[::ffff:127.0.0.1]", "::ffff:127.0.0.1"),
        ("::ffff:127.0.0.1", "::ffff:127.0.0.1"),
        ("[2001:DB8::1]", "2001:db8::1"),
    ];
    for &(host, want) in cases {
        let want: IpAddr = want.parse().expect("test address");
        assert_eq!(parse_ip_literal(host), Some(want), "{host:?}");
    }
}

#[test]
fn names_are_not_addresses() {
    for host in [
        "example.com",
        "localhost",
        "1e3",
        "0x7g",
        "a.b.c.d",
        "g",
        "0xg",
        "x",
    ] {
        assert_eq!(parse_host(host), HostKind::Name, "{host:?}");
        assert_eq!(parse_ip_literal(host), None, "{host:?}");
    }
    for host in ["256.0.0.1", "0x100000000", "fe80::1%eth0", ""] {
        assert_eq!(parse_ip_literal(host), None, "{host:?}");
    }
}

#[test]
fn refusal_names_are_stable() {
    let names: Vec<&str> = Refusal::ALL.iter().map(Refusal::as_str).collect();
    assert_eq!(
        names,
        [
            "loopback",
            "unspecified",
            "private",
            "carrier_grade_nat",
            "link_local",
            "unique_local",
            "multicast",
            "broadcast",
            "documentation",
            "benchmarking",
            "reserved",
            "site_local",
        ]
    );
    for refusal in Refusal::ALL {
        assert_eq!(refusal.to_string(), refusal.as_str());
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("test address")
}

#[test]
fn allowed_cidrs_let_exactly_their_networks_through() {
    let allowed = AllowedCidrs::parse(&["127.0.0.1/32"]).expect("valid");
    assert_eq!(permitted(ip("127.0.0.1"), &allowed), Ok(()));
    assert_eq!(permitted(ip("::ffff:127.0.0.1"), &allowed), Ok(()));
    assert_eq!(permitted(ip("127.0.0.2"), &allowed), Err(Loopback));
    assert_eq!(permitted(ip("::1"), &allowed), Err(Loopback));
    assert_eq!(permitted(ip("::127.0.0.1"), &allowed), Err(Loopback));
    assert_eq!(permitted(ip("8.8.8.8"), &allowed), Ok(()));
    assert_eq!(permitted(ip("10.0.0.1"), &allowed), Err(Private));

    let none = AllowedCidrs::default();
    assert_eq!(permitted(ip("127.0.0.1"), &none), Err(Loopback));
    assert_eq!(permitted(ip("8.8.8.8"), &none), Ok(()));

    let allowed =
        AllowedCidrs::parse(&["127.0.0.0/8", "::1/128", "10.1.2.3", " fd00::/8 "]).expect("valid");
    for a in [
        "127.0.0.1",
        "127.255.255.255",
        "::1",
        "10.1.2.3",
        "::ffff:10.1.2.3",
        "fd12::1",
    ] {
        assert!(allowed.contains(ip(a)), "{a}");
        assert_eq!(permitted(ip(a), &allowed), Ok(()), "{a}");
    }
    for a in [
        "128.0.0.1",
        "::2",
        "10.1.2.4",
        "10.1.2.2",
        "fe80::1",
        "::ffff:10.1.2.4",
    ] {
        assert!(!allowed.contains(ip(a)), "{a}");
    }

    // A mapped entry is the IPv4 entry; ::/0 does not reach IPv4 through
    // the mapped form.
    let mapped = AllowedCidrs::parse(&["::ffff:192.168.0.0/112"]).expect("valid");
    assert_eq!(
        mapped,
        AllowedCidrs::parse(&["192.168.0.0/16"]).expect("valid")
    );
    assert!(mapped.contains(ip("192.168.3.4")));
    let all_v6 = AllowedCidrs::parse(&["::/0"]).expect("valid");
    assert!(all_v6.contains(ip("fe80::1")));
    assert!(!all_v6.contains(ip("::ffff:127.0.0.1")));
    let all_v4 = AllowedCidrs::parse(&["0.0.0.0/0"]).expect("valid");
    assert!(all_v4.contains(ip("::ffff:127.0.0.1")));
    assert!(!all_v4.contains(ip("::1")));
}

#[test]
fn allowed_cidrs_reject_bad_entries() {
    for entry in [
        "",
        "/8",
        "10.0.0.0/",
        "10.0.0.0/33",
        "::/129",
        "10.0.0.0/+8",
        "10.0.0.0/-1",
        "10.0.0.0/8/8",
        "10.0.0.1/8",
        "::1/64",
        "127.1",
        "0x7f000001",
        "010.0.0.0/8",
        "[::1]/128",
        "fe80::1%eth0/128",
        "example.com/32",
        "10.0.0.0 /8",
        "10.0.0.0/0008x",
        "10.0.0.0/256",
    ] {
        let result = AllowedCidrs::parse(&[entry]);
        assert!(result.is_err(), "{entry:?} accepted as {result:?}");
    }
    let error = AllowedCidrs::parse(&["10.0.0.0/8", "nonsense"]).expect_err("invalid");
    assert!(error.contains("nonsense"), "{error}");
}

/// A small deterministic generator, so the loops below need no crates.
struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn no_panic_on_arbitrary_hosts() {
    const ALPHABET: &[&str] = &[
        "0",
        "1",
        "7",
        "8",
        "9",
        "f",
        "F",
        "x",
        "X",
        "e",
        "g",
        ".",
        ".",
        ".",
        ":",
        "::",
        "[",
        "]",
        "%",
        "%2e",
        "%3a",
        "%ff",
        "/",
        " ",
        "\t",
        "-",
        "ffff",
        "0x",
        "00",
        "255",
        "256",
        "4294967296",
        "１",
        "。",
        "①",
        "ⓧ",
        "𝟗",
        "\u{ad}",
        "\u{200b}",
        "é",
        "\u{10ffff}",
    ];
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    for _ in 0..200_000 {
        let len = rng.below(12);
        let host: String = (0..len)
            .map(|_| ALPHABET[rng.below(ALPHABET.len())])
            .collect();
        let kind = parse_host(&host);
        if let HostKind::Ip(address) = kind {
            let _ = classify(address);
            // What we decoded is a real address: its canonical form reads back.
            let canonical = match address {
                IpAddr::V4(v4) => v4.to_string(),
                IpAddr::V6(v6) => format!("[{v6}]"),
            };
            assert_eq!(parse_ip_literal(&canonical), Some(address), "{host:?}");
        }
        assert_eq!(
            parse_ip_literal(&host),
            match kind {
                HostKind::Ip(a) => Some(a),
                _ => None,
            }
        );
        let _ = AllowedCidrs::parse(&[&host]);
    }
}

/// An IPv4 address and its mapped form are always judged alike, and the
/// canonical and integer spellings of any address decode to it.
#[test]
fn ipv4_and_mapped_agree_everywhere() {
    let mut rng = XorShift(0x0123_4567_89ab_cdef);
    let mut samples: Vec<u32> = (0..100_000).map(|_| rng.next() as u32).collect();
    // Every rule boundary and its neighbours.
    for &(network, len, _) in V4_RULES {
        let first = u32::from(network);
        let last = first | u32::MAX.checked_shr(len).unwrap_or(0);
        for edge in [first, last] {
            samples.extend([edge.wrapping_sub(1), edge, edge.wrapping_add(1)]);
        }
    }
    for bits in samples {
        let v4 = Ipv4Addr::from(bits);
        let verdict = classify(IpAddr::V4(v4));
        assert_eq!(classify(IpAddr::V6(v4.to_ipv6_mapped())), verdict, "{v4}");
        assert_eq!(
            classify(IpAddr::V6(Ipv6Addr::from(
                (u128::from(NAT64_WELL_KNOWN)) | u128::from(bits)
            ))),
            verdict,
            "{v4}"
        );
        for spelling in [
            v4.to_string(),
            bits.to_string(),
            format!("{bits:#x}"),
            format!("0{bits:o}"),
        ] {
            assert_eq!(
                parse_ip_literal(&spelling),
                Some(IpAddr::V4(v4)),
                "{spelling}"
            );
        }
    }
}

#[test]
fn random_ipv6_never_panics_and_round_trips() {
    let mut rng = XorShift(0xdead_beef_cafe_f00d);
    for _ in 0..100_000 {
        let bits = (u128::from(rng.next()) << 64) | u128::from(rng.next());
        let v6 = Ipv6Addr::from(bits);
        let _ = classify(IpAddr::V6(v6));
        assert_eq!(parse_ip_literal(&format!("[{v6}]")), Some(IpAddr::V6(v6)));
        // Random bits are almost never in 2000::/3 with a sane layout, but
        // whatever passes must be global unicast.
        if classify(IpAddr::V6(v6)).is_ok()
            && v6.to_ipv4_mapped().is_none()
            && !v6_in(bits, NAT64_WELL_KNOWN, 96)
        {
            assert!(v6_in(bits, GLOBAL_UNICAST, 3), "{v6}");
        }
    }
}
