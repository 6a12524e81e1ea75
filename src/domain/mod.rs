//! The vocabulary the pipeline is written in: pure types and rules.
//!
//! Owns `ToolSpec`, `ToolResult`, `ToolOutcome`, trust, names and their
//! normalization, the canonical form, the idempotency key and the reason-code
//! message table. Must not know about ports, adapters, I/O, or any crate but
//! std, serde (with serde_json), sha2, thiserror and unicode-normalization.

/// Declares a closed enum with a stable snake_case wire spelling, `ALL`,
/// `as_str` and `FromStr`, so every classification shares one shape.
macro_rules! closed_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident => $wire:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
        pub enum $name {
            $( $(#[$vmeta])* #[serde(rename = $wire)] $variant, )+
        }

        impl $name {
            /// Every member, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The stable wire spelling.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $wire,)+ }
            }
        }

        impl std::str::FromStr for $name {
            type Err = crate::domain::UnknownMember;

            fn from_str(text: &str) -> Result<Self, Self::Err> {
                match text {
                    $($wire => Ok($name::$variant),)+
                    _ => Err(crate::domain::UnknownMember {
                        set: stringify!($name),
                        expected: &[$($wire),+],
                    }),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub mod addresses;
pub mod approval;
pub mod canonical;
pub mod durability;
pub mod egress;
pub mod environment;
pub mod event;
pub mod idempotency;
pub mod invocation;
pub mod mcp_server;
pub mod names;
pub mod outcome;
pub mod policy;
pub mod rate;
pub mod reason_codes;
pub mod recovery;
pub mod result;
pub mod secret;
pub mod session;
pub mod skill;
pub mod tool;
pub mod trust;

pub use approval::{ApprovalStatus, HealthWindow, ReviewResolution, TurnState};
pub use canonical::{
    CanonicalArguments, CanonicalError, base64, base64url, base64url_decode, canonicalize,
    sha256_hex,
};
pub use durability::Durability;
pub use event::ToolEventKind;
pub use idempotency::idempotency_key;
pub use invocation::SuspensionKind;
pub use outcome::{InvocationStatus, Remediation, ToolOutcome, ToolOutcomeStatus};
pub use rate::{RateLimit, TokenBucket};
pub use reason_codes::ReasonCode;
pub use result::{
    ArtifactRef, ContentPart, OPAQUE_MEDIA_TYPE, ToolFailure, ToolFailureKind, ToolResult,
    shown_media_type,
};
pub use secret::SecretValue;
pub use session::{
    AgentSpec, MAXIMUM_LIST_ENTRIES, PolicyProfile, Principal, RuntimeEnvironment, glob_matches,
    valid_call_id, valid_identifier, valid_tenant_id,
};
pub use skill::{AdvertisedSkill, SkillMetadata};
pub use tool::{
    IdempotencyClass, RiskLevel, SideEffectClass, TargetKind, ToolKind, ToolSource, ToolSpec,
};
pub use trust::{ArgumentTrust, TrustLevel};

/// A string that names no member of a closed set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a {set}; expected one of: {}", expected.join(", "))]
pub struct UnknownMember {
    /// The set's type name.
    pub set: &'static str,
    /// Its members' wire spellings.
    pub expected: &'static [&'static str],
}
