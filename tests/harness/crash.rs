//! The crash tests' harness: one call (or one recovery sweep) in a process
//! of its own, read as JSON from standard input. With a failpoint the
//! process aborts the moment the pipeline reaches it, exactly as a crash
//! would leave the database. Built by `cargo test` as an example, so the
//! production binary ships no failpoint runner.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;

use serde_json::{Value, json};
use toolgate::adapters::artifacts::FsArtifactStore;
use toolgate::adapters::credentials::EnvFileResolver;
use toolgate::adapters::policy::RuleFilePolicy;
use toolgate::adapters::store;
use toolgate::config::{DEFAULT_INLINE_MAXIMUM_BYTES, DEFAULT_MAXIMUM_OUTPUT_BYTES_CEILING};
use toolgate::domain::{
    AgentSpec, ArgumentTrust, PolicyProfile, Principal, RuntimeEnvironment, TargetKind, TrustLevel,
};
use toolgate::pipeline::{
    CallOutcome, CallRequest, Lease, Pipeline, PipelineParts, PipelineSettings, Point,
    RegistryLimits, StepObserver, SweepBounds, ToolRegistry, Unobserved,
};
use toolgate::ports::{Clock, SystemClock, WorkerRegistration};

/// A harness worker's lease: long, since it never renews it; a crashed
/// harness's lease is released by the next process of its node.
const LEASE: std::time::Duration = std::time::Duration::from_secs(30);

/// A sweep takes every row the tests leave.
const SWEEP: SweepBounds = SweepBounds {
    batch: 100,
    rounds: 10,
    time: std::time::Duration::from_secs(60),
};

/// One job, as the crash tests write it.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Job {
    /// The store.
    store_url: String,
    /// Where the demo tools write their effects.
    effects: std::path::PathBuf,
    /// The artifact store's root.
    artifacts: std::path::PathBuf,
    /// `call` or `recover`.
    mode: String,
    /// A point name at which to abort.
    #[serde(default)]
    failpoint: Option<String>,
    /// The node the harness process is (its worker's node id).
    node: String,
    /// `allow` (every call allowed) or `built_in` (external writes need
    /// approval).
    policy: String,
    /// The call, for `call`.
    #[serde(default)]
    request: Option<JobRequest>,
}

/// The call a job makes.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct JobRequest {
    tenant_id: String,
    session_id: uuid::Uuid,
    run_id: uuid::Uuid,
    call_id: String,
    tool: String,
    arguments: Value,
}

/// Aborts the process at one point, naming it first: a test tells a crash
/// at its failpoint from any other abort.
struct Failpoint(Point);

impl StepObserver for Failpoint {
    fn reached(&self, point: Point, _: &str) {
        if point == self.0 {
            eprintln!("crash_harness: aborted at {}", point.as_str());
            std::process::abort();
        }
    }
}

/// Runs a job and returns what the call (or sweep) produced.
async fn run(job: Job) -> Result<Value, String> {
    let store = store::connect(&job.store_url)
        .await
        .map_err(|e| e.to_string())?;
    store.migrate().await.map_err(|e| e.to_string())?;
    let registry = Arc::new(
        ToolRegistry::with_builtins(
            RegistryLimits {
                maximum_output_bytes_ceiling: DEFAULT_MAXIMUM_OUTPUT_BYTES_CEILING,
                tenant_catalog_tools: 10_000,
            },
            toolgate::builtin::demo::tools(&job.effects),
        )
        .map_err(|e| e.to_string())?,
    );
    let policy = match job.policy.as_str() {
        "allow" => RuleFilePolicy::parse("[[rules]]\ntools = [\"*\"]\ndecision = \"allow\"\n")
            .map_err(|e| e.to_string())?,
        _ => RuleFilePolicy::built_in(),
    };
    let observer: Arc<dyn StepObserver> = match &job.failpoint {
        Some(name) => Arc::new(Failpoint(
            Point::parse(name).ok_or_else(|| "unknown failpoint".to_owned())?,
        )),
        None => Arc::new(Unobserved),
    };
    let clock = Arc::new(SystemClock);
    let worker_id = uuid::Uuid::new_v4();
    let now = clock.now();
    // A harness is the node its job names: a process of the same node after
    // a crash is its restart, and releases the crashed one's lease; racing
    // harnesses of different nodes hold live leases side by side.
    store
        .register_worker(&WorkerRegistration {
            worker_id,
            node: job.node,
            host: "harness".into(),
            lease: LEASE,
        })
        .await
        .map_err(|e| e.to_string())?;
    let pipeline = Pipeline::new(PipelineParts {
        registry: registry.clone(),
        invocations: store.clone(),
        approvals: store.clone(),
        events: store.clone(),
        policy: Arc::new(policy),
        artifacts: Arc::new(FsArtifactStore::new(&job.artifacts)),
        credentials: Arc::new(EnvFileResolver::new(BTreeMap::new())),
        clock,
        observer,
        mcp: None,
        lease: Arc::new(Lease::until(worker_id, tokio::time::Instant::now() + LEASE)),
        settings: PipelineSettings {
            inline_maximum_bytes: DEFAULT_INLINE_MAXIMUM_BYTES,
        },
    });
    let result = match (job.mode.as_str(), job.request) {
        ("recover", _) => {
            let report = pipeline.recover(SWEEP).await.map_err(|e| e.to_string())?;
            json!({"taken": report.taken, "uncertain": report.uncertain})
        }
        ("call", Some(request)) => {
            let agent = AgentSpec {
                tools: vec!["demo.*".into()],
            };
            let principal = Principal {
                id: "harness".into(),
                scopes: ["demo.use".to_owned()].into(),
            };
            let environment = RuntimeEnvironment {
                targets: [TargetKind::InProcess].into(),
            };
            let pinned = registry.specs_for_session(
                &request.tenant_id,
                &agent,
                &principal,
                &PolicyProfile::default(),
                &environment,
            );
            let outcome = pipeline
                .call(CallRequest {
                    tenant_id: request.tenant_id,
                    session_id: request.session_id,
                    run_id: request.run_id,
                    step_number: 1,
                    call_id: request.call_id,
                    name: request.tool,
                    arguments: request.arguments,
                    principal,
                    agent,
                    pinned,
                    origin_trust: TrustLevel::User,
                    argument_trust: ArgumentTrust::default(),
                    deadline_at: Some(now + chrono::Duration::seconds(60)),
                    parallel_group: None,
                    recovering: None,
                    caller: Default::default(),
                })
                .await;
            match outcome {
                CallOutcome::Finished(finished) => json!({
                    "invocation_id": finished.invocation_id,
                    "outcome": finished.outcome,
                }),
                CallOutcome::Pending {
                    invocation_id,
                    approval_id,
                } => {
                    json!({"invocation_id": invocation_id, "pending": {"approval_id": approval_id}})
                }
                CallOutcome::Suspended {
                    invocation_id,
                    kind,
                    reference,
                } => json!({
                    "invocation_id": invocation_id,
                    "suspended": {"kind": kind, "reference": reference},
                }),
                CallOutcome::Withdrawn => json!({"withdrawn": true,
                }),
            }
        }
        _ => return Err("mode must be call (with a request) or recover".into()),
    };
    store
        .release_worker(worker_id)
        .await
        .map_err(|e| e.to_string())?;
    Ok(result)
}

fn main() -> ExitCode {
    let job: Job = match serde_json::from_reader(std::io::stdin()) {
        Ok(job) => job,
        Err(error) => {
            eprintln!("crash_harness: the job does not parse: {error}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("crash_harness: no runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(job)) {
        Ok(result) => {
            println!("{result}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("crash_harness: {error}");
            ExitCode::FAILURE
        }
    }
}
