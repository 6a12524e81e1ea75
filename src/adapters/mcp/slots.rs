//! The general preparation slots, shared fairly: operator servers (which
//! every tenant's sessions use) take any free slot; a tenant's own servers
//! hold at most its share, and a tenant already holding one takes another
//! only while more than the reserve stays free. However many tenants have
//! servers that never answer, a tenant holding none finds a slot as soon as
//! the reserve has one, not after the others' handshakes time out.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use tokio::sync::Notify;

/// The slots and who holds them.
pub(super) struct PreparationSlots {
    total: usize,
    share: usize,
    reserve: usize,
    held: Mutex<Held>,
    freed: Notify,
}

#[derive(Default)]
struct Held {
    all: usize,
    by_tenant: HashMap<String, usize>,
}

/// One slot, given back when dropped.
pub(super) struct Slot<'a> {
    slots: &'a PreparationSlots,
    tenant: Option<String>,
}

impl PreparationSlots {
    /// `total` slots; a tenant's servers hold at most `share` of them, and
    /// a second one only while more than `reserve` are free.
    pub(super) fn new(total: usize, share: usize, reserve: usize) -> Self {
        PreparationSlots {
            total: total.max(1),
            share: share.max(1),
            reserve,
            held: Mutex::new(Held::default()),
            freed: Notify::new(),
        }
    }

    /// A slot for a server of `tenant` (`None`: an operator server),
    /// waiting until the rules above give one.
    pub(super) async fn acquire(&self, tenant: Option<&str>) -> Slot<'_> {
        loop {
            // Registered before the check, so a slot freed in between is
            // not missed.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(slot) = self.try_acquire(tenant) {
                return slot;
            }
            freed.await;
        }
    }

    /// A slot now, if the rules give one.
    pub(super) fn try_acquire(&self, tenant: Option<&str>) -> Option<Slot<'_>> {
        let mut held = self.lock();
        let free = self.total.saturating_sub(held.all);
        let allowed = match tenant {
            None => free > 0,
            Some(tenant) => match held.by_tenant.get(tenant).copied().unwrap_or(0) {
                0 => free > 0,
                mine => mine < self.share && free > self.reserve,
            },
        };
        if !allowed {
            return None;
        }
        held.all += 1;
        if let Some(tenant) = tenant {
            *held.by_tenant.entry(tenant.to_owned()).or_default() += 1;
        }
        Some(Slot {
            slots: self,
            tenant: tenant.map(str::to_owned),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        {
            let mut held = self.slots.lock();
            held.all = held.all.saturating_sub(1);
            if let Some(tenant) = &self.tenant
                && let Some(mine) = held.by_tenant.get_mut(tenant)
            {
                *mine = mine.saturating_sub(1);
                if *mine == 0 {
                    held.by_tenant.remove(tenant);
                }
            }
        }
        self.slots.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noisy_tenants_leave_the_reserve_to_a_tenant_holding_none() {
        let slots = PreparationSlots::new(8, 2, 2);
        let mut held = Vec::new();
        // Four tenants whose servers never answer each ask for three.
        for _ in 0..3 {
            for tenant in ["a", "b", "c", "d"] {
                held.extend(slots.try_acquire(Some(tenant)));
            }
        }
        assert_eq!(
            held.len(),
            6,
            "four firsts, then seconds down to the reserve"
        );
        let quiet = slots.try_acquire(Some("quiet"));
        assert!(quiet.is_some(), "a tenant holding none is served");
        assert_eq!(held.len(), 6);
        assert!(slots.try_acquire(Some("quiet")).is_none(), "not a second");
        let operator = slots.try_acquire(None);
        assert!(operator.is_some(), "an operator server takes the last");
        assert!(slots.try_acquire(None).is_none(), "and then none are left");
    }

    #[test]
    fn one_tenant_holds_at_most_its_share() {
        let slots = PreparationSlots::new(8, 2, 2);
        let held: Vec<_> = (0..24)
            .filter_map(|_| slots.try_acquire(Some("noisy")))
            .collect();
        assert_eq!(held.len(), 2);
        drop(held);
        let again: Vec<_> = (0..24)
            .filter_map(|_| slots.try_acquire(Some("noisy")))
            .collect();
        assert_eq!(again.len(), 2, "given back when dropped");
    }

    #[tokio::test]
    async fn a_freed_slot_wakes_a_waiter() {
        let slots = std::sync::Arc::new(PreparationSlots::new(1, 1, 0));
        let first = slots.try_acquire(None);
        assert!(first.is_some());
        let waiter = {
            let slots = slots.clone();
            tokio::spawn(async move {
                let _slot = slots.acquire(Some("t")).await;
            })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(first);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .expect("ran");
    }
}
