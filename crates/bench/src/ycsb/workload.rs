//! YCSB's operation mixes: the core workloads A, B, C, D and F, the write-heavy insert mix W, insert-only, and
//! custom mixes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::YcsbError;
use super::distribution::Distribution;

/// What one operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OpKind {
    /// Read the record.
    Read,
    /// Overwrite the record with a new value.
    Update,
    /// Insert a new record under the next unused key id.
    Insert,
    /// Read the record, then overwrite it (YCSB's read-modify-write, one operation of workload F).
    ReadModifyWrite,
}

impl OpKind {
    /// Every kind, in the order a [`Mix`] lists them.
    pub const ALL: [OpKind; 4] = [
        OpKind::Read,
        OpKind::Update,
        OpKind::Insert,
        OpKind::ReadModifyWrite,
    ];

    /// "read", "update", "insert" or "rmw".
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Read => "read",
            OpKind::Update => "update",
            OpKind::Insert => "insert",
            OpKind::ReadModifyWrite => "rmw",
        }
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One generated operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Operation {
    /// What to do.
    pub kind: OpKind,
    /// The record it targets: an existing record for reads, updates and read-modify-writes, a new one for inserts.
    /// Turn it into key bytes with [`super::key_bytes`] or a [`super::KeyFormat`].
    pub key_id: u64,
}

/// The proportions of the operation kinds (YCSB's `readproportion`, `updateproportion`, `insertproportion` and
/// `readmodifywriteproportion`). Like YCSB, the weights need not sum to 1: each kind is drawn with its weight over
/// their sum. Scans (`scanproportion`, workload E) are not offered: the store has no range queries.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Mix {
    /// Weight of reads.
    pub read: f64,
    /// Weight of updates.
    pub update: f64,
    /// Weight of inserts.
    pub insert: f64,
    /// Weight of read-modify-writes.
    pub read_modify_write: f64,
}

impl Mix {
    /// A mix of the given weights, checked with [`Mix::validate`].
    pub fn new(
        read: f64,
        update: f64,
        insert: f64,
        read_modify_write: f64,
    ) -> Result<Mix, YcsbError> {
        let mix = Mix {
            read,
            update,
            insert,
            read_modify_write,
        };
        mix.validate()?;
        Ok(mix)
    }

    /// Checks that every weight is finite and not negative, and that some weight is positive.
    pub fn validate(&self) -> Result<(), YcsbError> {
        for kind in OpKind::ALL {
            let w = self.weight(kind);
            if !w.is_finite() || w < 0.0 {
                return Err(YcsbError::BadMix(format!(
                    "the {kind} weight must be a finite number ≥ 0 (got {w})"
                )));
            }
        }
        let total = self.total();
        if total <= 0.0 {
            return Err(YcsbError::BadMix("every weight is 0".to_string()));
        }
        if !total.is_finite() {
            return Err(YcsbError::BadMix(
                "the weights add up past f64::MAX".to_string(),
            ));
        }
        Ok(())
    }

    /// The weight of `kind`.
    pub fn weight(&self, kind: OpKind) -> f64 {
        match kind {
            OpKind::Read => self.read,
            OpKind::Update => self.update,
            OpKind::Insert => self.insert,
            OpKind::ReadModifyWrite => self.read_modify_write,
        }
    }

    /// The sum of the weights.
    pub fn total(&self) -> f64 {
        OpKind::ALL.iter().map(|&k| self.weight(k)).sum()
    }

    /// The fraction of operations of `kind`: its weight over the sum (0 for an invalid mix).
    pub fn fraction(&self, kind: OpKind) -> f64 {
        let total = self.total();
        if total > 0.0 && total.is_finite() {
            self.weight(kind) / total
        } else {
            0.0
        }
    }

    /// Whether some operation targets an existing record (so the store must hold one before the first).
    pub fn needs_records(&self) -> bool {
        self.read > 0.0 || self.update > 0.0 || self.read_modify_write > 0.0
    }
}

impl fmt::Display for Mix {
    /// "read=0.5,update=0.5", listing the kinds of positive weight (or "read=0" for a mix without any).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for kind in OpKind::ALL {
            let w = self.weight(kind);
            if w != 0.0 {
                write!(f, "{}{kind}={w}", if first { "" } else { "," })?;
                first = false;
            }
        }
        if first {
            f.write_str("read=0")?;
        }
        Ok(())
    }
}

impl FromStr for Mix {
    type Err = YcsbError;

    /// Parses comma-separated `kind=weight` pairs, kinds being "read", "update", "insert" and "rmw" (also
    /// "read-modify-write" and "readmodifywrite"); kinds left out weigh 0. Example: "read=0.9,update=0.05,insert=0.05".
    fn from_str(s: &str) -> Result<Mix, YcsbError> {
        let mut mix = Mix::default();
        let mut seen = [false; 4];
        for pair in s.split(',') {
            let (kind, weight) = pair
                .split_once('=')
                .ok_or_else(|| YcsbError::BadMix(format!("expected kind=weight, got {pair:?}")))?;
            let index = match kind.trim().to_ascii_lowercase().as_str() {
                "read" => 0,
                "update" => 1,
                "insert" => 2,
                "rmw" | "read-modify-write" | "readmodifywrite" => 3,
                other => {
                    return Err(YcsbError::BadMix(format!(
                        "unknown operation {other:?} (expected read, update, insert or rmw)"
                    )));
                }
            };
            if std::mem::replace(&mut seen[index], true) {
                return Err(YcsbError::BadMix(format!("{kind:?} given twice")));
            }
            let weight: f64 = weight
                .trim()
                .parse()
                .map_err(|_| YcsbError::BadMix(format!("bad weight {weight:?} for {kind}")))?;
            match index {
                0 => mix.read = weight,
                1 => mix.update = weight,
                2 => mix.insert = weight,
                _ => mix.read_modify_write = weight,
            }
        }
        mix.validate()?;
        Ok(mix)
    }
}

/// A YCSB workload: its operation mix, and the request distribution YCSB's workload file gives it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Workload {
    /// Update heavy: 50% reads, 50% updates (YCSB workload A).
    A,
    /// Read mostly: 95% reads, 5% updates (workload B).
    B,
    /// Read only: 100% reads (workload C).
    C,
    /// Read latest: 95% reads, 5% inserts, reads skewed towards the newest records (workload D).
    D,
    /// Read-modify-write: 50% reads, 50% read-modify-writes (workload F).
    F,
    /// Write heavy with inserts: 50% reads, 50% inserts (the DINOMO paper's write-heavy insert mix).
    W,
    /// Inserts only (a load phase as a workload).
    InsertOnly,
    /// Any mix of the four kinds.
    Custom(Mix),
}

impl Workload {
    /// The presets, in the order of their names.
    pub const PRESETS: [Workload; 7] = [
        Workload::A,
        Workload::B,
        Workload::C,
        Workload::D,
        Workload::F,
        Workload::W,
        Workload::InsertOnly,
    ];

    /// The operation mix.
    pub fn mix(&self) -> Mix {
        let m = |read, update, insert, read_modify_write| Mix {
            read,
            update,
            insert,
            read_modify_write,
        };
        match *self {
            Workload::A => m(0.5, 0.5, 0.0, 0.0),
            Workload::B => m(0.95, 0.05, 0.0, 0.0),
            Workload::C => m(1.0, 0.0, 0.0, 0.0),
            Workload::D => m(0.95, 0.0, 0.05, 0.0),
            Workload::F => m(0.5, 0.0, 0.0, 0.5),
            Workload::W => m(0.5, 0.0, 0.5, 0.0),
            Workload::InsertOnly => m(0.0, 0.0, 1.0, 0.0),
            Workload::Custom(mix) => mix,
        }
    }

    /// The request distribution YCSB uses for this workload: `requestdistribution=latest` for D, and
    /// `requestdistribution=zipfian` for the others — which YCSB's `CoreWorkload` implements as a
    /// [`Distribution::ScrambledZipfian`] of θ = 0.99, not as a plain Zipfian. A custom mix gets `CoreWorkload`'s
    /// default, uniform. Insert-only draws no existing key; it reports the Zipfian default like the others.
    pub fn default_distribution(&self) -> Distribution {
        match self {
            Workload::D => Distribution::Latest,
            Workload::Custom(_) => Distribution::Uniform,
            _ => Distribution::ScrambledZipfian {
                theta: super::zipf::YCSB_ZIPFIAN_CONSTANT,
            },
        }
    }
}

impl fmt::Display for Workload {
    /// "a", "b", "c", "d", "f", "w", "insert-only", or a custom mix as [`Mix`] prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Workload::A => f.write_str("a"),
            Workload::B => f.write_str("b"),
            Workload::C => f.write_str("c"),
            Workload::D => f.write_str("d"),
            Workload::F => f.write_str("f"),
            Workload::W => f.write_str("w"),
            Workload::InsertOnly => f.write_str("insert-only"),
            Workload::Custom(mix) => mix.fmt(f),
        }
    }
}

impl FromStr for Workload {
    type Err = YcsbError;

    /// Parses "a", "b", "c", "d", "f", "w" (also "workloada" and so on) or "insert-only" (also "insertonly",
    /// "insert_only"), ignoring case; anything containing '=' is read as a custom [`Mix`].
    fn from_str(s: &str) -> Result<Workload, YcsbError> {
        if s.contains('=') {
            return s.parse().map(Workload::Custom);
        }
        let lower = s.trim().to_ascii_lowercase();
        let name = lower.strip_prefix("workload").unwrap_or(&lower);
        Ok(match name {
            "a" => Workload::A,
            "b" => Workload::B,
            "c" => Workload::C,
            "d" => Workload::D,
            "f" => Workload::F,
            "w" => Workload::W,
            "insert-only" | "insertonly" | "insert_only" => Workload::InsertOnly,
            _ => {
                return Err(YcsbError::UnknownWorkload(format!(
                    "{s:?} (expected a, b, c, d, f, w, insert-only, or a mix such as read=0.9,insert=0.1)"
                )));
            }
        })
    }
}

impl TryFrom<String> for Workload {
    type Error = YcsbError;

    fn try_from(s: String) -> Result<Workload, YcsbError> {
        s.parse()
    }
}

impl From<Workload> for String {
    fn from(w: Workload) -> String {
        w.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_ycsbs_mixes() {
        let fractions = |w: Workload| OpKind::ALL.map(|k| w.mix().fraction(k));
        assert_eq!(fractions(Workload::A), [0.5, 0.5, 0.0, 0.0]);
        assert_eq!(fractions(Workload::B), [0.95, 0.05, 0.0, 0.0]);
        assert_eq!(fractions(Workload::C), [1.0, 0.0, 0.0, 0.0]);
        assert_eq!(fractions(Workload::D), [0.95, 0.0, 0.05, 0.0]);
        assert_eq!(fractions(Workload::F), [0.5, 0.0, 0.0, 0.5]);
        assert_eq!(fractions(Workload::W), [0.5, 0.0, 0.5, 0.0]);
        assert_eq!(fractions(Workload::InsertOnly), [0.0, 0.0, 1.0, 0.0]);
        assert_eq!(Workload::D.default_distribution(), Distribution::Latest);
        assert_eq!(
            Workload::A.default_distribution(),
            Distribution::ScrambledZipfian { theta: 0.99 }
        );
        assert!(!Workload::InsertOnly.mix().needs_records());
        assert!(Workload::W.mix().needs_records());
    }

    #[test]
    fn names_parse_and_print() {
        for w in Workload::PRESETS {
            assert_eq!(w.to_string().parse::<Workload>().unwrap(), w);
        }
        assert_eq!("WorkloadA".parse::<Workload>().unwrap(), Workload::A);
        assert_eq!(
            "insertonly".parse::<Workload>().unwrap(),
            Workload::InsertOnly
        );
        let custom: Workload = "read=0.9, update=0.05,rmw=0.05".parse().unwrap();
        let Workload::Custom(mix) = custom else {
            panic!("{custom:?}")
        };
        assert_eq!(
            (mix.read, mix.update, mix.insert, mix.read_modify_write),
            (0.9, 0.05, 0.0, 0.05)
        );
        assert_eq!(custom.to_string(), "read=0.9,update=0.05,rmw=0.05");
        assert_eq!(custom.to_string().parse::<Workload>().unwrap(), custom);
        assert_eq!(custom.default_distribution(), Distribution::Uniform);
        let json = serde_json::to_string(&Workload::InsertOnly).unwrap();
        assert_eq!(json, "\"insert-only\"");
        assert_eq!(
            serde_json::from_str::<Workload>(&json).unwrap(),
            Workload::InsertOnly
        );
        assert!(serde_json::from_str::<Workload>("\"e\"").is_err());
    }

    #[test]
    fn bad_mixes_are_refused() {
        for bad in [
            "e",
            "",
            "read=",
            "read=x",
            "read=-1",
            "read=inf",
            "read=NaN",
            "read=0,update=0",
            "scan=1",
            "read=1,read=1",
            "read",
        ] {
            assert!(bad.parse::<Workload>().is_err(), "{bad:?}");
        }
        assert!(Mix::new(0.5, -0.1, 0.0, 0.0).is_err());
        assert!(Mix::new(0.0, 0.0, 0.0, 0.0).is_err());
        assert!(Mix::new(f64::MAX, f64::MAX, 0.0, 0.0).is_err());
        assert!(Mix::new(1.0, 1.0, 0.0, 0.0).is_ok());
    }
}
