//! No tenant takes what belongs to another: identities that collide across
//! tenants, through the one pipeline on both stores.

use serde_json::json;
use toolgate::domain::{InvocationStatus, ReasonCode, ToolOutcomeStatus};

use crate::pipeline::{TENANT, allow_all, finished, harness};
use crate::store::backends;

/// Two tenants whose calls derive the same idempotency key (the same run
/// id, step, call id, tool and arguments) both run, each as its own call:
/// neither is refused, neither learns of the other's, and each replay is
/// answered from its own tenant's row.
#[tokio::test]
async fn the_same_call_identity_in_two_tenants_runs_in_both() {
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let harness = harness(store.clone(), allow_all()).await;
        let mine = harness.request("demo.external_write", json!({"line": "same identity"}));
        let mut theirs = mine.clone();
        theirs.tenant_id = "tenant-other".into();
        let first = harness.pipeline.call(mine.clone()).await;
        let second = harness.pipeline.call(theirs.clone()).await;
        for outcome in [&first, &second] {
            assert_eq!(
                finished(outcome).outcome.status(),
                ToolOutcomeStatus::Succeeded,
                "{name}: {outcome:?}"
            );
        }
        assert_eq!(
            harness.lines("external.log"),
            vec!["same identity", "same identity"],
            "{name}: both ran"
        );
        let (ours_id, theirs_id) = (
            finished(&first).invocation_id.unwrap(),
            finished(&second).invocation_id.unwrap(),
        );
        assert_ne!(ours_id, theirs_id, "{name}");
        // Each tenant sees its own row only, and a replay in each is its own.
        assert!(store.invocation(TENANT, theirs_id).await.unwrap().is_none());
        assert!(
            store
                .invocation("tenant-other", ours_id)
                .await
                .unwrap()
                .is_none()
        );
        for (request, id) in [(mine, ours_id), (theirs, theirs_id)] {
            let tenant = request.tenant_id.clone();
            let replay = harness.pipeline.call(request).await;
            assert_eq!(finished(&replay).invocation_id, Some(id), "{name}");
            let row = store.invocation(&tenant, id).await.unwrap().unwrap();
            assert_eq!(row.status(), InvocationStatus::Succeeded, "{name}");
        }
        assert_eq!(harness.lines("external.log").len(), 2, "{name}: no rerun");
    }
}

/// The breaker counts a tenant's own calls: another tenant's identical
/// calls in a run of the same id never bring its loop detection closer.
#[tokio::test]
async fn the_breaker_counts_each_tenants_calls_apart() {
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let harness = harness(store.clone(), allow_all()).await;
        let request = harness.request("demo.echo", json!({"text": "again and again"}));
        let mut refused = None;
        for call in 0..8 {
            let mut ours = request.clone();
            ours.call_id = format!("ours-{call}");
            let outcome = harness.pipeline.call(ours).await;
            if finished(&outcome).outcome.reason_code() == Some(ReasonCode::ToolLoopDetected) {
                refused = Some(call);
                break;
            }
        }
        let refused = refused.unwrap_or_else(|| panic!("{name}: the loop was never detected"));
        let mut theirs = request.clone();
        theirs.tenant_id = "tenant-other".into();
        for call in 0..refused {
            theirs.call_id = format!("theirs-{call}");
            let outcome = harness.pipeline.call(theirs.clone()).await;
            assert_eq!(
                finished(&outcome).outcome.status(),
                ToolOutcomeStatus::Succeeded,
                "{name}: their call {call} counts only theirs: {outcome:?}"
            );
        }
    }
}

/// A PUT of a tenant server, answered: (status, body).
fn put_server(
    served: &crate::serve::Served,
    tenant: &str,
    server: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    let text = body.to_string();
    let (status, _, answer) = crate::serve::http(
        &served.socket,
        "PUT",
        &format!("/v1/tenants/{tenant}/mcp-servers/{server}"),
        &[],
        Some(text.as_bytes()),
    );
    (status, crate::serve::json_of(&answer))
}

/// A tenant's server row is held to the operator's ceilings when written,
/// as the operator's own servers are at load: an output limit or a timeout
/// past them is refused, naming the field (and not echoing the value).
#[test]
fn a_tenant_row_is_held_to_the_operators_ceilings() {
    let served = crate::serve::Served::here().start();
    let row = |output: u64, timeout: u32| {
        json!({"endpoint": "https://mcp.example.com/mcp", "required_scopes": ["mcp.big.use"],
               "maximum_output_bytes": output, "timeout_seconds": timeout})
    };
    let (status, body) = put_server(&served, "tenant-e2e", "big", &row(1_000_000_000_000, 30));
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("maximum_output_bytes:"), "{message}");
    assert!(!message.contains("1000000000000"), "{message}");
    let (status, body) = put_server(&served, "tenant-e2e", "big", &row(65_536, 1_000_000));
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("timeout_seconds:"),
        "{body}"
    );
    let (status, body) = put_server(&served, "tenant-e2e", "big", &row(65_536, 30));
    assert_eq!(status, 200, "{body}");
}

/// Every route takes a tenant id by one rule: NUL, empty, over-long and
/// other characters are a 400 naming `tenant_id`, never a store error or an
/// empty answer.
#[test]
fn every_route_holds_a_tenant_id_to_one_rule() {
    let served = crate::serve::Served::here().start();
    let long = "t".repeat(129);
    for tenant in ["%00", "", long.as_str(), "a%20b", "a%2Fb", "..", "%C3%A9"] {
        for path in [
            format!("/v1/approvals?status=pending&tenant_id={tenant}"),
            format!("/v1/review?tenant_id={tenant}"),
            format!("/v1/events?after=0&tenant_id={tenant}"),
            format!(
                "/v1/invocations/{}?tenant_id={tenant}",
                uuid::Uuid::new_v4()
            ),
            format!(
                "/v1/runs/{}/invocations?tenant_id={tenant}",
                uuid::Uuid::new_v4()
            ),
            format!("/v1/artifacts/{}?tenant_id={tenant}", uuid::Uuid::new_v4()),
            format!("/v1/invocations?tenant_id={tenant}"),
            format!("/v1/sessions?tenant_id={tenant}"),
            format!("/v1/turns?tenant_id={tenant}"),
            format!("/v1/mcp-servers?tenant_id={tenant}"),
            format!("/v1/catalog-generations?tenant_id={tenant}"),
            format!("/v1/tool-health?tenant_id={tenant}"),
        ] {
            let (status, body) = served.get(&path);
            let body = crate::serve::json_of(&body);
            assert_eq!(status, 400, "{path}: {body}");
            assert!(
                body["error"]["message"]
                    .as_str()
                    .is_some_and(|message| message.contains("tenant_id")),
                "{path}: {body}"
            );
        }
    }
    for tenant in ["%00", "a%20b"] {
        let (status, body) = put_server(
            &served,
            tenant,
            "acme",
            &json!({"endpoint": "https://mcp.example.com/mcp"}),
        );
        assert_eq!(status, 400, "{tenant}: {body}");
        let (status, _) = served.get(&format!("/v1/tenants/{tenant}/mcp-servers/acme"));
        assert_eq!(status, 400, "{tenant}");
    }
}

/// A tenant server the operator later gives the same id is kept as the
/// tenant wrote it (its GET still answers it) and the operator is told;
/// sessions use the operator's. A new tenant write of an operator's id is
/// refused.
#[test]
fn an_operator_server_of_a_tenants_id_leaves_the_tenants_row_alone() {
    let mut served = crate::serve::Served::start();
    let (status, body) = put_server(
        &served,
        "tenant-e2e",
        "later",
        &json!({"endpoint": "https://mcp.example.com/mcp", "required_scopes": ["mcp.later.use"]}),
    );
    assert_eq!(status, 200, "{body}");
    assert!(served.stop());
    // The operator adds a stdio server of that id.
    let config = served.folder.path().join("toolgate.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!(
            "{text}\n[[mcp.servers]]\nserver_id = \"later\"\ncommand = \"{}\"\n\
             env = {{ SCRIPTED_CATALOG = \"basic\" }}\nrequired_scopes = [\"mcp.later.use\"]\n",
            crate::mcp::scripted_server().display()
        ),
    )
    .unwrap();
    served.start_again();
    let session = uuid::Uuid::new_v4();
    let (status, body) = served.post(
        "/v1/sessions",
        &json!({"session_id": session, "tenant_id": "tenant-e2e",
                "principal": {"id": "u", "scopes": ["mcp.later.use"]},
                "agent": {"tools": ["mcp.later.*"]}}),
    );
    assert_eq!(status, 200, "{body}");
    assert!(
        body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|tool| tool["name"] == "mcp.later.echo"),
        "the operator's tools: {body}"
    );
    let (status, row) = served.get("/v1/tenants/tenant-e2e/mcp-servers/later");
    assert_eq!(status, 200, "the tenant's row is kept");
    assert_eq!(
        crate::serve::json_of(&row)["endpoint"],
        "https://mcp.example.com/mcp"
    );
    assert!(
        served
            .logs
            .lock()
            .unwrap()
            .contains("a tenant server has an operator server's id"),
        "the operator is told"
    );
    let (status, body) = put_server(
        &served,
        "tenant-e2e",
        "later",
        &json!({"endpoint": "https://mcp.example.com/mcp"}),
    );
    assert_eq!(status, 409, "{body}");
}

/// Tenants' silent servers never hold the preparation slots another
/// tenant's session waits for: the other's session, discovering a server
/// of its own, opens in the time that server takes.
#[test]
fn silent_tenants_servers_never_stall_anothers_session() {
    // Accepts connections and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let answering = crate::http::ScriptedHttp::start(&[]);
    let answering_port = answering.port;
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in silent.incoming().flatten() {
            held.push(stream);
        }
    });
    let served = crate::serve::Served::start_edited(
        move |_, config| {
            config.replace(
                "allow = [\"mcp.example.com\", \"*.auth.example.com\"]",
                &format!(
                    "allow = [\"mcp.example.com\", \"*.auth.example.com\", \"http://127.0.0.1:{port}\", \
                     \"http://127.0.0.1:{answering_port}\"]\nallow_cidrs = [\"127.0.0.1/32\"]"
                ),
            )
        },
        &[],
    );
    served.wait_ready();
    // One tenant with many servers that never answer, and three more with
    // a few each: together they could hold every shared slot.
    let noisy = [
        "tenant-noisy",
        "tenant-noisy-b",
        "tenant-noisy-c",
        "tenant-noisy-d",
    ];
    for (tenant, servers) in noisy.iter().zip([24, 4, 4, 4]) {
        for index in 0..servers {
            let (status, body) = put_server(
                &served,
                tenant,
                &format!("silent{index}"),
                &json!({"endpoint": format!("http://127.0.0.1:{port}/mcp")}),
            );
            assert_eq!(status, 200, "{body}");
        }
    }
    let (status, body) = put_server(
        &served,
        "tenant-quiet",
        "own",
        &json!({"endpoint": answering.url(), "side_effect": "none", "risk": "low",
                "idempotency": "read_only", "required_scopes": ["mcp.own.use"]}),
    );
    assert_eq!(status, 200, "{body}");
    let open = |tenant: &str| {
        let socket = served.socket.clone();
        let body = json!({"session_id": uuid::Uuid::new_v4(), "tenant_id": tenant,
                          "principal": {"id": "u", "scopes": ["mcp.reads.use", "mcp.own.use"]},
                          "agent": {"tools": ["mcp.reads.*", "mcp.own.*"]}})
        .to_string();
        std::thread::spawn(move || {
            let started = std::time::Instant::now();
            let (status, _, _) = crate::serve::http(
                &socket,
                "POST",
                "/v1/sessions",
                &[("Content-Type", "application/json")],
                Some(body.as_bytes()),
            );
            (status, started.elapsed())
        })
    };
    let waiting: Vec<_> = noisy.iter().map(|tenant| open(tenant)).collect();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (status, took) = open("tenant-quiet").join().unwrap();
    assert_eq!(status, 200);
    let (_, events) = served.get("/v1/events?after=0&tenant_id=tenant-quiet");
    assert!(
        String::from_utf8_lossy(&events).contains("\"server\":\"own\""),
        "the quiet tenant's own server was discovered"
    );
    assert!(
        took < std::time::Duration::from_secs(3),
        "the quiet tenant waited {took:?} behind the noisy one's servers"
    );
    // The noisy tenants' sessions are still waiting on their silent
    // servers: they are not waited for.
    drop(waiting);
    let mut served = served;
    served.kill();
}

/// A script reads its own run's artifacts only: an artifact another run of
/// the same tenant made is not found through this turn's socket, while the
/// control API (the operator) still reads it within its tenant.
#[test]
fn a_script_reads_only_its_own_runs_artifacts() {
    let served = crate::serve::Served::here().start();
    let session = served.session();
    let artifact_of = |run: uuid::Uuid| {
        // A large output, so an artifact is written for the run.
        let (status, body) = served.post(
            "/v1/calls",
            &json!({"session_id": session, "run_id": run, "step_number": 1,
                    "origin_trust": "user",
                    "calls": [{"call_id": "big", "name": "demo.echo",
                               "arguments": {"text": "x".repeat(20_000)}}]}),
        );
        assert_eq!(status, 200, "{body}");
        body["results"][0]["content"]
            .as_array()
            .and_then(|parts| parts.iter().find(|part| part["type"] == "artifact"))
            .and_then(|part| part["artifact_id"].as_str())
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("an artifact: {body}"))
    };
    let (mine, theirs) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let own = artifact_of(mine);
    let other = artifact_of(theirs);
    let (_, socket, token) = served.turn(session, mine, "reads artifacts", None);
    let authorization = format!("Bearer {token}");
    let read = |id: &str| {
        crate::serve::http(
            &socket,
            "GET",
            &format!("/v1/artifacts/{id}"),
            &[("Authorization", &authorization)],
            None,
        )
        .0
    };
    assert_eq!(read(&own), 200, "its own run's artifact");
    assert_eq!(read(&other), 404, "another run's is not found");
    let (status, _) = served.get(&format!(
        "/v1/artifacts/{other}?tenant_id={}",
        crate::serve::TENANT
    ));
    assert_eq!(status, 200, "the operator reads it within the tenant");
}

/// A tenant server's configuration with a misspelt field is refused naming
/// the field, where it was and what is taken there; a key that does not
/// read as a field name (a pasted token) is refused without being echoed.
#[test]
fn a_misspelt_server_field_is_named() {
    let served = crate::serve::Served::here().start();
    let (status, body) = put_server(
        &served,
        "tenant-e2e",
        "acme",
        &json!({"endpoint": "https://mcp.example.com/mcp", "timeout": 30}),
    );
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("unknown field `timeout` in the body; expected one of `endpoint`"),
        "{message}"
    );
    assert!(message.contains("`timeout_seconds`"), "{message}");
    let (status, body) = put_server(
        &served,
        "tenant-e2e",
        "acme",
        &json!({"endpoint": "https://mcp.example.com/mcp", "auth": {"scheme": "bearer", "Bearer sk-1": 1}}),
    );
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("unknown field in auth"), "{message}");
    assert!(!message.contains("sk-1"), "{message}");
}
