//! The transition table holds every store: for each transition, from each
//! phase, with its guard holding and not, a row moves exactly when the
//! table says, into the phase the table names, and its holder becomes what
//! the table says. Run through the store port on both backends, so
//! PostgreSQL's functions (the claim, the watermark, the terminal write)
//! are held to it as well as the adapters' own statements.

use chrono::Duration;
use toolgate::domain::invocation::{Guard, Holder, Phase, SuspensionKind, TRANSITIONS, Transition};
use toolgate::domain::{Durability, ReasonCode};
use toolgate::ports::{Claim, Fence, InvocationRecord, Start, Store, TerminalRecord};
use uuid::Uuid;

use crate::store::{backends, insert, new_invocation, now, succeeded, worker};

const TENANT: &str = "tenant-a";

/// A fresh row in `phase`, inserted and moved there by `holder` (the worker
/// that holds it where a phase has one).
async fn row_in(store: &dyn Store, phase: Phase, holder: Uuid) -> InvocationRecord {
    let waiting = phase == Phase::Waiting || phase == Phase::Authorized;
    let start = if waiting {
        Start::Waiting {
            approval_id: Uuid::new_v4(),
            reason_code: ReasonCode::PolicyRuleApprovalRequired,
        }
    } else {
        Start::Running
    };
    let new = new_invocation(TENANT, Uuid::new_v4(), "call", start);
    let row = insert(store, &new, holder).await;
    let claim = Claim {
        worker_id: holder,
        now: now(),
    };
    match phase {
        Phase::Waiting | Phase::Running => {}
        Phase::Authorized => {
            store
                .authorize_waiting(TENANT, row.identity.id, claim, &[])
                .await
                .unwrap()
                .expect("authorized");
        }
        Phase::Suspended => {
            let fence = row.fence().expect("held");
            assert!(
                store
                    .suspend_invocation(
                        TENANT,
                        row.identity.id,
                        fence,
                        SuspensionKind::UserInput,
                        "q"
                    )
                    .await
                    .unwrap()
            );
        }
        Phase::Ended => {
            let fence = row.fence().expect("held");
            assert!(
                store
                    .complete_invocation(TENANT, row.identity.id, fence, &succeeded(), &[], now())
                    .await
                    .unwrap()
            );
        }
    }
    let row = store
        .invocation(TENANT, row.identity.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.state.phase(), phase, "set up in {phase:?}");
    row
}

/// Performs `transition` on `row` as `actor`, with `fence` where it takes
/// one: whether the store moved the row.
async fn perform(
    store: &dyn Store,
    transition: &Transition,
    row: &InvocationRecord,
    fence: Fence,
    actor: Uuid,
) -> bool {
    let claim = Claim {
        worker_id: actor,
        now: now(),
    };
    let ended = TerminalRecord::without_result(ReasonCode::ToolRunCancelled);
    let id = row.identity.id;
    match transition.name {
        "authorize_waiting" => store
            .authorize_waiting(TENANT, id, claim, &[])
            .await
            .unwrap()
            .is_some(),
        "settle_waiting" => store
            .settle_waiting(TENANT, id, &ended, &[], now())
            .await
            .unwrap(),
        "claim_invocation" => store
            .claim_invocation(TENANT, id, fence, now(), &[], Durability::Flushed)
            .await
            .unwrap()
            .is_some(),
        "mark_effect_sent" => store
            .mark_effect_sent(TENANT, id, fence, now(), Durability::Flushed)
            .await
            .unwrap(),
        "complete_invocation" => store
            .complete_invocation(TENANT, id, fence, &succeeded(), &[], now())
            .await
            .unwrap(),
        "release_invocation" => store.release_invocation(TENANT, id, fence).await.unwrap(),
        "suspend_invocation" => store
            .suspend_invocation(TENANT, id, fence, SuspensionKind::ChildRun, "r")
            .await
            .unwrap(),
        "complete_suspended" => store
            .complete_suspended(TENANT, id, &ended, &[], now())
            .await
            .unwrap(),
        "claim_expired" => store
            .claim_expired(claim, 10_000)
            .await
            .unwrap()
            .iter()
            .any(|held| held.identity.id == id),
        "take_over" => store.take_over(TENANT, id, claim).await.unwrap().is_some(),
        "reopen_approval" => store
            .reopen_approval(
                TENANT,
                id,
                fence,
                Uuid::new_v4(),
                ReasonCode::PolicyRuleApprovalRequired,
                now(),
            )
            .await
            .unwrap(),
        other => panic!("the contract test does not know {other}"),
    }
}

#[tokio::test]
async fn every_store_moves_a_row_exactly_as_the_transition_table_says() {
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let store = store.as_ref();
        for transition in &TRANSITIONS {
            for phase in Phase::ALL {
                let guards: &[bool] = if transition.guard == Guard::Phase {
                    &[true]
                } else {
                    &[true, false]
                };
                for &holds in guards {
                    let case = format!("{name}: {} from {phase:?}, guard {holds}", transition.name);
                    let holder = worker(store, Duration::seconds(60)).await;
                    let actor = worker(store, Duration::seconds(60)).await;
                    let row = row_in(store, phase, holder).await;
                    let current = Fence {
                        worker_id: holder,
                        lease_epoch: row.lease_epoch,
                    };
                    let fence = match (transition.guard, holds) {
                        (Guard::Fence | Guard::FenceAndLiveLease, false) => Fence {
                            lease_epoch: row.lease_epoch + 7,
                            ..current
                        },
                        _ => current,
                    };
                    // The owner is gone when its lease was released.
                    if transition.guard == Guard::OwnerGone && holds {
                        store.release_worker(holder).await.unwrap();
                    }
                    let moved = perform(store, transition, &row, fence, actor).await;
                    assert_eq!(moved, transition.allows(phase, holds), "{case}");
                    let after = store
                        .invocation(TENANT, row.identity.id)
                        .await
                        .unwrap()
                        .unwrap();
                    if !moved {
                        assert_eq!(after.state, row.state, "{case}: unchanged");
                        assert_eq!(after.lease_epoch, row.lease_epoch, "{case}: unchanged");
                        continue;
                    }
                    assert_eq!(
                        after.state.phase(),
                        transition.entered_from(phase),
                        "{case}"
                    );
                    match transition.holder {
                        Holder::Keeps => {
                            assert_eq!(after.lease_epoch, row.lease_epoch, "{case}");
                            if after.state.phase() != Phase::Ended {
                                assert_eq!(after.state.worker(), row.state.worker(), "{case}");
                            }
                        }
                        Holder::Claims => {
                            assert_eq!(after.lease_epoch, row.lease_epoch + 1, "{case}");
                            let claimant = if transition.guard == Guard::Fence {
                                fence.worker_id
                            } else {
                                actor
                            };
                            assert_eq!(after.state.worker(), Some(claimant), "{case}");
                        }
                        Holder::LetsGo => assert_eq!(after.state.worker(), None, "{case}"),
                    }
                }
            }
        }
    }
}
