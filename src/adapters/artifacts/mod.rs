//! The default artifact store: files under `{root}/{tenant}/{run}/`, written
//! once with mode 0600 and synced before the reference is returned, so an
//! invocation row never points at bytes that are not on disk.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use uuid::Uuid;

use crate::domain::{ArtifactRef, TrustLevel, valid_tenant_id};
use crate::ports::{ArtifactError, ArtifactReader, ArtifactStore, ArtifactWriter, BoxFuture};

/// The filesystem artifact store.
#[derive(Debug, Clone)]
pub struct FsArtifactStore {
    root: PathBuf,
}

impl FsArtifactStore {
    /// A store rooted at `root` (created on first write).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        FsArtifactStore { root: root.into() }
    }

    /// Where an artifact lives; for operators and tests, never for tools.
    pub fn path_of(&self, tenant_id: &str, run_id: Uuid, artifact_id: &str) -> PathBuf {
        self.root
            .join(tenant_id)
            .join(run_id.to_string())
            .join(format!("{artifact_id}.bin"))
    }
}

/// A tenant id is a path segment here, so it must be a plain one.
impl ArtifactStore for FsArtifactStore {
    fn writer(
        &self,
        tenant_id: &str,
        run_id: Uuid,
    ) -> Result<Arc<dyn ArtifactWriter>, ArtifactError> {
        if !valid_tenant_id(tenant_id) {
            return Err(ArtifactError::Store(
                "tenant id is not a plain path segment".into(),
            ));
        }
        Ok(Arc::new(RunWriter {
            folder: self.root.join(tenant_id).join(run_id.to_string()),
        }))
    }

    fn open<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        artifact_id: Uuid,
    ) -> BoxFuture<'a, Result<ArtifactReader, ArtifactError>> {
        Box::pin(async move {
            if !valid_tenant_id(tenant_id) {
                return Err(ArtifactError::Store(
                    "tenant id is not a plain path segment".into(),
                ));
            }
            let path = self.path_of(tenant_id, run_id, &artifact_id.to_string());
            let file = tokio::fs::File::open(path).await.map_err(|error| {
                ArtifactError::Store(format!("artifact read failed: {}", error.kind()))
            })?;
            Ok(Box::new(file) as ArtifactReader)
        })
    }
}

struct RunWriter {
    folder: PathBuf,
}

fn write_file(folder: &Path, artifact_id: &str, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(folder)?;
    let path = folder.join(format!("{artifact_id}.bin"));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

impl ArtifactWriter for RunWriter {
    fn write<'a>(
        &'a self,
        media_type: &'a str,
        _trust: TrustLevel,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<ArtifactRef, ArtifactError>> {
        Box::pin(async move {
            let artifact_id = Uuid::new_v4().to_string();
            let size = bytes.len() as u64;
            let folder = self.folder.clone();
            let id = artifact_id.clone();
            tokio::task::spawn_blocking(move || write_file(&folder, &id, &bytes))
                .await
                .map_err(|_| ArtifactError::Store("artifact write was interrupted".into()))?
                .map_err(|error| {
                    ArtifactError::Store(format!("artifact write failed: {}", error.kind()))
                })?;
            Ok(ArtifactRef {
                artifact_id,
                media_type: media_type.to_owned(),
                bytes: size,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[tokio::test]
    async fn writes_owner_only_files_scoped_by_tenant_and_run() {
        let folder = tempfile::tempdir().unwrap();
        let store = FsArtifactStore::new(folder.path());
        let run = Uuid::new_v4();
        let reference = store
            .writer("tenant-a", run)
            .unwrap()
            .write(
                "text/plain",
                TrustLevel::ExternalUntrusted,
                b"hello".to_vec(),
            )
            .await
            .unwrap();
        assert_eq!(reference.bytes, 5);
        let path = store.path_of("tenant-a", run, &reference.artifact_id);
        assert_eq!(std::fs::read(&path).unwrap(), b"hello");
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        for bad in ["../etc", "a/b", "", "."] {
            assert!(store.writer(bad, run).is_err(), "{bad}");
        }
    }
}
