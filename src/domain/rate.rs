//! Rate limits as token buckets: a limit's rate and burst, and a bucket's
//! arithmetic over elapsed time. Pure; whoever holds buckets supplies the
//! time.

use serde::{Deserialize, Serialize};

/// A limit: `per_second` calls on average, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Calls per second, refilled continuously (more than 0, at most
    /// 1,000,000).
    pub per_second: f64,
    /// Calls that may be taken at once from a full bucket (at least 1).
    pub burst: u32,
}

impl RateLimit {
    /// Why this limit is not one a bucket can keep, if it is not.
    pub fn problem(&self) -> Option<&'static str> {
        if !(self.per_second.is_finite() && self.per_second > 0.0 && self.per_second <= 1e6) {
            Some("per_second must be more than 0 and at most 1000000")
        } else if self.burst == 0 {
            Some("burst must be at least 1")
        } else {
            None
        }
    }
}

/// One bucket: the tokens it held when last seen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenBucket {
    tokens: f64,
}

impl TokenBucket {
    /// A full bucket of `limit`.
    pub fn full(limit: &RateLimit) -> TokenBucket {
        TokenBucket {
            tokens: f64::from(limit.burst),
        }
    }

    /// The bucket `elapsed_seconds` later: refilled, never above the burst.
    pub fn refilled(self, limit: &RateLimit, elapsed_seconds: f64) -> TokenBucket {
        TokenBucket {
            tokens: (self.tokens + elapsed_seconds.max(0.0) * limit.per_second)
                .min(f64::from(limit.burst)),
        }
    }

    /// Whether a call may be taken now.
    pub fn has_token(&self) -> bool {
        self.tokens >= 1.0
    }

    /// The bucket with one call taken (callers check [`has_token`] first).
    ///
    /// [`has_token`]: TokenBucket::has_token
    pub fn taken(self) -> TokenBucket {
        TokenBucket {
            tokens: self.tokens - 1.0,
        }
    }

    /// Whether the bucket is full again (so it may be forgotten).
    pub fn is_full(&self, limit: &RateLimit) -> bool {
        self.tokens >= f64::from(limit.burst)
    }

    /// Whole seconds until a call may be taken (at least 1).
    pub fn retry_after_seconds(&self, limit: &RateLimit) -> u64 {
        let wait = ((1.0 - self.tokens) / limit.per_second).ceil();
        if wait.is_finite() && wait >= 1.0 {
            wait as u64
        } else {
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_takes_its_burst_then_refills_at_its_rate() {
        let limit = RateLimit {
            per_second: 2.0,
            burst: 3,
        };
        let mut bucket = TokenBucket::full(&limit);
        for _ in 0..3 {
            assert!(bucket.has_token());
            bucket = bucket.taken();
        }
        assert!(!bucket.has_token());
        assert_eq!(bucket.retry_after_seconds(&limit), 1);
        bucket = bucket.refilled(&limit, 0.5);
        assert!(bucket.has_token(), "half a second at 2/s is one call");
        bucket = bucket.taken().refilled(&limit, 3600.0);
        assert!(bucket.is_full(&limit), "never above the burst");
        let slow = RateLimit {
            per_second: 0.1,
            burst: 1,
        };
        assert_eq!(
            TokenBucket::full(&slow).taken().retry_after_seconds(&slow),
            10
        );
    }

    #[test]
    fn limits_a_bucket_cannot_keep_are_refused() {
        for (per_second, burst) in [
            (0.0, 1),
            (-1.0, 1),
            (f64::NAN, 1),
            (f64::INFINITY, 1),
            (1.0, 0),
        ] {
            assert!(RateLimit { per_second, burst }.problem().is_some());
        }
        assert!(
            RateLimit {
                per_second: 0.5,
                burst: 1
            }
            .problem()
            .is_none()
        );
    }
}
