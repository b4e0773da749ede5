//! `dinomo bench project`: a bottleneck model of throughput at scales this machine cannot run.
//!
//! **This is a model, not a measurement.** It takes what `dinomo bench ycsb` measured per operation — fabric round
//! trips and bytes, CPU time of KV-node workers and network threads, of the memory node's merge and RPC threads and
//! of the clients — and a [`HardwareProfile`] (fabric round-trip time, NIC message rate, link bandwidth, cores per
//! KV node, memory-node threads, clients), and computes for each KV-node count the throughput ceiling of every
//! component:
//!
//! | component | ceiling (ops/s) for N KV nodes |
//! |---|---|
//! | KV-node CPU | N × kn_cores / (KV-node CPU per op × imbalance) |
//! | KV-node NIC | N × NIC round trips/s / (round trips per op × imbalance) |
//! | KV-node link | N × link bytes/s / (fabric bytes per op, larger direction, × imbalance) |
//! | memory-node NIC | NIC round trips/s / round trips per op (every KV node shares it) |
//! | memory-node link | link bytes/s / fabric bytes per op (larger direction) |
//! | memory-node processor | memory-node threads / (merge + RPC CPU per op) |
//! | clients | clients × outstanding / (client RTT + round trips × fabric RTT + KV-node and client CPU per op) |
//! | shared cores | cores / (all CPU per op), when every part runs on the same cores (this machine) |
//!
//! CPU times are multiplied by the profile's `cpu_scale` first. The prediction is the lowest ceiling, and the
//! component it belongs to is the one that binds. "Imbalance" is the busiest node's share of the work times the
//! node count, as measured; the clients' ceiling is Little's law with the latency no lower than the work on an
//! operation's path. Every ceiling is an upper bound: queueing, contention and coordination costs that grow with
//! scale are not in it, so a real system reaches at most the prediction.
//!
//! Per-op resources depend on the node count (more nodes cache more values; on one machine, more threads share
//! the same cores), so each node count is projected from the measured run with the nearest node count.
//! [`SeriesProjection::checks`] compares the model with every measured run: the prediction from the run's own
//! per-op resources, and from the run nearest to it. Those comparisons test the model only when the profile
//! describes the machine the runs ran on ([`HardwareProfile::local`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::format::rate;
use crate::svg;
use crate::ycsb_run::YcsbReport;
use crate::ycsb_run::report::series_label;

/// Said in every output of the projection.
pub const MODEL_NOTE: &str = "MODEL, not a measurement: predicted throughput is the lowest ceiling of the \
components, computed from per-operation resources measured by `dinomo bench ycsb` and a hardware profile. \
Queueing, contention and coordination costs that grow with scale are not modelled, so real throughput is at most \
the prediction.";

/// Most KV nodes a projection goes to.
pub const MAX_PROJECTED_KNS: usize = 4096;

/// Why a projection could not be made.
#[derive(Debug, Error)]
pub enum ProjectError {
    /// A profile value out of range.
    #[error("hardware profile: {0}")]
    BadProfile(String),
    /// A profile file that is not valid TOML or has unknown keys.
    #[error("hardware profile file: {0}")]
    ProfileFile(String),
    /// No usable runs.
    #[error("no runs to project from: {0}")]
    NoRuns(String),
    /// Nothing limits throughput: every ceiling is unlimited or unknown.
    #[error(
        "nothing limits the throughput of series {0}: every component is unlimited in the profile or was not measured"
    )]
    Unbounded(String),
}

/// The built-in profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProfilePreset {
    /// The DINOMO paper's testbed (§5): 56 Gb/s FDR InfiniBand, KV nodes of 8 threads, a memory node of 4 threads,
    /// 8 client nodes of 64 threads.
    Paper,
    /// The machine the runs ran on: every part of the in-process cluster and the clients on the same cores, an
    /// in-process fabric.
    Local,
}

impl FromStr for ProfilePreset {
    type Err = String;

    fn from_str(s: &str) -> Result<ProfilePreset, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "paper" | "testbed" => Ok(ProfilePreset::Paper),
            "local" | "this-machine" => Ok(ProfilePreset::Local),
            other => Err(format!("unknown profile {other:?} (paper or local)")),
        }
    }
}

/// The hardware a projection describes. A value of 0 for a rate, a bandwidth or a core count means "no separate
/// limit" (the component does not exist or is not a bottleneck there); for `clients` and `outstanding` it means
/// "as in the measured run".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HardwareProfile {
    /// A name for tables and plots.
    pub name: String,
    /// Round trip of one fabric operation (a one-sided READ), µs. Paper: 2 µs (FDR InfiniBand; the paper puts
    /// network latency at 1–20 µs).
    pub fabric_rtt_us: f64,
    /// Fabric round trips per second one KV node's NIC sustains. Paper: 25 M (the order of small-verb rates of a
    /// ConnectX-3 adapter).
    pub kn_nic_round_trips_per_s: f64,
    /// Fabric round trips per second the memory node's NIC sustains (shared by every KV node). Paper: 25 M.
    pub dpm_nic_round_trips_per_s: f64,
    /// Bandwidth of each NIC's link in each direction, Gb/s. Paper: 56 (FDR, 56 Gb/s per port).
    pub link_gbps: f64,
    /// Cores (threads) of one KV node. Paper: 8.
    pub kn_cores: f64,
    /// Processor threads of the memory node. Paper: 4.
    pub dpm_threads: f64,
    /// Closed-loop client threads. Paper: 512 (8 client nodes × 64 threads).
    pub clients: u32,
    /// Requests each client keeps in flight. Paper: 1 (§5.3; Figure 5 raises it until the KV nodes saturate).
    pub outstanding: u32,
    /// Round trip between a client and a KV node, µs. Paper: 20 (kernel TCP over 10 Gb Ethernet, an estimate).
    pub client_rtt_us: f64,
    /// Factor applied to every measured CPU time (0.5: the target's cores do the same work in half the time).
    /// Default 1.
    pub cpu_scale: f64,
    /// Cores shared by every KV node, the memory node and the clients (one machine); 0 when each node has its own.
    /// Paper: 0.
    pub shared_cores: f64,
}

impl Default for HardwareProfile {
    fn default() -> Self {
        HardwareProfile::paper()
    }
}

/// One in-process fabric round trip, µs: an 8-byte READ measured by `dinomo bench fabric` on the project's 2-core
/// VM (8.4 ns; README "Benchmark results").
pub const IN_PROCESS_RTT_US: f64 = 0.0084;

impl HardwareProfile {
    /// The DINOMO paper's testbed (§5 "Experiment setup").
    pub fn paper() -> HardwareProfile {
        HardwareProfile {
            name: "paper testbed".into(),
            fabric_rtt_us: 2.0,
            kn_nic_round_trips_per_s: 25e6,
            dpm_nic_round_trips_per_s: 25e6,
            link_gbps: 56.0,
            kn_cores: 8.0,
            dpm_threads: 4.0,
            clients: 512,
            outstanding: 1,
            client_rtt_us: 20.0,
            cpu_scale: 1.0,
            shared_cores: 0.0,
        }
    }

    /// One machine of `cores` cores running everything, as `dinomo bench ycsb --target in-process` does: no NIC or
    /// link limits (an in-process verb is a function call whose cost is in the workers' CPU time), clients as in
    /// the run, loopback client round trips whose cost is in the CPU times of the clients and KV-node network
    /// threads.
    pub fn local(cores: usize) -> HardwareProfile {
        HardwareProfile {
            name: format!("this machine ({cores} cores, in-process fabric)"),
            fabric_rtt_us: IN_PROCESS_RTT_US,
            kn_nic_round_trips_per_s: 0.0,
            dpm_nic_round_trips_per_s: 0.0,
            link_gbps: 0.0,
            kn_cores: cores as f64,
            dpm_threads: cores as f64,
            clients: 0,
            outstanding: 0,
            client_rtt_us: 0.0,
            cpu_scale: 1.0,
            shared_cores: cores as f64,
        }
    }

    /// A preset; `cores` is used by [`ProfilePreset::Local`].
    pub fn preset(preset: ProfilePreset, cores: usize) -> HardwareProfile {
        match preset {
            ProfilePreset::Paper => HardwareProfile::paper(),
            ProfilePreset::Local => HardwareProfile::local(cores),
        }
    }

    /// Checks every value.
    pub fn validate(&self) -> Result<(), ProjectError> {
        let fields = [
            ("fabric_rtt_us", self.fabric_rtt_us),
            ("kn_nic_round_trips_per_s", self.kn_nic_round_trips_per_s),
            ("dpm_nic_round_trips_per_s", self.dpm_nic_round_trips_per_s),
            ("link_gbps", self.link_gbps),
            ("kn_cores", self.kn_cores),
            ("dpm_threads", self.dpm_threads),
            ("client_rtt_us", self.client_rtt_us),
            ("shared_cores", self.shared_cores),
        ];
        for (name, v) in fields {
            if !v.is_finite() || v < 0.0 {
                return Err(ProjectError::BadProfile(format!(
                    "{name} must be a finite number ≥ 0 (got {v})"
                )));
            }
        }
        if !self.cpu_scale.is_finite() || self.cpu_scale <= 0.0 {
            return Err(ProjectError::BadProfile(format!(
                "cpu_scale must be a finite number > 0 (got {})",
                self.cpu_scale
            )));
        }
        Ok(())
    }

    /// One line for tables.
    pub fn describe(&self) -> String {
        let limit = |v: f64, unit: &str| {
            if v > 0.0 {
                format!("{}{unit}", short(v))
            } else {
                "no limit".to_string()
            }
        };
        let clients = if self.clients == 0 {
            "clients as in the run".to_string()
        } else {
            format!("{} clients", self.clients)
        };
        let outstanding = if self.outstanding == 0 {
            "outstanding as in the run".to_string()
        } else {
            format!("{} outstanding", self.outstanding)
        };
        let mut s = format!(
            "{}: fabric RTT {} µs, KV-node NIC {}, memory-node NIC {}, links {}, {} KV-node cores, {} memory-node \
             threads, {clients} × {outstanding}, client RTT {} µs, CPU scale {}",
            self.name,
            short(self.fabric_rtt_us),
            limit(self.kn_nic_round_trips_per_s, " RT/s"),
            limit(self.dpm_nic_round_trips_per_s, " RT/s"),
            limit(self.link_gbps, " Gb/s"),
            limit(self.kn_cores, ""),
            limit(self.dpm_threads, ""),
            short(self.client_rtt_us),
            short(self.cpu_scale)
        );
        if self.shared_cores > 0.0 {
            let _ = write!(
                s,
                ", everything on {} shared cores",
                short(self.shared_cores)
            );
        }
        s
    }

    fn link_bytes_per_s(&self) -> f64 {
        self.link_gbps * 1e9 / 8.0
    }
}

/// A profile as a TOML file or flags give it: every key is optional, and the rest comes from `base` (default
/// `paper`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileSettings {
    /// The preset the other keys change (default paper).
    pub base: Option<ProfilePreset>,
    /// See [`HardwareProfile`] for each key.
    pub name: Option<String>,
    #[allow(missing_docs)]
    pub fabric_rtt_us: Option<f64>,
    #[allow(missing_docs)]
    pub kn_nic_round_trips_per_s: Option<f64>,
    #[allow(missing_docs)]
    pub dpm_nic_round_trips_per_s: Option<f64>,
    #[allow(missing_docs)]
    pub link_gbps: Option<f64>,
    #[allow(missing_docs)]
    pub kn_cores: Option<f64>,
    #[allow(missing_docs)]
    pub dpm_threads: Option<f64>,
    #[allow(missing_docs)]
    pub clients: Option<u32>,
    #[allow(missing_docs)]
    pub outstanding: Option<u32>,
    #[allow(missing_docs)]
    pub client_rtt_us: Option<f64>,
    #[allow(missing_docs)]
    pub cpu_scale: Option<f64>,
    #[allow(missing_docs)]
    pub shared_cores: Option<f64>,
}

impl ProfileSettings {
    /// Reads a TOML profile (`base = "local"`, `fabric_rtt_us = 3.0`, ...); unknown keys are refused.
    pub fn from_toml(text: &str) -> Result<ProfileSettings, ProjectError> {
        toml::from_str(text).map_err(|e| ProjectError::ProfileFile(e.to_string()))
    }

    /// `other`'s keys over these.
    pub fn overlay(&self, other: &ProfileSettings) -> ProfileSettings {
        ProfileSettings {
            base: other.base.or(self.base),
            name: other.name.clone().or_else(|| self.name.clone()),
            fabric_rtt_us: other.fabric_rtt_us.or(self.fabric_rtt_us),
            kn_nic_round_trips_per_s: other
                .kn_nic_round_trips_per_s
                .or(self.kn_nic_round_trips_per_s),
            dpm_nic_round_trips_per_s: other
                .dpm_nic_round_trips_per_s
                .or(self.dpm_nic_round_trips_per_s),
            link_gbps: other.link_gbps.or(self.link_gbps),
            kn_cores: other.kn_cores.or(self.kn_cores),
            dpm_threads: other.dpm_threads.or(self.dpm_threads),
            clients: other.clients.or(self.clients),
            outstanding: other.outstanding.or(self.outstanding),
            client_rtt_us: other.client_rtt_us.or(self.client_rtt_us),
            cpu_scale: other.cpu_scale.or(self.cpu_scale),
            shared_cores: other.shared_cores.or(self.shared_cores),
        }
    }

    /// The profile: the base preset (`cores` for [`ProfilePreset::Local`]) with these keys applied, checked.
    pub fn resolve(&self, cores: usize) -> Result<HardwareProfile, ProjectError> {
        let mut p = HardwareProfile::preset(self.base.unwrap_or(ProfilePreset::Paper), cores);
        let mut changed = false;
        macro_rules! set {
            ($($field:ident),*) => {$(
                if let Some(v) = self.$field.clone() {
                    p.$field = v;
                    changed = true;
                }
            )*};
        }
        set!(
            fabric_rtt_us,
            kn_nic_round_trips_per_s,
            dpm_nic_round_trips_per_s,
            link_gbps,
            kn_cores,
            dpm_threads,
            clients,
            outstanding,
            client_rtt_us,
            cpu_scale,
            shared_cores
        );
        match &self.name {
            Some(name) => p.name = name.clone(),
            None if changed => p.name.push_str(", modified"),
            None => {}
        }
        p.validate()?;
        Ok(p)
    }
}

/// A part of the system whose capacity limits throughput.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Component {
    /// The KV nodes' cores.
    KnCpu,
    /// The KV nodes' NICs (messages).
    KnNic,
    /// The KV nodes' links (bytes).
    KnLink,
    /// The memory node's NIC (messages), shared by every KV node.
    DpmNic,
    /// The memory node's link (bytes), shared by every KV node.
    DpmLink,
    /// The memory node's processor threads (merge and RPC).
    DpmProcessor,
    /// The closed-loop clients: requests in flight over the lowest possible latency.
    Clients,
    /// Cores shared by everything (one machine).
    SharedCpu,
}

impl Component {
    /// Every component, in table order.
    pub const ALL: [Component; 8] = [
        Component::KnCpu,
        Component::KnNic,
        Component::KnLink,
        Component::DpmNic,
        Component::DpmLink,
        Component::DpmProcessor,
        Component::Clients,
        Component::SharedCpu,
    ];

    /// Its name for people.
    pub fn name(self) -> &'static str {
        match self {
            Component::KnCpu => "KV-node CPU",
            Component::KnNic => "KV-node NIC",
            Component::KnLink => "KV-node link",
            Component::DpmNic => "memory-node NIC",
            Component::DpmLink => "memory-node link",
            Component::DpmProcessor => "memory-node processor",
            Component::Clients => "clients",
            Component::SharedCpu => "shared cores",
        }
    }

    /// A short column heading.
    fn column(self) -> &'static str {
        match self {
            Component::KnCpu => "KN cpu",
            Component::KnNic => "KN nic",
            Component::KnLink => "KN link",
            Component::DpmNic => "MN nic",
            Component::DpmLink => "MN link",
            Component::DpmProcessor => "MN proc",
            Component::Clients => "clients",
            Component::SharedCpu => "shared",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Component::KnCpu => "kn_cpu",
            Component::KnNic => "kn_nic",
            Component::KnLink => "kn_link",
            Component::DpmNic => "dpm_nic",
            Component::DpmLink => "dpm_link",
            Component::DpmProcessor => "dpm_processor",
            Component::Clients => "clients",
            Component::SharedCpu => "shared_cpu",
        }
    }
}

impl std::fmt::Display for Component {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What one operation costs, from one measured run (or the mean of runs with the same node count).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Demand {
    /// KV nodes of the run.
    pub kv_nodes: usize,
    /// Runs averaged.
    pub runs: usize,
    /// Measured throughput, ops/s.
    pub measured_ops_per_s: f64,
    /// Fabric round trips.
    pub round_trips: f64,
    /// Fabric bytes in the busier direction (KV nodes to the memory node, or back).
    pub fabric_bytes: f64,
    /// CPU µs of KV-node workers and network threads; `None` when the run could not read CPU times.
    pub kn_cpu_us: Option<f64>,
    /// CPU µs of the memory node's merge and RPC threads.
    pub dpm_cpu_us: Option<f64>,
    /// CPU µs of the clients.
    pub client_cpu_us: Option<f64>,
    /// CPU µs of everything, other threads of the process included.
    pub total_cpu_us: Option<f64>,
    /// The busiest node's share of the work × the node count (1: perfectly even).
    pub imbalance: f64,
    /// Client threads of the run.
    pub clients: usize,
    /// Requests each kept in flight.
    pub outstanding: usize,
    /// A pDPM store's run: its compute nodes' work runs on the benchmark's client threads, so their CPU time is
    /// counted here as KV-node (compute-node) CPU and `client_cpu_us` is absent.
    #[serde(default)]
    pub compute_on_clients: bool,
}

impl Demand {
    /// What `r` measured per operation; `None` when its node count or its resources are unknown (a run through
    /// RESP).
    pub fn of(r: &YcsbReport) -> Option<Demand> {
        let kv_nodes = r.kv_nodes?;
        let resources = r.resources.as_ref()?;
        let p = &resources.per_op;
        let sum = |parts: &[Option<f64>]| -> Option<f64> { parts.iter().copied().sum() };
        let ops = r.measured.ops.max(1) as f64;
        let total = resources
            .cpu_ns
            .as_ref()
            .map(|c| c.values().sum::<u64>() as f64 / 1e3 / ops);
        let busiest = r.nodes.iter().map(|n| n.load_share).fold(0.0, f64::max);
        let imbalance = if r.nodes.is_empty() || busiest <= 0.0 {
            1.0
        } else {
            (busiest * r.nodes.len() as f64).max(1.0)
        };
        // A pDPM store (Clover, DirectDS, CentralDS) has no KV-node threads: each client thread is a compute node
        // doing the store's work in its own library, so its CPU time, workload generation included (an
        // overstatement of a few percent), is the compute node's; nothing is left on the clients' side. The
        // metadata server's or coordinator's RPC time is its memory node's.
        let compute_on_clients = r
            .system
            .parse::<crate::ycsb_run::System>()
            .is_ok_and(|s| s.is_pdpm());
        let (kn_cpu_us, client_cpu_us) = if compute_on_clients {
            (p.client_cpu_us, None)
        } else {
            (
                sum(&[p.kn_worker_cpu_us, p.kn_network_cpu_us]),
                p.client_cpu_us,
            )
        };
        Some(Demand {
            kv_nodes,
            runs: 1,
            measured_ops_per_s: r.measured.ops_per_s,
            round_trips: p.round_trips,
            fabric_bytes: p.bytes_out.max(p.bytes_in),
            kn_cpu_us,
            dpm_cpu_us: sum(&[p.memory_merge_cpu_us, p.memory_rpc_cpu_us]),
            client_cpu_us,
            total_cpu_us: total,
            imbalance,
            clients: r.options.clients,
            outstanding: r.options.outstanding,
            compute_on_clients,
        })
    }

    /// The mean of several demands of one node count.
    fn mean(all: &[Demand]) -> Demand {
        let n = all.len().max(1) as f64;
        let avg = |f: fn(&Demand) -> f64| all.iter().map(f).sum::<f64>() / n;
        let avg_opt = |f: fn(&Demand) -> Option<f64>| -> Option<f64> {
            all.iter().map(f).sum::<Option<f64>>().map(|s| s / n)
        };
        Demand {
            kv_nodes: all.first().map_or(0, |d| d.kv_nodes),
            runs: all.iter().map(|d| d.runs).sum(),
            measured_ops_per_s: avg(|d| d.measured_ops_per_s),
            round_trips: avg(|d| d.round_trips),
            fabric_bytes: avg(|d| d.fabric_bytes),
            kn_cpu_us: avg_opt(|d| d.kn_cpu_us),
            dpm_cpu_us: avg_opt(|d| d.dpm_cpu_us),
            client_cpu_us: avg_opt(|d| d.client_cpu_us),
            total_cpu_us: avg_opt(|d| d.total_cpu_us),
            imbalance: avg(|d| d.imbalance),
            clients: all.first().map_or(0, |d| d.clients),
            outstanding: all.first().map_or(0, |d| d.outstanding),
            compute_on_clients: all.iter().any(|d| d.compute_on_clients),
        }
    }
}

/// One component's ceiling at one node count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ceiling {
    /// The component.
    pub component: Component,
    /// Most operations per second it allows; `None` when it does not limit (see `note`).
    pub ops_per_s: Option<f64>,
    /// Why there is no number: "no limit in the profile", "not measured".
    pub note: Option<String>,
}

/// The ceilings of every component for `kv_nodes` nodes, given `d` and `p`.
pub fn ceilings(d: &Demand, p: &HardwareProfile, kv_nodes: usize) -> Vec<Ceiling> {
    let n = kv_nodes as f64;
    let s = p.cpu_scale;
    let unlimited = |c| Ceiling {
        component: c,
        ops_per_s: None,
        note: Some("no limit in the profile".into()),
    };
    let unmeasured = |c, what: &str| Ceiling {
        component: c,
        ops_per_s: None,
        note: Some(format!("not measured ({what})")),
    };
    let unused = |c, what: &str| Ceiling {
        component: c,
        ops_per_s: None,
        note: Some(format!("not used ({what})")),
    };
    let limit = |c, v: f64| Ceiling {
        component: c,
        ops_per_s: Some(v),
        note: None,
    };
    // capacity / demand, where a demand of 0 means the component is not used.
    let ratio = |c, capacity: f64, demand: Option<f64>, what: &str| match demand {
        _ if capacity <= 0.0 => unlimited(c),
        None => unmeasured(c, what),
        Some(dm) if dm <= 0.0 => unused(c, what),
        Some(dm) => limit(c, capacity / dm),
    };
    let link = p.link_bytes_per_s();
    let mut out = vec![
        ratio(
            Component::KnCpu,
            n * p.kn_cores * 1e6,
            d.kn_cpu_us.map(|c| c * s * d.imbalance),
            "KV-node CPU time",
        ),
        ratio(
            Component::KnNic,
            n * p.kn_nic_round_trips_per_s,
            Some(d.round_trips * d.imbalance),
            "no fabric round trips",
        ),
        ratio(
            Component::KnLink,
            n * link,
            Some(d.fabric_bytes * d.imbalance),
            "no fabric bytes",
        ),
        ratio(
            Component::DpmNic,
            p.dpm_nic_round_trips_per_s,
            Some(d.round_trips),
            "no fabric round trips",
        ),
        ratio(
            Component::DpmLink,
            link,
            Some(d.fabric_bytes),
            "no fabric bytes",
        ),
        ratio(
            Component::DpmProcessor,
            p.dpm_threads * 1e6,
            d.dpm_cpu_us.map(|c| c * s),
            "memory-node CPU time",
        ),
    ];
    let clients = if p.clients == 0 {
        d.clients
    } else {
        p.clients as usize
    };
    let outstanding = if p.outstanding == 0 {
        d.outstanding
    } else {
        p.outstanding as usize
    };
    // The least time an operation can take: its network round trips and the CPU work on its path (unknown CPU
    // counts as none, which only raises the bound).
    let floor_us = p.client_rtt_us
        + d.round_trips * p.fabric_rtt_us
        + s * (d.kn_cpu_us.unwrap_or(0.0) + d.client_cpu_us.unwrap_or(0.0));
    out.push(if floor_us > 0.0 {
        limit(
            Component::Clients,
            (clients * outstanding) as f64 * 1e6 / floor_us,
        )
    } else {
        unmeasured(Component::Clients, "no latency on an operation's path")
    });
    out.push(ratio(
        Component::SharedCpu,
        p.shared_cores * 1e6,
        d.total_cpu_us.map(|c| c * s),
        "CPU time",
    ));
    out
}

/// The lowest ceiling: (ops/s, component).
fn lowest(ceilings: &[Ceiling]) -> Option<(f64, Component)> {
    ceilings
        .iter()
        .filter_map(|c| c.ops_per_s.map(|v| (v, c.component)))
        .min_by(|a, b| a.0.total_cmp(&b.0))
}

/// The projection at one node count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProjectedPoint {
    /// KV nodes.
    pub kv_nodes: usize,
    /// Node count of the measured run whose per-op resources were used.
    pub from_kv_nodes: usize,
    /// Predicted throughput, ops/s: the lowest ceiling.
    pub predicted_ops_per_s: f64,
    /// The component whose ceiling that is.
    pub bound_by: Component,
    /// Every component's ceiling.
    pub ceilings: Vec<Ceiling>,
    /// Measured throughput at this node count, if a run had it.
    pub measured_ops_per_s: Option<f64>,
}

/// The model against one measured run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCheck {
    /// KV nodes of the run.
    pub kv_nodes: usize,
    /// What it measured, ops/s.
    pub measured_ops_per_s: f64,
    /// Predicted from its own per-op resources.
    pub predicted_ops_per_s: f64,
    /// The component that binds there.
    pub bound_by: Component,
    /// `predicted / measured − 1`.
    pub error: f64,
    /// The nearest other measured node count, if any, and the prediction from its per-op resources.
    pub from_other: Option<OtherPrediction>,
}

/// A prediction for one run from another run's per-op resources.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OtherPrediction {
    /// Node count of the run used.
    pub from_kv_nodes: usize,
    /// Predicted throughput.
    pub predicted_ops_per_s: f64,
    /// `predicted / measured − 1`.
    pub error: f64,
}

impl ModelCheck {
    /// Whether the prediction from the run's own resources is within `tolerance` (0.25: 25%) of what it measured.
    pub fn within(&self, tolerance: f64) -> bool {
        self.error.abs() <= tolerance
    }
}

/// The projection of one series of runs (one workload, distribution, value size and pipeline depth).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeriesProjection {
    /// What the runs have in common.
    pub label: String,
    /// Per-op resources of each measured node count.
    pub measured: Vec<Demand>,
    /// 1 to `max_kns` KV nodes.
    pub points: Vec<ProjectedPoint>,
    /// The model against each measured run.
    pub checks: Vec<ModelCheck>,
}

/// A whole projection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Projection {
    /// [`MODEL_NOTE`].
    pub model: String,
    /// The hardware described.
    pub profile: HardwareProfile,
    /// Largest node count projected.
    pub max_kns: usize,
    /// One per series of runs.
    pub series: Vec<SeriesProjection>,
    /// Things the reader should know (runs without CPU times, runs from different machines).
    pub warnings: Vec<String>,
}

/// The measured demand nearest to `kv_nodes` (ties: the smaller node count).
fn nearest<'a>(
    measured: impl IntoIterator<Item = &'a Demand>,
    kv_nodes: usize,
) -> Option<&'a Demand> {
    measured
        .into_iter()
        .min_by_key(|d| (d.kv_nodes.abs_diff(kv_nodes), d.kv_nodes))
}

/// Projects `runs` onto `profile` for 1 to `max_kns` KV nodes.
pub fn project(
    runs: &[YcsbReport],
    profile: &HardwareProfile,
    max_kns: usize,
) -> Result<Projection, ProjectError> {
    profile.validate()?;
    if !(1..=MAX_PROJECTED_KNS).contains(&max_kns) {
        return Err(ProjectError::BadProfile(format!(
            "the largest node count must be 1 to {MAX_PROJECTED_KNS} (got {max_kns})"
        )));
    }
    // A run through RESP cannot see the resources the model is built from.
    let usable: Vec<(&YcsbReport, Demand)> = runs
        .iter()
        .filter(|r| r.measured.ops > 0 && r.kv_nodes.is_some_and(|n| n > 0))
        .filter_map(|r| Some((r, Demand::of(r)?)))
        .collect();
    if usable.is_empty() {
        return Err(ProjectError::NoRuns(format!(
            "{} run(s) given, none completed an operation with the KV nodes' counters read",
            runs.len()
        )));
    }
    let mut warnings = Vec::new();
    let skipped = runs.len() - usable.len();
    if skipped > 0 {
        warnings.push(format!(
            "{skipped} run(s) without completed operations or without the KV nodes' counters (RESP) left out"
        ));
    }
    let no_cpu = usable
        .iter()
        .filter(|(r, _)| r.resources.as_ref().is_some_and(|x| x.cpu_ns.is_none()))
        .count();
    if no_cpu > 0 {
        warnings.push(format!(
            "{no_cpu} run(s) have no CPU times (a running cluster measured from outside): CPU ceilings are left out \
             for them, so the prediction can only be higher than the truth"
        ));
    }
    let mut hosts: Vec<usize> = usable.iter().map(|(r, _)| r.host.cores).collect();
    hosts.sort_unstable();
    hosts.dedup();
    if hosts.len() > 1 {
        warnings.push(format!(
            "the runs come from machines with different core counts ({hosts:?}): their per-op CPU times may not \
             compare"
        ));
    }
    let on_clients = usable.iter().filter(|(_, d)| d.compute_on_clients).count();
    if on_clients > 0 {
        warnings.push(format!(
            "{on_clients} run(s) of a pDPM store: its compute nodes are the client threads, so their CPU time \
             (workload generation included) is counted as KV-node CPU, the metadata server's as the memory node's, \
             and the KV-node NIC ceiling is the compute nodes' fabric traffic"
        ));
    }
    let errors: u64 = usable.iter().map(|(r, _)| r.measured.errors.total()).sum();
    if errors > 0 {
        warnings.push(format!(
            "the runs had {errors} failed operation(s): their throughput counts only completed ones"
        ));
    }

    let mut groups: BTreeMap<String, BTreeMap<usize, Vec<Demand>>> = BTreeMap::new();
    for (r, demand) in usable {
        groups
            .entry(series_label(r))
            .or_default()
            .entry(demand.kv_nodes)
            .or_default()
            .push(demand);
    }
    let mut series = Vec::new();
    for (label, by_nodes) in groups {
        let measured: Vec<Demand> = by_nodes.values().map(|d| Demand::mean(d)).collect();
        let mut points = Vec::with_capacity(max_kns);
        for n in 1..=max_kns {
            let Some(d) = nearest(&measured, n) else {
                continue;
            };
            let cs = ceilings(d, profile, n);
            let (predicted, bound_by) =
                lowest(&cs).ok_or_else(|| ProjectError::Unbounded(label.clone()))?;
            points.push(ProjectedPoint {
                kv_nodes: n,
                from_kv_nodes: d.kv_nodes,
                predicted_ops_per_s: predicted,
                bound_by,
                ceilings: cs,
                measured_ops_per_s: measured
                    .iter()
                    .find(|m| m.kv_nodes == n)
                    .map(|m| m.measured_ops_per_s),
            });
        }
        let mut checks = Vec::new();
        for d in &measured {
            let Some((predicted, bound_by)) = lowest(&ceilings(d, profile, d.kv_nodes)) else {
                return Err(ProjectError::Unbounded(label.clone()));
            };
            let err = |p: f64| {
                if d.measured_ops_per_s > 0.0 {
                    p / d.measured_ops_per_s - 1.0
                } else {
                    f64::INFINITY
                }
            };
            let others = measured.iter().filter(|o| o.kv_nodes != d.kv_nodes);
            let from_other = nearest(others, d.kv_nodes).and_then(|o| {
                lowest(&ceilings(o, profile, d.kv_nodes)).map(|(p, _)| OtherPrediction {
                    from_kv_nodes: o.kv_nodes,
                    predicted_ops_per_s: p,
                    error: err(p),
                })
            });
            checks.push(ModelCheck {
                kv_nodes: d.kv_nodes,
                measured_ops_per_s: d.measured_ops_per_s,
                predicted_ops_per_s: predicted,
                bound_by,
                error: err(predicted),
                from_other,
            });
        }
        series.push(SeriesProjection {
            label,
            measured,
            points,
            checks,
        });
    }
    Ok(Projection {
        model: MODEL_NOTE.to_string(),
        profile: profile.clone(),
        max_kns,
        series,
        warnings,
    })
}

/// A number without needless digits: 2, 0.0084, 25M.
fn short(v: f64) -> String {
    if v >= 1e6 {
        rate(v)
    } else {
        let s = format!("{v:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn opt_us(v: Option<f64>) -> String {
    v.map_or("?".to_string(), |v| format!("{v:.2}"))
}

impl Projection {
    /// Whether every check's own-resource prediction is within `tolerance`.
    pub fn all_within(&self, tolerance: f64) -> bool {
        self.series
            .iter()
            .flat_map(|s| &s.checks)
            .all(|c| c.within(tolerance))
    }

    /// The projection for people: the model note, the profile, and per series the per-op resources, a row per
    /// node count and the checks.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "{}", self.model);
        let _ = writeln!(s, "profile: {}", self.profile.describe());
        for w in &self.warnings {
            let _ = writeln!(s, "warning: {w}");
        }
        for series in &self.series {
            let _ = writeln!(s, "\nseries: {}", series.label);
            for d in &series.measured {
                let _ = writeln!(
                    s,
                    "  measured at {} KV node(s) ({} run(s)): {} ops/s; per op {:.3} round trips, {:.0} fabric bytes, \
                     CPU µs: KV node {}, memory node {}, client {}, all {}; imbalance {:.2}",
                    d.kv_nodes,
                    d.runs,
                    rate(d.measured_ops_per_s),
                    d.round_trips,
                    d.fabric_bytes,
                    opt_us(d.kn_cpu_us),
                    opt_us(d.dpm_cpu_us),
                    opt_us(d.client_cpu_us),
                    opt_us(d.total_cpu_us),
                    d.imbalance
                );
            }
            let _ = write!(
                s,
                "  {:>4}  {:>4}  {:>9}  {:<22}",
                "KNs", "from", "predicted", "bound by"
            );
            for c in Component::ALL {
                let _ = write!(s, " {:>8}", c.column());
            }
            let _ = writeln!(s, " {:>9}", "measured");
            for p in &series.points {
                let _ = write!(
                    s,
                    "  {:>4}  {:>4}  {:>9}  {:<22}",
                    p.kv_nodes,
                    p.from_kv_nodes,
                    rate(p.predicted_ops_per_s),
                    p.bound_by.name()
                );
                for c in &p.ceilings {
                    let _ = write!(s, " {:>8}", c.ops_per_s.map_or("-".into(), rate));
                }
                let _ = writeln!(
                    s,
                    " {:>9}",
                    p.measured_ops_per_s.map_or(String::new(), rate)
                );
            }
            if !series.checks.is_empty() {
                let _ = writeln!(
                    s,
                    "  model against the measured runs (a test of the model only when the profile describes the \
                     machine they ran on):"
                );
            }
            for c in &series.checks {
                let _ = write!(
                    s,
                    "    {} KV node(s): measured {}, predicted {} from its own run ({:+.1}%, {})",
                    c.kv_nodes,
                    rate(c.measured_ops_per_s),
                    rate(c.predicted_ops_per_s),
                    c.error * 100.0,
                    c.bound_by
                );
                if let Some(o) = &c.from_other {
                    let _ = write!(
                        s,
                        "; {} from the {}-node run ({:+.1}%)",
                        rate(o.predicted_ops_per_s),
                        o.from_kv_nodes,
                        o.error * 100.0
                    );
                }
                s.push('\n');
            }
        }
        s
    }

    /// One row per series and node count: the prediction, what binds, every ceiling and the measurement.
    pub fn to_csv(&self) -> String {
        let mut s = String::from("series,kv_nodes,from_kv_nodes,predicted_ops_per_s,bound_by");
        for c in Component::ALL {
            let _ = write!(s, ",{}", c.key());
        }
        s.push_str(",measured_ops_per_s\n");
        for series in &self.series {
            for p in &series.points {
                let _ = write!(
                    s,
                    "\"{}\",{},{},{:.0},{}",
                    series.label.replace('"', "'"),
                    p.kv_nodes,
                    p.from_kv_nodes,
                    p.predicted_ops_per_s,
                    p.bound_by.key()
                );
                for c in &p.ceilings {
                    let _ = write!(
                        s,
                        ",{}",
                        c.ops_per_s.map_or(String::new(), |v| format!("{v:.0}"))
                    );
                }
                let _ = writeln!(
                    s,
                    ",{}",
                    p.measured_ops_per_s
                        .map_or(String::new(), |v| format!("{v:.0}"))
                );
            }
        }
        s
    }

    /// The predicted throughput of every series against the node count (with the measured points), then per
    /// series the ceilings that come within 3× of its prediction somewhere.
    pub fn to_svg(&self) -> String {
        let mut throughput = Vec::new();
        for series in &self.series {
            throughput.push(svg::Series {
                name: format!("model: {}", series.label),
                points: series
                    .points
                    .iter()
                    .map(|p| (p.kv_nodes as f64, p.predicted_ops_per_s / 1e3))
                    .collect(),
            });
            throughput.push(svg::Series {
                name: format!("measured: {}", series.label),
                points: series
                    .measured
                    .iter()
                    .map(|d| (d.kv_nodes as f64, d.measured_ops_per_s / 1e3))
                    .collect(),
            });
        }
        let mut ceiling_series = Vec::new();
        for series in &self.series {
            let mut lines = vec![svg::Series {
                name: "predicted".into(),
                points: series
                    .points
                    .iter()
                    .map(|p| (p.kv_nodes as f64, p.predicted_ops_per_s / 1e3))
                    .collect(),
            }];
            for c in Component::ALL {
                let pts: Vec<(f64, f64, f64)> = series
                    .points
                    .iter()
                    .filter_map(|p| {
                        p.ceilings
                            .iter()
                            .find(|x| x.component == c)
                            .and_then(|x| x.ops_per_s)
                            .map(|v| (p.kv_nodes as f64, v, p.predicted_ops_per_s))
                    })
                    .collect();
                if pts.iter().any(|&(_, v, pred)| v <= 3.0 * pred) {
                    lines.push(svg::Series {
                        name: c.name().into(),
                        points: pts.iter().map(|&(x, v, _)| (x, v / 1e3)).collect(),
                    });
                }
            }
            ceiling_series.push((format!("Ceilings: {}", series.label), lines));
        }
        let title = format!("MODEL: projected throughput ({})", self.profile.name);
        let mut panels = vec![svg::Panel {
            title: &title,
            x_label: "KV nodes",
            y_label: "Kops/s",
            log2_x: false,
            series: &throughput,
        }];
        for (title, lines) in &ceiling_series {
            panels.push(svg::Panel {
                title,
                x_label: "KV nodes",
                y_label: "Kops/s",
                log2_x: false,
                series: lines,
            });
        }
        svg::render(&panels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demand() -> Demand {
        Demand {
            kv_nodes: 1,
            runs: 1,
            measured_ops_per_s: 30_000.0,
            round_trips: 0.5,
            fabric_bytes: 600.0,
            kn_cpu_us: Some(40.0),
            dpm_cpu_us: Some(0.5),
            client_cpu_us: Some(15.0),
            total_cpu_us: Some(60.0),
            imbalance: 1.0,
            clients: 8,
            outstanding: 1,
            compute_on_clients: false,
        }
    }

    fn value(cs: &[Ceiling], c: Component) -> Option<f64> {
        cs.iter()
            .find(|x| x.component == c)
            .and_then(|x| x.ops_per_s)
    }

    #[test]
    fn each_ceiling_follows_its_formula() {
        let d = demand();
        let p = HardwareProfile::paper();
        let cs = ceilings(&d, &p, 4);
        let close = |a: Option<f64>, b: f64| {
            let a = a.expect("a ceiling");
            assert!((a - b).abs() <= 1e-6 * b, "{a} vs {b}");
        };
        close(value(&cs, Component::KnCpu), 4.0 * 8.0 * 1e6 / 40.0);
        close(value(&cs, Component::KnNic), 4.0 * 25e6 / 0.5);
        close(value(&cs, Component::KnLink), 4.0 * 7e9 / 600.0);
        close(value(&cs, Component::DpmNic), 25e6 / 0.5);
        close(value(&cs, Component::DpmLink), 7e9 / 600.0);
        close(value(&cs, Component::DpmProcessor), 4.0 * 1e6 / 0.5);
        close(
            value(&cs, Component::Clients),
            512.0 * 1e6 / (20.0 + 0.5 * 2.0 + 40.0 + 15.0),
        );
        assert_eq!(value(&cs, Component::SharedCpu), None, "no shared cores");
        assert_eq!(lowest(&cs).unwrap(), (800_000.0, Component::KnCpu));
    }

    #[test]
    fn imbalance_and_cpu_scale_move_the_node_ceilings() {
        let d = Demand {
            imbalance: 2.0,
            ..demand()
        };
        let p = HardwareProfile {
            cpu_scale: 0.5,
            ..HardwareProfile::paper()
        };
        let cs = ceilings(&d, &p, 2);
        // 2 nodes × 8 cores / (40 µs × 0.5 × 2).
        assert_eq!(value(&cs, Component::KnCpu), Some(2.0 * 8.0 * 1e6 / 40.0));
        // The shared memory node does not care how the work is spread.
        assert_eq!(value(&cs, Component::DpmNic), Some(25e6 / 0.5));
        assert_eq!(value(&cs, Component::DpmProcessor), Some(4.0 * 1e6 / 0.25));
    }

    #[test]
    fn local_profile_is_bound_by_the_shared_cores() {
        let d = demand();
        let p = HardwareProfile::local(2);
        let cs = ceilings(&d, &p, 1);
        assert_eq!(value(&cs, Component::SharedCpu), Some(2e6 / 60.0));
        for c in [
            Component::KnNic,
            Component::KnLink,
            Component::DpmNic,
            Component::DpmLink,
        ] {
            assert_eq!(value(&cs, c), None, "{c}: the in-process fabric has no NIC");
        }
        // The run's own 8 clients × 1 in flight over 0.0042 + 55 µs of work.
        let clients = value(&cs, Component::Clients).unwrap();
        assert!((clients - 8e6 / (0.5 * IN_PROCESS_RTT_US + 55.0)).abs() < 1e-3);
        assert_eq!(lowest(&cs).unwrap().1, Component::SharedCpu);
    }

    #[test]
    fn unknown_cpu_leaves_those_ceilings_out() {
        let d = Demand {
            kn_cpu_us: None,
            dpm_cpu_us: None,
            client_cpu_us: None,
            total_cpu_us: None,
            ..demand()
        };
        let cs = ceilings(&d, &HardwareProfile::local(2), 1);
        assert_eq!(value(&cs, Component::KnCpu), None);
        assert_eq!(value(&cs, Component::SharedCpu), None);
        let note = cs
            .iter()
            .find(|c| c.component == Component::SharedCpu)
            .and_then(|c| c.note.clone())
            .unwrap();
        assert!(note.contains("not measured"), "{note}");
    }

    #[test]
    fn profiles_parse_from_toml_over_a_base() {
        let s = ProfileSettings::from_toml("base = \"local\"\nfabric_rtt_us = 3.5\nclients = 16\n")
            .unwrap();
        let p = s.resolve(4).unwrap();
        assert_eq!(p.shared_cores, 4.0);
        assert_eq!(p.fabric_rtt_us, 3.5);
        assert_eq!(p.clients, 16);
        assert!(p.name.ends_with("modified"), "{}", p.name);
        let paper = ProfileSettings::from_toml("").unwrap().resolve(4).unwrap();
        assert_eq!(paper, HardwareProfile::paper());
        assert!(
            ProfileSettings::from_toml("fabric_rtt = 3").is_err(),
            "unknown key"
        );
        assert!(ProfileSettings::from_toml("base = \"moon\"").is_err());
        let bad = ProfileSettings {
            cpu_scale: Some(0.0),
            ..ProfileSettings::default()
        };
        assert!(bad.resolve(2).is_err());
        let negative = ProfileSettings {
            link_gbps: Some(-1.0),
            ..ProfileSettings::default()
        };
        assert!(negative.resolve(2).is_err());
        let flags = ProfileSettings {
            kn_cores: Some(16.0),
            ..ProfileSettings::default()
        };
        let merged = s.overlay(&flags).resolve(4).unwrap();
        assert_eq!((merged.kn_cores, merged.fabric_rtt_us), (16.0, 3.5));
    }

    #[test]
    fn nearest_prefers_the_smaller_count_on_ties() {
        let at = |n| Demand {
            kv_nodes: n,
            ..demand()
        };
        let m = [at(1), at(4)];
        assert_eq!(nearest(&m, 2).unwrap().kv_nodes, 1);
        assert_eq!(nearest(&m, 3).unwrap().kv_nodes, 4);
        assert_eq!(nearest(&m, 16).unwrap().kv_nodes, 4);
        let tie = [at(1), at(3)];
        assert_eq!(nearest(&tie, 2).unwrap().kv_nodes, 1);
    }
}
