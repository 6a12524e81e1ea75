//! The default `PolicyEngine`: a rule file, read once at start-up.
//!
//! Per-name rules are tried first, in file order; then the file's matrix
//! rows over side effect, risk and origin trust; then the built-in matrix:
//! reads and workspace writes are allowed, external writes need approval
//! unless they are low-risk and the turn saw nothing below USER.

use std::path::Path;

use serde::Deserialize;

use crate::domain::glob_matches;
use crate::domain::names::SKILL_MANAGE;
use crate::domain::policy::{PolicyDecision, ProposedAction};
use crate::domain::{ReasonCode, RiskLevel, SideEffectClass, TrustLevel};
use crate::ports::{BoxFuture, PolicyEngine};

/// Why a rule file cannot be used. Names the place, never a value.
#[derive(Debug, thiserror::Error)]
pub enum PolicyFileError {
    /// The file cannot be read.
    #[error("cannot read the policy file: {0}")]
    Read(std::io::ErrorKind),
    /// The file does not match the rule-file schema.
    #[error("{path}: {message}")]
    Schema {
        /// Where in the file.
        path: String,
        /// What is wrong.
        message: String,
    },
}

/// What a rule decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Proceed.
    Allow,
    /// Refuse.
    Deny,
    /// Ask a human first.
    RequireApproval,
}

/// Which request trust a matrix row applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// Any origin.
    #[default]
    Any,
    /// The turn saw nothing below USER.
    Trusted,
    /// The turn saw something below USER.
    Untrusted,
}

/// A per-name rule.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Globs over registry names.
    pub tools: Vec<String>,
    /// When given, the rule covers only a call that has one of these
    /// arguments and did not get it from the user (its label is below
    /// `user`, as an unlabelled argument's is): a recipient an injected page
    /// supplied is not the user's choice. A call without any of them is
    /// not covered: it names no recipient to doubt.
    #[serde(default)]
    pub untrusted_arguments: Vec<String>,
    /// The decision for a match.
    pub decision: Decision,
}

/// A matrix row.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatrixRow {
    /// The side effect it covers.
    pub side_effect: SideEffectClass,
    /// The risk it covers; any when absent.
    #[serde(default)]
    pub risk: Option<RiskLevel>,
    /// The origin it covers.
    #[serde(default)]
    pub origin: Origin,
    /// As a rule's: when given, the row covers only a call that has one of
    /// these arguments and did not get it from the user.
    #[serde(default)]
    pub untrusted_arguments: Vec<String>,
    /// The decision for a match.
    pub decision: Decision,
}

/// Whether `names` is empty (no argument condition) or one of them is
/// labelled below `user` in `action`.
fn arguments_match(names: &[String], action: &ProposedAction<'_>) -> bool {
    names.is_empty()
        || names.iter().any(|name| {
            action.arguments.get(name).is_some()
                && action.argument_trust.of(name) < TrustLevel::User
        })
}

/// The rule file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleFile {
    /// Per-name rules, first match wins.
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// Matrix rows, first match wins, before the built-in matrix.
    #[serde(default)]
    pub matrix: Vec<MatrixRow>,
    /// Says the file means to have no rules (the built-in matrix alone):
    /// without it, a file with none is refused, so an emptied or truncated
    /// file never replaces the rules in force with fewer.
    #[serde(default)]
    pub no_rules: bool,
}

/// The rule-file policy engine.
#[derive(Debug, Clone, Default)]
pub struct RuleFilePolicy {
    file: RuleFile,
}

impl RuleFilePolicy {
    /// The engine with no rule file: the built-in matrix alone.
    pub fn built_in() -> Self {
        RuleFilePolicy::default()
    }

    /// Reads and parses a rule file.
    pub fn load(path: &Path) -> Result<Self, PolicyFileError> {
        let text =
            std::fs::read_to_string(path).map_err(|error| PolicyFileError::Read(error.kind()))?;
        Self::parse(&text)
    }

    /// Parses rule-file text.
    pub fn parse(text: &str) -> Result<Self, PolicyFileError> {
        let deserializer =
            toml::Deserializer::parse(text).map_err(|error| PolicyFileError::Schema {
                path: "(file)".into(),
                message: error.message().to_owned(),
            })?;
        let file: RuleFile = serde_path_to_error::deserialize(deserializer).map_err(|error| {
            PolicyFileError::Schema {
                path: error.path().to_string(),
                message: error.inner().message().to_owned(),
            }
        })?;
        let empty = file.rules.is_empty() && file.matrix.is_empty();
        match (empty, file.no_rules) {
            (true, false) => Err(PolicyFileError::Schema {
                path: "(file)".into(),
                message: "the file has no rules; write `no_rules = true` if it means the \
                          built-in matrix alone"
                    .into(),
            }),
            (false, true) => Err(PolicyFileError::Schema {
                path: "no_rules".into(),
                message: "the file says it has no rules, and has some".into(),
            }),
            _ => Ok(RuleFilePolicy { file }),
        }
    }

    /// The decision for an action; synchronous, microseconds.
    pub fn decide(&self, action: &ProposedAction<'_>) -> PolicyDecision {
        // An agent whose turn saw untrusted content cannot write a skill
        // in that turn (Section 30.3): built in, ahead of the file's rules,
        // so no file loosens it.
        if action.tool == SKILL_MANAGE && action.origin_trust < TrustLevel::User {
            return PolicyDecision::Deny(ReasonCode::PolicyRuleDenied);
        }
        for rule in &self.file.rules {
            if rule
                .tools
                .iter()
                .any(|pattern| glob_matches(pattern, action.tool))
                && arguments_match(&rule.untrusted_arguments, action)
            {
                return match rule.decision {
                    Decision::Allow => PolicyDecision::Allow,
                    Decision::Deny => PolicyDecision::Deny(ReasonCode::PolicyRuleDenied),
                    Decision::RequireApproval => {
                        PolicyDecision::RequireApproval(ReasonCode::PolicyRuleApprovalRequired)
                    }
                };
            }
        }
        let trusted = action.origin_trust >= TrustLevel::User;
        let matrix_row = self.file.matrix.iter().find(|row| {
            row.side_effect == action.side_effect
                && row.risk.is_none_or(|risk| risk == action.risk)
                && match row.origin {
                    Origin::Any => true,
                    Origin::Trusted => trusted,
                    Origin::Untrusted => !trusted,
                }
                && arguments_match(&row.untrusted_arguments, action)
        });
        let decision = match matrix_row {
            Some(row) => row.decision,
            None => built_in_matrix(action.side_effect, action.risk, trusted),
        };
        match decision {
            Decision::Allow => PolicyDecision::Allow,
            Decision::Deny => PolicyDecision::Deny(ReasonCode::PolicyMatrixDenied),
            Decision::RequireApproval if action.side_effect == SideEffectClass::ExternalWrite => {
                PolicyDecision::RequireApproval(ReasonCode::PolicyMatrixExternalWrite)
            }
            Decision::RequireApproval => {
                PolicyDecision::RequireApproval(ReasonCode::PolicyMatrixApprovalRequired)
            }
        }
    }
}

fn built_in_matrix(side_effect: SideEffectClass, risk: RiskLevel, trusted: bool) -> Decision {
    match side_effect {
        SideEffectClass::None
        | SideEffectClass::WorkspaceRead
        | SideEffectClass::WorkspaceWrite
        | SideEffectClass::NetworkRead
        | SideEffectClass::ExternalRead => Decision::Allow,
        SideEffectClass::ExternalWrite if risk == RiskLevel::Low && trusted => Decision::Allow,
        SideEffectClass::ExternalWrite => Decision::RequireApproval,
    }
}

impl PolicyEngine for RuleFilePolicy {
    fn evaluate<'a>(&'a self, action: &'a ProposedAction<'a>) -> BoxFuture<'a, PolicyDecision> {
        Box::pin(std::future::ready(self.decide(action)))
    }
}

/// A rule file that can be read again while toolgate runs (on SIGHUP): the
/// new file is parsed and validated whole before it replaces the old one,
/// so a bad file leaves the rules in force as they were.
pub struct ReloadablePolicy {
    path: std::path::PathBuf,
    current: std::sync::RwLock<std::sync::Arc<RuleFilePolicy>>,
}

impl ReloadablePolicy {
    /// The rules in `path`, read now.
    pub fn load(path: &Path) -> Result<Self, PolicyFileError> {
        Ok(ReloadablePolicy {
            path: path.to_path_buf(),
            current: std::sync::RwLock::new(std::sync::Arc::new(RuleFilePolicy::load(path)?)),
        })
    }

    /// The rules file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the file again; on any error the old rules stay in force.
    pub fn reload(&self) -> Result<(), PolicyFileError> {
        let fresh = std::sync::Arc::new(RuleFilePolicy::load(&self.path)?);
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = fresh;
        Ok(())
    }

    fn rules(&self) -> std::sync::Arc<RuleFilePolicy> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl PolicyEngine for ReloadablePolicy {
    fn evaluate<'a>(&'a self, action: &'a ProposedAction<'a>) -> BoxFuture<'a, PolicyDecision> {
        Box::pin(std::future::ready(self.rules().decide(action)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{ArgumentTrust, IdempotencyClass, Principal, ToolKind, ToolSource};

    static UNLABELLED: std::sync::LazyLock<ArgumentTrust> =
        std::sync::LazyLock::new(ArgumentTrust::default);
    static MAIL: std::sync::LazyLock<serde_json::Value> =
        std::sync::LazyLock::new(|| serde_json::json!({"to": "a@example.com", "body": "hi"}));

    #[test]
    fn a_rule_on_arguments_covers_a_call_whose_named_argument_the_user_did_not_give() {
        let policy = RuleFilePolicy::parse(
            "[[rules]]\ntools = [\"mail.send\"]\nuntrusted_arguments = [\"to\"]\n\
             decision = \"require_approval\"\n\n[[rules]]\ntools = [\"mail.*\"]\ndecision = \"allow\"\n",
        )
        .unwrap();
        let p = Principal {
            id: "p".into(),
            scopes: Default::default(),
        };
        let labelled = |to: TrustLevel| {
            ArgumentTrust::from_pointers([("/to", to), ("/body", TrustLevel::User)]).unwrap()
        };
        let decide = |trust: &ArgumentTrust, arguments: &serde_json::Value| {
            let mut action = action(
                &p,
                "mail.send",
                SideEffectClass::ExternalWrite,
                RiskLevel::High,
                TrustLevel::User,
            );
            action.argument_trust = trust;
            action.arguments = arguments;
            policy.decide(&action)
        };
        let required = PolicyDecision::RequireApproval(ReasonCode::PolicyRuleApprovalRequired);
        assert_eq!(
            decide(&UNLABELLED, &MAIL),
            required,
            "unlabelled: the model's"
        );
        assert_eq!(
            decide(&labelled(TrustLevel::ExternalUntrusted), &MAIL),
            required
        );
        assert_eq!(decide(&labelled(TrustLevel::InternalTool), &MAIL), required);
        assert_eq!(
            decide(&labelled(TrustLevel::User), &MAIL),
            PolicyDecision::Allow,
            "the user's recipient: the next rule"
        );
        // A call that names no recipient at all has none to doubt.
        assert_eq!(
            decide(&UNLABELLED, &serde_json::json!({"body": "hi"})),
            PolicyDecision::Allow,
            "no recipient: the next rule"
        );
    }

    fn action<'a>(
        principal: &'a Principal,
        tool: &'a str,
        side_effect: SideEffectClass,
        risk: RiskLevel,
        origin: TrustLevel,
    ) -> ProposedAction<'a> {
        ProposedAction {
            tenant_id: "t",
            principal,
            tool,
            kind: ToolKind::Capability,
            source: ToolSource::Builtin,
            side_effect,
            risk,
            idempotency: IdempotencyClass::NonIdempotent,
            origin_trust: origin,
            argument_trust: &UNLABELLED,
            arguments: &MAIL,
        }
    }

    #[test]
    fn a_skill_is_never_written_from_a_turn_that_saw_untrusted_content() {
        let p = Principal {
            id: "p".into(),
            scopes: Default::default(),
        };
        // Not even a file allowing it loosens the rule.
        let policy =
            RuleFilePolicy::parse("[[rules]]\ntools = [\"skill.manage\"]\ndecision = \"allow\"\n")
                .unwrap();
        for engine in [RuleFilePolicy::built_in(), policy] {
            for origin in [TrustLevel::ExternalUntrusted, TrustLevel::InternalTool] {
                assert_eq!(
                    engine.decide(&action(
                        &p,
                        "skill.manage",
                        SideEffectClass::WorkspaceWrite,
                        RiskLevel::High,
                        origin
                    )),
                    PolicyDecision::Deny(ReasonCode::PolicyRuleDenied)
                );
            }
            assert_eq!(
                engine.decide(&action(
                    &p,
                    "skill.manage",
                    SideEffectClass::WorkspaceWrite,
                    RiskLevel::High,
                    TrustLevel::User
                )),
                PolicyDecision::Allow
            );
        }
    }

    #[test]
    fn the_built_in_matrix() {
        let p = Principal {
            id: "p".into(),
            scopes: Default::default(),
        };
        let policy = RuleFilePolicy::built_in();
        use SideEffectClass::*;
        assert_eq!(
            policy.decide(&action(
                &p,
                "demo.echo",
                None,
                RiskLevel::Low,
                TrustLevel::ExternalUntrusted
            )),
            PolicyDecision::Allow
        );
        assert_eq!(
            policy.decide(&action(
                &p,
                "x.y",
                ExternalWrite,
                RiskLevel::Low,
                TrustLevel::User
            )),
            PolicyDecision::Allow
        );
        assert_eq!(
            policy.decide(&action(
                &p,
                "x.y",
                ExternalWrite,
                RiskLevel::Low,
                TrustLevel::ExternalUntrusted
            )),
            PolicyDecision::RequireApproval(ReasonCode::PolicyMatrixExternalWrite)
        );
        assert_eq!(
            policy.decide(&action(
                &p,
                "x.y",
                ExternalWrite,
                RiskLevel::High,
                TrustLevel::Platform
            )),
            PolicyDecision::RequireApproval(ReasonCode::PolicyMatrixExternalWrite)
        );
    }

    #[test]
    fn rules_then_matrix_then_built_in() {
        let policy = RuleFilePolicy::parse(
            r#"
            [[rules]]
            tools = ["demo.forbidden*"]
            decision = "deny"

            [[rules]]
            tools = ["demo.external_write"]
            decision = "allow"

            [[matrix]]
            side_effect = "external_read"
            origin = "untrusted"
            decision = "require_approval"

            [[matrix]]
            side_effect = "external_write"
            risk = "high"
            decision = "deny"
            "#,
        )
        .unwrap();
        let p = Principal {
            id: "p".into(),
            scopes: Default::default(),
        };
        use SideEffectClass::*;
        assert_eq!(
            policy.decide(&action(
                &p,
                "demo.forbidden_thing",
                None,
                RiskLevel::Low,
                TrustLevel::Platform
            )),
            PolicyDecision::Deny(ReasonCode::PolicyRuleDenied)
        );
        assert_eq!(
            policy.decide(&action(
                &p,
                "demo.external_write",
                ExternalWrite,
                RiskLevel::High,
                TrustLevel::ExternalUntrusted
            )),
            PolicyDecision::Allow
        );
        assert_eq!(
            policy.decide(&action(
                &p,
                "mcp.a.read",
                ExternalRead,
                RiskLevel::Low,
                TrustLevel::ExternalUntrusted
            )),
            PolicyDecision::RequireApproval(ReasonCode::PolicyMatrixApprovalRequired)
        );
        assert_eq!(
            policy.decide(&action(
                &p,
                "mcp.a.read",
                ExternalRead,
                RiskLevel::Low,
                TrustLevel::User
            )),
            PolicyDecision::Allow
        );
        assert_eq!(
            policy.decide(&action(
                &p,
                "mcp.a.write",
                ExternalWrite,
                RiskLevel::High,
                TrustLevel::User
            )),
            PolicyDecision::Deny(ReasonCode::PolicyMatrixDenied)
        );
    }

    /// An emptied file (nothing, comments, whitespace) is refused, at load
    /// and on reload, so a reload never fails open; a file that says it has
    /// no rules is the built-in matrix alone.
    #[test]
    fn a_file_with_no_rules_must_say_so() {
        for empty in [
            "",
            "\n\n",
            "# all rules removed\n# (on purpose?)\n",
            "  \t\n",
        ] {
            let error = RuleFilePolicy::parse(empty).unwrap_err();
            assert!(error.to_string().contains("no_rules = true"), "{error}");
        }
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("policy.toml");
        std::fs::write(
            &path,
            "[[rules]]\ntools = [\"demo.read\"]\ndecision = \"deny\"\n",
        )
        .unwrap();
        let reloadable = ReloadablePolicy::load(&path).unwrap();
        let principal = Principal {
            id: "p".into(),
            scopes: Default::default(),
        };
        let read = |policy: &ReloadablePolicy| {
            policy.rules().decide(&action(
                &principal,
                "demo.read",
                SideEffectClass::ExternalRead,
                RiskLevel::Low,
                TrustLevel::User,
            ))
        };
        assert_eq!(
            read(&reloadable),
            PolicyDecision::Deny(ReasonCode::PolicyRuleDenied)
        );
        std::fs::write(&path, "# emptied\n").unwrap();
        assert!(reloadable.reload().is_err());
        assert_eq!(
            read(&reloadable),
            PolicyDecision::Deny(ReasonCode::PolicyRuleDenied),
            "the rules in force stay"
        );
        std::fs::write(&path, "no_rules = true\n").unwrap();
        reloadable.reload().unwrap();
        assert_eq!(read(&reloadable), PolicyDecision::Allow);
        assert!(
            RuleFilePolicy::parse(
                "no_rules = true\n[[rules]]\ntools = [\"x\"]\ndecision = \"deny\"\n"
            )
            .is_err()
        );
    }

    #[test]
    fn a_bad_file_names_the_place() {
        let error = RuleFilePolicy::parse("[[rules]]\ntools = [\"x.*\"]\ndecision = \"maybe\"\n")
            .unwrap_err();
        assert!(
            error.to_string().starts_with("rules[0].decision"),
            "{error}"
        );
        assert!(
            RuleFilePolicy::parse(
                "[[matrix]]\nside_effect = \"none\"\ndecision = \"allow\"\nextra = 1\n"
            )
            .is_err()
        );
    }
}
