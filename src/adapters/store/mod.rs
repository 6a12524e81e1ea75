//! The `Store` port: PostgreSQL on sqlx (several nodes on one database) and
//! embedded SQLite on rusqlite (one node). Runtime queries only, so no build needs a
//! database; migrations are embedded per backend and applied by a small
//! migrator of our own (a checksum per version, refused when an applied
//! migration differs from this build's).

use std::str::FromStr;
use std::sync::Arc;

use serde_json::Value;

use crate::domain::invocation::{Phase, Transition};
use crate::domain::{InvocationStatus, sha256_hex};
use crate::ports::{StoreError, ToolEvent};

// The columns each backend reads, in one order: `invocation_columns!()`
// and its kin, for `concat!`.
macro_rules! invocation_columns {
    () => {
        "id, tenant_id, session_id, run_id, step_number, call_id, tool_name, tool_version, tool_source, \
         server_id, arguments, arguments_hash, idempotency_key, status, idempotency_class, side_effect, \
         principal, origin_trust, parallel_group, deadline_at, approval_id, effect_sent_at, attempt_number, \
         worker_id, lease_epoch, suspended_kind, suspended_ref, outcome_status, reason_code, result, error, \
         output_bytes, truncated, artifact_id, created_at, started_at, completed_at, argument_trust"
    };
}

macro_rules! approval_columns {
    () => {
        "id, tenant_id, invocation_id, tool_name, reason_code, status, approver, requested_at, decided_at"
    };
}

macro_rules! session_columns {
    () => {
        "session_id, tenant_id, principal, agent, tool_schema_sha256, tool_contract_sha256, opened_at, \
         last_used_at, tool_names"
    };
}

mod grants;
mod invocations;
mod operator;
mod postgres;
mod records;
mod rows;
mod sqlite;

pub use postgres::{PostgresSettings, PostgresStore};
pub use sqlite::SqliteStore;

/// One embedded migration.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Applied in ascending order.
    pub version: i64,
    /// For operators.
    pub description: &'static str,
    /// The SQL, possibly several statements.
    pub sql: &'static str,
}

impl Migration {
    /// What an applied migration must still match.
    pub fn checksum(&self) -> String {
        sha256_hex(self.sql.as_bytes())
    }
}

/// PostgreSQL's migrations.
pub const POSTGRES_MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "workers, tool_invocations, approvals, events",
        sql: include_str!("../../../migrations/postgres/0001_init.sql"),
    },
    Migration {
        version: 2,
        description: "the circuit breaker's evidence and restarts",
        sql: include_str!("../../../migrations/postgres/0002_breaker.sql"),
    },
    Migration {
        version: 3,
        description: "one round trip per hot-path commit",
        sql: include_str!("../../../migrations/postgres/0003_one_round_trip.sql"),
    },
    Migration {
        version: 4,
        description: "the MCP tool catalog history",
        sql: include_str!("../../../migrations/postgres/0004_mcp_catalog.sql"),
    },
    Migration {
        version: 5,
        description: "mcp_servers",
        sql: include_str!("../../../migrations/postgres/0005_mcp_servers.sql"),
    },
    Migration {
        version: 6,
        description: "review resolutions",
        sql: include_str!("../../../migrations/postgres/0006_review.sql"),
    },
    Migration {
        version: 7,
        description: "no tool_invocations index led by the tenant",
        sql: include_str!("../../../migrations/postgres/0007_run_index.sql"),
    },
    Migration {
        version: 8,
        description: "sessions",
        sql: include_str!("../../../migrations/postgres/0008_sessions.sql"),
    },
    Migration {
        version: 9,
        description: "tenant-configured servers",
        sql: include_str!("../../../migrations/postgres/0009_tenant_servers.sql"),
    },
    Migration {
        version: 10,
        description: "every artifact a call produced",
        sql: include_str!("../../../migrations/postgres/0010_produced_artifacts.sql"),
    },
    Migration {
        version: 11,
        description: "a read's intent and claim in one commit",
        sql: include_str!("../../../migrations/postgres/0011_folded_intent.sql"),
    },
    Migration {
        version: 12,
        description: "an allowed call's intent where the breaker has nothing to count",
        sql: include_str!("../../../migrations/postgres/0012_uncounted_intent.sql"),
    },
    Migration {
        version: 13,
        description: "leases on the database's clock; a node folder's place",
        sql: include_str!("../../../migrations/postgres/0013_store_clock_leases.sql"),
    },
    Migration {
        version: 14,
        description: "idempotency keys and the breaker's tables keyed by tenant",
        sql: include_str!("../../../migrations/postgres/0014_tenant_keys.sql"),
    },
    Migration {
        version: 15,
        description: "an approval per time an invocation is put to a human",
        sql: include_str!("../../../migrations/postgres/0015_approvals_per_ask.sql"),
    },
    Migration {
        version: 17,
        description: "the step after which a run only answers",
        sql: include_str!("../../../migrations/postgres/0017_synthesis_only.sql"),
    },
    Migration {
        version: 18,
        description: "skills a tenant's agents wrote",
        sql: include_str!("../../../migrations/postgres/0018_authored_skills.sql"),
    },
    Migration {
        version: 19,
        description: "where a call's arguments came from, on its row",
        sql: include_str!("../../../migrations/postgres/0019_argument_trust.sql"),
    },
    Migration {
        version: 20,
        description: "what the operator's lists read",
        sql: include_str!("../../../migrations/postgres/0020_operator_reads.sql"),
    },
    Migration {
        version: 21,
        description: "the turns still open, by expiry",
        sql: include_str!("../../../migrations/postgres/0021_open_turns.sql"),
    },
    Migration {
        version: 22,
        description: "runs and whose they are",
        sql: include_str!("../../../migrations/postgres/0022_run_owners.sql"),
    },
    Migration {
        version: 23,
        description: "operators' console sign-ins",
        sql: include_str!("../../../migrations/postgres/0023_console_sign_ins.sql"),
    },
    Migration {
        version: 24,
        description: "one index leads with the run",
        sql: include_str!("../../../migrations/postgres/0024_one_run_index.sql"),
    },
    Migration {
        version: 25,
        description: "one function a commit",
        sql: include_str!("../../../migrations/postgres/0025_one_function_a_commit.sql"),
    },
    Migration {
        version: 26,
        description: "events without a sequence",
        sql: include_str!("../../../migrations/postgres/0026_events_without_a_sequence.sql"),
    },
    Migration {
        version: 27,
        description: "each principal's upstream grants",
        sql: include_str!("../../../migrations/postgres/0027_upstream_grants.sql"),
    },
    Migration {
        version: 28,
        description: "consent flows' clients and revocation endpoints",
        sql: include_str!("../../../migrations/postgres/0028_consent_clients.sql"),
    },
    Migration {
        version: 29,
        description: "the held rows' index, and identical calls' without their outcome",
        sql: include_str!("../../../migrations/postgres/0029_held_and_identical.sql"),
    },
    Migration {
        version: 30,
        description: "the servers' events index without a list in its condition",
        sql: include_str!("../../../migrations/postgres/0030_server_events_without_a_list.sql"),
    },
    Migration {
        version: 31,
        description: "the statuses' checks without a list",
        sql: include_str!("../../../migrations/postgres/0031_statuses_without_a_list.sql"),
    },
    Migration {
        version: 32,
        description: "a call's writes answer whether they wrote; its status checked through a type",
        sql: include_str!("../../../migrations/postgres/0032_writes_without_their_rows.sql"),
    },
    Migration {
        version: 33,
        description: "a counted intent's INSERT planned once",
        sql: include_str!("../../../migrations/postgres/0033_intents_planned_once.sql"),
    },
];

/// SQLite's migrations, version for version the same schema.
pub const SQLITE_MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "workers, tool_invocations, approvals, events",
        sql: include_str!("../../../migrations/sqlite/0001_init.sql"),
    },
    Migration {
        version: 2,
        description: "the circuit breaker's evidence and restarts",
        sql: include_str!("../../../migrations/sqlite/0002_breaker.sql"),
    },
    Migration {
        version: 3,
        description: "one round trip per hot-path commit (nothing to do embedded)",
        sql: include_str!("../../../migrations/sqlite/0003_one_round_trip.sql"),
    },
    Migration {
        version: 4,
        description: "the MCP tool catalog history",
        sql: include_str!("../../../migrations/sqlite/0004_mcp_catalog.sql"),
    },
    Migration {
        version: 5,
        description: "mcp_servers",
        sql: include_str!("../../../migrations/sqlite/0005_mcp_servers.sql"),
    },
    Migration {
        version: 6,
        description: "review resolutions",
        sql: include_str!("../../../migrations/sqlite/0006_review.sql"),
    },
    Migration {
        version: 7,
        description: "no tool_invocations index led by the tenant",
        sql: include_str!("../../../migrations/sqlite/0007_run_index.sql"),
    },
    Migration {
        version: 8,
        description: "sessions",
        sql: include_str!("../../../migrations/sqlite/0008_sessions.sql"),
    },
    Migration {
        version: 9,
        description: "tenant-configured servers",
        sql: include_str!("../../../migrations/sqlite/0009_tenant_servers.sql"),
    },
    Migration {
        version: 10,
        description: "every artifact a call produced",
        sql: include_str!("../../../migrations/sqlite/0010_produced_artifacts.sql"),
    },
    Migration {
        version: 11,
        description: "a read's intent and claim in one commit (nothing to do embedded)",
        sql: include_str!("../../../migrations/sqlite/0011_folded_intent.sql"),
    },
    Migration {
        version: 12,
        description: "an allowed call's intent where the breaker has nothing to count (nothing to do embedded)",
        sql: include_str!("../../../migrations/sqlite/0012_uncounted_intent.sql"),
    },
    Migration {
        version: 13,
        description: "a node folder's place",
        sql: include_str!("../../../migrations/sqlite/0013_store_clock_leases.sql"),
    },
    Migration {
        version: 14,
        description: "idempotency keys and the breaker's tables keyed by tenant",
        sql: include_str!("../../../migrations/sqlite/0014_tenant_keys.sql"),
    },
    Migration {
        version: 15,
        description: "an approval per time an invocation is put to a human",
        sql: include_str!("../../../migrations/sqlite/0015_approvals_per_ask.sql"),
    },
    Migration {
        version: 17,
        description: "the step after which a run only answers",
        sql: include_str!("../../../migrations/sqlite/0017_synthesis_only.sql"),
    },
    Migration {
        version: 18,
        description: "skills a tenant's agents wrote",
        sql: include_str!("../../../migrations/sqlite/0018_authored_skills.sql"),
    },
    Migration {
        version: 19,
        description: "where a call's arguments came from, on its row",
        sql: include_str!("../../../migrations/sqlite/0019_argument_trust.sql"),
    },
    Migration {
        version: 20,
        description: "what the operator's lists read",
        sql: include_str!("../../../migrations/sqlite/0020_operator_reads.sql"),
    },
    Migration {
        version: 21,
        description: "the turns still open, by expiry",
        sql: include_str!("../../../migrations/sqlite/0021_open_turns.sql"),
    },
    Migration {
        version: 22,
        description: "runs and whose they are",
        sql: include_str!("../../../migrations/sqlite/0022_run_owners.sql"),
    },
    Migration {
        version: 23,
        description: "operators' console sign-ins",
        sql: include_str!("../../../migrations/sqlite/0023_console_sign_ins.sql"),
    },
    Migration {
        version: 24,
        description: "one index leads with the run",
        sql: include_str!("../../../migrations/sqlite/0024_one_run_index.sql"),
    },
    Migration {
        version: 25,
        description: "one function a commit",
        sql: include_str!("../../../migrations/sqlite/0025_one_function_a_commit.sql"),
    },
    Migration {
        version: 26,
        description: "events without a sequence",
        sql: include_str!("../../../migrations/sqlite/0026_events_without_a_sequence.sql"),
    },
    Migration {
        version: 27,
        description: "each principal's upstream grants",
        sql: include_str!("../../../migrations/sqlite/0027_upstream_grants.sql"),
    },
    Migration {
        version: 28,
        description: "consent flows' clients and revocation endpoints",
        sql: include_str!("../../../migrations/sqlite/0028_consent_clients.sql"),
    },
    Migration {
        version: 29,
        description: "the held rows' index, and identical calls' without their outcome",
        sql: include_str!("../../../migrations/sqlite/0029_held_and_identical.sql"),
    },
    Migration {
        version: 30,
        description: "the servers' events index without a list in its condition",
        sql: include_str!("../../../migrations/sqlite/0030_server_events_without_a_list.sql"),
    },
    Migration {
        version: 31,
        description: "the statuses' checks without a list",
        sql: include_str!("../../../migrations/sqlite/0031_statuses_without_a_list.sql"),
    },
    Migration {
        version: 32,
        description: "a call's writes answer whether they wrote; its status checked through a type",
        sql: include_str!("../../../migrations/sqlite/0032_writes_without_their_rows.sql"),
    },
    Migration {
        version: 33,
        description: "a counted intent's INSERT planned once",
        sql: include_str!("../../../migrations/sqlite/0033_intents_planned_once.sql"),
    },
];

/// Opens the store a URL names: `postgres://…`/`postgresql://…` or
/// `sqlite://path` (created if missing).
pub async fn connect(url: &str) -> Result<Arc<dyn crate::ports::Store>, StoreError> {
    connect_with(
        url,
        PostgresSettings::default(),
        Arc::new(crate::ports::SystemClock),
    )
    .await
}

/// [`connect`], with `settings` for PostgreSQL and the node's `clock`,
/// which keeps SQLite's leases (PostgreSQL keeps them by its own).
pub async fn connect_with(
    url: &str,
    settings: PostgresSettings,
    clock: Arc<dyn crate::ports::Clock>,
) -> Result<Arc<dyn crate::ports::Store>, StoreError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(PostgresStore::connect_with(url, settings).await?))
    } else if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::connect_on(url, clock).await?))
    } else {
        Err(StoreError::Unavailable(
            "store URL must be postgres:// or sqlite:".into(),
        ))
    }
}

/// Which applied versions are unknown or changed, and which are pending.
fn plan(migrations: &[Migration], applied: &[(i64, String)]) -> Result<Vec<Migration>, StoreError> {
    for (version, checksum) in applied {
        match migrations.iter().find(|m| m.version == *version) {
            None => {
                return Err(StoreError::Migration {
                    version: *version,
                    reason: "applied to the database but unknown to this build (a newer toolgate migrated it)".into(),
                });
            }
            Some(known) if known.checksum() != *checksum => {
                return Err(StoreError::Migration {
                    version: *version,
                    reason: "applied with different contents than this build's".into(),
                });
            }
            Some(_) => {}
        }
    }
    Ok(migrations
        .iter()
        .filter(|m| !applied.iter().any(|(version, _)| *version == m.version))
        .copied()
        .collect())
}

/// Maps a driver error to the port's, without bound values (sqlx never puts
/// them in its messages) and without the database's detail line.
fn database_error(error: sqlx::Error) -> StoreError {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => StoreError::Unavailable(error.to_string()),
        sqlx::Error::Database(database) => StoreError::Query(database.message().to_owned()),
        other => StoreError::Query(other.to_string()),
    }
}

/// Reads a closed-set column.
fn parse<T: FromStr>(text: &str, column: &str) -> Result<T, StoreError> {
    text.parse()
        .map_err(|_| StoreError::Decode(format!("{column}: not a known member")))
}

/// Reads an optional closed-set column.
fn parse_optional<T: FromStr>(text: Option<String>, column: &str) -> Result<Option<T>, StoreError> {
    text.map(|text| parse(&text, column)).transpose()
}

/// The SQL condition that a `tool_invocations` row (of table alias
/// `alias`, e.g. `"i."`, or `""`) is in one of the phases `transition` may
/// leave: both adapters render their conditional writes' phase guards from
/// the one transition table. RUNNING is told apart by its suspension.
fn leaves(transition: &Transition, alias: &str) -> String {
    let mut statuses: Vec<&str> = Vec::new();
    for phase in transition.leaves {
        for status in phase.statuses() {
            if !statuses.contains(&status.as_str()) {
                statuses.push(status.as_str());
            }
        }
    }
    let listed: Vec<String> = statuses
        .iter()
        .map(|status| format!("'{status}'"))
        .collect();
    let mut condition = if listed.len() == 1 {
        format!("{alias}status = {}", listed[0])
    } else {
        format!("{alias}status IN ({})", listed.join(", "))
    };
    let running = transition.leaves.contains(&Phase::Running);
    let suspended = transition.leaves.contains(&Phase::Suspended);
    let only_running = statuses == [InvocationStatus::Running.as_str()];
    let suspension = match (running, suspended) {
        (true, false) => Some("IS NULL"),
        (false, true) => Some("IS NOT NULL"),
        _ => None,
    };
    if let Some(test) = suspension {
        if only_running {
            condition.push_str(&format!(" AND {alias}suspended_kind {test}"));
        } else {
            condition.push_str(&format!(
                " AND ({alias}status <> 'running' OR {alias}suspended_kind {test})"
            ));
        }
    }
    condition
}

/// The JSON body an event row stores.
fn event_body(event: &ToolEvent) -> Result<Value, StoreError> {
    serde_json::to_value(event).map_err(|error| StoreError::Decode(error.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::invocation::{AUTHORIZE_WAITING, COMPLETE_SUSPENDED, SUSPEND, TAKE_OVER};

    #[test]
    fn phase_guards_are_rendered_from_the_table() {
        assert_eq!(
            leaves(&AUTHORIZE_WAITING, ""),
            "status = 'waiting_for_approval'"
        );
        assert_eq!(
            leaves(&SUSPEND, ""),
            "status = 'running' AND suspended_kind IS NULL"
        );
        assert_eq!(
            leaves(&COMPLETE_SUSPENDED, "t."),
            "t.status = 'running' AND t.suspended_kind IS NOT NULL"
        );
        assert_eq!(
            leaves(&TAKE_OVER, "i."),
            "i.status IN ('authorized', 'running') \
             AND (i.status <> 'running' OR i.suspended_kind IS NULL)"
        );
    }

    #[test]
    fn plans_refuse_unknown_and_changed_migrations() {
        let known = [Migration {
            version: 1,
            description: "a",
            sql: "select 1",
        }];
        assert_eq!(plan(&known, &[]).unwrap().len(), 1);
        assert!(
            plan(&known, &[(1, known[0].checksum())])
                .unwrap()
                .is_empty()
        );
        assert!(matches!(
            plan(&known, &[(1, "other".into())]),
            Err(StoreError::Migration { version: 1, .. })
        ));
        assert!(matches!(
            plan(&known, &[(2, "x".into())]),
            Err(StoreError::Migration { version: 2, .. })
        ));
    }

    #[test]
    fn versions_ascend_and_backends_match() {
        for migrations in [POSTGRES_MIGRATIONS, SQLITE_MIGRATIONS] {
            for pair in migrations.windows(2) {
                assert!(pair[0].version < pair[1].version);
            }
        }
        let versions = |m: &[Migration]| m.iter().map(|m| m.version).collect::<Vec<_>>();
        assert_eq!(versions(POSTGRES_MIGRATIONS), versions(SQLITE_MIGRATIONS));
    }
}
