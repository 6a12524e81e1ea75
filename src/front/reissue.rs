//! The re-issue rule: a call whose answer toolgate never delivered (the
//! stream or connection closed before the answer was written) is the same
//! call when the same principal asks for the same tool with the same
//! canonical arguments again, within the window. Clients that name nothing
//! re-issue a broken call with a new JSON-RPC id (2026-07-28 requires it,
//! and 2025-era SDKs do it on a reconnect, in a new session); toolgate
//! knows whether it delivered the answer, so it can tell a re-issue from a
//! new call where the client cannot.
//!
//! Each node keeps the calls its own connections left undelivered, here;
//! a delivered answer forgets the call, so an identical later call is a
//! new one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::render::CallIdentity;
use crate::domain::sha256_hex;

/// How long a non-idempotent call's undelivered answer is remembered past
/// the window: an identical call then is answered that call's recorded
/// outcome and told why, rather than run blind.
const REMEMBERED: Duration = Duration::from_secs(24 * 3600);

/// Undelivered calls one node remembers at most; past it the oldest
/// abandoned one is forgotten first.
const MAXIMUM_REMEMBERED: usize = 65_536;

/// What makes two calls the same call: the tenant, the principal, the
/// tool's registry name and the canonical arguments' hash.
pub fn reissue_key(
    tenant_id: &str,
    principal_id: &str,
    tool: &str,
    arguments_hash: &str,
) -> String {
    sha256_hex(format!("{tenant_id}\0{principal_id}\0{tool}\0{arguments_hash}").as_bytes())
}

/// The calls this node's connections have not delivered, by re-issue key.
pub(super) struct Reissues {
    window: Duration,
    calls: Mutex<HashMap<String, Undelivered>>,
    next: AtomicU64,
    /// When the expired calls were last forgotten: a sweep walks every
    /// call, so it runs at most once per [`SWEEP_EVERY`], not per call.
    swept: Mutex<Option<Instant>>,
}

/// How often the calls past what they are remembered for are forgotten.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// One call whose answer has not been delivered.
struct Undelivered {
    identity: CallIdentity,
    /// Distinguishes this entry from a later one under the same key.
    generation: u64,
    /// Requests whose connections still wait for the answer.
    waiting: usize,
    /// When the last waiting request's stream closed.
    abandoned_at: Option<Instant>,
    /// Whether repeating the tool may repeat an effect.
    acts: bool,
    /// Its answer said it waits for an approval: the call is not over, and
    /// asking again is asking for it, however late.
    held: bool,
    /// The run of the call on this node: resolves when it ends.
    running: watch::Receiver<bool>,
    /// Counts runs, so a re-issue knows when another took the turn.
    runs: u64,
}

/// How a call stands to an undelivered twin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reissue {
    /// No twin: a new call.
    New,
    /// The twin, within the window: the same call.
    SameCall,
    /// The twin of a tool that acts, past the window: its recorded outcome
    /// answers, with a word on why.
    PastWindow,
}

impl Reissue {
    /// The name in a result's `_meta` and the events.
    pub fn as_str(self) -> &'static str {
        match self {
            Reissue::New => "new",
            Reissue::SameCall => "same_call",
            Reissue::PastWindow => "past_window",
        }
    }
}

/// A request's place on one undelivered call.
pub(super) struct Attached {
    pub identity: CallIdentity,
    pub reissue: Reissue,
    pub key: String,
    pub generation: u64,
}

impl Reissues {
    pub(super) fn new(window: Duration) -> Self {
        Reissues {
            window,
            calls: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            swept: Mutex::new(None),
        }
    }

    /// The window a re-issue is the same call within.
    pub(super) fn window(&self) -> Duration {
        self.window
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Undelivered>> {
        self.calls.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Places a request for the call `key` names: on its undelivered twin
    /// when there is one to take, else on a new entry with `fresh`.
    pub(super) fn attach(&self, key: String, fresh: CallIdentity, acts: bool) -> Attached {
        let now = Instant::now();
        let mut calls = self.lock();
        {
            let mut swept = self.swept.lock().unwrap_or_else(PoisonError::into_inner);
            if swept.is_none_or(|at| now.duration_since(at) >= SWEEP_EVERY) {
                *swept = Some(now);
                self.forget_expired(&mut calls, now);
            }
        }
        // A twin the sweep has not reached yet is judged as it would.
        if calls
            .get(&key)
            .is_some_and(|twin| !self.remembered(twin, now))
        {
            calls.remove(&key);
        }
        if let Some(twin) = calls.get_mut(&key) {
            let reissue = match twin.abandoned_at {
                Some(at) if !twin.held && now.duration_since(at) >= self.window => {
                    Reissue::PastWindow
                }
                _ => Reissue::SameCall,
            };
            twin.waiting += 1;
            twin.abandoned_at = None;
            return Attached {
                identity: twin.identity.clone(),
                reissue,
                key,
                generation: twin.generation,
            };
        }
        if calls.len() >= MAXIMUM_REMEMBERED
            && let Some(oldest) = calls
                .iter()
                .filter_map(|(key, call)| call.abandoned_at.map(|at| (at, key.clone())))
                .min()
                .map(|(_, key)| key)
        {
            calls.remove(&oldest);
        }
        let generation = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let (_, running) = watch::channel(true);
        calls.insert(
            key.clone(),
            Undelivered {
                identity: fresh.clone(),
                generation,
                waiting: 1,
                abandoned_at: None,
                acts,
                held: false,
                running,
                runs: 0,
            },
        );
        Attached {
            identity: fresh,
            reissue: Reissue::New,
            key,
            generation,
        }
    }

    /// Takes the turn to run `attached`'s call on this node once no earlier
    /// run of it is under way here: the sender resolves the next waiter.
    pub(super) async fn take_turn(&self, attached: &Attached) -> watch::Sender<bool> {
        loop {
            let (mut running, runs) = {
                let calls = self.lock();
                match calls.get(&attached.key) {
                    Some(call) if call.generation == attached.generation => {
                        (call.running.clone(), call.runs)
                    }
                    // Delivered meanwhile by another of its requests: this
                    // one still runs it under the same identity, and the
                    // pipeline answers the recorded outcome.
                    _ => return watch::channel(false).0,
                }
            };
            let _ = running.wait_for(|ended| *ended).await;
            let mut calls = self.lock();
            let Some(call) = calls.get_mut(&attached.key) else {
                return watch::channel(false).0;
            };
            if call.generation != attached.generation {
                return watch::channel(false).0;
            }
            if call.runs == runs {
                let (sender, receiver) = watch::channel(false);
                call.running = receiver;
                call.runs += 1;
                return sender;
            }
        }
    }

    /// The answer reached the client: an identical later call is new.
    pub(super) fn delivered(&self, key: &str, generation: u64) {
        let mut calls = self.lock();
        if calls
            .get(key)
            .is_some_and(|call| call.generation == generation)
        {
            calls.remove(key);
        }
    }

    /// A request's stream closed before its answer was written.
    pub(super) fn abandoned(&self, key: &str, generation: u64) {
        self.let_go(key, generation, false);
    }

    /// A request was answered that its call waits for an approval: the
    /// call stays open, and the same call asked again resumes it.
    pub(super) fn held(&self, key: &str, generation: u64) {
        self.let_go(key, generation, true);
    }

    fn let_go(&self, key: &str, generation: u64, held: bool) {
        let mut calls = self.lock();
        if let Some(call) = calls.get_mut(key)
            && call.generation == generation
        {
            call.held |= held;
            call.waiting = call.waiting.saturating_sub(1);
            if call.waiting == 0 {
                call.abandoned_at = Some(Instant::now());
            }
        }
    }

    /// Forgets the abandoned calls past what they are remembered for: the
    /// window for a tool that does not act, [`REMEMBERED`] for one that
    /// does or that waits for an approval.
    fn forget_expired(&self, calls: &mut HashMap<String, Undelivered>, now: Instant) {
        calls.retain(|_, call| self.remembered(call, now));
    }

    /// Whether `call` is still remembered at `now`.
    fn remembered(&self, call: &Undelivered, now: Instant) -> bool {
        call.abandoned_at.is_none_or(|at| {
            let kept = if call.acts || call.held {
                self.window.max(REMEMBERED)
            } else {
                self.window
            };
            now.duration_since(at) < kept
        })
    }
}

/// One request's answer on its way to the client: written whole, or its
/// stream closed first. Shared by the listener, which sees the connection,
/// and the handler, which places the call.
#[derive(Default)]
pub(super) struct Delivery {
    /// Fired when the stream closes before the answer is written: for the
    /// call, cancellation.
    pub closed: CancellationToken,
    state: Mutex<DeliveryState>,
}

#[derive(Default)]
struct DeliveryState {
    attached: Option<(Arc<Reissues>, String, u64)>,
    /// Set once: true when written, false when the stream closed.
    ended: Option<bool>,
    /// The answer written says the call waits for an approval.
    pending: bool,
    /// The call's row and its session, once its run ended with one.
    recorded: Option<(Uuid, Uuid)>,
    /// Whether the undelivered answer has been reported.
    reported: bool,
}

/// A call past its intent whose answer its request's stream never took.
pub(super) struct Undelivery {
    pub invocation_id: Uuid,
    pub session_id: Uuid,
}

impl Delivery {
    fn lock(&self) -> std::sync::MutexGuard<'_, DeliveryState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The request waits on `attached`'s call.
    pub(super) fn attach(&self, reissues: Arc<Reissues>, attached: &Attached) {
        let mut state = self.lock();
        // Closed before the call was placed: the place is given back. (An
        // answer is written only after its call is placed.)
        if state.ended == Some(false) {
            reissues.abandoned(&attached.key, attached.generation);
        }
        state.attached = Some((reissues, attached.key.clone(), attached.generation));
    }

    /// The answer was written whole.
    pub(super) fn delivered(&self) {
        let mut state = self.lock();
        if state.ended.is_some() {
            return;
        }
        state.ended = Some(true);
        if let Some((reissues, key, generation)) = &state.attached {
            if state.pending {
                reissues.held(key, *generation);
            } else {
                reissues.delivered(key, *generation);
            }
        }
    }

    /// The answer about to be written says the call waits for an approval.
    pub(super) fn pending(&self) {
        self.lock().pending = true;
    }

    /// The stream closed first; what to report, when the call had a row.
    pub(super) fn abandoned(&self) -> Option<Undelivery> {
        let mut state = self.lock();
        if state.ended.is_some() {
            return None;
        }
        state.ended = Some(false);
        self.closed.cancel();
        if let Some((reissues, key, generation)) = &state.attached {
            reissues.abandoned(key, *generation);
        }
        Self::report(&mut state)
    }

    /// The call's run ended with a row; what to report, when its stream
    /// had already closed.
    pub(super) fn recorded(&self, invocation_id: Uuid, session_id: Uuid) -> Option<Undelivery> {
        let mut state = self.lock();
        state.recorded = Some((invocation_id, session_id));
        Self::report(&mut state)
    }

    fn report(state: &mut DeliveryState) -> Option<Undelivery> {
        match (state.ended, state.recorded, state.reported) {
            (Some(false), Some((invocation_id, session_id)), false) => {
                state.reported = true;
                Some(Undelivery {
                    invocation_id,
                    session_id,
                })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(call_id: &str) -> CallIdentity {
        CallIdentity {
            run_id: Uuid::new_v4(),
            step_number: 0,
            call_id: call_id.into(),
            named: false,
            origin_trust: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_undelivered_call_is_the_same_call_within_the_window_and_a_delivered_one_is_not() {
        let reissues = Arc::new(Reissues::new(Duration::from_secs(60)));
        let key = reissue_key("t", "p", "mail.send", "h");
        let first = reissues.attach(key.clone(), identity("mcp:1"), true);
        assert_eq!(first.reissue, Reissue::New);
        // In flight and not yet delivered: an identical call waits on it.
        let concurrent = reissues.attach(key.clone(), identity("mcp:2"), true);
        assert_eq!(
            (concurrent.reissue, concurrent.identity.call_id.as_str()),
            (Reissue::SameCall, "mcp:1")
        );
        reissues.abandoned(&key, first.generation);
        reissues.abandoned(&key, concurrent.generation);
        tokio::time::advance(Duration::from_secs(59)).await;
        let again = reissues.attach(key.clone(), identity("mcp:3"), true);
        assert_eq!(
            (again.reissue, again.identity.call_id.as_str()),
            (Reissue::SameCall, "mcp:1")
        );
        // Another principal, another tool, other arguments: never the same.
        for other in [
            reissue_key("t", "q", "mail.send", "h"),
            reissue_key("u", "p", "mail.send", "h"),
            reissue_key("t", "p", "mail.draft", "h"),
            reissue_key("t", "p", "mail.send", "i"),
        ] {
            assert_eq!(
                reissues.attach(other, identity("mcp:4"), true).reissue,
                Reissue::New
            );
        }
        reissues.delivered(&key, again.generation);
        let after = reissues.attach(key.clone(), identity("mcp:5"), true);
        assert_eq!(
            (after.reissue, after.identity.call_id.as_str()),
            (Reissue::New, "mcp:5")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_window_a_call_that_acts_answers_its_twin_and_one_that_does_not_runs() {
        let reissues = Reissues::new(Duration::from_secs(60));
        let acts = reissue_key("t", "p", "mail.send", "h");
        let reads = reissue_key("t", "p", "mail.read", "h");
        for (key, acting) in [(&acts, true), (&reads, false)] {
            let first = reissues.attach(key.clone(), identity("mcp:1"), acting);
            reissues.abandoned(key, first.generation);
        }
        tokio::time::advance(Duration::from_secs(61)).await;
        let twin = reissues.attach(acts.clone(), identity("mcp:2"), true);
        assert_eq!(
            (twin.reissue, twin.identity.call_id.as_str()),
            (Reissue::PastWindow, "mcp:1")
        );
        assert_eq!(
            reissues.attach(reads, identity("mcp:2"), false).reissue,
            Reissue::New
        );
        reissues.abandoned(&acts, twin.generation);
        tokio::time::advance(REMEMBERED).await;
        assert_eq!(
            reissues.attach(acts, identity("mcp:3"), true).reissue,
            Reissue::New
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_answered_pending_is_the_same_call_asked_again_past_the_window() {
        let reissues = Reissues::new(Duration::from_secs(60));
        let key = reissue_key("t", "p", "mail.read", "h");
        let first = reissues.attach(key.clone(), identity("mcp:1"), false);
        reissues.held(&key, first.generation);
        tokio::time::advance(Duration::from_secs(3600)).await;
        let again = reissues.attach(key.clone(), identity("mcp:2"), false);
        assert_eq!(
            (again.reissue, again.identity.call_id.as_str()),
            (Reissue::SameCall, "mcp:1")
        );
        reissues.delivered(&key, again.generation);
        assert_eq!(
            reissues.attach(key, identity("mcp:3"), false).reissue,
            Reissue::New
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_reissue_runs_after_the_run_under_way_and_one_at_a_time() {
        let reissues = Arc::new(Reissues::new(Duration::from_secs(60)));
        let key = reissue_key("t", "p", "mail.send", "h");
        let first = reissues.attach(key.clone(), identity("mcp:1"), true);
        let running = reissues.take_turn(&first).await;
        let second = reissues.attach(key.clone(), identity("mcp:2"), true);
        let waiting = {
            let reissues = reissues.clone();
            tokio::spawn(async move { reissues.take_turn(&second).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "waits for the run under way");
        running.send_replace(true);
        let turn = waiting.await.unwrap();
        assert!(!*turn.borrow());
    }

    #[test]
    fn a_delivery_reports_an_undelivered_row_once_whichever_comes_first() {
        let (row, session) = (Uuid::new_v4(), Uuid::new_v4());
        let closed_first = Delivery::default();
        assert!(closed_first.abandoned().is_none());
        assert!(closed_first.closed.is_cancelled());
        assert_eq!(
            closed_first.recorded(row, session).map(|u| u.invocation_id),
            Some(row)
        );
        assert!(closed_first.recorded(row, session).is_none(), "once");
        let recorded_first = Delivery::default();
        assert!(recorded_first.recorded(row, session).is_none());
        assert_eq!(
            recorded_first.abandoned().map(|u| u.session_id),
            Some(session)
        );
        let written = Delivery::default();
        assert!(written.recorded(row, session).is_none());
        written.delivered();
        assert!(written.abandoned().is_none());
        assert!(!written.closed.is_cancelled());
    }
}
