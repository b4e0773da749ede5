//! Cache policies and their textual names.

use std::fmt;
use std::str::FromStr;

/// How a [`Dac`](crate::Dac) divides its byte budget between values and shortcuts.
///
/// The textual form (see [`FromStr`] and [`fmt::Display`]) is `dac` (also accepted:
/// `adaptive`), `static-<percent>` with a percent in `0..=100`, `value-only` and
/// `shortcut-only`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Disaggregated Adaptive Caching: values and shortcuts share the whole budget and the
    /// split follows the workload (Table 3 and equation (1) of the DINOMO paper).
    #[default]
    Adaptive,
    /// A fixed share of the budget (`value_percent`, clamped to 100) holds values, the rest
    /// holds shortcuts; both shares evict least-recently-used entries, and a value evicted
    /// from the value share is demoted into the shortcut share.
    Static {
        /// Percentage of the budget reserved for values.
        value_percent: u8,
    },
    /// Values only: the same as `Static { value_percent: 100 }`.
    ValueOnly,
    /// Shortcuts only: the same as `Static { value_percent: 0 }`.
    ShortcutOnly,
}

impl Policy {
    /// The share of the budget reserved for values, in percent, or `None` for
    /// [`Policy::Adaptive`], whose split is not fixed.
    pub fn value_percent(self) -> Option<u8> {
        match self {
            Policy::Adaptive => None,
            Policy::Static { value_percent } => Some(value_percent.min(100)),
            Policy::ValueOnly => Some(100),
            Policy::ShortcutOnly => Some(0),
        }
    }
}

/// The error returned when a string names no [`Policy`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown cache policy {0:?}: expected dac, adaptive, static-<0..=100>, value-only or shortcut-only"
)]
pub struct ParsePolicyError(pub String);

impl FromStr for Policy {
    type Err = ParsePolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "dac" | "adaptive" => Ok(Policy::Adaptive),
            "value-only" => Ok(Policy::ValueOnly),
            "shortcut-only" => Ok(Policy::ShortcutOnly),
            _ => s
                .strip_prefix("static-")
                .filter(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|digits| digits.parse::<u8>().ok())
                .filter(|&value_percent| value_percent <= 100)
                .map(|value_percent| Policy::Static { value_percent })
                .ok_or_else(|| ParsePolicyError(s.to_owned())),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Adaptive => f.write_str("dac"),
            Policy::Static { value_percent } => write!(f, "static-{value_percent}"),
            Policy::ValueOnly => f.write_str("value-only"),
            Policy::ShortcutOnly => f.write_str("shortcut-only"),
        }
    }
}

/// In configuration files a policy is its textual name.
impl serde::Serialize for Policy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Policy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_round_trip() {
        let mut all = vec![Policy::Adaptive, Policy::ValueOnly, Policy::ShortcutOnly];
        all.extend((0..=100).map(|value_percent| Policy::Static { value_percent }));
        for policy in all {
            let text = policy.to_string();
            assert_eq!(text.parse::<Policy>(), Ok(policy), "{text}");
        }
        assert_eq!("adaptive".parse::<Policy>(), Ok(Policy::Adaptive));
        assert_eq!(Policy::Adaptive.to_string(), "dac");
        assert_eq!(
            "static-25".parse::<Policy>(),
            Ok(Policy::Static { value_percent: 25 })
        );
    }

    #[test]
    fn bad_policy_names_are_rejected() {
        for bad in [
            "",
            "DAC",
            "static",
            "static-",
            "static-101",
            "static-256",
            "static--1",
            "static-+5",
            "static-2x",
            " dac",
            "value_only",
            "lru",
        ] {
            let err = bad.parse::<Policy>().unwrap_err();
            assert_eq!(err, ParsePolicyError(bad.to_owned()));
            assert!(err.to_string().contains("static-<0..=100>"));
        }
    }

    #[test]
    fn value_percent_of_each_policy() {
        assert_eq!(Policy::Adaptive.value_percent(), None);
        assert_eq!(Policy::ValueOnly.value_percent(), Some(100));
        assert_eq!(Policy::ShortcutOnly.value_percent(), Some(0));
        assert_eq!(
            Policy::Static { value_percent: 25 }.value_percent(),
            Some(25)
        );
        assert_eq!(
            Policy::Static { value_percent: 250 }.value_percent(),
            Some(100)
        );
    }
}
