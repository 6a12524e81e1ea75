//! The default credential resolver: `env:NAME` from the environment the
//! composition root hands in (never read here from the process),
//! `file:/path` from a file, and `secret:TENANT/NAME` from the file `NAME` in
//! the tenant's folder under the operator's tenant-secrets directory; a
//! file's trailing newline is dropped.

use std::collections::BTreeMap;

mod sealer;

pub use sealer::{KeyError, KeySealer};

use crate::domain::SecretValue;
use crate::domain::secret::CredentialRef;
use crate::ports::{BoxFuture, CredentialError, CredentialResolver};

/// Resolves references from an environment snapshot and files.
#[derive(Clone, Default)]
pub struct EnvFileResolver {
    environment: BTreeMap<String, String>,
    /// Where tenants' secrets live, one folder per tenant; without it no
    /// `secret:` reference resolves.
    tenant_secrets: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for EnvFileResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The environment holds secrets; only its size is shown.
        f.debug_struct("EnvFileResolver")
            .field("variables", &self.environment.len())
            .finish()
    }
}

impl EnvFileResolver {
    /// A resolver over `environment`.
    pub fn new(environment: BTreeMap<String, String>) -> Self {
        EnvFileResolver {
            environment,
            tenant_secrets: None,
        }
    }

    /// Resolves `secret:` references from `directory/TENANT/NAME`.
    pub fn with_tenant_secrets(mut self, directory: std::path::PathBuf) -> Self {
        self.tenant_secrets = Some(directory);
        self
    }
}

impl CredentialResolver for EnvFileResolver {
    fn resolve<'a>(
        &'a self,
        reference: &'a CredentialRef,
    ) -> BoxFuture<'a, Result<SecretValue, CredentialError>> {
        Box::pin(async move {
            match reference {
                CredentialRef::Env(name) => self
                    .environment
                    .get(name)
                    .map(|value| SecretValue::new(value.clone()))
                    .ok_or_else(|| CredentialError::Unresolved(reference.clone())),
                CredentialRef::File(path) => {
                    let text = tokio::fs::read_to_string(path)
                        .await
                        .map_err(|_| CredentialError::Unresolved(reference.clone()))?;
                    Ok(SecretValue::new(text.trim_end_matches(['\n', '\r'])))
                }
                CredentialRef::Secret { tenant, name } => {
                    let directory = self
                        .tenant_secrets
                        .clone()
                        .ok_or_else(|| CredentialError::Unresolved(reference.clone()))?;
                    let (tenant, name) = (tenant.clone(), name.clone());
                    let text = tokio::task::spawn_blocking(move || {
                        tenant_secret(&directory, &tenant, &name)
                    })
                    .await
                    .ok()
                    .flatten()
                    .ok_or_else(|| CredentialError::Unresolved(reference.clone()))?;
                    Ok(SecretValue::new(text.trim_end_matches(['\n', '\r'])))
                }
            }
        })
    }
}

/// The largest tenant secret read.
pub const MAXIMUM_TENANT_SECRET: u64 = 64 << 10;

/// A tenant's secret: the file `name` in the folder `tenant` under
/// `directory`, read only if that folder is a folder (not a link to another
/// tenant's, or anywhere else), the file is a regular file (not a link, a
/// FIFO or a device) and it is at most [`MAXIMUM_TENANT_SECRET`] bytes.
/// Both names were checked when the reference was parsed: neither holds a
/// `/` or is `..`.
fn tenant_secret(directory: &std::path::Path, tenant: &str, name: &str) -> Option<String> {
    use nix::fcntl::{OFlag, open, openat};
    use nix::sys::stat::Mode;
    use std::io::Read as _;
    let folder = open(
        &directory.join(tenant),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    // Non-blocking, so a FIFO put in its place is refused, not waited on.
    let file = openat(
        &folder,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let file = std::fs::File::from(file);
    let metadata = file.metadata().ok()?;
    if !metadata.is_file() || metadata.len() > MAXIMUM_TENANT_SECRET {
        return None;
    }
    let mut text = String::new();
    file.take(MAXIMUM_TENANT_SECRET + 1)
        .read_to_string(&mut text)
        .ok()?;
    (text.len() as u64 <= MAXIMUM_TENANT_SECRET).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn resolves_env_and_file_references() {
        let folder = tempfile::tempdir().unwrap();
        let file = folder.path().join("token");
        std::fs::write(&file, "from-file\n").unwrap();
        let resolver = EnvFileResolver::new([("TOKEN".to_owned(), "from-env".to_owned())].into());
        let env = CredentialRef::parse("env:TOKEN").unwrap();
        assert_eq!(resolver.resolve(&env).await.unwrap().reveal(), "from-env");
        let from_file = CredentialRef::parse(&format!("file:{}", file.display())).unwrap();
        assert_eq!(
            resolver.resolve(&from_file).await.unwrap().reveal(),
            "from-file"
        );
        let missing = CredentialRef::parse("env:MISSING").unwrap();
        let error = resolver.resolve(&missing).await.unwrap_err();
        assert_eq!(
            error.to_string(),
            "credential reference env:MISSING does not resolve"
        );
        assert!(!format!("{resolver:?}").contains("from-env"));
    }

    /// A tenant's secret is a regular file in its own folder: a link out of
    /// it, or into another tenant's, is not followed; a folder that is a
    /// link is not entered; FIFOs, devices and oversized files are refused.
    #[tokio::test]
    async fn a_tenant_secret_is_a_regular_file_of_its_own_folder() {
        use std::os::unix::fs::symlink;
        let root = tempfile::tempdir().unwrap();
        let (mine, theirs) = (root.path().join("mine"), root.path().join("theirs"));
        std::fs::create_dir_all(&mine).unwrap();
        std::fs::create_dir_all(&theirs).unwrap();
        std::fs::write(mine.join("token"), "mine-123\n").unwrap();
        std::fs::write(theirs.join("token"), "theirs-456").unwrap();
        let outside = root.path().join("outside");
        std::fs::write(&outside, "outside-789").unwrap();
        symlink(theirs.join("token"), mine.join("borrowed")).unwrap();
        symlink(&outside, mine.join("escaped")).unwrap();
        symlink(&theirs, root.path().join("alias")).unwrap();
        nix::unistd::mkfifo(&mine.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        std::fs::write(
            mine.join("huge"),
            vec![b'x'; usize::try_from(MAXIMUM_TENANT_SECRET).unwrap() + 1],
        )
        .unwrap();
        let resolver = EnvFileResolver::default().with_tenant_secrets(root.path().to_path_buf());
        let resolve = |text: &str| {
            let reference = CredentialRef::parse(text).unwrap();
            let resolver = resolver.clone();
            async move {
                resolver
                    .resolve(&reference)
                    .await
                    .map(|value| value.reveal().to_owned())
            }
        };
        assert_eq!(resolve("secret:mine/token").await.unwrap(), "mine-123");
        for refused in [
            "secret:mine/borrowed",
            "secret:mine/escaped",
            "secret:alias/token",
            "secret:mine/fifo",
            "secret:mine/huge",
            "secret:mine/missing",
        ] {
            assert!(resolve(refused).await.is_err(), "{refused}");
        }
    }
}
