//! The reply encoder: writes replies straight into a connection's output buffer in the protocol the connection
//! speaks (RESP2 until the client switches with `HELLO 3`). Types RESP2 lacks are written as Redis writes them
//! there: a map as a flat array of keys and values, a set as an array, a double and a big number as bulk strings,
//! a boolean as 1 or 0, the null as `$-1` (or `*-1` for a null array).

/// The protocol of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// RESP2, every connection's protocol at first.
    Resp2,
    /// RESP3, after `HELLO 3`.
    Resp3,
}

impl Protocol {
    /// The version number `HELLO` reports.
    pub fn version(self) -> i64 {
        match self {
            Protocol::Resp2 => 2,
            Protocol::Resp3 => 3,
        }
    }
}

/// Writes replies into `out`. Binary-safe: bulk strings carry any bytes; the one-line types (simple strings,
/// errors) have their line ends replaced by spaces, as Redis does, so a reply can never break the framing.
pub struct ReplyWriter<'a> {
    out: &'a mut Vec<u8>,
    proto: Protocol,
}

impl<'a> ReplyWriter<'a> {
    /// A writer appending to `out`.
    pub fn new(out: &'a mut Vec<u8>, proto: Protocol) -> ReplyWriter<'a> {
        ReplyWriter { out, proto }
    }

    /// The protocol it writes.
    pub fn protocol(&self) -> Protocol {
        self.proto
    }

    /// `+text`.
    pub fn simple(&mut self, text: &[u8]) {
        self.out.push(b'+');
        push_line(self.out, text);
    }

    /// `+OK`.
    pub fn ok(&mut self) {
        self.out.extend_from_slice(b"+OK\r\n");
    }

    /// An error; `text` starts with its code (`ERR`, `WRONGPASS`, ...).
    pub fn error(&mut self, text: &[u8]) {
        self.out.push(b'-');
        push_line(self.out, text);
    }

    /// `-ERR text`.
    pub fn err(&mut self, text: &str) {
        self.out.extend_from_slice(b"-ERR ");
        push_line(self.out, text.as_bytes());
    }

    /// `:n`.
    pub fn integer(&mut self, n: i64) {
        self.out.push(b':');
        push_int(self.out, n);
        self.out.extend_from_slice(b"\r\n");
    }

    /// `$len` and the bytes.
    pub fn bulk(&mut self, data: &[u8]) {
        self.blob(b'$', data);
    }

    /// A missing value: `$-1` in RESP2, `_` in RESP3.
    pub fn null(&mut self) {
        self.out.extend_from_slice(match self.proto {
            Protocol::Resp2 => b"$-1\r\n".as_slice(),
            Protocol::Resp3 => b"_\r\n",
        });
    }

    /// A missing array: `*-1` in RESP2, `_` in RESP3.
    pub fn null_array(&mut self) {
        self.out.extend_from_slice(match self.proto {
            Protocol::Resp2 => b"*-1\r\n".as_slice(),
            Protocol::Resp3 => b"_\r\n",
        });
    }

    /// The header of an array of `len` replies (which follow).
    pub fn array(&mut self, len: usize) {
        self.header(b'*', len);
    }

    /// The header of a map of `len` pairs (`len` keys and values follow, alternating): `%len` in RESP3, an array
    /// of `2 × len` in RESP2.
    pub fn map(&mut self, len: usize) {
        match self.proto {
            Protocol::Resp2 => self.header(b'*', len * 2),
            Protocol::Resp3 => self.header(b'%', len),
        }
    }

    /// The header of a set of `len` replies: `~len` in RESP3, an array in RESP2.
    pub fn set(&mut self, len: usize) {
        match self.proto {
            Protocol::Resp2 => self.header(b'*', len),
            Protocol::Resp3 => self.header(b'~', len),
        }
    }

    /// The header of a push message of `len` replies: `>len` in RESP3, an array in RESP2.
    pub fn push(&mut self, len: usize) {
        match self.proto {
            Protocol::Resp2 => self.header(b'*', len),
            Protocol::Resp3 => self.header(b'>', len),
        }
    }

    /// A double: `,x` in RESP3, a bulk string in RESP2. Written in the shortest form that reads back the same
    /// (`inf`, `-inf` and `nan` as RESP3 spells them).
    pub fn double(&mut self, x: f64) {
        let text = format_double(x);
        match self.proto {
            Protocol::Resp2 => self.bulk(text.as_bytes()),
            Protocol::Resp3 => {
                self.out.push(b',');
                self.out.extend_from_slice(text.as_bytes());
                self.out.extend_from_slice(b"\r\n");
            }
        }
    }

    /// A boolean: `#t`/`#f` in RESP3, `:1`/`:0` in RESP2.
    pub fn boolean(&mut self, b: bool) {
        match self.proto {
            Protocol::Resp2 => self.integer(i64::from(b)),
            Protocol::Resp3 => self
                .out
                .extend_from_slice(if b { b"#t\r\n" } else { b"#f\r\n" }),
        }
    }

    /// A big number (decimal digits with an optional sign): `(digits` in RESP3, a bulk string in RESP2.
    pub fn big_number(&mut self, digits: &[u8]) {
        match self.proto {
            Protocol::Resp2 => self.bulk(digits),
            Protocol::Resp3 => {
                self.out.push(b'(');
                push_line(self.out, digits);
            }
        }
    }

    /// Text for people: a verbatim string with its three-letter format (`txt`, `mkd`) in RESP3, a bulk string in
    /// RESP2.
    pub fn verbatim(&mut self, format: &[u8; 3], text: &[u8]) {
        match self.proto {
            Protocol::Resp2 => self.bulk(text),
            Protocol::Resp3 => {
                self.header(b'=', text.len() + 4);
                self.out.extend_from_slice(format);
                self.out.push(b':');
                self.out.extend_from_slice(text);
                self.out.extend_from_slice(b"\r\n");
            }
        }
    }

    /// A bulk error (`!len` in RESP3; a simple error with its line ends replaced in RESP2).
    pub fn bulk_error(&mut self, text: &[u8]) {
        match self.proto {
            Protocol::Resp2 => self.error(text),
            Protocol::Resp3 => self.blob(b'!', text),
        }
    }

    /// The header of `len` attribute pairs (RESP3 only: RESP2 has no attributes, so callers leave them out
    /// there; see [`ReplyWriter::protocol`]). The pairs, then the value they describe, follow.
    pub fn attribute(&mut self, len: usize) {
        if self.proto == Protocol::Resp3 {
            self.header(b'|', len);
        }
    }

    fn header(&mut self, kind: u8, len: usize) {
        self.out.push(kind);
        push_int(self.out, len as i64);
        self.out.extend_from_slice(b"\r\n");
    }

    /// A length-prefixed string: `kind`, the length, then the bytes.
    fn blob(&mut self, kind: u8, data: &[u8]) {
        self.header(kind, data.len());
        self.out.extend_from_slice(data);
        self.out.extend_from_slice(b"\r\n");
    }
}

/// Appends `text` and `\r\n`, with any `\r` or `\n` inside `text` replaced by a space.
fn push_line(out: &mut Vec<u8>, text: &[u8]) {
    if text.iter().any(|&b| b == b'\r' || b == b'\n') {
        out.extend(
            text.iter()
                .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
        );
    } else {
        out.extend_from_slice(text);
    }
    out.extend_from_slice(b"\r\n");
}

/// Appends the decimal form of `n` without going through the formatting machinery (it is on every reply).
fn push_int(out: &mut Vec<u8>, n: i64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut v = n.unsigned_abs();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    if n < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&buf[i..]);
}

/// The RESP3 text of a double.
pub(crate) fn format_double(x: f64) -> String {
    if x.is_nan() {
        "nan".into()
    } else if x.is_infinite() {
        if x > 0.0 { "inf".into() } else { "-inf".into() }
    } else {
        format!("{x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both(f: impl Fn(&mut ReplyWriter<'_>)) -> (Vec<u8>, Vec<u8>) {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        f(&mut ReplyWriter::new(&mut a, Protocol::Resp2));
        f(&mut ReplyWriter::new(&mut b, Protocol::Resp3));
        (a, b)
    }

    #[test]
    fn every_type_in_both_protocols() {
        type Write = Box<dyn Fn(&mut ReplyWriter<'_>)>;
        let cases: Vec<(Write, &[u8], &[u8])> = vec![
            (Box::new(|w| w.ok()), b"+OK\r\n", b"+OK\r\n"),
            (
                Box::new(|w| w.simple(b"a\r\nb")),
                b"+a  b\r\n",
                b"+a  b\r\n",
            ),
            (
                Box::new(|w| w.err("no\nway")),
                b"-ERR no way\r\n",
                b"-ERR no way\r\n",
            ),
            (
                Box::new(|w| w.integer(i64::MIN)),
                b":-9223372036854775808\r\n",
                b":-9223372036854775808\r\n",
            ),
            (Box::new(|w| w.integer(0)), b":0\r\n", b":0\r\n"),
            (
                Box::new(|w| w.bulk(b"\r\n\0")),
                b"$3\r\n\r\n\0\r\n",
                b"$3\r\n\r\n\0\r\n",
            ),
            (Box::new(|w| w.null()), b"$-1\r\n", b"_\r\n"),
            (Box::new(|w| w.null_array()), b"*-1\r\n", b"_\r\n"),
            (
                Box::new(|w| {
                    w.map(1);
                    w.bulk(b"k");
                    w.integer(1);
                }),
                b"*2\r\n$1\r\nk\r\n:1\r\n",
                b"%1\r\n$1\r\nk\r\n:1\r\n",
            ),
            (
                Box::new(|w| {
                    w.set(1);
                    w.simple(b"x");
                }),
                b"*1\r\n+x\r\n",
                b"~1\r\n+x\r\n",
            ),
            (Box::new(|w| w.double(1.5)), b"$3\r\n1.5\r\n", b",1.5\r\n"),
            (
                Box::new(|w| w.double(f64::NEG_INFINITY)),
                b"$4\r\n-inf\r\n",
                b",-inf\r\n",
            ),
            (Box::new(|w| w.boolean(true)), b":1\r\n", b"#t\r\n"),
            (
                Box::new(|w| w.big_number(b"-12345678901234567890")),
                b"$21\r\n-12345678901234567890\r\n",
                b"(-12345678901234567890\r\n",
            ),
            (
                Box::new(|w| w.verbatim(b"txt", b"hi\r\n")),
                b"$4\r\nhi\r\n\r\n",
                b"=8\r\ntxt:hi\r\n\r\n",
            ),
            (
                Box::new(|w| w.bulk_error(b"ERR a\nb")),
                b"-ERR a b\r\n",
                b"!7\r\nERR a\nb\r\n",
            ),
            (Box::new(|w| w.push(0)), b"*0\r\n", b">0\r\n"),
        ];
        for (f, resp2, resp3) in cases {
            let (a, b) = both(f);
            assert_eq!(
                a.escape_ascii().to_string(),
                resp2.escape_ascii().to_string()
            );
            assert_eq!(
                b.escape_ascii().to_string(),
                resp3.escape_ascii().to_string()
            );
        }
    }
}
