//! [`stored_enum!`](crate::stored_enum): the one way keel declares a closed set of names that are stored, shown
//! and serialised as text (effect classes, journal and approval statuses). Each gets
//! `as_str`, `ALL`, `Display`, `FromStr` (an unknown name is an [`UnknownName`] error that lists
//! the known ones), serde and SQLite conversions — so a stored value keel does not know is a
//! read error, never a silent default.

/// A name outside a stored enum's set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{name}` is not a known {what} ({})", .known.join(", "))]
pub struct UnknownName {
    /// What kind of name was expected ("effect class", "journal status" …).
    pub what: &'static str,
    pub name: String,
    pub known: &'static [&'static str],
}

/// Declares a stored enum: `stored_enum! { /// doc  pub enum Name: "what it is" { A = "a", … } }`.
#[macro_export]
macro_rules! stored_enum {
    ($(#[$m:meta])* $vis:vis enum $name:ident : $what:literal {
        $($(#[$vm:meta])* $v:ident = $s:literal),+ $(,)?
    }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name { $($(#[$vm])* $v),+ }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$v),+];
            const NAMES: &'static [&'static str] = &[$($s),+];

            /// The stored name.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$v => $s),+ }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.pad(self.as_str())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::stored::UnknownName;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($s => Ok($name::$v),)+
                    _ => Err($crate::stored::UnknownName {
                        what: $what,
                        name: s.to_string(),
                        known: Self::NAMES,
                    }),
                }
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <::std::borrow::Cow<'de, str> as ::serde::Deserialize>::deserialize(d)?;
                s.parse().map_err(<D::Error as ::serde::de::Error>::custom)
            }
        }

        impl $crate::sql::ToSql for $name {
            fn to_sql(&self) -> $crate::sql::SqlRef<'_> {
                $crate::sql::SqlRef::Text(self.as_str())
            }
        }

        impl $crate::sql::FromSql for $name {
            fn column_result(
                v: $crate::sql::SqlRef<'_>,
            ) -> $crate::sql::FromSqlResult<Self> {
                <String as $crate::sql::FromSql>::column_result(v)?
                    .parse()
                    .map_err($crate::sql::FromSqlError::other)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    stored_enum! {
        /// A test set.
        enum Colour: "colour" { Red = "red", DarkBlue = "dark-blue" }
    }

    #[test]
    fn names_round_trip_and_unknown_ones_are_errors() {
        for c in Colour::ALL {
            assert_eq!(c.as_str().parse::<Colour>().unwrap(), *c);
            let v = serde_json::to_value(c).unwrap();
            assert_eq!(v, c.as_str());
            assert_eq!(serde_json::from_value::<Colour>(v).unwrap(), *c);
        }
        let e = "green".parse::<Colour>().unwrap_err();
        assert_eq!(e.to_string(), "`green` is not a known colour (red, dark-blue)");
        assert!(serde_json::from_str::<Colour>("\"green\"").is_err());
        assert_eq!(format!("{:<10}|", Colour::Red), "red       |");
    }

    #[test]
    fn an_unknown_stored_name_is_a_read_error() {
        let c = crate::sql::Connection::from(rusqlite::Connection::open_in_memory().unwrap());
        let ok: Colour = c.query_row("SELECT ?1", [Colour::DarkBlue], |r| r.get(0)).unwrap();
        assert_eq!(ok, Colour::DarkBlue);
        assert!(c.query_row("SELECT 'green'", [], |r| r.get::<_, Colour>(0)).is_err());
    }
}
