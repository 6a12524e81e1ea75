//! PostgresStore: Workers and their leases, every one judged by the
//! database's `now()`.

use super::*;

/// A duration as whole microseconds, for `$n * interval '1 microsecond'`.
fn micros(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

impl WorkerStore for PostgresStore {
    fn store_now(&self) -> BoxFuture<'_, Result<DateTime<Utc>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::System).await?;
            let now = sqlx::query_scalar("SELECT now()")
                .fetch_one(tx.statements())
                .await
                .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            Ok(now)
        })
    }

    fn register_worker<'a>(
        &'a self,
        registration: &'a WorkerRegistration,
    ) -> BoxFuture<'a, Result<Registration, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::System).await?;
            // Registrations of one node are serialized, so two copies of a
            // node folder starting together cannot both see it free.
            sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 7))")
                .bind(&registration.node)
                .execute(tx.statements())
                .await
                .map_err(database_error)?;
            let holders = sqlx::query(
                "SELECT worker_id, host, lease_expires_at, lease_expires_at > now() AS live \
                 FROM workers WHERE node = $1 AND released_at IS NULL",
            )
            .bind(&registration.node)
            .fetch_all(tx.statements())
            .await
            .map_err(database_error)?;
            // The folder was copied or moved when the node's newest worker,
            // live or not, was registered from another place.
            let newest: Option<String> = sqlx::query_scalar(
                "SELECT host FROM workers WHERE node = $1 ORDER BY started_at DESC LIMIT 1",
            )
            .bind(&registration.node)
            .fetch_optional(tx.statements())
            .await
            .map_err(database_error)?;
            let moved = newest.is_some_and(|host| host != registration.host);
            for holder in &holders {
                let host: String = get(holder, "host")?;
                if host == registration.host {
                    continue;
                }
                if get::<bool>(holder, "live")? {
                    drop(tx);
                    return Ok(Registration::HeldElsewhere {
                        worker_id: get(holder, "worker_id")?,
                        lease_expires_at: get(holder, "lease_expires_at")?,
                    });
                }
            }
            let released = sqlx::query(
                "UPDATE workers SET released_at = now(), lease_expires_at = LEAST(lease_expires_at, now()) \
                 WHERE node = $1 AND released_at IS NULL",
            )
            .bind(&registration.node)
            .execute(tx.statements())
            .await
            .map_err(database_error)?
            .rows_affected();
            sqlx::query(
                "INSERT INTO workers (worker_id, node, host, started_at, heartbeat_at, lease_expires_at) \
                 VALUES ($1, $2, $3, now(), now(), now() + $4 * interval '1 microsecond')",
            )
            .bind(registration.worker_id)
            .bind(&registration.node)
            .bind(&registration.host)
            .bind(micros(registration.lease))
            .execute(tx.statements())
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            Ok(Registration::Registered { released, moved })
        })
    }

    fn heartbeat(
        &self,
        worker_id: Uuid,
        lease: std::time::Duration,
    ) -> BoxFuture<'_, Result<Renewal, StoreError>> {
        Box::pin(async move {
            let mut connection = self.lease.lease().await?;
            let result = sqlx::query_scalar(
                "UPDATE workers SET heartbeat_at = now(), lease_expires_at = now() + $2 * interval '1 microsecond' \
                 WHERE worker_id = $1 AND released_at IS NULL AND lease_expires_at > now() \
                 RETURNING now()",
            )
            .bind(worker_id)
            .bind(micros(lease))
            .fetch_optional(connection.statements()?)
            .await;
            Ok(match connection.settle(result)? {
                Some(store_now) => Renewal::Renewed { store_now },
                None => Renewal::Lost,
            })
        })
    }

    fn release_worker(&self, worker_id: Uuid) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::System).await?;
            sqlx::query(
                "UPDATE workers SET released_at = now(), lease_expires_at = LEAST(lease_expires_at, now()) \
                 WHERE worker_id = $1 AND released_at IS NULL",
            )
            .bind(worker_id)
            .execute(tx.statements())
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)
        })
    }

    fn worker(&self, worker_id: Uuid) -> BoxFuture<'_, Result<Option<WorkerLease>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::System).await?;
            let row = sqlx::query(
                "SELECT worker_id, node, host, started_at, lease_expires_at, released_at \
                 FROM workers WHERE worker_id = $1",
            )
            .bind(worker_id)
            .fetch_optional(tx.statements())
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            row.map(|row| {
                Ok(WorkerLease {
                    worker_id: get(&row, "worker_id")?,
                    node: get(&row, "node")?,
                    host: get(&row, "host")?,
                    started_at: get(&row, "started_at")?,
                    lease_expires_at: get(&row, "lease_expires_at")?,
                    released_at: get(&row, "released_at")?,
                })
            })
            .transpose()
        })
    }
}
