//! What makes a turn a turn: one folder and one socket (toolgate's own, 0700
//! and 0600; for a turn bound to a sandbox user, 0711 and 0666, that uid
//! alone admitted by its peer credentials, so no chown and no capability is
//! needed), a token of 256 random bits of which only the hash is kept, the
//! ordinal each call gets and the call id it is given, and the per-turn cap;
//! so a replayed script in a new turn for the same run and step derives the
//! same call ids and deduplicates.

use std::collections::HashMap;
use std::io::Read as _;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::domain::{TrustLevel, sha256_hex};
use crate::edge::constant_time_eq;

/// How many bytes of randomness a token carries.
pub const TOKEN_BYTES: usize = 32;
/// The socket's file name inside the turn's folder.
pub const SOCKET_NAME: &str = "bridge.sock";

/// Why a turn could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// The filesystem refused.
    #[error("turn folder: {0}")]
    Folder(std::io::ErrorKind),
    /// No randomness.
    #[error("no randomness for the turn token")]
    Randomness,
    /// The socket could not be bound.
    #[error("turn socket: {0}")]
    Bind(std::io::ErrorKind),
}

/// What every call id a script's turn derives starts with.
pub const CALL_ID_PREFIX: &str = "bridge:";

/// `call_id = "bridge:" + hex(sha256(script_sha256 ‖ 0x00 ‖ ordinal))[:32]`.
pub fn call_id(script_sha256: &str, ordinal: u32) -> String {
    let mut input = Vec::with_capacity(script_sha256.len() + 12);
    input.extend_from_slice(script_sha256.as_bytes());
    input.push(0);
    input.extend_from_slice(ordinal.to_string().as_bytes());
    let digest = sha256_hex(&input);
    format!("{CALL_ID_PREFIX}{}", &digest[..32])
}

fn random_token() -> Result<String, BridgeError> {
    let mut bytes = [0u8; TOKEN_BYTES];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut file| file.read_exact(&mut bytes))
        .map_err(|_| BridgeError::Randomness)?;
    Ok(crate::domain::canonical::hex(&bytes))
}

/// A call an earlier turn recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedCall {
    /// Its row.
    pub invocation_id: Uuid,
    /// Its tool.
    pub tool_name: String,
    /// Its canonical arguments' hash.
    pub arguments_hash: String,
}

/// What a turn is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnBinding {
    /// The session whose pinned set the turn's calls resolve against.
    pub session_id: Uuid,
    /// The session's tenant, whose records the turn's events join.
    pub tenant_id: String,
    /// The run.
    pub run_id: Uuid,
    /// The step every call of the turn shares.
    pub step_number: i64,
    /// The script's hash: the call ids' seed.
    pub script_sha256: String,
    /// The sandbox user; when given, every peer must be this uid, checked
    /// on accept.
    pub sandbox_uid: Option<u32>,
    /// The trust of what produced the script: every call's origin trust.
    pub origin_trust: TrustLevel,
    /// What an earlier turn of the same run, step and script recorded, by
    /// call id: a replay's call is compared with the one recorded at its
    /// ordinal. Empty on a first run.
    pub recorded: std::collections::BTreeMap<String, RecordedCall>,
    /// The run's deadline, which every call of the turn carries.
    pub deadline_at: Option<DateTime<Utc>>,
}

/// Why a request on a turn's socket is refused before it is routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessDenied {
    /// No token, or not this turn's.
    Token,
    /// The turn is closed or past its expiry.
    Closed,
}

/// One open turn.
#[derive(Debug)]
pub struct Turn {
    /// The turn.
    pub id: Uuid,
    /// What it is bound to.
    pub binding: TurnBinding,
    /// When its token dies.
    pub expires_at: DateTime<Utc>,
    /// Its folder.
    pub folder: PathBuf,
    token_sha256: String,
    state: Mutex<TurnState>,
}

#[derive(Debug, Default)]
struct TurnState {
    ordinals: u32,
    closed: bool,
    /// A call is being served: one at a time per turn, so the ordinals are
    /// the script's order.
    busy: bool,
    /// The approval the call in flight waits for, when it waits.
    waiting: Option<Waiting>,
}

/// A call of the turn held for a human's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// The approval.
    pub approval_id: Uuid,
    /// The tool the call asked for.
    pub call: String,
    /// When the hold ends and the turn is suspended.
    pub held_until: DateTime<Utc>,
}

/// Why a call was not admitted on its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The turn closed or expired before the call was admitted.
    Closed,
    /// The turn has made its cap of calls.
    CapReached,
}

/// The turn's one call in flight; dropping it frees the turn for the next.
#[derive(Debug)]
pub struct CallInFlight(Arc<Turn>);

impl CallInFlight {
    /// Marks the call as waiting for `waiting`'s approval.
    pub fn wait(&self, waiting: Waiting) {
        self.0.lock().waiting = Some(waiting);
    }
}

impl Drop for CallInFlight {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.busy = false;
        state.waiting = None;
    }
}

impl Turn {
    /// The socket path.
    pub fn socket_path(&self) -> PathBuf {
        self.folder.join(SOCKET_NAME)
    }

    /// Whether a connecting process may be served at all: any peer when the
    /// turn names no sandbox user (its socket is then toolgate's user's
    /// alone), else that uid and no other, root included.
    pub fn admits_peer(&self, peer_uid: Option<u32>) -> bool {
        match self.binding.sandbox_uid {
            Some(uid) => peer_uid == Some(uid),
            None => true,
        }
    }

    /// Checks the bearer token (constant time over the hashes) and the
    /// turn's life.
    pub fn authorize(&self, token: Option<&str>, now: DateTime<Utc>) -> Result<(), AccessDenied> {
        let presented = sha256_hex(token.unwrap_or_default().as_bytes());
        let token_ok =
            token.is_some() && constant_time_eq(presented.as_bytes(), self.token_sha256.as_bytes());
        if !token_ok {
            return Err(AccessDenied::Token);
        }
        if self.is_closed() || now >= self.expires_at {
            return Err(AccessDenied::Closed);
        }
        Ok(())
    }

    /// Takes the turn for one call, or `None` when another is in flight.
    pub fn begin_call(self: &Arc<Self>) -> Option<CallInFlight> {
        let mut state = self.lock();
        if state.busy {
            return None;
        }
        state.busy = true;
        Some(CallInFlight(self.clone()))
    }

    /// Admits a call whose request has fully arrived: the turn must still be
    /// open and unexpired, and under its cap. Returns the call's ordinal
    /// (zero-based, as the design numbers them); denied calls count, since
    /// it is taken before the call runs.
    pub fn admit(&self, cap: u32, now: DateTime<Utc>) -> Result<u32, Admission> {
        let mut state = self.lock();
        if state.closed || now >= self.expires_at {
            return Err(Admission::Closed);
        }
        if state.ordinals >= cap {
            return Err(Admission::CapReached);
        }
        let ordinal = state.ordinals;
        state.ordinals += 1;
        Ok(ordinal)
    }

    /// Gives back the last ordinal: its call recorded nothing (another
    /// worker held it in flight), so the script's retry must make the same
    /// call, with the same call id, not a new one.
    pub fn return_ordinal(&self, ordinal: u32) {
        let mut state = self.lock();
        if state.ordinals == ordinal + 1 {
            state.ordinals = ordinal;
        }
    }

    /// The approval the turn's call in flight waits for, if any.
    pub fn waiting(&self) -> Option<Waiting> {
        self.lock().waiting.clone()
    }

    /// Calls made so far.
    pub fn calls(&self) -> u32 {
        self.lock().ordinals
    }

    /// Whether it was closed.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TurnState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The open turns of this process.
pub struct Turns {
    directory: PathBuf,
    turns: Mutex<HashMap<Uuid, Arc<Turn>>>,
}

impl Turns {
    /// Turns under `directory`. Sockets a previous process left there are
    /// removed: their tokens died with it.
    pub fn new(directory: &Path) -> Result<Self, BridgeError> {
        // Absolute, so the socket path a turn's opener is handed names the
        // socket wherever the opener runs, not relative to toolgate's folder.
        let directory =
            &std::path::absolute(directory).map_err(|error| BridgeError::Folder(error.kind()))?;
        // The composition root makes the folder traversable (0711) for
        // sandboxes of other uids; made here only when it is missing.
        if let Some(parent) = directory.parent() {
            std::fs::create_dir_all(parent).map_err(|error| BridgeError::Folder(error.kind()))?;
        }
        match std::fs::DirBuilder::new().mode(0o700).create(directory) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(error) => return Err(BridgeError::Folder(error.kind())),
        }
        if let Ok(entries) = std::fs::read_dir(directory) {
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() && path.join(SOCKET_NAME).exists() {
                    let _ = std::fs::remove_dir_all(&path);
                }
            }
        }
        Ok(Turns {
            directory: directory.to_owned(),
            turns: Mutex::new(HashMap::new()),
        })
    }

    /// Opens a turn: its folder and bound socket, reachable by the sandbox
    /// user when one is named, and its token, returned once.
    pub fn open(
        &self,
        binding: TurnBinding,
        expires_at: DateTime<Utc>,
    ) -> Result<(Arc<Turn>, String, tokio::net::UnixListener), BridgeError> {
        let id = Uuid::new_v4();
        let folder = self.directory.join(id.simple().to_string());
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&folder)
            .map_err(|error| BridgeError::Folder(error.kind()))?;
        let prepared = Self::prepare(&folder, binding.sandbox_uid);
        let (listener, token) = match prepared {
            Ok(prepared) => prepared,
            Err(error) => {
                // A turn that did not open leaves nothing behind.
                let _ = std::fs::remove_dir_all(&folder);
                return Err(error);
            }
        };
        let turn = Arc::new(Turn {
            id,
            binding,
            expires_at,
            folder,
            token_sha256: sha256_hex(token.as_bytes()),
            state: Mutex::new(TurnState::default()),
        });
        self.lock().insert(id, turn.clone());
        Ok((turn, token, listener))
    }

    /// Binds the socket and mints the token. Without a sandbox user the
    /// folder stays 0700 and the socket 0600: toolgate's user's alone. With
    /// one, any uid may traverse the folder (0711, not list it) and connect
    /// (0666: connecting needs write permission), and the server admits the
    /// sandbox uid alone by its peer credentials, before reading a byte;
    /// nothing is handed over, so toolgate needs no CAP_CHOWN.
    fn prepare(
        folder: &Path,
        sandbox_uid: Option<u32>,
    ) -> Result<(tokio::net::UnixListener, String), BridgeError> {
        let socket = folder.join(SOCKET_NAME);
        let listener = tokio::net::UnixListener::bind(&socket)
            .map_err(|error| BridgeError::Bind(error.kind()))?;
        let (folder_mode, socket_mode) = match sandbox_uid {
            Some(_) => (0o711, 0o666),
            None => (0o700, 0o600),
        };
        for (path, mode) in [(folder, folder_mode), (socket.as_path(), socket_mode)] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                .map_err(|error| BridgeError::Folder(error.kind()))?;
        }
        Ok((listener, random_token()?))
    }

    /// The turn, while open.
    pub fn get(&self, id: Uuid) -> Option<Arc<Turn>> {
        self.lock().get(&id).cloned()
    }

    /// Closes a turn: its token dies and its folder and socket go.
    pub fn close(&self, id: Uuid) -> Option<Arc<Turn>> {
        let turn = self.lock().remove(&id)?;
        turn.lock().closed = true;
        let _ = std::fs::remove_dir_all(&turn.folder);
        Some(turn)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Arc<Turn>>> {
        self.turns
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectors `sandbox-bridge/call_id_vectors.json` holds; the Python
    /// client's tests check the same file.
    #[test]
    fn call_ids_match_the_shared_vectors() {
        let vectors: Vec<serde_json::Value> = serde_json::from_str(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/sandbox-bridge/call_id_vectors.json"
        )))
        .unwrap();
        assert!(!vectors.is_empty());
        for vector in vectors {
            let script = vector["script_sha256"].as_str().unwrap();
            let ordinal = u32::try_from(vector["ordinal"].as_u64().unwrap()).unwrap();
            assert_eq!(call_id(script, ordinal), vector["call_id"], "{vector}");
        }
    }

    #[test]
    fn call_ids_follow_the_rule() {
        let script = "a".repeat(64);
        let first = call_id(&script, 1);
        assert!(first.starts_with("bridge:") && first.len() == 7 + 32);
        assert_ne!(first, call_id(&script, 2));
        assert_eq!(first, call_id(&script, 1));
        let expected = format!(
            "bridge:{}",
            &sha256_hex(format!("{script}\u{0}1").as_bytes())[..32]
        );
        assert_eq!(first, expected);
    }

    #[test]
    fn tokens_compare_in_constant_time_and_sockets_admit_their_sandbox_user() {
        let folder = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let turns = Turns::new(folder.path()).unwrap();
            let binding = TurnBinding {
                session_id: Uuid::new_v4(),
                tenant_id: "t".into(),
                run_id: Uuid::new_v4(),
                step_number: 1,
                script_sha256: "s".repeat(64),
                sandbox_uid: Some(4242),
                origin_trust: TrustLevel::User,
                recorded: Default::default(),
                deadline_at: None,
            };
            let (turn, token, _listener) = turns
                .open(binding, Utc::now() + chrono::Duration::seconds(60))
                .unwrap();
            assert_eq!(token.len(), 2 * TOKEN_BYTES);
            let now = Utc::now();
            assert_eq!(turn.authorize(Some(&token), now), Ok(()));
            assert_eq!(turn.authorize(Some("wrong"), now), Err(AccessDenied::Token));
            assert_eq!(turn.authorize(None, now), Err(AccessDenied::Token));
            // The sandbox user alone is admitted; root is another peer.
            assert!(turn.admits_peer(Some(4242)));
            assert!(!turn.admits_peer(Some(0)));
            assert!(!turn.admits_peer(None));
            // Reachable by any uid, so the peer check is the gate and
            // nothing is chowned.
            let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&turn.socket_path()), 0o666);
            assert_eq!(mode(&turn.folder), 0o711);
            turns.close(turn.id);
            assert_eq!(turn.authorize(Some(&token), now), Err(AccessDenied::Closed));
            assert!(!turn.folder.exists());

            // Without a sandbox user: toolgate's user's alone, any peer
            // admitted by the socket's mode.
            let binding = TurnBinding {
                sandbox_uid: None,
                ..turn.binding.clone()
            };
            let (own, _, _listener) = turns
                .open(binding, Utc::now() + chrono::Duration::seconds(60))
                .unwrap();
            assert!(own.admits_peer(Some(0)) && own.admits_peer(None));
            assert_eq!(mode(&own.socket_path()), 0o600);
            assert_eq!(mode(&own.folder), 0o700);
        });
    }

    #[test]
    fn stale_turns_are_cleaned_at_start_up() {
        let folder = tempfile::tempdir().unwrap();
        let stale = folder.path().join("0123abcd");
        std::fs::create_dir_all(&stale).unwrap();
        std::fs::write(stale.join(SOCKET_NAME), b"").unwrap();
        let unrelated = folder.path().join("notes");
        std::fs::create_dir_all(&unrelated).unwrap();
        Turns::new(folder.path()).unwrap();
        assert!(!stale.exists(), "a dead turn's socket is removed");
        assert!(unrelated.exists(), "nothing else is touched");
    }

    #[test]
    fn the_cap_counts_every_call() {
        let turn = Turn {
            id: Uuid::new_v4(),
            binding: TurnBinding {
                session_id: Uuid::new_v4(),
                tenant_id: "t".into(),
                run_id: Uuid::new_v4(),
                step_number: 1,
                script_sha256: String::new(),
                sandbox_uid: None,
                origin_trust: TrustLevel::User,
                recorded: Default::default(),
                deadline_at: None,
            },
            expires_at: Utc::now(),
            folder: PathBuf::new(),
            token_sha256: String::new(),
            state: Mutex::new(TurnState::default()),
        };
        let now = turn.expires_at - chrono::Duration::seconds(1);
        let ordinals: Vec<Result<u32, Admission>> = (0..4).map(|_| turn.admit(3, now)).collect();
        assert_eq!(
            ordinals,
            vec![Ok(0), Ok(1), Ok(2), Err(Admission::CapReached)]
        );
        assert_eq!(turn.admit(3, turn.expires_at), Err(Admission::Closed));
    }
}
