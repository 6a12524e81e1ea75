//! The default credential resolver: `env:NAME` from the environment the
//! composition root hands in (never read here from the process),
//! `file:/path` from a file, and `secret:TENANT/NAME` from the file `NAME` in
//! the tenant's folder under the operator's tenant-secrets directory; a
//! file's trailing newline is dropped.

use std::collections::BTreeMap;

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
                    // Both parts were checked when the reference was parsed:
                    // neither can leave the tenant's folder.
                    let directory = self
                        .tenant_secrets
                        .as_ref()
                        .ok_or_else(|| CredentialError::Unresolved(reference.clone()))?;
                    let text = tokio::fs::read_to_string(directory.join(tenant).join(name))
                        .await
                        .map_err(|_| CredentialError::Unresolved(reference.clone()))?;
                    Ok(SecretValue::new(text.trim_end_matches(['\n', '\r'])))
                }
            }
        })
    }
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
}
