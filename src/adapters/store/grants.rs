//! `oauth2_user`'s grants and consent flows, written once for both
//! backends as plans a [`Driver`] runs.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};

use super::invocations::{Driver, Moved, Plan, Rendered, Run, Value};
use super::operator::Dialect;
use super::rows::{consent_flow, upstream_grant};
use crate::ports::{BoxFuture, ConsentFlow, GrantStore, StoreError, UpstreamGrant};

// The expired flows go, and the principal's oldest outstanding past the
// newest `$4`, before one more is kept.
static PRUNE_FLOWS: LazyLock<Rendered> = LazyLock::new(|| {
    Rendered::of(|dialect| {
        let all = match dialect {
            Dialect::Postgres => "",
            Dialect::Sqlite => " LIMIT -1",
        };
        format!(
            "DELETE FROM consent_flows WHERE expires_at <= $1 OR state_sha256 IN (\
             SELECT state_sha256 FROM consent_flows WHERE tenant_id = $2 AND principal_id = $3 \
             AND expires_at > $1 ORDER BY started_at DESC{all} OFFSET $4)"
        )
    })
});

const BEGIN_FLOW: &str = "INSERT INTO consent_flows (state_sha256, tenant_id, principal_id, \
     server_id, browser_sha256, sealed_verifier, issuer, iss_required, token_endpoint, resource, \
     scopes, started_at, expires_at, client_document, revocation_endpoint) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)";

const FLOW_COLUMNS: &str = "state_sha256, tenant_id, principal_id, server_id, browser_sha256, \
     sealed_verifier, issuer, iss_required, token_endpoint, resource, scopes, started_at, \
     expires_at, client_document, revocation_endpoint";

// Deleted as it is read: of two callbacks with one state, one gets it.
static TAKE_FLOW: LazyLock<String> = LazyLock::new(|| {
    format!(
        "DELETE FROM consent_flows WHERE state_sha256 = $1 AND expires_at > $2 \
         RETURNING {FLOW_COLUMNS}"
    )
});

static FLOW: LazyLock<String> = LazyLock::new(|| {
    format!("SELECT {FLOW_COLUMNS} FROM consent_flows WHERE state_sha256 = $1 AND expires_at > $2")
});

/// The unexpired flow of a state, by `sql` (taken or only read).
async fn flow_by_state<D: Driver>(
    store: &D,
    run: Run,
    sql: &'static str,
    state_sha256: &str,
    now: DateTime<Utc>,
) -> Result<Option<ConsentFlow>, StoreError> {
    let values = vec![state_sha256.into(), now.into()];
    let plan = Plan::new(None, run, Moved::Rows, sql, values);
    store
        .run(plan)
        .await?
        .rows
        .first()
        .map(consent_flow)
        .transpose()
}

const SAVE_GRANT: &str = "INSERT INTO upstream_grants (tenant_id, principal_id, server_id, \
     issuer, scopes, sealed_tokens, granted_at, last_used_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
     ON CONFLICT (tenant_id, principal_id, server_id) DO UPDATE SET issuer = excluded.issuer, \
     scopes = excluded.scopes, sealed_tokens = excluded.sealed_tokens, \
     granted_at = excluded.granted_at, last_used_at = excluded.last_used_at";

const GRANT_COLUMNS: &str = "tenant_id, principal_id, server_id, issuer, scopes, sealed_tokens, \
     granted_at, last_used_at";

static GRANT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {GRANT_COLUMNS} FROM upstream_grants \
         WHERE tenant_id = $1 AND principal_id = $2 AND server_id = $3"
    )
});

static GRANTS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {GRANT_COLUMNS} FROM upstream_grants WHERE tenant_id = $1 \
         ORDER BY principal_id, server_id LIMIT 1001"
    )
});

const LEASE_REFRESH: &str = "UPDATE upstream_grants SET refresh_lease_until = $5 \
     WHERE tenant_id = $1 AND principal_id = $2 AND server_id = $3 AND sealed_tokens = $4 \
     AND (refresh_lease_until IS NULL OR refresh_lease_until <= $6)";

const REPLACE_TOKENS: &str = "UPDATE upstream_grants SET sealed_tokens = $5, \
     refresh_lease_until = NULL, last_used_at = $6 \
     WHERE tenant_id = $1 AND principal_id = $2 AND server_id = $3 AND sealed_tokens = $4";

// A use's time, written at most once a minute: nothing depends on it but
// the operators' list.
const TOUCH_GRANT: &str = "UPDATE upstream_grants SET last_used_at = $4 \
     WHERE tenant_id = $1 AND principal_id = $2 AND server_id = $3 \
     AND (last_used_at IS NULL OR last_used_at < $5)";

const RELEASE_REFRESH: &str = "UPDATE upstream_grants SET refresh_lease_until = NULL \
     WHERE tenant_id = $1 AND principal_id = $2 AND server_id = $3 AND sealed_tokens = $4";

const END_GRANT: &str = "DELETE FROM upstream_grants \
     WHERE tenant_id = $1 AND principal_id = $2 AND server_id = $3 AND sealed_tokens = $4";

// Returned as it is deleted: its tokens are revoked upstream after.
static REVOKE_GRANT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "DELETE FROM upstream_grants \
         WHERE tenant_id = $1 AND principal_id = $2 AND server_id = $3 RETURNING {GRANT_COLUMNS}"
    )
});

/// The one grant row `plan` reads or deletes, if any.
async fn one_grant<D: Driver>(store: &D, plan: Plan) -> Result<Option<UpstreamGrant>, StoreError> {
    store
        .run(plan)
        .await?
        .rows
        .first()
        .map(upstream_grant)
        .transpose()
}

/// A grant's key and the tokens it was read with.
fn read(grant: &UpstreamGrant) -> Vec<Value> {
    vec![
        grant.tenant_id.as_str().into(),
        grant.principal_id.as_str().into(),
        grant.server_id.as_str().into(),
        grant.sealed_tokens.as_str().into(),
    ]
}

fn scopes(scopes: &[String]) -> Value {
    Some(serde_json::Value::from(scopes.to_vec())).into()
}

impl<D: Driver> GrantStore for D {
    fn begin_consent<'a>(
        &'a self,
        flow: &'a ConsentFlow,
        maximum: usize,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let keep = i64::try_from(maximum.saturating_sub(1)).unwrap_or(i64::MAX);
            let pruned = vec![
                flow.started_at.into(),
                flow.tenant_id.as_str().into(),
                flow.principal_id.as_str().into(),
                keep.into(),
            ];
            let values = vec![
                flow.state_sha256.as_str().into(),
                flow.tenant_id.as_str().into(),
                flow.principal_id.as_str().into(),
                flow.server_id.as_str().into(),
                flow.browser_sha256.as_str().into(),
                flow.sealed_verifier.as_str().into(),
                flow.issuer.as_str().into(),
                flow.iss_required.into(),
                flow.token_endpoint.as_str().into(),
                flow.resource.as_str().into(),
                scopes(&flow.scopes),
                flow.started_at.into(),
                flow.expires_at.into(),
                flow.client_document.as_deref().into(),
                flow.revocation_endpoint.as_deref().into(),
            ];
            let prune = PRUNE_FLOWS.sql(D::DIALECT);
            let mut plan =
                Plan::new(None, Run::Flushed, Moved::Count, prune, pruned).then(BEGIN_FLOW, values);
            plan.always = true;
            self.run(plan).await.map(|_| ())
        })
    }

    fn take_consent<'a>(
        &'a self,
        state_sha256: &'a str,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Option<ConsentFlow>, StoreError>> {
        Box::pin(flow_by_state(
            self,
            Run::Flushed,
            TAKE_FLOW.as_str(),
            state_sha256,
            now,
        ))
    }

    fn consent_flow<'a>(
        &'a self,
        state_sha256: &'a str,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Option<ConsentFlow>, StoreError>> {
        Box::pin(flow_by_state(
            self,
            Run::Read,
            FLOW.as_str(),
            state_sha256,
            now,
        ))
    }

    fn save_grant<'a>(&'a self, grant: &'a UpstreamGrant) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let values = vec![
                grant.tenant_id.as_str().into(),
                grant.principal_id.as_str().into(),
                grant.server_id.as_str().into(),
                grant.issuer.as_str().into(),
                scopes(&grant.scopes),
                grant.sealed_tokens.as_str().into(),
                grant.granted_at.into(),
                grant.last_used_at.into(),
            ];
            let tenant = Some(grant.tenant_id.as_str());
            let plan = Plan::new(tenant, Run::Flushed, Moved::Count, SAVE_GRANT, values);
            self.run(plan).await.map(|_| ())
        })
    }

    fn grant<'a>(
        &'a self,
        tenant_id: &'a str,
        principal_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<UpstreamGrant>, StoreError>> {
        Box::pin(async move {
            let values = vec![tenant_id.into(), principal_id.into(), server_id.into()];
            one_grant(self, Plan::read(tenant_id, GRANT.as_str(), values)).await
        })
    }

    fn grants<'a>(
        &'a self,
        tenant_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<UpstreamGrant>, StoreError>> {
        Box::pin(async move {
            let plan = Plan::read(tenant_id, GRANTS.as_str(), vec![tenant_id.into()]);
            self.run(plan)
                .await?
                .rows
                .iter()
                .map(upstream_grant)
                .collect()
        })
    }

    fn lease_refresh<'a>(
        &'a self,
        grant: &'a UpstreamGrant,
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut values = read(grant);
            values.extend([until.into(), now.into()]);
            let tenant = Some(grant.tenant_id.as_str());
            let plan = Plan::new(tenant, Run::Flushed, Moved::Count, LEASE_REFRESH, values);
            Ok(self.run(plan).await?.count == 1)
        })
    }

    fn replace_tokens<'a>(
        &'a self,
        grant: &'a UpstreamGrant,
        sealed_tokens: &'a str,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut values = read(grant);
            values.extend([sealed_tokens.into(), now.into()]);
            let tenant = Some(grant.tenant_id.as_str());
            let plan = Plan::new(tenant, Run::Flushed, Moved::Count, REPLACE_TOKENS, values);
            Ok(self.run(plan).await?.count == 1)
        })
    }

    fn release_refresh<'a>(
        &'a self,
        grant: &'a UpstreamGrant,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let tenant = Some(grant.tenant_id.as_str());
            let plan = Plan::new(
                tenant,
                Run::Flushed,
                Moved::Count,
                RELEASE_REFRESH,
                read(grant),
            );
            self.run(plan).await.map(|_| ())
        })
    }

    fn end_grant<'a>(
        &'a self,
        grant: &'a UpstreamGrant,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let tenant = Some(grant.tenant_id.as_str());
            let plan = Plan::new(tenant, Run::Flushed, Moved::Count, END_GRANT, read(grant));
            Ok(self.run(plan).await?.count == 1)
        })
    }

    fn touch_grant<'a>(
        &'a self,
        grant: &'a UpstreamGrant,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let values = vec![
                grant.tenant_id.as_str().into(),
                grant.principal_id.as_str().into(),
                grant.server_id.as_str().into(),
                now.into(),
                (now - chrono::Duration::minutes(1)).into(),
            ];
            let tenant = Some(grant.tenant_id.as_str());
            let plan = Plan::new(tenant, Run::Relaxed, Moved::Count, TOUCH_GRANT, values);
            self.run(plan).await.map(|_| ())
        })
    }

    fn revoke_grant<'a>(
        &'a self,
        tenant_id: &'a str,
        principal_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<UpstreamGrant>, StoreError>> {
        Box::pin(async move {
            let values = vec![tenant_id.into(), principal_id.into(), server_id.into()];
            let sql = REVOKE_GRANT.as_str();
            let plan = Plan::new(Some(tenant_id), Run::Flushed, Moved::Rows, sql, values);
            one_grant(self, plan).await
        })
    }
}
