//! The typed values the file's text becomes: seconds as `Duration`s, counts
//! as `usize`, a socket's mode as its bits, a user to run as.
//!
//! What is refused here and what is left to validation: serde stops at the
//! first value it cannot build, so only a value with no form in its type
//! fails the parse (text where seconds go, a mode that is not octal, an
//! address or a reference that does not parse, an unknown scheme). Every
//! rule on a well-formed value (zero where zero makes no sense, a range, a
//! rule between fields) is validation's, which names every problem at once.
//! That is why zero is a value of these types: a count is a `usize`, not a
//! `NonZeroUsize`, so a file with `worker_threads = 0` and three other
//! mistakes is answered with all four.

use std::fmt;
use std::time::Duration;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A whole number of seconds: an integer in the file (the `…_seconds`
/// keys), a `Duration` where it is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(transparent)]
pub struct Seconds(u32);

impl Seconds {
    /// `seconds` seconds.
    pub const fn new(seconds: u32) -> Seconds {
        Seconds(seconds)
    }

    /// The number of seconds, as written.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// As a `Duration`.
    pub const fn duration(self) -> Duration {
        Duration::from_secs(self.0 as u64)
    }
}

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A count of things held at once (threads, connections, calls): read as a
/// `u32`, the file's bound, so no count reaches a semaphore's limit.
pub(super) fn count<'de, D: Deserializer<'de>>(deserializer: D) -> Result<usize, D::Error> {
    let count = u32::deserialize(deserializer)?;
    usize::try_from(count).map_err(|_| D::Error::custom("is too large for this platform"))
}

/// A unix socket's mode: octal text in the file (`"0660"`), its bits here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketMode(u32);

/// The mode a socket gets unless the file says otherwise: its owner's alone.
pub const DEFAULT_SOCKET_MODE: SocketMode = SocketMode(0o600);

const SOCKET_MODE_RULE: &str =
    "must be octal (0600, 0660), owner read and write, nothing for others";

impl SocketMode {
    /// The mode bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Owner read and write at least, nothing for others, and no bit beyond
    /// the owner's and the group's permissions.
    pub(super) fn problem(self) -> Option<&'static str> {
        let private = self.0 & !0o770 == 0 && self.0 & 0o600 == 0o600;
        (!private).then_some(SOCKET_MODE_RULE)
    }
}

impl Default for SocketMode {
    fn default() -> Self {
        DEFAULT_SOCKET_MODE
    }
}

impl<'de> Deserialize<'de> for SocketMode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        u32::from_str_radix(&text, 8)
            .map(SocketMode)
            .map_err(|_| D::Error::custom(SOCKET_MODE_RULE))
    }
}

impl Serialize for SocketMode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format!("{:04o}", self.0))
    }
}

/// The user a stdio server runs as: `name` (a POSIX user name), `uid`, or
/// `uid:gid`. A name is looked up when the server is set up, not here: the
/// file is checked on machines that need not have its users.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunAsUser {
    /// A user name of the system's user database.
    Name(String),
    /// A uid; its group is its passwd entry's, or the same number.
    Uid(u32),
    /// A uid and a gid, used as they are.
    Ids {
        /// The user.
        uid: u32,
        /// The group.
        gid: u32,
    },
}

const RUN_AS_RULE: &str = "must be a user name, a uid, or uid:gid";

impl std::str::FromStr for RunAsUser {
    type Err = &'static str;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        // Digits only: `u32::from_str` would take "+1".
        let number = |part: &str| {
            if part.bytes().all(|b| b.is_ascii_digit()) {
                part.parse::<u32>().map_err(|_| RUN_AS_RULE)
            } else {
                Err(RUN_AS_RULE)
            }
        };
        if let Some((uid, gid)) = text.split_once(':') {
            return Ok(RunAsUser::Ids {
                uid: number(uid)?,
                gid: number(gid)?,
            });
        }
        if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            return number(text).map(RunAsUser::Uid);
        }
        let name_ok = text.len() <= 32
            && text
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
            && text
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-'));
        if name_ok {
            Ok(RunAsUser::Name(text.to_owned()))
        } else {
            Err(RUN_AS_RULE)
        }
    }
}

impl fmt::Display for RunAsUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunAsUser::Name(name) => f.write_str(name),
            RunAsUser::Uid(uid) => write!(f, "{uid}"),
            RunAsUser::Ids { uid, gid } => write!(f, "{uid}:{gid}"),
        }
    }
}

impl<'de> Deserialize<'de> for RunAsUser {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?
            .parse()
            .map_err(D::Error::custom)
    }
}

impl Serialize for RunAsUser {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_is_a_name_a_uid_or_both_ids() {
        assert_eq!(
            "toolgate-mcp".parse(),
            Ok(RunAsUser::Name("toolgate-mcp".into()))
        );
        assert_eq!("10002".parse(), Ok(RunAsUser::Uid(10002)));
        assert_eq!(
            "10002:10003".parse(),
            Ok(RunAsUser::Ids {
                uid: 10002,
                gid: 10003
            })
        );
        for bad in ["", "Root", "1x", "1:", ":1", "99999999999", "a b", "-x"] {
            assert_eq!(bad.parse::<RunAsUser>(), Err(RUN_AS_RULE), "{bad}");
        }
    }

    #[test]
    fn a_socket_mode_is_private_to_its_owner_and_group() {
        assert_eq!(SocketMode(0o600).problem(), None);
        assert_eq!(SocketMode(0o660).problem(), None);
        for open in [0o666, 0o400, 0o4600, 0o604] {
            assert!(SocketMode(open).problem().is_some(), "{open:o}");
        }
    }
}
