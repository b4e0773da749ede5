//! What Redis's string commands do to a stored value: `INCRBY`, `INCRBYFLOAT`, `GETRANGE`, `SETRANGE` and the
//! bit commands (`SETBIT`, `GETBIT`, `BITCOUNT`, `BITPOS`).
//!
//! Every store computes these where the key is owned (a DINOMO KV node's worker, a pDPM baseline's
//! read-modify-write, the in-memory test store), so one definition here keeps their answers the same. Numbers are
//! parsed and printed as Redis does, with one difference: floats are IEEE doubles here, where Redis uses the C
//! `long double` (80 bits on x86), so a sum may differ from Redis's in its last digits (0.1 + 0.2 is
//! `0.30000000000000004` here, `0.3` there).

/// Why a value cannot be changed as asked; the texts are Redis's error replies.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// The stored value or the increment is not a decimal 64-bit integer.
    #[error("value is not an integer or out of range")]
    NotAnInteger,
    /// An integer increment whose result does not fit in 64 bits.
    #[error("increment or decrement would overflow")]
    IntegerOverflow,
    /// The stored value or the increment is not a number.
    #[error("value is not a valid float")]
    NotAFloat,
    /// A float increment whose result is infinite (or not a number).
    #[error("increment would produce NaN or Infinity")]
    NotFinite,
    /// The value a `SETRANGE` would make is longer than the store's limit.
    #[error("string exceeds maximum allowed size ({len} bytes, the limit is {max})")]
    TooLong {
        /// The length it would have (saturated at `u64::MAX`).
        len: u64,
        /// The store's limit.
        max: usize,
    },
}

/// The longest text taken as a float (Redis's `MAX_LONG_DOUBLE_CHARS`).
pub const MAX_FLOAT_CHARS: usize = 5 * 1024;

/// What a watched key (`WATCH`) is compared by: a 128-bit hash of its value, `None` for no value. A transaction
/// whose watched key's digest changed does not run; a write of the same bytes leaves the digest as it was.
pub fn digest(value: Option<&[u8]>) -> Option<u128> {
    value.map(xxhash_rust::xxh3::xxh3_128)
}

/// `s` as a decimal 64-bit integer in its one canonical spelling, as Redis's `string2ll` reads it: an optional
/// `-`, no leading zeros, no `+`, no blanks.
pub fn parse_integer(s: &[u8]) -> Option<i64> {
    if s == b"0" {
        return Some(0);
    }
    let (negative, digits) = match s {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, s),
    };
    if digits.is_empty() || digits.len() > 19 || !(b'1'..=b'9').contains(&digits[0]) {
        return None;
    }
    let mut v: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    if negative {
        if v > i64::MAX as u64 + 1 {
            return None;
        }
        Some((v as i64).wrapping_neg())
    } else {
        i64::try_from(v).ok()
    }
}

/// `INCRBY`: the stored integer (none = 0) plus `delta`.
pub fn increment(old: Option<&[u8]>, delta: i64) -> Result<i64, ValueError> {
    let n = match old {
        None => 0,
        Some(v) => parse_integer(v).ok_or(ValueError::NotAnInteger)?,
    };
    n.checked_add(delta).ok_or(ValueError::IntegerOverflow)
}

/// `s` as a float, as Redis's `string2ld` reads it: decimal or exponent notation, `inf` and `-inf` spelled out;
/// not empty, no blanks around it, not longer than [`MAX_FLOAT_CHARS`], not `nan`, and not a finite number too
/// large or too small (other than zero) for a double.
pub fn parse_float(s: &[u8]) -> Option<f64> {
    if s.is_empty() || s.len() >= MAX_FLOAT_CHARS {
        return None;
    }
    let text = std::str::from_utf8(s).ok()?;
    // Rust reads the forms C's strtod does, less hexadecimal, and refuses blanks as Redis does.
    let x: f64 = text.parse().ok()?;
    if x.is_nan() {
        return None;
    }
    let spelled_infinite = text
        .trim_start_matches(['+', '-'])
        .bytes()
        .next()
        .is_some_and(|c| c.eq_ignore_ascii_case(&b'i'));
    if x.is_infinite() && !spelled_infinite {
        return None;
    }
    // A nonzero literal that rounds to zero underflowed.
    let mantissa = text.split(['e', 'E']).next().unwrap_or(text);
    if x == 0.0 && mantissa.bytes().any(|c| (b'1'..=b'9').contains(&c)) {
        return None;
    }
    Some(x)
}

/// `x` as `INCRBYFLOAT` stores and answers it: the shortest decimal that reads back as `x`, never in exponent
/// notation, without trailing zeros, and `0` for negative zero.
pub fn format_float(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    x.to_string()
}

/// `INCRBYFLOAT`: the stored number (none = 0) plus the increment `delta` (as the client spelled it), in the form
/// that is stored and answered.
pub fn increment_float(old: Option<&[u8]>, delta: &[u8]) -> Result<Vec<u8>, ValueError> {
    let delta = parse_float(delta).ok_or(ValueError::NotAFloat)?;
    let n = match old {
        None => 0.0,
        Some(v) => parse_float(v).ok_or(ValueError::NotAFloat)?,
    };
    let sum = n + delta;
    if !sum.is_finite() {
        return Err(ValueError::NotFinite);
    }
    Ok(format_float(sum).into_bytes())
}

/// `GETRANGE`: the bytes of `value` from `start` to `end`, both included; negative positions count from the end
/// (-1 is the last byte). Positions beyond either end are clamped; a range that is empty after that gives no
/// bytes.
pub fn range(value: &[u8], start: i64, end: i64) -> &[u8] {
    if start < 0 && end < 0 && start > end {
        return &[];
    }
    let len = value.len() as i64;
    let from_end = |i: i64| if i < 0 { len.saturating_add(i) } else { i };
    let start = from_end(start).max(0);
    let end = from_end(end).max(0).min(len - 1);
    if len == 0 || start > end {
        return &[];
    }
    &value[start as usize..=end as usize]
}

/// What `SETRANGE` does to a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeWrite {
    /// Nothing to write (the bytes are empty): the value's length, 0 when there is none.
    Unchanged(usize),
    /// The new value to store (its length is the reply).
    Write(Vec<u8>),
}

/// `SETRANGE`: `old` (none = empty) with `bytes` written at `offset`, padded with zero bytes where `offset` lies
/// beyond its end. A value longer than `max_len` is refused before any memory is taken for it.
pub fn set_range(
    old: Option<Vec<u8>>,
    offset: u64,
    bytes: &[u8],
    max_len: usize,
) -> Result<RangeWrite, ValueError> {
    if bytes.is_empty() {
        return Ok(RangeWrite::Unchanged(old.map_or(0, |v| v.len())));
    }
    let end = offset.saturating_add(bytes.len() as u64);
    if end > max_len as u64 {
        return Err(ValueError::TooLong {
            len: end,
            max: max_len,
        });
    }
    // `end` fits in `max_len`, a usize.
    let (offset, end) = (offset as usize, end as usize);
    let mut value = old.unwrap_or_default();
    if value.len() < end {
        value.resize(end, 0);
    }
    value[offset..end].copy_from_slice(bytes);
    Ok(RangeWrite::Write(value))
}

/// The bits from `start` to `end` of a value of `len` bytes, both included, counted in bits (`bits`) or in bytes
/// (`!bits`: whole bytes), negative positions counting from the end, clamped to the value as Redis clamps them:
/// the first and last bit index, `None` when the range holds no bit.
fn bit_span(len: usize, start: i64, end: i64, bits: bool) -> Option<(u64, u64)> {
    let total = if bits { len as i64 * 8 } else { len as i64 };
    let from_end = |i: i64| if i < 0 { total.saturating_add(i) } else { i };
    let start = from_end(start).max(0);
    let end = from_end(end).max(0).min(total - 1);
    if start > end {
        return None;
    }
    let (start, end) = (start as u64, end as u64);
    Some(if bits {
        (start, end)
    } else {
        (start * 8, end * 8 + 7)
    })
}

/// Bit `i` of `value` (bit 0 is the most significant bit of the first byte); 0 beyond its end.
pub fn get_bit(value: &[u8], i: u64) -> u8 {
    let Ok(byte) = usize::try_from(i >> 3) else {
        return 0;
    };
    value.get(byte).map_or(0, |b| (b >> (7 - (i & 7))) & 1)
}

/// What `SETBIT` does to a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BitWrite {
    /// The bit before (the reply).
    pub previous: u8,
    /// The new value to store; `None` when the value is there and already had the bit.
    pub value: Option<Vec<u8>>,
}

/// `SETBIT`: `old` (none = empty) with bit `i` set to `bit`, grown with zero bytes to hold it; a key that had no
/// value gets one even when the bit is 0, as in Redis. A value longer than `max_len` is refused before any memory
/// is taken for it.
pub fn set_bit(
    old: Option<Vec<u8>>,
    i: u64,
    bit: bool,
    max_len: usize,
) -> Result<BitWrite, ValueError> {
    let need = (i >> 3) + 1;
    if need > max_len as u64 {
        return Err(ValueError::TooLong {
            len: need,
            max: max_len,
        });
    }
    let existed = old.is_some();
    let mut value = old.unwrap_or_default();
    let previous = get_bit(&value, i);
    if existed && value.len() as u64 >= need && previous == u8::from(bit) {
        return Ok(BitWrite {
            previous,
            value: None,
        });
    }
    // `need` fits in `max_len`, a usize.
    let byte = (i >> 3) as usize;
    if value.len() <= byte {
        value.resize(byte + 1, 0);
    }
    let mask = 0x80u8 >> (i & 7);
    if bit {
        value[byte] |= mask;
    } else {
        value[byte] &= !mask;
    }
    Ok(BitWrite {
        previous,
        value: Some(value),
    })
}

/// `BITCOUNT`: the set bits of `value`, all of them or those of the range (`start`, `end`, counted in bits when
/// the flag is set, else in bytes; see [`range`] for the positions).
pub fn bit_count(value: &[u8], range: Option<(i64, i64, bool)>) -> u64 {
    let (first, last) = match range {
        None if value.is_empty() => return 0,
        None => (0, value.len() as u64 * 8 - 1),
        // Both from the end, and in the wrong order: nothing (Redis answers so before clamping).
        Some((start, end, _)) if start < 0 && end < 0 && start > end => return 0,
        Some((start, end, bits)) => match bit_span(value.len(), start, end, bits) {
            Some(span) => span,
            None => return 0,
        },
    };
    count_ones(value, first, last)
}

/// The set bits of `value` from bit `first` to bit `last`, both included (both within the value).
fn count_ones(value: &[u8], first: u64, last: u64) -> u64 {
    let (a, b) = ((first >> 3) as usize, (last >> 3) as usize);
    let whole: u64 = value[a..=b].iter().map(|x| u64::from(x.count_ones())).sum();
    // Taken back out: the bits of the first byte before `first`, and those of the last byte after `last`.
    let before = value[a] & !(0xffu8 >> (first & 7));
    let after = value[b] & (0x7fu8 >> (last & 7));
    whole - u64::from(before.count_ones()) - u64::from(after.count_ones())
}

/// `BITPOS`: the position of the first bit equal to `bit` in `value` (none: a key without a value, which reads as
/// zeros without end), searching all of it or the range (`start`, an optional `end`, counted in bits when the flag
/// is set, else in bytes). -1 when there is none; a search for a 0 without an `end` that finds only ones answers the
/// first bit after the value, as Redis does (the value reads as padded with zeros).
pub fn bit_pos(value: Option<&[u8]>, bit: bool, range: Option<(i64, Option<i64>, bool)>) -> i64 {
    let Some(value) = value else {
        return if bit { -1 } else { 0 };
    };
    // No range: the whole value, in bytes.
    let (start, end, bits) = range.unwrap_or_default();
    let Some((first, last)) = bit_span(value.len(), start, end.unwrap_or(i64::MAX), bits) else {
        return -1;
    };
    let want = u8::from(bit);
    // Whole bytes without the bit are stepped over at once.
    let other = if bit { 0x00 } else { 0xff };
    let mut i = first;
    while i <= last {
        if i & 7 == 0 && i + 7 <= last && value[(i >> 3) as usize] == other {
            i += 8;
        } else if get_bit(value, i) == want {
            return i as i64;
        } else {
            i += 1;
        }
    }
    if bit || end.is_some() {
        -1
    } else {
        last as i64 + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn integers_are_read_only_in_their_canonical_spelling() {
        assert_eq!(parse_integer(b"0"), Some(0));
        assert_eq!(parse_integer(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_integer(b"9223372036854775807"), Some(i64::MAX));
        for bad in [
            b"".as_slice(),
            b"-",
            b"-0",
            b"+1",
            b"01",
            b" 1",
            b"1 ",
            b"1.5",
            b"9223372036854775808",
            b"-9223372036854775809",
        ] {
            assert_eq!(parse_integer(bad), None, "{bad:?}");
        }
        assert_eq!(increment(None, 5), Ok(5));
        assert_eq!(increment(Some(b"-3"), 1), Ok(-2));
        assert_eq!(increment(Some(b"x"), 1), Err(ValueError::NotAnInteger));
        assert_eq!(
            increment(Some(b"9223372036854775807"), 1),
            Err(ValueError::IntegerOverflow)
        );
    }

    #[test]
    fn floats_are_read_and_printed_as_redis_does() {
        assert_eq!(parse_float(b"10.50"), Some(10.5));
        assert_eq!(parse_float(b"5.0e3"), Some(5000.0));
        assert_eq!(parse_float(b"-inf"), Some(f64::NEG_INFINITY));
        assert_eq!(parse_float(b"3"), Some(3.0));
        assert_eq!(parse_float(b".5"), Some(0.5));
        assert_eq!(parse_float(b"0e5"), Some(0.0));
        for bad in [
            b"".as_slice(),
            b" 1",
            b"1 ",
            b"1x",
            b"nan",
            b"1e400",
            b"-1e400",
            b"1e-400",
            b"0x10",
        ] {
            assert_eq!(parse_float(bad), None, "{bad:?}");
        }
        assert_eq!(parse_float(&vec![b'1'; MAX_FLOAT_CHARS]), None);
        assert_eq!(format_float(3.0), "3");
        assert_eq!(format_float(-0.0), "0");
        assert_eq!(format_float(1e20), "100000000000000000000");
        assert_eq!(format_float(1.5e-7), "0.00000015");
        assert_eq!(
            increment_float(Some(b"10.50"), b"0.1"),
            Ok(b"10.6".to_vec())
        );
        assert_eq!(increment_float(None, b"5.0e3"), Ok(b"5000".to_vec()));
        assert_eq!(
            increment_float(Some(b"5.0e3"), b"2.0e2"),
            Ok(b"5200".to_vec())
        );
        assert_eq!(
            increment_float(Some(b"abc"), b"1"),
            Err(ValueError::NotAFloat)
        );
        assert_eq!(increment_float(None, b"x"), Err(ValueError::NotAFloat));
        assert_eq!(increment_float(None, b"inf"), Err(ValueError::NotFinite));
        assert_eq!(
            increment_float(Some(b"1.7e308"), b"1.7e308"),
            Err(ValueError::NotFinite)
        );
    }

    #[test]
    fn ranges_follow_redis_examples() {
        // The examples of Redis's GETRANGE documentation.
        let v = b"This is a string";
        assert_eq!(range(v, 0, 3), b"This");
        assert_eq!(range(v, -3, -1), b"ing");
        assert_eq!(range(v, 0, -1), v);
        assert_eq!(range(v, 10, 100), b"string");
        assert_eq!(range(v, 5, 3), b"");
        assert_eq!(range(v, -1, -5), b"");
        assert_eq!(range(v, -100, 0), b"T");
        assert_eq!(range(b"a", -32, -2), b"a");
        assert_eq!(range(v, i64::MIN, i64::MAX), v);
        assert_eq!(range(b"", 0, -1), b"");
    }

    #[test]
    fn set_range_pads_with_zeros_and_refuses_before_allocating() {
        assert_eq!(
            set_range(Some(b"Hello World".to_vec()), 6, b"Redis", 100),
            Ok(RangeWrite::Write(b"Hello Redis".to_vec()))
        );
        assert_eq!(
            set_range(None, 6, b"Redis", 100),
            Ok(RangeWrite::Write(b"\0\0\0\0\0\0Redis".to_vec()))
        );
        assert_eq!(set_range(None, 6, b"", 100), Ok(RangeWrite::Unchanged(0)));
        assert_eq!(
            set_range(Some(b"abc".to_vec()), u64::MAX, b"", 100),
            Ok(RangeWrite::Unchanged(3))
        );
        assert_eq!(
            set_range(None, u64::MAX, b"x", 100),
            Err(ValueError::TooLong {
                len: u64::MAX,
                max: 100
            })
        );
        assert_eq!(
            set_range(None, 99, b"xy", 100),
            Err(ValueError::TooLong { len: 101, max: 100 })
        );
        assert!(
            matches!(set_range(None, 98, b"xy", 100), Ok(RangeWrite::Write(v)) if v.len() == 100)
        );
    }

    #[test]
    fn bits_follow_redis_examples() {
        // SETBIT mykey 7 1 on no key: "\x01", previous 0; then 7 0.
        let w = set_bit(None, 7, true, 100).unwrap();
        assert_eq!((w.previous, w.value.as_deref()), (0, Some(&b"\x01"[..])));
        let w = set_bit(w.value, 7, false, 100).unwrap();
        assert_eq!((w.previous, w.value.as_deref()), (1, Some(&b"\x00"[..])));
        // A bit already as asked changes nothing; a 0 on no key still makes one.
        assert_eq!(set_bit(Some(vec![0]), 3, false, 100).unwrap().value, None);
        assert_eq!(
            set_bit(None, 100, false, 100).unwrap().value,
            Some(vec![0; 13])
        );
        assert_eq!(
            set_bit(None, 800, true, 100),
            Err(ValueError::TooLong { len: 101, max: 100 })
        );
        assert_eq!(get_bit(b"\x01", 7), 1);
        assert_eq!(get_bit(b"\x01", 0), 0);
        assert_eq!(get_bit(b"\x01", u64::MAX), 0);
        // BITCOUNT of "foobar" (Redis's documentation).
        assert_eq!(bit_count(b"foobar", None), 26);
        assert_eq!(bit_count(b"foobar", Some((0, 0, false))), 4);
        assert_eq!(bit_count(b"foobar", Some((1, 1, false))), 6);
        assert_eq!(bit_count(b"foobar", Some((5, 30, true))), 17);
        assert_eq!(bit_count(b"foobar", Some((-1, -5, false))), 0);
        assert_eq!(bit_count(b"", None), 0);
        // BITPOS of "\xff\xf0\x00" and "\x00\xff\xf0" (Redis's documentation).
        assert_eq!(bit_pos(Some(b"\xff\xf0\x00"), false, None), 12);
        assert_eq!(
            bit_pos(Some(b"\x00\xff\xf0"), true, Some((0, None, false))),
            8
        );
        assert_eq!(
            bit_pos(Some(b"\x00\xff\xf0"), true, Some((2, None, false))),
            16
        );
        assert_eq!(
            bit_pos(Some(b"\x00\xff\xf0"), true, Some((2, Some(-1), false))),
            16
        );
        assert_eq!(
            bit_pos(Some(b"\x00\xff\xf0"), true, Some((7, Some(15), true))),
            8
        );
        assert_eq!(bit_pos(Some(b"\x00\x00\x00"), true, None), -1);
        assert_eq!(bit_pos(Some(b"\xff\xff"), false, None), 16);
        assert_eq!(
            bit_pos(Some(b"\xff\xff"), false, Some((0, Some(-1), false))),
            -1
        );
        assert_eq!(bit_pos(None, false, None), 0);
        assert_eq!(bit_pos(None, true, None), -1);
        assert_eq!(bit_pos(Some(b""), false, None), -1);
    }

    proptest! {
        /// `BITCOUNT` and `BITPOS` agree with a bit-by-bit reading of the range.
        #[test]
        fn bit_ranges_agree_with_single_bits(value in proptest::collection::vec(any::<u8>(), 0..12),
                                            start in -100i64..100, end in -100i64..100, bits in any::<bool>(),
                                            bit in any::<bool>(), end_given in any::<bool>()) {
            let total = if bits { value.len() as i64 * 8 } else { value.len() as i64 };
            let clamp = |i: i64| (if i < 0 { total + i } else { i }).max(0);
            let (s, e) = (clamp(start), clamp(end).min(total - 1));
            let in_range = |i: u64| {
                let unit = if bits { i as i64 } else { (i / 8) as i64 };
                unit >= s && unit <= e
            };
            let all = 0..value.len() as u64 * 8;
            let ones = all.clone().filter(|&i| in_range(i) && get_bit(&value, i) == 1).count() as u64;
            let expected = if start < 0 && end < 0 && start > end { 0 } else { ones };
            prop_assert_eq!(bit_count(&value, Some((start, end, bits))), expected);
            let end = end_given.then_some(end);
            let e = end.map_or(total - 1, |end| clamp(end).min(total - 1));
            let in_range = |i: u64| {
                let unit = if bits { i as i64 } else { (i / 8) as i64 };
                unit >= s && unit <= e
            };
            let found = all.clone().find(|&i| in_range(i) && get_bit(&value, i) == u8::from(bit));
            let got = bit_pos(Some(&value), bit, Some((start, end, bits)));
            match found {
                Some(i) => prop_assert_eq!(got, i as i64),
                None if s > e || bit || end.is_some() => prop_assert_eq!(got, -1),
                None => {
                    let last = all.clone().rfind(|&i| in_range(i)).unwrap();
                    prop_assert_eq!(got, last as i64 + 1);
                }
            }
        }

        /// `SETBIT` changes that one bit, and `GETBIT` reads it back.
        #[test]
        fn set_bit_changes_one_bit(old in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..8)),
                                   i in 0u64..100, bit in any::<bool>()) {
            let before = old.clone().unwrap_or_default();
            let w = set_bit(old.clone(), i, bit, 64).unwrap();
            prop_assert_eq!(w.previous, get_bit(&before, i));
            let after = w.value.clone().unwrap_or_else(|| before.clone());
            prop_assert_eq!(get_bit(&after, i), u8::from(bit));
            for j in 0..after.len() as u64 * 8 {
                if j != i {
                    prop_assert_eq!(get_bit(&after, j), get_bit(&before, j));
                }
            }
            prop_assert_eq!(w.value.is_none(), old.is_some() && after == before);
        }

        /// `GETRANGE` is the slice of the positions it names, counted as Redis counts them.
        #[test]
        fn range_is_the_named_slice(value in proptest::collection::vec(any::<u8>(), 0..40),
                                    start in -50i64..50, end in -50i64..50) {
            let len = value.len() as i64;
            let got = range(&value, start, end);
            let expected: Vec<u8> = (0..len)
                .filter(|&i| {
                    let s = if start < 0 { (len + start).max(0) } else { start };
                    // Redis clamps a negative end at the first byte too: GETRANGE of "a" from -32 to -2 is "a".
                    let e = if end < 0 { (len + end).max(0) } else { end };
                    !(start < 0 && end < 0 && start > end) && i >= s && i <= e
                })
                .map(|i| value[i as usize])
                .collect();
            prop_assert_eq!(got, expected.as_slice());
        }

        /// `SETRANGE` writes its bytes at the offset, keeps every other byte, and zero-fills any gap.
        #[test]
        fn set_range_keeps_the_rest(old in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
                                    offset in 0u64..60, bytes in proptest::collection::vec(any::<u8>(), 0..20)) {
            let before = old.clone().unwrap_or_default();
            match set_range(old.clone(), offset, &bytes, 64) {
                Ok(RangeWrite::Unchanged(len)) => {
                    prop_assert!(bytes.is_empty());
                    prop_assert_eq!(len, before.len());
                }
                Ok(RangeWrite::Write(v)) => {
                    let end = offset as usize + bytes.len();
                    prop_assert_eq!(v.len(), before.len().max(end));
                    prop_assert_eq!(&v[offset as usize..end], bytes.as_slice());
                    for (i, b) in v.iter().enumerate() {
                        if i < offset as usize || i >= end {
                            prop_assert_eq!(*b, before.get(i).copied().unwrap_or(0));
                        }
                    }
                }
                Err(ValueError::TooLong { len, .. }) => prop_assert!(len > 64),
                Err(e) => prop_assert!(false, "{e}"),
            }
        }

        /// What `INCRBYFLOAT` stores reads back as the very double it computed.
        #[test]
        fn stored_floats_read_back_exactly(a in -1e300f64..1e300, b in -1e300f64..1e300) {
            let stored = increment_float(Some(format_float(a).as_bytes()), format_float(b).as_bytes()).unwrap();
            prop_assert_eq!(parse_float(&stored), Some(a + b));
        }

        /// Every integer reads back from its decimal form, and only from that one.
        #[test]
        fn integers_round_trip(n in any::<i64>()) {
            prop_assert_eq!(parse_integer(n.to_string().as_bytes()), Some(n));
            let padded = format!("0{n}");
            prop_assert_eq!(parse_integer(padded.as_bytes()), None);
        }
    }
}
