//! Real crashes. A `crash_harness` process runs one call and aborts at
//! a failpoint; a fresh process runs recovery; a third replays the call.
//! The rows and the effects counted from outside must match the recovery
//! table, for every idempotency class and every point of the pipeline.

use std::path::Path;
use std::process::{Command, Stdio};

use chrono::Utc;
use serde_json::{Value, json};
use toolgate::domain::{ApprovalStatus, InvocationStatus, ReasonCode};
use toolgate::pipeline::Point;
use toolgate::ports::{InvocationStore as _, Schema, Store};
use uuid::Uuid;

use crate::store::PgSchema;

const TENANT: &str = "tenant-crash";

struct Job<'a> {
    store_url: &'a str,
    folder: &'a Path,
    mode: &'a str,
    failpoint: Option<Point>,
    policy: &'a str,
    tool: &'a str,
    arguments: &'a Value,
    ids: (Uuid, Uuid, &'a str),
    /// The node the harness process is: a process after a crash of the
    /// same node is its restart, which releases the crashed one's lease.
    node: &'a str,
}

/// The harness binary, built by `cargo test` as an example.
fn harness() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let path = exe
        .parent()
        .and_then(std::path::Path::parent)
        .expect("target folder")
        .join("examples/crash_harness");
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test`",
        path.display()
    );
    path
}

/// Runs a harness process; returns whether it exited normally and its output.
fn run(job: &Job<'_>) -> (bool, Value) {
    let body = json!({
        "store_url": job.store_url,
        "effects": job.folder.join("effects"),
        "artifacts": job.folder.join("artifacts"),
        "mode": job.mode,
        "failpoint": job.failpoint.map(Point::as_str),
        "node": job.node,
        "policy": job.policy,
        "request": {
            "tenant_id": TENANT,
            "session_id": job.ids.0,
            "run_id": job.ids.1,
            "call_id": job.ids.2,
            "tool": job.tool,
            "arguments": job.arguments,
        },
    });
    let mut child = Command::new(harness())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the harness starts");
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(body.to_string().as_bytes())
            .expect("the job is written");
    }
    let output = child.wait_with_output().expect("the harness ends");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let value = serde_json::from_str(stdout.trim()).unwrap_or(Value::Null);
    if output.status.success() {
        (true, value)
    } else {
        // Aborted at the failpoint (SIGABRT), never a clean failure, nor an
        // abort anywhere else.
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(
            output.status.signal(),
            Some(6),
            "the harness failed rather than crashed: {stderr}"
        );
        let at = job.failpoint.map_or("no failpoint", Point::as_str);
        assert!(
            stderr.contains(&format!("crash_harness: aborted at {at}\n")),
            "the harness aborted elsewhere than at {at}: {stderr}"
        );
        (false, value)
    }
}

/// Effects a tool left, counted from its files.
fn effects(tool: &str, folder: &Path) -> usize {
    let effects = folder.join("effects");
    let lines = |file: &str| {
        std::fs::read_to_string(effects.join(file))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    match tool {
        "demo.external_write" => lines("external.log"),
        "demo.keyed_write" => lines("keyed.log"),
        "demo.set_value" => usize::from(effects.join("values/k").exists()),
        _ => 0,
    }
}

/// The routes a call takes through the pipeline, each reaching its own points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Policy allows the call: its intent and its claim are one commit.
    Allowed,
    /// Policy asks a human, and the crashing call is the first: its row
    /// and its approval would be one commit.
    Requested,
    /// The call's row waits for an approval still pending when the same
    /// call, asked again, crashes.
    Waiting,
    /// The approval was given, and the same call asked again resumes it:
    /// the row authorized, then claimed, two commits the fused path never
    /// has between them.
    Resumed,
}

impl Route {
    const ALL: [Route; 4] = [
        Route::Allowed,
        Route::Requested,
        Route::Waiting,
        Route::Resumed,
    ];

    /// The policy its calls and their recovery run under.
    fn policy(self) -> &'static str {
        match self {
            Route::Allowed => "allow",
            Route::Requested | Route::Waiting | Route::Resumed => "built_in",
        }
    }

    /// Its tools: every idempotency class where nothing waits; where a
    /// human is asked, the two the built-in matrix holds for approval.
    fn tools(self) -> &'static [&'static str] {
        match self {
            Route::Allowed => &[
                "demo.echo",
                "demo.set_value",
                "demo.keyed_write",
                "demo.external_write",
            ],
            Route::Requested | Route::Waiting | Route::Resumed => {
                &["demo.keyed_write", "demo.external_write"]
            }
        }
    }

    /// Whether a call on this path reaches `point`: exactly where the
    /// harness must crash.
    fn reaches(self, point: Point) -> bool {
        let authority = matches!(
            point,
            Point::Resolve
                | Point::Enabled
                | Point::Scopes
                | Point::Validate
                | Point::Normalize
                | Point::Policy
        );
        match self {
            // Nobody is asked.
            Route::Allowed => point != Point::Approval,
            // The call ends pending at step 7.
            Route::Requested | Route::Waiting => authority || point == Point::Approval,
            // The intent exists: step 8 finds it and resumes it.
            Route::Resumed => point != Point::PersistIntent,
        }
    }
}

fn arguments(tool: &str) -> Value {
    match tool {
        "demo.echo" => json!({"text": "hello"}),
        "demo.set_value" => json!({"key": "k", "value": "v"}),
        "demo.keyed_write" => json!({"line": "keyed"}),
        _ => json!({"line": "once"}),
    }
}

/// What the table says a crash at `point` on `path` leaves after recovery:
/// the row's status, and the effects.
fn expected(path: Route, tool: &str, point: Point) -> (Option<InvocationStatus>, usize) {
    let effectful = tool != "demo.echo";
    let one = usize::from(effectful);
    let non_idempotent = tool == "demo.external_write";
    match (path, point) {
        // Nothing was written: the waiting row and its approval commit
        // together after step 7.
        (Route::Requested, _) => (None, 0),
        // A waiting row is nobody's to recover: it waits on, its approval
        // as it was.
        (Route::Waiting, _) => (Some(InvocationStatus::WaitingForApproval), 0),
        (
            Route::Resumed,
            Point::Resolve
            | Point::Enabled
            | Point::Scopes
            | Point::Validate
            | Point::Normalize
            | Point::Policy
            | Point::Approval,
        ) => (Some(InvocationStatus::WaitingForApproval), 0),
        // Nothing before step 8 touched the world or the database.
        (
            _,
            Point::Resolve
            | Point::Enabled
            | Point::Scopes
            | Point::Validate
            | Point::Normalize
            | Point::Policy
            | Point::Approval
            | Point::PersistIntent,
        ) => (None, 0),
        // Intent persisted, authorized or claimed, nothing sent: executed
        // once by recovery.
        (_, Point::Claim | Point::Execute) => (Some(InvocationStatus::Succeeded), one),
        // The watermark is set but the tool never started.
        (_, Point::WatermarkCommitted) if non_idempotent => (Some(InvocationStatus::Uncertain), 0),
        (_, Point::WatermarkCommitted) => (Some(InvocationStatus::Succeeded), one),
        // The effect happened; only the non-idempotent one cannot be repeated.
        (_, Point::ValidateResult | Point::Artifactize | Point::PersistResult)
            if non_idempotent =>
        {
            (Some(InvocationStatus::Uncertain), 1)
        }
        (_, Point::ValidateResult | Point::Artifactize | Point::PersistResult) => {
            (Some(InvocationStatus::Succeeded), one)
        }
        // The result committed; only its acknowledgement was lost.
        (_, Point::Render) => (Some(InvocationStatus::Succeeded), one),
    }
}

/// Approves a pending approval, as a human would through the API.
async fn approve(store: &dyn Store, approval_id: &Value) {
    let id: Uuid = approval_id
        .as_str()
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("an approval id: {approval_id}"));
    let decided = store
        .decide_approval(TENANT, id, ApprovalStatus::Approved, "reviewer", Utc::now())
        .await
        .unwrap();
    assert!(decided.is_some(), "the approval was pending");
}

/// The call asked again until it has an end: a call waiting for its
/// approval is approved and asked once more.
async fn answered(job: &Job<'_>, store: &dyn Store, case: &str) -> Value {
    for _ in 0..3 {
        let (ok, answer) = run(job);
        assert!(ok, "{case}: replay");
        match answer.get("pending") {
            Some(pending) => approve(store, &pending["approval_id"]).await,
            None => return answer,
        }
    }
    panic!("{case}: still waiting after its approval")
}

/// Cases that crash: the four classes at every point but step 7 where
/// policy allows; the two held for approval at steps 1 to 7 when asked
/// first and when waiting, and at every point but step 8 when resumed.
const CRASHES: usize = 4 * 14 + 2 * 7 + 2 * 7 + 2 * 14;

async fn crash_matrix(name: &str, store_url: &str, store: &dyn Store) {
    // Crashes counted per point: the matrix is not vacuous when every
    // point crashed somewhere, and as many cases crashed as the table says.
    let mut crashes = [0usize; Point::ALL.len()];
    for path in Route::ALL {
        for tool in path.tools() {
            let arguments = arguments(tool);
            for (index, point) in Point::ALL.into_iter().enumerate() {
                let folder = tempfile::tempdir().unwrap();
                let (session, run_id, call) = (
                    Uuid::new_v4(),
                    Uuid::new_v4(),
                    format!("call-{}", point.as_str()),
                );
                let node = Uuid::new_v4().to_string();
                let job = |mode, failpoint| Job {
                    store_url,
                    folder: folder.path(),
                    mode,
                    failpoint,
                    policy: path.policy(),
                    tool,
                    arguments: &arguments,
                    ids: (session, run_id, &call),
                    node: &node,
                };
                let case = format!("{name} {path:?} {tool} crash at {}", point.as_str());
                // A row waiting for its approval, given or not, before the
                // same call is asked again.
                let approval = match path {
                    Route::Allowed | Route::Requested => None,
                    Route::Waiting | Route::Resumed => {
                        let (ok, first) = run(&job("call", None));
                        assert!(ok, "{case}: the first call");
                        let approval = first["pending"]["approval_id"].clone();
                        if path == Route::Resumed {
                            approve(store, &approval).await;
                        }
                        Some(approval)
                    }
                };
                let (completed, _) = run(&job("call", Some(point)));
                assert_eq!(
                    !completed,
                    path.reaches(point),
                    "{case}: crashed where the table says it does"
                );
                if completed {
                    continue;
                }
                crashes[index] += 1;
                let (recovered, _) = run(&job("recover", None));
                assert!(recovered, "{case}: recovery");

                let rows = store.run_invocations(TENANT, run_id).await.unwrap();
                let (status, count) = expected(path, tool, point);
                assert_eq!(rows.first().map(|r| r.status()), status, "{case}: row");
                assert_eq!(effects(tool, folder.path()), count, "{case}: effects");
                assert!(rows.len() <= 1, "{case}: one row per call");
                if status == Some(InvocationStatus::Uncertain) {
                    assert_eq!(
                        rows[0].reason_code,
                        Some(ReasonCode::ToolOutcomeUnknown),
                        "{case}"
                    );
                }
                if let Some(approval) =
                    approval.filter(|_| status.is_some_and(|s| !s.is_terminal()))
                {
                    // Still the approval the human saw, as the human left it.
                    let id = approval.as_str().unwrap().parse().unwrap();
                    let record = store.approval(TENANT, id).await.unwrap().unwrap();
                    let left = match path {
                        Route::Resumed => ApprovalStatus::Approved,
                        _ => ApprovalStatus::Pending,
                    };
                    assert_eq!(record.status, left, "{case}: the approval");
                }

                // A replay never repeats a recorded effect; a call that left
                // no row, or a row still waiting, runs now, once.
                let replay = answered(&job("call", None), store, &case).await;
                let after = effects(tool, folder.path());
                let recorded = store.run_invocations(TENANT, run_id).await.unwrap();
                assert_eq!(recorded.len(), 1, "{case}: one row per call");
                match status {
                    None | Some(InvocationStatus::WaitingForApproval) => {
                        assert_eq!(after, usize::from(*tool != "demo.echo"), "{case}: ran once");
                        assert_eq!(
                            recorded[0].status(),
                            InvocationStatus::Succeeded,
                            "{case}: replayed"
                        );
                    }
                    Some(status) => {
                        assert_eq!(after, count, "{case}: replay repeated an effect");
                        assert_eq!(
                            recorded[0].status(),
                            status,
                            "{case}: replay changed the row"
                        );
                    }
                }
                assert_eq!(
                    replay["invocation_id"],
                    json!(recorded[0].identity.id),
                    "{case}: replay found the row"
                );
            }
        }
    }
    for (point, crashed) in Point::ALL.iter().zip(crashes) {
        assert!(crashed > 0, "{name}: no case crashed at {}", point.as_str());
    }
    assert_eq!(crashes.iter().sum::<usize>(), CRASHES, "{name}: crashes");
}

/// Gate 7: a recorded crash at each of the fourteen pipeline steps (and the
/// watermark inside step 10) recovers to the state the table specifies, on
/// every path a call takes: allowed, held for approval (asked first, still
/// waiting, resumed once approved). Each case crashes exactly where the
/// table says its call passes, and the crashes are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gate_07_a_crash_at_every_step_recovers_as_the_table_says() {
    let folder = tempfile::tempdir().unwrap();
    let sqlite_url = format!("sqlite://{}", folder.path().join("crash.db").display());
    let sqlite = toolgate::adapters::store::SqliteStore::connect(&sqlite_url)
        .await
        .unwrap();
    sqlite.migrate().await.unwrap();
    let postgres = PgSchema::create().await;
    let sqlite_run = crash_matrix("sqlite", &sqlite_url, &sqlite);
    match &postgres {
        Some(schema) => {
            let store = toolgate::adapters::store::PostgresStore::connect(&schema.url)
                .await
                .unwrap();
            store.migrate().await.unwrap();
            let postgres_run = crash_matrix("postgres", &schema.url, &store);
            tokio::join!(sqlite_run, postgres_run);
        }
        None => {
            eprintln!("DATABASE_URL unset: the PostgreSQL crash matrix is skipped");
            sqlite_run.await;
        }
    }
}

/// Gate 8 across processes: two sidecars on one PostgreSQL database submit
/// the same call at once; it executes once.
#[tokio::test]
async fn gate_08_two_processes_on_one_database_execute_once() {
    let Some(schema) = PgSchema::create().await else {
        eprintln!("DATABASE_URL unset: the two-process gate runs on PostgreSQL only");
        return;
    };
    let store = toolgate::adapters::store::PostgresStore::connect(&schema.url)
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let folder = tempfile::tempdir().unwrap();
    let arguments = json!({"line": "raced"});
    for round in 0..5 {
        let (session, run_id, call) = (Uuid::new_v4(), Uuid::new_v4(), format!("call-{round}"));
        let (node_a, node_b) = (Uuid::new_v4().to_string(), Uuid::new_v4().to_string());
        let job = |node| Job {
            store_url: &schema.url,
            folder: folder.path(),
            mode: "call",
            failpoint: None,
            policy: "allow",
            tool: "demo.external_write",
            arguments: &arguments,
            ids: (session, run_id, &call),
            // Two nodes, each with a live lease: neither is taken for dead.
            node,
        };
        let (job_a, job_b) = (job(&node_a), job(&node_b));
        let (a, b) = std::thread::scope(|scope| {
            let a = scope.spawn(|| run(&job_a));
            let b = scope.spawn(|| run(&job_b));
            (a.join().unwrap(), b.join().unwrap())
        });
        let statuses: Vec<&str> = [&a.1, &b.1]
            .iter()
            .map(|v| v["outcome"]["status"].as_str().unwrap_or(""))
            .collect();
        for (value, status) in [&a.1, &b.1].iter().zip(&statuses) {
            assert!(
                *status == "succeeded"
                    || value["outcome"]["reason_code"] == "tool.concurrency_conflict",
                "round {round}: {value}"
            );
        }
        assert!(statuses.contains(&"succeeded"), "round {round}");
        assert_eq!(
            effects("demo.external_write", folder.path()),
            round + 1,
            "round {round}: one execution"
        );
    }
}

/// Proportional durability: a read's commits are relaxed, so a power loss
/// may take the newest of them. Simulated on a real SQLite file by putting
/// the database back as it was before the lost commits (what the disk
/// holds after such a loss): a read whose result commit was lost, and one
/// whose every commit was lost, are each executed again when replayed,
/// never answered from a record that does not exist.
#[tokio::test]
async fn a_read_whose_commits_were_lost_runs_again() {
    let folder = tempfile::tempdir().unwrap();
    let database = folder.path().join("lost.db");
    let url = format!("sqlite://{}", database.display());
    let store = toolgate::adapters::store::SqliteStore::connect(&url)
        .await
        .unwrap();
    store.migrate().await.unwrap();
    store.close().await;
    let files = |into: &Path| {
        std::fs::create_dir_all(into).unwrap();
        for suffix in ["", "-wal", "-shm"] {
            let name = format!("lost.db{suffix}");
            let _ = std::fs::remove_file(into.join(&name));
            if let Ok(bytes) = std::fs::read(folder.path().join(&name)) {
                std::fs::write(into.join(&name), bytes).unwrap();
            }
        }
    };
    let restore = |from: &Path| {
        for suffix in ["", "-wal", "-shm"] {
            let name = format!("lost.db{suffix}");
            let _ = std::fs::remove_file(folder.path().join(&name));
            if let Ok(bytes) = std::fs::read(from.join(&name)) {
                std::fs::write(folder.path().join(&name), bytes).unwrap();
            }
        }
    };
    let arguments = json!({"text": "hello"});
    let rows = |run_id: Uuid| {
        let url = url.clone();
        async move {
            let store = toolgate::adapters::store::SqliteStore::connect(&url)
                .await
                .unwrap();
            let rows = store.run_invocations(TENANT, run_id).await.unwrap();
            // Closed before the files are replaced under it.
            store.close().await;
            rows
        }
    };

    // 1. Intent and claim kept, the result lost: the row is RUNNING again.
    let (session, run_id) = (Uuid::new_v4(), Uuid::new_v4());
    let node = Uuid::new_v4().to_string();
    let job = |mode, failpoint| Job {
        store_url: &url,
        folder: folder.path(),
        mode,
        failpoint,
        policy: "allow",
        tool: "demo.echo",
        arguments: &arguments,
        ids: (session, run_id, "lost-result"),
        node: &node,
    };
    let (completed, _) = run(&job("call", Some(Point::Execute)));
    assert!(!completed, "the harness stops after the claim");
    let claimed = folder.path().join("claimed");
    files(&claimed);
    let (ok, first) = run(&job("call", None));
    assert!(ok);
    assert_eq!(first["outcome"]["status"], "succeeded", "{first}");
    let kept = rows(run_id).await;
    assert_eq!(kept[0].status(), InvocationStatus::Succeeded);
    assert_eq!(kept[0].attempt_number, 2);
    restore(&claimed);
    let before = rows(run_id).await;
    assert_eq!(
        before[0].status(),
        InvocationStatus::Running,
        "the result is gone"
    );
    let (ok, replay) = run(&job("call", None));
    assert!(ok);
    assert_eq!(replay["outcome"]["status"], "succeeded", "{replay}");
    assert_eq!(replay["invocation_id"], json!(before[0].identity.id));
    let after = rows(run_id).await;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].status(), InvocationStatus::Succeeded);
    // Executed again (a second attempt on the restored row), not answered.
    assert_eq!(after[0].attempt_number, 2, "{after:?}");
    assert!(
        after[0]
            .ended()
            .and_then(|ended| ended.result.as_ref())
            .is_some()
    );

    // 2. Every commit of the call lost: no row, so the replay runs it anew.
    let (session, run_id) = (Uuid::new_v4(), Uuid::new_v4());
    let job = |mode| Job {
        store_url: &url,
        folder: folder.path(),
        mode,
        failpoint: None,
        policy: "allow",
        tool: "demo.echo",
        arguments: &arguments,
        ids: (session, run_id, "lost-everything"),
        node: &node,
    };
    let empty = folder.path().join("empty");
    files(&empty);
    let (ok, first) = run(&job("call"));
    assert!(ok);
    let first_id = first["invocation_id"].clone();
    assert_eq!(rows(run_id).await.len(), 1);
    restore(&empty);
    assert!(rows(run_id).await.is_empty(), "the row is gone");
    let (ok, replay) = run(&job("call"));
    assert!(ok);
    assert_eq!(replay["outcome"]["status"], "succeeded", "{replay}");
    let after = rows(run_id).await;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].status(), InvocationStatus::Succeeded);
    assert_eq!(after[0].attempt_number, 1);
    assert_eq!(replay["invocation_id"], json!(after[0].identity.id));
    assert_ne!(replay["invocation_id"], first_id, "a new row, run anew");
}
