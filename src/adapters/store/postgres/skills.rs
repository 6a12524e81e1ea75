//! PostgresStore: Skills a tenant's agents wrote.

use super::*;

impl SkillStore for PostgresStore {
    fn put_skill<'a>(
        &'a self,
        tenant_id: &'a str,
        skill: &'a AuthoredSkill,
        mode: SkillWrite,
    ) -> BoxFuture<'a, Result<SkillWritten, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            // Locked while it is decided, so two writes of one name are
            // told apart, not interleaved.
            let current: Option<(String, String)> = sqlx::query_as(
                "SELECT written_by_key, author FROM skills WHERE tenant_id = $1 AND name = $2 FOR UPDATE",
            )
            .bind(tenant_id)
            .bind(&skill.name)
            .fetch_optional(tx.statements())
            .await
            .map_err(database_error)?;
            let written = match (current, mode) {
                (Some((key, _)), _) if key == skill.written_by_key => SkillWritten::Repeated,
                (Some(_), SkillWrite::Create) => SkillWritten::Exists,
                (Some((_, author)), SkillWrite::Update) if author != skill.author => {
                    SkillWritten::OtherAuthor
                }
                (None, SkillWrite::Update) => SkillWritten::Missing,
                _ => {
                    sqlx::query(
                        "INSERT INTO skills (tenant_id, name, description, body, required_tools, version, \
                         author, written_by_key, created_at, updated_at) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9) \
                         ON CONFLICT (tenant_id, name) DO UPDATE SET description = EXCLUDED.description, \
                         body = EXCLUDED.body, required_tools = EXCLUDED.required_tools, \
                         version = EXCLUDED.version, author = EXCLUDED.author, \
                         written_by_key = EXCLUDED.written_by_key, updated_at = EXCLUDED.updated_at",
                    )
                    .bind(tenant_id)
                    .bind(&skill.name)
                    .bind(&skill.description)
                    .bind(&skill.body)
                    .bind(serde_json::json!(skill.required_tools))
                    .bind(&skill.version)
                    .bind(&skill.author)
                    .bind(&skill.written_by_key)
                    .bind(skill.updated_at)
                    .execute(tx.statements())
                    .await
                    .map_err(database_error)?;
                    SkillWritten::Written
                }
            };
            tx.commit().await.map_err(database_error)?;
            Ok(written)
        })
    }

    fn delete_skill<'a>(
        &'a self,
        tenant_id: &'a str,
        name: &'a str,
        author: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let deleted = sqlx::query(
                "DELETE FROM skills WHERE tenant_id = $1 AND name = $2 AND author = $3",
            )
            .bind(tenant_id)
            .bind(name)
            .bind(author)
            .execute(tx.statements())
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            Ok(deleted.rows_affected() == 1)
        })
    }

    fn skills<'a>(
        &'a self,
        tenant_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<AuthoredSkill>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let rows = sqlx::query(
                "SELECT name, description, body, required_tools, version, author, written_by_key, \
                 created_at, updated_at FROM skills WHERE tenant_id = $1 ORDER BY name",
            )
            .bind(tenant_id)
            .fetch_all(tx.statements())
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            rows.iter().map(authored_skill).collect()
        })
    }
}
