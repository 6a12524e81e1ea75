//! The door's live connections, so that a full door makes room: when every
//! place is taken, a connection serving no request (one that never sent a
//! whole head first, else the one idle longest) is asked to close and its
//! place is handed to the new one at once. A connection serving a request
//! is never asked; so whoever holds connections without using them holds
//! nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::OwnedSemaphorePermit;
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
    /// Its place in the door, until it ends or gives the place up.
    place: Mutex<Option<OwnedSemaphorePermit>>,
    table: Arc<LiveConnections>,
}

impl Live {
    /// Whether it has begun a request.
    pub(super) fn used(&self) -> bool {
        self.used.load(Ordering::Acquire)
    }

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
    /// Registers a connection holding `place`; it leaves the table, and
    /// gives the place back, when the last handle to it drops.
    pub(super) fn register(self: &Arc<Self>, place: OwnedSemaphorePermit) -> Arc<Live> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let live = Arc::new(Live {
            id,
            busy: AtomicUsize::new(0),
            active: Mutex::new(Instant::now()),
            used: std::sync::atomic::AtomicBool::new(false),
            close: CancellationToken::new(),
            place: Mutex::new(Some(place)),
            table: self.clone(),
        });
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, Arc::downgrade(&live));
        live
    }

    /// Asks a connection not serving a request to close (one that never
    /// sent a whole request first, else the one idle longest) and takes its
    /// place, if there is one.
    pub(super) fn evict_idle(&self) -> Option<OwnedSemaphorePermit> {
        let candidates: Vec<Arc<Live>> = self
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        let idlest = candidates
            .iter()
            .filter(|live| {
                live.busy.load(Ordering::Acquire) == 0
                    && !live.close.is_cancelled()
                    && lock(&live.place).is_some()
            })
            .min_by_key(|live| {
                (
                    live.used.load(Ordering::Acquire),
                    *live.active.lock().unwrap_or_else(PoisonError::into_inner),
                )
            });
        let live = idlest?;
        live.close.cancel();
        lock(&live.place).take()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idlest_connection_is_asked_to_close_and_a_busy_one_never() {
        let table = Arc::new(LiveConnections::default());
        let places = Arc::new(tokio::sync::Semaphore::new(4));
        let place = || places.clone().try_acquire_owned().unwrap();
        let (old, busy, young) = (
            table.register(place()),
            table.register(place()),
            table.register(place()),
        );
        let _request = busy.begin();
        drop(old.begin());
        drop(young.begin());
        // Never used goes first, however young.
        let fresh = table.register(place());
        assert!(
            places.clone().try_acquire_owned().is_err(),
            "the door is full"
        );
        assert!(table.evict_idle().is_some(), "a place handed over");
        assert!(fresh.close.is_cancelled() && !old.close.is_cancelled());
        *young.active.lock().unwrap() = Instant::now() + std::time::Duration::from_secs(1);
        assert!(table.evict_idle().is_some());
        assert!(old.close.is_cancelled() && !busy.close.is_cancelled());
        assert!(table.evict_idle().is_some());
        assert!(young.close.is_cancelled());
        assert!(table.evict_idle().is_none(), "only a busy one is left");
        assert!(!busy.close.is_cancelled());
        drop((old, fresh));
        assert_eq!(table.live.lock().unwrap().len(), 2);
    }
}
