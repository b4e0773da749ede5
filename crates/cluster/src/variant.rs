//! The systems of the DINOMO paper's evaluation (§5) that run on this code: DINOMO and its variants. A variant is
//! a setting of the same parts, never a copy of them.

use serde::{Deserialize, Serialize};

use dinomo_dpm::Partitioning;

use crate::LocalClusterConfig;

/// Which of the DINOMO paper's systems a cluster is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// DINOMO: ownership partitioning, disaggregated adaptive caching (values and shortcuts), selective
    /// replication, one shared index on the memory node.
    #[default]
    Dinomo,
    /// DINOMO-S: DINOMO with a shortcut-only cache. A KV node caches only where each of its values lives in the
    /// pool, so even a cache hit costs one READ of the value. Otherwise identical to DINOMO.
    DinomoS,
    /// DINOMO-N: shared-nothing. The memory node keeps one index per KV node ([`Partitioning::PerNode`]), which
    /// only that node reads; when keys change owner (a node joins, leaves or fails), their entries are copied into
    /// the new owner's partition before it serves them. DAC as in DINOMO; no selective replication.
    DinomoN,
}

impl Variant {
    /// Every variant, in the paper's order.
    pub const ALL: [Variant; 3] = [Variant::Dinomo, Variant::DinomoS, Variant::DinomoN];

    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Dinomo => "dinomo",
            Variant::DinomoS => "dinomo-s",
            Variant::DinomoN => "dinomo-n",
        }
    }

    /// How its memory node lays out the index.
    pub fn partitioning(self) -> Partitioning {
        match self {
            Variant::Dinomo | Variant::DinomoS => Partitioning::Shared,
            Variant::DinomoN => Partitioning::PerNode,
        }
    }

    /// The cache policy the variant's KV nodes use: `requested` for DINOMO (its default is DAC), always
    /// shortcut-only for DINOMO-S, which refuses any other request.
    pub fn cache_policy(
        self,
        requested: Option<dinomo_cache::Policy>,
    ) -> Result<dinomo_cache::Policy, String> {
        match (self, requested) {
            (Variant::DinomoS, None | Some(dinomo_cache::Policy::ShortcutOnly)) => {
                Ok(dinomo_cache::Policy::ShortcutOnly)
            }
            (Variant::DinomoS, Some(other)) => Err(format!(
                "dinomo-s caches shortcuts only; it cannot run with the {other} cache policy"
            )),
            (Variant::Dinomo | Variant::DinomoN, requested) => Ok(requested.unwrap_or_default()),
        }
    }

    /// Sets what makes `cfg` this variant, leaving every other setting as it is: DINOMO-S, the shortcut-only
    /// cache; DINOMO-N, the index partitioned per KV node and an autoscaler that never replicates keys. A caller
    /// that takes a cache policy from its user checks it with [`Variant::cache_policy`] first.
    pub fn configure(self, cfg: &mut LocalClusterConfig) {
        if self == Variant::DinomoS {
            cfg.node.kn.cache.policy = dinomo_cache::Policy::ShortcutOnly;
        }
        cfg.processor.partitioning = self.partitioning();
        if self == Variant::DinomoN {
            cfg.autoscale.policy.selective_replication = false;
        }
    }
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Variant {
    type Err = String;

    fn from_str(s: &str) -> Result<Variant, String> {
        let lower = s.trim().to_ascii_lowercase();
        Variant::ALL
            .into_iter()
            .find(|v| v.name() == lower)
            .ok_or_else(|| {
                let names: Vec<&str> = Variant::ALL.iter().map(|v| v.name()).collect();
                format!("unknown system {s:?} (one of {})", names.join(", "))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dinomo_cache::Policy;

    #[test]
    fn names_round_trip() {
        for v in Variant::ALL {
            assert_eq!(v.name().parse::<Variant>(), Ok(v));
        }
        assert!("clover".parse::<Variant>().is_err());
    }

    #[test]
    fn dinomo_s_caches_shortcuts_only() {
        assert_eq!(
            Variant::DinomoS.cache_policy(None),
            Ok(Policy::ShortcutOnly)
        );
        assert!(
            Variant::DinomoS
                .cache_policy(Some(Policy::ValueOnly))
                .is_err()
        );
        assert_eq!(Variant::Dinomo.cache_policy(None), Ok(Policy::Adaptive));
        assert_eq!(
            Variant::Dinomo.cache_policy(Some(Policy::ValueOnly)),
            Ok(Policy::ValueOnly)
        );
        let mut cfg = LocalClusterConfig::default();
        Variant::DinomoS.configure(&mut cfg);
        assert_eq!(cfg.node.kn.cache.policy, Policy::ShortcutOnly);
        let mut cfg = LocalClusterConfig::default();
        Variant::Dinomo.configure(&mut cfg);
        assert_eq!(cfg.node.kn.cache.policy, Policy::Adaptive);
        assert_eq!(cfg.processor.partitioning, Partitioning::Shared);
    }

    #[test]
    fn dinomo_n_partitions_the_index_and_replicates_nothing() {
        let mut cfg = LocalClusterConfig::default();
        Variant::DinomoN.configure(&mut cfg);
        assert_eq!(cfg.processor.partitioning, Partitioning::PerNode);
        assert!(!cfg.autoscale.policy.selective_replication);
        assert_eq!(cfg.node.kn.cache.policy, Policy::Adaptive);
    }
}
