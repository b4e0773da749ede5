//! What the server runs commands on: a [`Backend`] hands each connection a [`BackendConn`], which executes the
//! key operations of a pipeline together (so a store can keep many in flight and commit writes in groups).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use dinomo_value::RangeWrite;

use crate::wake::Wake;

/// One operation on one key. Commands map onto these (`MGET` is one [`Op::Get`] per key, `SET NX` an
/// [`Op::Insert`], ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// The value of a key.
    Get(Vec<u8>),
    /// Whether a key has a value.
    Exists(Vec<u8>),
    /// Sets a value.
    Set(Vec<u8>, Vec<u8>),
    /// Sets a value only if the key has none; whether it did.
    Insert(Vec<u8>, Vec<u8>),
    /// Sets a value only if the key has one; whether it did.
    Update(Vec<u8>, Vec<u8>),
    /// Sets a value; the previous one.
    GetSet(Vec<u8>, Vec<u8>),
    /// Removes a key; whether it had a value.
    Delete(Vec<u8>),
    /// Adds to the decimal integer at the key (none = 0); the result.
    Incr(Vec<u8>, i64),
    /// Appends to the value (none = empty); the new length.
    Append(Vec<u8>, Vec<u8>),
    /// The length of the value (none = 0), without the value.
    Strlen(Vec<u8>),
    /// Removes a key; the value it had.
    Take(Vec<u8>),
    /// The bytes of the value between two positions, both included, negative ones counting from the end
    /// ([`dinomo_value::range`]; none = empty).
    GetRange(Vec<u8>, i64, i64),
    /// Writes bytes at an offset of the value, zero-filling any gap ([`dinomo_value::set_range`]); the new length.
    SetRange(Vec<u8>, u64, Vec<u8>),
    /// Adds the float the bytes spell to the stored number (none = 0); the result as stored.
    IncrFloat(Vec<u8>, Vec<u8>),
    /// Sets a value only if the key has none; the current value (none when it was set).
    InsertGet(Vec<u8>, Vec<u8>),
    /// Sets a value only if the key has one; the previous value (none when nothing was set).
    UpdateGet(Vec<u8>, Vec<u8>),
    /// Sets or clears one bit ([`dinomo_value::set_bit`]); the bit before.
    SetBit(Vec<u8>, u64, bool),
    /// One bit ([`dinomo_value::get_bit`]).
    GetBit(Vec<u8>, u64),
    /// The set bits of all or a range of the value ([`dinomo_value::bit_count`]).
    BitCount(Vec<u8>, Option<(i64, i64, bool)>),
    /// The first bit equal to the flag in all or a range of the value ([`dinomo_value::bit_pos`]).
    BitPos(Vec<u8>, bool, Option<(i64, Option<i64>, bool)>),
    /// Whether the value still has this digest ([`dinomo_value::digest`]; `None`: no value): a key `WATCH`ed by a
    /// transaction, which runs only if every one of them holds ([`BackendConn::execute_atomic`]).
    Unchanged(Vec<u8>, Option<u128>),
}

impl Op {
    /// The key.
    pub fn key(&self) -> &[u8] {
        match self {
            Op::Get(k) | Op::Exists(k) | Op::Strlen(k) | Op::Delete(k) | Op::Incr(k, _) => k,
            Op::Set(k, _) | Op::Insert(k, _) | Op::Update(k, _) | Op::GetSet(k, _) => k,
            Op::Append(k, _) | Op::Take(k) | Op::GetRange(k, ..) | Op::SetRange(k, ..) => k,
            Op::IncrFloat(k, _) | Op::InsertGet(k, _) | Op::UpdateGet(k, _) => k,
            Op::SetBit(k, ..) | Op::GetBit(k, _) | Op::BitCount(k, _) | Op::BitPos(k, ..) => k,
            Op::Unchanged(k, _) => k,
        }
    }

    /// The value the op brings to store whole (`SET` and its conditional forms), if it brings one.
    pub fn value(&self) -> Option<&[u8]> {
        match self {
            Op::Set(_, v)
            | Op::Insert(_, v)
            | Op::Update(_, v)
            | Op::GetSet(_, v)
            | Op::InsertGet(_, v)
            | Op::UpdateGet(_, v) => Some(v),
            _ => None,
        }
    }

    /// Whether it may change data.
    pub fn is_write(&self) -> bool {
        !matches!(
            self,
            Op::Get(_)
                | Op::Exists(_)
                | Op::Strlen(_)
                | Op::GetRange(..)
                | Op::GetBit(..)
                | Op::BitCount(..)
                | Op::BitPos(..)
                | Op::Unchanged(..)
        )
    }
}

/// The result of an [`Op`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// A value or none (`Get`, `GetSet`, `Take`, `GetRange`, `IncrFloat`, `InsertGet`, `UpdateGet`).
    Value(Option<Vec<u8>>),
    /// Whether it held or applied (`Exists`, `Set`, `Insert`, `Update`, `Delete`).
    Applied(bool),
    /// A number (`Incr`, `Append`, `Strlen`, `SetRange` and the bit ops).
    Int(i64),
}

/// Why an operation failed; each becomes an error reply (`-ERR` and the text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// `Incr` on a value that is not a decimal 64-bit integer (or, where the store cannot tell the two apart, a
    /// result that would overflow).
    #[error("value is not an integer or out of range")]
    NotAnInteger,
    /// `Incr` whose result would overflow.
    #[error("increment or decrement would overflow")]
    Overflow,
    /// The request breaks a limit of the store (key or value size); it was not applied.
    #[error("{0}")]
    Invalid(String),
    /// A write whose outcome is unknown: it may or may not have been applied. Never reported as success.
    #[error("write outcome unknown, it may or may not have been applied: {0}")]
    Indeterminate(String),
    /// The store could not serve the operation now; it was not applied.
    #[error("{0}")]
    Unavailable(String),
    /// The store is full: the write was not applied. Answered as Redis answers a write beyond `maxmemory`, with an
    /// `-OOM` error, which Redis clients tell apart from other errors.
    #[error("{0}")]
    OutOfSpace(String),
}

impl From<dinomo_value::ValueError> for BackendError {
    fn from(e: dinomo_value::ValueError) -> BackendError {
        match e {
            dinomo_value::ValueError::NotAnInteger => BackendError::NotAnInteger,
            dinomo_value::ValueError::IntegerOverflow => BackendError::Overflow,
            e => BackendError::Invalid(e.to_string()),
        }
    }
}

/// One step of a walk over the keys ([`BackendConn::scan`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeysPage {
    /// Where the next step starts; 0 when the walk is over.
    pub cursor: u64,
    /// Keys named by this step.
    pub keys: Vec<Vec<u8>>,
}

/// A result of an [`Op`].
pub type OpResult = Result<Output, BackendError>;

/// The fabric traffic of the process serving a connection (every thread of it, background work included), for
/// `INFO fabric`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FabricCounts {
    /// Round trips to memory nodes: a one-sided verb, a posted batch or a two-sided call each count one.
    pub round_trips: u64,
    /// Bytes sent to memory nodes.
    pub bytes_out: u64,
    /// Bytes received from memory nodes.
    pub bytes_in: u64,
}

/// A store the server can serve.
pub trait Backend: Send + Sync + 'static {
    /// A connection's handle.
    type Conn: BackendConn;

    /// A handle for a new client connection. A backend whose [`BackendConn::start`] leaves operations running
    /// rings `wake` as they complete, so the event loop serving the connection learns when to finish them
    /// instead of blocking in [`BackendConn::finish`].
    fn connect(&self, wake: Wake) -> Self::Conn;
}

/// One client connection's way to the store.
pub trait BackendConn: Send + 'static {
    /// Executes `ops` (a pipeline's worth, in the order the client sent them), leaving `ops` empty, and replaces
    /// `results` with one result per op, in the same order. Ops on the same key take effect in order; ops on
    /// different keys may run concurrently.
    fn execute(&mut self, ops: &mut Vec<Op>, results: &mut Vec<OpResult>);

    /// Starts `ops` without waiting for them, so a thread serving many connections serves the others while they
    /// run. [`BackendConn::finish`] with the same `ops` must follow before any other call but
    /// [`BackendConn::is_complete`]. The default starts nothing: `finish` runs them.
    fn start(&mut self, ops: &mut Vec<Op>) {
        let _ = ops;
    }

    /// Whether every op [`BackendConn::start`] began (`ops`, as `start` left them) has its result, so
    /// [`BackendConn::finish`] will not wait for the store. A backend may take the chance to move the ops on (send
    /// on the ones one part of the store handed back). A backend that answers `false` rings the connection's
    /// [`Wake`] when that may have changed (and answers `true` once its own time limit for the ops has passed, so
    /// `finish` reports them failed). The default, for backends that start nothing, is `true`: `finish` runs the
    /// ops.
    fn is_complete(&mut self, ops: &mut Vec<Op>) -> bool {
        let _ = ops;
        true
    }

    /// Completes the ops [`BackendConn::start`] began, as [`BackendConn::execute`] would have run them.
    fn finish(&mut self, ops: &mut Vec<Op>, results: &mut Vec<OpResult>) {
        self.execute(ops, results);
    }

    /// Executes `ops` as one transaction (`MULTI` ... `EXEC`): in order, with no other client's operation on their
    /// keys between them, replacing `results` with one result per op as [`BackendConn::execute`] does (an op's own
    /// failure fails it alone). Its [`Op::Unchanged`] ops are the transaction's condition, checked before anything
    /// runs: `Ok(false)`, nothing applied and `results` empty, when one does not hold. `Err` when the transaction
    /// did not run for another reason, nothing of it applied. The default is a store that cannot run transactions.
    fn execute_atomic(
        &mut self,
        ops: &mut Vec<Op>,
        results: &mut Vec<OpResult>,
    ) -> Result<bool, BackendError> {
        let _ = (ops, results);
        Err(BackendError::Unavailable(
            "this store cannot run transactions (MULTI/EXEC)".into(),
        ))
    }

    /// Starts `ops` as one transaction without waiting for it, as [`BackendConn::start`] starts a pipeline;
    /// [`BackendConn::finish_atomic`] with the same `ops` must follow before any other call but
    /// [`BackendConn::is_complete`]. The default starts nothing: `finish_atomic` runs the transaction.
    fn start_atomic(&mut self, ops: &mut Vec<Op>) {
        let _ = ops;
    }

    /// Completes the transaction [`BackendConn::start_atomic`] began, as [`BackendConn::execute_atomic`] would
    /// have run it.
    fn finish_atomic(
        &mut self,
        ops: &mut Vec<Op>,
        results: &mut Vec<OpResult>,
    ) -> Result<bool, BackendError> {
        self.execute_atomic(ops, results)
    }

    /// How many keys the store holds.
    fn dbsize(&mut self) -> Result<u64, BackendError>;

    /// One step of a walk over the store's keys (`SCAN`, `KEYS`), from `cursor` (0 starts a walk; a reply cursor
    /// of 0 ends it), naming about `count` keys. A whole walk names every key there from its start to its end,
    /// some perhaps more than once, and may name keys that are no longer there: the caller asks about each. The
    /// default is a store that cannot list its keys.
    fn scan(&mut self, cursor: u64, count: u32) -> Result<KeysPage, BackendError> {
        let _ = (cursor, count);
        Err(BackendError::Unavailable(
            "this store cannot list its keys (SCAN, KEYS)".into(),
        ))
    }

    /// The serving process's fabric counters since it started, when the store reaches memory nodes through a
    /// fabric that counts them; `None` (the default) leaves the `fabric` section out of `INFO`.
    fn fabric_counts(&mut self) -> Option<FabricCounts> {
        None
    }

    /// Runs one op.
    fn run(&mut self, op: Op) -> OpResult {
        let mut results = Vec::with_capacity(1);
        self.execute(&mut vec![op], &mut results);
        results
            .pop()
            .unwrap_or_else(|| Err(BackendError::Unavailable("no result".into())))
    }

    /// The value of `key`.
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        match self.run(Op::Get(key.to_vec()))? {
            Output::Value(v) => Ok(v),
            other => Err(unexpected(other)),
        }
    }

    /// Whether `key` has a value.
    fn exists(&mut self, key: &[u8]) -> Result<bool, BackendError> {
        self.applied(Op::Exists(key.to_vec()))
    }

    /// Sets `key`.
    fn set(&mut self, key: &[u8], value: &[u8]) -> Result<(), BackendError> {
        self.applied(Op::Set(key.to_vec(), value.to_vec()))
            .map(|_| ())
    }

    /// Sets `key` if it has no value; whether it did.
    fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<bool, BackendError> {
        self.applied(Op::Insert(key.to_vec(), value.to_vec()))
    }

    /// Sets `key` if it has a value; whether it did.
    fn update(&mut self, key: &[u8], value: &[u8]) -> Result<bool, BackendError> {
        self.applied(Op::Update(key.to_vec(), value.to_vec()))
    }

    /// Sets `key`; its previous value.
    fn get_set(&mut self, key: &[u8], value: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        match self.run(Op::GetSet(key.to_vec(), value.to_vec()))? {
            Output::Value(v) => Ok(v),
            other => Err(unexpected(other)),
        }
    }

    /// Removes `key`; whether it had a value.
    fn delete(&mut self, key: &[u8]) -> Result<bool, BackendError> {
        self.applied(Op::Delete(key.to_vec()))
    }

    /// Adds `delta` to the integer at `key`; the result.
    fn incr(&mut self, key: &[u8], delta: i64) -> Result<i64, BackendError> {
        match self.run(Op::Incr(key.to_vec(), delta))? {
            Output::Int(n) => Ok(n),
            other => Err(unexpected(other)),
        }
    }

    /// The length of the value at `key` (none = 0).
    fn strlen(&mut self, key: &[u8]) -> Result<i64, BackendError> {
        match self.run(Op::Strlen(key.to_vec()))? {
            Output::Int(n) => Ok(n),
            other => Err(unexpected(other)),
        }
    }

    /// Appends to the value at `key`; the new length.
    fn append(&mut self, key: &[u8], suffix: &[u8]) -> Result<i64, BackendError> {
        match self.run(Op::Append(key.to_vec(), suffix.to_vec()))? {
            Output::Int(n) => Ok(n),
            other => Err(unexpected(other)),
        }
    }

    /// Runs an op answered with whether it held or applied.
    fn applied(&mut self, op: Op) -> Result<bool, BackendError> {
        match self.run(op)? {
            Output::Applied(a) => Ok(a),
            other => Err(unexpected(other)),
        }
    }
}

fn unexpected(o: Output) -> BackendError {
    BackendError::Unavailable(format!("the store answered with an unexpected {o:?}"))
}

/// Adds `delta` to a stored decimal integer as Redis does (`string2ll`: no spaces, no `+`, no leading zeros).
pub fn increment(old: Option<&[u8]>, delta: i64) -> Result<i64, BackendError> {
    Ok(dinomo_value::increment(old, delta)?)
}

/// What an op does to its key's value ([`outcome`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Nothing.
    Keep,
    /// Stores this value (creating the key).
    Put(Vec<u8>),
    /// Removes the key.
    Delete,
}

/// What `op` answers, and does to its key's value, given the value it has now (`None`: none): the one decision of
/// the stores that run every op as a read-modify-write of one value (the in-memory store, the pDPM baselines).
/// Values `SETRANGE` and `SETBIT` would build past `max_value_len` are refused before they are built.
pub fn outcome(
    op: &Op,
    current: Option<&[u8]>,
    max_value_len: usize,
) -> Result<(Output, Effect), BackendError> {
    let owned = || current.map(<[u8]>::to_vec);
    let bytes = current.unwrap_or_default();
    let present = current.is_some();
    let put_if = |yes: bool, v: &[u8]| {
        if yes {
            Effect::Put(v.to_vec())
        } else {
            Effect::Keep
        }
    };
    let delete_if = |yes: bool| if yes { Effect::Delete } else { Effect::Keep };
    Ok(match op {
        Op::Get(_) => (Output::Value(owned()), Effect::Keep),
        Op::Exists(_) => (Output::Applied(present), Effect::Keep),
        Op::Strlen(_) => (Output::Int(bytes.len() as i64), Effect::Keep),
        Op::Set(_, v) => (Output::Applied(true), Effect::Put(v.clone())),
        Op::Insert(_, v) => (Output::Applied(!present), put_if(!present, v)),
        Op::Update(_, v) => (Output::Applied(present), put_if(present, v)),
        Op::GetSet(_, v) => (Output::Value(owned()), Effect::Put(v.clone())),
        Op::InsertGet(_, v) => (Output::Value(owned()), put_if(!present, v)),
        Op::UpdateGet(_, v) => (Output::Value(owned()), put_if(present, v)),
        Op::Delete(_) => (Output::Applied(present), delete_if(present)),
        Op::Take(_) => (Output::Value(owned()), delete_if(present)),
        Op::Incr(_, delta) => {
            let n = increment(current, *delta)?;
            (Output::Int(n), Effect::Put(n.to_string().into_bytes()))
        }
        Op::IncrFloat(_, delta) => {
            let n = dinomo_value::increment_float(current, delta)?;
            (Output::Value(Some(n.clone())), Effect::Put(n))
        }
        Op::Append(_, suffix) => {
            let v = [bytes, suffix].concat();
            (Output::Int(v.len() as i64), Effect::Put(v))
        }
        Op::GetRange(_, start, end) => {
            let part = dinomo_value::range(bytes, *start, *end).to_vec();
            (Output::Value(Some(part)), Effect::Keep)
        }
        Op::SetRange(_, offset, b) => {
            match dinomo_value::set_range(owned(), *offset, b, max_value_len)? {
                RangeWrite::Unchanged(len) => (Output::Int(len as i64), Effect::Keep),
                RangeWrite::Write(v) => (Output::Int(v.len() as i64), Effect::Put(v)),
            }
        }
        Op::SetBit(_, i, bit) => {
            let w = dinomo_value::set_bit(owned(), *i, *bit, max_value_len)?;
            let effect = w.value.map_or(Effect::Keep, Effect::Put);
            (Output::Int(i64::from(w.previous)), effect)
        }
        Op::GetBit(_, i) => (
            Output::Int(i64::from(dinomo_value::get_bit(bytes, *i))),
            Effect::Keep,
        ),
        Op::BitCount(_, range) => (
            Output::Int(dinomo_value::bit_count(bytes, *range) as i64),
            Effect::Keep,
        ),
        Op::BitPos(_, bit, range) => (
            Output::Int(dinomo_value::bit_pos(current, *bit, *range)),
            Effect::Keep,
        ),
        Op::Unchanged(_, digest) => (
            Output::Applied(dinomo_value::digest(current) == *digest),
            Effect::Keep,
        ),
    })
}

/// An in-memory store: a hash map behind a lock. For tests, and for serving RESP without a cluster.
#[derive(Debug, Clone, Default)]
pub struct MemoryBackend {
    map: Arc<Mutex<HashMap<Vec<u8>, Vec<u8>>>>,
    max_value_len: Option<usize>,
}

impl MemoryBackend {
    /// An empty store without a value-size limit.
    pub fn new() -> MemoryBackend {
        MemoryBackend::default()
    }

    /// An empty store that refuses values longer than `max` bytes.
    pub fn with_max_value_len(max: usize) -> MemoryBackend {
        MemoryBackend {
            max_value_len: Some(max),
            ..MemoryBackend::default()
        }
    }

    /// Refuses a value of `len` bytes beyond the limit.
    fn check(&self, len: usize) -> Result<(), BackendError> {
        match self.max_value_len {
            Some(max) if len > max => Err(BackendError::Invalid(format!(
                "value of {len} bytes exceeds the limit of {max} bytes"
            ))),
            _ => Ok(()),
        }
    }

    /// Applies `ops` in order to `map` (locked by the caller), leaving `ops` empty; `results` holds their results.
    fn apply_all(
        &self,
        map: &mut HashMap<Vec<u8>, Vec<u8>>,
        ops: &mut Vec<Op>,
        results: &mut Vec<OpResult>,
    ) {
        results.clear();
        results.extend(ops.drain(..).map(|op| self.apply(map, op)));
    }

    fn apply(&self, map: &mut HashMap<Vec<u8>, Vec<u8>>, op: Op) -> OpResult {
        // A value the op brings is refused as it comes (even where it would not be stored), one it builds before it
        // is stored.
        if let Some(v) = op.value() {
            self.check(v.len())?;
        }
        let max = self.max_value_len.unwrap_or(usize::MAX);
        let (output, effect) = outcome(&op, map.get(op.key()).map(Vec::as_slice), max)?;
        match effect {
            Effect::Keep => {}
            Effect::Put(v) => {
                self.check(v.len())?;
                map.insert(op.key().to_vec(), v);
            }
            Effect::Delete => {
                map.remove(op.key());
            }
        }
        Ok(output)
    }
}

impl Backend for MemoryBackend {
    type Conn = MemoryBackend;

    fn connect(&self, _wake: Wake) -> MemoryBackend {
        self.clone()
    }
}

impl BackendConn for MemoryBackend {
    fn execute(&mut self, ops: &mut Vec<Op>, results: &mut Vec<OpResult>) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        self.apply_all(&mut map, ops, results);
    }

    /// One lock over the whole map for the whole transaction keeps other clients out.
    fn execute_atomic(
        &mut self,
        ops: &mut Vec<Op>,
        results: &mut Vec<OpResult>,
    ) -> Result<bool, BackendError> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let holds = ops.iter().all(|op| match op {
            Op::Unchanged(k, d) => dinomo_value::digest(map.get(k).map(Vec::as_slice)) == *d,
            _ => true,
        });
        if !holds {
            ops.clear();
            results.clear();
            return Ok(false);
        }
        self.apply_all(&mut map, ops, results);
        Ok(true)
    }

    fn dbsize(&mut self) -> Result<u64, BackendError> {
        Ok(self.map.lock().unwrap_or_else(|p| p.into_inner()).len() as u64)
    }

    /// Every key in one step, in no particular order (Redis answers small keyspaces so too).
    fn scan(&mut self, _cursor: u64, _count: u32) -> Result<KeysPage, BackendError> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        Ok(KeysPage {
            cursor: 0,
            keys: map.keys().cloned().collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_backend_follows_the_op_contracts() {
        let mut m = MemoryBackend::with_max_value_len(8);
        assert_eq!(m.get(b"k"), Ok(None));
        assert_eq!(m.insert(b"k", b"1"), Ok(true));
        assert_eq!(m.insert(b"k", b"2"), Ok(false));
        assert_eq!(m.update(b"k", b"3"), Ok(true));
        assert_eq!(m.update(b"x", b"3"), Ok(false));
        assert_eq!(m.get_set(b"k", b"41"), Ok(Some(b"3".to_vec())));
        assert_eq!(m.incr(b"k", 1), Ok(42));
        assert_eq!(m.incr(b"k", i64::MAX), Err(BackendError::Overflow));
        assert_eq!(m.append(b"k", b"x"), Ok(3));
        assert_eq!((m.strlen(b"k"), m.strlen(b"absent")), (Ok(3), Ok(0)));
        assert_eq!(m.incr(b"k", 1), Err(BackendError::NotAnInteger));
        assert!(matches!(
            m.append(b"k", b"123456"),
            Err(BackendError::Invalid(_))
        ));
        assert!(matches!(
            m.set(b"k", b"123456789"),
            Err(BackendError::Invalid(_))
        ));
        assert_eq!(m.exists(b"k"), Ok(true));
        assert_eq!(m.dbsize(), Ok(1));
        assert_eq!(m.delete(b"k"), Ok(true));
        assert_eq!(m.delete(b"k"), Ok(false));
        assert_eq!(m.dbsize(), Ok(0));
    }

    #[test]
    fn increments_parse_like_redis() {
        assert_eq!(increment(None, 5), Ok(5));
        assert_eq!(increment(Some(b"-3"), 1), Ok(-2));
        for bad in [b" 1".as_slice(), b"+1", b"01", b"1.5", b""] {
            assert_eq!(
                increment(Some(bad), 1),
                Err(BackendError::NotAnInteger),
                "{bad:?}"
            );
        }
    }
}
