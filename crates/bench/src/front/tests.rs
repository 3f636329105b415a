#![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

use super::*;

#[test]
fn parses_name_and_command() {
    let f: Front = "vllm-router-cache_aware=vllm-router --port {port} --policy x=y"
        .parse()
        .unwrap();
    assert_eq!(f.name, "vllm-router-cache_aware");
    assert_eq!(f.command, "vllm-router --port {port} --policy x=y");
    for bad in ["", "name", "=cmd", "name=", "na me=cmd", "a/b=cmd", " = "] {
        assert!(bad.parse::<Front>().is_err(), "{bad:?} parsed");
    }
    for url in ["r=http://127.0.0.1:8000", "r=https://router.example/v1"] {
        let err = url.parse::<Front>().unwrap_err();
        assert_eq!(err, FrontSyntaxError::Url(url.to_owned()));
        assert!(err.to_string().contains("is a URL"), "{err}");
    }
    // A command that merely mentions a URL is a command.
    assert!("r=curl-front http://x {port}".parse::<Front>().is_ok());
}

/// A front that is `addr`, started by nobody (the test serves it, or nothing does).
fn unmanaged(addr: SocketAddr, log: &Path) -> RunningFront {
    RunningFront {
        name: "f".to_owned(),
        child: None,
        log: log.to_owned(),
        addr,
    }
}

#[tokio::test]
async fn not_ready_says_what_the_last_probe_got() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("front-f.log");
    // Something that answers every request with 404.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf).await;
            let _ = conn
                .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                .await;
        }
    });
    let err = unmanaged(addr, &log)
        .wait_ready(Duration::from_millis(300))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("(last try: HTTP 404 Not Found)"), "{err}");

    // Nothing listens.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let err = unmanaged(closed, &log)
        .wait_ready(Duration::from_millis(300))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("Connection refused"), "{err}");
}

#[test]
fn the_log_tail_is_its_last_lines() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("front-f.log");
    assert_eq!(log_tail(&log), "");
    std::fs::write(
        &log,
        "one\ntwo\n\nthree\nsh: 1: localhost:8000: not found\n",
    )
    .unwrap();
    assert_eq!(
        log_tail(&log),
        "two | three | sh: 1: localhost:8000: not found"
    );
    // Only the last run's output, after its header line.
    std::fs::write(
        &log,
        "== front f, seed 1 ==\nold\nolder\n== front f, seed 2 ==\nnew\n",
    )
    .unwrap();
    assert_eq!(log_tail(&log), "new");
}

#[test]
fn fills_every_placeholder() {
    let f: Front =
        "x=run --port {port} --m {aux_port} --w {urls} --a {addrs} {port} {kv_events} {model}"
            .parse()
            .unwrap();
    assert!(f.wants_kv_events());
    let pods: Vec<SocketAddr> = vec![
        "127.0.0.1:8001".parse().unwrap(),
        "127.0.0.1:8002".parse().unwrap(),
    ];
    let feeds = vec![
        Some((
            "127.0.0.1:7001".parse().unwrap(),
            Some("127.0.0.1:7002".parse().unwrap()),
        )),
        Some(("127.0.0.1:7003".parse().unwrap(), None)),
    ];
    let cmd = f.render(&FrontPorts {
        port: 9000,
        aux_port: 9001,
        pods: &pods,
        kv_events: &feeds,
        model: "m/x",
    });
    assert_eq!(
        cmd,
        "run --port 9000 --m 9001 --w http://127.0.0.1:8001 http://127.0.0.1:8002 \
         --a 127.0.0.1:8001,127.0.0.1:8002 9000 \
         http://127.0.0.1:8001=tcp://127.0.0.1:7001,tcp://127.0.0.1:7002 \
         http://127.0.0.1:8002=tcp://127.0.0.1:7003 m/x"
    );
    let plain: Front = "y=nginx-front.sh".parse().unwrap();
    assert!(!plain.wants_kv_events());

    // A fleet whose first pod publishes no events (SGLang): the second pod keeps its own
    // feed, and the first is not given it.
    let mixed = [None, Some(("127.0.0.1:7003".parse().unwrap(), None))];
    let kv: Front = "k=run {kv_events}".parse().unwrap();
    let cmd = kv.render(&FrontPorts {
        port: 9000,
        aux_port: 9001,
        pods: &pods,
        kv_events: &mixed,
        model: "m",
    });
    assert_eq!(cmd, "run http://127.0.0.1:8002=tcp://127.0.0.1:7003");
}

#[test]
fn the_first_program_is_told_from_the_text_where_it_can_be() {
    for (command, program) in [
        ("vllm-router --port 8000", Some("vllm-router")),
        ("  /opt/r/bin/router   --x", Some("/opt/r/bin/router")),
        ("RUST_LOG=info A_1=x exec ./router 8000", Some("./router")),
        ("false; echo", Some("false")),
        ("cd /tmp && exec x", Some("cd")),
        ("[ -x r ] && r", Some("[")),
        ("PATH=/opt/bin:$PATH router", None),
        ("\"my router\" --port 1", None),
        ("$ROUTER --port 1", None),
        ("(cd /tmp; r)", None),
        ("exec -a name router", None),
        ("# a comment", None),
        ("", None),
    ] {
        assert_eq!(first_program(command), program, "{command:?}");
    }
}

#[test]
fn a_command_that_cannot_start_is_refused_before_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let check = |command: String| format!("f={command}").parse::<Front>().unwrap().check();
    // Builtins, programs on PATH, executable files and what cannot be told from the text pass.
    let script = dir.path().join("front.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    let plain = dir.path().join("plain.sh");
    std::fs::write(&plain, "exit 0\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for ok in [
        "false".to_owned(),
        "exec sleep {port}".to_owned(),
        "echo {urls} {addrs} {kv_events} {model} {aux_port}; exit 1".to_owned(),
        format!("X=1 exec {} --port {{port}}", script.display()),
        format!("sh {}", plain.display()),
        "\"$ROUTER\" --port {port}".to_owned(),
    ] {
        check(ok.clone()).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }

    let err = check("infergate-no-such-router --port {port}".to_owned()).unwrap_err();
    assert!(
        matches!(&err, BenchError::FrontProgram { program, .. } if program == "infergate-no-such-router"),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "front f: its command runs `infergate-no-such-router`, which is neither a shell builtin nor a program on PATH; nothing was run"
    );
    let missing = dir.path().join("gone.sh");
    let err = check(format!("{} {{port}}", missing.display())).unwrap_err();
    assert!(
        err.to_string()
            .ends_with("which does not exist; nothing was run"),
        "{err}"
    );
    let err = check(format!("{} {{port}}", plain.display())).unwrap_err();
    assert!(
        err.to_string().contains("is not an executable file"),
        "{err}"
    );
    let err = check(dir.path().display().to_string()).unwrap_err();
    assert!(
        err.to_string().contains("is not an executable file"),
        "{err}"
    );

    let err = check("router --name 'unterminated {port}".to_owned()).unwrap_err();
    assert!(
        matches!(&err, BenchError::FrontSyntax { .. })
            && err.to_string().contains("its command is not valid sh (")
            && err.to_string().contains("nterminated"),
        "{err}"
    );
}

#[test]
fn a_front_is_given_its_own_ready_timeout_within_bounds() {
    let front = |s: &str| s.parse::<Front>().unwrap();
    assert_eq!(front("a=run").ready_timeout(), READY_TIMEOUT);
    assert_eq!(READY_TIMEOUT, Duration::from_secs(120));

    let t: ReadyTimeout = "a=300".parse().unwrap();
    assert_eq!(
        (t.front.as_str(), t.timeout),
        ("a", Duration::from_secs(300))
    );
    assert_eq!(
        "a=3600".parse::<ReadyTimeout>().unwrap().timeout,
        MAX_READY_TIMEOUT
    );
    for bad in [
        "a", "a=", "=5", "a=0", "a=-1", "a=1.5", "a=3601", "a=2m", "a=1e3",
    ] {
        let err = bad.parse::<ReadyTimeout>().unwrap_err();
        assert_eq!(err, FrontSyntaxError::ReadyTimeout(bad.to_owned()), "{bad}");
        assert!(err.to_string().contains("from 1 to 3600"), "{err}");
    }
    assert!(
        front("a=run")
            .with_ready_timeout(Duration::from_millis(500))
            .is_err()
    );
    assert!(
        front("a=run")
            .with_ready_timeout(MAX_READY_TIMEOUT + Duration::from_secs(1))
            .is_err()
    );

    let mut fronts = vec![front("a=run"), front("b=run")];
    set_ready_timeouts(&mut fronts, &["b=5".parse().unwrap()]).unwrap();
    assert_eq!(fronts[0].ready_timeout(), READY_TIMEOUT);
    assert_eq!(fronts[1].ready_timeout(), Duration::from_secs(5));
    assert_eq!(
        set_ready_timeouts(&mut fronts, &["c=5".parse().unwrap()]),
        Err(FrontSyntaxError::UnknownFront("c".to_owned()))
    );
    assert_eq!(
        set_ready_timeouts(
            &mut fronts,
            &["a=5".parse().unwrap(), "a=6".parse().unwrap()]
        ),
        Err(FrontSyntaxError::TwoReadyTimeouts("a".to_owned()))
    );
}
