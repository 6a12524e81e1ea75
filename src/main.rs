//! The `toolgate` command.

use std::path::PathBuf;
use std::process::ExitCode;

use std::collections::BTreeMap;

use clap::{Parser, Subcommand};
use hyper::Method;
use toolgate::adapters::telemetry::LogBudget;
use toolgate::adapters::telemetry::otlp::{OtlpError, TraceExport};
use toolgate::api::client::{encode, send};
use toolgate::ports::PlatformEvent;
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// Every allocation of the command's: a call makes many small ones.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The tool gateway beside agent sandboxes.
#[derive(Parser)]
#[command(
    name = "toolgate",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("TOOLGATE_REVISION"), ")"),
    about
)]
struct Cli {
    /// Log lines as JSON objects instead of text (to standard error).
    #[arg(long, global = true)]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print shell completions for toolgate to standard output.
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print toolgate's manual page (roff) to standard output, or write it
    /// and a page for every subcommand it lists into a folder.
    Man {
        /// The folder to write toolgate.1 and the subcommands' pages
        /// (toolgate-serve.1, toolgate-invocations-show.1, …) into.
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
    /// Validate a configuration file as a whole; every problem is printed
    /// with its field path.
    CheckConfig {
        /// The TOML file.
        file: PathBuf,
    },
    /// Run the sidecar: the control API, the bridge, recovery and the MCP
    /// servers, until SIGTERM (which drains) or a second signal (which forces).
    Serve {
        /// The TOML file.
        #[arg(long, default_value = "config/toolgate.toml")]
        config: PathBuf,
        /// Apply pending migrations instead of refusing to start.
        #[arg(long)]
        migrate: bool,
    },
    /// Connect to every configured MCP server (stdio servers started, HTTP
    /// servers dialled through egress) and report what its catalog
    /// registers, what is rejected and why; records nothing.
    Discover {
        /// The TOML file.
        #[arg(long, default_value = "config/toolgate.toml")]
        config: PathBuf,
    },
    /// Relay an MCP client that only spawns stdio servers to a running
    /// toolgate's front door: JSON-RPC lines on standard input and output.
    Stdio {
        /// The front door: http://host:port/mcp or unix:/path/to/front.sock.
        #[arg(long)]
        url: String,
        /// A file holding the bearer credential (an API key or a token);
        /// never given on the command line.
        #[arg(long)]
        token_file: PathBuf,
    },
    /// Make a new front door API key: prints the key (for the client) and
    /// its sha256 (for `front.api_keys`).
    Key,
    /// Apply the store's pending migrations.
    Migrate {
        /// The TOML file naming the store.
        #[arg(long, default_value = "config/toolgate.toml")]
        config: PathBuf,
    },
    /// Read recorded calls through a running sidecar's control API.
    Invocations {
        #[command(subcommand)]
        command: InvocationsCommand,
    },
    /// List and decide approvals through a running sidecar's control API.
    Approvals {
        #[command(subcommand)]
        command: ApprovalsCommand,
    },
    /// The queue of UNCERTAIN calls and their human resolution, through a
    /// running sidecar's control API.
    Review {
        #[command(subcommand)]
        command: ReviewCommand,
    },
    /// Each principal's grants at `oauth2_user` servers, through a running
    /// sidecar's control API: list them (never a token), or end one (its
    /// principal consents again at the next call).
    Grants {
        #[command(subcommand)]
        command: GrantsCommand,
    },
    /// Reload the running sidecar this configuration names (through its
    /// control socket): the policy rules and the front door's credentials
    /// are put in force; any other section changed in the file is reported
    /// as waiting for a restart.
    Reload {
        /// The TOML file the sidecar was started with.
        #[arg(long, default_value = "config/toolgate.toml")]
        config: PathBuf,
        /// The control socket, instead of the one the configuration names.
        #[arg(long)]
        socket: Option<PathBuf>,
    },
}

/// Where an operator command finds the sidecar, and whose records it reads.
#[derive(clap::Args)]
struct Operator {
    /// The tenant whose records are read or decided: lists span every
    /// tenant without it; a decision and a run's rows need it.
    #[arg(long)]
    tenant: Option<String>,
    /// The TOML file naming the control socket.
    #[arg(long, default_value = "config/toolgate.toml")]
    config: PathBuf,
    /// The control socket, instead of the one the configuration names.
    #[arg(long)]
    socket: Option<PathBuf>,
}

/// What a list is narrowed to and where its page starts.
#[derive(clap::Args)]
struct ListFilter {
    /// Only calls of this tool (registry name).
    #[arg(long)]
    tool: Option<String>,
    /// Only rows recorded at or after this RFC 3339 time.
    #[arg(long)]
    since: Option<String>,
    /// Rows per page, 1 to 500.
    #[arg(long)]
    limit: Option<u32>,
    /// The `next_cursor` of the page before.
    #[arg(long)]
    cursor: Option<String>,
}

impl ListFilter {
    /// The query a list route takes, `status` first when given.
    fn query(&self, status: Option<&str>) -> String {
        let pairs = [
            ("status", status.map(str::to_owned)),
            ("tool_name", self.tool.clone()),
            ("since", self.since.clone()),
            ("limit", self.limit.map(|limit| limit.to_string())),
            ("cursor", self.cursor.clone()),
        ];
        let query: Vec<String> = pairs
            .into_iter()
            .filter_map(|(key, value)| value.map(|value| format!("{key}={}", encode(&value))))
            .collect();
        if query.is_empty() {
            String::new()
        } else {
            format!("?{}", query.join("&"))
        }
    }
}

#[derive(Subcommand)]
enum InvocationsCommand {
    /// Recorded calls, newest first, across tenants unless --tenant names
    /// one.
    List {
        /// Only calls in this status (succeeded, failed, denied,
        /// uncertain, running, waiting_for_approval, authorized).
        #[arg(long)]
        status: Option<String>,
        #[command(flatten)]
        filter: ListFilter,
        #[command(flatten)]
        operator: Operator,
    },
    /// One recorded call, with its events.
    Show {
        invocation_id: String,
        #[command(flatten)]
        operator: Operator,
    },
    /// A run's recorded calls, in step order.
    Run {
        run_id: String,
        #[command(flatten)]
        operator: Operator,
    },
}

#[derive(Subcommand)]
enum ApprovalsCommand {
    /// Approvals with the calls they would allow, newest first: pending
    /// unless --status says otherwise.
    List {
        #[arg(long, default_value = "pending",
              value_parser = ["pending", "approved", "denied", "expired", "all"])]
        status: String,
        #[command(flatten)]
        filter: ListFilter,
        #[command(flatten)]
        operator: Operator,
    },
    /// Approve: the waiting call resumes at its next submission.
    Approve {
        approval_id: String,
        /// Who decided, as recorded.
        #[arg(long)]
        approver: String,
        #[command(flatten)]
        operator: Operator,
    },
    /// Deny: the waiting call ends denied.
    Deny {
        approval_id: String,
        /// Who decided, as recorded.
        #[arg(long)]
        approver: String,
        #[command(flatten)]
        operator: Operator,
    },
}

#[derive(Subcommand)]
enum GrantsCommand {
    /// The tenant's grants: principal, server, issuer, scopes, when granted
    /// and last used.
    List {
        #[command(flatten)]
        operator: Operator,
    },
    /// Ends a principal's grant at a server.
    Revoke {
        /// The server.
        server_id: String,
        /// Whose grant.
        #[arg(long)]
        principal: String,
        #[command(flatten)]
        operator: Operator,
    },
}

#[derive(Subcommand)]
enum ReviewCommand {
    /// UNCERTAIN calls, newest first: those not yet resolved unless
    /// --status says otherwise.
    List {
        #[arg(long, default_value = "pending", value_parser = ["pending", "resolved", "all"])]
        status: String,
        #[command(flatten)]
        filter: ListFilter,
        #[command(flatten)]
        operator: Operator,
    },
    /// Record what a human found: whether the effect happened. The row
    /// itself is never changed.
    Resolve {
        invocation_id: String,
        #[arg(long, value_parser = ["effect_applied", "effect_not_applied"])]
        resolution: String,
        /// Who resolved it, as recorded.
        #[arg(long)]
        resolver: String,
        /// What was found, in a line.
        #[arg(long)]
        note: Option<String>,
        #[command(flatten)]
        operator: Operator,
    },
}

/// A line on standard output. A reader that went away (`| head`) ends the
/// command quietly: nothing more it prints is read.
macro_rules! out {
    ($($line:tt)*) => {{
        use std::io::Write as _;
        if writeln!(std::io::stdout().lock(), $($line)*).is_err() {
            std::process::exit(0);
        }
    }};
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Before any file, socket or child exists, and while the process has one
    // thread (the umask is process-wide).
    if let Err(error) = toolgate::app::harden_process() {
        eprintln!("toolgate: {error}");
        return ExitCode::FAILURE;
    }
    let environment: BTreeMap<String, String> = std::env::vars().collect();
    let process = match &cli.command {
        Command::Serve { config, .. } => toolgate::app::process_settings(config, &environment).ok(),
        _ => None,
    };
    let export = match init_logging(cli.log_json, process.as_ref(), &environment) {
        Ok(export) => export,
        Err(error) => {
            eprintln!("toolgate: {error}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::CheckConfig { file } => check_config(&file, &environment),
        Command::Serve { config, migrate } => {
            let threads = process.map_or_else(
                || toolgate::config::RuntimeConfig::default().worker_threads,
                |process| process.worker_threads,
            );
            let Some(runtime) = runtime_with(threads) else {
                return ExitCode::FAILURE;
            };
            let options = toolgate::app::ServeOptions {
                migrate,
                config_path: Some(config.clone()),
            };
            let served = runtime.block_on(serve(&config, &environment, options));
            // What spans are buffered go to the collector before the exit.
            if let Some(export) = &export {
                export.shutdown();
            }
            exit("toolgate", served)
        }
        Command::Discover { config } => discover(&config, &environment),
        Command::Stdio { url, token_file } => {
            let relayed = toolgate::front::relay::Endpoint::parse(&url).and_then(|endpoint| {
                let token = toolgate::front::relay::read_token(&token_file)?;
                let runtime = runtime().ok_or(toolgate::front::relay::RelayError::Io(
                    std::io::ErrorKind::Other,
                ))?;
                runtime.block_on(toolgate::front::relay::run(endpoint, token))
            });
            exit("toolgate stdio", relayed)
        }
        Command::Key => {
            let key = toolgate::front::auth::new_api_key().map(|(key, sha256)| {
                out!("key: {key}");
                out!("sha256: {sha256}");
            });
            exit("toolgate", key)
        }
        Command::Completions { shell } => {
            use clap::CommandFactory as _;
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "toolgate", &mut script);
            emit(&script)
        }
        Command::Man { out_dir } => {
            use clap::CommandFactory as _;
            // The pages list no `help` subcommand: no page is made for it,
            // and every page has its options already.
            let command = Cli::command().disable_help_subcommand(true);
            match out_dir {
                Some(folder) => exit("toolgate", clap_mangen::generate_to(command, folder)),
                None => {
                    let mut page = Vec::new();
                    match clap_mangen::Man::new(command).render(&mut page) {
                        Ok(()) => emit(&page),
                        Err(error) => exit("toolgate", Err(error)),
                    }
                }
            }
        }
        Command::Migrate { config } => migrate(&config, &environment),
        Command::Invocations { command } => invocations(command, &environment),
        Command::Approvals { command } => approvals(command, &environment),
        Command::Review { command } => review(command, &environment),
        Command::Grants { command } => grants(command, &environment),
        Command::Reload { config, socket } => reload(&config, socket, &environment),
    }
}

/// `toolgate reload`: asks the sidecar on the configuration's control
/// socket to reload, and prints what it did, a line per section or file.
/// Fails when anything was refused, or no sidecar answered.
fn reload(
    config: &std::path::Path,
    socket: Option<PathBuf>,
    environment: &BTreeMap<String, String>,
) -> ExitCode {
    let socket = match socket {
        Some(socket) => socket,
        None => match toolgate::app::control_socket(config, environment) {
            Ok(socket) => socket,
            Err(errors) => {
                for error in &errors.0 {
                    eprintln!("{}: {error}", config.display());
                }
                return ExitCode::FAILURE;
            }
        },
    };
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    let answer = match runtime.block_on(send(&socket, Method::POST, "/v1/reload", None)) {
        Ok(answer) if answer.status == 200 => answer.body,
        Ok(answer) => {
            eprintln!("toolgate: {}", answer.refusal());
            return ExitCode::FAILURE;
        }
        Err(error) => {
            eprintln!(
                "toolgate: {error}; is the sidecar of {} running?",
                config.display()
            );
            return ExitCode::FAILURE;
        }
    };
    let lines = |key: &str| -> Vec<String> {
        answer[key]
            .as_array()
            .map(|lines| {
                lines
                    .iter()
                    .filter_map(|line| line.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    for line in lines("reloaded") {
        out!("reloaded: {line}");
    }
    for line in lines("unchanged") {
        out!("unchanged: {line}");
    }
    for line in lines("restart_required") {
        out!("restart required: {line} (changed in the file; in force after the next start)");
    }
    let refused = lines("refused");
    for line in &refused {
        out!("refused: {line}");
    }
    if refused.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `bytes` on standard output; a reader that went away ends it quietly.
fn emit(bytes: &[u8]) -> ExitCode {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(error) => exit("toolgate", Err(error)),
    }
}

/// Success, or the error on standard error after `prefix`.
fn exit<E: std::fmt::Display>(prefix: &str, result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{prefix}: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Logs go to standard error; spans carry identity and classification
/// only, never arguments or results, and go to the OTLP collector when one
/// is configured (its export handle is returned, to flush at exit).
fn init_logging(
    json: bool,
    process: Option<&toolgate::app::ProcessSettings>,
    environment: &BTreeMap<String, String>,
) -> Result<Option<TraceExport>, OtlpError> {
    let targets = log_filter(
        environment
            .get("RUST_LOG")
            .map(String::as_str)
            .or(process.map(|process| process.log_level.as_str())),
    );
    let (traces, export) = match process.and_then(|process| process.otlp.as_ref()) {
        Some(settings) => {
            let (layer, export) = toolgate::adapters::telemetry::otlp::layer(settings)?;
            (Some(layer), Some(export))
        }
        None => (None, None),
    };
    if json {
        tracing_subscriber::registry()
            .with(traces)
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(true)
                    .with_writer(std::io::stderr)
                    .with_filter(LogBudget::default()),
            )
            .with(targets)
            .init();
    } else {
        tracing_subscriber::registry()
            .with(traces)
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_filter(LogBudget::default()),
            )
            .with(targets)
            .init();
    }
    Ok(export)
}

/// `toolgate check-config`: a summary, or every problem found.
fn check_config(file: &std::path::Path, environment: &BTreeMap<String, String>) -> ExitCode {
    match toolgate::app::check_config(file, environment) {
        Ok(summary) => {
            out!(
                "{}: ok (store: {}, stdio servers: {}, http servers: {}, egress entries: {})",
                file.display(),
                summary.store_backend,
                summary.stdio_servers,
                summary.http_servers,
                summary.egress_entries
            );
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for error in &errors.0 {
                eprintln!("{}: {error}", file.display());
            }
            ExitCode::FAILURE
        }
    }
}

/// `toolgate discover`: what each server answered; a failure when one did
/// not.
fn discover(config: &std::path::Path, environment: &BTreeMap<String, String>) -> ExitCode {
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    // Progress goes to standard error, so the report on standard output
    // stays what a pipe reads; a closed standard error is not a failure.
    let progress = |line: String| {
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "toolgate: {line}");
    };
    match runtime.block_on(toolgate::app::discover(config, environment, &progress)) {
        Ok(reports) => {
            let mut failed = false;
            for report in reports {
                out!("{}", report.server_id);
                for event in &report.events {
                    failed |= matches!(event, PlatformEvent::ServerDisconnected { .. });
                    out!("  {} {}", event.event_type(), event.payload());
                }
                for name in &report.registered {
                    out!("  registered {name}");
                }
                for name in &report.skills {
                    out!("  skill {name}");
                }
            }
            if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(error) => {
            eprintln!("toolgate: {error}");
            ExitCode::FAILURE
        }
    }
}

/// `toolgate migrate`: the versions applied, or that none were due.
fn migrate(config: &std::path::Path, environment: &BTreeMap<String, String>) -> ExitCode {
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    match runtime.block_on(toolgate::app::migrate(config, environment)) {
        Ok(applied) if applied.is_empty() => {
            out!("store is current");
            ExitCode::SUCCESS
        }
        Ok(applied) => {
            let versions: Vec<String> = applied.iter().map(i64::to_string).collect();
            out!("applied migration(s): {}", versions.join(", "));
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{}: {error}", config.display());
            ExitCode::FAILURE
        }
    }
}

/// `toolgate invocations …` over the control API.
fn invocations(command: InvocationsCommand, environment: &BTreeMap<String, String>) -> ExitCode {
    match command {
        InvocationsCommand::List {
            status,
            filter,
            operator,
        } => ask(
            &operator,
            environment,
            Method::GET,
            &format!("/v1/invocations{}", filter.query(status.as_deref())),
            None,
        ),
        InvocationsCommand::Show {
            invocation_id,
            operator,
        } => ask(
            &operator,
            environment,
            Method::GET,
            &format!("/v1/invocations/{}", encode(&invocation_id)),
            None,
        ),
        InvocationsCommand::Run { run_id, operator } => ask(
            &operator,
            environment,
            Method::GET,
            &format!("/v1/runs/{}/invocations", encode(&run_id)),
            None,
        ),
    }
}

/// `toolgate approvals …` over the control API.
fn approvals(command: ApprovalsCommand, environment: &BTreeMap<String, String>) -> ExitCode {
    let decide = |approval_id: &str, decision: &str, approver: String, operator: &Operator| {
        ask(
            operator,
            environment,
            Method::POST,
            &format!("/v1/approvals/{}", encode(approval_id)),
            Some(serde_json::json!({"decision": decision, "approver": approver})),
        )
    };
    match command {
        ApprovalsCommand::List {
            status,
            filter,
            operator,
        } => ask(
            &operator,
            environment,
            Method::GET,
            &format!("/v1/approvals{}", filter.query(Some(&status))),
            None,
        ),
        ApprovalsCommand::Approve {
            approval_id,
            approver,
            operator,
        } => decide(&approval_id, "approve", approver, &operator),
        ApprovalsCommand::Deny {
            approval_id,
            approver,
            operator,
        } => decide(&approval_id, "deny", approver, &operator),
    }
}

/// `toolgate grants …` over the control API: always one tenant's.
fn grants(command: GrantsCommand, environment: &BTreeMap<String, String>) -> ExitCode {
    let operator = match &command {
        GrantsCommand::List { operator } | GrantsCommand::Revoke { operator, .. } => operator,
    };
    if operator.tenant.is_none() {
        eprintln!("toolgate: grants are a tenant's: name it with --tenant");
        return ExitCode::FAILURE;
    }
    match &command {
        GrantsCommand::List { operator } => {
            ask(operator, environment, Method::GET, "/v1/grants", None)
        }
        GrantsCommand::Revoke {
            server_id,
            principal,
            operator,
        } => ask(
            operator,
            environment,
            Method::DELETE,
            &format!(
                "/v1/grants/{}?principal_id={}",
                encode(server_id),
                encode(principal)
            ),
            None,
        ),
    }
}

/// `toolgate review …` over the control API.
fn review(command: ReviewCommand, environment: &BTreeMap<String, String>) -> ExitCode {
    match command {
        ReviewCommand::List {
            status,
            filter,
            operator,
        } => ask(
            &operator,
            environment,
            Method::GET,
            &format!("/v1/review{}", filter.query(Some(&status))),
            None,
        ),
        ReviewCommand::Resolve {
            invocation_id,
            resolution,
            resolver,
            note,
            operator,
        } => ask(
            &operator,
            environment,
            Method::POST,
            &format!("/v1/review/{}", encode(&invocation_id)),
            Some(serde_json::json!({"resolution": resolution, "resolver": resolver, "note": note})),
        ),
    }
}

/// Sends one operator request (for the tenant, when one is named) and
/// prints the answer: the JSON on standard output, or the refusal on
/// standard error.
fn ask(
    operator: &Operator,
    environment: &BTreeMap<String, String>,
    method: Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> ExitCode {
    let socket = match &operator.socket {
        Some(socket) => socket.clone(),
        None => match toolgate::app::control_socket(&operator.config, environment) {
            Ok(socket) => socket,
            Err(errors) => {
                for error in &errors.0 {
                    eprintln!("{}: {error}", operator.config.display());
                }
                return ExitCode::FAILURE;
            }
        },
    };
    let target = match &operator.tenant {
        Some(tenant) => {
            let separator = if path.contains('?') { '&' } else { '?' };
            format!("{path}{separator}tenant_id={}", encode(tenant))
        }
        None => path.to_owned(),
    };
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    match runtime.block_on(send(&socket, method, &target, body.as_ref())) {
        Ok(answer) if (200..300).contains(&answer.status) => {
            out!(
                "{}",
                serde_json::to_string_pretty(&answer.body).unwrap_or_default()
            );
            ExitCode::SUCCESS
        }
        Ok(answer) => {
            eprintln!("toolgate: {}", answer.refusal());
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("toolgate: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The log filter: `RUST_LOG` or `log.level` (`info`, or target=level
/// pairs), INFO when neither says. The MCP library is heard from at WARN
/// unless the filter names it: it logs every notification and a server's
/// self-description at INFO, so a server could flood the log with its text.
fn log_filter(given: Option<&str>) -> Targets {
    let default = Targets::new()
        .with_default(tracing::Level::INFO)
        .with_target("rmcp", tracing::Level::WARN);
    let Some(given) = given
        .map(str::trim)
        .filter(|given| toolgate::config::valid_log_filter(given))
    else {
        return default;
    };
    let given = if given.contains("rmcp") {
        given.to_owned()
    } else {
        format!("{given},rmcp=warn")
    };
    given.parse().unwrap_or(default)
}

/// A runtime for one command.
fn runtime() -> Option<tokio::runtime::Runtime> {
    runtime_with(2)
}

/// A runtime of `threads` worker threads.
fn runtime_with(threads: usize) -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
    {
        Ok(runtime) => Some(runtime),
        Err(error) => {
            eprintln!("toolgate: cannot start the runtime: {error}");
            None
        }
    }
}

/// `toolgate serve`: the node built from its checked configuration and
/// served until SIGTERM or SIGINT, or until its lease is lost for good. The first
/// signal drains; a second one forces the exit. SIGHUP reloads the policy
/// and the front door's credentials.
async fn serve(
    path: &std::path::Path,
    environment: &BTreeMap<String, String>,
    options: toolgate::app::ServeOptions,
) -> Result<(), toolgate::app::AppError> {
    use tokio::signal::unix::{SignalKind, signal};
    use toolgate::app::{self, AppError};
    app::check_config(path, environment)?;
    let config = toolgate::config::Config::load(path, environment)?;
    let clock = std::sync::Arc::new(toolgate::ports::SystemClock);
    let built = app::build(config, environment, options, clock).await?;
    // Caught before the sockets exist: a signal sent once a client can
    // reach the node drains it.
    let listen = |kind: SignalKind| signal(kind).map_err(AppError::Signal);
    let mut terminate = listen(SignalKind::terminate())?;
    let mut interrupt = listen(SignalKind::interrupt())?;
    let mut hangup = listen(SignalKind::hangup())?;
    let listeners = built.bind().await?;
    let running = built.spawn(listeners);
    let lost = running.lease_lost();
    let lease_lost = loop {
        tokio::select! {
            _ = terminate.recv() => break false,
            _ = interrupt.recv() => break false,
            _ = lost.cancelled() => break true,
            _ = hangup.recv() => running.reload().await,
        }
    };
    let force = async {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    };
    running.drain(force, lease_lost).await
}
