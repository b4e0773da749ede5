//! The command table: every command the server knows, with Redis's arity convention (`n`: exactly n arguments
//! counting the name; `-n`: at least n), flags, key positions, ACL categories and documentation. It drives the
//! arity and unknown-command errors, authentication (only `no_auth` commands run before `AUTH`), and the
//! replies of `COMMAND`, `COMMAND COUNT`, `COMMAND INFO`, `COMMAND DOCS` and `COMMAND LIST`.

use crate::reply::ReplyWriter;

/// What the server runs for a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum CommandId {
    Get,
    Set,
    SetNx,
    GetSet,
    Del,
    Unlink,
    Exists,
    MGet,
    MSet,
    Incr,
    Decr,
    IncrBy,
    DecrBy,
    Append,
    Strlen,
    GetDel,
    GetRange,
    SetRange,
    IncrByFloat,
    GetEx,
    Ttl,
    Persist,
    Touch,
    Time,
    FlushDb,
    SetBit,
    GetBit,
    BitCount,
    BitPos,
    Reset,
    Shutdown,
    Ping,
    Echo,
    Multi,
    Exec,
    Discard,
    Watch,
    Unwatch,
    Select,
    Hello,
    Auth,
    Quit,
    Info,
    DbSize,
    Scan,
    Keys,
    Type,
    Client,
    ClientId,
    ClientGetName,
    ClientSetName,
    ClientSetInfo,
    ClientInfo,
    ClientList,
    ClientKill,
    ClientHelp,
    Command,
    CommandCount,
    CommandDocs,
    CommandInfo,
    CommandList,
    CommandHelp,
    Config,
    ConfigGet,
    ConfigHelp,
}

/// One command (or subcommand, named `container|sub`).
#[derive(Debug)]
pub struct CommandSpec {
    /// What runs it.
    pub id: CommandId,
    /// Lower-case name; a subcommand's is `container|sub`.
    pub name: &'static str,
    /// Arguments counting the name (and a subcommand's container): `n` exactly, `-n` at least.
    pub arity: i32,
    /// Redis's command flags (`readonly`, `write`, `fast`, `no_auth`, ...).
    pub flags: &'static [&'static str],
    /// Position of the first key argument (0: none).
    pub first_key: i32,
    /// Position of the last key argument (-1: the last argument).
    pub last_key: i32,
    /// Step between key arguments.
    pub key_step: i32,
    /// ACL categories.
    pub categories: &'static [&'static str],
    /// Documentation group.
    pub group: &'static str,
    /// The Redis version that introduced it.
    pub since: &'static str,
    /// Time complexity.
    pub complexity: &'static str,
    /// One line of documentation.
    pub summary: &'static str,
    /// Subcommands of a container command.
    pub subcommands: &'static [CommandSpec],
}

impl CommandSpec {
    /// Whether `argc` arguments (counting the name) fit the arity.
    pub fn arity_ok(&self, argc: usize) -> bool {
        let argc = argc as i64;
        let arity = i64::from(self.arity);
        if arity >= 0 {
            argc == arity
        } else {
            argc >= -arity
        }
    }

    /// Whether it only groups subcommands.
    pub fn is_container(&self) -> bool {
        !self.subcommands.is_empty()
    }

    /// Whether it carries `flag`.
    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags.contains(&flag)
    }

    /// Writes its `COMMAND INFO` entry: name, arity, flags, first key, last key, step, ACL categories, tips, key
    /// specifications, subcommands.
    pub fn write_info(&self, w: &mut ReplyWriter<'_>) {
        w.array(10);
        w.bulk(self.name.as_bytes());
        w.integer(i64::from(self.arity));
        w.set(self.flags.len());
        for f in self.flags {
            w.simple(f.as_bytes());
        }
        w.integer(i64::from(self.first_key));
        w.integer(i64::from(self.last_key));
        w.integer(i64::from(self.key_step));
        w.set(self.categories.len());
        for c in self.categories {
            w.simple(c.as_bytes());
        }
        w.array(0);
        w.array(0);
        w.array(self.subcommands.len());
        for s in self.subcommands {
            s.write_info(w);
        }
    }

    /// Writes its `COMMAND DOCS` entry (without the name): summary, since, group, complexity, and its
    /// subcommands' entries.
    pub fn write_docs(&self, w: &mut ReplyWriter<'_>) {
        w.map(4 + usize::from(self.is_container()));
        for (k, v) in [
            ("summary", self.summary),
            ("since", self.since),
            ("group", self.group),
            ("complexity", self.complexity),
        ] {
            w.bulk(k.as_bytes());
            w.bulk(v.as_bytes());
        }
        if self.is_container() {
            w.bulk(b"subcommands");
            w.map(self.subcommands.len());
            for s in self.subcommands {
                w.bulk(s.name.as_bytes());
                s.write_docs(w);
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
const fn cmd(
    id: CommandId,
    name: &'static str,
    arity: i32,
    flags: &'static [&'static str],
    keys: (i32, i32, i32),
    categories: &'static [&'static str],
    group: &'static str,
    since: &'static str,
    complexity: &'static str,
    summary: &'static str,
) -> CommandSpec {
    CommandSpec {
        id,
        name,
        arity,
        flags,
        first_key: keys.0,
        last_key: keys.1,
        key_step: keys.2,
        categories,
        group,
        since,
        complexity,
        summary,
        subcommands: &[],
    }
}

const NO_KEYS: (i32, i32, i32) = (0, 0, 0);
const ONE_KEY: (i32, i32, i32) = (1, 1, 1);
const ALL_KEYS: (i32, i32, i32) = (1, -1, 1);
const READ_FAST: &[&str] = &["@read", "@string", "@fast"];
const WRITE_FAST: &[&str] = &["@write", "@string", "@fast"];
const CONNECTION: &[&str] = &["@slow", "@connection"];
const CONNECTION_FAST: &[&str] = &["@fast", "@connection"];
const CONNECTION_FLAGS: &[&str] = &["noscript", "loading", "stale"];
const LOADING_STALE: &[&str] = &["loading", "stale"];
const ADMIN_FLAGS: &[&str] = &["admin", "noscript", "loading", "stale"];
const ADMIN: &[&str] = &["@admin", "@slow", "@dangerous", "@connection"];
const TRANSACTION_FLAGS: &[&str] = &["noscript", "loading", "stale", "fast", "allow_busy"];
const TRANSACTION_FAST: &[&str] = &["@fast", "@transaction"];
/// `HELLO` and `AUTH`: they run before authentication.
const HANDSHAKE_FLAGS: &[&str] = &[
    "noscript",
    "loading",
    "stale",
    "fast",
    "no_auth",
    "allow_busy",
];

use CommandId as C;

static CLIENT_SUBCOMMANDS: [CommandSpec; 8] = [
    cmd(
        C::ClientId,
        "client|id",
        2,
        CONNECTION_FLAGS,
        NO_KEYS,
        CONNECTION,
        "connection",
        "5.0.0",
        "O(1)",
        "Returns the client ID for the current connection",
    ),
    cmd(
        C::ClientGetName,
        "client|getname",
        2,
        CONNECTION_FLAGS,
        NO_KEYS,
        CONNECTION,
        "connection",
        "2.6.9",
        "O(1)",
        "Get the current connection name",
    ),
    cmd(
        C::ClientSetName,
        "client|setname",
        3,
        CONNECTION_FLAGS,
        NO_KEYS,
        CONNECTION,
        "connection",
        "2.6.9",
        "O(1)",
        "Set the current connection name",
    ),
    cmd(
        C::ClientSetInfo,
        "client|setinfo",
        4,
        CONNECTION_FLAGS,
        NO_KEYS,
        CONNECTION,
        "connection",
        "7.2.0",
        "O(1)",
        "Set client or connection specific info",
    ),
    cmd(
        C::ClientInfo,
        "client|info",
        2,
        CONNECTION_FLAGS,
        NO_KEYS,
        CONNECTION,
        "connection",
        "6.2.0",
        "O(1)",
        "Returns information about the current client connection.",
    ),
    cmd(
        C::ClientList,
        "client|list",
        -2,
        ADMIN_FLAGS,
        NO_KEYS,
        ADMIN,
        "connection",
        "2.4.0",
        "O(N) where N is the number of client connections",
        "Get the list of client connections",
    ),
    cmd(
        C::ClientKill,
        "client|kill",
        -3,
        ADMIN_FLAGS,
        NO_KEYS,
        ADMIN,
        "connection",
        "2.4.0",
        "O(N) where N is the number of client connections",
        "Kill the connection of a client",
    ),
    cmd(
        C::ClientHelp,
        "client|help",
        2,
        LOADING_STALE,
        NO_KEYS,
        CONNECTION,
        "connection",
        "5.0.0",
        "O(1)",
        "Show helpful text about the different subcommands",
    ),
];

static COMMAND_SUBCOMMANDS: [CommandSpec; 5] = [
    cmd(
        C::CommandCount,
        "command|count",
        2,
        LOADING_STALE,
        NO_KEYS,
        CONNECTION,
        "server",
        "2.8.13",
        "O(1)",
        "Get total number of Redis commands",
    ),
    cmd(
        C::CommandDocs,
        "command|docs",
        -2,
        LOADING_STALE,
        NO_KEYS,
        CONNECTION,
        "server",
        "7.0.0",
        "O(N) where N is the number of commands to look up",
        "Get array of specific Redis command documentation",
    ),
    cmd(
        C::CommandInfo,
        "command|info",
        -2,
        LOADING_STALE,
        NO_KEYS,
        CONNECTION,
        "server",
        "2.8.13",
        "O(N) where N is the number of commands to look up",
        "Get array of specific Redis command details, or all when no argument is given.",
    ),
    cmd(
        C::CommandList,
        "command|list",
        2,
        LOADING_STALE,
        NO_KEYS,
        CONNECTION,
        "server",
        "7.0.0",
        "O(N) where N is the total number of Redis commands",
        "Get an array of Redis command names",
    ),
    cmd(
        C::CommandHelp,
        "command|help",
        2,
        LOADING_STALE,
        NO_KEYS,
        CONNECTION,
        "server",
        "5.0.0",
        "O(1)",
        "Show helpful text about the different subcommands",
    ),
];

static CONFIG_SUBCOMMANDS: [CommandSpec; 2] = [
    cmd(
        C::ConfigGet,
        "config|get",
        -3,
        &["admin", "noscript", "loading", "stale"],
        NO_KEYS,
        &["@admin", "@slow", "@dangerous"],
        "server",
        "2.0.0",
        "O(N) when N is the number of configuration parameters provided",
        "Get the values of configuration parameters",
    ),
    cmd(
        C::ConfigHelp,
        "config|help",
        2,
        LOADING_STALE,
        NO_KEYS,
        &["@slow"],
        "server",
        "5.0.0",
        "O(1)",
        "Show helpful text about the different subcommands",
    ),
];

/// Every top-level command.
pub static COMMANDS: [CommandSpec; 55] = [
    cmd(
        C::Get,
        "get",
        2,
        &["readonly", "fast"],
        ONE_KEY,
        READ_FAST,
        "string",
        "1.0.0",
        "O(1)",
        "Get the value of a key",
    ),
    cmd(
        C::Set,
        "set",
        -3,
        &["write", "denyoom"],
        ONE_KEY,
        &["@write", "@string", "@slow"],
        "string",
        "1.0.0",
        "O(1)",
        "Set the string value of a key",
    ),
    cmd(
        C::SetNx,
        "setnx",
        3,
        &["write", "denyoom", "fast"],
        ONE_KEY,
        WRITE_FAST,
        "string",
        "1.0.0",
        "O(1)",
        "Set the value of a key, only if the key does not exist",
    ),
    cmd(
        C::GetSet,
        "getset",
        3,
        &["write", "denyoom", "fast"],
        ONE_KEY,
        WRITE_FAST,
        "string",
        "1.0.0",
        "O(1)",
        "Set the string value of a key and return its old value",
    ),
    cmd(
        C::Del,
        "del",
        -2,
        &["write"],
        ALL_KEYS,
        &["@keyspace", "@write", "@slow"],
        "generic",
        "1.0.0",
        "O(N) where N is the number of keys that will be removed.",
        "Delete a key",
    ),
    cmd(
        C::Unlink,
        "unlink",
        -2,
        &["write", "fast"],
        ALL_KEYS,
        &["@keyspace", "@write", "@fast"],
        "generic",
        "4.0.0",
        "O(1) for each key removed regardless of its size.",
        "Delete a key asynchronously in another thread. Otherwise it is just as DEL, but non blocking.",
    ),
    cmd(
        C::Exists,
        "exists",
        -2,
        &["readonly", "fast"],
        ALL_KEYS,
        &["@keyspace", "@read", "@fast"],
        "generic",
        "1.0.0",
        "O(N) where N is the number of keys to check.",
        "Determine if a key exists",
    ),
    cmd(
        C::MGet,
        "mget",
        -2,
        &["readonly", "fast"],
        ALL_KEYS,
        READ_FAST,
        "string",
        "1.0.0",
        "O(N) where N is the number of keys to retrieve.",
        "Get the values of all the given keys",
    ),
    cmd(
        C::MSet,
        "mset",
        -3,
        &["write", "denyoom"],
        (1, -1, 2),
        &["@write", "@string", "@slow"],
        "string",
        "1.0.1",
        "O(N) where N is the number of keys to set.",
        "Set multiple keys to multiple values (not atomically when the keys live on several nodes)",
    ),
    cmd(
        C::Incr,
        "incr",
        2,
        &["write", "denyoom", "fast"],
        ONE_KEY,
        WRITE_FAST,
        "string",
        "1.0.0",
        "O(1)",
        "Increment the integer value of a key by one",
    ),
    cmd(
        C::Decr,
        "decr",
        2,
        &["write", "denyoom", "fast"],
        ONE_KEY,
        WRITE_FAST,
        "string",
        "1.0.0",
        "O(1)",
        "Decrement the integer value of a key by one",
    ),
    cmd(
        C::IncrBy,
        "incrby",
        3,
        &["write", "denyoom", "fast"],
        ONE_KEY,
        WRITE_FAST,
        "string",
        "1.0.0",
        "O(1)",
        "Increment the integer value of a key by the given amount",
    ),
    cmd(
        C::DecrBy,
        "decrby",
        3,
        &["write", "denyoom", "fast"],
        ONE_KEY,
        WRITE_FAST,
        "string",
        "1.0.0",
        "O(1)",
        "Decrement the integer value of a key by the given number",
    ),
    cmd(
        C::Append,
        "append",
        3,
        &["write", "denyoom", "fast"],
        ONE_KEY,
        WRITE_FAST,
        "string",
        "2.0.0",
        "O(1). The amortized time complexity is O(1) assuming the appended value is small and the already present value is of any size, since the dynamic string library used by Redis will double the free space available on every reallocation.",
        "Append a value to a key",
    ),
    cmd(
        C::Strlen,
        "strlen",
        2,
        &["readonly", "fast"],
        ONE_KEY,
        READ_FAST,
        "string",
        "2.2.0",
        "O(1)",
        "Get the length of the value stored in a key",
    ),
    cmd(
        C::Ping,
        "ping",
        -1,
        &["fast"],
        NO_KEYS,
        CONNECTION_FAST,
        "connection",
        "1.0.0",
        "O(1)",
        "Ping the server",
    ),
    cmd(
        C::Echo,
        "echo",
        2,
        &["fast"],
        NO_KEYS,
        CONNECTION_FAST,
        "connection",
        "1.0.0",
        "O(1)",
        "Echo the given string",
    ),
    cmd(
        C::Multi,
        "multi",
        1,
        TRANSACTION_FLAGS,
        NO_KEYS,
        TRANSACTION_FAST,
        "transactions",
        "1.2.0",
        "O(1)",
        "Start a transaction block",
    ),
    cmd(
        C::Exec,
        "exec",
        1,
        &["noscript", "loading", "stale", "skip_slowlog"],
        NO_KEYS,
        &["@slow", "@transaction"],
        "transactions",
        "1.2.0",
        "Depends on commands in the transaction",
        "Execute all commands issued after MULTI, with no other client's command on their keys in between",
    ),
    cmd(
        C::Discard,
        "discard",
        1,
        TRANSACTION_FLAGS,
        NO_KEYS,
        TRANSACTION_FAST,
        "transactions",
        "2.0.0",
        "O(N), when N is the number of queued commands",
        "Discard all commands issued after MULTI",
    ),
    cmd(
        C::Watch,
        "watch",
        -2,
        TRANSACTION_FLAGS,
        ALL_KEYS,
        TRANSACTION_FAST,
        "transactions",
        "2.2.0",
        "O(1) for every key.",
        "Monitor changes to keys to determine execution of a MULTI/EXEC block (here: their values)",
    ),
    cmd(
        C::Unwatch,
        "unwatch",
        1,
        TRANSACTION_FLAGS,
        NO_KEYS,
        TRANSACTION_FAST,
        "transactions",
        "2.2.0",
        "O(1)",
        "Forget about all watched keys",
    ),
    cmd(
        C::Select,
        "select",
        2,
        &["loading", "stale", "fast"],
        NO_KEYS,
        CONNECTION_FAST,
        "connection",
        "1.0.0",
        "O(1)",
        "Change the selected database for the current connection (dinomo has only database 0)",
    ),
    cmd(
        C::Hello,
        "hello",
        -1,
        HANDSHAKE_FLAGS,
        NO_KEYS,
        CONNECTION_FAST,
        "connection",
        "6.0.0",
        "O(1)",
        "Handshake with Redis",
    ),
    cmd(
        C::Auth,
        "auth",
        -2,
        HANDSHAKE_FLAGS,
        NO_KEYS,
        CONNECTION_FAST,
        "connection",
        "1.0.0",
        "O(N) where N is the number of passwords defined for the user",
        "Authenticate to the server",
    ),
    cmd(
        C::Quit,
        "quit",
        -1,
        &[
            "allow_busy",
            "noscript",
            "loading",
            "stale",
            "fast",
            "no_auth",
        ],
        NO_KEYS,
        CONNECTION_FAST,
        "connection",
        "1.0.0",
        "O(1)",
        "Close the connection",
    ),
    cmd(
        C::Info,
        "info",
        -1,
        LOADING_STALE,
        NO_KEYS,
        &["@slow", "@dangerous"],
        "server",
        "1.0.0",
        "O(1)",
        "Get information and statistics about the server",
    ),
    cmd(
        C::DbSize,
        "dbsize",
        1,
        &["readonly", "fast"],
        NO_KEYS,
        &["@keyspace", "@read", "@fast"],
        "server",
        "1.0.0",
        "O(1)",
        "Return the number of keys in the selected database (in the whole cluster)",
    ),
    cmd(
        C::Scan,
        "scan",
        -2,
        &["readonly"],
        NO_KEYS,
        &["@keyspace", "@read", "@slow"],
        "generic",
        "2.8.0",
        "O(1) for every call. O(N) for a complete iteration, including enough command calls for the cursor to return \
         back to 0. N is the number of elements inside the collection.",
        "Iterate the keys space (of the whole cluster)",
    ),
    cmd(
        C::Keys,
        "keys",
        2,
        &["readonly"],
        NO_KEYS,
        &["@keyspace", "@read", "@slow", "@dangerous"],
        "generic",
        "1.0.0",
        "O(N) with N being the number of keys in the database",
        "Find all keys matching the given pattern (in the whole cluster)",
    ),
    cmd(
        C::Type,
        "type",
        2,
        &["readonly", "fast"],
        ONE_KEY,
        &["@keyspace", "@read", "@fast"],
        "generic",
        "1.0.0",
        "O(1)",
        "Determine the type stored at key",
    ),
    cmd(
        C::GetDel,
        "getdel",
        2,
        &["write", "fast"],
        ONE_KEY,
        WRITE_FAST,
        "string",
        "6.2.0",
        "O(1)",
        "Returns the string value of a key after deleting the key",
    ),
    cmd(
        C::GetRange,
        "getrange",
        4,
        &["readonly"],
        ONE_KEY,
        &["@read", "@string", "@slow"],
        "string",
        "2.4.0",
        "O(N) where N is the length of the returned string.",
        "Returns a substring of the string stored at a key",
    ),
    cmd(
        C::GetRange,
        "substr",
        4,
        &["readonly"],
        ONE_KEY,
        &["@read", "@string", "@slow"],
        "string",
        "1.0.0",
        "O(N) where N is the length of the returned string.",
        "Returns a substring from a string value (GETRANGE under its old name)",
    ),
    cmd(
        C::SetRange,
        "setrange",
        4,
        &["write", "denyoom"],
        ONE_KEY,
        &["@write", "@string", "@slow"],
        "string",
        "2.2.0",
        "O(N) where N is the length of the new value: the whole value is written again.",
        "Overwrites a part of a string value with another by an offset; creates the key if it doesn't exist",
    ),
    cmd(
        C::IncrByFloat,
        "incrbyfloat",
        3,
        &["write", "denyoom", "fast"],
        ONE_KEY,
        WRITE_FAST,
        "string",
        "2.6.0",
        "O(1)",
        "Increment the floating point value of a key by a number (IEEE double arithmetic); 0 if the key doesn't exist",
    ),
    cmd(
        C::GetEx,
        "getex",
        -2,
        &["write", "fast"],
        ONE_KEY,
        WRITE_FAST,
        "string",
        "6.2.0",
        "O(1)",
        "Returns the string value of a key (keys here never expire: only PERSIST or no option is accepted)",
    ),
    cmd(
        C::Ttl,
        "ttl",
        2,
        &["readonly", "fast"],
        ONE_KEY,
        &["@keyspace", "@read", "@fast"],
        "generic",
        "1.0.0",
        "O(1)",
        "Returns the expiration time in seconds of a key (-1: none, as for every key here; -2: no such key)",
    ),
    cmd(
        C::Ttl,
        "pttl",
        2,
        &["readonly", "fast"],
        ONE_KEY,
        &["@keyspace", "@read", "@fast"],
        "generic",
        "2.6.0",
        "O(1)",
        "Returns the expiration time in milliseconds of a key (-1: none, as for every key here; -2: no such key)",
    ),
    cmd(
        C::Ttl,
        "expiretime",
        2,
        &["readonly", "fast"],
        ONE_KEY,
        &["@keyspace", "@read", "@fast"],
        "generic",
        "7.0.0",
        "O(1)",
        "Returns the expiration time of a key as a Unix timestamp (-1: none, as for every key here; -2: no such key)",
    ),
    cmd(
        C::Ttl,
        "pexpiretime",
        2,
        &["readonly", "fast"],
        ONE_KEY,
        &["@keyspace", "@read", "@fast"],
        "generic",
        "7.0.0",
        "O(1)",
        "Returns the expiration time of a key as a Unix milliseconds timestamp (-1: none; -2: no such key)",
    ),
    cmd(
        C::Persist,
        "persist",
        2,
        &["write", "fast"],
        ONE_KEY,
        &["@keyspace", "@write", "@fast"],
        "generic",
        "2.2.0",
        "O(1)",
        "Removes the expiration time of a key (always 0: keys here never expire)",
    ),
    cmd(
        C::Touch,
        "touch",
        -2,
        &["readonly", "fast"],
        ALL_KEYS,
        &["@keyspace", "@read", "@fast"],
        "generic",
        "3.2.1",
        "O(N) where N is the number of keys that will be touched.",
        "Returns the number of existing keys out of those specified",
    ),
    cmd(
        C::Time,
        "time",
        1,
        &["loading", "stale", "fast"],
        NO_KEYS,
        &["@fast"],
        "server",
        "2.6.0",
        "O(1)",
        "Returns the server time",
    ),
    cmd(
        C::FlushDb,
        "flushdb",
        -1,
        &["write"],
        NO_KEYS,
        &["@keyspace", "@write", "@slow", "@dangerous"],
        "server",
        "1.0.0",
        "O(N) where N is the number of keys in the cluster",
        "Remove all keys (from the whole cluster)",
    ),
    cmd(
        C::FlushDb,
        "flushall",
        -1,
        &["write"],
        NO_KEYS,
        &["@keyspace", "@write", "@slow", "@dangerous"],
        "server",
        "1.0.0",
        "O(N) where N is the number of keys in the cluster",
        "Remove all keys (from the whole cluster)",
    ),
    cmd(
        C::SetBit,
        "setbit",
        4,
        &["write", "denyoom"],
        ONE_KEY,
        &["@write", "@bitmap", "@slow"],
        "bitmap",
        "2.2.0",
        "O(1)",
        "Sets or clears the bit at offset of the string value; creates the key if it doesn't exist",
    ),
    cmd(
        C::GetBit,
        "getbit",
        3,
        &["readonly", "fast"],
        ONE_KEY,
        &["@read", "@bitmap", "@fast"],
        "bitmap",
        "2.2.0",
        "O(1)",
        "Returns a bit value by offset",
    ),
    cmd(
        C::BitCount,
        "bitcount",
        -2,
        &["readonly"],
        ONE_KEY,
        &["@read", "@bitmap", "@slow"],
        "bitmap",
        "2.6.0",
        "O(N)",
        "Counts the number of set bits (population counting) in a string",
    ),
    cmd(
        C::BitPos,
        "bitpos",
        -3,
        &["readonly"],
        ONE_KEY,
        &["@read", "@bitmap", "@slow"],
        "bitmap",
        "2.8.7",
        "O(N)",
        "Finds the first set (1) or clear (0) bit in a string",
    ),
    cmd(
        C::Reset,
        "reset",
        1,
        HANDSHAKE_FLAGS,
        NO_KEYS,
        CONNECTION_FAST,
        "connection",
        "6.2.0",
        "O(1)",
        "Reset the connection: no name, RESP2, and unauthenticated when a password is set",
    ),
    cmd(
        C::Shutdown,
        "shutdown",
        -1,
        &[
            "admin",
            "noscript",
            "loading",
            "stale",
            "no_multi",
            "allow_busy",
        ],
        NO_KEYS,
        &["@admin", "@slow", "@dangerous"],
        "server",
        "1.0.0",
        "O(N) when saving, where N is the total number of keys in all databases when saving data, otherwise O(1)",
        "Stops the serving process cleanly (every write is already in the memory node's pool: nothing to save)",
    ),
    CommandSpec {
        subcommands: &CLIENT_SUBCOMMANDS,
        ..cmd(
            C::Client,
            "client",
            -2,
            &[],
            NO_KEYS,
            &["@slow"],
            "connection",
            "2.4.0",
            "Depends on subcommand.",
            "A container for client connection commands",
        )
    },
    CommandSpec {
        subcommands: &COMMAND_SUBCOMMANDS,
        ..cmd(
            C::Command,
            "command",
            -1,
            LOADING_STALE,
            NO_KEYS,
            CONNECTION,
            "server",
            "2.8.13",
            "O(N) where N is the total number of Redis commands",
            "Get array of Redis command details",
        )
    },
    CommandSpec {
        subcommands: &CONFIG_SUBCOMMANDS,
        ..cmd(
            C::Config,
            "config",
            -2,
            &[],
            NO_KEYS,
            &["@slow"],
            "server",
            "2.0.0",
            "Depends on subcommand.",
            "A container for server configuration commands",
        )
    },
];

/// The top-level commands. A container runs as a command of its own when its arity allows it to be called
/// without a subcommand (`COMMAND`).
pub fn commands() -> &'static [CommandSpec] {
    &COMMANDS
}

/// The command called `name` (any case).
pub fn lookup(name: &[u8]) -> Option<&'static CommandSpec> {
    commands()
        .iter()
        .find(|c| c.name.as_bytes().eq_ignore_ascii_case(name))
}

/// The subcommand `name` (any case) of `container`.
pub fn lookup_subcommand(
    container: &'static CommandSpec,
    name: &[u8],
) -> Option<&'static CommandSpec> {
    container.subcommands.iter().find(|s| {
        s.name
            .split_once('|')
            .is_some_and(|(_, sub)| sub.as_bytes().eq_ignore_ascii_case(name))
    })
}

/// A command or subcommand by its full name (`get`, `client|setname`; any case), as `COMMAND INFO` and
/// `COMMAND DOCS` name them.
pub fn lookup_full(name: &[u8]) -> Option<&'static CommandSpec> {
    match name.iter().position(|&b| b == b'|') {
        None => lookup(name),
        Some(bar) => lookup_subcommand(lookup(&name[..bar])?, &name[bar + 1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_ignore_case_and_find_subcommands() {
        assert_eq!(lookup(b"GeT").map(|c| c.id), Some(CommandId::Get));
        assert!(lookup(b"nope").is_none());
        let client = lookup(b"client").unwrap();
        assert_eq!(
            lookup_subcommand(client, b"SETNAME").map(|c| c.id),
            Some(CommandId::ClientSetName)
        );
        assert_eq!(
            lookup_full(b"Client|GetName").map(|c| c.id),
            Some(CommandId::ClientGetName)
        );
        assert!(lookup_full(b"get|x").is_none());
    }

    #[test]
    fn arity_follows_redis_convention() {
        let get = lookup(b"get").unwrap();
        assert!(get.arity_ok(2) && !get.arity_ok(1) && !get.arity_ok(3));
        let del = lookup(b"del").unwrap();
        assert!(!del.arity_ok(1) && del.arity_ok(2) && del.arity_ok(9));
    }

    #[test]
    fn the_table_is_consistent() {
        let mut names: Vec<&str> = commands().iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), commands().len(), "names are unique");
        for c in commands() {
            assert_eq!(c.name, c.name.to_ascii_lowercase());
            assert!(!c.summary.is_empty() && c.arity != 0);
            for s in c.subcommands {
                assert!(s.name.starts_with(&format!("{}|", c.name)), "{}", s.name);
                assert!(s.arity.unsigned_abs() >= 2);
            }
        }
    }
}
