//! A bound on repeated warnings: each WARN or ERROR line of the code (its
//! callsite) is written at most [`LINES_PER_WINDOW`] times per
//! [`WINDOW`]; the rest of the window's lines of it are dropped. A flood of
//! refused or abandoned requests thus costs a few lines a minute, not one
//! per request, while every kind of problem is still seen. (A line saying
//! how many were dropped cannot be written from here: tracing drops events
//! raised while an event is being dispatched.)

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use tracing::callsite::Identifier;
use tracing::{Event, Level, Metadata};
use tracing_subscriber::layer::{Context, Filter};

/// Lines of one callsite written per window.
pub const LINES_PER_WINDOW: u32 = 10;
/// The window.
pub const WINDOW: Duration = Duration::from_secs(60);

struct Window {
    began: Instant,
    written: u32,
}

/// The per-layer filter that keeps the budget.
#[derive(Default)]
pub struct LogBudget {
    windows: Mutex<HashMap<Identifier, Window>>,
}

impl LogBudget {
    /// Whether a line of `callsite` may be written at `now`.
    fn admit(&self, callsite: Identifier, now: Instant) -> bool {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        let window = windows.entry(callsite).or_insert(Window {
            began: now,
            written: 0,
        });
        if now.duration_since(window.began) >= WINDOW {
            window.began = now;
            window.written = 0;
        }
        let written = window.written < LINES_PER_WINDOW;
        if written {
            window.written += 1;
        }
        written
    }
}

impl<S> Filter<S> for LogBudget {
    fn enabled(&self, _: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        true
    }

    fn event_enabled(&self, event: &Event<'_>, _: &Context<'_, S>) -> bool {
        let metadata = event.metadata();
        // INFO and below (one line per finished call among them) are not
        // budgeted: they are what the operator turned on.
        if *metadata.level() > Level::WARN {
            return true;
        }
        self.admit(metadata.callsite(), Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_callsite_writes_its_budget_per_window() {
        struct Site;
        static SITE: Site = Site;
        impl tracing::callsite::Callsite for Site {
            fn set_interest(&self, _: tracing::subscriber::Interest) {}
            fn metadata(&self) -> &Metadata<'_> {
                unreachable!("not asked in this test")
            }
        }
        let budget = LogBudget::default();
        let now = Instant::now();
        let id = || Identifier(&SITE);
        for _ in 0..LINES_PER_WINDOW {
            assert!(budget.admit(id(), now));
        }
        assert!(!budget.admit(id(), now));
        assert!(!budget.admit(id(), now + WINDOW / 2));
        assert!(budget.admit(id(), now + WINDOW), "a new window");
    }
}
