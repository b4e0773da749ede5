//! The index as a KV node sees it: lock-free lookups with one-sided READs, each validated against the header's
//! `current` word read after it in the same round trip (see the crate documentation).

use dinomo_fabric::{Batch, DATA_REGION, Endpoint, ROOTS_REGION, RegionInfo, Slot};
use dinomo_log::{EntryRef, roots};

use crate::RemoteIndexError;
use crate::layout::{
    BUCKET_LEN, BucketImage, CURRENT_OFFSET, CurrentWord, HEADER_LEN, HeaderError, IndexHeader,
    TABLE_HEADER_LEN, TableHeader, bucket_index, overflow_offset, primary_offset, stored_hash,
    table_bytes,
};

/// How many times a lookup starts over (because a new table was published, or a chain could not be followed)
/// before it gives up with [`RemoteIndexError::TooManyRetries`].
pub const REMOTE_MAX_ATTEMPTS: u32 = 64;

/// A KV-node worker's reader of one memory node's index. Holds the cached `current` word and the geometry of the
/// table it names; one per thread, next to that thread's [`Endpoint`].
#[derive(Debug)]
pub struct RemoteIndex {
    data: RegionInfo,
    header: u64,
    /// The `current` word the cached geometry belongs to.
    word: u64,
    table: CurrentWord,
    /// Overflow capacity of `table`, once its header was read and validated.
    overflow_capacity: Option<u64>,
    batch: Batch<'static>,
}

fn word_at(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

impl RemoteIndex {
    /// Finds the index through root slot [`roots::INDEX`] (in the "roots" region), then connects as
    /// [`RemoteIndex::connect_at`] does.
    pub fn connect(ep: &mut Endpoint) -> Result<RemoteIndex, RemoteIndexError> {
        let roots_region = ep
            .region(ROOTS_REGION)
            .ok_or(RemoteIndexError::NoRegion(ROOTS_REGION))?
            .clone();
        let mut b = [0u8; 8];
        ep.read(
            roots_region.at(roots_region.start + 8 * roots::INDEX as u64),
            &mut b,
        )?;
        let header = u64::from_le_bytes(b);
        if header == 0 {
            return Err(RemoteIndexError::NotFound);
        }
        RemoteIndex::connect_at(ep, header)
    }

    /// Reads and checks the index header at pool offset `header`, then the current table's header. For a pool with
    /// several indexes (one per KV node), whose headers the memory node names.
    pub fn connect_at(ep: &mut Endpoint, header: u64) -> Result<RemoteIndex, RemoteIndexError> {
        let data = ep
            .region(DATA_REGION)
            .ok_or(RemoteIndexError::NoRegion(DATA_REGION))?
            .clone();
        let corrupt = |reason: String| RemoteIndexError::Corrupt {
            offset: header,
            reason,
        };
        if header % 64 != 0
            || header < data.start
            || header
                .checked_add(HEADER_LEN)
                .is_none_or(|end| end > data.end())
        {
            return Err(corrupt(
                "the index header lies outside the data region".into(),
            ));
        }
        let mut hb = [0u8; HEADER_LEN as usize];
        ep.read(data.at(header), &mut hb)?;
        let (_, word) = IndexHeader::decode(&hb).map_err(|e| match e {
            HeaderError::Version(v) => corrupt(format!("unsupported format version {v}")),
            HeaderError::Corrupt(reason) => corrupt(reason),
        })?;
        let mut me = RemoteIndex {
            table: CurrentWord::unpack(word).expect("decode checked the current word"),
            data,
            header,
            word,
            overflow_capacity: None,
            batch: Batch::new(),
        };
        me.adopt(word)?;
        me.load_geometry(ep)?;
        Ok(me)
    }

    /// Pool offset of the index header.
    pub fn header_offset(&self) -> u64 {
        self.header
    }

    /// The cached `current` word.
    pub fn current(&self) -> CurrentWord {
        self.table
    }

    /// Switches to the table named by `word` (its header is read with the next bucket).
    fn adopt(&mut self, word: u64) -> Result<(), RemoteIndexError> {
        let corrupt = |reason: String| RemoteIndexError::Corrupt {
            offset: self.header,
            reason,
        };
        let t = CurrentWord::unpack(word)
            .ok_or_else(|| corrupt(format!("current word {word:#018x} names no table")))?;
        let fits = t.table >= self.data.start
            && t.table
                .checked_add(table_bytes(t.nbuckets, 0))
                .is_some_and(|end| end <= self.data.end());
        if !fits {
            return Err(corrupt(format!(
                "current word {word:#018x} names a table outside the data region"
            )));
        }
        self.word = word;
        self.table = t;
        self.overflow_capacity = None;
        Ok(())
    }

    /// Checks the table header bytes read while `self.word` was current, and caches its overflow capacity.
    fn accept_table_header(&mut self, bytes: &[u8]) -> Result<(), RemoteIndexError> {
        let t = self.table;
        let h = TableHeader::decode(bytes, t, self.header).map_err(|reason| {
            RemoteIndexError::Corrupt {
                offset: t.table,
                reason,
            }
        })?;
        let fits = t
            .table
            .checked_add(table_bytes(h.nbuckets, h.overflow_capacity))
            .is_some_and(|end| end <= self.data.end());
        if !fits {
            return Err(RemoteIndexError::Corrupt {
                offset: t.table,
                reason: format!(
                    "{} overflow buckets reach past the data region",
                    h.overflow_capacity
                ),
            });
        }
        self.overflow_capacity = Some(h.overflow_capacity);
        Ok(())
    }

    /// Reads the current table's header, validated by `current` in the same round trip: a walk's round trip that
    /// reads no bucket (the header is read while its overflow capacity is unknown, as it is after `adopt`).
    fn load_geometry(&mut self, ep: &mut Endpoint) -> Result<(), RemoteIndexError> {
        for _ in 0..REMOTE_MAX_ATTEMPTS {
            if self.read_buckets(ep, std::iter::empty())?.is_some() {
                return Ok(());
            }
        }
        Err(RemoteIndexError::TooManyRetries {
            attempts: REMOTE_MAX_ATTEMPTS,
        })
    }

    /// Clears `out` and pushes, in chain order, every entry reference of `hash`'s chain whose slot hash equals
    /// `hash` (value non-null). The caller compares the full key of each candidate by reading its entry.
    ///
    /// One round trip per bucket of the chain: each READ of a bucket is followed, in the same batch, by a READ of
    /// the header's `current` word; if it changed, the bucket is discarded and the lookup starts over on the new
    /// table. Gives up after [`REMOTE_MAX_ATTEMPTS`] attempts.
    pub fn candidates(
        &mut self,
        ep: &mut Endpoint,
        hash: u64,
        out: &mut Vec<EntryRef>,
    ) -> Result<(), RemoteIndexError> {
        let hash = stored_hash(hash);
        for _ in 0..REMOTE_MAX_ATTEMPTS {
            out.clear();
            let t = self.table;
            let mut bucket = primary_offset(t.table, bucket_index(hash, t.nbuckets));
            let mut hops = 0u64;
            let complete = loop {
                let Some(first) = self.read_buckets(ep, std::iter::once(bucket))? else {
                    break false;
                };
                match self.follow(first, bucket, hash, hops, |r| out.push(r)) {
                    Chain::End => break true,
                    Chain::Broken => break false,
                    Chain::Next(next) => {
                        hops += 1;
                        bucket = next;
                    }
                }
            };
            if complete {
                return Ok(());
            }
        }
        out.clear();
        Err(RemoteIndexError::TooManyRetries {
            attempts: REMOTE_MAX_ATTEMPTS,
        })
    }

    /// [`Self::candidates`] of several hashes at once: their chains are walked side by side, so the walk costs one
    /// round trip per bucket of the longest chain, not one per bucket of every chain. Clears `out` and pushes
    /// `(i, reference)` for each candidate of `hashes[i]`, each hash's in chain order. Every round trip READs the
    /// `current` word after its buckets, as a single walk's does; when it changed, every walk starts over on the new
    /// table. Keep `hashes` within what one batch may READ: 64 bytes each, within the memory node's message limit.
    pub fn candidates_of_many(
        &mut self,
        ep: &mut Endpoint,
        hashes: &[u64],
        out: &mut Vec<(usize, EntryRef)>,
    ) -> Result<(), RemoteIndexError> {
        // Each walk still under way: its hash's index in `hashes`, its stored hash, the bucket to read next, and the
        // overflow buckets followed so far.
        let mut walks: Vec<(usize, u64, u64, u64)> = Vec::with_capacity(hashes.len());
        for _ in 0..REMOTE_MAX_ATTEMPTS {
            out.clear();
            walks.clear();
            let t = self.table;
            walks.extend(hashes.iter().enumerate().map(|(i, &h)| {
                let h = stored_hash(h);
                (
                    i,
                    h,
                    primary_offset(t.table, bucket_index(h, t.nbuckets)),
                    0,
                )
            }));
            let complete = loop {
                if walks.is_empty() {
                    break true;
                }
                let Some(first) = self.read_buckets(ep, walks.iter().map(|w| w.2))? else {
                    break false;
                };
                let mut broken = false;
                let mut at = first;
                walks.retain_mut(|(i, hash, bucket, hops)| {
                    let chain = self.follow(at, *bucket, *hash, *hops, |r| out.push((*i, r)));
                    at += 1;
                    match chain {
                        Chain::End => false,
                        Chain::Broken => {
                            broken = true;
                            false
                        }
                        Chain::Next(next) => {
                            *hops += 1;
                            *bucket = next;
                            true
                        }
                    }
                });
                if broken {
                    break false;
                }
            };
            if complete {
                // Each walk pushed its candidates round by round: put each hash's together, in chain order.
                out.sort_by_key(|&(i, _)| i);
                return Ok(());
            }
        }
        out.clear();
        Err(RemoteIndexError::TooManyRetries {
            attempts: REMOTE_MAX_ATTEMPTS,
        })
    }

    /// One round trip of a walk: READs `buckets` of the cached table (and its header, while its overflow capacity
    /// is unknown), then the `current` word. Returns the batch slot of the first bucket (the others follow it), or
    /// `None` when a new table was published: what was read may come from a retired (or freed) table, and the
    /// walk starts over on the new one, adopted here.
    fn read_buckets(
        &mut self,
        ep: &mut Endpoint,
        buckets: impl Iterator<Item = u64>,
    ) -> Result<Option<usize>, RemoteIndexError> {
        let w = self.word;
        let t = self.table;
        let cur = self.data.at(self.header + CURRENT_OFFSET);
        self.batch.clear();
        let th = self.overflow_capacity.is_none().then(|| {
            self.batch
                .read(self.data.at(t.table), TABLE_HEADER_LEN as u32)
        });
        let first = self.batch.len();
        for bucket in buckets {
            self.batch.read(self.data.at(bucket), BUCKET_LEN as u32);
        }
        let cs = self.batch.read(cur, 8);
        ep.post(&mut self.batch)?;
        let now = word_at(self.batch.read_data(cs));
        if now != w {
            self.adopt(now)?;
            return Ok(None);
        }
        if let Some(th) = th {
            let bytes: [u8; TABLE_HEADER_LEN as usize] =
                self.batch.read_data(th).try_into().expect("64 bytes");
            self.accept_table_header(&bytes)?;
        }
        Ok(Some(first))
    }

    /// Takes the bucket read into batch slot `at` (`bucket` of the cached table, reached after `hops` overflow
    /// buckets): pushes its slots of stored hash `hash`, and says where the chain goes.
    fn follow(
        &self,
        at: usize,
        bucket: u64,
        hash: u64,
        hops: u64,
        mut push: impl FnMut(EntryRef),
    ) -> Chain {
        let t = self.table;
        let cap = self.overflow_capacity.unwrap_or(0);
        let img = BucketImage::decode(self.batch.read_data(Slot(at)));
        img.slots
            .iter()
            .filter(|&&(h, _)| h == hash)
            .filter_map(|&(_, v)| EntryRef::from_raw(v))
            .for_each(&mut push);
        if img.next == 0 {
            return Chain::End;
        }
        if img.next > cap || hops >= cap {
            // Cannot happen in a sound table; start over rather than follow it.
            tracing::warn!(
                bucket,
                next = img.next,
                "remote index chain cannot be followed"
            );
            return Chain::Broken;
        }
        Chain::Next(overflow_offset(t.table, t.nbuckets, img.next))
    }
}

/// Where a chain goes after a bucket.
enum Chain {
    /// It ends there.
    End,
    /// On to this overflow bucket.
    Next(u64),
    /// Its next word cannot be followed (a walk starts over).
    Broken,
}
