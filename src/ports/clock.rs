//! `Clock`: the one source of "now", passed in so tests control time.

use chrono::{DateTime, Utc};

/// Tells the time.
pub trait Clock: Send + Sync {
    /// Now, to the microsecond (what both stores keep).
    fn now(&self) -> DateTime<Utc>;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        let now = Utc::now();
        DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now)
    }
}
