//! The foundation's hard gates (design document, "Hard gates"): 1, 2, 4, 9,
//! 10 and 14. Gate 6 and 13 are the import-graph walk in `boundaries`.

use std::collections::BTreeSet;

use proptest::prelude::*;
use serde_json::{Value, json};
use toolgate::domain::egress::{AllowEntry, EgressAllowlist};
use toolgate::domain::environment::TIER0;
use toolgate::domain::mcp_server::{
    AuthFields, AuthScheme, RowViolation, Transport, validate_auth,
};
use toolgate::domain::names::{RESERVED_DOMAINS, mcp_registry_name, validate_registry_name};
use toolgate::domain::{
    ReasonCode, TargetKind, ToolOutcome, ToolOutcomeStatus, ToolSource, ToolSpec, TrustLevel,
    canonicalize,
};
use toolgate::pipeline::{RegistryLimits, RejectionReason, ToolRegistry};
use unicode_normalization::UnicodeNormalization;

use std::sync::Arc;

use toolgate::adapters::credentials::EnvFileResolver;
use toolgate::adapters::mcp::McpServerSet;
use toolgate::adapters::telemetry::MetricsRegistry;
use toolgate::config::DEFAULT_MAXIMUM_OUTPUT_BYTES_CEILING;
use toolgate::ports::SystemClock;

use crate::support::{builtin_spec, mcp_spec, tools};

/// Which rejection a bad spec must get.
type Expected = fn(&RejectionReason) -> bool;

const LIMITS: RegistryLimits = RegistryLimits {
    maximum_output_bytes_ceiling: 65536,
    tenant_catalog_tools: 10_000,
};

/// Gate 1: only specs passing registration validation are registered, and
/// every failing one is rejected with its reason.
#[test]
fn gate_01_every_registered_spec_passes_registration_validation() {
    let good = [
        builtin_spec("demo.echo"),
        builtin_spec("workspace.read_text"),
    ];
    let registry =
        ToolRegistry::with_builtins(LIMITS, tools(good.clone())).expect("valid builtins register");

    let mut bad_name = builtin_spec("demo.Echo");
    bad_name.name = "demo.Echo".into();
    let long_name = builtin_spec(&format!("demo.{}", "a".repeat(92)));
    let reserved = builtin_spec("mcp.acme.tool");
    let mut old_dialect = builtin_spec("demo.old");
    old_dialect.input_schema =
        json!({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"});
    let mut remote_ref = builtin_spec("demo.remote");
    remote_ref.input_schema =
        json!({"type": "object", "properties": {"a": {"$ref": "https://evil.example/s.json"}}});
    let mut over_ceiling = builtin_spec("demo.big");
    over_ceiling.maximum_output_bytes = LIMITS.maximum_output_bytes_ceiling + 1;
    let cases: Vec<(ToolSpec, Expected)> = vec![
        (bad_name, |r| matches!(r, RejectionReason::Name(_))),
        (long_name, |r| matches!(r, RejectionReason::Name(_))),
        (reserved, |r| {
            matches!(r, RejectionReason::ReservedDomain(_))
        }),
        (old_dialect, |r| {
            matches!(r, RejectionReason::InputSchema(_))
        }),
        (remote_ref, |r| matches!(r, RejectionReason::InputSchema(_))),
        (over_ceiling, |r| {
            matches!(r, RejectionReason::OutputCeiling { .. })
        }),
    ];
    for (spec, expected) in cases {
        let name = spec.name.clone();
        let error = ToolRegistry::with_builtins(LIMITS, tools([spec]))
            .err()
            .expect("an invalid spec is refused");
        let report = error.0;
        assert!(report.registered.is_empty(), "{name} registered");
        assert_eq!(report.rejected.len(), 1, "{name}");
        assert!(
            expected(&report.rejected[0].cause),
            "{name}: {}",
            report.rejected[0].reason
        );
        assert!(registry.get(&name, None).is_err());
    }

    // output_trust present: a declaration without one does not even parse.
    let mut without_trust = serde_json::to_value(builtin_spec("demo.untrusting")).unwrap();
    without_trust
        .as_object_mut()
        .unwrap()
        .remove("output_trust");
    assert!(serde_json::from_value::<ToolSpec>(without_trust).is_err());

    // What did register satisfies every rule.
    for spec in good {
        let registered = registry.get(&spec.name, None).expect("registered");
        assert_eq!(validate_registry_name(&registered.spec.name), Ok(()));
        assert!(!RESERVED_DOMAINS.contains(&registered.spec.domain()));
        assert!(registered.spec.maximum_output_bytes <= LIMITS.maximum_output_bytes_ceiling);
    }
}

/// Gate 1 over the build's own tool set: every builtin and control tool
/// `serve` registers passes registration validation (a rejection is a
/// start-up error), as registered, and the set is the one this test names,
/// so a tool added later is held to it too.
#[tokio::test]
async fn gate_01_the_builds_tool_set_passes_registration_validation() {
    let (store, folder) = crate::mcp::sqlite().await;
    let servers = Arc::new(McpServerSet::new(
        Vec::new(),
        Arc::new(EnvFileResolver::new(Default::default())),
        store.clone(),
        Arc::new(SystemClock),
        Arc::new(MetricsRegistry::default()),
    ));
    let limits = RegistryLimits {
        maximum_output_bytes_ceiling: DEFAULT_MAXIMUM_OUTPUT_BYTES_CEILING,
        tenant_catalog_tools: 10_000,
    };
    let build = || {
        toolgate::builtin::tools(
            &folder.path().join("demo"),
            servers.clone(),
            store.clone(),
            store.clone(),
            Arc::new(SystemClock),
        )
    };
    let names: BTreeSet<String> = build()
        .iter()
        .map(|tool| tool.spec().name.clone())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(
            [
                "context.update_working_state",
                "conversation.ask_user",
                "delegate.run",
                "demo.echo",
                "demo.external_write",
                "demo.keyed_write",
                "demo.set_value",
                "demo.wait",
                "skill.load",
                "skill.manage",
                "tool.call",
            ]
            .map(str::to_owned)
        )
    );
    let registry = match ToolRegistry::with_builtins(limits, build()) {
        Ok(registry) => registry,
        Err(error) => panic!("the build's tools fail registration: {}", error.0),
    };
    for tool in build() {
        // Each alone, too: no tool passes only beside another.
        let alone = ToolRegistry::with_builtins(limits, vec![tool.clone()]);
        assert!(alone.is_ok(), "{}", tool.spec().name);
        let registered = registry.get(&tool.spec().name, None).expect("registered");
        let spec = &registered.spec;
        assert_eq!(validate_registry_name(&spec.name), Ok(()));
        assert!(!RESERVED_DOMAINS.contains(&spec.domain()), "{}", spec.name);
        assert!(spec.maximum_output_bytes <= limits.maximum_output_bytes_ceiling);
        assert!(spec.timeout_seconds > 0, "{}", spec.name);
        assert!(!spec.description.is_empty(), "{}", spec.name);
        assert_eq!(spec.input_schema["type"], "object", "{}", spec.name);
    }
}

/// Gate 2: no MCP, device or sandbox tool keeps an output trust above
/// EXTERNAL_UNTRUSTED, whatever it declared.
#[test]
fn gate_02_forced_trust_table_holds() {
    let mut sandbox = builtin_spec("sandbox.run_command");
    sandbox.source = ToolSource::Sandbox;
    sandbox.target_kind = TargetKind::Sandbox;
    sandbox.output_trust = TrustLevel::Platform;
    let mut builtin = builtin_spec("demo.echo");
    builtin.output_trust = TrustLevel::TrustedConfiguration;
    let registry =
        ToolRegistry::with_builtins(LIMITS, tools([sandbox, builtin])).expect("builtins register");

    let mut mcp = mcp_spec("acme", "Create Ticket");
    mcp.output_trust = TrustLevel::Platform;
    let report = registry.register_dynamic(tools([mcp]), ToolSource::Mcp);
    assert!(report.rejected.is_empty(), "{report}");

    let mut device = builtin_spec("device.camera_snapshot");
    device.source = ToolSource::Device;
    device.device_id = Some("phone".into());
    device.target_kind = TargetKind::Device;
    device.output_trust = TrustLevel::User;
    let report = registry.register_dynamic(tools([device]), ToolSource::Device);
    assert!(report.rejected.is_empty(), "{report}");

    for name in [
        "sandbox.run_command",
        "mcp.acme.create_ticket",
        "device.camera_snapshot",
    ] {
        let spec = &registry.get(name, None).expect("registered").spec;
        assert!(
            spec.output_trust <= TrustLevel::ExternalUntrusted,
            "{name} kept {:?}",
            spec.output_trust
        );
    }
    // Builtins keep what they declared.
    assert_eq!(
        registry.get("demo.echo", None).unwrap().spec.output_trust,
        TrustLevel::TrustedConfiguration
    );
}

/// Gate 4: every non-success outcome is exactly six fields, and its message
/// matches the checked-in table for its code. The table is compared with a
/// second copy kept by hand (`tests/testdata/outcome-messages.tsv`), and the
/// outcomes and causes the document spells out with a verbatim copy of them
/// (`tests/testdata/outcome-examples.json`): not with itself.
#[test]
fn gate_04_outcome_is_six_fields_with_the_table_message() {
    let six: BTreeSet<&str> = [
        "status",
        "action",
        "reason_code",
        "message",
        "retryable",
        "remediation",
    ]
    .into();
    let table = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/testdata/outcome-messages.tsv"),
    )
    .expect("the second copy of the message table");
    let mut copied = std::collections::BTreeMap::new();
    for line in table
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
    {
        let fields: Vec<&str> = line.split('\t').collect();
        let [code, status, retryable, remediation, message] = fields[..] else {
            panic!("a row of five fields: {line:?}");
        };
        let row = json!({"status": status, "reason_code": code, "message": message,
            "retryable": retryable == "true", "remediation": remediation});
        assert!(
            copied.insert(code.to_owned(), row).is_none(),
            "{code} twice"
        );
    }
    let mut statuses = BTreeSet::new();
    for code in ReasonCode::ALL {
        let outcome = ToolOutcome::not_succeeded("mcp.acme.create_ticket", *code);
        let value = serde_json::to_value(&outcome).unwrap();
        let object = value.as_object().expect("an object");
        let keys: BTreeSet<&str> = object.keys().map(String::as_str).collect();
        assert_eq!(keys, six, "{code}");
        let mut expected = copied
            .remove(code.as_str())
            .unwrap_or_else(|| panic!("{code} is missing from the second copy"));
        expected["action"] = json!("mcp.acme.create_ticket");
        assert_eq!(value, expected, "{code}");
        // status first, as the bridge contract says.
        let text = serde_json::to_string(&outcome).unwrap();
        assert!(text.starts_with("{\"status\":"), "{text}");
        statuses.insert(code.status());
    }
    assert!(
        copied.is_empty(),
        "codes the copy has and the build does not: {:?}",
        copied.keys()
    );
    let expected: BTreeSet<ToolOutcomeStatus> = [
        ToolOutcomeStatus::Failed,
        ToolOutcomeStatus::Denied,
        ToolOutcomeStatus::Unavailable,
        ToolOutcomeStatus::Uncertain,
    ]
    .into();
    assert_eq!(statuses, expected, "every non-success status has codes");
    // What the document spells out, copied from it verbatim.
    let document: Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/testdata/outcome-examples.json"),
        )
        .expect("the document's examples"),
    )
    .expect("JSON");
    let by_name = |name: &str| {
        ReasonCode::ALL
            .iter()
            .copied()
            .find(|code| code.as_str() == name)
            .unwrap_or_else(|| panic!("the document's {name} is a code"))
    };
    let outcomes = document["outcomes"].as_array().expect("outcomes");
    assert_eq!(outcomes.len(), 4);
    for example in outcomes {
        let code = by_name(example["reason_code"].as_str().unwrap());
        let action = example["action"].as_str().unwrap();
        let value = serde_json::to_value(ToolOutcome::not_succeeded(action, code)).unwrap();
        assert_eq!(&value, example);
    }
    let causes = document["uncallable"].as_array().expect("causes");
    assert_eq!(causes.len(), 5);
    for cause in causes {
        let code = by_name(cause["reason_code"].as_str().unwrap());
        assert_eq!(json!(code.status().as_str()), cause["status"], "{cause}");
    }
}

/// A JSON value whose strings (keys included) are NFC, drawn from an
/// alphabet rich in characters with decompositions.
fn arbitrary_json() -> impl Strategy<Value = Value> {
    let alphabet = prop::sample::select(vec![
        'a', 'z', 'é', 'Å', 'ñ', 'ö', 'ế', '한', 'ǖ', '"', '\\', '\n', ' ', '😀', '\u{1}',
    ]);
    let text = prop::collection::vec(alphabet, 0..6).prop_map(|chars| {
        chars
            .into_iter()
            .collect::<String>()
            .nfc()
            .collect::<String>()
    });
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (-1.0e12f64..1.0e12)
            .prop_filter("no negative zero", |f| *f != 0.0 || f.is_sign_positive())
            .prop_map(Value::from),
        text.clone().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(text.clone(), inner, 0..5)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// Writes `value` as JSON text with object keys in an order chosen by
/// `order` and every string (keys included) decomposed where `decompose`
/// says, and integers sometimes spelled as floats: the same document to
/// anyone who reads JSON and Unicode correctly.
fn respell(value: &Value, order: &mut impl Iterator<Item = u64>, out: &mut String) {
    let string = |text: &str, out: &mut String, order: &mut dyn Iterator<Item = u64>| {
        let text: String = if order.next().unwrap_or(0).is_multiple_of(2) {
            text.nfd().collect()
        } else {
            text.to_owned()
        };
        out.push_str(&serde_json::to_string(&text).unwrap());
    };
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            // A permutation driven by the random stream.
            for index in (1..entries.len()).rev() {
                let pick = (order.next().unwrap_or(0) as usize) % (index + 1);
                entries.swap(index, pick);
            }
            out.push('{');
            for (index, (key, item)) in entries.into_iter().enumerate() {
                if index > 0 {
                    out.push_str(" , ");
                }
                string(key, out, order);
                out.push_str(" : ");
                respell(item, order, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push_str("[ ");
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                respell(item, order, out);
            }
            out.push(']');
        }
        Value::String(text) => string(text, out, order),
        Value::Number(number) if number.is_i64() && order.next().unwrap_or(0).is_multiple_of(3) => {
            let integer = number.as_i64().unwrap_or(0);
            if integer.unsigned_abs() <= 1 << 53 {
                out.push_str(&format!("{integer}.0"));
            } else {
                out.push_str(&number.to_string());
            }
        }
        other => out.push_str(&other.to_string()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Gate 9: the canonical form and hash are invariant under key
    /// reordering and Unicode recomposition.
    #[test]
    fn gate_09_canonical_form_is_invariant_under_reordering_and_recomposition(
        value in arbitrary_json(),
        stream in prop::collection::vec(any::<u64>(), 64..256),
    ) {
        let original = canonicalize(value.clone()).expect("generated values are canonicalizable");
        let mut text = String::new();
        respell(&value, &mut stream.iter().copied().cycle(), &mut text);
        let reparsed: Value = serde_json::from_str(&text).expect("respelled JSON parses");
        let respelled = canonicalize(reparsed).expect("respelled values canonicalize");
        prop_assert_eq!(&respelled.text, &original.text);
        prop_assert_eq!(&respelled.sha256, &original.sha256);
        // And the form is a fixed point.
        let again: Value = serde_json::from_str(&original.text).unwrap();
        prop_assert_eq!(canonicalize(again).unwrap().text, original.text.clone());
        // A different document hashes differently.
        let other = canonicalize(json!({"wrapped": value})).unwrap();
        prop_assert_ne!(other.sha256, original.sha256);
    }
}

/// Gate 10: a builtin in a reserved domain is a startup error, and no MCP
/// name can land outside the reserved `mcp` domain.
#[test]
fn gate_10_builtin_in_reserved_domain_is_a_startup_error() {
    for name in [
        "mcp.acme.create_ticket",
        "device.camera.snapshot",
        "mcp.workspace.write_text",
    ] {
        let error = ToolRegistry::with_builtins(
            LIMITS,
            tools([builtin_spec("demo.echo"), builtin_spec(name)]),
        )
        .err()
        .unwrap_or_else(|| panic!("{name} must not register"));
        let rejected: Vec<_> = error
            .0
            .rejected
            .iter()
            .map(|r| (&r.name, &r.cause))
            .collect();
        assert_eq!(rejected.len(), 1, "{rejected:?}");
        assert!(
            matches!(rejected[0].1, RejectionReason::ReservedDomain(domain) if RESERVED_DOMAINS.contains(&domain.as_str()))
        );
    }
    // Whatever a server calls its tool, its registry name is under mcp.
    for remote in [
        "workspace.write_text",
        "../../etc",
        "Demo Echo",
        "",
        "système.écrire",
        &"x".repeat(300),
    ] {
        let name = mcp_registry_name("acme", remote);
        assert!(name.starts_with("mcp.acme."), "{name}");
        assert_eq!(validate_registry_name(&name), Ok(()), "{name}");
        assert_eq!(name.matches('.').count(), 2, "{name}");
    }
}

fn row(transport: Transport, scheme: &'static str) -> AuthFields<'static> {
    AuthFields {
        transport,
        scheme,
        auth_name: None,
        credential_ref: None,
        token_endpoint: None,
    }
}

/// Gate 14: every invalid authentication row the document lists is refused,
/// over the validator alone (no server, no broker).
#[test]
fn gate_14_every_invalid_authentication_row_is_rejected() {
    let allowlist = EgressAllowlist::new(vec![AllowEntry::parse("auth.example.com").unwrap()]);
    let check = |fields: AuthFields<'_>| validate_auth(fields, &allowlist);

    // A scheme outside the closed five.
    for scheme in ["basic", "Bearer", "mtls", "", "oauth2"] {
        let fields = AuthFields {
            scheme,
            credential_ref: Some("env:T"),
            ..row(Transport::Http, "none")
        };
        assert_eq!(check(fields), vec![RowViolation::UnknownScheme], "{scheme}");
    }
    // A scheme on the wrong transport.
    let wrong = [
        (Transport::Http, "env", Some("API_TOKEN"), None),
        (Transport::Stdio, "bearer", None, None),
        (Transport::Stdio, "header", Some("X-Key"), None),
        (
            Transport::Stdio,
            "oauth2_client",
            None,
            Some("https://auth.example.com/token"),
        ),
    ];
    for (transport, scheme, auth_name, token_endpoint) in wrong {
        let fields = AuthFields {
            transport,
            scheme,
            auth_name,
            credential_ref: Some("env:T"),
            token_endpoint,
        };
        let parsed: AuthScheme = scheme.parse().unwrap();
        assert_eq!(
            check(fields),
            vec![RowViolation::WrongTransport {
                scheme: parsed,
                transport
            }],
            "{scheme}"
        );
    }
    // none with a credential reference.
    for transport in [Transport::Http, Transport::Stdio] {
        let fields = AuthFields {
            credential_ref: Some("env:T"),
            ..row(transport, "none")
        };
        assert_eq!(check(fields), vec![RowViolation::ReferenceWithNone]);
    }
    // Every other scheme without one.
    let bearer = row(Transport::Http, "bearer");
    assert_eq!(
        check(bearer),
        vec![RowViolation::ReferenceMissing(AuthScheme::Bearer)]
    );
    // header or env without a name.
    let header = AuthFields {
        credential_ref: Some("env:T"),
        ..row(Transport::Http, "header")
    };
    assert_eq!(
        check(header),
        vec![RowViolation::NameMissing(AuthScheme::Header)]
    );
    let env = AuthFields {
        credential_ref: Some("env:T"),
        ..row(Transport::Stdio, "env")
    };
    assert_eq!(check(env), vec![RowViolation::NameMissing(AuthScheme::Env)]);
    // A name outside the pattern.
    for name in ["", "has space", "a.b", &"x".repeat(65)] {
        let fields = AuthFields {
            auth_name: Some(name),
            ..header
        };
        assert_eq!(check(fields), vec![RowViolation::NameMalformed], "{name:?}");
    }
    // header naming Authorization, in any case.
    for name in ["Authorization", "authorization", "AUTHORIZATION"] {
        let fields = AuthFields {
            auth_name: Some(name),
            ..header
        };
        assert_eq!(
            check(fields),
            vec![RowViolation::HeaderIsAuthorization],
            "{name}"
        );
    }
    // env naming a tier-0 variable: every one on the list.
    for name in TIER0 {
        let fields = AuthFields {
            auth_name: Some(name),
            ..env
        };
        assert_eq!(check(fields), vec![RowViolation::EnvNameIsTier0], "{name}");
    }
    // oauth2_client without an endpoint, and with one egress refuses.
    let oauth = AuthFields {
        credential_ref: Some("file:/run/secrets/client"),
        ..row(Transport::Http, "oauth2_client")
    };
    assert_eq!(check(oauth), vec![RowViolation::TokenEndpointMissing]);
    for endpoint in [
        "https://evil.example.net/token",
        "http://auth.example.com/token",
        "https://auth.example.com:8443/token",
    ] {
        let fields = AuthFields {
            token_endpoint: Some(endpoint),
            ..oauth
        };
        assert!(
            matches!(
                check(fields).as_slice(),
                [RowViolation::TokenEndpointRefused(_)]
            ),
            "{endpoint}"
        );
    }
    // And the valid shape of each passes, so the refusals above are the rules'.
    let valid_oauth = AuthFields {
        token_endpoint: Some("https://auth.example.com/token"),
        ..oauth
    };
    assert_eq!(check(valid_oauth), vec![]);
    assert_eq!(
        check(AuthFields {
            auth_name: Some("MY_API_TOKEN"),
            ..env
        }),
        vec![]
    );
    assert_eq!(
        check(AuthFields {
            auth_name: Some("X-Api-Key"),
            ..header
        }),
        vec![]
    );
}
