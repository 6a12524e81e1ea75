//! Registry names: the grammar, the domain partition, MCP name normalization
//! and the provider-safe `wire_name` alias.
//!
//! Every function here is pure and deterministic, because names are
//! serialized into the byte-stable prefix: a name that depended on discovery
//! order would rewrite the prefix on an unrelated server's restart.

use unicode_normalization::UnicodeNormalization;

use super::canonical::sha256_hex;

/// Longest registry name.
pub const MAXIMUM_NAME_LENGTH: usize = 96;
/// Longest wire name (model APIs accept `^[a-zA-Z0-9_-]{1,64}$`).
pub const MAXIMUM_WIRE_NAME_LENGTH: usize = 64;
/// Longest normalized MCP remote name before it is shortened.
const MAXIMUM_NORMALIZED_REMOTE_LENGTH: usize = 48;
/// Kept characters of a shortened MCP remote name.
const SHORTENED_REMOTE_LENGTH: usize = 40;

/// Who may register tools in a domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DomainOwner {
    /// Builtin tools, registered at build time.
    Builtin,
    /// Builtin control tools and nothing else.
    Control,
    /// Reserved for tools discovered from MCP servers.
    Mcp,
    /// Reserved for tools declared by attached devices.
    Device,
}

/// The domain partition table of the design document.
pub const DOMAIN_PARTITION: &[(&str, DomainOwner)] = &[
    ("system", DomainOwner::Builtin),
    ("math", DomainOwner::Builtin),
    ("workspace", DomainOwner::Builtin),
    ("sandbox", DomainOwner::Builtin),
    ("artifact", DomainOwner::Builtin),
    ("demo", DomainOwner::Builtin),
    ("delegate", DomainOwner::Builtin),
    ("conversation", DomainOwner::Control),
    ("context", DomainOwner::Control),
    ("tool", DomainOwner::Control),
    ("skill", DomainOwner::Builtin),
    ("memory", DomainOwner::Builtin),
    ("schedule", DomainOwner::Builtin),
    ("knowledge", DomainOwner::Builtin),
    ("web", DomainOwner::Builtin),
    ("browser", DomainOwner::Builtin),
    ("email", DomainOwner::Builtin),
    ("people", DomainOwner::Builtin),
    ("image", DomainOwner::Builtin),
    ("video", DomainOwner::Builtin),
    ("mcp", DomainOwner::Mcp),
    ("device", DomainOwner::Device),
];

/// Domains no builtin may use: registering one there is a startup error.
pub const RESERVED_DOMAINS: &[&str] = &["mcp", "device"];

/// The control tool that loads a skill a session was shown.
pub const SKILL_LOAD: &str = "skill.load";
/// The capability tool through which an agent writes its tenant's skills.
pub const SKILL_MANAGE: &str = "skill.manage";
/// What an authored skill's name is shown with (`skill.authored.triage`),
/// so it is told apart from an MCP server's prompts and agents' patterns can
/// enable the tenant's skills as one.
pub const AUTHORED_SKILL_PREFIX: &str = "skill.authored.";
/// The control tool whose recorded arguments are a run's working state.
pub const UPDATE_WORKING_STATE: &str = "context.update_working_state";

/// The control tools, closed at build time (Decision 25).
pub const CONTROL_TOOLS: &[&str] = &[
    "conversation.ask_user",
    "delegate.run",
    UPDATE_WORKING_STATE,
    SKILL_LOAD,
    "tool.call",
];

/// The owner of `domain` in the partition table, if it has one.
pub fn domain_owner(domain: &str) -> Option<DomainOwner> {
    DOMAIN_PARTITION
        .iter()
        .find(|(name, _)| *name == domain)
        .map(|(_, owner)| *owner)
}

/// Why a string is not a registry name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Longer than [`MAXIMUM_NAME_LENGTH`].
    #[error("name is longer than {MAXIMUM_NAME_LENGTH} characters")]
    TooLong,
    /// Not `^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$`.
    #[error("name must be dotted lowercase segments, each starting with a letter, at least two")]
    Grammar,
}

/// Checks `^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$` and the length cap.
pub fn validate_registry_name(name: &str) -> Result<(), NameError> {
    if name.len() > MAXIMUM_NAME_LENGTH {
        return Err(NameError::TooLong);
    }
    let mut segments = 0;
    for segment in name.split('.') {
        if !is_identifier(segment) {
            return Err(NameError::Grammar);
        }
        segments += 1;
    }
    if segments < 2 {
        return Err(NameError::Grammar);
    }
    Ok(())
}

/// The longest name from outside that an event or record carries whole.
pub const MAXIMUM_OUTSIDE_NAME_LENGTH: usize = 64;
/// How many characters of a longer or odd name are kept before its hash.
const KEPT_PREFIX: usize = 24;

/// A name that came from outside (a caller's name for a tool that is not
/// pinned, a server's name for its tool) as an event or a record may carry
/// it: whole when it is a registry name, or short printable ASCII; otherwise
/// its first characters with anything but printable ASCII replaced, then `#`
/// and 16 hex digits of the whole name's sha256. Bounded and inert, and
/// different names stay told apart.
pub fn bounded_name(name: &str) -> std::borrow::Cow<'_, str> {
    let printable = name.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
    if validate_registry_name(name).is_ok()
        || (printable && !name.is_empty() && name.len() <= MAXIMUM_OUTSIDE_NAME_LENGTH)
    {
        return std::borrow::Cow::Borrowed(name);
    }
    let prefix: String = name
        .chars()
        .take(KEPT_PREFIX)
        .map(|c| if c.is_ascii_graphic() { c } else { '_' })
        .collect();
    let digest = super::canonical::sha256_hex(name.as_bytes());
    std::borrow::Cow::Owned(format!("{prefix}#{}", &digest[..16]))
}

/// `^[a-z][a-z0-9_]*$`: one name segment, and the grammar of a server id.
pub fn is_identifier(text: &str) -> bool {
    let mut bytes = text.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z'))
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'))
}

/// The five normalization rules, exactly, applied to a name an MCP server
/// reported.
pub fn normalize_remote_name(remote_name: &str) -> String {
    // 1. NFC, then lowercase.
    let lowered: String = remote_name.nfc().collect::<String>().to_lowercase();
    // 2 and 3. Replace outside [a-z0-9_] with _, collapse runs, strip ends.
    let mut normalized = String::with_capacity(lowered.len());
    for ch in lowered.chars() {
        let ch = if ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '_' {
            ch
        } else {
            '_'
        };
        if ch == '_' && (normalized.is_empty() || normalized.ends_with('_')) {
            continue;
        }
        normalized.push(ch);
    }
    while normalized.ends_with('_') {
        normalized.pop();
    }
    // 4. Empty or leading digit gets a prefix.
    if normalized.is_empty() || normalized.starts_with(|c: char| c.is_ascii_digit()) {
        normalized.insert_str(0, "t_");
    }
    // 5. Long names keep 40 characters and a digest of the original.
    if normalized.len() > MAXIMUM_NORMALIZED_REMOTE_LENGTH {
        normalized.truncate(SHORTENED_REMOTE_LENGTH);
        normalized.push('_');
        normalized.push_str(&sha256_hex(remote_name.as_bytes())[..7]);
    }
    normalized
}

/// `mcp.{server_id}.{normalized_remote_name}`.
pub fn mcp_registry_name(server_id: &str, remote_name: &str) -> String {
    format!("mcp.{server_id}.{}", normalize_remote_name(remote_name))
}

/// The provider-safe alias of a registry name: dots become hyphens (a
/// registry name has none, so the map is one-to-one), and a name past 64
/// characters keeps 55 and appends `-` and 8 hex of its sha256. Collisions
/// within one pinned set are detected by the registry when it pins.
pub fn wire_name(registry_name: &str) -> String {
    let aliased = registry_name.replace('.', "-");
    if aliased.len() <= MAXIMUM_WIRE_NAME_LENGTH {
        return aliased;
    }
    let digest = sha256_hex(registry_name.as_bytes());
    let keep = MAXIMUM_WIRE_NAME_LENGTH - 9;
    format!("{}-{}", &aliased[..keep], &digest[..8])
}

/// Whether `text` is acceptable to model APIs as a tool name.
pub fn is_wire_safe(text: &str) -> bool {
    (1..=MAXIMUM_WIRE_NAME_LENGTH).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_names_are_bounded_inert_and_distinct() {
        assert_eq!(bounded_name("demo.echo"), "demo.echo");
        assert_eq!(bounded_name("Get Item"), "Get Item");
        let huge = "x".repeat(900_000);
        let cut = bounded_name(&huge);
        assert!(cut.len() <= MAXIMUM_OUTSIDE_NAME_LENGTH, "{cut}");
        assert_ne!(cut, bounded_name(&"x".repeat(900_001)));
        let hostile = bounded_name("\u{1b}[31mfake\nlog line");
        assert!(hostile.bytes().all(|b| b.is_ascii_graphic()), "{hostile}");
        assert!(bounded_name("").starts_with('#'));
    }

    #[test]
    fn grammar() {
        for good in [
            "demo.echo",
            "mcp.acme.create_ticket",
            "a.b",
            "web.fetch2",
            "x_1.y_",
        ] {
            assert_eq!(validate_registry_name(good), Ok(()), "{good}");
        }
        for bad in [
            "demo",
            "Demo.echo",
            "demo.Echo",
            "demo.",
            ".echo",
            "demo..echo",
            "1demo.echo",
            "demo.1echo",
            "demo.ec-ho",
            "demo.ec ho",
            "demo._echo",
            "",
        ] {
            assert_eq!(
                validate_registry_name(bad),
                Err(NameError::Grammar),
                "{bad}"
            );
        }
        let long = format!("demo.{}", "a".repeat(91));
        assert_eq!(validate_registry_name(&long), Ok(()));
        let too_long = format!("demo.{}", "a".repeat(92));
        assert_eq!(validate_registry_name(&too_long), Err(NameError::TooLong));
    }

    #[test]
    fn normalization_rules() {
        assert_eq!(normalize_remote_name("Get Item"), "get_item");
        assert_eq!(normalize_remote_name("get-item"), "get_item");
        assert_eq!(normalize_remote_name("__a--b__"), "a_b");
        assert_eq!(normalize_remote_name("2fa"), "t_2fa");
        assert_eq!(normalize_remote_name("---"), "t_");
        assert_eq!(normalize_remote_name(""), "t_");
        // NFC before lowercase: a decomposed É becomes one replaced character.
        assert_eq!(normalize_remote_name("Cafe\u{301}"), "caf");
        assert_eq!(normalize_remote_name("CAFÉ_menu"), "caf_menu");
        assert_eq!(normalize_remote_name("getSum"), "getsum");
    }

    #[test]
    fn long_names_are_shortened_with_a_digest_of_the_original() {
        let remote = "a".repeat(49);
        let normalized = normalize_remote_name(&remote);
        assert_eq!(normalized.len(), 48);
        assert_eq!(&normalized[..41], &format!("{}_", "a".repeat(40)));
        assert_eq!(&normalized[41..], &sha256_hex(remote.as_bytes())[..7]);
        assert_eq!(normalize_remote_name(&"a".repeat(48)), "a".repeat(48));
        // Two originals that normalize alike still shorten apart.
        assert_ne!(
            normalize_remote_name(&format!("{}X", "b".repeat(50))),
            normalize_remote_name(&format!("{}x", "b".repeat(50)))
        );
    }

    #[test]
    fn mcp_names_satisfy_the_registry_grammar() {
        for remote in ["Get Item", "9lives", "", "ünïcödé", &"z".repeat(200)] {
            let name = mcp_registry_name("acme", remote);
            assert_eq!(validate_registry_name(&name), Ok(()), "{name}");
        }
    }

    #[test]
    fn wire_names_are_safe_deterministic_and_short() {
        assert_eq!(
            wire_name("mcp.acme.create_ticket"),
            "mcp-acme-create_ticket"
        );
        let long = format!("mcp.acme.{}", "x".repeat(80));
        let wire = wire_name(&long);
        assert_eq!(wire.len(), 64);
        assert!(is_wire_safe(&wire));
        assert_eq!(wire, wire_name(&long));
        assert_ne!(wire, wire_name(&format!("mcp.acme.{}y", "x".repeat(79))));
        assert!(!is_wire_safe("a.b"));
    }

    #[test]
    fn partition_covers_reserved_and_control_domains() {
        for reserved in RESERVED_DOMAINS {
            assert!(matches!(
                domain_owner(reserved),
                Some(DomainOwner::Mcp | DomainOwner::Device)
            ));
        }
        for control in CONTROL_TOOLS {
            assert_eq!(validate_registry_name(control), Ok(()));
            let domain = control.split('.').next().unwrap();
            assert!(domain_owner(domain).is_some(), "{control}");
        }
        assert_eq!(domain_owner("nonesuch"), None);
    }
}
