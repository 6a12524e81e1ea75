//! SqliteStore: Workers and their leases. One node: the process's clock is
//! the store's.

use super::*;

fn lease_end(lease: Duration) -> i64 {
    micros(Utc::now()).saturating_add(i64::try_from(lease.as_micros()).unwrap_or(i64::MAX))
}

impl WorkerStore for SqliteStore {
    fn store_now(&self) -> BoxFuture<'_, Result<DateTime<Utc>, StoreError>> {
        Box::pin(async move { Ok(Utc::now()) })
    }

    fn register_worker<'a>(
        &'a self,
        registration: &'a WorkerRegistration,
    ) -> BoxFuture<'a, Result<Registration, StoreError>> {
        Box::pin(async move {
            // The write lock from the first statement: registrations of one
            // node are serialized.
            let mut tx = self.begin().await?;
            let now = micros(Utc::now());
            let holders = sqlx::query(
                "SELECT worker_id, host, lease_expires_at FROM workers \
                 WHERE node = $1 AND released_at IS NULL",
            )
            .bind(&registration.node)
            .fetch_all(&mut *tx)
            .await
            .map_err(database_error)?;
            // The folder was copied or moved when the node's newest worker,
            // live or not, was registered from another place.
            let newest: Option<String> = sqlx::query_scalar(
                "SELECT host FROM workers WHERE node = $1 ORDER BY started_at DESC LIMIT 1",
            )
            .bind(&registration.node)
            .fetch_optional(&mut *tx)
            .await
            .map_err(database_error)?;
            let moved = newest.is_some_and(|host| host != registration.host);
            for holder in &holders {
                let host: String = get(holder, "host")?;
                if host == registration.host {
                    continue;
                }
                let expires: i64 = get(holder, "lease_expires_at")?;
                if expires > now {
                    return Ok(Registration::HeldElsewhere {
                        worker_id: uuid(holder, "worker_id")?,
                        lease_expires_at: time(holder, "lease_expires_at")?,
                    });
                }
            }
            let released = sqlx::query(
                "UPDATE workers SET released_at = $2, lease_expires_at = MIN(lease_expires_at, $2) \
                 WHERE node = $1 AND released_at IS NULL",
            )
            .bind(&registration.node)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(database_error)?
            .rows_affected();
            sqlx::query(
                "INSERT INTO workers (worker_id, node, host, started_at, heartbeat_at, lease_expires_at) \
                 VALUES ($1, $2, $3, $4, $4, $5)",
            )
            .bind(registration.worker_id.to_string())
            .bind(&registration.node)
            .bind(&registration.host)
            .bind(now)
            .bind(lease_end(registration.lease))
            .execute(&mut *tx)
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            Ok(Registration::Registered { released, moved })
        })
    }

    fn heartbeat(
        &self,
        worker_id: Uuid,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Renewal, StoreError>> {
        Box::pin(async move {
            let now = Utc::now();
            let result = sqlx::query(
                "UPDATE workers SET heartbeat_at = $2, lease_expires_at = $3 \
                 WHERE worker_id = $1 AND released_at IS NULL AND lease_expires_at > $2",
            )
            .bind(worker_id.to_string())
            .bind(micros(now))
            .bind(lease_end(lease))
            .execute(&mut *self.writer.acquire().await?)
            .await
            .map_err(database_error)?;
            Ok(if result.rows_affected() == 1 {
                Renewal::Renewed { store_now: now }
            } else {
                Renewal::Lost
            })
        })
    }

    fn release_worker(&self, worker_id: Uuid) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            sqlx::query(
                "UPDATE workers SET released_at = $2, lease_expires_at = MIN(lease_expires_at, $2) \
                 WHERE worker_id = $1 AND released_at IS NULL",
            )
            .bind(worker_id.to_string())
            .bind(micros(Utc::now()))
            .execute(&mut *self.writer.acquire().await?)
            .await
            .map_err(database_error)?;
            Ok(())
        })
    }

    fn worker(&self, worker_id: Uuid) -> BoxFuture<'_, Result<Option<WorkerLease>, StoreError>> {
        Box::pin(async move {
            let row = sqlx::query(
                "SELECT worker_id, node, host, started_at, lease_expires_at, released_at \
                 FROM workers WHERE worker_id = $1",
            )
            .bind(worker_id.to_string())
            .fetch_optional(&mut *self.reader().await?)
            .await
            .map_err(database_error)?;
            row.map(|row| {
                Ok(WorkerLease {
                    worker_id: uuid(&row, "worker_id")?,
                    node: get(&row, "node")?,
                    host: get(&row, "host")?,
                    started_at: time(&row, "started_at")?,
                    lease_expires_at: time(&row, "lease_expires_at")?,
                    released_at: optional_time(&row, "released_at")?,
                })
            })
            .transpose()
        })
    }
}
