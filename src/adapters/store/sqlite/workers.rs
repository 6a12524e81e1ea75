//! SqliteStore: Workers and their leases.

use super::*;

impl WorkerStore for SqliteStore {
    fn register_worker<'a>(
        &'a self,
        lease: &'a WorkerLease,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            sqlx::query(
                "INSERT INTO workers (worker_id, node, started_at, heartbeat_at, lease_expires_at) \
                 VALUES ($1, $2, $3, $3, $4)",
            )
            .bind(lease.worker_id.to_string())
            .bind(&lease.node)
            .bind(micros(lease.started_at))
            .bind(micros(lease.lease_expires_at))
            .execute(&mut *self.writer.acquire().await?)
            .await
            .map_err(database_error)?;
            Ok(())
        })
    }

    fn heartbeat(
        &self,
        worker_id: Uuid,
        lease_expires_at: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        Box::pin(async move {
            let result = sqlx::query(
                "UPDATE workers SET heartbeat_at = $3, lease_expires_at = $2 \
                 WHERE worker_id = $1 AND released_at IS NULL",
            )
            .bind(worker_id.to_string())
            .bind(micros(lease_expires_at))
            .bind(micros(Utc::now()))
            .execute(&mut *self.writer.acquire().await?)
            .await
            .map_err(database_error)?;
            Ok(result.rows_affected() == 1)
        })
    }

    fn release_worker(
        &self,
        worker_id: Uuid,
        now: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            sqlx::query(
                "UPDATE workers SET released_at = $2, lease_expires_at = $2 WHERE worker_id = $1",
            )
            .bind(worker_id.to_string())
            .bind(micros(now))
            .execute(&mut *self.writer.acquire().await?)
            .await
            .map_err(database_error)?;
            Ok(())
        })
    }

    fn worker(&self, worker_id: Uuid) -> BoxFuture<'_, Result<Option<WorkerLease>, StoreError>> {
        Box::pin(async move {
            let row = sqlx::query(
                "SELECT worker_id, node, started_at, lease_expires_at FROM workers WHERE worker_id = $1",
            )
            .bind(worker_id.to_string())
            .fetch_optional(&mut *self.reader().await?)
            .await
            .map_err(database_error)?;
            row.map(|row| {
                Ok(WorkerLease {
                    worker_id: uuid(&row, "worker_id")?,
                    node: get(&row, "node")?,
                    started_at: time(&row, "started_at")?,
                    lease_expires_at: time(&row, "lease_expires_at")?,
                })
            })
            .transpose()
        })
    }

    fn release_node_workers<'a>(
        &'a self,
        node: &'a str,
        except: Uuid,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let released = sqlx::query(
                "UPDATE workers SET released_at = $3, lease_expires_at = $3 \
                 WHERE node = $1 AND worker_id <> $2 AND released_at IS NULL",
            )
            .bind(node)
            .bind(except.to_string())
            .bind(micros(now))
            .execute(&mut *self.writer.acquire().await?)
            .await
            .map_err(database_error)?;
            Ok(released.rows_affected())
        })
    }
}
