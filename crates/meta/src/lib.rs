//! Cluster metadata store: the cluster record, liveness leases and M-node election; embedded (served by the memory node, persisted in the pool) or etcd.
