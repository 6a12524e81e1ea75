//! The tier-0 environment names: what toolgate synthesizes for every stdio
//! child, plus the loader and interpreter hooks that would let a variable
//! run code in it.
//!
//! One list. The stdio transport reads it to know what it builds; the
//! configuration validator reads it to refuse an operator variable or an
//! `env`-scheme credential that would shadow one of these.

/// Names the child environment synthesizes itself.
pub const SYNTHESIZED: &[&str] = &["PATH", "HOME", "LANG", "TMPDIR"];

/// Every tier-0 name: the synthesized tier and the hooks.
pub const TIER0: &[&str] = &[
    "PATH",
    "HOME",
    "LANG",
    "TMPDIR",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "LD_BIND_NOW",
    "LD_DEBUG",
    "GCONV_PATH",
    "DYLD_INSERT_LIBRARIES",
    "DYLD_LIBRARY_PATH",
    "NODE_OPTIONS",
    "NODE_PATH",
    "NODE_EXTRA_CA_CERTS",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONINSPECT",
    "PERL5LIB",
    "PERL5OPT",
    "RUBYLIB",
    "RUBYOPT",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "IFS",
];

/// Whether `name` is tier-0. Case-insensitive: no platform should get to
/// disagree with us about whether `ld_preload` is `LD_PRELOAD`.
pub fn is_tier0(name: &str) -> bool {
    TIER0
        .iter()
        .any(|reserved| reserved.eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_synthesized_tier_is_tier0() {
        for name in SYNTHESIZED {
            assert!(is_tier0(name));
        }
        assert!(is_tier0("ld_preload"));
        assert!(!is_tier0("API_TOKEN"));
    }
}
