//! What stands between a tool and the pipeline while it runs: the panic
//! guard around its future, the effect watermark on its context (one short
//! fenced transaction), and the resolver that remembers every credential it
//! handed out so the values can be scrubbed from what the tool returns.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::domain::secret::CredentialRef;
use crate::domain::{Durability, SecretValue, ToolResult};
use crate::ports::{
    BoxFuture, Clock, CredentialError, CredentialResolver, EffectWatermark, Fence, InvocationStore,
    WatermarkError,
};

/// The watermark a tool's context carries: one short fenced transaction.
pub(super) struct StoreWatermark {
    pub(super) store: Arc<dyn InvocationStore>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) tenant_id: String,
    pub(super) id: Uuid,
    pub(super) fence: Fence,
    /// As [`Durability::of_watermark`] says for the call's tool.
    pub(super) durability: Durability,
}

impl EffectWatermark for StoreWatermark {
    fn mark_effect_sent(&self) -> BoxFuture<'_, Result<(), WatermarkError>> {
        Box::pin(async move {
            match self
                .store
                .mark_effect_sent(
                    &self.tenant_id,
                    self.id,
                    self.fence,
                    self.clock.now(),
                    self.durability,
                )
                .await
            {
                Ok(true) => Ok(()),
                Ok(false) => Err(WatermarkError(
                    "this attempt no longer holds the call".into(),
                )),
                Err(error) => Err(WatermarkError(error.to_string())),
            }
        })
    }
}

/// Resolves through the real resolver and remembers every value it handed
/// out, so they can be scrubbed from whatever the tool returns.
pub(super) struct RecordingResolver {
    pub(super) inner: Arc<dyn CredentialResolver>,
    pub(super) resolved: Mutex<Vec<SecretValue>>,
}

impl RecordingResolver {
    pub(super) fn resolved(&self) -> Vec<SecretValue> {
        self.resolved
            .lock()
            .map(|values| values.clone())
            .unwrap_or_default()
    }
}

impl CredentialResolver for RecordingResolver {
    fn resolve<'a>(
        &'a self,
        reference: &'a CredentialRef,
    ) -> BoxFuture<'a, Result<SecretValue, CredentialError>> {
        Box::pin(async move {
            let value = self.inner.resolve(reference).await?;
            if let Ok(mut resolved) = self.resolved.lock() {
                resolved.push(value.clone());
            }
            Ok(value)
        })
    }
}

/// Runs tool code (its `execute`, its destructor) so that a panic in it is
/// `None` rather than an unwinding pipeline.
pub(super) fn contain<T>(run: impl FnOnce() -> T) -> Option<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).ok()
}

/// A tool's future whose panic ends it with `None` instead of unwinding
/// through the pipeline.
pub(super) struct Contained<'a>(pub(super) BoxFuture<'a, ToolResult>);

impl std::future::Future for Contained<'_> {
    type Output = Option<ToolResult>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let running = &mut self.0;
        // A future that panicked is never polled again.
        match contain(|| running.as_mut().poll(cx)) {
            Some(std::task::Poll::Ready(result)) => std::task::Poll::Ready(Some(result)),
            Some(std::task::Poll::Pending) => std::task::Poll::Pending,
            None => std::task::Poll::Ready(None),
        }
    }
}

pub(super) fn system_time(now: DateTime<Utc>, seconds: f64) -> std::time::SystemTime {
    let now: std::time::SystemTime = now.into();
    if seconds.is_finite() {
        now + std::time::Duration::from_secs_f64(seconds.max(0.0))
    } else {
        now + std::time::Duration::from_secs(365 * 24 * 3600)
    }
}
