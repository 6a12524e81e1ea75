//! Reloading a running node (`toolgate reload`, `POST /v1/reload`,
//! SIGHUP): the configuration file is read and validated again, and each
//! section is reported. The policy rules and the front door's credentials
//! (its API keys, inline and in their file, and its JWK set file) change
//! while the node runs; any other section changed in the file is reported
//! as waiting for a restart, never silently ignored.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;

use super::front_keys::{front_keys, key_entries};
use crate::adapters::policy::ReloadablePolicy;
use crate::config::{ApiKeyConfig, Config, FrontConfig};
use crate::domain::sha256_hex;
use crate::front::Front;
use crate::ports::tool::BoxFuture;
use crate::ports::{Reload, ReloadReport};

/// Sub-keys of `[front]` whose change is put in force by a reload.
const LIVE_FRONT_KEYS: [&str; 2] = ["api_keys", "api_keys_file"];

/// What a reload compares with and puts in force.
pub(super) struct Reloader {
    /// Where the configuration was read from; without it only the files
    /// the running configuration names are read again.
    path: Option<PathBuf>,
    environment: BTreeMap<String, String>,
    policy: Option<Arc<ReloadablePolicy>>,
    front: Option<Arc<Front>>,
    state: Mutex<InForce>,
}

/// The configuration in force, as the reports compare it.
struct InForce {
    /// The configuration, section by section, as JSON.
    sections: Value,
    /// `[front]` as it was read (its keys file and JWK set file).
    front: FrontConfig,
    /// The rules file's digest.
    policy_sha256: Option<String>,
    /// Each API key id and a digest of its entry.
    keys: BTreeMap<String, String>,
}

impl Reloader {
    pub(super) fn new(
        config: &Config,
        path: Option<PathBuf>,
        environment: &BTreeMap<String, String>,
        policy: Option<Arc<ReloadablePolicy>>,
        front: Option<Arc<Front>>,
    ) -> Reloader {
        Reloader {
            path,
            environment: environment.clone(),
            state: Mutex::new(InForce {
                sections: serde_json::to_value(config).unwrap_or(Value::Null),
                front: config.front.clone(),
                policy_sha256: policy_digest(config),
                keys: key_entries(&config.front)
                    .map(|entries| key_digests(&entries))
                    .unwrap_or_default(),
            }),
            policy,
            front,
        }
    }

    fn reload_now(&self) -> ReloadReport {
        let mut report = ReloadReport::default();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let read = match &self.path {
            Some(path) => match Config::load(path, &self.environment) {
                Ok(config) => Some(config),
                Err(errors) => {
                    // The file's errors name a field, never a value.
                    report.refused.extend(
                        errors
                            .0
                            .iter()
                            .map(|error| format!("{}: {error}", path.display())),
                    );
                    None
                }
            },
            None => None,
        };
        if let Some(config) = &read {
            let sections = serde_json::to_value(config).unwrap_or(Value::Null);
            for changed in changed_sections(&state.sections, &sections) {
                let live = self.front.is_some()
                    && changed
                        .strip_prefix("front.")
                        .is_some_and(|key| LIVE_FRONT_KEYS.contains(&key));
                if !live {
                    report.restart_required.push(changed);
                }
            }
            // What a reload puts in force becomes the configuration it
            // compares with; the rest stays as the node started.
            if let (Some(running), Some(read)) = (
                state
                    .sections
                    .get_mut("front")
                    .and_then(Value::as_object_mut),
                sections.get("front").and_then(Value::as_object),
            ) && self.front.is_some()
            {
                for key in LIVE_FRONT_KEYS {
                    match read.get(key) {
                        Some(value) => running.insert(key.to_owned(), value.clone()),
                        None => running.remove(key),
                    };
                }
                state.front.api_keys = config.front.api_keys.clone();
                state.front.api_keys_file = config.front.api_keys_file.clone();
            }
        }
        self.reload_policy(&mut state, &mut report);
        self.reload_front(&mut state, &mut report);
        report
    }

    /// The rules file, read again.
    fn reload_policy(&self, state: &mut InForce, report: &mut ReloadReport) {
        let Some(policy) = &self.policy else {
            return;
        };
        let name = format!("policy rules ({})", policy.path().display());
        match policy.reload() {
            Ok(()) => {
                let digest = file_digest(policy.path());
                if digest != state.policy_sha256 {
                    report.reloaded.push(name);
                    state.policy_sha256 = digest;
                } else {
                    report.unchanged.push(name);
                }
            }
            // The rules file's error names a line, never a secret.
            Err(error) => report.refused.push(format!("{name}: {error}")),
        }
    }

    /// The front door's API keys and JWK set file, read again.
    fn reload_front(&self, state: &mut InForce, report: &mut ReloadReport) {
        let Some(front) = &self.front else {
            return;
        };
        // Put in force whole or not at all: a key that does not validate
        // leaves every key in force as it was.
        match key_entries(&state.front) {
            Ok(entries) => {
                let digests = key_digests(&entries);
                front.credentials().replace_keys(front_keys(&entries));
                let change = key_change(&state.keys, &digests);
                if change.is_empty() {
                    report
                        .unchanged
                        .push(format!("front API keys ({})", digests.len()));
                } else {
                    report.reloaded.push(format!(
                        "front API keys ({} in force; {change})",
                        digests.len()
                    ));
                }
                state.keys = digests;
            }
            Err(errors) => report.refused.extend(
                errors
                    .0
                    .iter()
                    .map(|error| format!("front API keys (those in force stay): {error}")),
            ),
        }
        if let Some(file) = state
            .front
            .jwt
            .as_ref()
            .and_then(|jwt| jwt.jwks_file.as_ref())
        {
            let name = format!("front JWK set ({})", file.display());
            match front.credentials().reload_key_file() {
                Ok(()) => report.reloaded.push(format!("{name}, read again")),
                Err(error) => report
                    .refused
                    .push(format!("{name} (the set in force stays): {error}")),
            }
        }
    }
}

impl Reload for Reloader {
    fn reload(&self) -> BoxFuture<'_, ReloadReport> {
        Box::pin(async move { self.reload_now() })
    }
}

/// The sections that differ, top level by top level; `[front]` key by key,
/// since some of its keys change while the node runs.
fn changed_sections(running: &Value, read: &Value) -> Vec<String> {
    let empty = serde_json::Map::new();
    let (running, read) = (
        running.as_object().unwrap_or(&empty),
        read.as_object().unwrap_or(&empty),
    );
    let names: BTreeSet<&String> = running.keys().chain(read.keys()).collect();
    let mut changed = Vec::new();
    for name in names {
        let (before, after) = (running.get(name), read.get(name));
        if before == after {
            continue;
        }
        match (name.as_str(), before, after) {
            ("front", Some(Value::Object(before)), Some(Value::Object(after))) => {
                let keys: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
                changed.extend(
                    keys.into_iter()
                        .filter(|key| before.get(*key) != after.get(*key))
                        .map(|key| format!("front.{key}")),
                );
            }
            _ => changed.push(name.clone()),
        }
    }
    changed
}

/// Each key id and a digest of its whole entry.
fn key_digests(entries: &[ApiKeyConfig]) -> BTreeMap<String, String> {
    entries
        .iter()
        .map(|key| {
            let entry = serde_json::to_string(key).unwrap_or_default();
            (key.id.clone(), sha256_hex(entry.as_bytes()))
        })
        .collect()
}

/// "added a; removed b; replaced c", by key id; empty when nothing changed.
fn key_change(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> String {
    let added: Vec<&str> = after
        .keys()
        .filter(|id| !before.contains_key(*id))
        .map(String::as_str)
        .collect();
    let removed: Vec<&str> = before
        .keys()
        .filter(|id| !after.contains_key(*id))
        .map(String::as_str)
        .collect();
    let replaced: Vec<&str> = after
        .iter()
        .filter(|(id, digest)| before.get(*id).is_some_and(|was| was != *digest))
        .map(|(id, _)| id.as_str())
        .collect();
    [
        ("added", added),
        ("removed", removed),
        ("replaced", replaced),
    ]
    .into_iter()
    .filter(|(_, ids)| !ids.is_empty())
    .map(|(what, ids)| format!("{what} {}", ids.join(", ")))
    .collect::<Vec<_>>()
    .join("; ")
}

fn policy_digest(config: &Config) -> Option<String> {
    config.policy.file.as_deref().and_then(file_digest)
}

fn file_digest(path: &std::path::Path) -> Option<String> {
    std::fs::read(path).ok().map(|bytes| sha256_hex(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sections_are_compared_whole_and_front_key_by_key() {
        let running = json!({"console": {"listen": "a"}, "front": {"listen": "x", "api_keys": []},
                             "policy": {"file": "p"}});
        let read = json!({"console": {"listen": "b"}, "front": {"listen": "x", "api_keys": [1]},
                          "policy": {"file": "p"}, "ops": {}});
        assert_eq!(
            changed_sections(&running, &read),
            ["console", "front.api_keys", "ops"]
        );
        assert!(changed_sections(&running, &running).is_empty());
    }

    #[test]
    fn key_changes_name_ids_only() {
        let before: BTreeMap<String, String> =
            [("a".into(), "1".into()), ("b".into(), "2".into())].into();
        let after: BTreeMap<String, String> =
            [("b".into(), "3".into()), ("c".into(), "4".into())].into();
        assert_eq!(
            key_change(&before, &after),
            "added c; removed a; replaced b"
        );
        assert_eq!(key_change(&before, &before), "");
    }
}
