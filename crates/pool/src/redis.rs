//! A small Redis client: RESP2 over one TCP connection, for shared counters.
//!
//! Only what shared quotas and global rate limits need: [`Pipeline`] sends any number of
//! commands in one write and reads their replies in order (Redis runs a connection's commands
//! in the order sent, so a pipeline of `INCRBY`s followed by an `MGET` reads the totals with
//! this replica's increments in them), plus [`Redis::ping`]. Every command is an array of bulk
//! strings, so any Redis command can be sent; [`Value`] is the reply.
//!
//! Bounded by design, so a slow or dead Redis never holds a caller long:
//! - the connect and every round trip have their own timeout ([`RedisConfig`]);
//! - after a failure the connection is dropped and the next attempt waits out a backoff
//!   (doubling from [`RedisConfig::backoff_min`] to [`RedisConfig::backoff_max`]); calls during
//!   the backoff fail at once with [`RedisError::Backoff`], without touching the network;
//! - replies are parsed with limits (bulk strings up to [`MAX_BULK`] bytes, arrays up to
//!   [`MAX_ARRAY`] elements, nesting up to [`MAX_DEPTH`]): a hostile or broken server gets an
//!   error, not an allocation of its choosing.
//!
//! A password (`AUTH`) is sent on connect when configured. TLS is not supported: reach Redis
//! over a trusted network (loopback, a pod network with a network policy) or a TLS tunnel.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The largest bulk string accepted in a reply.
pub const MAX_BULK: usize = 1 << 20;
/// The most elements accepted in one reply array.
pub const MAX_ARRAY: usize = 1 << 16;
/// The deepest nesting of arrays accepted in a reply.
pub const MAX_DEPTH: usize = 4;
/// The longest status, error or integer line accepted in a reply.
const MAX_LINE: usize = 4096;

/// Where Redis is and how long to wait for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// `host:port`.
    pub address: String,
    /// The longest wait for a connection (and its `AUTH`).
    pub connect_timeout: Duration,
    /// The longest wait for one round trip (a whole pipeline).
    pub command_timeout: Duration,
    /// The first wait after a failure before connecting again.
    pub backoff_min: Duration,
    /// The longest wait between attempts.
    pub backoff_max: Duration,
    /// Sent with `AUTH` on connect, when set.
    pub password: Option<String>,
}

impl RedisConfig {
    /// Redis at `address` with the defaults: 200 ms to connect, 200 ms per round trip,
    /// backoff from 100 ms to 5 s, no password.
    pub fn new(address: impl Into<String>) -> Self {
        RedisConfig {
            address: address.into(),
            connect_timeout: Duration::from_millis(200),
            command_timeout: Duration::from_millis(200),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            password: None,
        }
    }
}

/// Why a Redis call failed.
#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    /// The TCP connection could not be made.
    #[error("cannot connect to Redis at {address}")]
    Connect {
        /// The configured address.
        address: String,
        /// What the socket reported.
        #[source]
        source: std::io::Error,
    },
    /// The connection (and `AUTH`) did not complete in time.
    #[error("no connection to Redis at {address} within {} ms", timeout.as_millis())]
    ConnectTimeout {
        /// The configured address.
        address: String,
        /// The connect timeout.
        timeout: Duration,
    },
    /// A round trip did not complete in time.
    #[error("Redis did not answer within {} ms", timeout.as_millis())]
    Timeout {
        /// The command timeout.
        timeout: Duration,
    },
    /// Reading or writing the connection failed, or the server closed it.
    #[error("the Redis connection failed")]
    Io {
        /// What the socket reported.
        #[source]
        source: std::io::Error,
    },
    /// The reply was not valid RESP2, or over a limit.
    #[error("Redis sent an invalid reply: {reason}")]
    Protocol {
        /// What was wrong.
        reason: &'static str,
    },
    /// Redis answered a command with an error (`-ERR ...`), e.g. a wrong password.
    #[error("Redis refused the command: {message}")]
    Server {
        /// The error line Redis sent.
        message: String,
    },
    /// A previous attempt failed and the backoff has not passed: no attempt was made.
    #[error("Redis is unreachable; the next attempt is in {} ms", wait.as_millis())]
    Backoff {
        /// Until the next attempt.
        wait: Duration,
    },
}

/// One RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A status line, e.g. `OK` or `PONG`.
    Status(String),
    /// An error line; inside a pipeline it answers one command without failing the others.
    Error(String),
    /// An integer.
    Int(i64),
    /// A bulk string.
    Bulk(Vec<u8>),
    /// The null bulk string or null array.
    Nil,
    /// An array.
    Array(Vec<Value>),
}

impl Value {
    /// The value as an integer: an integer reply, or a bulk string holding one; `Nil` is 0.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(n) => Some(*n),
            Value::Bulk(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            Value::Nil => Some(0),
            _ => None,
        }
    }
}

/// Commands sent in one write, answered in order.
#[derive(Debug, Default, Clone)]
pub struct Pipeline {
    buf: Vec<u8>,
    commands: usize,
}

impl Pipeline {
    /// An empty pipeline.
    pub fn new() -> Self {
        Pipeline::default()
    }

    /// Adds one command given as its words, e.g. `["INCRBY", key, "5"]`.
    pub fn cmd<A: AsRef<[u8]>>(&mut self, words: &[A]) -> &mut Self {
        self.buf.push(b'*');
        self.buf
            .extend_from_slice(words.len().to_string().as_bytes());
        self.buf.extend_from_slice(b"\r\n");
        for w in words {
            let w = w.as_ref();
            self.buf.push(b'$');
            self.buf.extend_from_slice(w.len().to_string().as_bytes());
            self.buf.extend_from_slice(b"\r\n");
            self.buf.extend_from_slice(w);
            self.buf.extend_from_slice(b"\r\n");
        }
        self.commands += 1;
        self
    }

    /// The number of commands.
    pub fn len(&self) -> usize {
        self.commands
    }

    /// Whether there is no command.
    pub fn is_empty(&self) -> bool {
        self.commands == 0
    }

    /// Removes every command, keeping the buffer.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.commands = 0;
    }
}

type Conn = BufReader<TcpStream>;

/// A Redis connection that reconnects on demand, with timeouts and backoff; see the module
/// documentation. Calls take `&mut self`: one task owns the client.
#[derive(Debug)]
pub struct Redis {
    config: RedisConfig,
    conn: Option<Conn>,
    /// No attempt before this instant (after a failure).
    retry_at: Option<Instant>,
    backoff: Duration,
}

impl Redis {
    /// A client for `config`; nothing is connected until the first call.
    pub fn new(config: RedisConfig) -> Self {
        let backoff = config.backoff_min;
        Redis {
            config,
            conn: None,
            retry_at: None,
            backoff,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// Whether a connection is open now.
    pub fn is_connected(&self) -> bool {
        self.conn.is_some()
    }

    /// `PING`.
    pub async fn ping(&mut self) -> Result<(), RedisError> {
        let mut p = Pipeline::new();
        p.cmd(&["PING"]);
        match self.pipeline(&p).await?.pop() {
            Some(Value::Status(s)) if s == "PONG" => Ok(()),
            Some(Value::Error(message)) => Err(RedisError::Server { message }),
            _ => Err(RedisError::Protocol {
                reason: "PING was not answered with PONG",
            }),
        }
    }

    /// Sends `p` and returns one reply per command, in order. A command Redis refused is a
    /// [`Value::Error`] in its place; a failed connection, a timeout or a broken reply is an
    /// error for the whole pipeline (and the connection is dropped).
    pub async fn pipeline(&mut self, p: &Pipeline) -> Result<Vec<Value>, RedisError> {
        let timeout = self.config.command_timeout;
        let mut conn = self.connection().await?;
        let sent = tokio::time::timeout(timeout, exchange(&mut conn, p)).await;
        match sent {
            Ok(Ok(values)) => {
                self.conn = Some(conn);
                self.succeeded();
                Ok(values)
            }
            Ok(Err(e)) => {
                self.failed();
                Err(e)
            }
            Err(_) => {
                self.failed();
                Err(RedisError::Timeout { timeout })
            }
        }
    }

    /// The open connection, or a new one (unless the backoff has not passed).
    async fn connection(&mut self) -> Result<Conn, RedisError> {
        if let Some(c) = self.conn.take() {
            return Ok(c);
        }
        if let Some(at) = self.retry_at {
            let now = Instant::now();
            if now < at {
                return Err(RedisError::Backoff { wait: at - now });
            }
        }
        let timeout = self.config.connect_timeout;
        match tokio::time::timeout(timeout, self.connect()).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => {
                self.failed();
                Err(e)
            }
            Err(_) => {
                self.failed();
                Err(RedisError::ConnectTimeout {
                    address: self.config.address.clone(),
                    timeout,
                })
            }
        }
    }

    async fn connect(&self) -> Result<Conn, RedisError> {
        let stream = TcpStream::connect(&self.config.address)
            .await
            .map_err(|source| RedisError::Connect {
                address: self.config.address.clone(),
                source,
            })?;
        // Small writes, answered at once: no Nagle delay.
        let _ = stream.set_nodelay(true);
        let mut conn = BufReader::new(stream);
        if let Some(password) = &self.config.password {
            let mut p = Pipeline::new();
            p.cmd(&["AUTH", password.as_str()]);
            if let Some(Value::Error(message)) = exchange(&mut conn, &p).await?.pop() {
                return Err(RedisError::Server { message });
            }
        }
        Ok(conn)
    }

    fn succeeded(&mut self) {
        self.retry_at = None;
        self.backoff = self.config.backoff_min;
    }

    fn failed(&mut self) {
        self.conn = None;
        self.retry_at = Some(Instant::now() + self.backoff);
        self.backoff = (self.backoff * 2).min(self.config.backoff_max);
    }
}

/// Writes `p` and reads its replies.
async fn exchange(conn: &mut Conn, p: &Pipeline) -> Result<Vec<Value>, RedisError> {
    let io = |source| RedisError::Io { source };
    conn.get_mut().write_all(&p.buf).await.map_err(io)?;
    let mut values = Vec::with_capacity(p.commands);
    let mut line = Vec::new();
    for _ in 0..p.commands {
        match read_value(conn, &mut line, 0).await {
            Ok(v) => values.push(v),
            Err(e @ RedisError::Io { .. }) => {
                // Redis closes the connection after refusing some commands (an unauthenticated
                // client's long one, after `NOAUTH` for each before it): its first refusal
                // says why, the closed socket does not.
                return Err(
                    match values.into_iter().find(|v| matches!(v, Value::Error(_))) {
                        Some(Value::Error(message)) => RedisError::Server { message },
                        _ => e,
                    },
                );
            }
            Err(e) => return Err(e),
        }
    }
    Ok(values)
}

/// Reads one reply, nested at `depth`.
async fn read_value(
    conn: &mut Conn,
    line: &mut Vec<u8>,
    depth: usize,
) -> Result<Value, RedisError> {
    read_line(conn, line).await?;
    let (kind, rest) = match line.split_first() {
        Some((k, rest)) => (*k, rest),
        None => return Err(protocol("an empty reply line")),
    };
    match kind {
        b'+' => Ok(Value::Status(String::from_utf8_lossy(rest).into_owned())),
        b'-' => Ok(Value::Error(String::from_utf8_lossy(rest).into_owned())),
        b':' => Ok(Value::Int(parse_int(rest)?)),
        b'$' => {
            let n = parse_int(rest)?;
            if n < 0 {
                return Ok(Value::Nil);
            }
            let n = usize::try_from(n).map_err(|_| protocol("a bulk length out of range"))?;
            if n > MAX_BULK {
                return Err(protocol("a bulk string over the size limit"));
            }
            let mut buf = vec![0u8; n + 2];
            conn.read_exact(&mut buf)
                .await
                .map_err(|source| RedisError::Io { source })?;
            if !buf.ends_with(b"\r\n") {
                return Err(protocol("a bulk string not ended by CRLF"));
            }
            buf.truncate(n);
            Ok(Value::Bulk(buf))
        }
        b'*' => {
            let n = parse_int(rest)?;
            if n < 0 {
                return Ok(Value::Nil);
            }
            let n = usize::try_from(n).map_err(|_| protocol("an array length out of range"))?;
            if n > MAX_ARRAY {
                return Err(protocol("an array over the length limit"));
            }
            if depth >= MAX_DEPTH {
                return Err(protocol("arrays nested too deep"));
            }
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                items.push(Box::pin(read_value(conn, line, depth + 1)).await?);
            }
            Ok(Value::Array(items))
        }
        _ => Err(protocol("an unknown reply type")),
    }
}

/// Reads one CRLF-terminated line into `line`, without the CRLF.
async fn read_line(conn: &mut Conn, line: &mut Vec<u8>) -> Result<(), RedisError> {
    line.clear();
    let n = (&mut *conn)
        .take(MAX_LINE as u64 + 2)
        .read_until(b'\n', line)
        .await
        .map_err(|source| RedisError::Io { source })?;
    if n == 0 {
        return Err(RedisError::Io {
            source: std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "Redis closed the connection",
            ),
        });
    }
    if !line.ends_with(b"\r\n") {
        return Err(protocol("a reply line too long or not ended by CRLF"));
    }
    line.truncate(line.len() - 2);
    Ok(())
}

fn parse_int(s: &[u8]) -> Result<i64, RedisError> {
    std::str::from_utf8(s)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(protocol("an invalid integer"))
}

fn protocol(reason: &'static str) -> RedisError {
    RedisError::Protocol { reason }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests;
