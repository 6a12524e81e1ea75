//! Sealing what must be stored but never read in clear: each principal's
//! upstream tokens and a consent flow's PKCE verifier.

use crate::domain::SecretValue;

/// Why a value could not be sealed or opened. Never carries the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// The value was sealed under another key, for another context, or is
    /// not a sealed value at all.
    #[error("the sealed value does not open under this key and context")]
    Unopenable,
    /// The operating system gave no randomness.
    #[error("no randomness for a nonce")]
    Randomness,
}

/// Authenticated encryption bound to a context: a value sealed for one
/// tenant, principal and server does not open as another's.
pub trait Sealer: Send + Sync {
    /// `plain`, sealed for `context`, as text a store keeps.
    fn seal(&self, context: &[u8], plain: &SecretValue) -> Result<String, SealError>;

    /// The value `sealed` holds, if it was sealed for `context` under a
    /// key this sealer holds.
    fn open(&self, context: &[u8], sealed: &str) -> Result<SecretValue, SealError>;
}
