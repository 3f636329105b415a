//! External fronts for live runs: another router or proxy (vllm-router, nginx, …) started as a
//! command in front of the same emulated fleet, so one report compares it with infergate's
//! presets on the same arrivals.
//!
//! A front is `NAME=COMMAND`. For each run the bench starts a fresh fleet, picks two free ports
//! on 127.0.0.1, fills the command's placeholders and runs it with `sh -c` in a process group of
//! its own:
//!
//! | placeholder  | environment variable        | value                                        |
//! |--------------|-----------------------------|----------------------------------------------|
//! | `{port}`     | `INFERGATE_FRONT_PORT`      | where the front must listen (on 127.0.0.1)    |
//! | `{aux_port}` | `INFERGATE_FRONT_AUX_PORT`  | a second free port (a metrics listener, say)  |
//! | `{urls}`     | `INFERGATE_FRONT_URLS`      | the pods as `http://HOST:PORT`, space-separated |
//! | `{addrs}`    | `INFERGATE_FRONT_ADDRS`     | the pods as `HOST:PORT`, comma-separated      |
//! | `{model}`    | `INFERGATE_FRONT_MODEL`     | the model the pods serve (the requests' `model`) |
//! | `{kv_events}` | `INFERGATE_FRONT_KV_EVENTS` | each pod's KV-event feed as `http://HOST:PORT=tcp://HOST:PUB[,tcp://HOST:REPLAY]`, space-separated |
//!
//! The pods publish vLLM's KV-cache events (ZeroMQ, keyed encoding, with replay) only for a front
//! whose command names `{kv_events}` or `INFERGATE_FRONT_KV_EVENTS`: publishing costs the
//! emulator CPU that the other runs do not pay.
//!
//! The front is ready once `GET /v1/models` through it answers 200 (it is then known to reach a
//! pod), within [`READY_TIMEOUT`] (120 s) or the time it is given
//! ([`Front::with_ready_timeout`], `--front-ready-timeout NAME=SECONDS`); the run's requests go
//! to `POST /v1/chat/completions` on it. After the run its process group gets `SIGTERM`, then
//! `SIGKILL` if it is still there 5 s later. Its output goes to
//! `LOG_DIR/SCENARIO-live-front-NAME.log` ([`crate::live::Fronts::log_path`]: one file per
//! scenario and front, named in the report and in every error about the front): the first
//! seed's run starts the file afresh, each later seed's appends to it, every run after a line
//! naming its seed.

use std::fmt;
use std::io::Write as _;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::BenchError;

/// How long a front may take to answer `GET /v1/models` with 200, unless it is given its own
/// time ([`Front::with_ready_timeout`]).
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// The longest a front may be given to get ready: a front slower than an hour to start is
/// waited for by nobody, and a typo of a few zeros should not hang a bench for days.
pub const MAX_READY_TIMEOUT: Duration = Duration::from_secs(3600);

/// One external front: a name for the report and the command that starts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Front {
    /// The name its runs carry in the report (instead of a policy's).
    pub name: String,
    /// The command, with placeholders (see the module documentation).
    pub command: String,
    /// How long it may take to get ready; between 1 s and [`MAX_READY_TIMEOUT`].
    ready_timeout: Duration,
}

/// A `--front-ready-timeout` argument, `NAME=SECONDS`: the time front NAME may take to answer
/// `GET /v1/models` with 200, in whole seconds from 1 to 3,600.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyTimeout {
    /// The front's name.
    pub front: String,
    /// Its time to get ready.
    pub timeout: Duration,
}

/// A `--front` argument that is not `NAME=COMMAND`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrontSyntaxError {
    /// Not `NAME=COMMAND` (the argument as given).
    #[error(
        "front `{0}`: expected NAME=COMMAND, NAME of letters, digits, '-', '_' or '.', and a command"
    )]
    Syntax(String),
    /// A ready timeout that is not `NAME=SECONDS`, whole seconds from 1 to 3,600 (the argument
    /// as given).
    #[error(
        "front ready timeout `{0}`: expected NAME=SECONDS, SECONDS a whole number from 1 to 3600"
    )]
    ReadyTimeout(String),
    /// A ready timeout for a front that is not given (its name).
    #[error("a ready timeout is given for front {0}, but no front is named {0}")]
    UnknownFront(String),
    /// Two ready timeouts for one front (its name).
    #[error("two ready timeouts are given for front {0}")]
    TwoReadyTimeouts(String),
    /// The command is a URL (the argument as given): the bench starts each front itself, in
    /// front of a fleet of its own.
    #[error(
        "front `{0}`: the command is a URL, but a front is a command that starts a router listening on {{port}} in front of the bench's fresh fleet (each run has pods of its own, so an already running router cannot be used), e.g. `NAME=my-router --port {{port}} --workers {{urls}}`"
    )]
    Url(String),
}

impl FromStr for Front {
    type Err = FrontSyntaxError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || FrontSyntaxError::Syntax(s.to_owned());
        let (name, command) = s.split_once('=').ok_or_else(bad)?;
        let name = name.trim();
        let command = command.trim();
        let name_ok = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !name_ok || command.is_empty() {
            return Err(bad());
        }
        if !command.contains(char::is_whitespace)
            && (command.starts_with("http://") || command.starts_with("https://"))
        {
            // A URL would run as a command named after it and exit 127, minutes later, after
            // the scenario's own policies.
            return Err(FrontSyntaxError::Url(s.to_owned()));
        }
        Ok(Front {
            name: name.to_owned(),
            command: command.to_owned(),
            ready_timeout: READY_TIMEOUT,
        })
    }
}

impl FromStr for ReadyTimeout {
    type Err = FrontSyntaxError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || FrontSyntaxError::ReadyTimeout(s.to_owned());
        let (front, secs) = s.split_once('=').ok_or_else(bad)?;
        let secs: u64 = secs.trim().parse().map_err(|_| bad())?;
        let timeout = Duration::from_secs(secs);
        if secs == 0 || timeout > MAX_READY_TIMEOUT || front.trim().is_empty() {
            return Err(bad());
        }
        Ok(ReadyTimeout {
            front: front.trim().to_owned(),
            timeout,
        })
    }
}

/// Gives each front named in `timeouts` its time to get ready; the others keep
/// [`READY_TIMEOUT`]. A timeout for a front not in `fronts`, or two for one front, is refused.
pub fn set_ready_timeouts(
    fronts: &mut [Front],
    timeouts: &[ReadyTimeout],
) -> Result<(), FrontSyntaxError> {
    for (i, t) in timeouts.iter().enumerate() {
        if timeouts[..i].iter().any(|u| u.front == t.front) {
            return Err(FrontSyntaxError::TwoReadyTimeouts(t.front.clone()));
        }
        let front = fronts
            .iter_mut()
            .find(|f| f.name == t.front)
            .ok_or_else(|| FrontSyntaxError::UnknownFront(t.front.clone()))?;
        *front = front.clone().with_ready_timeout(t.timeout)?;
    }
    Ok(())
}

impl fmt::Display for Front {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, self.command)
    }
}

/// The values a front's command is given for one run.
#[derive(Debug, Clone)]
pub struct FrontPorts<'a> {
    /// Where the front listens.
    pub port: u16,
    /// A second free port.
    pub aux_port: u16,
    /// The pods.
    pub pods: &'a [SocketAddr],
    /// Each pod's KV-event publisher and replay socket, in the order of `pods`: `None` for a
    /// pod that publishes none (an SGLang or TGI pod; every pod when the fleet publishes none).
    pub kv_events: &'a [Option<(SocketAddr, Option<SocketAddr>)>],
    /// The model the pods serve.
    pub model: &'a str,
}

impl FrontPorts<'_> {
    fn urls(&self) -> String {
        let urls: Vec<String> = self.pods.iter().map(|a| format!("http://{a}")).collect();
        urls.join(" ")
    }

    fn addrs(&self) -> String {
        let addrs: Vec<String> = self.pods.iter().map(SocketAddr::to_string).collect();
        addrs.join(",")
    }

    fn kv_events(&self) -> String {
        let feeds: Vec<String> = self
            .pods
            .iter()
            .zip(self.kv_events)
            // Paired by position, so a pod without a feed cannot shift the others' onto it.
            .filter_map(|(pod, feed)| feed.map(|f| (pod, f)))
            .map(|(pod, (feed, replay))| match replay {
                Some(r) => format!("http://{pod}=tcp://{feed},tcp://{r}"),
                None => format!("http://{pod}=tcp://{feed}"),
            })
            .collect();
        feeds.join(" ")
    }
}

impl Front {
    /// The front, given `timeout` to answer `GET /v1/models` with 200 instead of
    /// [`READY_TIMEOUT`]: whole seconds, from 1 s to [`MAX_READY_TIMEOUT`].
    pub fn with_ready_timeout(self, timeout: Duration) -> Result<Self, FrontSyntaxError> {
        if timeout < Duration::from_secs(1)
            || timeout > MAX_READY_TIMEOUT
            || timeout.subsec_nanos() != 0
        {
            return Err(FrontSyntaxError::ReadyTimeout(format!(
                "{}={}",
                self.name,
                timeout.as_secs_f64()
            )));
        }
        Ok(Front {
            ready_timeout: timeout,
            ..self
        })
    }

    /// How long the front may take to answer `GET /v1/models` with 200.
    pub fn ready_timeout(&self) -> Duration {
        self.ready_timeout
    }

    /// Whether the front reads the pods' KV-event feeds (its command names `{kv_events}` or
    /// `INFERGATE_FRONT_KV_EVENTS`), so the fleet must publish them.
    pub fn wants_kv_events(&self) -> bool {
        self.command.contains("{kv_events}") || self.command.contains("INFERGATE_FRONT_KV_EVENTS")
    }

    /// The command with its placeholders filled in.
    pub fn render(&self, ports: &FrontPorts<'_>) -> String {
        self.command
            .replace("{port}", &ports.port.to_string())
            .replace("{aux_port}", &ports.aux_port.to_string())
            .replace("{urls}", &ports.urls())
            .replace("{addrs}", &ports.addrs())
            .replace("{kv_events}", &ports.kv_events())
            .replace("{model}", ports.model)
    }

    /// Checks, before any run and without starting the front, that it can start at all: its
    /// command, placeholders filled with sample values, is valid `sh` (`sh -n`), and the program
    /// it runs first is there (a shell builtin, a program on `PATH`, or an executable file).
    /// What the command does after that (a script's own commands, a program that exits) is
    /// found when it runs. Cheap: at most two `sh` processes that run nothing of the front's.
    pub fn check(&self) -> Result<(), BenchError> {
        let pods: [SocketAddr; 2] = [
            SocketAddr::from(([127, 0, 0, 1], 8001)),
            SocketAddr::from(([127, 0, 0, 1], 8002)),
        ];
        let feeds = [
            Some((SocketAddr::from(([127, 0, 0, 1], 5557)), None)),
            Some((SocketAddr::from(([127, 0, 0, 1], 5558)), None)),
        ];
        let command = self.render(&FrontPorts {
            port: 8000,
            aux_port: 8100,
            pods: &pods,
            kv_events: &feeds,
            model: "model",
        });
        let start_err = |source| BenchError::FrontStart {
            front: self.name.clone(),
            source,
        };
        let syntax = Command::new("sh")
            .arg("-n")
            .arg("-c")
            .arg(&command)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .output()
            .map_err(start_err)?;
        if !syntax.status.success() {
            return Err(BenchError::FrontSyntax {
                front: self.name.clone(),
                complaint: String::from_utf8_lossy(&syntax.stderr).trim().to_owned(),
            });
        }
        let Some(program) = first_program(&command) else {
            return Ok(());
        };
        let missing = |why| {
            Err(BenchError::FrontProgram {
                front: self.name.clone(),
                program: program.to_owned(),
                why,
            })
        };
        if program.contains('/') {
            use std::os::unix::fs::PermissionsExt as _;
            return match std::fs::metadata(program) {
                Err(_) => missing("does not exist"),
                Ok(m) if !m.is_file() || m.permissions().mode() & 0o111 == 0 => {
                    missing("is not an executable file")
                }
                Ok(_) => Ok(()),
            };
        }
        // sh itself says whether it would find the word: builtins and keywords included.
        let found = Command::new("sh")
            .arg("-c")
            .arg(r#"command -v "$1""#)
            .arg("sh")
            .arg(program)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(start_err)?;
        if found.success() {
            Ok(())
        } else {
            missing("is neither a shell builtin nor a program on PATH")
        }
    }

    /// Starts the front for one run and waits until it is ready.
    pub(crate) async fn start(
        &self,
        pods: &[SocketAddr],
        kv_events: &[Option<(SocketAddr, Option<SocketAddr>)>],
        model: &str,
        log: &Path,
        run: LogRun,
    ) -> Result<RunningFront, BenchError> {
        let port = free_port()?;
        let mut aux_port = free_port()?;
        while aux_port == port {
            aux_port = free_port()?;
        }
        let ports = FrontPorts {
            port,
            aux_port,
            pods,
            kv_events,
            model,
        };
        let command = self.render(&ports);
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir).map_err(|source| BenchError::Write {
                path: dir.to_owned(),
                source,
            })?;
        }
        let write_err = |source| BenchError::Write {
            path: log.to_owned(),
            source,
        };
        // One file for all of a scenario's seeds: a later seed's run must not wipe an earlier
        // one's.
        let mut out = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(!run.first)
            .truncate(run.first)
            .open(log)
            .map_err(write_err)?;
        writeln!(out, "== front {}, seed {} ==", self.name, run.seed).map_err(write_err)?;
        let err = out.try_clone().map_err(write_err)?;
        let child = Command::new("sh")
            .arg("-c")
            .arg(&command)
            .env("INFERGATE_FRONT_PORT", port.to_string())
            .env("INFERGATE_FRONT_AUX_PORT", aux_port.to_string())
            .env("INFERGATE_FRONT_URLS", ports.urls())
            .env("INFERGATE_FRONT_ADDRS", ports.addrs())
            .env("INFERGATE_FRONT_KV_EVENTS", ports.kv_events())
            .env("INFERGATE_FRONT_MODEL", model)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|source| BenchError::FrontStart {
                front: self.name.clone(),
                source,
            })?;
        let mut running = RunningFront {
            name: self.name.clone(),
            child: Some(child),
            log: log.to_owned(),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        running.wait_ready(self.ready_timeout).await?;
        Ok(running)
    }
}

/// The program a command runs first, when that can be told from its text alone: its first
/// word after variable assignments and `exec`. `None` when it cannot be told without running
/// the shell (quotes, expansions, a subshell, an assignment to `PATH`).
fn first_program(command: &str) -> Option<&str> {
    let mut words = command.split_whitespace();
    loop {
        let word = words.next()?;
        // A word ends at an operator: `false;` runs `false`.
        let word = &word[..word.find([';', '&', '|', '<', '>']).unwrap_or(word.len())];
        if word.is_empty()
            || word.starts_with('#')
            || word.contains(['\'', '"', '\\', '$', '`', '*', '?', '~', '(', ')'])
            || (word.len() > 1 && word.contains(['{', '}', '[']))
        {
            return None;
        }
        if let Some((name, _)) = word.split_once('=') {
            let assignment = !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if assignment {
                if name == "PATH" {
                    return None;
                }
                continue;
            }
        }
        if word == "exec" {
            continue;
        }
        if word.starts_with('-') {
            // An option of `exec` (bash's `exec -a NAME`): not worth following.
            return None;
        }
        return Some(word);
    }
}

/// Which run of a bench a front's log is written for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LogRun {
    /// The run's seed (named in the log).
    pub(crate) seed: u64,
    /// The bench's first run of this front: the log starts afresh.
    pub(crate) first: bool,
}

/// A started front; stopped (its whole process group) by [`RunningFront::stop`] or on drop.
#[derive(Debug)]
pub(crate) struct RunningFront {
    name: String,
    child: Option<Child>,
    log: PathBuf,
    addr: SocketAddr,
}

impl RunningFront {
    /// Where the front listens.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits until `GET /v1/models` through the front answers 200, for at most `within`.
    async fn wait_ready(&mut self, within: Duration) -> Result<(), BenchError> {
        let client: Client<HttpConnector, Empty<Bytes>> =
            Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        let uri: http::Uri = format!("http://{}/v1/models", self.addr)
            .parse()
            .map_err(|_| BenchError::FrontNotReady {
                front: self.name.clone(),
                secs: 0,
                last: "no URI for its address".to_owned(),
                log: self.log.clone(),
            })?;
        let by = Instant::now() + within;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(BenchError::FrontExited {
                    front: self.name.clone(),
                    status: status.to_string(),
                    tail: log_tail(&self.log),
                    log: self.log.clone(),
                });
            }
            let probe = tokio::time::timeout(Duration::from_secs(2), client.get(uri.clone()));
            // What the probe got, for the error: a front that answers 404 is not one that never
            // listened.
            let last = match probe.await {
                Ok(Ok(resp)) if resp.status() == http::StatusCode::OK => return Ok(()),
                Ok(Ok(resp)) => format!("HTTP {}", resp.status()),
                // hyper's client error alone says only "Connect": its causes too.
                Ok(Err(e)) => infergate_metrics::ErrorChain(&e).to_string(),
                Err(_) => "no answer within 2 s".to_owned(),
            };
            if Instant::now() > by {
                return Err(BenchError::FrontNotReady {
                    front: self.name.clone(),
                    secs: within.as_secs(),
                    last,
                    log: self.log.clone(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the front: `SIGTERM` to its process group, `SIGKILL` after 5 s.
    pub(crate) async fn stop(mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        signal_group(child.id(), "TERM");
        let by = Instant::now() + Duration::from_secs(5);
        while Instant::now() < by {
            if matches!(child.try_wait(), Ok(Some(_))) {
                // The leader is gone; anything it left in the group goes too.
                signal_group(child.id(), "KILL");
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        signal_group(child.id(), "KILL");
        let _ = child.wait();
    }
}

impl Drop for RunningFront {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal_group(child.id(), "KILL");
            let _ = child.wait();
        }
    }
}

/// Sends `SIG<signal>` to the process group `pgid` with kill(1) (the group was made with the
/// child as its leader, so its id is the child's).
fn signal_group(pgid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(format!("-{pgid}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The last lines of a front's log, for an error message (empty when it wrote nothing).
fn log_tail(path: &Path) -> String {
    const LINES: usize = 3;
    const CHARS: usize = 400;
    let text = std::fs::read_to_string(path).unwrap_or_default();
    // This run's output: what follows the last run's header line.
    let run = text
        .rfind("== front ")
        .and_then(|at| text[at..].find('\n').map(|end| &text[at + end + 1..]))
        .unwrap_or(&text);
    let lines: Vec<&str> = run.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(LINES)..].join(" | ");
    let skip = tail.chars().count().saturating_sub(CHARS);
    tail.chars().skip(skip).collect()
}

fn free_port() -> Result<u16, BenchError> {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0)).map_err(BenchError::Bind)?;
    l.local_addr().map(|a| a.port()).map_err(BenchError::Bind)
}

#[cfg(test)]
mod tests;
