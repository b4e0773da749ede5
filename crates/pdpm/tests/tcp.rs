//! Every baseline over the TCP transport on 127.0.0.1: the same answers and round trips as in-process.

mod common;

use std::time::Duration;

use anyhow::Result;
use common::{Nodes, connector, serve_coordinator, serve_metadata, traffic};
use dinomo_fabric::NodeConfig;
use dinomo_pdpm::PdpmStore;
use dinomo_pdpm::central::{
    self, CentralClient, CentralLayout, CentralSettings, Coordinator, CoordinatorConfig,
};
use dinomo_pdpm::clover::{
    self, CloverClient, CloverLayout, CloverSettings, MetadataConfig, MetadataServer,
};
use dinomo_pdpm::direct::{self, DirectClient, DirectLayout, DirectSettings, Flavor};

#[test]
fn every_baseline_works_over_tcp_with_the_papers_round_trips() -> Result<()> {
    for flavor in [Flavor::Markers, Flavor::Crc] {
        let layout = DirectLayout {
            flavor,
            slots: 64,
            replication: 2,
            ..DirectLayout::default()
        };
        let n = Nodes::new(2, |pool| direct::format(pool, &layout).unwrap());
        let mut c = DirectClient::connect(&n.connectors(true), DirectSettings::default())?;
        let mut other = DirectClient::connect(&n.connectors(true), DirectSettings::default())?;
        c.put(b"k", b"v1")?;
        let steps = c.protocol_steps();
        let (r, t) = traffic(|| c.put(b"k", &[9u8; 1000]));
        r?;
        assert_eq!((t.round_trips, c.protocol_steps() - steps), (10, 6));
        let (r, t) = traffic(|| other.get(b"k"));
        assert_eq!(r?, Some(vec![9u8; 1000]));
        assert_eq!(t.round_trips, if flavor == Flavor::Markers { 3 } else { 1 });
        other.delete(b"k")?;
        assert_eq!(c.get(b"k")?, None);
    }

    let layout = CentralLayout {
        blocks: 64,
        ..CentralLayout::default()
    };
    let memory = Nodes::new(2, |pool| central::format(pool, &layout).unwrap());
    let coordinator = Coordinator::new(&memory.connectors(true), CoordinatorConfig::default())?;
    let (host, server) = serve_coordinator(&coordinator, NodeConfig::default().rpc_threads);
    let coord = connector(&host, &server, true);
    let mut c =
        CentralClient::connect(&coord, &memory.connectors(true), CentralSettings::default())?;
    c.refill()?;
    let (r, t) = traffic(|| c.put(b"k", &[3u8; 1000]));
    r?;
    assert_eq!(t.round_trips, 3);
    let (r, t) = traffic(|| c.get(b"k"));
    assert_eq!(r?, Some(vec![3u8; 1000]));
    assert_eq!(t.round_trips, 2);
    c.delete(b"k")?;
    assert_eq!(c.get(b"k")?, None);

    for replication in [1u32, 2] {
        let layout = CloverLayout {
            cells: 64,
            slots: 64,
            replication,
            ..CloverLayout::default()
        };
        let memory = Nodes::new(2, |pool| clover::format(pool, &layout).unwrap());
        // Long leases: a READ abandoned after a scheduling stall would add a round trip.
        let ms = MetadataServer::new(
            &memory.connectors(true),
            MetadataConfig {
                reclaim_lease: Duration::from_secs(4),
                ..MetadataConfig::default()
            },
        )?;
        let settings = CloverSettings {
            read_timeout: Duration::from_secs(2),
            ..CloverSettings::default()
        };
        let (host, server) = serve_metadata(&ms, NodeConfig::default().rpc_threads);
        let ms_connector = connector(&host, &server, true);
        let mut c =
            CloverClient::connect(&ms_connector, &memory.connectors(true), settings.clone())?;
        let mut other =
            CloverClient::connect(&ms_connector, &memory.connectors(true), settings.clone())?;
        c.refill()?;
        c.put(b"k", b"v1")?;
        let steps = c.protocol_steps();
        let (r, t) = traffic(|| c.put(b"k", &[5u8; 1000]));
        r?;
        // R = 1: WRITE with its validating READ, CAS. R = 2: both copies, CAS, the old copies' header words.
        let (want_rts, want_steps) = if replication == 1 { (2, 2) } else { (5, 3) };
        assert_eq!(
            (t.round_trips, c.protocol_steps() - steps),
            (want_rts, want_steps)
        );
        let (r, t) = traffic(|| c.get(b"k"));
        assert_eq!(r?, Some(vec![5u8; 1000]));
        assert_eq!(t.round_trips, 1);
        assert_eq!(other.get(b"k")?, Some(vec![5u8; 1000]));
        other.delete(b"k")?;
        assert_eq!(c.get(b"k")?, None);
    }
    Ok(())
}
