//! Whose a run is. A run belongs to the tenant and principal whose call or
//! turn opened it; the store records that once, and this node remembers the
//! runs it has seen so a call costs no read for it.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use uuid::Uuid;

use crate::ports::{InvocationStore, RunOwner, StoreError};

/// Runs remembered at once; past this the memory starts again (a run not
/// remembered costs one store round trip, nothing else).
const REMEMBERED: usize = 65_536;

/// The owners of the runs this node has seen.
#[derive(Default)]
pub(super) struct RunOwners {
    /// By tenant and run: the owning principal.
    known: Mutex<HashMap<(String, Uuid), String>>,
}

impl RunOwners {
    /// Whether `opener`'s principal may write its tenant's run: recorded as
    /// its owner now when the run is new.
    pub(super) async fn admits(
        &self,
        store: &dyn InvocationStore,
        opener: &RunOwner,
    ) -> Result<bool, StoreError> {
        let remembered = self
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(opener.tenant_id.clone(), opener.run_id))
            .map(|principal| principal == &opener.principal_id);
        if let Some(admits) = remembered {
            return Ok(admits);
        }
        let owner = store.open_run(opener).await?;
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        if known.len() >= REMEMBERED {
            known.clear();
        }
        let admits = owner.principal_id == opener.principal_id;
        known.insert((owner.tenant_id, owner.run_id), owner.principal_id);
        Ok(admits)
    }
}
