//! The unix sockets a node serves on, with their mode and group.

use std::path::Path;

use super::AppError;

/// Binds the control socket (0600), replacing a stale one a crashed process
/// left behind.
pub(super) fn bind_control(
    control: &crate::config::ControlConfig,
) -> Result<tokio::net::UnixListener, AppError> {
    bind_socket(
        &control.socket,
        control.socket_mode.bits(),
        control.socket_group.as_deref(),
        "control",
    )
}

/// Binds a unix socket with its mode and group, replacing a stale one a
/// crashed process left behind; `field` names its section in errors.
pub(super) fn bind_socket(
    socket: &Path,
    mode: u32,
    group: Option<&str>,
    field: &str,
) -> Result<tokio::net::UnixListener, AppError> {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(parent) = socket.parent() {
        std::fs::create_dir_all(parent).map_err(|source| AppError::Io {
            what: parent.display().to_string(),
            source,
        })?;
    }
    if socket.exists() {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Err(AppError::SocketInUse {
                path: socket.display().to_string(),
            });
        }
        let _ = std::fs::remove_file(socket);
    }
    let listener = tokio::net::UnixListener::bind(socket).map_err(|source| AppError::Io {
        what: socket.display().to_string(),
        source,
    })?;
    // The group first, then the mode: never a moment in which the socket
    // is open to a group it was not meant for.
    if let Some(group) = group {
        let gid = crate::config::resolve_group(group).ok_or_else(|| AppError::NoSuchGroup {
            field: field.to_owned(),
        })?;
        std::os::unix::fs::chown(socket, None, Some(gid)).map_err(|source| AppError::Io {
            what: format!("{field}.socket_group"),
            source,
        })?;
    }
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(mode)).map_err(|source| {
        AppError::Io {
            what: socket.display().to_string(),
            source,
        }
    })?;
    Ok(listener)
}
