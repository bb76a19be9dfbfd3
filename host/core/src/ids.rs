//! Identifier newtypes: a session id, a tool call id and an approval unit id are different
//! things, and the compiler keeps them apart. Each is text (stored, shown and serialised as
//! the bare string) and reads as a `&str` where one is needed.

macro_rules! id_newtype {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(
            Debug,
            Clone,
            Default,
            PartialEq,
            Eq,
            Hash,
            PartialOrd,
            Ord,
            serde::Serialize,
            serde::Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub fn new(id: impl Into<String>) -> Self {
                Self(id.into())
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }

            /// The text, to build an id from parts (a streamed call id).
            pub fn as_mut_string(&mut self) -> &mut String {
                &mut self.0
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

        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(s)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.to_string())
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                &self.0 == other
            }
        }

        impl PartialEq<$name> for str {
            fn eq(&self, other: &$name) -> bool {
                self == other.0
            }
        }

        impl PartialEq<$name> for &str {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }

        impl PartialEq<$name> for String {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }

        impl rusqlite::ToSql for $name {
            fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
                Ok(self.0.as_str().into())
            }
        }

        impl rusqlite::types::FromSql for $name {
            fn column_result(
                v: rusqlite::types::ValueRef<'_>,
            ) -> rusqlite::types::FromSqlResult<Self> {
                String::column_result(v).map(Self)
            }
        }
    };
}

id_newtype! {
    /// A session's id (chosen with `--id`, or generated).
    SessionId
}

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
        let c = rusqlite::Connection::open_in_memory().unwrap();
        let read: UnitId = c.query_row("SELECT ?1", [&unit], |r| r.get(0)).unwrap();
        assert_eq!(read, unit);
    }
}
