//! Redis's glob-style patterns (`KEYS`, `SCAN ... MATCH`), byte for byte as Redis reads them:
//! - `*` any run of bytes, `?` any one byte;
//! - `[abc]` one of, `[^abc]` none of, `[a-z]` a range (either way round), `\x` inside a class the byte `x`; a class
//!   left open runs to the end of the pattern;
//! - `\x` the byte `x`; a trailing `\` is itself.
//!
//! A pattern is read once into single-byte tokens and stars, and matched with one backtracking point (the last
//! star), so a match costs at most the product of the two lengths whatever the pattern: no pattern a client sends
//! can make it exponential.

/// A compiled pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    tokens: Vec<Token>,
    /// Only stars: everything matches.
    matches_all: bool,
    /// ASCII letters match either case (`CONFIG GET`'s patterns; key patterns are exact).
    ignore_case: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Star,
    Any,
    Byte(u8),
    Class {
        negated: bool,
        ranges: Vec<(u8, u8)>,
    },
}

impl Token {
    fn matches(&self, b: u8) -> bool {
        match self {
            Token::Star | Token::Any => true,
            Token::Byte(x) => *x == b,
            Token::Class { negated, ranges } => {
                ranges.iter().any(|&(lo, hi)| lo <= b && b <= hi) != *negated
            }
        }
    }
}

impl Pattern {
    /// Reads `pattern`; every byte string is a pattern.
    pub fn new(pattern: &[u8]) -> Pattern {
        Pattern::read(pattern, false)
    }

    /// Like [`Pattern::new`], with ASCII letters matching either case.
    pub fn ignoring_case(pattern: &[u8]) -> Pattern {
        Pattern::read(&pattern.to_ascii_lowercase(), true)
    }

    fn read(pattern: &[u8], ignore_case: bool) -> Pattern {
        let p = pattern;
        let mut tokens = Vec::new();
        let mut i = 0;
        while i < p.len() {
            match p[i] {
                b'*' => {
                    if tokens.last() != Some(&Token::Star) {
                        tokens.push(Token::Star);
                    }
                    i += 1;
                }
                b'?' => {
                    tokens.push(Token::Any);
                    i += 1;
                }
                b'[' => {
                    i += 1;
                    let negated = p.get(i) == Some(&b'^');
                    if negated {
                        i += 1;
                    }
                    let mut ranges = Vec::new();
                    while i < p.len() {
                        if p[i] == b'\\' && i + 1 < p.len() {
                            ranges.push((p[i + 1], p[i + 1]));
                            i += 2;
                        } else if p[i] == b']' {
                            i += 1;
                            break;
                        } else if i + 2 < p.len() && p[i + 1] == b'-' {
                            let (a, b) = (p[i], p[i + 2]);
                            ranges.push((a.min(b), a.max(b)));
                            i += 3;
                        } else {
                            ranges.push((p[i], p[i]));
                            i += 1;
                        }
                    }
                    tokens.push(Token::Class { negated, ranges });
                }
                b'\\' if i + 1 < p.len() => {
                    tokens.push(Token::Byte(p[i + 1]));
                    i += 2;
                }
                b => {
                    tokens.push(Token::Byte(b));
                    i += 1;
                }
            }
        }
        let matches_all = tokens.iter().all(|t| *t == Token::Star) && !tokens.is_empty();
        Pattern {
            tokens,
            matches_all,
            ignore_case,
        }
    }

    /// Whether `s` matches the whole pattern.
    pub fn matches(&self, s: &[u8]) -> bool {
        if self.matches_all {
            return true;
        }
        let tokens = &self.tokens;
        let (mut t, mut i) = (0, 0);
        // The last star met, and where in `s` its run ends now.
        let mut star: Option<(usize, usize)> = None;
        let byte = |i: usize| {
            if self.ignore_case {
                s[i].to_ascii_lowercase()
            } else {
                s[i]
            }
        };
        while i < s.len() {
            match tokens.get(t) {
                Some(Token::Star) => {
                    star = Some((t, i));
                    t += 1;
                    continue;
                }
                Some(tok) if tok.matches(byte(i)) => {
                    t += 1;
                    i += 1;
                    continue;
                }
                _ => {}
            }
            // A mismatch: the last star takes one byte more, and matching resumes after it.
            match star {
                Some((st, end)) => {
                    star = Some((st, end + 1));
                    t = st + 1;
                    i = end + 1;
                }
                None => return false,
            }
        }
        tokens[t..].iter().all(|tok| *tok == Token::Star)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Redis's `stringmatchlen` transcribed as it is written (recursive at each star), as the reference.
    fn reference(p: &[u8], s: &[u8]) -> bool {
        let (mut p, mut s) = (p, s);
        while !p.is_empty() && !s.is_empty() {
            match p[0] {
                b'*' => {
                    while p.len() > 1 && p[1] == b'*' {
                        p = &p[1..];
                    }
                    if p.len() == 1 {
                        return true;
                    }
                    for start in 0..s.len() {
                        if reference(&p[1..], &s[start..]) {
                            return true;
                        }
                    }
                    return false;
                }
                b'?' => s = &s[1..],
                b'[' => {
                    p = &p[1..];
                    let not = p.first() == Some(&b'^');
                    if not {
                        p = &p[1..];
                    }
                    let mut matched = false;
                    loop {
                        if p.len() >= 2 && p[0] == b'\\' {
                            p = &p[1..];
                            if p[0] == s[0] {
                                matched = true;
                            }
                        } else if p.is_empty() || p[0] == b']' {
                            break;
                        } else if p.len() >= 3 && p[1] == b'-' {
                            let (a, b) = (p[0].min(p[2]), p[0].max(p[2]));
                            if a <= s[0] && s[0] <= b {
                                matched = true;
                            }
                            p = &p[2..];
                        } else if p[0] == s[0] {
                            matched = true;
                        }
                        p = &p[1..];
                    }
                    if matched == not {
                        return false;
                    }
                    s = &s[1..];
                    // `p` is at the closing bracket, or at the end of an open class.
                    if !p.is_empty() {
                        p = &p[1..];
                    }
                    continue;
                }
                b'\\' if p.len() >= 2 => {
                    if p[1] != s[0] {
                        return false;
                    }
                    p = &p[1..];
                    s = &s[1..];
                }
                b => {
                    if b != s[0] {
                        return false;
                    }
                    s = &s[1..];
                }
            }
            p = &p[1..];
        }
        s.is_empty() && p.iter().all(|&b| b == b'*')
    }

    fn m(p: &str, s: &str) -> bool {
        Pattern::new(p.as_bytes()).matches(s.as_bytes())
    }

    #[test]
    fn redis_documented_examples() {
        for s in ["hello", "hallo", "hxllo"] {
            assert!(m("h?llo", s));
        }
        for s in ["hllo", "heeeello"] {
            assert!(m("h*llo", s));
        }
        assert!(m("h[ae]llo", "hello") && m("h[ae]llo", "hallo") && !m("h[ae]llo", "hillo"));
        assert!(m("h[^e]llo", "hallo") && m("h[^e]llo", "hbllo") && !m("h[^e]llo", "hello"));
        assert!(m("h[a-b]llo", "hallo") && m("h[a-b]llo", "hbllo") && !m("h[a-b]llo", "hcllo"));
        assert!(m("h[b-a]llo", "hallo"), "a range written backwards");
        assert!(m("*", "") && m("*", "anything") && m("**", "x"));
        assert!(!m("", "x") && m("", ""));
        assert!(m("h\\*llo", "h*llo") && !m("h\\*llo", "hello"));
        assert!(m("a[\\]]b", "a]b") && m("a\\", "a\\"));
        assert!(m("user:*:name", "user:42:name") && !m("user:*:name", "user:42:age"));
        assert!(
            m("a[bc", "ab") && !m("a[bc", "ad"),
            "an open class runs to the end"
        );
        assert!(
            !m("a[]b", "ab") && !m("a[]b", "a]b"),
            "an empty class matches nothing"
        );
        assert!(!m("Key*", "key1"), "case matters in key patterns");
    }

    #[test]
    fn config_patterns_ignore_case() {
        for (p, t, matched) in [
            ("*", "save", true),
            ("sa*", "save", true),
            ("*ve", "save", true),
            ("s?ve", "save", true),
            ("s[a-c]ve", "save", true),
            ("s[^a]ve", "save", false),
            ("S[A]VE", "save", true),
            ("s[B-A]ve", "save", true),
            ("s\\ave", "save", true),
            ("*a*e*", "save", true),
            ("sav", "save", false),
            ("*x*", "save", false),
            ("", "save", false),
            ("MAX*", "maxmemory", true),
        ] {
            assert_eq!(
                Pattern::ignoring_case(p.as_bytes()).matches(t.as_bytes()),
                matched,
                "{p} ~ {t}"
            );
        }
    }

    #[test]
    fn many_stars_stay_fast() {
        // A pattern that makes a naive matcher backtrack exponentially.
        let p = Pattern::new(
            &b"a*"
                .repeat(40)
                .into_iter()
                .chain(*b"b")
                .collect::<Vec<u8>>(),
        );
        assert!(!p.matches(&[b'a'; 2000]));
    }

    fn bytes_of(alphabet: &'static [u8], max: usize) -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(prop::sample::select(alphabet), 0..max)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn matches_as_redis_does(
            p in bytes_of(b"ab*?[]^-\\", 10),
            s in bytes_of(b"ab-]^*\\", 8),
        ) {
            prop_assert_eq!(Pattern::new(&p).matches(&s), reference(&p, &s), "{:?} on {:?}",
                String::from_utf8_lossy(&p), String::from_utf8_lossy(&s));
        }
    }
}
