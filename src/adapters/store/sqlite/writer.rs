//! The flushed commits' one writer: a thread of its own holding a
//! connection with `synchronous = FULL`, which commits whatever is queued
//! when it comes round as one transaction, each write in a savepoint of its
//! own. Every write in the group is on disk after one fsync; a write that
//! fails is rolled back to its savepoint alone. Throughput of writes that
//! must be durable grows with concurrency instead of queueing on the disk.

use std::sync::mpsc;
use std::thread::JoinHandle;

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::db::sqlite_error;
use crate::ports::StoreError;

/// Writes committed together at most: a group is bounded, so one commit's
/// latency is too.
const MAXIMUM_GROUP: usize = 256;

/// One write, run inside the group's transaction.
trait Job: Send {
    /// Runs the write on the writer's connection: whether it succeeded.
    fn run(&mut self, connection: &Connection) -> bool;
    /// Answers the caller once the group's commit is known.
    fn finish(self: Box<Self>, committed: Result<(), StoreError>);
}

struct Submitted<T, F> {
    work: Option<F>,
    result: Option<Result<T, StoreError>>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T, F> Job for Submitted<T, F>
where
    T: Send,
    F: FnOnce(&Connection) -> Result<T, StoreError> + Send,
{
    fn run(&mut self, connection: &Connection) -> bool {
        let result = match self.work.take() {
            // A write that panics fails alone; the thread goes on.
            Some(work) => {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(connection)))
                    .unwrap_or_else(|_| Err(StoreError::Query("a write panicked".into())))
            }
            None => Err(StoreError::Query("a write was run twice".into())),
        };
        let succeeded = result.is_ok();
        self.result = Some(result);
        succeeded
    }

    fn finish(self: Box<Self>, committed: Result<(), StoreError>) {
        let answer = match (self.result, committed) {
            (Some(Err(error)), _) => Err(error),
            (_, Err(error)) => Err(error),
            (Some(Ok(value)), Ok(())) => Ok(value),
            (None, Ok(())) => Err(StoreError::Unavailable(
                "the write was not run before its group ended".into(),
            )),
        };
        let _ = self.reply.send(answer);
    }
}

/// The writer thread and the queue to it. Dropping it lets the thread
/// finish what is queued and waits for it, so its connection is closed
/// when this returns.
pub(super) struct GroupWriter {
    queue: Option<mpsc::Sender<Box<dyn Job>>>,
    thread: Option<JoinHandle<()>>,
}

impl GroupWriter {
    /// Starts the thread over `connection`.
    pub(super) fn start(connection: Connection) -> Result<GroupWriter, StoreError> {
        let (queue, jobs) = mpsc::channel::<Box<dyn Job>>();
        let thread = std::thread::Builder::new()
            .name("toolgate-sqlite-writer".into())
            .spawn(move || write_groups(&connection, &jobs))
            .map_err(|error| StoreError::Unavailable(format!("the writer thread: {error}")))?;
        Ok(GroupWriter {
            queue: Some(queue),
            thread: Some(thread),
        })
    }

    /// Runs `work` in the next group and answers once that group is on
    /// disk (or failed).
    pub(super) async fn write<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job = Box::new(Submitted {
            work: Some(work),
            result: None,
            reply,
        });
        self.queue
            .as_ref()
            .ok_or_else(closed)?
            .send(job)
            .map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }
}

fn closed() -> StoreError {
    StoreError::Unavailable("the store's writer has stopped".into())
}

impl Drop for GroupWriter {
    fn drop(&mut self) {
        self.queue.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The error of a group's commit, for each of its writes.
fn again(error: &StoreError) -> StoreError {
    match error {
        StoreError::Query(message) => StoreError::Query(message.clone()),
        other => StoreError::Unavailable(other.to_string()),
    }
}

fn write_groups(connection: &Connection, jobs: &mpsc::Receiver<Box<dyn Job>>) {
    while let Ok(first) = jobs.recv() {
        let mut group = vec![first];
        while group.len() < MAXIMUM_GROUP {
            match jobs.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        let committed = commit_group(connection, &mut group);
        for job in group {
            job.finish(committed.as_ref().map(|_| ()).map_err(again));
        }
    }
}

/// One transaction for the whole group, a savepoint per write.
fn commit_group(connection: &Connection, group: &mut [Box<dyn Job>]) -> Result<(), StoreError> {
    if !connection.is_autocommit() {
        let _ = connection.execute_batch("ROLLBACK");
    }
    connection
        .execute_batch("BEGIN IMMEDIATE")
        .map_err(sqlite_error)?;
    let ran = (|| {
        for job in group.iter_mut() {
            connection
                .execute_batch("SAVEPOINT write")
                .map_err(sqlite_error)?;
            if !job.run(connection) {
                connection
                    .execute_batch("ROLLBACK TO write")
                    .map_err(sqlite_error)?;
            }
            connection
                .execute_batch("RELEASE write")
                .map_err(sqlite_error)?;
        }
        connection.execute_batch("COMMIT").map_err(sqlite_error)
    })();
    if ran.is_err() {
        let _ = connection.execute_batch("ROLLBACK");
    }
    ran
}
