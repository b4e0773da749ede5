//! Record contents: fixed-size keys made from record ids, and deterministic values that name their key and
//! version, so that a reader can check what it got.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::YcsbError;
use super::zipf::{GOLDEN_GAMMA, mix64};

/// Key size of the DINOMO paper's workloads: 8 bytes.
pub const DEFAULT_KEY_SIZE: usize = 8;
/// Smallest binary key: the 8 bytes of the (hashed or plain) id, which make keys of distinct ids distinct.
pub const MIN_BINARY_KEY_SIZE: usize = 8;
/// Smallest YCSB-style key: "user" and one digit.
pub const MIN_USER_KEY_SIZE: usize = 5;
/// Largest key [`KeyFormat`] makes (64 KiB).
pub const MAX_KEY_SIZE: usize = 1 << 16;
/// Smallest value: the 8-byte key id and the 8-byte version.
pub const MIN_VALUE_SIZE: usize = 16;
/// Largest value [`fill_value`] makes (64 MiB).
pub const MAX_VALUE_SIZE: usize = 1 << 26;

/// Length of the prefix "user" of YCSB-style keys.
const USER_PREFIX: &[u8] = b"user";
/// Decimal digits of the largest `u64`.
const MAX_DIGITS: usize = 20;

/// Which number a key is made from (YCSB's `insertorder`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyOrder {
    /// A bijective hash of the id (SplitMix64's finaliser), so consecutive ids land far apart in the key space and
    /// records load in random key order (YCSB's default `insertorder=hashed`, which uses FNV-64; a bijection keeps
    /// keys of distinct ids distinct, which FNV-64 does not promise).
    #[default]
    Hashed,
    /// The id itself, written so that keys sort as their ids do (`insertorder=ordered`).
    Ordered,
}

/// How a key spells its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyStyle {
    /// The number's 8 bytes — little-endian when hashed, big-endian when ordered, so that ordered keys sort as
    /// numbers — then deterministic filler bytes derived from the id up to the key size.
    #[default]
    Binary,
    /// YCSB's `"user" + number` in decimal, zero-padded to the key size (YCSB's `zeropadding`). The number must fit:
    /// 24 bytes hold any id; shorter keys fail for ids (or hashes) with too many digits.
    User,
}

/// The shape of the keys of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeyFormat {
    /// Bytes per key. Default [`DEFAULT_KEY_SIZE`].
    pub size: usize,
    /// Default [`KeyOrder::Hashed`].
    pub order: KeyOrder,
    /// Default [`KeyStyle::Binary`].
    pub style: KeyStyle,
}

impl Default for KeyFormat {
    fn default() -> KeyFormat {
        KeyFormat {
            size: DEFAULT_KEY_SIZE,
            order: KeyOrder::Hashed,
            style: KeyStyle::Binary,
        }
    }
}

impl KeyFormat {
    /// Checks the size: [`MIN_BINARY_KEY_SIZE`] (binary) or [`MIN_USER_KEY_SIZE`] (user) up to [`MAX_KEY_SIZE`].
    pub fn validate(&self) -> Result<(), YcsbError> {
        let min = match self.style {
            KeyStyle::Binary => MIN_BINARY_KEY_SIZE,
            KeyStyle::User => MIN_USER_KEY_SIZE,
        };
        if (min..=MAX_KEY_SIZE).contains(&self.size) {
            Ok(())
        } else {
            Err(YcsbError::KeySize {
                size: self.size,
                min,
                max: MAX_KEY_SIZE,
            })
        }
    }

    /// The number a key spells for record `id`.
    fn number(&self, id: u64) -> u64 {
        match self.order {
            KeyOrder::Hashed => mix64(id),
            KeyOrder::Ordered => id,
        }
    }

    /// Writes the key of record `id` into `out` (cleared first; its capacity is reused). Distinct ids give distinct
    /// keys. Fails on a bad size, or on a [`KeyStyle::User`] key too short for the number's digits.
    pub fn write(&self, id: u64, out: &mut Vec<u8>) -> Result<(), YcsbError> {
        self.validate()?;
        out.clear();
        let number = self.number(id);
        match self.style {
            KeyStyle::Binary => {
                out.reserve(self.size);
                match self.order {
                    KeyOrder::Hashed => out.extend_from_slice(&number.to_le_bytes()),
                    KeyOrder::Ordered => out.extend_from_slice(&number.to_be_bytes()),
                }
                // Filler after the distinguishing bytes, so that long keys do not share long runs of equal bytes.
                let mut state = mix64(number ^ 0x243F_6A88_85A3_08D3);
                while out.len() < self.size {
                    state = state.wrapping_add(GOLDEN_GAMMA);
                    let word = mix64(state).to_le_bytes();
                    let take = (self.size - out.len()).min(word.len());
                    out.extend_from_slice(&word[..take]);
                }
            }
            KeyStyle::User => {
                let mut digits = [0u8; MAX_DIGITS];
                let mut n = number;
                let mut start = MAX_DIGITS;
                loop {
                    start -= 1;
                    digits[start] = b'0' + (n % 10) as u8;
                    n /= 10;
                    if n == 0 {
                        break;
                    }
                }
                let width = self.size - USER_PREFIX.len();
                let len = MAX_DIGITS - start;
                if len > width {
                    return Err(YcsbError::KeyTooShort {
                        id,
                        size: self.size,
                        needed: USER_PREFIX.len() + len,
                    });
                }
                out.reserve(self.size);
                out.extend_from_slice(USER_PREFIX);
                out.resize(self.size - len, b'0');
                out.extend_from_slice(&digits[start..]);
            }
        }
        Ok(())
    }
}

/// Writes the [`KeyFormat::default`]-style key of record `n` with `key_size` bytes into `out`: the 8 little-endian
/// bytes of a bijective hash of `n`, then filler derived from `n`. Fails unless
/// `8 ≤ key_size ≤` [`MAX_KEY_SIZE`].
pub fn key_bytes(n: u64, key_size: usize, out: &mut Vec<u8>) -> Result<(), YcsbError> {
    KeyFormat {
        size: key_size,
        ..KeyFormat::default()
    }
    .write(n, out)
}

/// Why [`verify_value`] refused a value.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum VerifyError {
    /// The value is shorter than [`MIN_VALUE_SIZE`] or longer than [`MAX_VALUE_SIZE`].
    #[error(
        "a value of {len} bytes cannot be one of the workload's (expected {MIN_VALUE_SIZE} to {MAX_VALUE_SIZE})"
    )]
    BadLength {
        /// The value's length.
        len: usize,
    },
    /// The value was written for another record.
    #[error("the value belongs to record {found}, not {expected}")]
    WrongKey {
        /// The record read.
        expected: u64,
        /// The record the value names.
        found: u64,
    },
    /// A byte differs from what the record, version and length determine.
    #[error("the value of record {key_id} (version {version}) is corrupt from byte {offset}")]
    Corrupt {
        /// The record.
        key_id: u64,
        /// The version the value names.
        version: u64,
        /// The first differing byte.
        offset: usize,
    },
}

/// The seed of a value's filler: depends on the record, the version and the length, so that a value cut short or
/// moved to another record or version does not verify.
fn filler_seed(key_id: u64, version: u64, len: usize) -> u64 {
    mix64(key_id ^ mix64(version ^ mix64(len as u64 ^ 0x1319_8A2E_0370_7344)))
}

/// The filler words of a value, eight bytes at a time.
fn filler(key_id: u64, version: u64, len: usize) -> impl Iterator<Item = u64> {
    let mut state = filler_seed(key_id, version, len);
    std::iter::repeat_with(move || {
        state = state.wrapping_add(GOLDEN_GAMMA);
        mix64(state)
    })
}

/// Writes the value of record `key_id` at `version` with `value_size` bytes into `out` (cleared first; its capacity
/// is reused): the key id (8 bytes, little-endian), the version (8 bytes, little-endian), then filler derived from
/// the id, the version and the size. Fails unless [`MIN_VALUE_SIZE`] `≤ value_size ≤` [`MAX_VALUE_SIZE`].
pub fn fill_value(
    key_id: u64,
    version: u64,
    value_size: usize,
    out: &mut Vec<u8>,
) -> Result<(), YcsbError> {
    if !(MIN_VALUE_SIZE..=MAX_VALUE_SIZE).contains(&value_size) {
        return Err(YcsbError::ValueSize {
            size: value_size,
            min: MIN_VALUE_SIZE,
            max: MAX_VALUE_SIZE,
        });
    }
    out.clear();
    out.resize(value_size, 0);
    out[..8].copy_from_slice(&key_id.to_le_bytes());
    out[8..MIN_VALUE_SIZE].copy_from_slice(&version.to_le_bytes());
    let mut words = filler(key_id, version, value_size);
    let mut chunks = out[MIN_VALUE_SIZE..].chunks_exact_mut(8);
    for (chunk, word) in (&mut chunks).zip(&mut words) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    let tail = chunks.into_remainder();
    if let Some(word) = words.next() {
        let len = tail.len();
        tail.copy_from_slice(&word.to_le_bytes()[..len]);
    }
    Ok(())
}

/// Checks that `bytes` is a value [`fill_value`] wrote for record `key_id`, and returns its version.
pub fn verify_value(key_id: u64, bytes: &[u8]) -> Result<u64, VerifyError> {
    let len = bytes.len();
    if !(MIN_VALUE_SIZE..=MAX_VALUE_SIZE).contains(&len) {
        return Err(VerifyError::BadLength { len });
    }
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(w)
    };
    let found = word(0);
    if found != key_id {
        return Err(VerifyError::WrongKey {
            expected: key_id,
            found,
        });
    }
    let version = word(8);
    let mut words = filler(key_id, version, len);
    let mut chunks = bytes[MIN_VALUE_SIZE..].chunks_exact(8);
    let corrupt = |at: usize, got: &[u8], expected: u64| {
        let within = got
            .iter()
            .zip(expected.to_le_bytes())
            .position(|(a, b)| *a != b)
            .unwrap_or(0);
        VerifyError::Corrupt {
            key_id,
            version,
            offset: at + within,
        }
    };
    let mut at = MIN_VALUE_SIZE;
    for (chunk, expected) in (&mut chunks).zip(&mut words) {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        if u64::from_le_bytes(w) != expected {
            return Err(corrupt(at, chunk, expected));
        }
        at += 8;
    }
    let tail = chunks.remainder();
    if let Some(expected) = words.next() {
        if tail != &expected.to_le_bytes()[..tail.len()] {
            return Err(corrupt(at, tail, expected));
        }
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn default_keys_are_8_distinct_bytes() {
        let mut key = Vec::new();
        let mut seen = HashSet::new();
        for id in 0..100_000u64 {
            key_bytes(id, DEFAULT_KEY_SIZE, &mut key).unwrap();
            assert_eq!(key.len(), 8);
            assert_eq!(u64::from_le_bytes(key[..8].try_into().unwrap()), mix64(id));
            assert!(seen.insert(key.clone()), "id {id} repeats a key");
        }
        // Deterministic, and hashed: neighbours share no leading byte pattern.
        let mut again = Vec::new();
        key_bytes(77, 8, &mut again).unwrap();
        key_bytes(77, 8, &mut key).unwrap();
        assert_eq!(key, again);
        key_bytes(78, 8, &mut again).unwrap();
        assert_ne!(key[..4], again[..4]);
    }

    #[test]
    fn long_keys_are_padded_deterministically() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for size in [9usize, 16, 17, 100, 1024] {
            key_bytes(5, size, &mut a).unwrap();
            key_bytes(5, size, &mut b).unwrap();
            assert_eq!(a.len(), size);
            assert_eq!(a, b);
            key_bytes(6, size, &mut b).unwrap();
            assert_ne!(a[8..], b[8..], "filler depends on the id");
        }
        // A longer key extends the shorter one.
        key_bytes(5, 16, &mut a).unwrap();
        key_bytes(5, 100, &mut b).unwrap();
        assert_eq!(a[..], b[..16]);
    }

    #[test]
    fn ordered_keys_sort_as_their_ids() {
        let format = KeyFormat {
            size: 12,
            order: KeyOrder::Ordered,
            style: KeyStyle::Binary,
        };
        let mut keys = Vec::new();
        for id in [0u64, 1, 255, 256, 65_536, u64::MAX / 3, u64::MAX] {
            let mut k = Vec::new();
            format.write(id, &mut k).unwrap();
            assert_eq!(k[..8], id.to_be_bytes());
            keys.push(k);
        }
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn user_keys_look_like_ycsbs() {
        let mut k = Vec::new();
        let ordered = KeyFormat {
            size: 12,
            order: KeyOrder::Ordered,
            style: KeyStyle::User,
        };
        ordered.write(42, &mut k).unwrap();
        assert_eq!(k, b"user00000042");
        ordered.write(12_345_678, &mut k).unwrap();
        assert_eq!(k, b"user12345678");
        assert!(matches!(
            ordered.write(123_456_789, &mut k),
            Err(YcsbError::KeyTooShort { needed: 13, .. })
        ));
        let hashed = KeyFormat {
            size: 24,
            order: KeyOrder::Hashed,
            style: KeyStyle::User,
        };
        hashed.write(0, &mut k).unwrap();
        assert_eq!(k.len(), 24);
        let text = std::str::from_utf8(&k).unwrap();
        assert_eq!(text[4..].parse::<u64>().unwrap(), mix64(0));
        // 24 bytes hold every number.
        hashed.write(u64::MAX, &mut k).unwrap();
        assert_eq!(k.len(), 24);
    }

    #[test]
    fn bad_key_sizes_are_refused() {
        let mut k = Vec::new();
        for size in [0usize, 1, 7, MAX_KEY_SIZE + 1, usize::MAX] {
            assert!(key_bytes(1, size, &mut k).is_err(), "{size}");
        }
        let user = KeyFormat {
            size: 4,
            order: KeyOrder::Ordered,
            style: KeyStyle::User,
        };
        assert!(user.write(1, &mut k).is_err());
        assert!(key_bytes(1, MAX_KEY_SIZE, &mut k).is_ok());
    }

    #[test]
    fn values_round_trip() {
        let mut v = Vec::new();
        for size in [16usize, 17, 23, 24, 100, 1024] {
            for (key_id, version) in [(0u64, 0u64), (1, 1), (u64::MAX, 7), (12_345, u64::MAX)] {
                fill_value(key_id, version, size, &mut v).unwrap();
                assert_eq!(v.len(), size);
                assert_eq!(verify_value(key_id, &v), Ok(version));
                let mut again = Vec::new();
                fill_value(key_id, version, size, &mut again).unwrap();
                assert_eq!(v, again);
            }
        }
    }

    #[test]
    fn every_corrupt_byte_is_caught() {
        let mut v = Vec::new();
        fill_value(99, 3, 100, &mut v).unwrap();
        for at in 0..v.len() {
            for flip in [1u8, 0x80, 0xff] {
                let mut bad = v.clone();
                bad[at] ^= flip;
                let err = verify_value(99, &bad).unwrap_err();
                if at >= MIN_VALUE_SIZE {
                    assert_eq!(
                        err,
                        VerifyError::Corrupt {
                            key_id: 99,
                            version: 3,
                            offset: at
                        }
                    );
                } else if at < 8 {
                    assert!(
                        matches!(err, VerifyError::WrongKey { expected: 99, .. }),
                        "{err}"
                    );
                } else {
                    // A changed version changes the filler it implies.
                    assert!(
                        matches!(err, VerifyError::Corrupt { key_id: 99, .. }),
                        "{err}"
                    );
                }
            }
        }
    }

    #[test]
    fn values_of_other_records_versions_or_lengths_fail() {
        let mut v = Vec::new();
        fill_value(5, 1, 64, &mut v).unwrap();
        assert_eq!(
            verify_value(6, &v),
            Err(VerifyError::WrongKey {
                expected: 6,
                found: 5
            })
        );
        // Cut short (but still long enough to name key and version): the filler is the length's.
        assert!(matches!(
            verify_value(5, &v[..40]),
            Err(VerifyError::Corrupt { .. })
        ));
        assert_eq!(
            verify_value(5, &v[..15]),
            Err(VerifyError::BadLength { len: 15 })
        );
        // Another version's filler under this version's header.
        let mut w = Vec::new();
        fill_value(5, 2, 64, &mut w).unwrap();
        w[8..16].copy_from_slice(&1u64.to_le_bytes());
        assert!(matches!(
            verify_value(5, &w),
            Err(VerifyError::Corrupt { offset: 16, .. })
        ));
        for size in [0usize, 15, MAX_VALUE_SIZE + 1] {
            assert!(fill_value(1, 1, size, &mut v).is_err(), "{size}");
        }
    }
}
