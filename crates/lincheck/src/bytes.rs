//! Byte strings in JSON and in reports.
//!
//! In JSON a byte string that is valid UTF-8 is written as a string (readable in a saved history) and any other as
//! an array of numbers; both forms are read back to the same bytes, so the encoding is exact.

use std::fmt;

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How many bytes of a key or value `Display` implementations show before eliding the rest.
pub(crate) const DISPLAY_MAX: usize = 64;

/// Serialises borrowed bytes as a string when they are UTF-8, else as an array of numbers.
struct Ser<'a>(&'a [u8]);

impl Serialize for Ser<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(self.0) {
            Ok(text) => s.serialize_str(text),
            Err(_) => s.collect_seq(self.0),
        }
    }
}

/// Deserialises bytes from a string, a byte string or an array of numbers.
struct De(Vec<u8>);

impl<'de> Deserialize<'de> for De {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = De;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or an array of bytes")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<De, E> {
                Ok(De(v.as_bytes().to_vec()))
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<De, E> {
                Ok(De(v.to_vec()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<De, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
                while let Some(b) = seq.next_element::<u8>()? {
                    out.push(b);
                }
                Ok(De(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// `#[serde(with)]` module for `Vec<u8>`.
pub(crate) mod plain {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        Ser(b).serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        De::deserialize(d).map(|b| b.0)
    }
}

/// `#[serde(with)]` module for `Option<Vec<u8>>` (`None` is `null`).
pub(crate) mod option {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(b: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        b.as_deref().map(Ser).serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Vec<u8>>, D::Error> {
        Option::<De>::deserialize(d).map(|b| b.map(|b| b.0))
    }
}

/// `#[serde(with)]` module for a byte-keyed map, written as a list of `{"key", "value"}` objects (JSON object keys
/// would have to be strings).
pub(crate) mod pairs {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(Serialize)]
    struct PairSer<'a> {
        key: Ser<'a>,
        value: Ser<'a>,
    }

    #[derive(Deserialize)]
    struct PairDe {
        key: De,
        value: De,
    }

    pub(crate) fn serialize<S: Serializer>(
        m: &BTreeMap<Vec<u8>, Vec<u8>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_seq(m.iter().map(|(k, v)| PairSer {
            key: Ser(k),
            value: Ser(v),
        }))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, D::Error> {
        let pairs = Vec::<PairDe>::deserialize(d)?;
        Ok(pairs.into_iter().map(|p| (p.key.0, p.value.0)).collect())
    }
}

/// Shows bytes in a report: quoted, with non-printable bytes escaped (`"a\x00"`), elided after `.1` bytes.
pub(crate) struct Shown<'a>(pub(crate) &'a [u8], pub(crate) usize);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Shown(b, max) = *self;
        let head = &b[..b.len().min(max)];
        write!(f, "\"{}\"", head.escape_ascii())?;
        if head.len() < b.len() {
            write!(f, "… ({} bytes)", b.len())?;
        }
        Ok(())
    }
}

/// Shows a register value: `nil` when absent, else [`Shown`].
pub(crate) struct ShownValue<'a>(pub(crate) Option<&'a [u8]>, pub(crate) usize);

impl fmt::Display for ShownValue<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(b) => Shown(b, self.1).fmt(f),
            None => f.write_str("nil"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_escapes_and_elides() {
        assert_eq!(Shown(b"ab\x00\"", 10).to_string(), r#""ab\x00\"""#);
        assert_eq!(Shown(b"abcdef", 3).to_string(), "\"abc\"… (6 bytes)");
        assert_eq!(ShownValue(None, 3).to_string(), "nil");
        assert_eq!(ShownValue(Some(b""), 3).to_string(), "\"\"");
    }
}
