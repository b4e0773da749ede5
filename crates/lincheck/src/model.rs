//! The sequential specification of one key: a register holding `Option<bytes>`, with values interned to small ids
//! so that the search's states are cheap to copy, hash and compare.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::history::{Op, Outcome};

/// How [`Op::Incr`] reads a stored value as an integer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum IntSyntax {
    /// As Redis does: an optional `-` and decimal digits without leading zeros (`"0"` itself is fine, `"-0"` is
    /// not), no `+`, no spaces, within `i64`.
    #[default]
    Strict,
    /// As Rust's `i64::from_str` does: an optional `+` or `-` and decimal digits, leading zeros allowed.
    Lenient,
}

impl IntSyntax {
    /// The integer `bytes` stand for, `None` when they are not one.
    pub fn parse(self, bytes: &[u8]) -> Option<i64> {
        match self {
            IntSyntax::Lenient => std::str::from_utf8(bytes).ok()?.parse().ok(),
            IntSyntax::Strict => {
                let digits = bytes.strip_prefix(b"-").unwrap_or(bytes);
                let negative = digits.len() < bytes.len();
                let first = *digits.first()?;
                if !first.is_ascii_digit() || (first == b'0' && (digits.len() > 1 || negative)) {
                    return None;
                }
                // Accumulate negatively so that i64::MIN parses.
                let mut n: i64 = 0;
                for &d in digits {
                    if !d.is_ascii_digit() {
                        return None;
                    }
                    n = n.checked_mul(10)?.checked_sub(i64::from(d - b'0'))?;
                }
                if negative { Some(n) } else { n.checked_neg() }
            }
        }
    }
}

/// The id of a register value; [`ABSENT`] is the absent key.
pub(crate) type ValueId = u32;

/// The id of "no value".
pub(crate) const ABSENT: ValueId = 0;

/// Interns register values to [`ValueId`]s and remembers each one's integer reading.
#[derive(Debug)]
pub(crate) struct Values {
    syntax: IntSyntax,
    ids: HashMap<Vec<u8>, ValueId>,
    bytes: Vec<Vec<u8>>,
    ints: Vec<Option<i64>>,
    /// Whether the value is the canonical decimal text of its integer (what increments write).
    canonical: Vec<bool>,
    int_ids: HashMap<i64, ValueId>,
}

impl Values {
    pub(crate) fn new(syntax: IntSyntax) -> Self {
        Self {
            syntax,
            ids: HashMap::new(),
            // Slot 0 stands for ABSENT, which reads as 0 for incr.
            bytes: vec![Vec::new()],
            ints: vec![Some(0)],
            canonical: vec![false],
            int_ids: HashMap::new(),
        }
    }

    pub(crate) fn intern(&mut self, value: &[u8]) -> ValueId {
        if let Some(&id) = self.ids.get(value) {
            return id;
        }
        // More distinct values than u32 ids cannot fit in memory alongside their bytes; saturating keeps this total.
        let id = ValueId::try_from(self.bytes.len()).unwrap_or(ValueId::MAX);
        self.ids.insert(value.to_vec(), id);
        self.bytes.push(value.to_vec());
        let int = self.syntax.parse(value);
        self.ints.push(int);
        self.canonical
            .push(int.is_some_and(|n| n.to_string().as_bytes() == value));
        id
    }

    pub(crate) fn intern_opt(&mut self, value: Option<&[u8]>) -> ValueId {
        value.map_or(ABSENT, |v| self.intern(v))
    }

    fn intern_int(&mut self, n: i64) -> ValueId {
        if let Some(&id) = self.int_ids.get(&n) {
            return id;
        }
        let id = self.intern(n.to_string().as_bytes());
        self.int_ids.insert(n, id);
        id
    }

    /// The value's bytes, `None` for [`ABSENT`].
    pub(crate) fn get(&self, id: ValueId) -> Option<&[u8]> {
        if id == ABSENT {
            None
        } else {
            self.bytes.get(id as usize).map(Vec::as_slice)
        }
    }

    /// The integer `id` holds if it is exactly the decimal text an increment writes (`None` for the absent key).
    pub(crate) fn int_value(&self, id: ValueId) -> Option<i64> {
        if self.canonical.get(id as usize).copied().unwrap_or(false) {
            self.int(id)
        } else {
            None
        }
    }

    fn int(&self, id: ValueId) -> Option<i64> {
        self.ints.get(id as usize).copied().flatten()
    }
}

/// What an [`Op::Incr`] answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum IncrResult {
    Int(i64),
    Error,
    /// Unknown outcome.
    Any,
}

/// Which values written by increments (canonical decimal integers) an operation's recorded response fits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IntegerFit {
    /// Possibly any of them.
    Anything,
    /// Only this one.
    Exactly(i64),
    /// None.
    Never,
}

/// One operation compiled against a [`Values`] table: its effect and the response it must reproduce.
/// `Option<bool>` is `None` for an unknown outcome. Reads with unknown outcome are never compiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Step {
    Get(ValueId),
    Set(ValueId),
    Insert(ValueId, Option<bool>),
    Update(ValueId, Option<bool>),
    Delete(Option<bool>),
    Incr(i64, IncrResult),
    /// A `GETDEL` that read this value ([`ABSENT`]: found nothing), `None` when its outcome is unknown.
    Take(Option<ValueId>),
}

impl Step {
    /// Compiles an operation and its outcome; `None` for a read with unknown outcome, which constrains nothing.
    /// The outcome must suit the operation (see [`Op::accepts`]); an unsuitable one compiles as unknown.
    pub(crate) fn compile(op: &Op, outcome: &Outcome, values: &mut Values) -> Option<Step> {
        let applied = match outcome {
            Outcome::Applied(b) => Some(*b),
            _ => None,
        };
        Some(match op {
            Op::Get(_) => match outcome {
                Outcome::Value(v) => Step::Get(values.intern_opt(v.as_deref())),
                _ => return None,
            },
            Op::Set(_, v) => Step::Set(values.intern(v)),
            Op::Insert(_, v) => Step::Insert(values.intern(v), applied),
            Op::Update(_, v) => Step::Update(values.intern(v), applied),
            Op::Delete(_) => Step::Delete(applied),
            Op::Take(_) => Step::Take(match outcome {
                Outcome::Value(v) => Some(values.intern_opt(v.as_deref())),
                _ => None,
            }),
            Op::Incr(_, delta) => Step::Incr(
                *delta,
                match outcome {
                    Outcome::Int(n) => IncrResult::Int(*n),
                    Outcome::Error => IncrResult::Error,
                    _ => IncrResult::Any,
                },
            ),
        })
    }

    /// Which integer values, as increments write them, the operation's recorded response fits.
    pub(crate) fn integer_fit(&self, values: &Values) -> IntegerFit {
        match *self {
            Step::Get(v) | Step::Take(Some(v)) => match values.int_value(v) {
                Some(n) => IntegerFit::Exactly(n),
                None => IntegerFit::Never,
            },
            Step::Incr(delta, IncrResult::Int(m)) => m
                .checked_sub(delta)
                .map_or(IntegerFit::Anything, IntegerFit::Exactly),
            // An insert that added, an update that found nothing, a delete that found nothing: only absence fits.
            Step::Insert(_, Some(true))
            | Step::Update(_, Some(false))
            | Step::Delete(Some(false)) => IntegerFit::Never,
            _ => IntegerFit::Anything,
        }
    }

    /// Whether the operation never changes the value when its recorded response fits: a read, or an insert,
    /// update, delete or increment that answered it did nothing.
    pub(crate) fn is_pure(&self) -> bool {
        matches!(
            self,
            Step::Get(_)
                | Step::Insert(_, Some(false))
                | Step::Update(_, Some(false))
                | Step::Delete(Some(false))
                | Step::Incr(_, IncrResult::Error)
                | Step::Take(Some(ABSENT))
        )
    }

    /// Applies the operation to `state`: the new state, or `None` when its recorded response cannot come from
    /// `state`.
    pub(crate) fn apply(&self, state: ValueId, values: &mut Values) -> Option<ValueId> {
        let present = state != ABSENT;
        match *self {
            Step::Get(expect) => (expect == state).then_some(state),
            Step::Set(v) => Some(v),
            Step::Insert(v, applied) => match applied {
                Some(a) if a == present => None,
                _ => Some(if present { state } else { v }),
            },
            Step::Update(v, applied) => match applied {
                Some(a) if a != present => None,
                _ => Some(if present { v } else { state }),
            },
            Step::Delete(applied) => match applied {
                Some(a) if a != present => None,
                _ => Some(ABSENT),
            },
            Step::Take(read) => match read {
                Some(expect) if expect != state => None,
                _ => Some(ABSENT),
            },
            Step::Incr(delta, result) => {
                let sum = values.int(state).and_then(|n| n.checked_add(delta));
                match (sum, result) {
                    (None, IncrResult::Error | IncrResult::Any) => Some(state),
                    (Some(n), IncrResult::Int(m)) if n == m => Some(values.intern_int(n)),
                    (Some(n), IncrResult::Any) => Some(values.intern_int(n)),
                    _ => None,
                }
            }
        }
    }

    /// Why [`Step::apply`] refuses `state`, for reports.
    pub(crate) fn refusal(&self, state: ValueId, values: &Values, max_bytes: usize) -> String {
        use crate::bytes::ShownValue;
        let shown = |id| ShownValue(values.get(id), max_bytes).to_string();
        let now = shown(state);
        match *self {
            Step::Get(expect) | Step::Take(Some(expect)) => {
                format!("it read {} but the value is {now}", shown(expect))
            }
            Step::Insert(_, Some(a)) | Step::Update(_, Some(a)) | Step::Delete(Some(a)) => {
                format!("it answered {a} but the value is {now}")
            }
            Step::Incr(delta, IncrResult::Int(m)) => {
                match values.int(state).map(|n| n.checked_add(delta)) {
                    Some(Some(n)) => format!("it answered {m} but {now} + {delta} is {n}"),
                    Some(None) => format!("it answered {m} but {now} + {delta} overflows"),
                    None => format!("it answered {m} but the value {now} is not an integer"),
                }
            }
            Step::Incr(delta, IncrResult::Error) => {
                format!("it answered error but the value {now} + {delta} is a valid increment")
            }
            _ => "it always applies".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_syntax_reads_like_redis() {
        let p = |s: &str| IntSyntax::Strict.parse(s.as_bytes());
        assert_eq!(p("0"), Some(0));
        assert_eq!(p("42"), Some(42));
        assert_eq!(p("-7"), Some(-7));
        assert_eq!(p("9223372036854775807"), Some(i64::MAX));
        assert_eq!(p("-9223372036854775808"), Some(i64::MIN));
        for bad in [
            "",
            "-",
            "-0",
            "007",
            "+5",
            " 5",
            "5 ",
            "1a",
            "9223372036854775808",
            "-9223372036854775809",
        ] {
            assert_eq!(p(bad), None, "{bad:?}");
        }
        assert_eq!(IntSyntax::Strict.parse(&[0xff]), None);
    }

    #[test]
    fn lenient_syntax_reads_like_rust() {
        let p = |s: &str| IntSyntax::Lenient.parse(s.as_bytes());
        assert_eq!(p("007"), Some(7));
        assert_eq!(p("+5"), Some(5));
        assert_eq!(p("-0"), Some(0));
        assert_eq!(p(" 5"), None);
        assert_eq!(p(""), None);
    }

    #[test]
    fn steps_follow_the_register_specification() {
        let mut v = Values::new(IntSyntax::Strict);
        let a = v.intern(b"a");
        let b = v.intern(b"b");
        assert_eq!(v.intern(b"a"), a);
        assert_eq!(v.get(ABSENT), None);
        assert_eq!(v.get(a), Some(&b"a"[..]));

        assert_eq!(Step::Get(a).apply(a, &mut v), Some(a));
        assert_eq!(Step::Get(a).apply(b, &mut v), None);
        assert_eq!(Step::Get(ABSENT).apply(ABSENT, &mut v), Some(ABSENT));
        assert_eq!(Step::Set(b).apply(ABSENT, &mut v), Some(b));

        assert_eq!(Step::Insert(b, Some(true)).apply(ABSENT, &mut v), Some(b));
        assert_eq!(Step::Insert(b, Some(true)).apply(a, &mut v), None);
        assert_eq!(Step::Insert(b, Some(false)).apply(a, &mut v), Some(a));
        assert_eq!(Step::Insert(b, Some(false)).apply(ABSENT, &mut v), None);
        assert_eq!(Step::Insert(b, None).apply(ABSENT, &mut v), Some(b));
        assert_eq!(Step::Insert(b, None).apply(a, &mut v), Some(a));

        assert_eq!(Step::Update(b, Some(true)).apply(a, &mut v), Some(b));
        assert_eq!(Step::Update(b, Some(true)).apply(ABSENT, &mut v), None);
        assert_eq!(
            Step::Update(b, Some(false)).apply(ABSENT, &mut v),
            Some(ABSENT)
        );
        assert_eq!(Step::Update(b, Some(false)).apply(a, &mut v), None);
        assert_eq!(Step::Update(b, None).apply(a, &mut v), Some(b));
        assert_eq!(Step::Update(b, None).apply(ABSENT, &mut v), Some(ABSENT));

        assert_eq!(Step::Delete(Some(true)).apply(a, &mut v), Some(ABSENT));
        assert_eq!(Step::Delete(Some(true)).apply(ABSENT, &mut v), None);
        assert_eq!(
            Step::Delete(Some(false)).apply(ABSENT, &mut v),
            Some(ABSENT)
        );
        assert_eq!(Step::Delete(Some(false)).apply(a, &mut v), None);
        assert_eq!(Step::Delete(None).apply(a, &mut v), Some(ABSENT));
    }

    #[test]
    fn incr_reads_writes_and_refuses_decimal_values() {
        let mut v = Values::new(IntSyntax::Strict);
        let five = v.intern(b"5");
        let text = v.intern(b"x");
        let padded = v.intern(b"05");
        let max = v.intern(i64::MAX.to_string().as_bytes());
        let one = Step::Incr(1, IncrResult::Int(1))
            .apply(ABSENT, &mut v)
            .unwrap();
        assert_eq!(v.get(one), Some(&b"1"[..]));
        let three = Step::Incr(-2, IncrResult::Int(3))
            .apply(five, &mut v)
            .unwrap();
        assert_eq!(v.get(three), Some(&b"3"[..]));
        assert_eq!(Step::Incr(1, IncrResult::Int(7)).apply(five, &mut v), None);
        assert_eq!(Step::Incr(1, IncrResult::Error).apply(five, &mut v), None);
        assert_eq!(
            Step::Incr(1, IncrResult::Error).apply(text, &mut v),
            Some(text)
        );
        assert_eq!(
            Step::Incr(1, IncrResult::Error).apply(padded, &mut v),
            Some(padded)
        );
        assert_eq!(Step::Incr(1, IncrResult::Int(1)).apply(text, &mut v), None);
        assert_eq!(
            Step::Incr(1, IncrResult::Error).apply(max, &mut v),
            Some(max)
        );
        assert_eq!(Step::Incr(1, IncrResult::Any).apply(max, &mut v), Some(max));
        let six = Step::Incr(1, IncrResult::Any).apply(five, &mut v).unwrap();
        assert_eq!(v.get(six), Some(&b"6"[..]));

        let mut lenient = Values::new(IntSyntax::Lenient);
        let padded = lenient.intern(b"05");
        let six = Step::Incr(1, IncrResult::Int(6))
            .apply(padded, &mut lenient)
            .unwrap();
        assert_eq!(lenient.get(six), Some(&b"6"[..]));
    }

    #[test]
    fn refusals_name_the_conflict() {
        let mut v = Values::new(IntSyntax::Strict);
        let a = v.intern(b"a");
        let b = v.intern(b"b");
        assert_eq!(
            Step::Get(a).refusal(b, &v, 8),
            "it read \"a\" but the value is \"b\""
        );
        assert_eq!(
            Step::Delete(Some(true)).refusal(ABSENT, &v, 8),
            "it answered true but the value is nil"
        );
        assert!(
            Step::Incr(1, IncrResult::Int(9))
                .refusal(ABSENT, &v, 8)
                .contains("nil + 1 is 1")
        );
        assert!(
            Step::Incr(1, IncrResult::Int(9))
                .refusal(a, &v, 8)
                .contains("not an integer")
        );
    }
}
