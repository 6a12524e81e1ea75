//! SqliteStore: Workers and their leases. One node: the node's clock is
//! the store's.

use super::*;

fn lease_end(now: DateTime<Utc>, lease: Duration) -> i64 {
    micros(now).saturating_add(i64::try_from(lease.as_micros()).unwrap_or(i64::MAX))
}

impl SqliteStore {
    fn now(&self) -> DateTime<Utc> {
        self.inner.clock.now()
    }
}

impl WorkerStore for SqliteStore {
    fn store_now(&self) -> BoxFuture<'_, Result<DateTime<Utc>, StoreError>> {
        Box::pin(async move { Ok(self.now()) })
    }

    fn register_worker<'a>(
        &'a self,
        registration: &'a WorkerRegistration,
    ) -> BoxFuture<'a, Result<Registration, StoreError>> {
        let registration = registration.clone();
        // Read on the caller's task, not the writer's thread: the node's
        // clock is the caller's.
        let at = self.now();
        Box::pin(async move {
            // The write lock from the first statement: registrations of one
            // node are serialized.
            self.flushed(move |connection| {
                let now = micros(at);
                let holders = query(
                    "SELECT worker_id, host, lease_expires_at FROM workers \
                     WHERE node = $1 AND released_at IS NULL",
                )
                .bind(&registration.node)
                .fetch_all(connection)?;
                // The folder was copied or moved when the node's newest
                // worker, live or not, was registered from another place.
                let newest = query(
                    "SELECT host FROM workers WHERE node = $1 ORDER BY started_at DESC LIMIT 1",
                )
                .bind(&registration.node)
                .fetch_optional(connection)?
                .map(|row| get::<String>(&row, "host"))
                .transpose()?;
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
                let released = query(
                    "UPDATE workers SET released_at = $2, lease_expires_at = MIN(lease_expires_at, $2) \
                     WHERE node = $1 AND released_at IS NULL",
                )
                .bind(&registration.node)
                .bind(now)
                .execute(connection)?;
                query(
                    "INSERT INTO workers (worker_id, node, host, started_at, heartbeat_at, lease_expires_at) \
                     VALUES ($1, $2, $3, $4, $4, $5)",
                )
                .bind(registration.worker_id.to_string())
                .bind(&registration.node)
                .bind(&registration.host)
                .bind(now)
                .bind(lease_end(at, registration.lease))
                .execute(connection)?;
                Ok(Registration::Registered {
                    released: u64::try_from(released).unwrap_or(u64::MAX),
                    moved,
                })
            })
            .await
        })
    }

    fn heartbeat(
        &self,
        worker_id: Uuid,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Renewal, StoreError>> {
        Box::pin(async move {
            // A renewal is the process's own view of itself: one node, and a
            // lease lost with the process is released at its restart.
            let now = self.now();
            let renewed = self.relaxed(|connection| {
                query(
                    "UPDATE workers SET heartbeat_at = $2, lease_expires_at = $3 \
                     WHERE worker_id = $1 AND released_at IS NULL AND lease_expires_at > $2",
                )
                .bind(worker_id.to_string())
                .bind(micros(now))
                .bind(lease_end(now, lease))
                .execute(connection)
            })?;
            Ok(if renewed == 1 {
                Renewal::Renewed { store_now: now }
            } else {
                Renewal::Lost
            })
        })
    }

    fn release_worker(&self, worker_id: Uuid) -> BoxFuture<'_, Result<(), StoreError>> {
        let now = self.now();
        Box::pin(async move {
            self.flushed(move |connection| {
                query(
                    "UPDATE workers SET released_at = $2, lease_expires_at = MIN(lease_expires_at, $2) \
                     WHERE worker_id = $1 AND released_at IS NULL",
                )
                .bind(worker_id.to_string())
                .bind(micros(now))
                .execute(connection)
                .map(|_| ())
            })
            .await
        })
    }

    fn worker(&self, worker_id: Uuid) -> BoxFuture<'_, Result<Option<WorkerLease>, StoreError>> {
        Box::pin(async move {
            self.read(|connection| {
                query(
                    "SELECT worker_id, node, host, started_at, lease_expires_at, released_at \
                     FROM workers WHERE worker_id = $1",
                )
                .bind(worker_id.to_string())
                .fetch_optional(connection)?
                .map(|row| {
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
        })
    }
}
