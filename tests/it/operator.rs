//! The operator's lists over the control API of a real `toolgate serve`:
//! they span tenants, filter, page with a cursor that is stable while rows
//! are added, refuse a bad filter naming the field, and keep decisions
//! listable after they leave their queue.

use serde_json::{Value, json};
use uuid::Uuid;

use crate::serve::{Served, TENANT, json_of};

const OTHER: &str = "tenant-other";

/// Opens a session of `tenant` with demo and MCP tools.
fn session_of(served: &Served, tenant: &str) -> Uuid {
    let session_id = Uuid::new_v4();
    let (status, body) = served.post(
        "/v1/sessions",
        &json!({
            "session_id": session_id,
            "tenant_id": tenant,
            "principal": {"id": "user-1", "scopes": ["demo.use", "mcp.reads.use", "mcp.writes.use"]},
            "agent": {"tools": ["demo.*", "mcp.*"]},
        }),
    );
    assert_eq!(status, 200, "{body}");
    session_id
}

/// One call in its own step of a new run: the result entry.
fn call(served: &Served, session: Uuid, name: &str, arguments: Value) -> Value {
    let (status, body) = served.post(
        "/v1/calls",
        &json!({
            "session_id": session, "run_id": Uuid::new_v4(), "step_number": 1, "origin_trust": "user",
            "calls": [{"call_id": "c1", "name": name, "arguments": arguments}]
        }),
    );
    assert_eq!(status, 200, "{body}");
    body["results"][0].clone()
}

fn get(served: &Served, path: &str) -> Value {
    let (status, body) = served.get(path);
    let body = json_of(&body);
    assert_eq!(status, 200, "{path}: {body}");
    body
}

fn ids(list: &Value, key: &str, id: &str) -> Vec<String> {
    list[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} in {list}"))
        .iter()
        .map(|item| item[id].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn operator_lists_span_tenants_filter_and_page_with_a_stable_cursor() {
    let served = Served::here().start();
    let (mine, other) = (session_of(&served, TENANT), session_of(&served, OTHER));
    let mut made = Vec::new();
    for (session, text) in [
        (mine, "a"),
        (other, "b"),
        (mine, "c"),
        (other, "d"),
        (mine, "e"),
    ] {
        let result = call(&served, session, "demo.echo", json!({"text": text}));
        made.push(result["invocation_id"].as_str().unwrap().to_owned());
    }
    made.reverse();

    let all = get(&served, "/v1/invocations");
    assert_eq!(
        ids(&all, "invocations", "invocation_id"),
        made,
        "newest first, both tenants"
    );
    assert_eq!(all["next_cursor"], Value::Null);
    assert_eq!(all["invocations"][0]["arguments"], json!({"text": "e"}));
    let other_only = get(&served, &format!("/v1/invocations?tenant_id={OTHER}"));
    assert_eq!(
        ids(&other_only, "invocations", "invocation_id"),
        [made[1].clone(), made[3].clone()]
    );
    let none = get(
        &served,
        "/v1/invocations?tool_name=demo.time&status=succeeded",
    );
    assert_eq!(none["invocations"], json!([]));
    let succeeded = get(
        &served,
        "/v1/invocations?tool_name=demo.echo&status=succeeded",
    );
    assert_eq!(succeeded["invocations"].as_array().unwrap().len(), 5);
    let later = get(&served, "/v1/invocations?since=2999-01-01T00:00:00Z");
    assert_eq!(later["invocations"], json!([]));

    // Pages of two; a call made between pages lands before the first, so
    // the pages hold every earlier row once.
    let mut seen = Vec::new();
    let mut path = "/v1/invocations?limit=2".to_owned();
    loop {
        let page = get(&served, &path);
        let listed = ids(&page, "invocations", "invocation_id");
        assert!(listed.len() <= 2);
        seen.extend(listed);
        if seen.len() == 2 {
            call(&served, other, "demo.echo", json!({"text": "late"}));
        }
        match page["next_cursor"].as_str() {
            Some(cursor) => path = format!("/v1/invocations?limit=2&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(seen, made);

    // Sessions, with their pinned set.
    let sessions = get(&served, "/v1/sessions");
    let listed = ids(&sessions, "sessions", "session_id");
    assert_eq!(listed, [other.to_string(), mine.to_string()]);
    let tools = sessions["sessions"][0]["tools"].as_array().unwrap();
    assert!(tools.contains(&json!("demo.echo")), "{sessions}");
    assert_eq!(
        sessions["sessions"][0]["tool_schema_sha256"]
            .as_str()
            .unwrap()
            .len(),
        64
    );
    let mine_only = get(&served, &format!("/v1/sessions?tenant_id={TENANT}"));
    assert_eq!(
        ids(&mine_only, "sessions", "session_id"),
        [mine.to_string()]
    );

    // Servers per tenant, and their catalogs.
    let servers = get(&served, "/v1/mcp-servers?server_id=reads");
    let tenants: Vec<&str> = servers["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|server| server["tenant_id"].as_str().unwrap())
        .collect();
    assert!(
        tenants.contains(&TENANT) && tenants.contains(&OTHER),
        "{servers}"
    );
    assert_eq!(servers["servers"][0]["tenant_configured"], false);
    let generations = get(
        &served,
        &format!("/v1/catalog-generations?tenant_id={TENANT}&server_id=reads"),
    );
    let tools = generations["generations"][0]["tools"].as_array().unwrap();
    assert!(tools.contains(&json!("mcp.reads.echo")), "{generations}");

    // Health over the last hour, from the rows.
    let health = get(&served, "/v1/tool-health?window=hour&tool_name=demo.echo");
    assert_eq!(health["window"], "hour");
    assert_eq!(health["tools"][0]["calls"], 6, "{health}");
    assert!(health["tools"][0]["p50_ms"].is_number(), "{health}");
    assert!(health["tools"][0]["p99_ms"].is_number(), "{health}");
    assert_eq!(health["tools"][0]["uncertain"], 0);
}

#[test]
fn a_bad_filter_is_refused_naming_its_field() {
    let served = Served::here().start();
    for (path, field) in [
        ("/v1/invocations?limit=0", "limit"),
        ("/v1/invocations?limit=501", "limit"),
        ("/v1/invocations?limit=ten", "limit"),
        ("/v1/invocations?cursor=abc", "cursor"),
        ("/v1/approvals?cursor=1.zz", "cursor"),
        ("/v1/invocations?since=yesterday", "since"),
        ("/v1/review?until=2026-13-01", "until"),
        ("/v1/invocations?status=done", "status"),
        ("/v1/approvals?status=waiting", "status"),
        ("/v1/review?status=open", "status"),
        ("/v1/turns?status=pending", "status"),
        ("/v1/sessions?tenant_id=no%20spaces", "tenant_id"),
        ("/v1/tool-health?window=week", "window"),
        ("/v1/tool-health?tool_name=%01", "tool_name"),
    ] {
        let (status, body) = served.get(path);
        let body = json_of(&body);
        assert_eq!(status, 400, "{path}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request", "{path}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{path}: {message}");
    }
    let (status, _) = served.get("/v1/sessions?status=open");
    assert_eq!(status, 400, "a key the list does not take");
}

#[test]
fn decisions_stay_listable_with_who_decided_and_are_events_of_the_row() {
    let served = Served::here().start();
    let (mine, other) = (session_of(&served, TENANT), session_of(&served, OTHER));
    let held = call(
        &served,
        mine,
        "demo.external_write",
        json!({"line": "to approve"}),
    );
    let approval_id = held["pending"]["approval_id"]
        .as_str()
        .expect("held")
        .to_owned();
    let invocation_id = held["invocation_id"].as_str().unwrap().to_owned();

    // Pending, across tenants, with the call it would allow.
    let pending = get(&served, "/v1/approvals");
    assert_eq!(
        ids(&pending, "approvals", "approval_id"),
        std::slice::from_ref(&approval_id)
    );
    let item = &pending["approvals"][0];
    assert_eq!(item["arguments"], json!({"line": "to approve"}));
    assert_eq!(item["tenant_id"], TENANT);
    assert_eq!(item["side_effect"], "external_write");
    assert_eq!(item["origin_trust"], "user");
    assert_eq!(item["principal"]["id"], "user-1");
    assert_eq!(item["step_number"], 1);
    assert!(item["requested_at"].is_string() && item["run_id"].is_string());
    assert_eq!(item["approver"], Value::Null);
    let none = get(&served, &format!("/v1/approvals?tenant_id={OTHER}"));
    assert_eq!(none["approvals"], json!([]));

    let (status, body) = served.post(
        &format!("/v1/approvals/{approval_id}?tenant_id={TENANT}"),
        &json!({"decision": "approve", "approver": "ops@example.com"}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(get(&served, "/v1/approvals")["approvals"], json!([]));
    let approved = get(&served, "/v1/approvals?status=approved");
    let item = &approved["approvals"][0];
    assert_eq!(item["approval_id"], json!(approval_id));
    assert_eq!(item["approver"], "ops@example.com");
    assert!(item["decided_at"].is_string(), "{approved}");
    let all = get(&served, "/v1/approvals?status=all");
    assert_eq!(all["approvals"].as_array().unwrap().len(), 1);

    // The operator reads the row without naming its tenant, with its
    // events, the decision among them.
    let row = get(&served, &format!("/v1/invocations/{invocation_id}"));
    assert_eq!(row["tenant_id"], TENANT);
    let events: Vec<&str> = row["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|event| event["event_type"].as_str().unwrap())
        .collect();
    assert!(events.contains(&"approval.decided"), "{events:?}");
    assert!(
        events.iter().any(|kind| kind.starts_with("tool.call.")),
        "{events:?}"
    );
    let (status, _) = served.get(&format!(
        "/v1/invocations/{invocation_id}?tenant_id={OTHER}"
    ));
    assert_eq!(
        status, 404,
        "another tenant's row is not found under its name"
    );

    // An UNCERTAIN write leaves the queue resolved and stays listable.
    let uncertain = call(
        &served,
        other,
        "mcp.writes.write_then_die",
        json!({"line": "x"}),
    );
    assert_eq!(uncertain["outcome"]["status"], "uncertain", "{uncertain}");
    let uncertain_id = uncertain["invocation_id"].as_str().unwrap().to_owned();
    let queue = get(&served, "/v1/review");
    assert_eq!(
        ids(&queue, "uncertain", "invocation_id"),
        std::slice::from_ref(&uncertain_id)
    );
    assert_eq!(queue["uncertain"][0]["resolution"], Value::Null);
    assert_eq!(queue["uncertain"][0]["arguments"], json!({"line": "x"}));
    let (status, body) = served.post(
        &format!("/v1/review/{uncertain_id}?tenant_id={OTHER}"),
        &json!({"resolution": "effect_applied", "resolver": "oncall", "note": "one line landed"}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(get(&served, "/v1/review")["uncertain"], json!([]));
    let resolved = get(&served, "/v1/review?status=resolved");
    let resolution = &resolved["uncertain"][0]["resolution"];
    assert_eq!(resolution["resolution"], "effect_applied", "{resolved}");
    assert_eq!(resolution["resolver"], "oncall");
    assert_eq!(resolution["note"], "one line landed");
    assert!(resolution["resolved_at"].is_string());
    let row = get(&served, &format!("/v1/invocations/{uncertain_id}"));
    assert!(
        row["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|event| event["event_type"] == "review.resolved"
                && event["payload"]["resolver"] == "oncall"),
        "{row}"
    );
    let health = get(
        &served,
        &format!("/v1/tool-health?window=day&tenant_id={OTHER}"),
    );
    let write = health["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|tool| tool["tool_name"] == "mcp.writes.write_then_die")
        .expect("the write's health");
    assert_eq!(write["uncertain"], 1, "{health}");
    assert_eq!(write["failures"]["tool.outcome_unknown"], 1, "{health}");
}

#[test]
fn turns_are_listed_open_then_closed_with_an_absolute_socket_path() {
    let served = Served::here().start();
    let session = session_of(&served, TENANT);
    let (status, body) = served.post(
        "/v1/turns",
        &json!({
            "session_id": session, "run_id": Uuid::new_v4(), "step_number": 2,
            "script_sha256": "a".repeat(64),
        }),
    );
    assert_eq!(status, 200, "{body}");
    let socket = body["socket_path"].as_str().unwrap();
    assert!(std::path::Path::new(socket).is_absolute(), "{socket}");
    let turn_id = body["turn_id"].as_str().unwrap().to_owned();
    let open = get(&served, "/v1/turns?status=open");
    assert_eq!(
        ids(&open, "turns", "turn_id"),
        std::slice::from_ref(&turn_id)
    );
    assert_eq!(open["turns"][0]["step_number"], 2);
    assert_eq!(open["turns"][0]["closed_at"], Value::Null);
    let (status, _, _) = crate::serve::http(
        &served.socket,
        "DELETE",
        &format!("/v1/turns/{turn_id}"),
        &[],
        None,
    );
    assert_eq!(status, 200);
    assert_eq!(get(&served, "/v1/turns?status=open")["turns"], json!([]));
    let closed = get(&served, "/v1/turns?status=closed");
    assert_eq!(ids(&closed, "turns", "turn_id"), [turn_id]);
    assert!(closed["turns"][0]["closed_at"].is_string());
    assert_eq!(
        get(&served, "/v1/turns")["turns"].as_array().unwrap().len(),
        1
    );
}

/// Every counter a pinned tool moves by its name exists at 0 once a
/// session pins it, so `increase(...) > 0` sees the first UNCERTAIN call;
/// the process's CPU is a float counter in seconds.
#[test]
fn a_pinned_tools_counters_exist_at_zero_before_its_first_call() {
    let served = Served::here().start();
    session_of(&served, TENANT);
    let (status, body) = served.get("/metrics");
    assert_eq!(status, 200);
    let text = String::from_utf8(body).unwrap();
    for tool in [
        "name=\"demo.echo\",source=\"builtin\"",
        "name=\"mcp.writes.write_then_die\",source=\"mcp\"",
    ] {
        for series in [
            format!("toolgate_tool_uncertain_total{{{tool}}} 0\n"),
            format!("toolgate_tool_truncations_total{{{tool}}} 0\n"),
            format!("toolgate_tool_calls_total{{{tool},outcome_status=\"uncertain\"}} 0\n"),
            format!("toolgate_tool_calls_total{{{tool},outcome_status=\"succeeded\"}} 0\n"),
        ] {
            assert!(text.contains(&series), "{series} missing:\n{text}");
        }
    }
    assert!(text.contains("# TYPE toolgate_process_cpu_seconds counter"));
    let cpu = text
        .lines()
        .find_map(|line| line.strip_prefix("toolgate_process_cpu_seconds_total "))
        .expect("the CPU counter");
    assert!(cpu.contains('.'), "seconds with their fraction: {cpu}");
    assert!(cpu.parse::<f64>().unwrap() > 0.0, "{cpu}");
}

/// A finished call's log line carries its fields as plain values: the
/// invocation id as the id, never `Some(…)`.
#[test]
fn log_fields_are_plain_values() {
    let served = Served::start();
    let session = session_of(&served, TENANT);
    let result = call(&served, session, "demo.echo", json!({"text": "logged"}));
    let id = result["invocation_id"].as_str().unwrap().to_owned();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let line = loop {
        let logs = served.logs.lock().unwrap().clone();
        if let Some(line) = logs
            .lines()
            .find(|line| line.contains("tool call finished") && line.contains(&id))
        {
            break line.to_owned();
        }
        assert!(std::time::Instant::now() < deadline, "no log line:\n{logs}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(!line.contains("Some("), "{line}");
    let logged: Value = serde_json::from_str(&line).unwrap();
    let fields = logged.get("fields").unwrap_or(&logged);
    assert_eq!(fields["invocation_id"], json!(id), "{line}");
}
