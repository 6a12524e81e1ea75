//! The flushed commits' one writer: a thread of its own holding a
//! connection with `synchronous = FULL`, which commits whatever is queued
//! when it comes round as one transaction, each write in a savepoint of its
//! own. Every write in the group is on disk after one fsync; a write that
//! fails is rolled back to its savepoint alone. Throughput of writes that
//! must be durable grows with concurrency instead of queueing on the disk.
//! The log's checkpoints run here too, between groups: a checkpoint copies
//! pages and fsyncs twice, work no calling task should wait on (but for the
//! one that starts a log past its bound over, which must hold the relaxed
//! commits off).

use std::sync::mpsc;
use std::thread::JoinHandle;

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::db::run;
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

/// What the writer thread is asked to do.
enum Message {
    /// A write for the next group.
    Write(Box<dyn Job>),
    /// Copy what the log holds into the database, without waiting on
    /// readers or writers (`PASSIVE`).
    Checkpoint,
}

/// The writer thread and the queue to it. Dropping it lets the thread
/// finish what is queued and waits for it, so its connection is closed
/// when this returns.
pub(super) struct GroupWriter {
    queue: Option<mpsc::Sender<Message>>,
    thread: Option<JoinHandle<()>>,
}

impl GroupWriter {
    /// Starts the thread over `connection`.
    pub(super) fn start(connection: Connection) -> Result<GroupWriter, StoreError> {
        let (queue, jobs) = mpsc::channel::<Message>();
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
            .send(Message::Write(job))
            .map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }

    /// Asks for a checkpoint after the groups queued before it; does not
    /// wait for it.
    pub(super) fn checkpoint(&self) {
        if let Some(queue) = &self.queue {
            let _ = queue.send(Message::Checkpoint);
        }
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

fn write_groups(connection: &Connection, messages: &mpsc::Receiver<Message>) {
    while let Ok(message) = messages.recv() {
        let Message::Write(first) = message else {
            checkpoint(connection);
            continue;
        };
        let mut group = vec![first];
        let mut checkpoint_after = false;
        while group.len() < MAXIMUM_GROUP {
            match messages.try_recv() {
                Ok(Message::Write(job)) => group.push(job),
                Ok(Message::Checkpoint) => checkpoint_after = true,
                Err(_) => break,
            }
        }
        let committed = commit_group(connection, &mut group);
        for job in group {
            job.finish(committed.as_ref().map(|_| ()).map_err(again));
        }
        if checkpoint_after {
            checkpoint(connection);
        }
    }
}

/// A passive checkpoint: what it cannot copy now (a reader still needs it)
/// the next one copies, so its failure is only logged.
fn checkpoint(connection: &Connection) {
    if let Err(error) = connection.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
        tracing::debug!(error = %error, "a checkpoint of the store's log did not run");
    }
}

/// One transaction for the whole group, a savepoint per write.
fn commit_group(connection: &Connection, group: &mut [Box<dyn Job>]) -> Result<(), StoreError> {
    if !connection.is_autocommit() {
        let _ = connection.execute_batch("ROLLBACK");
    }
    run(connection, "BEGIN IMMEDIATE")?;
    let ran = (|| {
        for job in group.iter_mut() {
            run(connection, "SAVEPOINT write")?;
            if !job.run(connection) {
                run(connection, "ROLLBACK TO write")?;
            }
            run(connection, "RELEASE write")?;
        }
        run(connection, "COMMIT")
    })();
    if ran.is_err() {
        let _ = connection.execute_batch("ROLLBACK");
    }
    ran
}
