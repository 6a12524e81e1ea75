//! No tenant takes what belongs to another: identities that collide across
//! tenants, through the one pipeline on both stores.

use serde_json::json;
use toolgate::domain::{InvocationStatus, ToolOutcomeStatus};

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
            assert_eq!(row.status, InvocationStatus::Succeeded, "{name}");
        }
        assert_eq!(harness.lines("external.log").len(), 2, "{name}: no rerun");
    }
}
