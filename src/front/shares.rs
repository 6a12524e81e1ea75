//! Fair shares of the door: the calls one credential, and one tenant, may
//! have in flight on this node across all their sessions, so that no caller
//! holds every connection the door has (held approvals make that cheap).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Whose share is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ShareSpent {
    /// The credential's.
    Credential,
    /// The tenant's.
    Tenant,
}

/// The calls in flight per credential and per tenant.
pub(super) struct Shares {
    credential_cap: usize,
    tenant_cap: usize,
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    credentials: HashMap<String, usize>,
    tenants: HashMap<String, usize>,
}

/// One call's place in both shares, given back when dropped.
pub(super) struct Share {
    shares: Arc<Shares>,
    credential: String,
    tenant: String,
}

impl Shares {
    pub(super) fn new(credential_cap: usize, tenant_cap: usize) -> Arc<Self> {
        Arc::new(Shares {
            credential_cap: credential_cap.max(1),
            tenant_cap: tenant_cap.max(1),
            counts: Mutex::new(Counts::default()),
        })
    }

    /// A place for one more call of `credential` of `tenant`, or whose
    /// share is spent (nothing is taken then).
    pub(super) fn enter(
        self: &Arc<Self>,
        credential: &str,
        tenant: &str,
    ) -> Result<Share, ShareSpent> {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if counts.credentials.get(credential).copied().unwrap_or(0) >= self.credential_cap {
            return Err(ShareSpent::Credential);
        }
        if counts.tenants.get(tenant).copied().unwrap_or(0) >= self.tenant_cap {
            return Err(ShareSpent::Tenant);
        }
        *counts.credentials.entry(credential.to_owned()).or_default() += 1;
        *counts.tenants.entry(tenant.to_owned()).or_default() += 1;
        Ok(Share {
            shares: self.clone(),
            credential: credential.to_owned(),
            tenant: tenant.to_owned(),
        })
    }
}

fn release(map: &mut HashMap<String, usize>, key: &str) {
    if let Some(count) = map.get_mut(key) {
        *count = count.saturating_sub(1);
        if *count == 0 {
            map.remove(key);
        }
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut counts = self
            .shares
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        release(&mut counts.credentials, &self.credential);
        release(&mut counts.tenants, &self.tenant);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_and_a_tenant_take_no_more_than_their_share() {
        let shares = Shares::new(2, 3);
        let a1 = shares.enter("a", "t").unwrap();
        let _a2 = shares.enter("a", "t").unwrap();
        assert_eq!(shares.enter("a", "t").err(), Some(ShareSpent::Credential));
        let _b1 = shares.enter("b", "t").unwrap();
        assert_eq!(shares.enter("c", "t").err(), Some(ShareSpent::Tenant));
        assert!(shares.enter("c", "u").is_ok(), "another tenant has its own");
        drop(a1);
        assert!(
            shares.enter("c", "t").is_ok(),
            "a place given back is taken"
        );
        let counts = shares.counts.lock().unwrap();
        assert_eq!(counts.credentials.get("a"), Some(&1));
    }
}
