//! Statements on a rusqlite connection, bound as the store's SQL is
//! written (`$1`, `$2`, … by number, wherever they appear) and read back as
//! owned rows whose columns are found by name. Prepared statements are
//! cached per connection.

use std::sync::Arc;

use rusqlite::types::{FromSql, Value, ValueRef};
use rusqlite::{Connection, ErrorCode};

use crate::ports::StoreError;

/// Statements kept prepared per connection: every statement the store
/// writes fits.
pub(super) const STATEMENT_CACHE: usize = 128;

/// A driver error as the port's: busy and I/O faults are the store being
/// unavailable, everything else a failed query. SQLite's messages name
/// tables and constraints, never bound values.
pub(super) fn sqlite_error(error: rusqlite::Error) -> StoreError {
    match &error {
        rusqlite::Error::SqliteFailure(failure, _)
            if matches!(
                failure.code,
                ErrorCode::DatabaseBusy
                    | ErrorCode::DatabaseLocked
                    | ErrorCode::CannotOpen
                    | ErrorCode::SystemIoFailure
                    | ErrorCode::DiskFull
                    | ErrorCode::ReadOnly
                    | ErrorCode::DatabaseCorrupt
                    | ErrorCode::NotADatabase
                    | ErrorCode::OutOfMemory
                    | ErrorCode::PermissionDenied
            ) =>
        {
            StoreError::Unavailable(error.to_string())
        }
        _ => StoreError::Query(error.to_string()),
    }
}

/// Runs a statement without values that every transaction runs (`BEGIN`,
/// `COMMIT`, a savepoint's): kept prepared, not parsed again each time.
pub(super) fn run(connection: &Connection, sql: &str) -> Result<(), StoreError> {
    connection
        .prepare_cached(sql)
        .and_then(|mut statement| statement.raw_execute())
        .map(|_| ())
        .map_err(sqlite_error)
}

/// A value a statement binds.
pub(super) trait Bind {
    /// The value as SQLite stores it.
    fn value(self) -> Value;
}

impl Bind for Value {
    fn value(self) -> Value {
        self
    }
}

impl Bind for String {
    fn value(self) -> Value {
        Value::Text(self)
    }
}

impl Bind for &String {
    fn value(self) -> Value {
        Value::Text(self.clone())
    }
}

impl Bind for &str {
    fn value(self) -> Value {
        Value::Text(self.to_owned())
    }
}

impl Bind for i64 {
    fn value(self) -> Value {
        Value::Integer(self)
    }
}

impl Bind for i32 {
    fn value(self) -> Value {
        Value::Integer(i64::from(self))
    }
}

impl Bind for bool {
    fn value(self) -> Value {
        Value::Integer(i64::from(self))
    }
}

impl<T: Bind> Bind for Option<T> {
    fn value(self) -> Value {
        self.map_or(Value::Null, Bind::value)
    }
}

impl Bind for &Option<String> {
    fn value(self) -> Value {
        self.as_deref()
            .map_or(Value::Null, |text| Value::Text(text.to_owned()))
    }
}

impl Bind for crate::adapters::store::invocations::Value {
    fn value(self) -> Value {
        use crate::adapters::store::invocations::Value as Plain;
        match self {
            Plain::Text(text) => text.map_or(Value::Null, Value::Text),
            Plain::Integer(number) => number.map_or(Value::Null, Value::Integer),
            Plain::Flag(flag) => Value::Integer(i64::from(flag)),
            Plain::Uuid(id) => id.map_or(Value::Null, |id| Value::Text(id.to_string())),
            Plain::Time(at) => at.map_or(Value::Null, |at| Value::Integer(at.timestamp_micros())),
            Plain::Json(json) => json
                .as_ref()
                .map_or(Value::Null, |json| Value::Text(super::text(json))),
            // PostgreSQL's arrays: no SQLite statement names them.
            Plain::Kinds(_) | Plain::Bodies(_) => Value::Null,
        }
    }
}

/// One statement and the values of its `$N` parameters, in order.
pub(super) struct Query<'q> {
    sql: &'q str,
    values: Vec<Value>,
}

/// A statement to bind and run.
pub(super) fn query(sql: &str) -> Query<'_> {
    Query {
        sql,
        values: Vec::new(),
    }
}

impl Query<'_> {
    /// The next parameter's value: `$1`, then `$2`, …
    pub(super) fn bind(mut self, value: impl Bind) -> Self {
        self.values.push(value.value());
        self
    }

    fn prepared<'c>(
        &self,
        connection: &'c Connection,
    ) -> Result<rusqlite::CachedStatement<'c>, StoreError> {
        let mut statement = connection.prepare_cached(self.sql).map_err(sqlite_error)?;
        // SQLite numbers a statement's parameters in the order they first
        // appear: each index's name says which `$N` it is. A statement need
        // not use every number it is given.
        for index in 1..=statement.parameter_count() {
            let number = statement
                .parameter_name(index)
                .and_then(|name| name.strip_prefix('$'))
                .and_then(|number| number.parse::<usize>().ok())
                .ok_or_else(|| StoreError::Query(format!("parameter {index} is not named $N")))?;
            let value = self
                .values
                .get(number.wrapping_sub(1))
                .ok_or_else(|| StoreError::Query(format!("${number} has no value bound")))?;
            statement
                .raw_bind_parameter(index, value)
                .map_err(sqlite_error)?;
        }
        Ok(statement)
    }

    /// Runs it: how many rows it changed.
    pub(super) fn execute(self, connection: &Connection) -> Result<usize, StoreError> {
        self.prepared(connection)?
            .raw_execute()
            .map_err(sqlite_error)
    }

    /// Every row it returns.
    pub(super) fn fetch_all(self, connection: &Connection) -> Result<Vec<Row>, StoreError> {
        let mut statement = self.prepared(connection)?;
        let names: Arc<[String]> = statement
            .column_names()
            .into_iter()
            .map(str::to_owned)
            .collect();
        let mut rows = statement.raw_query();
        let mut read = Vec::new();
        while let Some(row) = rows.next().map_err(sqlite_error)? {
            let values = (0..names.len())
                .map(|index| row.get::<_, Value>(index))
                .collect::<Result<Vec<Value>, _>>()
                .map_err(sqlite_error)?;
            read.push(Row {
                names: names.clone(),
                values,
            });
        }
        Ok(read)
    }

    /// Its first row, if any.
    pub(super) fn fetch_optional(self, connection: &Connection) -> Result<Option<Row>, StoreError> {
        Ok(self.fetch_all(connection)?.into_iter().next())
    }

    /// Its first row, which must exist.
    pub(super) fn fetch_one(self, connection: &Connection) -> Result<Row, StoreError> {
        self.fetch_optional(connection)?
            .ok_or_else(|| StoreError::Query("a query returned no row".into()))
    }
}

/// A row read back, its columns by name.
#[derive(Debug, Clone)]
pub(in crate::adapters::store) struct Row {
    names: Arc<[String]>,
    values: Vec<Value>,
}

impl Row {
    fn value(&self, column: &str) -> Result<&Value, StoreError> {
        self.names
            .iter()
            .position(|name| name == column)
            .and_then(|index| self.values.get(index))
            .ok_or_else(|| StoreError::Decode(format!("{column}: no such column")))
    }
}

/// A column of `row` as `T`.
pub(super) fn get<T: FromSql>(row: &Row, column: &str) -> Result<T, StoreError> {
    T::column_result(ValueRef::from(row.value(column)?))
        .map_err(|error| StoreError::Decode(format!("{column}: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_bound_by_their_number_wherever_they_stand() {
        let connection = Connection::open_in_memory().unwrap();
        let row = query("SELECT $3 AS c, $1 AS a, $2 + 1 AS b, $1 AS again")
            .bind("first")
            .bind(41_i64)
            .bind(Some(true))
            .fetch_one(&connection)
            .unwrap();
        assert_eq!(get::<String>(&row, "a").unwrap(), "first");
        assert_eq!(get::<i64>(&row, "b").unwrap(), 42);
        assert!(get::<bool>(&row, "c").unwrap());
        assert_eq!(get::<String>(&row, "again").unwrap(), "first");
        assert!(matches!(
            get::<i64>(&row, "missing"),
            Err(StoreError::Decode(_))
        ));
        // A number the statement does not use is no error.
        let row = query("SELECT $2 AS only")
            .bind(Option::<String>::None)
            .bind(7_i64)
            .fetch_one(&connection)
            .unwrap();
        assert_eq!(get::<Option<i64>>(&row, "only").unwrap(), Some(7));
        // A number it uses but is not given is.
        assert!(matches!(
            query("SELECT $1 AS a, $2 AS b")
                .bind(1_i64)
                .fetch_one(&connection),
            Err(StoreError::Query(_))
        ));
    }
}
