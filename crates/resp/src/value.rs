//! Whole RESP2/RESP3 values: what a client reads back. The server writes replies with
//! [`ReplyWriter`](crate::ReplyWriter) directly; this type is for clients, tests and tools that need to read any
//! reply, nested types included, within limits.

use crate::parse::parse_i64;
use crate::reply::{Protocol, ReplyWriter};

/// Default of [`ValueLimits::max_depth`].
pub const DEFAULT_MAX_DEPTH: usize = 128;
/// Default of [`ValueLimits::max_elements`].
pub const DEFAULT_MAX_ELEMENTS: usize = 1 << 24;

/// A RESP2 or RESP3 value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `+text`.
    Simple(Vec<u8>),
    /// `-CODE text`.
    Error(Vec<u8>),
    /// `:n`.
    Integer(i64),
    /// `$len`, binary-safe.
    Bulk(Vec<u8>),
    /// RESP3's null, `_`.
    Null,
    /// RESP2's null bulk string, `$-1`.
    NullBulk,
    /// RESP2's null array, `*-1`.
    NullArray,
    /// `*len`.
    Array(Vec<Value>),
    /// `%len` (RESP3).
    Map(Vec<(Value, Value)>),
    /// `~len` (RESP3).
    Set(Vec<Value>),
    /// `>len` (RESP3).
    Push(Vec<Value>),
    /// `,x` (RESP3).
    Double(f64),
    /// `#t` / `#f` (RESP3).
    Boolean(bool),
    /// `(digits` (RESP3).
    BigNumber(Vec<u8>),
    /// `=len` with a three-letter format (RESP3).
    Verbatim([u8; 3], Vec<u8>),
    /// `!len` (RESP3).
    BulkError(Vec<u8>),
    /// `|len` attributes (RESP3) and the value they describe.
    Attribute(Vec<(Value, Value)>, Box<Value>),
}

/// Bounds on a value being read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueLimits {
    /// Longest bulk string (and verbatim string, bulk error). Default
    /// [`DEFAULT_MAX_BULK_LEN`](crate::parse::DEFAULT_MAX_BULK_LEN).
    pub max_bulk_len: usize,
    /// Most elements of one aggregate. Default [`DEFAULT_MAX_ELEMENTS`].
    pub max_elements: usize,
    /// Deepest nesting of aggregates (arrays, maps, sets, pushes, attributes). Default [`DEFAULT_MAX_DEPTH`].
    pub max_depth: usize,
}

impl Default for ValueLimits {
    fn default() -> Self {
        ValueLimits {
            max_bulk_len: crate::parse::DEFAULT_MAX_BULK_LEN,
            max_elements: DEFAULT_MAX_ELEMENTS,
            max_depth: DEFAULT_MAX_DEPTH,
        }
    }
}

/// A value that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// The bytes are not RESP.
    #[error("invalid RESP: {0}")]
    Invalid(String),
    /// Nested deeper than [`ValueLimits::max_depth`].
    #[error("value nested deeper than {0} levels")]
    TooDeep(usize),
    /// A length beyond [`ValueLimits::max_bulk_len`] or [`ValueLimits::max_elements`].
    #[error("length {len} exceeds the limit of {max}")]
    TooLong {
        /// Announced length.
        len: i64,
        /// The limit.
        max: usize,
    },
}

impl Value {
    /// Reads one value from the front of `input`: the value and the bytes it took, or `Ok(None)` when `input` ends
    /// before the value does.
    pub fn parse(input: &[u8], limits: &ValueLimits) -> Result<Option<(Value, usize)>, ValueError> {
        let mut r = Reader {
            input,
            pos: 0,
            limits,
        };
        match r.value(0) {
            Ok(v) => Ok(Some((v, r.pos))),
            Err(Stop::More) => Ok(None),
            Err(Stop::Error(e)) => Err(e),
        }
    }

    /// Writes the value in `w`'s protocol (RESP3 types as RESP2 represents them; attributes are dropped in RESP2,
    /// which has none).
    pub fn write(&self, w: &mut ReplyWriter<'_>) {
        match self {
            Value::Simple(s) => w.simple(s),
            Value::Error(e) => w.error(e),
            Value::Integer(n) => w.integer(*n),
            Value::Bulk(b) => w.bulk(b),
            Value::Null | Value::NullBulk => w.null(),
            Value::NullArray => w.null_array(),
            Value::Array(items) => {
                w.array(items.len());
                items.iter().for_each(|v| v.write(w));
            }
            Value::Set(items) => {
                w.set(items.len());
                items.iter().for_each(|v| v.write(w));
            }
            Value::Push(items) => {
                w.push(items.len());
                items.iter().for_each(|v| v.write(w));
            }
            Value::Map(pairs) => {
                w.map(pairs.len());
                for (k, v) in pairs {
                    k.write(w);
                    v.write(w);
                }
            }
            Value::Double(x) => w.double(*x),
            Value::Boolean(b) => w.boolean(*b),
            Value::BigNumber(d) => w.big_number(d),
            Value::Verbatim(format, text) => w.verbatim(format, text),
            Value::BulkError(e) => w.bulk_error(e),
            Value::Attribute(attrs, value) => {
                if w.protocol() == Protocol::Resp3 {
                    w.attribute(attrs.len());
                    for (k, v) in attrs {
                        k.write(w);
                        v.write(w);
                    }
                }
                value.write(w);
            }
        }
    }

    /// The value encoded in `proto`.
    pub fn to_bytes(&self, proto: Protocol) -> Vec<u8> {
        let mut out = Vec::new();
        self.write(&mut ReplyWriter::new(&mut out, proto));
        out
    }
}

enum Stop {
    More,
    Error(ValueError),
}

impl From<ValueError> for Stop {
    fn from(e: ValueError) -> Stop {
        Stop::Error(e)
    }
}

fn invalid(why: impl Into<String>) -> Stop {
    Stop::Error(ValueError::Invalid(why.into()))
}

struct Reader<'a> {
    input: &'a [u8],
    pos: usize,
    limits: &'a ValueLimits,
}

impl Reader<'_> {
    /// The rest of the current line, without its `\r\n`.
    fn line(&mut self) -> Result<&[u8], Stop> {
        let rest = &self.input[self.pos..];
        let Some(cr) = rest.windows(2).position(|w| w == b"\r\n") else {
            return Err(Stop::More);
        };
        self.pos += cr + 2;
        Ok(&rest[..cr])
    }

    fn int_line(&mut self) -> Result<i64, Stop> {
        let line = self.line()?;
        parse_i64(line).ok_or_else(|| {
            invalid(format!(
                "not an integer: {:?}",
                String::from_utf8_lossy(line)
            ))
        })
    }

    fn count(&mut self, max: usize) -> Result<Option<usize>, Stop> {
        let n = self.int_line()?;
        if n == -1 {
            return Ok(None);
        }
        if n < 0 || n as u64 > max as u64 {
            return Err(ValueError::TooLong { len: n, max }.into());
        }
        Ok(Some(n as usize))
    }

    fn blob(&mut self) -> Result<Option<Vec<u8>>, Stop> {
        let Some(len) = self.count(self.limits.max_bulk_len)? else {
            return Ok(None);
        };
        let rest = &self.input[self.pos..];
        if rest.len() < len + 2 {
            return Err(Stop::More);
        }
        if &rest[len..len + 2] != b"\r\n" {
            return Err(invalid("a blob is not followed by \\r\\n"));
        }
        self.pos += len + 2;
        Ok(Some(rest[..len].to_vec()))
    }

    /// Room reserved for an aggregate announcing `n` elements: bounded by what the rest of the input could hold
    /// (an element takes at least 3 bytes) and by a constant, so that deep nesting cannot multiply it; a larger
    /// aggregate grows as its elements arrive.
    fn preallocation(&self, n: usize) -> usize {
        n.min((self.input.len() - self.pos) / 3).min(1024)
    }

    fn items(&mut self, n: usize, depth: usize) -> Result<Vec<Value>, Stop> {
        let mut v = Vec::with_capacity(self.preallocation(n));
        for _ in 0..n {
            v.push(self.value(depth + 1)?);
        }
        Ok(v)
    }

    fn pairs(&mut self, n: usize, depth: usize) -> Result<Vec<(Value, Value)>, Stop> {
        let mut v = Vec::with_capacity(self.preallocation(n));
        for _ in 0..n {
            let k = self.value(depth + 1)?;
            v.push((k, self.value(depth + 1)?));
        }
        Ok(v)
    }

    fn value(&mut self, depth: usize) -> Result<Value, Stop> {
        let Some(&kind) = self.input.get(self.pos) else {
            return Err(Stop::More);
        };
        let aggregate = matches!(kind, b'*' | b'%' | b'~' | b'>' | b'|');
        if aggregate && depth >= self.limits.max_depth {
            return Err(ValueError::TooDeep(self.limits.max_depth).into());
        }
        self.pos += 1;
        let max_elements = self.limits.max_elements;
        Ok(match kind {
            b'+' => Value::Simple(self.line()?.to_vec()),
            b'-' => Value::Error(self.line()?.to_vec()),
            b':' => Value::Integer(self.int_line()?),
            b'$' => self.blob()?.map_or(Value::NullBulk, Value::Bulk),
            b'_' => {
                if !self.line()?.is_empty() {
                    return Err(invalid("text after a null"));
                }
                Value::Null
            }
            b'#' => match self.line()? {
                b"t" => Value::Boolean(true),
                b"f" => Value::Boolean(false),
                _ => return Err(invalid("a boolean is t or f")),
            },
            b',' => {
                let line = self.line()?;
                let x = match line {
                    b"inf" | b"+inf" => f64::INFINITY,
                    b"-inf" => f64::NEG_INFINITY,
                    b"nan" | b"-nan" => f64::NAN,
                    _ => std::str::from_utf8(line)
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| invalid("not a double"))?,
                };
                Value::Double(x)
            }
            b'(' => {
                let line = self.line()?;
                let digits = line.strip_prefix(b"-").unwrap_or(line);
                if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                    return Err(invalid("not a big number"));
                }
                Value::BigNumber(line.to_vec())
            }
            b'=' => {
                let blob = self
                    .blob()?
                    .ok_or_else(|| invalid("a verbatim string cannot be null"))?;
                if blob.len() < 4 || blob[3] != b':' {
                    return Err(invalid("a verbatim string starts with its format and ':'"));
                }
                Value::Verbatim([blob[0], blob[1], blob[2]], blob[4..].to_vec())
            }
            b'!' => Value::BulkError(
                self.blob()?
                    .ok_or_else(|| invalid("a bulk error cannot be null"))?,
            ),
            b'*' => match self.count(max_elements)? {
                None => Value::NullArray,
                Some(n) => Value::Array(self.items(n, depth)?),
            },
            b'~' | b'>' | b'%' | b'|' => {
                let n = self
                    .count(max_elements)?
                    .ok_or_else(|| invalid("only arrays and bulk strings have a -1 length"))?;
                match kind {
                    b'~' => Value::Set(self.items(n, depth)?),
                    b'>' => Value::Push(self.items(n, depth)?),
                    b'%' => Value::Map(self.pairs(n, depth)?),
                    _ => {
                        let attrs = self.pairs(n, depth)?;
                        Value::Attribute(attrs, Box::new(self.value(depth + 1)?))
                    }
                }
            }
            other => {
                return Err(invalid(format!(
                    "unknown type byte {:?}",
                    char::from(other)
                )));
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_type() {
        let wire = b"*3\r\n+OK\r\n:-5\r\n$-1\r\n%1\r\n$1\r\nk\r\n~2\r\n#t\r\n,1.5\r\n_\r\n(123\r\n=8\r\ntxt:abcd\r\n!3\r\nERR\r\n>1\r\n*-1\r\n|1\r\n+a\r\n+b\r\n:1\r\n";
        let limits = ValueLimits::default();
        let mut pos = 0;
        let mut got = Vec::new();
        while pos < wire.len() {
            let (v, used) = Value::parse(&wire[pos..], &limits).unwrap().unwrap();
            got.push(v);
            pos += used;
        }
        assert_eq!(
            got,
            vec![
                Value::Array(vec![
                    Value::Simple(b"OK".to_vec()),
                    Value::Integer(-5),
                    Value::NullBulk
                ]),
                Value::Map(vec![(
                    Value::Bulk(b"k".to_vec()),
                    Value::Set(vec![Value::Boolean(true), Value::Double(1.5)])
                )]),
                Value::Null,
                Value::BigNumber(b"123".to_vec()),
                Value::Verbatim(*b"txt", b"abcd".to_vec()),
                Value::BulkError(b"ERR".to_vec()),
                Value::Push(vec![Value::NullArray]),
                Value::Attribute(
                    vec![(Value::Simple(b"a".to_vec()), Value::Simple(b"b".to_vec()))],
                    Box::new(Value::Integer(1))
                ),
            ]
        );
    }

    #[test]
    fn nesting_is_bounded() {
        let limits = ValueLimits {
            max_depth: 3,
            ..ValueLimits::default()
        };
        assert!(
            Value::parse(b"*1\r\n*1\r\n*1\r\n:1\r\n", &limits)
                .unwrap()
                .is_some()
        );
        assert_eq!(
            Value::parse(b"*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n", &limits),
            Err(ValueError::TooDeep(3))
        );
        // A very deep value is refused before it could exhaust the stack.
        let deep = "*1\r\n".repeat(1_000_000);
        assert_eq!(
            Value::parse(deep.as_bytes(), &ValueLimits::default()),
            Err(ValueError::TooDeep(DEFAULT_MAX_DEPTH))
        );
    }

    #[test]
    fn lengths_are_bounded_and_partial_input_asks_for_more() {
        let limits = ValueLimits {
            max_bulk_len: 3,
            max_elements: 2,
            ..ValueLimits::default()
        };
        assert_eq!(
            Value::parse(b"$4\r\nabcd\r\n", &limits),
            Err(ValueError::TooLong { len: 4, max: 3 })
        );
        assert_eq!(
            Value::parse(b"*3\r\n", &limits),
            Err(ValueError::TooLong { len: 3, max: 2 })
        );
        assert_eq!(
            Value::parse(b"*2000000000\r\n", &ValueLimits::default()),
            Err(ValueError::TooLong {
                len: 2_000_000_000,
                max: DEFAULT_MAX_ELEMENTS
            })
        );
        assert_eq!(Value::parse(b"$3\r\nab", &limits), Ok(None));
        assert_eq!(Value::parse(b"*2\r\n:1\r\n", &limits), Ok(None));
        assert!(Value::parse(b"$3\r\nabcd\r\n", &limits).is_err());
    }
}
