//! The incremental parser of client requests, as redis-server reads them: arrays of bulk strings
//! (`*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`) and inline commands (`GET k\r\n`, with Redis's quoting rules).
//!
//! The parser works on whatever bytes have arrived: it takes what it can from the front of the buffer and keeps
//! the parts of a request that is not complete yet, so a request split across many reads is never scanned twice
//! and a large argument is copied once, as it arrives. Errors carry the text redis-server sends; after one the
//! connection must be closed, since the stream cannot be resynchronised.

use crate::reply::{Protocol, ReplyWriter};

/// Default of [`ParseLimits::max_bulk_len`]: Redis's `proto-max-bulk-len` (512 MiB).
pub const DEFAULT_MAX_BULK_LEN: usize = 512 << 20;
/// Default of [`ParseLimits::max_multibulk_len`]: arguments of one request (1,048,576).
pub const DEFAULT_MAX_MULTIBULK_LEN: usize = 1 << 20;
/// Default of [`ParseLimits::max_inline_len`]: Redis's `PROTO_INLINE_MAX_SIZE` (64 KiB).
pub const DEFAULT_MAX_INLINE_LEN: usize = 64 << 10;
/// Default of [`ParseLimits::max_request_bytes`]: Redis's `client-query-buffer-limit` (1 GiB).
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1 << 30;
/// Arguments a client may send before it authenticated (Redis's fixed limit).
pub const UNAUTHENTICATED_MAX_MULTIBULK_LEN: i64 = 10;
/// Length of one argument a client may send before it authenticated (Redis's fixed limit).
pub const UNAUTHENTICATED_MAX_BULK_LEN: usize = 16384;
/// Arguments at least this long are taken as they arrive instead of waiting in the connection's buffer.
const BIG_ARG: usize = 32 << 10;
/// Arguments preallocated for a request, whatever count it announces (the rest grow as they arrive).
const MAX_PREALLOCATED_ARGS: usize = 1024;

/// Bounds on what a client may send.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ParseLimits {
    /// Longest argument (bulk string). Default [`DEFAULT_MAX_BULK_LEN`].
    pub max_bulk_len: usize,
    /// Most arguments in one request. Default [`DEFAULT_MAX_MULTIBULK_LEN`].
    pub max_multibulk_len: usize,
    /// Longest inline command, and longest length header (redis-server applies it only while the line end has
    /// not arrived; here it applies either way, so the outcome does not depend on how the input was split into
    /// reads). Default [`DEFAULT_MAX_INLINE_LEN`].
    pub max_inline_len: usize,
    /// Most bytes of one request, headers included. Default [`DEFAULT_MAX_REQUEST_BYTES`].
    pub max_request_bytes: usize,
}

impl Default for ParseLimits {
    fn default() -> Self {
        ParseLimits {
            max_bulk_len: DEFAULT_MAX_BULK_LEN,
            max_multibulk_len: DEFAULT_MAX_MULTIBULK_LEN,
            max_inline_len: DEFAULT_MAX_INLINE_LEN,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
        }
    }
}

/// A malformed request. The text (from [`ProtocolError::reply_text`]) is what redis-server replies, after
/// `-ERR `; the connection is closed after the reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The argument count is not a number, or beyond the limit.
    #[error("Protocol error: invalid multibulk length")]
    InvalidMultibulkLength,
    /// An argument length is not a number, negative, or beyond the limit.
    #[error("Protocol error: invalid bulk length")]
    InvalidBulkLength,
    /// An argument does not start with `$`.
    #[error("Protocol error: expected '$', got '{}'", char::from(*.0).escape_default())]
    ExpectedBulk(u8),
    /// An inline command longer than the limit, without a line end.
    #[error("Protocol error: too big inline request")]
    InlineTooBig,
    /// An argument count line longer than the limit, without a line end.
    #[error("Protocol error: too big mbulk count string")]
    MultibulkCountTooBig,
    /// An argument length line longer than the limit, without a line end.
    #[error("Protocol error: too big bulk count string")]
    BulkCountTooBig,
    /// An inline command with a quote that is not closed (or closed and followed by more text).
    #[error("Protocol error: unbalanced quotes in request")]
    UnbalancedQuotes,
    /// More than [`UNAUTHENTICATED_MAX_MULTIBULK_LEN`] arguments before authentication.
    #[error("Protocol error: unauthenticated multibulk length")]
    UnauthenticatedMultibulkLength,
    /// An argument longer than [`UNAUTHENTICATED_MAX_BULK_LEN`] before authentication.
    #[error("Protocol error: unauthenticated bulk length")]
    UnauthenticatedBulkLength,
    /// The request would exceed [`ParseLimits::max_request_bytes`] (redis-server closes such a client silently).
    #[error("Protocol error: request exceeds the limit of {0} bytes")]
    RequestTooLarge(usize),
}

impl ProtocolError {
    /// The error text as redis-server sends it (after `-ERR `): the offending byte of [`ExpectedBulk`] is sent as
    /// it came, except that a line end becomes a space.
    ///
    /// [`ExpectedBulk`]: ProtocolError::ExpectedBulk
    pub fn reply_text(&self) -> Vec<u8> {
        match self {
            ProtocolError::ExpectedBulk(b) => {
                let shown = if matches!(b, b'\r' | b'\n') { b' ' } else { *b };
                let mut t = b"Protocol error: expected '$', got '".to_vec();
                t.push(shown);
                t.push(b'\'');
                t
            }
            other => other.to_string().into_bytes(),
        }
    }
}

/// The outcome of one [`RequestParser::parse`] call: how many bytes it consumed, and a request, a request for more
/// input (`Ok(None)`), or an error.
pub type ParseResult = (usize, Result<Option<Vec<Vec<u8>>>, ProtocolError>);

/// A multibulk request being read.
#[derive(Debug)]
struct Partial {
    /// Arguments still to come.
    remaining: usize,
    args: Vec<Vec<u8>>,
    /// The argument being read, once its length header was read.
    bulk: Option<Bulk>,
    /// Bytes of the request consumed so far.
    bytes: usize,
}

#[derive(Debug)]
struct Bulk {
    len: usize,
    /// What arrived of a large argument.
    data: Vec<u8>,
}

/// Parses the requests of one connection; see the module documentation.
#[derive(Debug)]
pub struct RequestParser {
    limits: ParseLimits,
    partial: Option<Partial>,
}

impl RequestParser {
    /// A parser enforcing `limits`.
    pub fn new(limits: ParseLimits) -> RequestParser {
        RequestParser {
            limits,
            partial: None,
        }
    }

    /// Reads the next request from the front of `input`. Returns how many bytes it consumed (the caller drops
    /// them before the next call) and the request's arguments once complete, `Ok(None)` when more input is needed
    /// (what was consumed is kept), or the error to reply with before closing the connection. `authenticated`:
    /// whether the client may send more than Redis allows before authentication.
    pub fn parse(&mut self, input: &[u8], authenticated: bool) -> ParseResult {
        let mut pos = 0;
        loop {
            if self.partial.is_none() {
                if pos == input.len() {
                    return (pos, Ok(None));
                }
                let rest = &input[pos..];
                if rest[0] != b'*' {
                    match self.inline(rest) {
                        Inline::Request(used, args) => return (pos + used, Ok(Some(args))),
                        Inline::Empty(used) => {
                            pos += used;
                            continue;
                        }
                        Inline::More => return (pos, Ok(None)),
                        Inline::Error(used, e) => return (pos + used, Err(e)),
                    }
                }
                let cr = match length_line(
                    rest,
                    self.limits.max_inline_len,
                    ProtocolError::MultibulkCountTooBig,
                ) {
                    Ok(Some(cr)) => cr,
                    Ok(None) => return (pos, Ok(None)),
                    Err(e) => return (pos, Err(e)),
                };
                let count = match parse_i64(&rest[1..cr]) {
                    Some(n)
                        if n <= i64::from(i32::MAX)
                            && n <= self.limits.max_multibulk_len as i64 =>
                    {
                        n
                    }
                    _ => return (pos, Err(ProtocolError::InvalidMultibulkLength)),
                };
                if count > UNAUTHENTICATED_MAX_MULTIBULK_LEN && !authenticated {
                    return (pos, Err(ProtocolError::UnauthenticatedMultibulkLength));
                }
                pos += cr + 2;
                if count <= 0 {
                    // An empty request: skipped, as redis-server does.
                    continue;
                }
                let count = count as usize;
                self.partial = Some(Partial {
                    remaining: count,
                    args: Vec::with_capacity(count.min(MAX_PREALLOCATED_ARGS)),
                    bulk: None,
                    bytes: cr + 2,
                });
            }
            let limits = &self.limits;
            let p = self.partial.as_mut().expect("a request is being read");
            while p.remaining > 0 {
                if p.bulk.is_none() {
                    let rest = &input[pos..];
                    let cr = match length_line(
                        rest,
                        limits.max_inline_len,
                        ProtocolError::BulkCountTooBig,
                    ) {
                        Ok(Some(cr)) => cr,
                        Ok(None) => return (pos, Ok(None)),
                        Err(e) => return (pos, Err(e)),
                    };
                    if rest[0] != b'$' {
                        return (pos, Err(ProtocolError::ExpectedBulk(rest[0])));
                    }
                    let len = match parse_i64(&rest[1..cr]) {
                        Some(n) if n >= 0 && n as u64 <= limits.max_bulk_len as u64 => n as usize,
                        _ => return (pos, Err(ProtocolError::InvalidBulkLength)),
                    };
                    if len > UNAUTHENTICATED_MAX_BULK_LEN && !authenticated {
                        return (pos, Err(ProtocolError::UnauthenticatedBulkLength));
                    }
                    if p.bytes.saturating_add(cr + 2 + len + 2) > limits.max_request_bytes {
                        return (
                            pos,
                            Err(ProtocolError::RequestTooLarge(limits.max_request_bytes)),
                        );
                    }
                    pos += cr + 2;
                    p.bytes += cr + 2;
                    p.bulk = Some(Bulk {
                        len,
                        data: Vec::new(),
                    });
                }
                let bulk = p.bulk.as_mut().expect("set above");
                let rest = &input[pos..];
                let arg = if bulk.data.is_empty() && rest.len() >= bulk.len + 2 {
                    // The whole argument is here: one copy. The two bytes after it are skipped unread, like Redis.
                    pos += bulk.len + 2;
                    p.bytes += bulk.len + 2;
                    rest[..bulk.len].to_vec()
                } else if bulk.len >= BIG_ARG {
                    // A large argument is taken as it arrives, so it is not buffered twice.
                    let take = (bulk.len - bulk.data.len()).min(rest.len());
                    bulk.data.extend_from_slice(&rest[..take]);
                    pos += take;
                    p.bytes += take;
                    if bulk.data.len() < bulk.len || input.len() - pos < 2 {
                        return (pos, Ok(None));
                    }
                    pos += 2;
                    p.bytes += 2;
                    std::mem::take(&mut bulk.data)
                } else {
                    return (pos, Ok(None));
                };
                p.args.push(arg);
                p.bulk = None;
                p.remaining -= 1;
            }
            let done = self.partial.take().expect("a request is being read");
            return (pos, Ok(Some(done.args)));
        }
    }

    fn inline(&self, rest: &[u8]) -> Inline {
        let nl = find(rest, b'\n');
        if nl.unwrap_or(rest.len()) > self.limits.max_inline_len {
            return Inline::Error(0, ProtocolError::InlineTooBig);
        }
        let Some(nl) = nl else {
            return Inline::More;
        };
        let mut line = &rest[..nl];
        if let [head @ .., b'\r'] = line {
            line = head;
        }
        match split_args(line) {
            Some(args) if args.is_empty() => Inline::Empty(nl + 1),
            Some(args) => Inline::Request(nl + 1, args),
            None => Inline::Error(nl + 1, ProtocolError::UnbalancedQuotes),
        }
    }
}

enum Inline {
    Request(usize, Vec<Vec<u8>>),
    Empty(usize),
    More,
    Error(usize, ProtocolError),
}

/// Appends a request as clients send it: an array of bulk strings.
pub fn encode_request<A: AsRef<[u8]>>(args: &[A], out: &mut Vec<u8>) {
    // The same bytes as a RESP2 reply of an array of bulk strings.
    let mut w = ReplyWriter::new(out, Protocol::Resp2);
    w.array(args.len());
    for a in args {
        w.bulk(a.as_ref());
    }
}

/// Where the `\r` of the length line at the front of `rest` is, once the line has arrived (`None` until then), or
/// `too_big` when the line is longer than `max`. A line is too long whether or not its end has arrived, so the
/// outcome does not depend on how the input was split into reads. Like Redis, the byte after `\r` is taken as
/// the `\n` without looking at it, but it must have arrived.
fn length_line(
    rest: &[u8],
    max: usize,
    too_big: ProtocolError,
) -> Result<Option<usize>, ProtocolError> {
    let cr = find(rest, b'\r');
    if cr.unwrap_or(rest.len()) > max {
        return Err(too_big);
    }
    Ok(cr.filter(|&cr| cr + 2 <= rest.len()))
}

fn find(haystack: &[u8], byte: u8) -> Option<usize> {
    haystack.iter().position(|&b| b == byte)
}

/// Parses a decimal integer exactly as Redis's `string2ll`: an optional `-`, no `+`, no leading zeros, no
/// spaces, within `i64`.
pub fn parse_i64(s: &[u8]) -> Option<i64> {
    dinomo_value::parse_integer(s)
}

/// Splits an inline command into arguments with Redis's rules (`sdssplitargs`): blanks separate arguments;
/// `"..."` understands `\n \r \t \b \a \xHH` and `\<any>`; `'...'` understands `\'`; a closing quote must be
/// followed by a blank or the end. `None` for unbalanced quotes. Like redis-server (which sees a C string), the
/// line ends at its first NUL byte.
pub fn split_args(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let line = match find(line, 0) {
        Some(nul) => &line[..nul],
        None => line,
    };
    let at = |i: usize| line.get(i).copied().unwrap_or(0);
    let is_space = |c: u8| matches!(c, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c);
    let mut args = Vec::new();
    let mut i = 0;
    loop {
        while i < line.len() && is_space(line[i]) {
            i += 1;
        }
        if i >= line.len() {
            return Some(args);
        }
        // The quote the argument is inside of, if any.
        let mut quote = None;
        let mut current = Vec::new();
        loop {
            let c = at(i);
            match quote {
                None => match c {
                    b' ' | b'\n' | b'\r' | b'\t' | 0 => break,
                    b'"' | b'\'' => quote = Some(c),
                    _ => current.push(c),
                },
                Some(b'"')
                    if c == b'\\'
                        && at(i + 1) == b'x'
                        && at(i + 2).is_ascii_hexdigit()
                        && at(i + 3).is_ascii_hexdigit() =>
                {
                    current.push(hex(at(i + 2)) * 16 + hex(at(i + 3)));
                    i += 3;
                }
                Some(b'"') if c == b'\\' && at(i + 1) != 0 => {
                    i += 1;
                    current.push(match at(i) {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 0x08,
                        b'a' => 0x07,
                        other => other,
                    });
                }
                Some(b'\'') if c == b'\\' && at(i + 1) == b'\'' => {
                    i += 1;
                    current.push(b'\'');
                }
                Some(q) if c == q => {
                    if at(i + 1) != 0 && !is_space(at(i + 1)) {
                        return None;
                    }
                    i += 1;
                    break;
                }
                // The line ended inside the quotes.
                Some(_) if c == 0 => return None,
                Some(_) => current.push(c),
            }
            if c != 0 {
                i += 1;
            }
        }
        args.push(current);
    }
}

fn hex(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        _ => c - b'A' + 10,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<Vec<u8>> {
        list.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    /// Parses everything in `input` as one connection would, returning the requests and the error, if any.
    fn parse_all(input: &[u8], authenticated: bool) -> (Vec<Vec<Vec<u8>>>, Option<ProtocolError>) {
        let mut p = RequestParser::new(ParseLimits::default());
        let mut pos = 0;
        let mut out = Vec::new();
        loop {
            let (used, r) = p.parse(&input[pos..], authenticated);
            pos += used;
            match r {
                Ok(Some(a)) => out.push(a),
                Ok(None) => return (out, None),
                Err(e) => return (out, Some(e)),
            }
        }
    }

    #[test]
    fn multibulk_and_inline_requests() {
        let (reqs, err) = parse_all(
            b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\nset a 1\r\n*0\r\n*-1\r\n\r\n\nping\n",
            true,
        );
        assert_eq!(err, None);
        assert_eq!(
            reqs,
            vec![
                args(&["GET", "k"]),
                args(&["set", "a", "1"]),
                args(&["ping"])
            ]
        );
    }

    #[test]
    fn errors_carry_redis_text() {
        let cases: &[(&[u8], &str)] = &[
            (b"*1\r\nx\r\n", "Protocol error: expected '$', got 'x'"),
            (b"*1\r\n$-5\r\n", "Protocol error: invalid bulk length"),
            (b"*a\r\n", "Protocol error: invalid multibulk length"),
            (
                b"*3000000000\r\n",
                "Protocol error: invalid multibulk length",
            ),
            (
                b"*1\r\n$04\r\nPING\r\n",
                "Protocol error: invalid bulk length",
            ),
            (
                b"*1\r\n$+4\r\nPING\r\n",
                "Protocol error: invalid bulk length",
            ),
            (
                b"*1\r\n$600000000\r\n",
                "Protocol error: invalid bulk length",
            ),
            (
                b"\"unbalanced\r\n",
                "Protocol error: unbalanced quotes in request",
            ),
            (
                b"echo \"a\"b\r\n",
                "Protocol error: unbalanced quotes in request",
            ),
            (b"*1\r\n\r\n", "Protocol error: expected '$', got ' '"),
        ];
        for (input, text) in cases {
            let (_, err) = parse_all(input, true);
            let err = err.unwrap_or_else(|| panic!("{input:?} parsed"));
            assert_eq!(
                String::from_utf8_lossy(&err.reply_text()),
                *text,
                "{input:?}"
            );
        }
    }

    #[test]
    fn unauthenticated_clients_get_redis_limits() {
        assert_eq!(
            parse_all(b"*11\r\n", false).1,
            Some(ProtocolError::UnauthenticatedMultibulkLength)
        );
        assert_eq!(
            parse_all(b"*1\r\n$16385\r\n", false).1,
            Some(ProtocolError::UnauthenticatedBulkLength)
        );
        assert_eq!(parse_all(b"*10\r\n$16384\r\n", false).1, None);
        assert_eq!(parse_all(b"*11\r\n$16385\r\n", true).1, None);
    }

    #[test]
    fn lines_without_an_end_are_bounded() {
        let long = vec![b'a'; DEFAULT_MAX_INLINE_LEN + 1];
        assert_eq!(parse_all(&long, true).1, Some(ProtocolError::InlineTooBig));
        let mut mbulk = b"*".to_vec();
        mbulk.extend_from_slice(&long);
        assert_eq!(
            parse_all(&mbulk, true).1,
            Some(ProtocolError::MultibulkCountTooBig)
        );
        let mut bulk = b"*1\r\n$".to_vec();
        bulk.extend_from_slice(&long);
        assert_eq!(
            parse_all(&bulk, true).1,
            Some(ProtocolError::BulkCountTooBig)
        );
        assert_eq!(
            parse_all(&long[..DEFAULT_MAX_INLINE_LEN], true),
            (vec![], None)
        );
    }

    #[test]
    fn configured_limits_apply() {
        let limits = ParseLimits {
            max_bulk_len: 4,
            max_multibulk_len: 2,
            max_inline_len: 8,
            max_request_bytes: 20,
        };
        let run = |input: &[u8]| {
            let mut p = RequestParser::new(limits.clone());
            p.parse(input, true).1
        };
        assert_eq!(
            run(b"*1\r\n$5\r\nhello\r\n"),
            Err(ProtocolError::InvalidBulkLength)
        );
        assert_eq!(
            run(b"*1\r\n$4\r\nhell\r\n"),
            Ok(Some(vec![b"hell".to_vec()]))
        );
        assert_eq!(run(b"*3\r\n"), Err(ProtocolError::InvalidMultibulkLength));
        assert_eq!(run(b"get aaaaaaaa"), Err(ProtocolError::InlineTooBig));
        assert_eq!(
            run(b"*2\r\n$4\r\nabcd\r\n$4\r\nabcd\r\n"),
            Err(ProtocolError::RequestTooLarge(20))
        );
    }

    #[test]
    fn trailing_bytes_of_a_bulk_are_skipped_like_redis() {
        assert_eq!(
            parse_all(b"*1\r\n$4\r\nPINGxx", true).0,
            vec![args(&["PING"])]
        );
    }

    #[test]
    fn large_arguments_are_taken_as_they_arrive() {
        let value = vec![7u8; BIG_ARG * 3 + 5];
        let mut wire = format!("*2\r\n$3\r\nSET\r\n${}\r\n", value.len()).into_bytes();
        wire.extend_from_slice(&value);
        wire.extend_from_slice(b"\r\n");
        let mut p = RequestParser::new(ParseLimits::default());
        let mut buffered = Vec::new();
        let mut largest_buffer = 0;
        let mut got = None;
        for chunk in wire.chunks(4096) {
            buffered.extend_from_slice(chunk);
            largest_buffer = largest_buffer.max(buffered.len());
            let (used, r) = p.parse(&buffered, true);
            buffered.drain(..used);
            if let Some(a) = r.unwrap() {
                got = Some(a);
            }
        }
        assert_eq!(got, Some(vec![b"SET".to_vec(), value]));
        assert!(
            largest_buffer <= 4096 + 16,
            "the caller's buffer never held more than a read: {largest_buffer}"
        );
    }

    #[test]
    fn integers_follow_string2ll() {
        for (s, v) in [
            ("0", Some(0)),
            ("-1", Some(-1)),
            ("9223372036854775807", Some(i64::MAX)),
            ("-9223372036854775808", Some(i64::MIN)),
            ("9223372036854775808", None),
            ("-0", None),
            ("01", None),
            ("+1", None),
            (" 1", None),
            ("1 ", None),
            ("", None),
            ("-", None),
            ("1a", None),
        ] {
            assert_eq!(parse_i64(s.as_bytes()), v, "{s:?}");
        }
    }

    #[test]
    fn inline_quoting_follows_sdssplitargs() {
        type Case<'a> = (&'a [u8], Option<&'a [&'a [u8]]>);
        let cases: &[Case<'_>] = &[
            (b"set \"b c\" 2", Some(&[b"set", b"b c", b"2"])),
            (b"echo 'a\\'b'", Some(&[b"echo", b"a'b"])),
            (b"echo \"\\x41\\n\"", Some(&[b"echo", b"A\n"])),
            (b"echo \"\\x4\"", Some(&[b"echo", b"x4"])),
            (b"a\"b c\"", Some(&[b"ab c"])),
            (b"  \t ", Some(&[])),
            (b"echo \"\"", Some(&[b"echo", b""])),
            (b"get a\0b c", Some(&[b"get", b"a"])),
            (b"echo 'abc", None),
            (b"echo 'a'b", None),
            (b"echo \"a\\", None),
        ];
        for (line, want) in cases {
            let want = want.map(|w| w.iter().map(|a| a.to_vec()).collect::<Vec<_>>());
            assert_eq!(
                split_args(line),
                want,
                "{:?}",
                String::from_utf8_lossy(line)
            );
        }
    }
}
