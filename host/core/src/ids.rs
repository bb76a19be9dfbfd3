//! Identifier newtypes: a session id, a tool call id and an approval unit id are different
//! things, and the compiler keeps them apart. Each is text (stored, shown and serialised as
//! the bare string) and reads as a `&str` where one is needed.

/// What every id is, whatever holds its text: read as a `&str`, compared with text, shown,
/// serialised and stored as the bare string.
macro_rules! id_text {
    ($name:ident) => {
        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.into())
            }
        }

        impl From<&String> for $name {
            fn from(s: &String) -> Self {
                Self(s.as_str().into())
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0.to_string()
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                &*self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                &*self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                &*self.0 == other.as_str()
            }
        }

        impl PartialEq<$name> for str {
            fn eq(&self, other: &$name) -> bool {
                self == &*other.0
            }
        }

        impl PartialEq<$name> for &str {
            fn eq(&self, other: &$name) -> bool {
                *self == &*other.0
            }
        }

        impl PartialEq<$name> for String {
            fn eq(&self, other: &$name) -> bool {
                self.as_str() == &*other.0
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                String::deserialize(d).map(Self::from)
            }
        }

        impl $crate::sql::ToSql for $name {
            fn to_sql(&self) -> $crate::sql::SqlRef<'_> {
                $crate::sql::SqlRef::Text(&self.0)
            }
        }

        impl $crate::sql::FromSql for $name {
            fn column_result(v: $crate::sql::SqlRef<'_>) -> $crate::sql::FromSqlResult<Self> {
                <String as $crate::sql::FromSql>::column_result(v).map(Self::from)
            }
        }
    };
}

/// An id whose text is built in place (an owned `String`).
macro_rules! id_newtype {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            pub fn new(id: impl Into<String>) -> Self {
                Self(id.into())
            }

            pub fn into_string(self) -> String {
                self.0
            }

            /// The text, to build an id from parts (a streamed call id).
            pub fn as_mut_string(&mut self) -> &mut String {
                &mut self.0
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(s)
            }
        }

        id_text!($name);
    };
}

/// A session's id (chosen with `--id`, or generated). Its text is shared: a clone (into a
/// store closure, a task, an event) copies a pointer, not the text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(std::sync::Arc<str>);

impl SessionId {
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into().into())
    }

    pub fn into_string(self) -> String {
        self.0.to_string()
    }
}

impl From<String> for SessionId {
    fn from(s: String) -> Self {
        Self(s.into())
    }
}

id_text!(SessionId);

id_newtype! {
    /// A tool call's id within its step (the model's, or one keel gave it).
    CallId
}

id_newtype! {
    /// An approval unit's id (`ap-…`).
    UnitId
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_read_as_text_and_stay_apart() {
        let unit = UnitId::new("ap-123");
        assert_eq!(unit, "ap-123");
        assert_eq!(unit.len(), 6, "reads as a str");
        assert_eq!(serde_json::to_string(&unit).unwrap(), "\"ap-123\"");
        let back: UnitId = serde_json::from_str("\"ap-123\"").unwrap();
        assert_eq!(back, unit);
        assert_eq!(format!("[{unit:>8}]"), "[  ap-123]");
        let c = crate::sql::Connection::from(rusqlite::Connection::open_in_memory().unwrap());
        let read: UnitId = c.query_row("SELECT ?1", [&unit], |r| r.get(0)).unwrap();
        assert_eq!(read, unit);

        let session = SessionId::new("s-1");
        let shared = session.clone();
        assert!(std::ptr::eq(session.as_str(), shared.as_str()), "a clone shares the text");
        assert_eq!(serde_json::to_string(&session).unwrap(), "\"s-1\"");
        let back: SessionId = serde_json::from_str("\"s-1\"").unwrap();
        assert_eq!(back, "s-1");
        let read: SessionId = c.query_row("SELECT ?1", [&session], |r| r.get(0)).unwrap();
        assert_eq!((read.as_str(), format!("{session:<4}|")), ("s-1", "s-1 |".to_string()));
    }
}
