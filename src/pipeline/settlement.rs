//! Rows a call could not settle because the store failed under it after
//! its tool ran: the worker keeps the terminal record and writes it when the
//! store answers again, with bounded retries; past them it lets the row go
//! to recovery, which applies the same table the call's answer followed.
//!
//! The answer the caller got already says what the row will hold whichever
//! way it ends (the executor decides that, not this module): `uncertain`
//! where recovery would end the row uncertain, and so the record kept here
//! says uncertain too; otherwise a retryable `tool.record_unavailable`
//! whose retry is the same call and reads what the row ends with.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::task::JoinSet;
use uuid::Uuid;

use crate::ports::{Fence, InvocationStore, TerminalRecord, ToolEvent};

/// The first retry's wait; each next one doubles, up to [`LONGEST_WAIT`].
const FIRST_WAIT: Duration = Duration::from_millis(100);
/// The longest wait between two tries.
const LONGEST_WAIT: Duration = Duration::from_secs(5);
/// Tries of the terminal write before the row is let go: about a minute
/// and a half of outage with the waits above.
const WRITE_TRIES: u32 = 24;
/// Tries of letting the row go, after which it stays with this worker until
/// its lease ends.
const RELEASE_TRIES: u32 = 24;

/// A terminal record waiting for the store.
pub(super) struct Settlement {
    /// The row's tenant.
    pub tenant_id: String,
    /// The row.
    pub id: Uuid,
    /// The attempt's fence: a row another worker took meanwhile is its.
    pub fence: Fence,
    /// What the row ends with.
    pub terminal: TerminalRecord,
    /// The terminal event.
    pub events: Vec<ToolEvent>,
    /// When the call ended.
    pub now: DateTime<Utc>,
}

/// The settlements in progress, each on a task of its own.
pub(super) struct Settler {
    store: Arc<dyn InvocationStore>,
    tasks: Mutex<JoinSet<()>>,
}

impl Settler {
    pub(super) fn new(store: Arc<dyn InvocationStore>) -> Settler {
        Settler {
            store,
            tasks: Mutex::new(JoinSet::new()),
        }
    }

    /// Takes a settlement over; it is written, or its row let go, in the
    /// background.
    pub(super) fn hand_over(&self, settlement: Settlement) {
        let store = self.store.clone();
        let mut tasks = self
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Reap what has finished, so the set holds only what is pending.
        while tasks.try_join_next().is_some() {}
        tasks.spawn(settle(store, settlement));
    }

    /// Settlements still pending.
    pub(super) fn pending(&self) -> usize {
        let mut tasks = self
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while tasks.try_join_next().is_some() {}
        tasks.len()
    }

    /// Waits up to `within` for the pending settlements; what is left is
    /// dropped with the process, its rows recovered by the table.
    pub(super) async fn drain(&self, within: Duration) {
        let mut tasks = std::mem::take(
            &mut *self
                .tasks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let _ = tokio::time::timeout(within, async { while tasks.join_next().await.is_some() {} })
            .await;
    }
}

async fn settle(store: Arc<dyn InvocationStore>, settlement: Settlement) {
    let Settlement {
        tenant_id,
        id,
        fence,
        terminal,
        events,
        now,
    } = settlement;
    let mut wait = FIRST_WAIT;
    for _ in 0..WRITE_TRIES {
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(LONGEST_WAIT);
        match store
            .complete_invocation(&tenant_id, id, fence, &terminal, &events, now)
            .await
        {
            Ok(true) => {
                tracing::info!(invocation_id = %id, "a row the store failed under is settled");
                return;
            }
            // Another worker holds the row now: its record is the row's.
            Ok(false) => return,
            Err(_) => continue,
        }
    }
    tracing::error!(
        invocation_id = %id,
        "the store did not take a settled row in time; it goes to recovery"
    );
    let mut wait = FIRST_WAIT;
    for _ in 0..RELEASE_TRIES {
        match store.release_invocation(&tenant_id, id, fence).await {
            Ok(_) => return,
            Err(_) => {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(LONGEST_WAIT);
            }
        }
    }
    tracing::error!(
        invocation_id = %id,
        "a row could not be let go; it is recovered when this worker's lease ends"
    );
}
