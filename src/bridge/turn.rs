//! What makes a turn a turn: one 0700 folder and one 0600 socket, a token of
//! 256 random bits of which only the hash is kept, the ordinal each call
//! gets and the call id it is given, and the per-turn cap; so a replayed
//! script in a new turn for the same run and step derives the same call ids
//! and deduplicates.

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

/// `call_id = "bridge:" + hex(sha256(script_sha256 ‖ 0x00 ‖ ordinal))[:32]`.
pub fn call_id(script_sha256: &str, ordinal: u32) -> String {
    let mut input = Vec::with_capacity(script_sha256.len() + 12);
    input.extend_from_slice(script_sha256.as_bytes());
    input.push(0);
    input.extend_from_slice(ordinal.to_string().as_bytes());
    let digest = sha256_hex(&input);
    format!("bridge:{}", &digest[..32])
}

fn random_token() -> Result<String, BridgeError> {
    let mut bytes = [0u8; TOKEN_BYTES];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut file| file.read_exact(&mut bytes))
        .map_err(|_| BridgeError::Randomness)?;
    Ok(crate::domain::canonical::hex(&bytes))
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
    /// The sandbox user; when given, every peer must be this uid.
    pub sandbox_uid: Option<u32>,
    /// The trust of what produced the script: every call's origin trust.
    pub origin_trust: TrustLevel,
    /// The run's deadline, which every call of the turn carries.
    pub deadline_at: Option<DateTime<Utc>>,
}

/// Why a request on a turn's socket is refused before it is routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessDenied {
    /// No token, or not this turn's.
    Token,
    /// The peer is not the sandbox user.
    Peer,
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

impl Drop for CallInFlight {
    fn drop(&mut self) {
        self.0.lock().busy = false;
    }
}

impl Turn {
    /// The socket path.
    pub fn socket_path(&self) -> PathBuf {
        self.folder.join(SOCKET_NAME)
    }

    /// Checks the bearer token (constant time over the hashes), the peer and
    /// the turn's life.
    pub fn authorize(
        &self,
        token: Option<&str>,
        peer_uid: Option<u32>,
        now: DateTime<Utc>,
    ) -> Result<(), AccessDenied> {
        let presented = sha256_hex(token.unwrap_or_default().as_bytes());
        let token_ok =
            token.is_some() && constant_time_eq(presented.as_bytes(), self.token_sha256.as_bytes());
        if !token_ok {
            return Err(AccessDenied::Token);
        }
        if self.is_closed() || now >= self.expires_at {
            return Err(AccessDenied::Closed);
        }
        if let Some(uid) = self.binding.sandbox_uid
            && peer_uid != Some(uid)
        {
            return Err(AccessDenied::Peer);
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
        // The folder is toolgate's alone; the folders above it, made as any
        // would be, stay reachable by the users its children run as.
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

    /// Opens a turn: its folder (0700) and bound socket (0600), both owned
    /// by the sandbox user when one is named, and its token, returned once.
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

    /// Binds the socket (0600), hands folder and socket to the sandbox user
    /// and mints the token.
    fn prepare(
        folder: &Path,
        sandbox_uid: Option<u32>,
    ) -> Result<(tokio::net::UnixListener, String), BridgeError> {
        let socket = folder.join(SOCKET_NAME);
        let listener = tokio::net::UnixListener::bind(&socket)
            .map_err(|error| BridgeError::Bind(error.kind()))?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
            .map_err(|error| BridgeError::Folder(error.kind()))?;
        if let Some(uid) = sandbox_uid {
            for path in [folder, socket.as_path()] {
                std::os::unix::fs::chown(path, Some(uid), None)
                    .map_err(|error| BridgeError::Folder(error.kind()))?;
            }
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
    fn tokens_compare_in_constant_time_and_die_with_the_turn() {
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
                deadline_at: None,
            };
            let (turn, token, _listener) = turns
                .open(binding, Utc::now() + chrono::Duration::seconds(60))
                .unwrap();
            assert_eq!(token.len(), 2 * TOKEN_BYTES);
            let now = Utc::now();
            assert_eq!(turn.authorize(Some(&token), Some(4242), now), Ok(()));
            assert_eq!(
                turn.authorize(Some("wrong"), Some(4242), now),
                Err(AccessDenied::Token)
            );
            assert_eq!(
                turn.authorize(None, Some(4242), now),
                Err(AccessDenied::Token)
            );
            assert_eq!(
                turn.authorize(Some(&token), Some(0), now),
                Err(AccessDenied::Peer)
            );
            let mode = std::fs::metadata(turn.socket_path())
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
            assert_eq!(
                std::fs::metadata(&turn.folder)
                    .unwrap()
                    .permissions()
                    .mode()
                    & 0o777,
                0o700
            );
            turns.close(turn.id);
            assert_eq!(
                turn.authorize(Some(&token), Some(4242), now),
                Err(AccessDenied::Closed)
            );
            assert!(!turn.folder.exists());
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
