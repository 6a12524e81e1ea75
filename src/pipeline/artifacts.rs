//! Reading an artifact back, for its owner only: the tenant's record first
//! (another tenant's id is simply not found), then its bytes as a stream.
//! The edges serve it: a turn's socket for the turn's run, the control
//! API for the tenant a request names, the MCP front door for the
//! principal whose run it is.

use std::sync::Arc;

use uuid::Uuid;

use crate::ports::{
    ArtifactReader, ArtifactRecord, ArtifactStore, InvocationStore, StoreError, StoredArtifact,
};

/// Why an artifact could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactReadError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The record exists but its bytes could not be opened.
    #[error("the artifact's bytes could not be read")]
    Unreadable,
}

/// An artifact ready to be sent.
pub struct OpenArtifact {
    /// What it is.
    pub artifact: StoredArtifact,
    /// Its bytes.
    pub reader: ArtifactReader,
}

/// The artifacts of every tenant, read by owner.
pub struct Artifacts {
    records: Arc<dyn InvocationStore>,
    files: Arc<dyn ArtifactStore>,
}

impl Artifacts {
    /// Artifacts recorded in `records` whose bytes are in `files`.
    pub fn new(records: Arc<dyn InvocationStore>, files: Arc<dyn ArtifactStore>) -> Self {
        Artifacts { records, files }
    }

    /// `id` when it is `tenant_id`'s; `None` otherwise.
    pub async fn open(
        &self,
        tenant_id: &str,
        id: Uuid,
    ) -> Result<Option<OpenArtifact>, ArtifactReadError> {
        self.open_where(tenant_id, id, |_| true).await
    }

    /// An artifact of one run of a tenant: what a script reads, whose turn
    /// belongs to that run. Another run's artifact is not found.
    pub async fn open_in_run(
        &self,
        tenant_id: &str,
        run_id: Uuid,
        id: Uuid,
    ) -> Result<Option<OpenArtifact>, ArtifactReadError> {
        self.open_where(tenant_id, id, |record| record.run_id == run_id)
            .await
    }

    /// An artifact of a run of one principal: what a front-door caller
    /// reads through a link its result carried. An artifact of another
    /// run, or a run of another principal, is not found.
    pub async fn open_for_principal(
        &self,
        tenant_id: &str,
        principal_id: &str,
        run_id: Uuid,
        id: Uuid,
    ) -> Result<Option<OpenArtifact>, ArtifactReadError> {
        self.open_where(tenant_id, id, |record| {
            record.run_id == run_id && record.run_principal_id.as_deref() == Some(principal_id)
        })
        .await
    }

    async fn open_where(
        &self,
        tenant_id: &str,
        id: Uuid,
        allowed: impl FnOnce(&ArtifactRecord) -> bool,
    ) -> Result<Option<OpenArtifact>, ArtifactReadError> {
        let Some(record) = self.records.artifact(tenant_id, id).await? else {
            return Ok(None);
        };
        if !allowed(&record) {
            return Ok(None);
        }
        let reader = self
            .files
            .open(tenant_id, record.run_id, id)
            .await
            .map_err(|_| ArtifactReadError::Unreadable)?;
        Ok(Some(OpenArtifact {
            artifact: record.artifact,
            reader,
        }))
    }
}
