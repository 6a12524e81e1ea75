//! Skills a tenant's agents wrote (`skill.manage`), kept as the tenant's
//! own durable state, apart from the build's tools and the MCP servers'
//! prompts. Loaded through `skill.load` as EXTERNAL_UNTRUSTED: an agent
//! wrote them.

use chrono::{DateTime, Utc};

use super::StoreError;
use crate::ports::tool::BoxFuture;

/// A `skills` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthoredSkill {
    /// Its short name, unique within the tenant.
    pub name: String,
    /// What it is for, shown with it.
    pub description: String,
    /// Its text, loaded into the turn.
    pub body: String,
    /// Tools it expects, as registry names.
    pub required_tools: Vec<String>,
    /// A digest of the above: what a session was shown.
    pub version: String,
    /// The principal whose call wrote this version.
    pub author: String,
    /// The idempotency key of the call that wrote this version: the same
    /// call again changes nothing.
    pub written_by_key: String,
    /// When it was first written.
    pub created_at: DateTime<Utc>,
    /// When this version was written.
    pub updated_at: DateTime<Utc>,
}

/// How a write is meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkillWrite {
    /// A new skill; one of the name must not exist.
    Create,
    /// A new version of an existing skill.
    Update,
}

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkillWritten {
    /// The skill now holds the written version.
    Written,
    /// The same call (its key) already wrote it: nothing changed.
    Repeated,
    /// A create found the name taken by another write.
    Exists,
    /// An update found no skill of the name.
    Missing,
    /// The skill is another principal's: only its author changes it.
    OtherAuthor,
}

/// The `skills` table.
pub trait SkillStore: Send + Sync {
    /// Writes `skill` as `mode` says, unless the call that carries its key
    /// already wrote it.
    fn put_skill<'a>(
        &'a self,
        tenant_id: &'a str,
        skill: &'a AuthoredSkill,
        mode: SkillWrite,
    ) -> BoxFuture<'a, Result<SkillWritten, StoreError>>;

    /// Deletes one of the tenant's skills; whether there was one.
    fn delete_skill<'a>(
        &'a self,
        tenant_id: &'a str,
        name: &'a str,
        author: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// The tenant's skills, by name.
    fn skills<'a>(
        &'a self,
        tenant_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<AuthoredSkill>, StoreError>>;
}
