//! The idempotency key (Section 8.4, as the design document completes it).
//!
//! Seven inputs separated by NUL, sha256, lowercase hex. `attempt_number` is
//! deliberately not an input: a retry within a step must produce the same key
//! so the remote's own deduplication can recognise it.

use sha2::{Digest, Sha256};

use super::canonical::hex;

/// The version tag: a future change to the derivation is a new key space,
/// never a silent collision with history.
pub const KEY_VERSION_TAG: &str = "veetbot.tool.v1";

/// The key for one call. `run_id` is the run's UUID in its hyphenated
/// lowercase form; `normalized_arguments_hash` is the canonical form's hex.
pub fn idempotency_key(
    run_id: &str,
    step_number: u64,
    call_id: &str,
    tool_name: &str,
    tool_version: &str,
    normalized_arguments_hash: &str,
) -> String {
    let mut hasher = Sha256::new();
    let step = step_number.to_string();
    let parts: [&[u8]; 7] = [
        KEY_VERSION_TAG.as_bytes(),
        run_id.as_bytes(),
        step.as_bytes(),
        call_id.as_bytes(),
        tool_name.as_bytes(),
        tool_version.as_bytes(),
        normalized_arguments_hash.as_bytes(),
    ];
    for (index, part) in parts.iter().enumerate() {
        if index > 0 {
            hasher.update([0u8]);
        }
        hasher.update(part);
    }
    hex(&hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::canonical::sha256_hex;

    const RUN: &str = "6f1c1d9e-2b1a-4c7e-9f00-0123456789ab";
    const ARGS: &str = "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a";

    #[test]
    fn matches_the_documented_derivation() {
        let expected = sha256_hex(
            format!("veetbot.tool.v1\0{RUN}\07\0call_abc\0demo.echo\01\0{ARGS}").as_bytes(),
        );
        assert_eq!(
            idempotency_key(RUN, 7, "call_abc", "demo.echo", "1", ARGS),
            expected
        );
        assert_eq!(expected.len(), 64);
    }

    #[test]
    fn every_input_changes_the_key() {
        let base = idempotency_key(RUN, 7, "call_abc", "demo.echo", "1", ARGS);
        let variants = [
            idempotency_key(
                "6f1c1d9e-2b1a-4c7e-9f00-0123456789ac",
                7,
                "call_abc",
                "demo.echo",
                "1",
                ARGS,
            ),
            idempotency_key(RUN, 8, "call_abc", "demo.echo", "1", ARGS),
            idempotency_key(RUN, 7, "call_abd", "demo.echo", "1", ARGS),
            idempotency_key(RUN, 7, "call_abc", "demo.echoes", "1", ARGS),
            idempotency_key(RUN, 7, "call_abc", "demo.echo", "2", ARGS),
            idempotency_key(
                RUN,
                7,
                "call_abc",
                "demo.echo",
                "1",
                &ARGS.replace('4', "5"),
            ),
        ];
        for variant in variants {
            assert_ne!(variant, base);
        }
    }

    #[test]
    fn separators_prevent_concatenation_collisions() {
        assert_ne!(
            idempotency_key(RUN, 7, "ab", "c.d", "1", ARGS),
            idempotency_key(RUN, 7, "a", "bc.d", "1", ARGS)
        );
    }
}
