//! Rate limits on calls, per principal, tenant, tool and server, as the
//! operator sets them: token buckets kept by this node (so a limit holds
//! per node). A limited call is refused before anything of it is recorded;
//! it is not a denial, so the breaker never counts it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::time::Instant;

use crate::domain::{RateLimit, TokenBucket, ToolSpec, glob_matches};
use crate::ports::Metrics;

/// Buckets held at once before full ones are forgotten (a full bucket is
/// what a new one would be).
const SWEEP_AT: usize = 16_384;

/// A limit on the calls of every tool matching one of `tools`.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRateLimit {
    /// Globs over registry names.
    pub tools: Vec<String>,
    /// The limit, per tenant and tool.
    pub limit: RateLimit,
}

/// The operator's limits; each `None` is off.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RateLimitSettings {
    /// Per tenant and principal (on the front door, a credential's).
    pub principal: Option<RateLimit>,
    /// Per tenant.
    pub tenant: Option<RateLimit>,
    /// Per tenant and MCP server (an operator's or the tenant's own).
    pub server: Option<RateLimit>,
    /// Per tenant and tool, the first entry whose globs match.
    pub tools: Vec<ToolRateLimit>,
}

impl RateLimitSettings {
    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        self.principal.is_some()
            || self.tenant.is_some()
            || self.server.is_some()
            || !self.tools.is_empty()
    }
}

/// What a bucket is kept for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Scope {
    Principal,
    Tenant,
    Server,
    Tool,
}

impl Scope {
    fn as_str(self) -> &'static str {
        match self {
            Scope::Principal => "principal",
            Scope::Tenant => "tenant",
            Scope::Server => "server",
            Scope::Tool => "tool",
        }
    }
}

/// A limited call: which limit, and the whole seconds before it may pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Limited {
    pub(super) retry_after_seconds: u64,
}

/// A bucket's key: its scope, tenant and subject (principal, server or
/// tool; empty for the tenant's own).
type BucketKey = (Scope, String, String);

/// Each bucket, as it was when last taken from.
type Buckets = HashMap<BucketKey, (TokenBucket, Instant)>;

/// The buckets of this node.
pub(super) struct RateLimits {
    settings: RateLimitSettings,
    metrics: Option<Arc<dyn Metrics>>,
    buckets: Mutex<Buckets>,
}

impl RateLimits {
    pub(super) fn new(settings: RateLimitSettings, metrics: Option<Arc<dyn Metrics>>) -> Self {
        RateLimits {
            settings,
            metrics,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one call of the tool `name` by `principal_id` of `tenant_id`
    /// from every bucket that applies, or from none of them: a call refused
    /// by one limit spends nothing of the others. `spec` is the tool's, when
    /// the name resolves (a name that does not still counts per principal
    /// and tenant).
    pub(super) fn take(
        &self,
        tenant_id: &str,
        principal_id: &str,
        name: &str,
        spec: Option<&ToolSpec>,
    ) -> Result<(), Limited> {
        if !self.settings.any() {
            return Ok(());
        }
        let mut applying: Vec<(Scope, String, &RateLimit)> = Vec::with_capacity(4);
        if let Some(limit) = &self.settings.principal {
            applying.push((Scope::Principal, principal_id.to_owned(), limit));
        }
        if let Some(limit) = &self.settings.tenant {
            applying.push((Scope::Tenant, String::new(), limit));
        }
        let server = spec.and_then(|spec| spec.server_id.as_ref());
        if let (Some(limit), Some(server)) = (&self.settings.server, server) {
            applying.push((Scope::Server, server.clone(), limit));
        }
        // A wire alias is judged as the registry name it stands for.
        let name = spec.map_or(name, |spec| spec.name.as_str());
        if let Some(entry) = self.settings.tools.iter().find(|entry| {
            entry
                .tools
                .iter()
                .any(|pattern| glob_matches(pattern, name))
        }) {
            applying.push((Scope::Tool, name.to_owned(), &entry.limit));
        }
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        let mut refilled = Vec::with_capacity(applying.len());
        let mut wait: Option<(Scope, u64)> = None;
        for (scope, subject, limit) in &applying {
            let key = (*scope, tenant_id.to_owned(), subject.clone());
            let bucket = buckets.get(&key).map_or_else(
                || TokenBucket::full(limit),
                |(bucket, seen)| bucket.refilled(limit, now.duration_since(*seen).as_secs_f64()),
            );
            if !bucket.has_token() {
                let seconds = bucket.retry_after_seconds(limit);
                if wait.is_none_or(|(_, longest)| seconds > longest) {
                    wait = Some((*scope, seconds));
                }
            }
            refilled.push((key, bucket));
        }
        if let Some((scope, retry_after_seconds)) = wait {
            for (key, bucket) in refilled {
                buckets.insert(key, (bucket, now));
            }
            drop(buckets);
            if let Some(metrics) = &self.metrics {
                metrics.increment(
                    "rate_limited_total",
                    vec![("scope", scope.as_str().to_owned())],
                );
            }
            return Err(Limited {
                retry_after_seconds,
            });
        }
        for (key, bucket) in refilled {
            buckets.insert(key, (bucket.taken(), now));
        }
        if buckets.len() > SWEEP_AT {
            self.forget_full(&mut buckets, now);
        }
        Ok(())
    }

    /// Drops the buckets that have refilled: they are what new ones are.
    fn forget_full(&self, buckets: &mut Buckets, now: Instant) {
        let settings = &self.settings;
        buckets.retain(|(scope, _, subject), (bucket, seen)| {
            let limit = match scope {
                Scope::Principal => settings.principal.as_ref(),
                Scope::Tenant => settings.tenant.as_ref(),
                Scope::Server => settings.server.as_ref(),
                Scope::Tool => settings
                    .tools
                    .iter()
                    .find(|entry| {
                        entry
                            .tools
                            .iter()
                            .any(|pattern| glob_matches(pattern, subject))
                    })
                    .map(|entry| &entry.limit),
            };
            limit.is_some_and(|limit| {
                !bucket
                    .refilled(limit, now.duration_since(*seen).as_secs_f64())
                    .is_full(limit)
            })
        });
    }
}
