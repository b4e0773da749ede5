//! The elastic cluster: KV-node servers with ownership checks, routing, the native client, the management node and reconfiguration.
