//! The door's live connections, so that a full door makes room: when every
//! place is taken, the connection that has been idle longest (kept alive
//! between requests, or still sending its first head) is asked to close,
//! and the new one takes its place. A connection serving a request is never
//! asked; so whoever holds connections without using them holds nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// One connection as the table sees it.
pub(super) struct Live {
    id: u64,
    /// Requests it is serving now.
    busy: AtomicUsize,
    /// When it last began or ended a request (or opened).
    active: Mutex<Instant>,
    /// Whether it has begun a request at all.
    used: std::sync::atomic::AtomicBool,
    /// Fired to ask it to close once idle.
    pub(super) close: CancellationToken,
    table: Arc<LiveConnections>,
}

impl Live {
    /// A request begins; it ends when the guard drops (with the response's
    /// body, once written).
    pub(super) fn begin(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::AcqRel);
        self.used.store(true, Ordering::Release);
        *self.active.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
        Busy(self.clone())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.table
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

/// A request in progress on a connection.
pub(super) struct Busy(Arc<Live>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
        *self.0.active.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }
}

/// Every live connection of the door.
#[derive(Default)]
pub(super) struct LiveConnections {
    next: AtomicU64,
    live: Mutex<HashMap<u64, std::sync::Weak<Live>>>,
}

impl LiveConnections {
    /// Registers a connection; it leaves the table when the last handle
    /// to it drops.
    pub(super) fn register(self: &Arc<Self>) -> Arc<Live> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let live = Arc::new(Live {
            id,
            busy: AtomicUsize::new(0),
            active: Mutex::new(Instant::now()),
            used: std::sync::atomic::AtomicBool::new(false),
            close: CancellationToken::new(),
            table: self.clone(),
        });
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, Arc::downgrade(&live));
        live
    }

    /// Asks a connection not serving a request to close: one that never
    /// sent a whole request first, else the one idle longest; whether
    /// there was one.
    pub(super) fn evict_idle(&self) -> bool {
        let candidates: Vec<Arc<Live>> = self
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        let idlest = candidates
            .iter()
            .filter(|live| live.busy.load(Ordering::Acquire) == 0 && !live.close.is_cancelled())
            .min_by_key(|live| {
                (
                    live.used.load(Ordering::Acquire),
                    *live.active.lock().unwrap_or_else(PoisonError::into_inner),
                )
            });
        match idlest {
            Some(live) => {
                live.close.cancel();
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idlest_connection_is_asked_to_close_and_a_busy_one_never() {
        let table = Arc::new(LiveConnections::default());
        let (old, busy, young) = (table.register(), table.register(), table.register());
        let _request = busy.begin();
        drop(old.begin());
        drop(young.begin());
        // Never used goes first, however young.
        let fresh = table.register();
        assert!(table.evict_idle());
        assert!(fresh.close.is_cancelled() && !old.close.is_cancelled());
        *young.active.lock().unwrap() = Instant::now() + std::time::Duration::from_secs(1);
        assert!(table.evict_idle());
        assert!(old.close.is_cancelled() && !busy.close.is_cancelled());
        assert!(table.evict_idle());
        assert!(young.close.is_cancelled());
        assert!(!table.evict_idle(), "only a busy one is left");
        assert!(!busy.close.is_cancelled());
        drop((old, fresh));
        assert_eq!(table.live.lock().unwrap().len(), 2);
    }
}
