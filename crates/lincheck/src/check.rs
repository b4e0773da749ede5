//! The per-key Wing & Gong / Lowe search and its reductions (described in the crate documentation).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use crate::bytes::{Shown, ShownValue};
use crate::history::{Event, History, HistoryError};
use crate::model::{IncrResult, IntSyntax, IntegerFit, Step, ValueId, Values};

/// Default for [`CheckConfig::max_states_per_key`]. A cached configuration costs about `n / 8 + 40` bytes for a
/// key with `n` operations, so the default bounds one key's search to tens of megabytes for keys of a few hundred
/// operations; a linearizable history of that size usually needs a few states per operation.
pub const DEFAULT_MAX_STATES_PER_KEY: u64 = 1_000_000;

/// Default for [`CheckConfig::dominance_checks`].
pub const DEFAULT_DOMINANCE_CHECKS: usize = 32;

/// Default for [`CheckConfig::explain_ops`].
pub const DEFAULT_EXPLAIN_OPS: usize = 10;

/// Default for [`CheckConfig::explain_value_bytes`].
pub const DEFAULT_EXPLAIN_VALUE_BYTES: usize = 48;

/// Settings of [`check`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckConfig {
    /// How many distinct configurations (linearized set and value) the search of one key may visit before it
    /// gives up with [`Verdict::Inconclusive`]; bounds both time and memory. Default
    /// [`DEFAULT_MAX_STATES_PER_KEY`].
    pub max_states_per_key: u64,
    /// How many fully explored configurations (the most recent first) a new one is compared with for the inclusion
    /// rule on unknown writes: a configuration whose known operations and value equal those of an explored one, and
    /// whose unknown writes include that one's, is pruned. More prunes more, at a cost per state. Default
    /// [`DEFAULT_DOMINANCE_CHECKS`].
    pub dominance_checks: usize,
    /// How many operations a [`Verdict::NotLinearizable`] explanation lists before and at the point where the
    /// search got stuck. Default [`DEFAULT_EXPLAIN_OPS`].
    pub explain_ops: usize,
    /// How many bytes of a key or value an explanation shows before eliding the rest. Default
    /// [`DEFAULT_EXPLAIN_VALUE_BYTES`].
    pub explain_value_bytes: usize,
    /// How [`crate::Op::Incr`] reads stored values as integers; it must match the store under test. Default
    /// [`IntSyntax::Strict`] (as Redis).
    pub int_syntax: IntSyntax,
}

impl Default for CheckConfig {
    fn default() -> Self {
        Self {
            max_states_per_key: DEFAULT_MAX_STATES_PER_KEY,
            dominance_checks: DEFAULT_DOMINANCE_CHECKS,
            explain_ops: DEFAULT_EXPLAIN_OPS,
            explain_value_bytes: DEFAULT_EXPLAIN_VALUE_BYTES,
            int_syntax: IntSyntax::default(),
        }
    }
}

/// What [`check`] concluded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every key's operations can be ordered consistently with real time and the register's specification.
    Linearizable,
    /// One key's operations cannot (the first such key in byte order is reported).
    NotLinearizable {
        /// The key.
        key: Vec<u8>,
        /// Where the search got stuck: the last operations of a longest consistent order, the value after them and
        /// the operations that could take effect next, each with why it does not fit.
        explanation: String,
    },
    /// No key is known to be non-linearizable, but the search of this one (the first in byte order) ran out of
    /// budget ([`CheckConfig::max_states_per_key`]).
    Inconclusive {
        /// The key.
        key: Vec<u8>,
        /// How far the search got.
        reason: String,
    },
}

impl Verdict {
    /// Whether the verdict is [`Verdict::Linearizable`].
    pub fn is_linearizable(&self) -> bool {
        matches!(self, Verdict::Linearizable)
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Linearizable => f.write_str("linearizable"),
            Verdict::NotLinearizable { explanation, .. } => f.write_str(explanation),
            Verdict::Inconclusive { key, reason } => {
                write!(
                    f,
                    "key {}: inconclusive: {reason}",
                    Shown(key, DEFAULT_EXPLAIN_VALUE_BYTES)
                )
            }
        }
    }
}

/// A [`Verdict`] with the work it took.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckReport {
    /// The verdict.
    pub verdict: Verdict,
    /// Keys with at least one operation to check.
    pub keys: usize,
    /// Operations checked (reads with unknown outcome excluded).
    pub ops: usize,
    /// Reads with unknown outcome, which constrain nothing and were dropped.
    pub dropped_reads: usize,
    /// Writes with unknown outcome, which may or may not have taken effect.
    pub unknown_writes: usize,
    /// Configurations visited, all keys together.
    pub states: u64,
    /// Configurations visited by the most expensive key.
    pub max_key_states: u64,
}

/// Checks that `history` is linearizable with respect to a map of independent registers (see [`crate::Op`] for
/// each operation's specification). Fails only when the history is malformed (see [`History::validate`]).
pub fn check(history: &History, config: &CheckConfig) -> Result<Verdict, HistoryError> {
    check_report(history, config).map(|r| r.verdict)
}

/// [`check`], also reporting how much work the search did.
pub fn check_report(history: &History, config: &CheckConfig) -> Result<CheckReport, HistoryError> {
    history.validate()?;
    let events = history.events();
    let mut by_key: BTreeMap<&[u8], Vec<usize>> = BTreeMap::new();
    let mut dropped_reads = 0;
    for (i, e) in events.iter().enumerate() {
        if e.op.is_read() && e.outcome.is_unknown() {
            dropped_reads += 1;
        } else {
            by_key.entry(e.op.key()).or_default().push(i);
        }
    }
    let mut report = CheckReport {
        verdict: Verdict::Linearizable,
        keys: by_key.len(),
        ops: by_key.values().map(Vec::len).sum(),
        dropped_reads,
        unknown_writes: 0,
        states: 0,
        max_key_states: 0,
    };
    let mut inconclusive = None;
    for (key, indices) in by_key {
        let mut values = Values::new(config.int_syntax);
        let initial = values.intern_opt(history.initial_value(key));
        let ops: Vec<KeyOp> = indices
            .into_iter()
            .filter_map(|event| {
                let e = &events[event];
                let step = Step::compile(&e.op, &e.outcome, &mut values)?;
                Some(KeyOp {
                    event,
                    step,
                    call: e.invoked,
                    ret: e.returned,
                })
            })
            .collect();
        report.unknown_writes += ops.iter().filter(|o| o.ret.is_none()).count();
        let mut search = Search::new(&ops, initial, &mut values, config);
        let result = search.run();
        let states = search.cache.len() as u64;
        report.states += states;
        report.max_key_states = report.max_key_states.max(states);
        tracing::debug!(key = %Shown(key, config.explain_value_bytes), ops = ops.len(), states, "lincheck: key searched");
        match result {
            KeyResult::Linearizable => {}
            KeyResult::Stuck(snapshot) => {
                let explanation =
                    explain(key, &ops, events, initial, &mut values, &snapshot, config);
                report.verdict = Verdict::NotLinearizable {
                    key: key.to_vec(),
                    explanation,
                };
                return Ok(report);
            }
            KeyResult::Budget => {
                if inconclusive.is_none() {
                    let unknown = ops.iter().filter(|o| o.ret.is_none()).count();
                    let reason = format!(
                        "the search gave up after visiting {states} configurations (max_states_per_key = {}) over {} \
                         operations, {unknown} of them writes with unknown outcome; a larger max_states_per_key \
                         searches further",
                        config.max_states_per_key,
                        ops.len()
                    );
                    inconclusive = Some(Verdict::Inconclusive {
                        key: key.to_vec(),
                        reason,
                    });
                }
            }
        }
    }
    if let Some(v) = inconclusive {
        report.verdict = v;
    }
    Ok(report)
}

/// One operation of the key being searched.
struct KeyOp {
    /// Index in [`History::events`].
    event: usize,
    step: Step,
    call: u64,
    /// `None` for an unknown outcome (a response at +infinity).
    ret: Option<u64>,
}

/// How one key's search ended.
enum KeyResult {
    Linearizable,
    Stuck(Snapshot),
    Budget,
}

/// The deepest point of a failed search: the configuration with the most known operations linearized.
struct Snapshot {
    /// Operations in linearization order (indices into the key's ops).
    order: Vec<usize>,
    /// Known operations among them.
    known_done: usize,
    /// The operations that could take effect next.
    candidates: Vec<usize>,
    /// The operation whose response is the earliest unexplained one.
    blocking: Option<usize>,
}

const NIL: usize = usize::MAX;

/// The call and return entries sorted by time, as a doubly linked list from which linearized operations are
/// unlinked and relinked in last-in-first-out order (dancing links).
struct Entries {
    next: Vec<usize>,
    prev: Vec<usize>,
    /// The operation of each entry (`NIL` for the head and tail sentinels).
    op: Vec<usize>,
    is_call: Vec<bool>,
    /// Each operation's call entry.
    call: Vec<usize>,
    /// Each operation's return entry, `NIL` when its outcome is unknown.
    ret: Vec<usize>,
    tail: usize,
}

impl Entries {
    fn new(ops: &[KeyOp]) -> Self {
        // At equal times calls sort before returns: an operation invoked at the very nanosecond another returned
        // counts as concurrent with it, which never rejects a linearizable history.
        let mut sorted: Vec<(u64, bool, usize)> = Vec::with_capacity(ops.len() * 2);
        for (i, op) in ops.iter().enumerate() {
            sorted.push((op.call, false, i));
            if let Some(r) = op.ret {
                sorted.push((r, true, i));
            }
        }
        sorted.sort_unstable();
        let tail = sorted.len() + 1;
        let mut e = Entries {
            next: (1..=tail).chain([NIL]).collect(),
            prev: [NIL].into_iter().chain(0..tail).collect(),
            op: vec![NIL; tail + 1],
            is_call: vec![false; tail + 1],
            call: vec![NIL; ops.len()],
            ret: vec![NIL; ops.len()],
            tail,
        };
        for (slot, &(_, is_return, op)) in sorted.iter().enumerate() {
            let entry = slot + 1;
            e.op[entry] = op;
            e.is_call[entry] = !is_return;
            if is_return {
                e.ret[op] = entry;
            } else {
                e.call[op] = entry;
            }
        }
        e
    }

    fn unlink(&mut self, entry: usize) {
        let (p, n) = (self.prev[entry], self.next[entry]);
        self.next[p] = n;
        self.prev[n] = p;
    }

    fn relink(&mut self, entry: usize) {
        let (p, n) = (self.prev[entry], self.next[entry]);
        self.next[p] = entry;
        self.prev[n] = entry;
    }

    fn lift(&mut self, op: usize) {
        self.unlink(self.call[op]);
        if self.ret[op] != NIL {
            self.unlink(self.ret[op]);
        }
    }

    fn unlift(&mut self, op: usize) {
        if self.ret[op] != NIL {
            self.relink(self.ret[op]);
        }
        self.relink(self.call[op]);
    }
}

/// The splitmix64 finalizer: a cheap, well-mixed hash of a u64.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A set of known operations in canonical form: `full` words of ones, then `window` (which does not end in a
/// zero word), then zeros.
#[derive(Clone, Copy, PartialEq, Eq)]
struct KnownSet<'a> {
    full: usize,
    window: &'a [u64],
}

/// Visited configurations. Each is chained under the hash of its whole (known set, unknown set, value), for exact
/// matches, and once fully explored also under the hash of (known set, value), for the inclusion rule.
struct Cache {
    exact_heads: nohash_hasher::IntMap<u64, usize>,
    exact_next: Vec<usize>,
    explored_heads: nohash_hasher::IntMap<u64, usize>,
    explored_next: Vec<usize>,
    explored_hash: Vec<u64>,
    state: Vec<ValueId>,
    /// Each configuration's known set: its `full` count and where its window lies in `windows`.
    known_full: Vec<usize>,
    window_at: Vec<usize>,
    windows: Vec<u64>,
    unknown: Vec<u64>,
    unknown_words: usize,
    dominance_checks: usize,
}

impl Cache {
    fn new(unknown_words: usize, dominance_checks: usize) -> Self {
        Cache {
            exact_heads: HashMap::default(),
            exact_next: Vec::new(),
            explored_heads: HashMap::default(),
            explored_next: Vec::new(),
            explored_hash: Vec::new(),
            state: Vec::new(),
            known_full: Vec::new(),
            window_at: vec![0],
            windows: Vec::new(),
            unknown: Vec::new(),
            unknown_words,
            dominance_checks,
        }
    }

    fn len(&self) -> usize {
        self.state.len()
    }

    fn known_of(&self, id: usize) -> KnownSet<'_> {
        KnownSet {
            full: self.known_full[id],
            window: &self.windows[self.window_at[id]..self.window_at[id + 1]],
        }
    }

    fn unknown_of(&self, id: usize) -> &[u64] {
        &self.unknown[id * self.unknown_words..(id + 1) * self.unknown_words]
    }

    /// Records the configuration and returns its id, or `None` when it was visited already or is dominated by a
    /// fully explored one (same known set and value, a subset of its unknown writes; only the
    /// `dominance_checks` most recently explored candidates are compared).
    fn visit(
        &mut self,
        known_hash: u64,
        unknown_hash: u64,
        known: KnownSet<'_>,
        unknown: &[u64],
        state: ValueId,
    ) -> Option<usize> {
        let state_hash = mix(u64::from(state) ^ (1 << 62));
        let exact_hash = known_hash ^ unknown_hash ^ state_hash;
        let explored_hash = known_hash ^ state_hash;
        let head = self.exact_heads.get(&exact_hash).copied().unwrap_or(NIL);
        let mut id = head;
        while id != NIL {
            if self.state[id] == state
                && self.known_of(id) == known
                && self.unknown_of(id) == unknown
            {
                return None;
            }
            id = self.exact_next[id];
        }
        if self.unknown_words > 0 {
            let mut id = self
                .explored_heads
                .get(&explored_hash)
                .copied()
                .unwrap_or(NIL);
            for _ in 0..self.dominance_checks {
                if id == NIL {
                    break;
                }
                if self.state[id] == state
                    && self.known_of(id) == known
                    && self
                        .unknown_of(id)
                        .iter()
                        .zip(unknown)
                        .all(|(s, u)| s & !u == 0)
                {
                    return None;
                }
                id = self.explored_next[id];
            }
        }
        let id = self.state.len();
        self.exact_next.push(head);
        self.exact_heads.insert(exact_hash, id);
        self.explored_next.push(NIL);
        self.explored_hash.push(explored_hash);
        self.state.push(state);
        self.known_full.push(known.full);
        self.windows.extend_from_slice(known.window);
        self.window_at.push(self.windows.len());
        self.unknown.extend_from_slice(unknown);
        Some(id)
    }

    /// Marks the configuration fully explored (without success), making it a candidate for the inclusion rule.
    fn explored(&mut self, id: usize) {
        if self.unknown_words > 0 {
            let hash = self.explored_hash[id];
            self.explored_next[id] = self.explored_heads.insert(hash, id).unwrap_or(NIL);
        }
    }
}

/// The candidates of one search level: `arena[start..end]`, `arena[cursor]` being the next to try.
struct Level {
    start: usize,
    cursor: usize,
    end: usize,
    blocking: Option<usize>,
    /// Where runs of the level's unknown operations can take the value, and where the known candidates need it.
    reach: Reach,
}

/// A bound on the values from which a run of unknown increments can still lead to a known candidate. When every
/// unknown candidate is an increment by a positive (negative) amount, a run of them only raises (lowers) an integer
/// value, and the known candidates that fit an integer fit only the values listed by [`Step::integer_fit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reach {
    /// No bound.
    Any,
    /// Runs only raise the value; no known candidate fits above this.
    Up(i64),
    /// Runs only lower the value; no known candidate fits below this.
    Down(i64),
    /// No known candidate fits any value a run of increments leaves.
    Nowhere,
}

/// One linearized operation on the search path.
struct Frame {
    op: usize,
    prev_state: ValueId,
    cache_id: usize,
}

struct Search<'a> {
    ops: &'a [KeyOp],
    values: &'a mut Values,
    max_states: u64,
    entries: Entries,
    /// Each operation's bit in `known` or `unknown`.
    slot: Vec<usize>,
    known: Vec<u64>,
    /// Words of `known` before this one are all ones.
    known_full: usize,
    /// Words of `known` from this one on are all zeros.
    known_end: usize,
    unknown: Vec<u64>,
    /// XOR of `mix(slot)` over the known operations linearized: the set's hash, kept incrementally.
    known_hash: u64,
    /// The same for the unknown operations linearized.
    unknown_hash: u64,
    known_left: usize,
    known_total: usize,
    state: ValueId,
    cache: Cache,
    arena: Vec<usize>,
    impure: Vec<usize>,
    deferred: Vec<usize>,
    /// The effects of the unknown candidates of the level being opened.
    unknown_steps: HashSet<Step>,
    levels: Vec<Level>,
    frames: Vec<Frame>,
    best: Option<Snapshot>,
}

impl<'a> Search<'a> {
    fn new(
        ops: &'a [KeyOp],
        initial: ValueId,
        values: &'a mut Values,
        config: &CheckConfig,
    ) -> Self {
        // Known operations are numbered in the order of their responses, so that a configuration's known set is
        // a run of ones (every operation that returned before the earliest unexplained response) followed by a
        // short window; the cache stores only the window.
        let entries = Entries::new(ops);
        let mut slot = vec![0; ops.len()];
        let (mut nk, mut nu) = (0usize, 0usize);
        let mut e = entries.next[0];
        while e != entries.tail {
            let op = entries.op[e];
            if !entries.is_call[e] {
                slot[op] = nk;
                nk += 1;
            } else if ops[op].ret.is_none() {
                slot[op] = nu;
                nu += 1;
            }
            e = entries.next[e];
        }
        let (wk, wu) = (nk.div_ceil(64), nu.div_ceil(64));
        Search {
            ops,
            values,
            max_states: config.max_states_per_key,
            entries,
            slot,
            known_full: 0,
            known_end: 0,
            known: vec![0; wk],
            unknown: vec![0; wu],
            known_hash: 0,
            unknown_hash: 0,
            known_left: nk,
            known_total: nk,
            state: initial,
            cache: Cache::new(wu, config.dominance_checks),
            arena: Vec::new(),
            impure: Vec::new(),
            deferred: Vec::new(),
            unknown_steps: HashSet::new(),
            levels: Vec::new(),
            frames: Vec::new(),
            best: None,
        }
    }

    /// Flips the operation's bit in the linearized sets.
    fn toggle(&mut self, op: usize) {
        let s = self.slot[op];
        let bit = 1u64 << (s % 64);
        if self.ops[op].ret.is_some() {
            let w = s / 64;
            self.known[w] ^= bit;
            self.known_hash ^= mix(s as u64);
            if self.known[w] & bit != 0 {
                self.known_end = self.known_end.max(w + 1);
                while self.known_full < self.known.len() && self.known[self.known_full] == u64::MAX
                {
                    self.known_full += 1;
                }
            } else {
                self.known_full = self.known_full.min(w);
                while self.known_end > 0 && self.known[self.known_end - 1] == 0 {
                    self.known_end -= 1;
                }
            }
        } else {
            self.unknown[s / 64] ^= bit;
            self.unknown_hash ^= mix(s as u64 | (1 << 63));
        }
    }

    /// Opens a level whose candidates are the calls before the earliest unlinearized return: known operations that
    /// do not change the value first, then the other known ones, then the unknown ones.
    /// Of several unknown operations with the same effect only the earliest invoked is a candidate: it can take
    /// effect wherever a later one could, so trying the others too would only repeat the same orders.
    fn push_level(&mut self) {
        let start = self.arena.len();
        self.impure.clear();
        self.deferred.clear();
        self.unknown_steps.clear();
        let mut e = self.entries.next[0];
        while e != self.entries.tail && self.entries.is_call[e] {
            let op = self.entries.op[e];
            if self.ops[op].ret.is_none() {
                if self.unknown_steps.insert(self.ops[op].step) {
                    self.deferred.push(op);
                }
            } else if self.ops[op].step.is_pure() {
                self.arena.push(op);
            } else {
                self.impure.push(op);
            }
            e = self.entries.next[e];
        }
        self.arena.extend_from_slice(&self.impure);
        let known = self.arena.len() - start;
        // Most recently invoked first: an unknown operation whose effect shows up is likelier to be a recent one.
        self.arena.extend(self.deferred.iter().rev());
        let blocking = (e != self.entries.tail).then(|| self.entries.op[e]);
        let reach = self.reach(&self.arena[start..start + known]);
        self.levels.push(Level {
            start,
            cursor: start,
            end: self.arena.len(),
            blocking,
            reach,
        });
    }

    /// The [`Reach`] of a level whose known candidates are `known` and unknown ones `self.deferred`.
    fn reach(&self, known: &[usize]) -> Reach {
        let mut up = true;
        let mut down = true;
        for &op in &self.deferred {
            match self.ops[op].step {
                Step::Incr(d, IncrResult::Any) => {
                    up &= d > 0;
                    down &= d < 0;
                }
                _ => return Reach::Any,
            }
        }
        if self.deferred.is_empty() || !(up || down) {
            return Reach::Any;
        }
        let mut bound: Option<i64> = None;
        for &op in known {
            match self.ops[op].step.integer_fit(self.values) {
                IntegerFit::Anything => return Reach::Any,
                IntegerFit::Never => {}
                IntegerFit::Exactly(n) => {
                    bound = Some(bound.map_or(n, |b| if up { b.max(n) } else { b.min(n) }));
                }
            }
        }
        match bound {
            None => Reach::Nowhere,
            Some(b) if up => Reach::Up(b),
            Some(b) => Reach::Down(b),
        }
    }

    /// Whether some operation that may be linearized right after the unknown `op` (taking the value from
    /// `self.state` to `after`) fits `after` and ends differently than it would without `op`. The candidates after
    /// `op` are the current level's minus `op`, plus possibly a pending twin of `op` (same effect), which `op`'s
    /// own step stands for.
    fn observed(&mut self, op: usize, after: ValueId) -> bool {
        let Some(level) = self.levels.last() else {
            return true;
        };
        let before = self.state;
        let twin = std::iter::once(self.ops[op].step);
        let others = self.arena[level.start..level.end]
            .iter()
            .filter(|&&c| c != op)
            .map(|&c| self.ops[c].step);
        for step in twin.chain(others) {
            if let Some(n) = step.apply(after, self.values) {
                if step.apply(before, self.values) != Some(n) {
                    return true;
                }
            }
        }
        false
    }

    /// Whether linearizing the unknown `op` now (leaving the value `after`) can lead anywhere that orders without
    /// it cannot: something that may follow observes it, the value is not already past every value a known
    /// candidate could use, and it does not break the canonical order of a run of increments (which commute, so
    /// only runs in invocation order are tried).
    fn worth_assuming(&mut self, op: usize, after: ValueId) -> bool {
        let Some(level) = self.levels.last() else {
            return true;
        };
        let reach = level.reach;
        if let Some(x) = self.values.int_value(after) {
            let hopeless = match reach {
                Reach::Any => false,
                Reach::Nowhere => true,
                Reach::Up(max) => x > max,
                Reach::Down(min) => x < min,
            };
            if hopeless {
                return false;
            }
        }
        if let (Step::Incr(_, IncrResult::Any), Some(top)) = (self.ops[op].step, self.frames.last())
        {
            let top_is_unknown_incr =
                matches!(self.ops[top.op].step, Step::Incr(_, IncrResult::Any));
            if top_is_unknown_incr && self.slot[op] < self.slot[top.op] {
                return false;
            }
        }
        self.observed(op, after)
    }

    fn run(&mut self) -> KeyResult {
        self.push_level();
        loop {
            if self.known_left == 0 {
                return KeyResult::Linearizable;
            }
            let Some(level) = self.levels.last_mut() else {
                return KeyResult::Linearizable;
            };
            if level.cursor < level.end {
                let op = self.arena[level.cursor];
                level.cursor += 1;
                let Some(next) = self.ops[op].step.apply(self.state, self.values) else {
                    continue;
                };
                // An unknown write whose effect the next operation would have produced anyway was pointless:
                // the same order without it is tried from the level below (see the crate documentation).
                let pointless = self.frames.last().is_some_and(|top| {
                    self.ops[top.op].ret.is_none()
                        && self.ops[op].step.apply(top.prev_state, self.values) == Some(next)
                });
                if pointless {
                    continue;
                }
                // An unknown write is worth assuming only if something that may come right after it observes
                // it; otherwise every order through it is pruned one level up, so skip it now.
                if self.ops[op].ret.is_none() && !self.worth_assuming(op, next) {
                    continue;
                }
                // A known operation that never changes the value can move to the front of any order that continues
                // from here, so when it fits now the orders starting with it are the only ones to try.
                if self.ops[op].ret.is_some() && self.ops[op].step.is_pure() {
                    if let Some(level) = self.levels.last_mut() {
                        level.cursor = level.end;
                    }
                }
                self.toggle(op);
                let window = &self.known[self.known_full..self.known_end.max(self.known_full)];
                let known = KnownSet {
                    full: self.known_full,
                    window,
                };
                let visited = self.cache.visit(
                    self.known_hash,
                    self.unknown_hash,
                    known,
                    &self.unknown,
                    next,
                );
                let Some(cache_id) = visited else {
                    self.toggle(op);
                    continue;
                };
                if self.cache.len() as u64 > self.max_states {
                    return KeyResult::Budget;
                }
                self.frames.push(Frame {
                    op,
                    prev_state: self.state,
                    cache_id,
                });
                self.state = next;
                self.entries.lift(op);
                if self.ops[op].ret.is_some() {
                    self.known_left -= 1;
                }
                self.push_level();
            } else {
                let known_done = self.known_total - self.known_left;
                // The most known operations linearized, and among those the fewest unknown ones assumed.
                let depth = self.frames.len();
                let better = |b: &Snapshot| {
                    known_done > b.known_done
                        || (known_done == b.known_done && depth < b.order.len())
                };
                if self.best.as_ref().is_none_or(better) {
                    self.best = Some(Snapshot {
                        order: self.frames.iter().map(|f| f.op).collect(),
                        known_done,
                        candidates: self.arena[level.start..level.end].to_vec(),
                        blocking: level.blocking,
                    });
                }
                let start = level.start;
                self.levels.pop();
                self.arena.truncate(start);
                let Some(frame) = self.frames.pop() else {
                    let snapshot = self.best.take().unwrap_or(Snapshot {
                        order: Vec::new(),
                        known_done: 0,
                        candidates: Vec::new(),
                        blocking: None,
                    });
                    return KeyResult::Stuck(snapshot);
                };
                self.cache.explored(frame.cache_id);
                self.state = frame.prev_state;
                self.entries.unlift(frame.op);
                self.toggle(frame.op);
                if self.ops[frame.op].ret.is_some() {
                    self.known_left += 1;
                }
            }
        }
    }
}

/// Describes where a failed search got stuck.
fn explain(
    key: &[u8],
    ops: &[KeyOp],
    events: &[Event],
    initial: ValueId,
    values: &mut Values,
    snap: &Snapshot,
    config: &CheckConfig,
) -> String {
    use std::fmt::Write as _;
    let max = config.explain_value_bytes;
    let known_total = ops.iter().filter(|o| o.ret.is_some()).count();
    let describe = |op: usize| {
        let o = &ops[op];
        let e = &events[o.event];
        let ret = o.ret.map_or_else(|| "?".to_owned(), |r| r.to_string());
        format!(
            "#{} client {} [{}, {}] {} -> {}",
            o.event,
            e.client,
            o.call,
            ret,
            e.op.without_key(max),
            e.outcome.shown(max)
        )
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "key {}: not linearizable: at most {} of its {} operations with a response fit one order that respects \
         real time and the register's specification ({} operations in such an order, counting writes with unknown \
         outcome).",
        Shown(key, max),
        snap.known_done,
        known_total,
        snap.order.len()
    );
    // Replay the order to show the value after each operation.
    let mut state = initial;
    let mut after = Vec::with_capacity(snap.order.len());
    for &op in &snap.order {
        state = ops[op].step.apply(state, values).unwrap_or(state);
        after.push(state);
    }
    let shown_from = snap.order.len().saturating_sub(config.explain_ops);
    if snap.order.is_empty() {
        let _ = writeln!(
            out,
            "No operation can take effect first; the initial value is {}.",
            ShownValue(values.get(initial), max)
        );
    } else {
        let _ = writeln!(
            out,
            "The last {} operations of that order (event index, client, [invoked, returned] in ns, oldest first):",
            snap.order.len() - shown_from
        );
        for (&op, &value) in snap.order[shown_from..].iter().zip(&after[shown_from..]) {
            let _ = writeln!(
                out,
                "  {}   => value {}",
                describe(op),
                ShownValue(values.get(value), max)
            );
        }
        let _ = writeln!(
            out,
            "The value after them: {}.",
            ShownValue(values.get(state), max)
        );
    }
    let _ = writeln!(
        out,
        "Operations that could take effect next (* marks the one whose response is the earliest still unexplained; \
         it must take effect before any operation invoked after that response):"
    );
    // The blocked operation first: it is the one the search could not get past.
    let listed: Vec<usize> = snap
        .blocking
        .into_iter()
        .chain(
            snap.candidates
                .iter()
                .copied()
                .filter(|&c| Some(c) != snap.blocking),
        )
        .collect();
    for &op in listed.iter().take(config.explain_ops.max(1)) {
        let mark = if snap.blocking == Some(op) { "*" } else { " " };
        let why = match ops[op].step.apply(state, values) {
            None => format!("cannot: {}", ops[op].step.refusal(state, values, max)),
            Some(next) => format!(
                "can (value {}), but no consistent order of the remaining operations follows",
                ShownValue(values.get(next), max)
            ),
        };
        let _ = writeln!(out, "{mark} {}: {why}", describe(op));
    }
    if listed.len() > config.explain_ops.max(1) {
        let _ = writeln!(
            out,
            "  ... and {} more",
            listed.len() - config.explain_ops.max(1)
        );
    }
    out
}

#[cfg(test)]
mod tests;
