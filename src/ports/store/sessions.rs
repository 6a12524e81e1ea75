//! Sessions as recorded, so any node can pin a session's tool set again;
//! operators' console sign-ins, so any node knows who is signed in.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::StoreError;
use crate::domain::{AgentSpec, Principal};
use crate::ports::tool::BoxFuture;

/// A `sessions` row: what a session was opened with, so that any node (or
/// this one after a restart) can pin its tool set again.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRecord {
    pub session_id: Uuid,
    pub tenant_id: String,
    pub principal: Principal,
    pub agent: AgentSpec,
    /// The pinned set's hashes when the session opened (what the model was
    /// shown, and what calls execute under): a node that takes the session
    /// over must reproduce both.
    pub tool_schema_sha256: String,
    pub tool_contract_sha256: String,
    /// The pinned set's registry names, sorted: what an operator reads of
    /// an open session.
    pub tool_names: Vec<String>,
    pub opened_at: DateTime<Utc>,
    /// Refreshed at most hourly while the session is used.
    pub last_used_at: DateTime<Utc>,
}

/// The `sessions` table.
pub trait SessionStore: Send + Sync {
    /// Records a session. When its id is already recorded, nothing is
    /// written and the recorded row is returned instead, to be compared.
    fn open_session<'a>(
        &'a self,
        session: &'a SessionRecord,
    ) -> BoxFuture<'a, Result<SessionRecord, StoreError>>;

    /// A session by its id, whichever tenant holds it: the id is what a
    /// caller presents, and the row says whose it is.
    fn session(&self, session_id: Uuid)
    -> BoxFuture<'_, Result<Option<SessionRecord>, StoreError>>;

    /// Marks a session used at `now`.
    fn touch_session(
        &self,
        session_id: Uuid,
        now: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Ends one session of `tenant_id`: its row is deleted (its calls'
    /// records stay). Whether there was one.
    fn end_session<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: Uuid,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Deletes the sessions last used before `before`; how many.
    fn forget_sessions(&self, before: DateTime<Utc>) -> BoxFuture<'_, Result<u64, StoreError>>;
}

/// An operator's console sign-in, kept by the sha256 of its cookie: the
/// store holds nothing a browser could present.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleSignIn {
    /// Lowercase hex sha256 of the cookie's value.
    pub cookie_sha256: String,
    /// Who signed in.
    pub operator: String,
    pub signed_in_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// The `console_sign_ins` table.
pub trait ConsoleSignInStore: Send + Sync {
    /// Records a sign-in. Those expired by its time are deleted; past
    /// `maximum` held, the ones ending soonest are too, so signing in in a
    /// loop cannot grow the table.
    fn sign_in<'a>(
        &'a self,
        sign_in: &'a ConsoleSignIn,
        maximum: usize,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// The sign-in of that cookie, if it has not expired by `now`.
    fn signed_in<'a>(
        &'a self,
        cookie_sha256: &'a str,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Option<ConsoleSignIn>, StoreError>>;

    /// Ends the sign-in of that cookie.
    fn sign_out<'a>(&'a self, cookie_sha256: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;
}
