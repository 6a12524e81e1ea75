//! SqliteStore: Skills a tenant's agents wrote.

use super::*;

const SKILL_COLUMNS: &str = "name, description, body, required_tools, version, author, \
                             written_by_key, created_at, updated_at";

impl SkillStore for SqliteStore {
    fn put_skill<'a>(
        &'a self,
        tenant_id: &'a str,
        skill: &'a AuthoredSkill,
        mode: SkillWrite,
    ) -> BoxFuture<'a, Result<SkillWritten, StoreError>> {
        let (tenant_id, skill) = (tenant_id.to_owned(), skill.clone());
        Box::pin(async move {
            self.flushed(move |connection| {
                let current = query(
                    "SELECT written_by_key, author FROM skills WHERE tenant_id = $1 AND name = $2",
                )
                .bind(&tenant_id)
                .bind(&skill.name)
                .fetch_optional(connection)?
                .map(|row| {
                    Ok::<_, StoreError>((
                        get::<String>(&row, "written_by_key")?,
                        get::<String>(&row, "author")?,
                    ))
                })
                .transpose()?;
                match (current, mode) {
                    (Some((key, _)), _) if key == skill.written_by_key => {
                        return Ok(SkillWritten::Repeated);
                    }
                    (Some(_), SkillWrite::Create) => return Ok(SkillWritten::Exists),
                    (Some((_, author)), SkillWrite::Update) if author != skill.author => {
                        return Ok(SkillWritten::OtherAuthor);
                    }
                    (None, SkillWrite::Update) => return Ok(SkillWritten::Missing),
                    _ => {}
                }
                query(
                    "INSERT INTO skills (tenant_id, name, description, body, required_tools, version, \
                     author, written_by_key, created_at, updated_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9) \
                     ON CONFLICT (tenant_id, name) DO UPDATE SET description = excluded.description, \
                     body = excluded.body, required_tools = excluded.required_tools, \
                     version = excluded.version, author = excluded.author, \
                     written_by_key = excluded.written_by_key, updated_at = excluded.updated_at",
                )
                .bind(&tenant_id)
                .bind(&skill.name)
                .bind(&skill.description)
                .bind(&skill.body)
                .bind(text(&serde_json::json!(skill.required_tools)))
                .bind(&skill.version)
                .bind(&skill.author)
                .bind(&skill.written_by_key)
                .bind(micros(skill.updated_at))
                .execute(connection)?;
                Ok(SkillWritten::Written)
            })
            .await
        })
    }

    fn delete_skill<'a>(
        &'a self,
        tenant_id: &'a str,
        name: &'a str,
        author: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let (tenant_id, name, author) = (tenant_id.to_owned(), name.to_owned(), author.to_owned());
        Box::pin(async move {
            self.flushed(move |connection| {
                let deleted =
                    query("DELETE FROM skills WHERE tenant_id = $1 AND name = $2 AND author = $3")
                        .bind(tenant_id)
                        .bind(name)
                        .bind(author)
                        .execute(connection)?;
                Ok(deleted == 1)
            })
            .await
        })
    }

    fn skills<'a>(
        &'a self,
        tenant_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<AuthoredSkill>, StoreError>> {
        Box::pin(async move {
            self.read(|connection| {
                query(&format!(
                    "SELECT {SKILL_COLUMNS} FROM skills WHERE tenant_id = $1 ORDER BY name"
                ))
                .bind(tenant_id)
                .fetch_all(connection)?
                .iter()
                .map(authored_skill)
                .collect()
            })
        })
    }
}
