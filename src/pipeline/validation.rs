//! Argument validation: schema preparation at registration, compiled
//! validators cached per tool version, and step 4 and 5 at call time.
//!
//! JSON Schema draft 2020-12 with no remote retrieval: `$ref` resolves only
//! within the document, unknown properties are refused unless the schema says
//! otherwise, and errors name the failing path without echoing the value.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};

use crate::domain::{CanonicalArguments, CanonicalError, canonicalize, sha256_hex};

/// The only dialect accepted.
pub const DRAFT_2020_12: &str = "https://json-schema.org/draft/2020-12/schema";
/// Draft-07, which most MCP servers still declare. A remote draft-07 schema
/// is accepted as 2020-12 when it uses no keyword whose meaning changed
/// between the two (array-form `items`, `additionalItems`, `dependencies`).
pub const DRAFT_07: &str = "http://json-schema.org/draft-07/schema";
/// Depth cap for schemas that arrive from outside (MCP, devices).
pub const REMOTE_SCHEMA_MAXIMUM_DEPTH: usize = 16;
/// Serialized size cap for schemas that arrive from outside.
pub const REMOTE_SCHEMA_MAXIMUM_BYTES: usize = 32 * 1024;
/// Schema locations quoted in errors are cut here.
const MAXIMUM_POINTER_LENGTH: usize = 256;

/// Where a schema came from, which decides its caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SchemaOrigin {
    /// Written by us; trusted to be sane in size.
    Local,
    /// Written by a server or device: depth 16, 32 KB.
    Remote,
}

/// Why a schema cannot be registered. Never quotes the schema's content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// The root is not an object schema.
    #[error("schema root must be an object schema with type object")]
    NotObjectSchema,
    /// `$schema` names another dialect, or appears below the root.
    #[error("{pointer}: only JSON Schema draft 2020-12 at the root is accepted")]
    Dialect {
        /// Where.
        pointer: String,
    },
    /// A `$ref` or `$dynamicRef` leaving the document, or an `$id` below the
    /// root that would rebase one.
    #[error("{pointer}: references must stay within the document")]
    RemoteReference {
        /// Where.
        pointer: String,
    },
    /// Deeper than [`REMOTE_SCHEMA_MAXIMUM_DEPTH`].
    #[error("schema nests {depth} levels; at most {REMOTE_SCHEMA_MAXIMUM_DEPTH} are accepted")]
    TooDeep {
        /// Measured depth (the root object is 1).
        depth: usize,
    },
    /// Larger than [`REMOTE_SCHEMA_MAXIMUM_BYTES`].
    #[error("schema is {bytes} bytes; at most {REMOTE_SCHEMA_MAXIMUM_BYTES} are accepted")]
    TooLarge {
        /// Serialized size.
        bytes: usize,
    },
    /// The schema has no canonical form (it is hashed into the pinned set).
    #[error("schema has no canonical form: {0}")]
    NoCanonicalForm(CanonicalError),
    /// The schema is not valid draft 2020-12.
    #[error("{pointer}: not a valid draft 2020-12 schema (keyword {keyword})")]
    Invalid {
        /// Where in the schema.
        pointer: String,
        /// The meta-schema keyword that failed.
        keyword: String,
    },
}

/// Why arguments fail step 4 or 5. Names the failing place, never the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgumentError {
    /// Arguments must be a JSON object.
    #[error("/: arguments must be a JSON object")]
    NotAnObject,
    /// A schema keyword failed at `path`.
    #[error("{path}: fails {keyword}{}", detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Schema {
        /// JSON pointer into the arguments.
        path: String,
        /// The failing keyword, e.g. `type`, `required`.
        keyword: String,
        /// Schema-derived detail (a missing property's name), never a value.
        detail: Option<String>,
    },
    /// The document has no canonical form.
    #[error(transparent)]
    Canonical(#[from] CanonicalError),
}

/// A schema prepared for validation: closed by default and compiled once.
pub struct CompiledSchema {
    validator: jsonschema::Validator,
    /// The schema as prepared (with the inserted closures), for defaults.
    prepared: Value,
    /// Whether any property declares a `default`; most schemas do not, and
    /// then the arguments need no copy.
    has_defaults: bool,
}

impl std::fmt::Debug for CompiledSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledSchema").finish_non_exhaustive()
    }
}

impl CompiledSchema {
    /// Checks and compiles `schema`.
    pub fn compile(schema: &Value, origin: SchemaOrigin) -> Result<Self, SchemaError> {
        if origin == SchemaOrigin::Remote {
            let bytes = serde_json::to_vec(schema)
                .map(|v| v.len())
                .unwrap_or(usize::MAX);
            if bytes > REMOTE_SCHEMA_MAXIMUM_BYTES {
                return Err(SchemaError::TooLarge { bytes });
            }
            let depth = json_depth(schema);
            if depth > REMOTE_SCHEMA_MAXIMUM_DEPTH {
                return Err(SchemaError::TooDeep { depth });
            }
        }
        let Value::Object(root) = schema else {
            return Err(SchemaError::NotObjectSchema);
        };
        canonicalize(schema.clone()).map_err(SchemaError::NoCanonicalForm)?;
        match root.get("type") {
            None => {}
            Some(Value::String(kind)) if kind == "object" => {}
            Some(_) => return Err(SchemaError::NotObjectSchema),
        }
        let mut prepared = schema.clone();
        if let Some(dialect) = root.get("$schema") {
            let dialect = dialect.as_str().map(|d| d.trim_end_matches('#'));
            let translatable = origin == SchemaOrigin::Remote
                && dialect == Some(DRAFT_07)
                && !uses_changed_keywords(schema, 0);
            if dialect != Some(DRAFT_2020_12) && !translatable {
                return Err(SchemaError::Dialect {
                    pointer: "/$schema".into(),
                });
            }
            if translatable && let Value::Object(map) = &mut prepared {
                // Every keyword it uses means the same in 2020-12.
                map.remove("$schema");
            }
        }
        prepare(&mut prepared, &mut String::new(), Position::Root)?;
        let validator = jsonschema::draft202012::options()
            .build(&prepared)
            .map_err(|error| SchemaError::Invalid {
                pointer: cut(&error.instance_path().to_string()),
                keyword: error.kind().keyword().to_owned(),
            })?;
        let has_defaults = declares_defaults(&prepared, 0);
        Ok(CompiledSchema {
            validator,
            prepared,
            has_defaults,
        })
    }

    /// Step 4 and 5: normalizes, applies defaults, validates, and
    /// canonicalizes. What is validated is the NFC form that will execute
    /// (normalization can lengthen text), never the text as sent.
    pub fn validate(&self, arguments: Value) -> Result<CanonicalArguments, ArgumentError> {
        if !arguments.is_object() {
            return Err(ArgumentError::NotAnObject);
        }
        let normalized = canonicalize(arguments)?;
        if !self.has_defaults {
            // The boolean check is much cheaper; errors are built only on
            // failure.
            if self.validator.is_valid(&normalized.value) {
                return Ok(normalized);
            }
            return Err(self.refusal(&normalized.value));
        }
        let mut arguments = normalized.value;
        apply_defaults(&self.prepared, &mut arguments, 0);
        if self.validator.is_valid(&arguments) {
            // Defaults come from the schema, whose strings are canonical;
            // the form is taken again over the whole.
            return Ok(canonicalize(arguments)?);
        }
        Err(self.refusal(&arguments))
    }

    /// Why `arguments` fail the schema: where and which keyword, never the
    /// value.
    fn refusal(&self, arguments: &Value) -> ArgumentError {
        let error = self.validator.iter_errors(arguments).next();
        let (path, keyword, detail) = match error {
            Some(error) => {
                let detail = match error.kind() {
                    jsonschema::error::ValidationErrorKind::Required { property } => {
                        property.as_str().map(cut)
                    }
                    _ => None,
                };
                let path = cut(&pointer_or_root(&error.instance_path().to_string()));
                (path, error.kind().keyword().to_owned(), detail)
            }
            // is_valid and iter_errors disagreeing would be a validator bug;
            // the arguments are still refused.
            None => ("/".to_owned(), "schema".to_owned(), None),
        };
        ArgumentError::Schema {
            path,
            keyword,
            detail,
        }
    }
}

/// Compiled schemas keyed by origin and schema digest: a schema is
/// compiled once however many tools, versions and sessions declare it (a
/// catalog that churns re-declares most of its schemas unchanged).
#[derive(Default)]
pub struct SchemaCache {
    compiled: Mutex<HashMap<(SchemaOrigin, String), Arc<CompiledSchema>>>,
}

impl SchemaCache {
    /// The compiled `schema` of `origin`, compiling on first use.
    pub fn get_or_compile(
        &self,
        schema: &Value,
        origin: SchemaOrigin,
    ) -> Result<Arc<CompiledSchema>, SchemaError> {
        let digest = sha256_hex(&serde_json::to_vec(schema).unwrap_or_default());
        let key = (origin, digest);
        if let Some(found) = self.lock().get(&key) {
            return Ok(found.clone());
        }
        let compiled = Arc::new(CompiledSchema::compile(schema, origin)?);
        self.lock().insert(key, compiled.clone());
        Ok(compiled)
    }

    /// Drops the schemas no registered tool holds any more.
    pub fn collect(&self) {
        self.lock()
            .retain(|_, compiled| Arc::strong_count(compiled) > 1);
    }

    /// How many versions are compiled.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing is compiled yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(SchemaOrigin, String), Arc<CompiledSchema>>> {
        // A panic while holding the lock cannot leave the map half-written
        // (inserts are single calls), so a poisoned lock is still usable.
        self.compiled
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// How a subschema is reached, which decides whether it must be closed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Position {
    /// The root, or a schema an instance value is validated against directly
    /// (`properties/*`, `items`, ...): an object here is closed by default.
    Root,
    /// Inside an applicator (`allOf/*`, `$defs/*`, `then`, ...): its
    /// properties count as evaluated by the enclosing structural schema,
    /// which carries the closure.
    Applied,
}

const SCHEMA_MAPS: &[(&str, Position)] = &[
    ("properties", Position::Root),
    ("patternProperties", Position::Root),
    ("$defs", Position::Applied),
    ("definitions", Position::Applied),
    ("dependentSchemas", Position::Applied),
];
const SCHEMA_LISTS: &[(&str, Position)] = &[
    ("prefixItems", Position::Root),
    ("allOf", Position::Applied),
    ("anyOf", Position::Applied),
    ("oneOf", Position::Applied),
];
const SCHEMA_SINGLES: &[(&str, Position)] = &[
    ("items", Position::Root),
    ("contains", Position::Root),
    ("additionalProperties", Position::Root),
    ("unevaluatedProperties", Position::Root),
    ("unevaluatedItems", Position::Root),
    ("propertyNames", Position::Root),
    ("contentSchema", Position::Root),
    ("not", Position::Applied),
    ("if", Position::Applied),
    ("then", Position::Applied),
    ("else", Position::Applied),
];
const APPLICATORS: &[&str] = &[
    "allOf",
    "anyOf",
    "oneOf",
    "$ref",
    "$dynamicRef",
    "if",
    "dependentSchemas",
];

/// Checks references and dialect below the root, and closes object schemas:
/// `additionalProperties: false` where nothing composes, else
/// `unevaluatedProperties: false`, which sees through `$ref` and `allOf`.
fn prepare(
    schema: &mut Value,
    pointer: &mut String,
    position: Position,
) -> Result<(), SchemaError> {
    let Value::Object(map) = schema else {
        return Ok(());
    };
    for keyword in ["$ref", "$dynamicRef"] {
        if let Some(reference) = map.get(keyword)
            && !reference.as_str().is_some_and(|r| r.starts_with('#'))
        {
            return Err(SchemaError::RemoteReference {
                pointer: cut(&format!("{pointer}/{keyword}")),
            });
        }
    }
    if !pointer.is_empty() {
        if map.contains_key("$id") {
            return Err(SchemaError::RemoteReference {
                pointer: cut(&format!("{pointer}/$id")),
            });
        }
        if map.contains_key("$schema") {
            return Err(SchemaError::Dialect {
                pointer: cut(&format!("{pointer}/$schema")),
            });
        }
    }
    if position == Position::Root
        && is_object_schema(map)
        && !map.contains_key("additionalProperties")
        && !map.contains_key("unevaluatedProperties")
    {
        let composes = APPLICATORS.iter().any(|keyword| map.contains_key(*keyword));
        let closure = if composes {
            "unevaluatedProperties"
        } else {
            "additionalProperties"
        };
        map.insert(closure.to_owned(), Value::Bool(false));
    }
    let mark = pointer.len();
    for (keyword, child_position) in SCHEMA_MAPS {
        if let Some(Value::Object(children)) = map.get_mut(*keyword) {
            for (name, child) in children.iter_mut() {
                pointer.push_str(&format!("/{keyword}/{}", escape(name)));
                prepare(child, pointer, *child_position)?;
                pointer.truncate(mark);
            }
        }
    }
    for (keyword, child_position) in SCHEMA_LISTS {
        if let Some(Value::Array(children)) = map.get_mut(*keyword) {
            for (index, child) in children.iter_mut().enumerate() {
                pointer.push_str(&format!("/{keyword}/{index}"));
                prepare(child, pointer, *child_position)?;
                pointer.truncate(mark);
            }
        }
    }
    for (keyword, child_position) in SCHEMA_SINGLES {
        if let Some(child) = map.get_mut(*keyword) {
            pointer.push_str(&format!("/{keyword}"));
            prepare(child, pointer, *child_position)?;
            pointer.truncate(mark);
        }
    }
    Ok(())
}

fn is_object_schema(map: &Map<String, Value>) -> bool {
    let typed_object = match map.get("type") {
        Some(Value::String(kind)) => kind == "object",
        Some(Value::Array(kinds)) => kinds.iter().any(|k| k == "object"),
        _ => false,
    };
    typed_object
        || map.contains_key("properties")
        || map.contains_key("required")
        || APPLICATORS.iter().any(|keyword| map.contains_key(*keyword))
}

/// Inserts `default` values of absent properties, recursing into present
/// object-valued properties. Bounded by the canonical depth.
fn apply_defaults(schema: &Value, document: &mut Value, depth: usize) {
    if depth > crate::domain::canonical::MAXIMUM_DEPTH {
        return;
    }
    let (Some(properties), Value::Object(object)) = (
        schema.get("properties").and_then(Value::as_object),
        document,
    ) else {
        return;
    };
    for (name, property_schema) in properties {
        match object.get_mut(name) {
            Some(present) => apply_defaults(property_schema, present, depth + 1),
            None => {
                if let Some(default) = property_schema.get("default") {
                    object.insert(name.clone(), default.clone());
                }
            }
        }
    }
}

/// Whether `apply_defaults` would find a `default` to insert.
fn declares_defaults(schema: &Value, depth: usize) -> bool {
    if depth > crate::domain::canonical::MAXIMUM_DEPTH {
        return false;
    }
    schema
        .get("properties")
        .and_then(Value::as_object)
        .is_some_and(|properties| {
            properties.values().any(|property| {
                property.get("default").is_some() || declares_defaults(property, depth + 1)
            })
        })
}

/// Whether a draft-07 schema uses a keyword 2020-12 reads differently. A
/// property merely named like one is refused too: cheaper than telling
/// them apart, and only ever a refusal.
fn uses_changed_keywords(schema: &Value, depth: usize) -> bool {
    if depth > REMOTE_SCHEMA_MAXIMUM_DEPTH {
        return true;
    }
    match schema {
        Value::Object(map) => map.iter().any(|(key, value)| {
            matches!(key.as_str(), "additionalItems" | "dependencies")
                || (key == "items" && value.is_array())
                || uses_changed_keywords(value, depth + 1)
        }),
        Value::Array(items) => items
            .iter()
            .any(|item| uses_changed_keywords(item, depth + 1)),
        _ => false,
    }
}

/// Nesting depth of a JSON value: a scalar is 0, the root object 1.
pub fn json_depth(value: &Value) -> usize {
    // Iterative, so a hostile schema cannot exhaust the stack here.
    let mut deepest = 0;
    let mut stack = vec![(value, 1usize)];
    while let Some((value, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match value {
            Value::Object(map) => Box::new(map.values()),
            Value::Array(items) => Box::new(items.iter()),
            _ => continue,
        };
        deepest = deepest.max(depth);
        stack.extend(children.map(|child| (child, depth + 1)));
    }
    deepest
}

fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

fn pointer_or_root(pointer: &str) -> String {
    if pointer.is_empty() {
        "/".to_owned()
    } else {
        pointer.to_owned()
    }
}

fn cut(text: &str) -> String {
    if text.len() <= MAXIMUM_POINTER_LENGTH {
        return text.to_owned();
    }
    let mut end = MAXIMUM_POINTER_LENGTH;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn compile(schema: Value) -> CompiledSchema {
        CompiledSchema::compile(&schema, SchemaOrigin::Local).unwrap()
    }

    /// U+0958 has no NFC form of its own: it becomes two code points. A
    /// limit checked before normalization would let twice the limit through.
    #[test]
    fn arguments_are_validated_in_the_nfc_form_that_executes() {
        let limited = compile(json!({"type": "object", "properties": {
            "text": {"type": "string", "maxLength": 4096},
            "key": {"type": "string", "pattern": "^\u{0915}\u{093c}$"}
        }}));
        let expanding = "\u{0958}".repeat(4096);
        assert!(
            limited.validate(json!({ "text": expanding })).is_err(),
            "4,096 code points that execute as 8,192 passed a 4,096 limit"
        );
        let within = "\u{0958}".repeat(2048);
        let canonical = limited.validate(json!({ "text": within })).unwrap();
        assert_eq!(
            canonical.value["text"].as_str().unwrap().chars().count(),
            4096
        );
        // A pattern written for the NFC form matches what executes.
        assert!(limited.validate(json!({"key": "\u{0958}"})).is_ok());
    }

    #[test]
    fn unknown_properties_are_refused_unless_allowed() {
        let closed = compile(json!({"type": "object", "properties": {"a": {"type": "string"}}}));
        assert!(closed.validate(json!({"a": "x"})).is_ok());
        let error = closed
            .validate(json!({"a": "x", "secret-value": 1}))
            .unwrap_err();
        assert!(
            matches!(&error, ArgumentError::Schema { keyword, .. } if keyword == "additionalProperties")
        );
        assert!(!error.to_string().contains("secret-value"));

        let open = compile(json!({"type": "object", "additionalProperties": true}));
        assert!(open.validate(json!({"anything": 1})).is_ok());
    }

    #[test]
    fn nested_objects_are_closed_too() {
        let schema = compile(json!({"type": "object", "properties": {
            "inner": {"type": "object", "properties": {"x": {"type": "integer"}}},
            "list": {"type": "array", "items": {"type": "object", "properties": {"y": {}}}}
        }}));
        assert!(
            schema
                .validate(json!({"inner": {"x": 1}, "list": [{"y": 2}]}))
                .is_ok()
        );
        let error = schema
            .validate(json!({"inner": {"x": 1, "z": 2}}))
            .unwrap_err();
        assert!(
            matches!(&error, ArgumentError::Schema { path, .. } if path == "/inner"),
            "{error}"
        );
        assert!(
            schema
                .validate(json!({"list": [{"y": 2, "q": 0}]}))
                .is_err()
        );
    }

    #[test]
    fn composition_closes_over_evaluated_properties() {
        let schema = compile(json!({
            "type": "object",
            "allOf": [{"$ref": "#/$defs/a"}, {"properties": {"b": {"type": "string"}}}],
            "$defs": {"a": {"properties": {"a": {"type": "string"}}}}
        }));
        assert!(schema.validate(json!({"a": "x", "b": "y"})).is_ok());
        assert!(schema.validate(json!({"a": "x", "c": "y"})).is_err());
    }

    #[test]
    fn errors_name_the_path_not_the_value() {
        let schema = compile(json!({"type": "object", "required": ["path"],
            "properties": {"path": {"type": "string", "maxLength": 3}}}));
        let error = schema
            .validate(json!({"path": "sk-live-123456"}))
            .unwrap_err();
        let text = error.to_string();
        assert!(text.starts_with("/path: fails maxLength"), "{text}");
        assert!(!text.contains("sk-live"));
        let missing = schema.validate(json!({})).unwrap_err();
        assert_eq!(missing.to_string(), "/: fails required (path)");
        assert_eq!(
            schema.validate(json!([1])).unwrap_err(),
            ArgumentError::NotAnObject
        );
    }

    #[test]
    fn defaults_are_applied_before_hashing() {
        let schema = compile(json!({"type": "object", "properties": {
            "count": {"type": "integer", "default": 10}, "name": {"type": "string"}}}));
        let implicit = schema.validate(json!({"name": "x"})).unwrap();
        let explicit = schema.validate(json!({"name": "x", "count": 10})).unwrap();
        assert_eq!(implicit.sha256, explicit.sha256);
        assert_eq!(implicit.text, r#"{"count":10,"name":"x"}"#);
    }

    #[test]
    fn remote_references_are_refused() {
        for schema in [
            json!({"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}}),
            json!({"type": "object", "$ref": "other.json#/x"}),
            json!({"type": "object", "properties": {"a": {"$id": "https://example.com/a", "type": "string"}}}),
            json!({"type": "object", "$dynamicRef": "https://example.com/d"}),
        ] {
            let error = CompiledSchema::compile(&schema, SchemaOrigin::Local).unwrap_err();
            assert!(
                matches!(error, SchemaError::RemoteReference { .. }),
                "{schema}: {error}"
            );
        }
        // A property merely named $ref is data, not a reference.
        compile(json!({"type": "object", "properties": {"$ref": {"type": "string"}}}));
    }

    #[test]
    fn dialect_is_draft_2020_12_only() {
        compile(json!({"$schema": DRAFT_2020_12, "type": "object"}));
        let old = json!({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"});
        assert!(matches!(
            CompiledSchema::compile(&old, SchemaOrigin::Local),
            Err(SchemaError::Dialect { .. })
        ));
        // A remote draft-07 schema whose keywords mean the same is read as
        // 2020-12; one using array-form items is not.
        let remote = CompiledSchema::compile(&old, SchemaOrigin::Remote).unwrap();
        assert!(remote.validate(json!({})).is_ok());
        let tuple = json!({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
            "properties": {"pair": {"type": "array", "items": [{"type": "string"}]}}});
        assert!(matches!(
            CompiledSchema::compile(&tuple, SchemaOrigin::Remote),
            Err(SchemaError::Dialect { .. })
        ));
        let other = json!({"$schema": "http://json-schema.org/draft-04/schema#", "type": "object"});
        assert!(matches!(
            CompiledSchema::compile(&other, SchemaOrigin::Remote),
            Err(SchemaError::Dialect { .. })
        ));
        let invalid = json!({"type": "object", "properties": {"a": {"type": 12}}});
        assert!(matches!(
            CompiledSchema::compile(&invalid, SchemaOrigin::Local),
            Err(SchemaError::Invalid { .. })
        ));
        assert_eq!(
            CompiledSchema::compile(&json!({"type": "string"}), SchemaOrigin::Local).unwrap_err(),
            SchemaError::NotObjectSchema
        );
    }

    #[test]
    fn remote_schemas_are_capped() {
        let mut deep = json!({"type": "string"});
        for _ in 0..8 {
            deep = json!({"type": "object", "properties": {"x": deep}});
        }
        // Each level adds two (the schema object and its properties map).
        assert_eq!(json_depth(&deep), 17);
        assert_eq!(
            CompiledSchema::compile(&deep, SchemaOrigin::Remote).unwrap_err(),
            SchemaError::TooDeep { depth: 17 }
        );
        assert!(CompiledSchema::compile(&deep, SchemaOrigin::Local).is_ok());

        let description = "x".repeat(REMOTE_SCHEMA_MAXIMUM_BYTES);
        let large = json!({"type": "object", "description": description});
        assert!(matches!(
            CompiledSchema::compile(&large, SchemaOrigin::Remote),
            Err(SchemaError::TooLarge { .. })
        ));
    }

    #[test]
    fn cache_compiles_each_schema_once_whatever_declares_it() {
        let cache = SchemaCache::default();
        let schema = json!({"type": "object"});
        let first = cache.get_or_compile(&schema, SchemaOrigin::Local).unwrap();
        let again = cache.get_or_compile(&schema, SchemaOrigin::Local).unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        // Another origin has other caps: compiled apart.
        cache.get_or_compile(&schema, SchemaOrigin::Remote).unwrap();
        cache
            .get_or_compile(
                &json!({"type": "object", "properties": {}}),
                SchemaOrigin::Local,
            )
            .unwrap();
        assert_eq!(cache.len(), 3);
    }
}
