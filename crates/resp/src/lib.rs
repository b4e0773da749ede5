//! The Redis protocol front door: every KV node of a dinomo cluster speaks RESP, so redis-cli, redis-benchmark
//! and Redis client libraries work unchanged.
//!
//! - [`parse`]: the incremental request parser (arrays of bulk strings and inline commands, with Redis's limits
//!   and error texts);
//! - [`reply`]: the reply encoder for RESP2 and RESP3 (a connection switches with `HELLO 3`);
//! - [`value`]: whole RESP2/RESP3 values, for clients and tests;
//! - [`command`]: the command table (arity, flags, docs) behind `COMMAND` and the arity and unknown-command
//!   errors;
//! - [`backend`]: what commands run on: a [`Backend`] gives each connection a [`BackendConn`] that executes a
//!   pipeline's key operations together; [`MemoryBackend`] is an in-memory one;
//! - [`glob`]: Redis's glob-style patterns (`KEYS`, `SCAN ... MATCH`);
//! - [`server`]: the threaded server, with pipelining, `requirepass`, protected mode, a client limit and an idle
//!   timeout.

pub mod backend;
mod clients;
pub mod command;
pub mod glob;
pub mod parse;
pub mod reply;
pub mod server;
mod session;
pub mod value;
mod wake;

pub use backend::{
    Backend, BackendConn, BackendError, Effect, FabricCounts, KeysPage, MemoryBackend, Op,
    OpResult, Output, outcome,
};
pub use parse::{ParseLimits, ProtocolError, RequestParser, encode_request};
pub use reply::{Protocol, ReplyWriter};
pub use server::{RespServer, ServerConfig, ServerError, ServerStats, ShutdownHook, StatsHandle};
pub use session::REDIS_COMPAT_VERSION;
pub use value::{Value, ValueError, ValueLimits};
pub use wake::Wake;
