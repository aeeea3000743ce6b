//! JSON read strictly: a member named twice in one object is an error, never read first-wins or last-wins (parsers
//! disagree on which, so a token's claims or an admin body could mean one thing here and another elsewhere).

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// A JSON value in which no object names a member twice, at any depth.
#[derive(Debug, Clone, PartialEq)]
pub struct UniqueMembers(pub Value);

/// A JWT's claims: an object whose members are all unique.
#[derive(Debug, Clone, PartialEq)]
pub struct Claims(pub Map<String, Value>);

/// The JSON object of `bytes` with unique members, or why not (not JSON, a duplicated member, or another value
/// than an object: an admin body is an object, and an array would otherwise be read as a struct's fields in order).
pub fn object(bytes: &[u8]) -> Result<Value, String> {
    match serde_json::from_slice::<UniqueMembers>(bytes) {
        Ok(UniqueMembers(value @ Value::Object(_))) => Ok(value),
        Ok(_) => Err("the body must be a JSON object".to_owned()),
        Err(error) => Err(error.to_string()),
    }
}

// === impl UniqueMembers ===

impl<'de> Deserialize<'de> for UniqueMembers {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(StrictVisitor)
            .map(UniqueMembers)
    }
}

impl<'de> Deserialize<'de> for Claims {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match deserializer.deserialize_any(StrictVisitor)? {
            Value::Object(members) => Ok(Claims(members)),
            _ => Err(de::Error::custom("the claims are not a JSON object")),
        }
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(UniqueMembers(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut members = Map::new();
        while let Some(name) = map.next_key::<String>()? {
            if members.contains_key(&name) {
                return Err(de::Error::custom(format!("duplicate member {name:?}")));
            }
            let UniqueMembers(value) = map.next_value()?;
            members.insert(name, value);
        }
        Ok(Value::Object(members))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_named_twice_is_refused_at_any_depth() {
        assert!(object(br#"{"plan":"pro","blocked":false}"#).is_ok());
        for body in [
            r#"{"plan":"pro","plan":"free"}"#,
            r#"{"overrides":{"hourly":{"burst":1},"hourly":{"burst":9}}}"#,
            r#"{"a":[{"b":1,"b":2}]}"#,
        ] {
            let error = object(body.as_bytes()).expect_err(body);
            assert!(error.contains("duplicate member"), "{body}: {error}");
        }
        let claims: Result<Claims, _> = serde_json::from_str(r#"{"sub":"alice","sub":"bob"}"#);
        assert!(claims.is_err());
    }

    #[test]
    fn only_an_object_is_a_body() {
        for body in [r#"["pro",{},false]"#, "1", "\"x\"", "null"] {
            assert!(object(body.as_bytes()).is_err(), "{body}");
        }
    }
}
