//! The app in-process: built from its configuration, spawned, and drained
//! while a call is in flight, with no child process between the test and
//! the node.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolgate::app::{self, ServeOptions};
use toolgate::config::Config;
use toolgate::ports::SystemClock;
use uuid::Uuid;

use crate::serve::{TENANT, post_json as post};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_built_in_process_drains_with_a_call_in_flight() {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("toolgate.toml");
    std::fs::write(
        &path,
        r#"
[control]
socket = "run/control.sock"

[bridge]
directory = "run/turns"

[store]
url = "sqlite://toolgate.db"

[artifacts]
directory = "state/artifacts"

[node]
directory = "state/node"
"#,
    )
    .unwrap();
    let environment = BTreeMap::new();
    let config = Config::load(&path, &environment).unwrap();
    let socket = config.control.socket.clone();
    // The test binds the node's listeners itself, as a caller may.
    let listeners = app::Listeners::bind(&config, &environment).await.unwrap();
    let built = app::build(
        config,
        &environment,
        ServeOptions {
            migrate: true,
            ..ServeOptions::default()
        },
        Arc::new(SystemClock),
    )
    .await
    .unwrap();
    // Built is not served: the socket is bound, nothing answers on it yet.
    assert!(socket.exists());
    let running = built.spawn(listeners);

    let opened = {
        let socket = socket.clone();
        tokio::task::spawn_blocking(move || {
            let session_id = Uuid::new_v4();
            let (status, body) = post(
                &socket,
                "/v1/sessions",
                &json!({
                    "session_id": session_id,
                    "tenant_id": TENANT,
                    "principal": {"id": "user-1", "scopes": ["demo.use"]},
                    "agent": {"tools": ["demo.*"]},
                }),
            );
            assert_eq!(status, 200, "{body}");
            session_id
        })
        .await
        .unwrap()
    };
    let run_id = Uuid::new_v4();
    let call = {
        let socket = socket.clone();
        tokio::task::spawn_blocking(move || {
            post(
                &socket,
                "/v1/calls",
                &json!({
                    "session_id": opened, "run_id": run_id, "step_number": 1,
                    "origin_trust": "user",
                    "calls": [{"call_id": "slow", "name": "demo.wait", "arguments": {"milliseconds": 1500}}]
                }),
            )
        })
    };
    // The call is in flight when the drain starts (its row says it
    // runs); the drain waits for it, and nothing forces it to stop.
    let waited = tokio::time::Instant::now();
    loop {
        let socket = socket.clone();
        let running = tokio::task::spawn_blocking(move || {
            let (_, _, rows) = crate::serve::http(
                &socket,
                "GET",
                &format!("/v1/runs/{run_id}/invocations?tenant_id={TENANT}"),
                &[],
                None,
            );
            crate::serve::json_of(&rows)["invocations"][0]["status"] == "running"
        })
        .await
        .unwrap();
        if running {
            break;
        }
        assert!(waited.elapsed() < Duration::from_secs(30), "the call runs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = tokio::time::Instant::now();
    running
        .drain(std::future::pending(), false)
        .await
        .expect("the drain ends the node cleanly");
    let drained = started.elapsed();
    let (status, body) = call.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["results"][0]["outcome"]["status"], "succeeded",
        "{body}"
    );
    assert!(
        drained >= Duration::from_millis(900),
        "the drain waited for the call: {drained:?}"
    );
    // Drained: the socket is gone, and the node's lock is free for the
    // next process.
    assert!(!socket.exists(), "the control socket is removed");
    let again = Config::load(&path, &environment).unwrap();
    let rebuilt = app::build(
        again,
        &environment,
        ServeOptions::default(),
        Arc::new(SystemClock),
    )
    .await
    .expect("the same node starts again once drained");
    let listeners = rebuilt.bind().await.unwrap();
    rebuilt
        .spawn(listeners)
        .drain(std::future::ready(()), false)
        .await
        .unwrap();
}
