//! Soft state of the embedded store: leases, members and elections, in DRAM only.
//!
//! After a memory-node restart it is empty and every node re-registers, which is why none of it is persisted.
//! Expiry is by [`Instant`] deadline, checked lazily at the start of every operation (every operation takes `now`,
//! so tests can drive time without sleeping).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use crate::{LeaseId, MetaConfig, MetaError};

/// Lease ids stay below 2^62 so they also fit etcd's signed 64-bit ids in logs and tools.
const LEASE_ID_SPACE: u64 = 1 << 62;

struct Lease {
    deadline: Instant,
    ttl: Duration,
    /// Members registered under this lease.
    members: BTreeSet<String>,
    /// Elections this lease leads.
    elections: BTreeSet<String>,
}

struct Member {
    info: Vec<u8>,
    lease: LeaseId,
}

struct Leader {
    candidate: String,
    lease: LeaseId,
}

/// Leases, members and elections.
pub(crate) struct Soft {
    leases: HashMap<LeaseId, Lease>,
    /// Lease deadlines in order, so expiry costs nothing while nothing is due.
    deadlines: BTreeSet<(Instant, LeaseId)>,
    members: BTreeMap<String, Member>,
    leaders: HashMap<String, Leader>,
    next_lease: LeaseId,
}

impl Soft {
    /// Empty state. Lease ids start at a random point so that ids from before a restart are not handed out again
    /// (a node still holding one gets `LeaseExpired`, never somebody else's lease).
    pub(crate) fn new() -> Soft {
        Soft::with_first_lease(rand::random::<u64>() % (LEASE_ID_SPACE / 2) + 1)
    }

    pub(crate) fn with_first_lease(first: LeaseId) -> Soft {
        Soft {
            leases: HashMap::new(),
            deadlines: BTreeSet::new(),
            members: BTreeMap::new(),
            leaders: HashMap::new(),
            next_lease: first.clamp(1, LEASE_ID_SPACE - 1),
        }
    }

    /// Ends every lease whose deadline has passed.
    pub(crate) fn expire(&mut self, now: Instant) {
        while let Some(&(deadline, id)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_first();
            tracing::debug!(lease = id, "lease expired");
            self.end(id);
        }
    }

    /// Removes a lease (already out of `deadlines`) and everything attached to it.
    fn end(&mut self, id: LeaseId) {
        let Some(lease) = self.leases.remove(&id) else {
            return;
        };
        for m in lease.members {
            if self.members.get(&m).is_some_and(|x| x.lease == id) {
                self.members.remove(&m);
            }
        }
        for e in lease.elections {
            if self.leaders.get(&e).is_some_and(|l| l.lease == id) {
                tracing::info!(election = %e, lease = id, "leadership ended with its lease");
                self.leaders.remove(&e);
            }
        }
    }

    fn live(&mut self, now: Instant, id: LeaseId) -> Result<&mut Lease, MetaError> {
        self.expire(now);
        self.leases.get_mut(&id).ok_or(MetaError::LeaseExpired(id))
    }

    /// Live leases.
    pub(crate) fn lease_count(&self) -> usize {
        self.leases.len()
    }

    pub(crate) fn grant(
        &mut self,
        cfg: &MetaConfig,
        now: Instant,
        ttl: Duration,
    ) -> Result<LeaseId, MetaError> {
        cfg.check_ttl(ttl)?;
        self.expire(now);
        if self.leases.len() >= cfg.max_leases {
            return Err(MetaError::Invalid(format!(
                "{} live leases: the limit is reached",
                self.leases.len()
            )));
        }
        let deadline = now
            .checked_add(ttl)
            .ok_or_else(|| MetaError::Invalid(format!("lease TTL {ttl:?} is out of range")))?;
        let mut id = self.next_lease;
        while self.leases.contains_key(&id) {
            id = id % (LEASE_ID_SPACE - 1) + 1;
        }
        self.next_lease = id % (LEASE_ID_SPACE - 1) + 1;
        self.leases.insert(
            id,
            Lease {
                deadline,
                ttl,
                members: BTreeSet::new(),
                elections: BTreeSet::new(),
            },
        );
        self.deadlines.insert((deadline, id));
        Ok(id)
    }

    pub(crate) fn keep_alive(&mut self, now: Instant, id: LeaseId) -> Result<(), MetaError> {
        let lease = self.live(now, id)?;
        let old = lease.deadline;
        // `now + ttl` was representable at grant time, and `now` only grows.
        let new = now.checked_add(lease.ttl).unwrap_or(old).max(old);
        lease.deadline = new;
        self.deadlines.remove(&(old, id));
        self.deadlines.insert((new, id));
        Ok(())
    }

    pub(crate) fn revoke(&mut self, now: Instant, id: LeaseId) -> Result<(), MetaError> {
        let deadline = self.live(now, id)?.deadline;
        self.deadlines.remove(&(deadline, id));
        self.end(id);
        Ok(())
    }

    pub(crate) fn register(
        &mut self,
        cfg: &MetaConfig,
        now: Instant,
        member: &str,
        info: &[u8],
        lease: LeaseId,
    ) -> Result<(), MetaError> {
        cfg.check_name("member", member)?;
        cfg.check_info(info.len())?;
        self.live(now, lease)?;
        let previous = self.members.get(member).map(|m| m.lease);
        if previous.is_none() && self.members.len() >= cfg.max_members {
            return Err(MetaError::Invalid(format!(
                "{} registered members: the limit is reached",
                self.members.len()
            )));
        }
        if let Some(l) = previous
            .filter(|&old| old != lease)
            .and_then(|old| self.leases.get_mut(&old))
        {
            l.members.remove(member);
        }
        if let Some(l) = self.leases.get_mut(&lease) {
            l.members.insert(member.to_string());
        }
        self.members.insert(
            member.to_string(),
            Member {
                info: info.to_vec(),
                lease,
            },
        );
        Ok(())
    }

    pub(crate) fn members(
        &mut self,
        cfg: &MetaConfig,
        now: Instant,
        prefix: &str,
    ) -> Result<Vec<(String, Vec<u8>)>, MetaError> {
        cfg.check_prefix("member", prefix)?;
        self.expire(now);
        Ok(self
            .members
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(name, _)| name.starts_with(prefix))
            .map(|(name, m)| (name.clone(), m.info.clone()))
            .collect())
    }

    pub(crate) fn try_lead(
        &mut self,
        cfg: &MetaConfig,
        now: Instant,
        election: &str,
        candidate: &str,
        lease: LeaseId,
    ) -> Result<bool, MetaError> {
        cfg.check_name("election", election)?;
        cfg.check_name("candidate", candidate)?;
        self.live(now, lease)?;
        // The leader is the candidate holding the lease it won with: another under the same name (a second M-node
        // left on the same name, or a restarted one while the old one's lease lives) does not lead.
        if let Some(l) = self.leaders.get(election) {
            return Ok(l.candidate == candidate && l.lease == lease);
        }
        if self.leaders.len() >= cfg.max_elections {
            return Err(MetaError::Invalid(format!(
                "{} elections have leaders: the limit is reached",
                self.leaders.len()
            )));
        }
        if let Some(l) = self.leases.get_mut(&lease) {
            l.elections.insert(election.to_string());
        }
        self.leaders.insert(
            election.to_string(),
            Leader {
                candidate: candidate.to_string(),
                lease,
            },
        );
        tracing::info!(election, candidate, lease, "new leader");
        Ok(true)
    }

    pub(crate) fn leader(
        &mut self,
        cfg: &MetaConfig,
        now: Instant,
        election: &str,
    ) -> Result<Option<String>, MetaError> {
        cfg.check_name("election", election)?;
        self.expire(now);
        Ok(self.leaders.get(election).map(|l| l.candidate.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn leases_expire_at_their_deadline_and_keep_alive_extends_them() {
        let cfg = MetaConfig::default();
        let t0 = Instant::now();
        let mut s = Soft::with_first_lease(1);
        let a = s.grant(&cfg, t0, ms(100)).unwrap();
        let b = s.grant(&cfg, t0, ms(100)).unwrap();
        assert_ne!(a, b);
        s.register(&cfg, t0, "kn/1", b"a", a).unwrap();
        s.register(&cfg, t0, "kn/2", b"b", b).unwrap();
        s.keep_alive(t0 + ms(90), a).unwrap();
        // b is due at t0+100; a was extended to t0+190.
        let names: Vec<_> = s
            .members(&cfg, t0 + ms(100), "kn/")
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(names, vec!["kn/1".to_string()]);
        assert_eq!(
            s.keep_alive(t0 + ms(100), b),
            Err(MetaError::LeaseExpired(b))
        );
        assert!(s.members(&cfg, t0 + ms(189), "").unwrap().len() == 1);
        assert!(s.members(&cfg, t0 + ms(190), "").unwrap().is_empty());
        assert_eq!(
            s.keep_alive(t0 + ms(500), a),
            Err(MetaError::LeaseExpired(a))
        );
        assert_eq!(s.lease_count(), 0);
    }

    #[test]
    fn re_registering_under_another_lease_moves_the_member() {
        let cfg = MetaConfig::default();
        let t0 = Instant::now();
        let mut s = Soft::with_first_lease(1);
        let a = s.grant(&cfg, t0, ms(100)).unwrap();
        let b = s.grant(&cfg, t0, ms(1000)).unwrap();
        s.register(&cfg, t0, "kn/1", b"old", a).unwrap();
        s.register(&cfg, t0, "kn/1", b"new", b).unwrap();
        // The end of `a` must not remove a member that now belongs to `b`.
        s.revoke(t0, a).unwrap();
        assert_eq!(
            s.members(&cfg, t0, "kn/").unwrap(),
            vec![("kn/1".to_string(), b"new".to_vec())]
        );
        s.revoke(t0, b).unwrap();
        assert!(s.members(&cfg, t0, "kn/").unwrap().is_empty());
    }

    #[test]
    fn leadership_follows_the_lease() {
        let cfg = MetaConfig::default();
        let t0 = Instant::now();
        let mut s = Soft::with_first_lease(1);
        let a = s.grant(&cfg, t0, ms(100)).unwrap();
        let b = s.grant(&cfg, t0, ms(1000)).unwrap();
        assert!(s.try_lead(&cfg, t0, "m", "m1", a).unwrap());
        assert!(!s.try_lead(&cfg, t0, "m", "m2", b).unwrap());
        assert!(s.try_lead(&cfg, t0, "m", "m1", a).unwrap());
        assert_eq!(s.leader(&cfg, t0, "m").unwrap().as_deref(), Some("m1"));
        assert_eq!(s.leader(&cfg, t0 + ms(100), "m").unwrap(), None);
        assert!(s.try_lead(&cfg, t0 + ms(100), "m", "m2", b).unwrap());
        assert_eq!(
            s.try_lead(&cfg, t0 + ms(100), "m", "m1", a),
            Err(MetaError::LeaseExpired(a))
        );
    }

    #[test]
    fn limits_are_enforced() {
        let cfg = MetaConfig {
            max_leases: 2,
            max_members: 1,
            max_elections: 1,
            max_info_len: 4,
            ..MetaConfig::default()
        };
        let t0 = Instant::now();
        let mut s = Soft::with_first_lease(1);
        let a = s.grant(&cfg, t0, ms(100)).unwrap();
        s.grant(&cfg, t0, ms(100)).unwrap();
        assert!(matches!(
            s.grant(&cfg, t0, ms(100)),
            Err(MetaError::Invalid(_))
        ));
        // Expired leases free their places.
        s.grant(&cfg, t0 + ms(100), ms(100)).unwrap();
        let a2 = s.grant(&cfg, t0 + ms(100), ms(100)).unwrap();
        assert!(s.keep_alive(t0 + ms(100), a).is_err());
        s.register(&cfg, t0 + ms(100), "x", b"1234", a2).unwrap();
        assert!(matches!(
            s.register(&cfg, t0 + ms(100), "x", b"12345", a2),
            Err(MetaError::Invalid(_))
        ));
        assert!(matches!(
            s.register(&cfg, t0 + ms(100), "y", b"", a2),
            Err(MetaError::Invalid(_))
        ));
        s.register(&cfg, t0 + ms(100), "x", b"", a2).unwrap();
        assert!(s.try_lead(&cfg, t0 + ms(100), "e1", "c", a2).unwrap());
        assert!(matches!(
            s.try_lead(&cfg, t0 + ms(100), "e2", "c", a2),
            Err(MetaError::Invalid(_))
        ));
    }

    #[test]
    fn lease_ids_are_never_zero_and_skip_live_ones() {
        let cfg = MetaConfig::default();
        let t0 = Instant::now();
        let mut s = Soft::with_first_lease(LEASE_ID_SPACE - 1);
        let a = s.grant(&cfg, t0, ms(10)).unwrap();
        let b = s.grant(&cfg, t0, ms(10)).unwrap();
        assert_eq!(a, LEASE_ID_SPACE - 1);
        assert_eq!(b, 1);
        assert!(matches!(
            s.grant(&cfg, t0, Duration::MAX),
            Err(MetaError::Invalid(_))
        ));
    }
}
