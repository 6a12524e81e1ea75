//! A node's identity: its id kept in its folder, held under a lock.

use std::path::Path;

use super::AppError;
use crate::pipeline::NodePlace;

/// This node's identity: the id kept in its state folder with where that
/// folder is, and the lock on it, held for as long as the process runs.
pub(super) struct NodeIdentity {
    pub(super) place: NodePlace,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

/// Where a node folder is: the host's boot and the folder's own device and
/// inode, hashed. A copy of the folder (elsewhere on this host, or on
/// another) has another; the same folder after a restart has the same.
pub(super) fn node_host(directory: &Path) -> Result<String, std::io::Error> {
    use std::os::unix::fs::MetadataExt as _;
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let metadata = std::fs::metadata(directory)?;
    let place = format!("{}\0{}\0{}", boot.trim(), metadata.dev(), metadata.ino());
    Ok(crate::domain::sha256_hex(place.as_bytes())[..32].to_owned())
}

impl NodeIdentity {
    /// Takes the node's lock (refusing when another process holds it) and
    /// reads its id, making one on first start.
    pub(super) fn acquire(directory: &Path) -> Result<NodeIdentity, AppError> {
        use std::io::Write as _;
        use std::os::unix::fs::DirBuilderExt as _;
        let failed = |what: &str, source: std::io::Error| AppError::Io {
            what: format!("{} ({what})", directory.display()),
            source,
        };
        // The folder is toolgate's alone; the folders above it, made as any
        // would be, stay reachable by the users its children run as.
        if let Some(parent) = directory.parent() {
            std::fs::create_dir_all(parent).map_err(|error| failed("node folder", error))?;
        }
        match std::fs::DirBuilder::new().mode(0o700).create(directory) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(error) => return Err(failed("node folder", error)),
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(directory.join("node.lock"))
            .map_err(|error| failed("node lock", error))?;
        let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|_| AppError::NodeHeld {
                folder: directory.display().to_string(),
            })?;
        let path = directory.join("node.id");
        let id = match std::fs::read_to_string(&path) {
            Ok(text) if uuid::Uuid::parse_str(text.trim()).is_ok() => text.trim().to_owned(),
            Ok(_) => {
                return Err(failed(
                    "node.id",
                    std::io::Error::new(std::io::ErrorKind::InvalidData, "not a node id"),
                ));
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                let id = uuid::Uuid::new_v4().to_string();
                let mut file =
                    std::fs::File::create(&path).map_err(|error| failed("node.id", error))?;
                file.write_all(id.as_bytes())
                    .and_then(|()| file.sync_all())
                    .map_err(|error| failed("node.id", error))?;
                id
            }
            Err(error) => return Err(failed("node.id", error)),
        };
        let host = node_host(directory).map_err(|error| failed("node folder", error))?;
        Ok(NodeIdentity {
            place: NodePlace { node: id, host },
            _lock: lock,
        })
    }
}
