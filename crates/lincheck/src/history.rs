//! Operations, outcomes, events and histories, their well-formedness rules and their JSON form.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::bytes::{self, Shown};

/// One operation on the key-value map. Keys and values are arbitrary bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Op {
    /// Read a key; answered by [`Outcome::Value`].
    Get(#[serde(with = "bytes::plain")] Vec<u8>),
    /// Write a key whether or not it exists (upsert); answered by [`Outcome::Ok`].
    Set(
        #[serde(with = "bytes::plain")] Vec<u8>,
        #[serde(with = "bytes::plain")] Vec<u8>,
    ),
    /// Write a key only if it is absent; answered by [`Outcome::Applied`].
    Insert(
        #[serde(with = "bytes::plain")] Vec<u8>,
        #[serde(with = "bytes::plain")] Vec<u8>,
    ),
    /// Write a key only if it is present; answered by [`Outcome::Applied`].
    Update(
        #[serde(with = "bytes::plain")] Vec<u8>,
        #[serde(with = "bytes::plain")] Vec<u8>,
    ),
    /// Remove a key; answered by [`Outcome::Applied`] (whether it existed).
    Delete(#[serde(with = "bytes::plain")] Vec<u8>),
    /// Add `delta` to the key's value read as a decimal integer (absent reads as 0) and write the sum back as
    /// decimal ASCII; answered by [`Outcome::Int`] (the sum), or [`Outcome::Error`] when the stored value is not a
    /// decimal integer or the sum overflows `i64` (then nothing changes).
    Incr(#[serde(with = "bytes::plain")] Vec<u8>, i64),
    /// Remove a key and read the value it had (`GETDEL`); answered by [`Outcome::Value`] (`None` when the key was
    /// absent, and then nothing changes).
    Take(#[serde(with = "bytes::plain")] Vec<u8>),
}

impl Op {
    /// The key the operation acts on.
    pub fn key(&self) -> &[u8] {
        match self {
            Op::Get(k)
            | Op::Set(k, _)
            | Op::Insert(k, _)
            | Op::Update(k, _)
            | Op::Delete(k)
            | Op::Take(k)
            | Op::Incr(k, _) => k,
        }
    }

    /// Whether the operation only reads (an unknown-outcome read constrains nothing).
    pub fn is_read(&self) -> bool {
        matches!(self, Op::Get(_))
    }

    /// The operation's lower-case name (`get`, `set`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Get(_) => "get",
            Op::Set(..) => "set",
            Op::Insert(..) => "insert",
            Op::Update(..) => "update",
            Op::Delete(_) => "delete",
            Op::Incr(..) => "incr",
            Op::Take(_) => "getdel",
        }
    }

    /// Whether `outcome` is a response this operation can give ([`Outcome::Unknown`] fits every operation).
    pub fn accepts(&self, outcome: &Outcome) -> bool {
        matches!(
            (self, outcome),
            (_, Outcome::Unknown)
                | (Op::Get(_) | Op::Take(_), Outcome::Value(_))
                | (Op::Set(..), Outcome::Ok)
                | (
                    Op::Insert(..) | Op::Update(..) | Op::Delete(_),
                    Outcome::Applied(_)
                )
                | (Op::Incr(..), Outcome::Int(_) | Outcome::Error)
        )
    }

    /// The operation without its key, for reports that already name the key (`set "v"`, `incr -2`).
    pub(crate) fn without_key(&self, max_bytes: usize) -> String {
        match self {
            Op::Get(_) | Op::Delete(_) | Op::Take(_) => self.name().to_owned(),
            Op::Set(_, v) | Op::Insert(_, v) | Op::Update(_, v) => {
                format!("{} {}", self.name(), Shown(v, max_bytes))
            }
            Op::Incr(_, d) => format!("incr {d}"),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let max = bytes::DISPLAY_MAX;
        match self {
            Op::Get(k) | Op::Delete(k) | Op::Take(k) => {
                write!(f, "{} {}", self.name(), Shown(k, max))
            }
            Op::Set(k, v) | Op::Insert(k, v) | Op::Update(k, v) => {
                write!(f, "{} {} {}", self.name(), Shown(k, max), Shown(v, max))
            }
            Op::Incr(k, d) => write!(f, "incr {} {d}", Shown(k, max)),
        }
    }
}

/// The response an operation got, or [`Outcome::Unknown`] when none came back.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Outcome {
    /// A [`Op::Get`]'s or [`Op::Take`]'s result: the value, or `None` when the key was absent.
    Value(#[serde(with = "bytes::option")] Option<Vec<u8>>),
    /// A [`Op::Set`] succeeded.
    Ok,
    /// Whether an [`Op::Insert`], [`Op::Update`] or [`Op::Delete`] changed the map.
    Applied(bool),
    /// An [`Op::Incr`]'s result: the new value.
    Int(i64),
    /// An [`Op::Incr`] found a value that is not a decimal integer (or the sum overflowed) and changed nothing.
    Error,
    /// No response: the client timed out, the connection dropped or the node died. The operation may have taken
    /// effect at any time after its invocation, or never.
    Unknown,
}

impl Outcome {
    /// Whether this is [`Outcome::Unknown`].
    pub fn is_unknown(&self) -> bool {
        matches!(self, Outcome::Unknown)
    }

    pub(crate) fn shown(&self, max_bytes: usize) -> String {
        match self {
            Outcome::Value(Some(v)) => Shown(v, max_bytes).to_string(),
            Outcome::Value(None) => "nil".to_owned(),
            Outcome::Ok => "ok".to_owned(),
            Outcome::Applied(b) => b.to_string(),
            Outcome::Int(n) => n.to_string(),
            Outcome::Error => "error".to_owned(),
            Outcome::Unknown => "unknown".to_owned(),
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown(bytes::DISPLAY_MAX))
    }
}

/// One operation as a client saw it: when it was invoked, when (and with what) it returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The client that issued it (a label; one client may have several operations outstanding).
    pub client: u32,
    /// The operation.
    pub op: Op,
    /// Invocation time in nanoseconds since a start shared by all clients of the history.
    pub invoked: u64,
    /// Response time on the same clock, `None` when the outcome is unknown.
    pub returned: Option<u64>,
    /// The response; [`Outcome::Unknown`] exactly when `returned` is `None`.
    pub outcome: Outcome,
}

/// A malformed history or a history file that cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// An event's response time is earlier than its invocation time.
    #[error(
        "event #{index} (client {client}): returned at {returned} ns, before its invocation at {invoked} ns"
    )]
    ResponseBeforeInvocation {
        /// Index of the event in [`History::events`].
        index: usize,
        /// The event's client.
        client: u32,
        /// Its invocation time.
        invoked: u64,
        /// Its response time.
        returned: u64,
    },
    /// An event's outcome is of a kind its operation cannot return (a `get` answered `ok`, ...).
    #[error("event #{index} (client {client}): {op} cannot return {outcome}")]
    WrongOutcome {
        /// Index of the event in [`History::events`].
        index: usize,
        /// The event's client.
        client: u32,
        /// The operation, as text.
        op: String,
        /// The outcome, as text.
        outcome: String,
    },
    /// An event has a response time but an unknown outcome.
    #[error("event #{index} (client {client}): has a response time but an unknown outcome")]
    ReturnedWithoutOutcome {
        /// Index of the event in [`History::events`].
        index: usize,
        /// The event's client.
        client: u32,
    },
    /// An event has a known outcome but no response time.
    #[error("event #{index} (client {client}): outcome {outcome} has no response time")]
    OutcomeWithoutReturn {
        /// Index of the event in [`History::events`].
        index: usize,
        /// The event's client.
        client: u32,
        /// The outcome, as text.
        outcome: String,
    },
    /// The history's JSON form is malformed.
    #[error("history JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A history file cannot be read or written.
    #[error("history file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// A recorded history: events in any order plus the keys' initial values (every other key starts absent).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    #[serde(default, with = "bytes::pairs")]
    initial: BTreeMap<Vec<u8>, Vec<u8>>,
    events: Vec<Event>,
}

impl History {
    /// A history of `events` in which every key starts absent.
    pub fn new(events: Vec<Event>) -> Self {
        Self {
            initial: BTreeMap::new(),
            events,
        }
    }

    /// The same history with `key` starting at `value` (replacing an earlier initial value of `key`).
    #[must_use]
    pub fn with_initial(mut self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        self.initial.insert(key.into(), value.into());
        self
    }

    /// The events, in recording order.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// The keys' initial values (keys not listed start absent).
    pub fn initial(&self) -> &BTreeMap<Vec<u8>, Vec<u8>> {
        &self.initial
    }

    /// The initial value of `key`, `None` when it starts absent.
    pub fn initial_value(&self, key: &[u8]) -> Option<&[u8]> {
        self.initial.get(key).map(Vec::as_slice)
    }

    /// Appends one event.
    pub fn push(&mut self, event: Event) {
        self.events.push(event);
    }

    /// The number of events.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether there are no events.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Checks that every event is well formed: it returns no earlier than it was invoked, its outcome is of a kind
    /// its operation can return, and it has a response time exactly when its outcome is known.
    pub fn validate(&self) -> Result<(), HistoryError> {
        for (index, e) in self.events.iter().enumerate() {
            let client = e.client;
            if !e.op.accepts(&e.outcome) {
                return Err(HistoryError::WrongOutcome {
                    index,
                    client,
                    op: e.op.to_string(),
                    outcome: e.outcome.to_string(),
                });
            }
            match (e.returned, e.outcome.is_unknown()) {
                (Some(returned), false) if returned < e.invoked => {
                    return Err(HistoryError::ResponseBeforeInvocation {
                        index,
                        client,
                        invoked: e.invoked,
                        returned,
                    });
                }
                (Some(_), true) => {
                    return Err(HistoryError::ReturnedWithoutOutcome { index, client });
                }
                (None, false) => {
                    return Err(HistoryError::OutcomeWithoutReturn {
                        index,
                        client,
                        outcome: e.outcome.to_string(),
                    });
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The history as pretty-printed JSON. Byte strings that are valid UTF-8 appear as JSON strings, others as
    /// arrays of numbers; [`History::from_json`] reads both.
    pub fn to_json(&self) -> Result<String, HistoryError> {
        Ok(serde_json::to_string_pretty(self)?)
    }

    /// Reads a history written by [`History::to_json`].
    pub fn from_json(json: &str) -> Result<Self, HistoryError> {
        Ok(serde_json::from_str(json)?)
    }

    /// Writes the history to `path` as JSON (to replay a failing run later with [`History::load`]).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), HistoryError> {
        let path = path.as_ref();
        std::fs::write(path, self.to_json()?).map_err(|source| HistoryError::Io {
            path: path.to_owned(),
            source,
        })
    }

    /// Reads a history file written by [`History::save`].
    pub fn load(path: impl AsRef<Path>) -> Result<Self, HistoryError> {
        let path = path.as_ref();
        let json = std::fs::read_to_string(path).map_err(|source| HistoryError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::from_json(&json)
    }
}

impl From<Vec<Event>> for History {
    fn from(events: Vec<Event>) -> Self {
        Self::new(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(op: Op, invoked: u64, returned: Option<u64>, outcome: Outcome) -> Event {
        Event {
            client: 7,
            op,
            invoked,
            returned,
            outcome,
        }
    }

    #[test]
    fn accepts_matches_each_op_with_its_outcome_kinds() {
        let k = b"k".to_vec();
        let v = b"v".to_vec();
        let ops = [
            Op::Get(k.clone()),
            Op::Set(k.clone(), v.clone()),
            Op::Insert(k.clone(), v.clone()),
            Op::Update(k.clone(), v.clone()),
            Op::Delete(k.clone()),
            Op::Incr(k.clone(), 1),
            Op::Take(k.clone()),
        ];
        let outcomes = [
            Outcome::Value(None),
            Outcome::Ok,
            Outcome::Applied(true),
            Outcome::Int(3),
            Outcome::Error,
            Outcome::Unknown,
        ];
        let fits = |op: &Op, o: &Outcome| -> bool {
            match o {
                Outcome::Unknown => true,
                Outcome::Value(_) => ["get", "getdel"].contains(&op.name()),
                Outcome::Ok => op.name() == "set",
                Outcome::Applied(_) => ["insert", "update", "delete"].contains(&op.name()),
                Outcome::Int(_) | Outcome::Error => op.name() == "incr",
            }
        };
        for op in &ops {
            assert_eq!(op.key(), b"k");
            for o in &outcomes {
                assert_eq!(op.accepts(o), fits(op, o), "{op} {o}");
            }
        }
    }

    #[test]
    fn validate_reports_each_malformation() {
        let ok = History::new(vec![
            ev(
                Op::Set(b"k".to_vec(), b"v".to_vec()),
                5,
                Some(5),
                Outcome::Ok,
            ),
            ev(Op::Get(b"k".to_vec()), 6, None, Outcome::Unknown),
        ]);
        ok.validate().unwrap();

        let early = History::new(vec![ev(
            Op::Delete(b"k".to_vec()),
            10,
            Some(9),
            Outcome::Applied(false),
        )]);
        let err = early.validate().unwrap_err();
        assert!(
            matches!(
                err,
                HistoryError::ResponseBeforeInvocation {
                    index: 0,
                    client: 7,
                    invoked: 10,
                    returned: 9
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("before its invocation"), "{err}");

        let wrong = History::new(vec![
            ev(
                Op::Set(b"k".to_vec(), b"v".to_vec()),
                1,
                Some(2),
                Outcome::Ok,
            ),
            ev(Op::Get(b"k".to_vec()), 1, Some(2), Outcome::Ok),
        ]);
        let err = wrong.validate().unwrap_err();
        assert!(
            matches!(err, HistoryError::WrongOutcome { index: 1, .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains("get \"k\" cannot return ok"),
            "{err}"
        );

        let incr_applied = History::new(vec![ev(
            Op::Incr(b"k".to_vec(), 1),
            1,
            Some(2),
            Outcome::Applied(true),
        )]);
        assert!(matches!(
            incr_applied.validate(),
            Err(HistoryError::WrongOutcome { .. })
        ));

        let no_outcome = History::new(vec![ev(
            Op::Get(b"k".to_vec()),
            1,
            Some(2),
            Outcome::Unknown,
        )]);
        assert!(matches!(
            no_outcome.validate(),
            Err(HistoryError::ReturnedWithoutOutcome { index: 0, .. })
        ));

        let no_return = History::new(vec![ev(
            Op::Get(b"k".to_vec()),
            1,
            None,
            Outcome::Value(None),
        )]);
        assert!(matches!(
            no_return.validate(),
            Err(HistoryError::OutcomeWithoutReturn { index: 0, .. })
        ));
    }

    #[test]
    fn json_round_trips_text_and_binary_bytes() {
        let binary = vec![0u8, 159, 146, 150, 255];
        let h = History::new(vec![
            ev(
                Op::Set(b"k".to_vec(), binary.clone()),
                1,
                Some(2),
                Outcome::Ok,
            ),
            ev(
                Op::Get(binary.clone()),
                3,
                Some(4),
                Outcome::Value(Some("\"é\n".as_bytes().to_vec())),
            ),
            ev(Op::Get(b"k".to_vec()), 3, Some(4), Outcome::Value(None)),
            ev(Op::Incr(Vec::new(), -9), 5, None, Outcome::Unknown),
            ev(
                Op::Update(b"k".to_vec(), Vec::new()),
                6,
                Some(8),
                Outcome::Applied(false),
            ),
            ev(
                Op::Incr(b"n".to_vec(), i64::MIN),
                6,
                Some(8),
                Outcome::Error,
            ),
        ])
        .with_initial(binary.clone(), b"init".to_vec())
        .with_initial(b"n".to_vec(), b"-4".to_vec());
        let json = h.to_json().unwrap();
        assert!(json.contains("\"init\""), "{json}");
        assert!(json.contains("159"), "{json}");
        let back = History::from_json(&json).unwrap();
        assert_eq!(back, h);
        assert_eq!(back.initial_value(&binary), Some(&b"init"[..]));
        assert_eq!(back.initial_value(b"absent"), None);
        assert_eq!(back.len(), 6);
    }

    #[test]
    fn json_without_initial_values_and_bad_json() {
        let json = r#"{"events":[{"client":1,"op":{"Get":[107]},"invoked":0,"returned":1,"outcome":{"Value":"x"}}]}"#;
        let h = History::from_json(json).unwrap();
        assert_eq!(h.events()[0].op, Op::Get(b"k".to_vec()));
        assert_eq!(h.events()[0].outcome, Outcome::Value(Some(b"x".to_vec())));
        assert!(matches!(
            History::from_json("{\"events\": 3}"),
            Err(HistoryError::Json(_))
        ));
        assert!(matches!(
            History::from_json(
                r#"{"events":[{"client":1,"op":{"Get":[300]},"invoked":0,"returned":1,"outcome":"Ok"}]}"#
            ),
            Err(HistoryError::Json(_))
        ));
    }

    #[test]
    fn save_and_load_round_trip_and_report_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.json");
        let h = History::new(vec![ev(
            Op::Delete(b"k".to_vec()),
            1,
            Some(2),
            Outcome::Applied(true),
        )])
        .with_initial(b"k".to_vec(), b"v".to_vec());
        h.save(&path).unwrap();
        assert_eq!(History::load(&path).unwrap(), h);
        std::fs::remove_file(&path).unwrap();
        let err = History::load(&path).unwrap_err();
        assert!(matches!(err, HistoryError::Io { .. }), "{err}");
    }
}
