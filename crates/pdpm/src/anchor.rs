//! How a baseline's area is laid into a memory node's pool and found again: one extent, anchored in a pool root
//! slot, that starts with a 64-byte header `[magic: 8][format version: 4][the layout's fields: 48][CRC32C: 4]`
//! (the CRC covers bytes 0..60).

use std::fmt::Debug;

use dinomo_fabric::{Connector, DATA_REGION, Endpoint, ROOTS_REGION, RegionInfo};
use dinomo_pool::Pool;

use crate::PdpmError;

/// Bytes of an area's header.
pub(crate) const HEADER_LEN: u64 = 64;

/// Bytes of the header the CRC covers (the CRC follows them).
const SEALED: usize = 60;

/// Where and under which name a baseline's area lives.
pub(crate) struct Anchor {
    /// Pool root slot holding the area's offset.
    pub root: usize,
    /// Allocation tag of the area's extent.
    pub tag: u16,
    pub magic: &'static [u8; 8],
    pub version: u32,
    /// The store, for messages ("DirectDS").
    pub store: &'static str,
    /// The area, for messages ("slot table").
    pub what: &'static str,
}

/// A geometry stored in an anchored area's header.
pub(crate) trait Anchored: Sized + PartialEq + Debug {
    const ANCHOR: Anchor;

    /// Writes the geometry into bytes 12..60 of `h`.
    fn put_fields(&self, h: &mut [u8; HEADER_LEN as usize]);

    /// Reads the geometry from a header whose magic, CRC and version are checked, and checks it.
    fn get_fields(h: &[u8]) -> Result<Self, String>;

    /// Bytes of the whole area, header included.
    fn anchored_len(&self) -> u64;

    /// The sealed header.
    fn encode(&self) -> [u8; HEADER_LEN as usize] {
        let a = Self::ANCHOR;
        let mut h = [0u8; HEADER_LEN as usize];
        h[0..8].copy_from_slice(a.magic);
        h[8..12].copy_from_slice(&a.version.to_le_bytes());
        self.put_fields(&mut h);
        let crc = crc32c::crc32c(&h[..SEALED]);
        h[SEALED..SEALED + 4].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// The geometry of a header, or what is wrong with it.
    fn decode(h: &[u8]) -> Result<Self, String> {
        let a = Self::ANCHOR;
        if h.len() < HEADER_LEN as usize || &h[0..8] != a.magic {
            return Err(format!("no {} {} (bad magic)", a.store, a.what));
        }
        if crc32c::crc32c(&h[..SEALED]) != le_u32(h, SEALED) {
            return Err(format!("{} header fails its checksum", a.what));
        }
        if le_u32(h, 8) != a.version {
            return Err(format!(
                "{} format version {} unknown",
                a.what,
                le_u32(h, 8)
            ));
        }
        Self::get_fields(h)
    }
}

/// The little-endian `u32` at `at` (the caller checked the length).
pub(crate) fn le_u32(h: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(h[at..at + 4].try_into().unwrap_or([0; 4]))
}

/// The little-endian `u64` at `at` (the caller checked the length).
pub(crate) fn le_u64(h: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(h[at..at + 8].try_into().unwrap_or([0; 8]))
}

/// Allocates `layout`'s area in `pool`, writes its header (zeroing the rest first when `zero_body`) and anchors it
/// in its root slot. Refuses a pool that already has one.
pub(crate) fn format<L: Anchored>(
    pool: &Pool,
    layout: &L,
    zero_body: bool,
) -> Result<(), PdpmError> {
    let a = L::ANCHOR;
    if pool.root(a.root)? != 0 {
        return Err(PdpmError::Layout {
            node: 0,
            why: format!("the pool already has a {} {}", a.store, a.what),
        });
    }
    let len = layout.anchored_len();
    let extent = pool.alloc_bytes(len, a.tag)?;
    let persisted = if zero_body {
        let zeros = vec![0u8; 1 << 20];
        let mut at = extent.offset;
        let end = extent.offset + len;
        while at < end {
            let n = (end - at).min(zeros.len() as u64);
            pool.write(at, &zeros[..n as usize])?;
            at += n;
        }
        len
    } else {
        HEADER_LEN
    };
    pool.write(extent.offset, &layout.encode())?;
    pool.persist(extent.offset, persisted);
    // The root word commits the format.
    pool.set_root(a.root, extent.offset)?;
    Ok(())
}

/// An area as a client reaches it.
pub(crate) struct Located {
    pub data: RegionInfo,
    /// Pool offset of the first byte after the header.
    pub body: u64,
}

/// Finds memory node `node`'s area through its root slot and reads its geometry.
pub(crate) fn locate<L: Anchored>(
    ep: &mut Endpoint,
    node: usize,
) -> Result<(Located, L), PdpmError> {
    let a = L::ANCHOR;
    let layout_err = |why: String| PdpmError::Layout { node, why };
    let roots_region = ep
        .region(ROOTS_REGION)
        .ok_or_else(|| layout_err("no roots region".into()))?
        .clone();
    let data = ep
        .region(DATA_REGION)
        .ok_or_else(|| layout_err("no data region".into()))?
        .clone();
    let mut word = [0u8; 8];
    ep.read(
        roots_region.at(roots_region.start + 8 * a.root as u64),
        &mut word,
    )?;
    let base = u64::from_le_bytes(word);
    if base == 0 {
        return Err(layout_err(format!(
            "not formatted for {} (root slot empty)",
            a.store
        )));
    }
    let mut header = [0u8; HEADER_LEN as usize];
    ep.read(data.at(base), &mut header)?;
    let layout = L::decode(&header).map_err(layout_err)?;
    let inside = base >= data.start
        && base
            .checked_add(layout.anchored_len())
            .is_some_and(|end| end <= data.end());
    if !inside {
        return Err(layout_err(format!(
            "{} lies outside the data region",
            a.what
        )));
    }
    Ok((
        Located {
            data,
            body: base + HEADER_LEN,
        },
        layout,
    ))
}

/// Connects to every memory node (node `i` is `connectors[i]`, at least one) and locates their areas, which must
/// share one geometry.
pub(crate) fn locate_all<L: Anchored>(
    connectors: &[Connector],
) -> Result<(Vec<Endpoint>, Vec<Located>, L), PdpmError> {
    let mut eps = Vec::with_capacity(connectors.len());
    let mut areas = Vec::with_capacity(connectors.len());
    let mut layout: Option<L> = None;
    for (node, c) in connectors.iter().enumerate() {
        let mut ep = c.connect()?;
        let (area, l) = locate::<L>(&mut ep, node)?;
        match &layout {
            Some(first) if *first != l => {
                return Err(PdpmError::Layout {
                    node,
                    why: format!("{} {l:?} differs from node 0's {first:?}", L::ANCHOR.what),
                });
            }
            _ => layout = Some(l),
        }
        eps.push(ep);
        areas.push(area);
    }
    let layout = layout.ok_or_else(|| PdpmError::Config("no memory nodes".into()))?;
    Ok((eps, areas, layout))
}
