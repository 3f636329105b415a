//! TLS on the gateway: the front door (`tls: { certFile, keyFile }`) with real TLS clients (the
//! official `openai` Python SDK with a CA file, and curl), a certificate replaced on disk, a
//! plaintext client on the TLS port, mutual TLS (`clientCaFile`, curl with and without
//! `--cert`), and HTTPS to a model server behind a private CA.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "common/tls_gateway.rs"]
mod tls_gateway;
#[path = "common/upstream.rs"]
mod upstream;

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use infergate_pool::tls::{ALPN_HTTP, Certificate, ServerTls, ServerTlsOptions};
use infergate_proxy::{GatewayConfig, Listeners, WorkerListeners, serve, serve_workers};
use infergate_testkit::tls::{TestCa, peer_certificate};
use tls_gateway::{Pki, pki, start, tls_config, wait_ready};
use upstream::{Behaviour, Upstream};

const CHAT_STREAM: &str =
    r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}"#;

fn chat_request(stream: bool) -> Request<Bytes> {
    let body = if stream {
        CHAT_STREAM.to_owned()
    } else {
        CHAT_STREAM.replace("true", "false")
    };
    let mut r = Request::new(Bytes::from(body));
    *r.method_mut() = Method::POST;
    *r.uri_mut() = "/v1/chat/completions".parse().unwrap();
    r.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    r
}

/// The `data:` payloads of an SSE body, joined.
fn streamed_text(body: &[u8]) -> String {
    let mut text = String::new();
    for line in std::str::from_utf8(body).unwrap().lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(data).unwrap();
        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(t);
        }
    }
    text
}

fn run_blocking(program: &str, args: Vec<String>) -> std::process::Output {
    std::process::Command::new(program)
        .args(&args)
        .output()
        .unwrap_or_else(|e| panic!("{program} must be installed: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_and_curl_stream_over_tls_with_a_ca_file() {
    let pki = pki();
    let a = Upstream::start(Behaviour::Ok).await;
    let b = Upstream::start(Behaviour::Ok).await;
    let listeners = WorkerListeners::bind("127.0.0.1:0".parse().unwrap(), None, 2).unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let gw = serve_workers(tls_config(&pki, &[a.addr, b.addr]), listeners, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    wait_ready(&gw).await;
    let base = format!("https://127.0.0.1:{}", gw.http_addr().port());

    // The official SDK, trusting only the test CA: chat, streamed chat, completion, models, 404.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/test_sdk.py");
    let args = vec![
        script.display().to_string(),
        base.clone(),
        pki.ca_file.display().to_string(),
    ];
    let out = tokio::task::spawn_blocking(move || run_blocking("python3", args))
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    // Exit 77: the script found no `openai` package; the SDK part is skipped outside CI.
    if infergate_testkit::required_tool(
        out.status.code() != Some(77),
        "the openai Python SDK",
        &format!("pip install openai==3.57.0: {stderr}"),
    ) {
        assert!(
            out.status.success(),
            "SDK over TLS failed:\n{stdout}\n{stderr}"
        );
        assert!(stdout.contains("all checks passed"), "{stdout}");
        assert_eq!(a.requests() + b.requests(), 3);
    }
    let before = a.requests() + b.requests();

    // curl with the CA file: a streamed chat over HTTP/2 and one over HTTP/1.1.
    for (flag, version) in [("--http2", "2"), ("--http1.1", "1.1")] {
        let args = vec![
            "-sS".into(),
            "-N".into(),
            flag.into(),
            "--max-time".into(),
            "20".into(),
            "--cacert".into(),
            pki.ca_file.display().to_string(),
            "-H".into(),
            "content-type: application/json".into(),
            "-d".into(),
            CHAT_STREAM.into(),
            "-w".into(),
            "\n%{http_code} %{http_version}".into(),
            format!("{base}/v1/chat/completions"),
        ];
        let out = tokio::task::spawn_blocking(move || run_blocking("curl", args))
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "curl {flag} failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (body, status) = stdout.rsplit_once('\n').unwrap();
        assert_eq!(status, format!("200 {version}"), "{stdout}");
        assert_eq!(streamed_text(body.as_bytes()), "hello", "{body}");
        assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    }
    assert_eq!(a.requests() + b.requests(), before + 2);

    // curl without the CA refuses the certificate (exit 60: peer certificate cannot be
    // authenticated): the gateway's certificate is not trusted by accident.
    let args = vec![
        "-sS".into(),
        "--max-time".into(),
        "20".into(),
        format!("{base}/v1/models"),
    ];
    let out = tokio::task::spawn_blocking(move || run_blocking("curl", args))
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(60), "{out:?}");
    tx.send(()).unwrap();
    gw.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_replaced_on_disk_is_served_without_restart() {
    let pki = pki();
    let a = Upstream::start(Behaviour::Ok).await;
    let (gw, stop) = start(tls_config(&pki, &[a.addr])).await;
    let addr = gw.http_addr();
    // Before any reload or failed handshake, every result and reason is exported at 0.
    let metrics = infergate_testkit::get(gw.admin_addr().unwrap(), "/metrics")
        .await
        .text();
    for line in [
        r#"infergate_tls_certificate_reloads_total{result="ok"} 0"#,
        r#"infergate_tls_certificate_reloads_total{result="error"} 0"#,
        r#"infergate_tls_handshake_failures_total{reason="timeout"} 0"#,
        r#"infergate_tls_handshake_failures_total{reason="error"} 0"#,
    ] {
        assert!(
            metrics.lines().any(|l| l.ends_with(line)),
            "{line} missing in\n{metrics}"
        );
    }
    assert_eq!(peer_certificate(addr, "localhost").await, pki.leaf.der);

    // A kept-alive connection opened on the old certificate.
    let stream =
        infergate_testkit::tls::connect(addr, "localhost", pki.ca.client_config(&[b"http/1.1"]))
            .await
            .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let send = |sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>| {
        let mut r = chat_request(false).map(Full::new);
        r.headers_mut().insert("host", "localhost".parse().unwrap());
        sender.send_request(r)
    };
    assert_eq!(send(&mut sender).await.unwrap().status(), StatusCode::OK);

    // Same CA first, then a new CA: each is served to new connections within the poll.
    let renewed = pki.ca.issue(&["localhost", "127.0.0.1"]);
    let new_ca = TestCa::new("rotated ca");
    let rotated = new_ca.issue(&["localhost", "127.0.0.1"]);
    for (leaf, ca) in [(&renewed, &pki.ca), (&rotated, &new_ca)] {
        assert_ne!(peer_certificate(addr, "localhost").await, leaf.der);
        leaf.write(pki.dir.path());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while peer_certificate(addr, "localhost").await != leaf.der {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the replaced certificate was not served within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // A client trusting the CA of the certificate now in force completes a request.
        let r = infergate_testkit::tls::send_within(
            addr,
            "localhost",
            ca.client_config(&[b"http/1.1"]),
            chat_request(false),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        assert_eq!(r.status, StatusCode::OK);
    }
    // The old connection keeps the session it negotiated and keeps serving.
    let resp = send(&mut sender).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(body.starts_with(b"{"), "{body:?}");
    // Only the new CA is trusted by the new certificate's clients: the old CA no longer fits.
    let old = infergate_testkit::tls::send_within(
        addr,
        "localhost",
        pki.ca.client_config(&[b"http/1.1"]),
        chat_request(false),
        Duration::from_secs(10),
    )
    .await;
    assert!(old.is_err(), "{old:?}");
    let metrics = infergate_testkit::get(gw.admin_addr().unwrap(), "/metrics")
        .await
        .text();
    assert!(
        metrics.contains("infergate_tls_certificate_reloads_total{result=\"ok\"} 2"),
        "{metrics}"
    );
    stop.send(()).unwrap();
    gw.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_client_to_the_tls_port_is_refused_cleanly() {
    let pki = pki();
    let a = Upstream::start(Behaviour::Ok).await;
    let (gw, stop) = start(tls_config(&pki, &[a.addr])).await;
    let addr = gw.http_addr();
    let started = std::time::Instant::now();
    // A whole plaintext HTTP/1.1 request: the handshake fails on the first bytes and the
    // connection is closed; no HTTP answer comes back.
    let plain =
        infergate_testkit::send_within(addr, chat_request(false), Duration::from_secs(9)).await;
    assert!(
        matches!(plain, Err(infergate_testkit::Error::Http { .. })),
        "{plain:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "closed after {:?}",
        started.elapsed()
    );
    // The gateway keeps serving TLS clients.
    let r = infergate_testkit::tls::send_within(
        addr,
        "localhost",
        pki.ca.client_config(&[b"http/1.1"]),
        chat_request(true),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(streamed_text(&r.body), "hello");
    assert_eq!(a.requests(), 1);
    let metrics = infergate_testkit::get(gw.admin_addr().unwrap(), "/metrics")
        .await
        .text();
    assert!(
        metrics.contains("infergate_tls_handshake_failures_total{reason=\"error\"} 1"),
        "{metrics}"
    );
    stop.send(()).unwrap();
    gw.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_speaks_https_to_a_model_server_behind_a_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("model ca");
    let ca_file = ca.write_ca(dir.path());
    let (cert, key) = ca.issue(&["vllm.internal"]).write(dir.path());
    let server_tls = ServerTls::new(
        &Certificate::Files { cert, key },
        &ServerTlsOptions::new(infergate_pool::tls::port::FRONT, &ALPN_HTTP),
    )
    .unwrap();
    let up = Upstream::start_with(Behaviour::Ok, Some(server_tls)).await;
    let config = GatewayConfig::from_yaml(&format!(
        "auth: none\nmodels:\n  - name: m\n    tls: {{ caFile: {}, serverName: vllm.internal }}\n    endpoints: [{}]\n",
        ca_file.display(),
        up.addr
    ))
    .unwrap();
    // Ready means the metrics were scraped over HTTPS too.
    let (gw, stop) = start(config).await;
    for stream in [false, true] {
        let r = infergate_testkit::send(gw.http_addr(), chat_request(stream))
            .await
            .unwrap();
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(
            r.header("x-infergate-endpoint"),
            Some(up.addr.to_string().as_str())
        );
        if stream {
            assert_eq!(streamed_text(&r.body), "hello");
        }
    }
    assert_eq!(up.requests(), 2);
    stop.send(()).unwrap();
    gw.wait().await;

    // The same server, with the wrong name expected: never scraped, never sent a request.
    let config = GatewayConfig::from_yaml(&format!(
        "auth: none\nmodels:\n  - name: m\n    tls: {{ caFile: {}, serverName: other.internal }}\n    endpoints: [{}]\n",
        ca_file.display(),
        up.addr
    ))
    .unwrap();
    let listeners = Listeners {
        http: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        admin: None,
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let gw = serve(config, listeners, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!gw.handle().is_ready());
    let r = infergate_testkit::send(gw.http_addr(), chat_request(false))
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    assert_eq!(up.requests(), 2);
    tx.send(()).unwrap();
    gw.wait().await;
}

#[test]
fn a_missing_or_mismatched_certificate_stops_the_gateway_at_start() {
    let pki = pki();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut config = tls_config(&pki, &["127.0.0.1:1".parse().unwrap()]);
        let other_key = pki.dir.path().join("other.key");
        std::fs::write(&other_key, pki.ca.issue(&["localhost"]).key_pem).unwrap();
        config.tls.as_mut().unwrap().key_file = other_key;
        let listeners = Listeners {
            http: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            admin: None,
        };
        let err = serve(config, listeners, std::future::pending::<()>())
            .await
            .err()
            .expect("a key that is not the certificate's must not start");
        let text = infergate_pool::ErrorChain(&err).to_string();
        assert!(text.contains("does not match"), "{text}");

        let mut config = tls_config(&pki, &["127.0.0.1:1".parse().unwrap()]);
        config.tls.as_mut().unwrap().cert_file = pki.dir.path().join("missing.pem");
        let listeners = Listeners {
            http: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            admin: None,
        };
        let err = serve(config, listeners, std::future::pending::<()>())
            .await
            .err()
            .expect("a missing certificate must not start");
        let text = infergate_pool::ErrorChain(&err).to_string();
        assert!(text.contains("missing.pem"), "{text}");
    });
}

/// curl over the gateway's TLS front door, trusting `pki`'s CA, presenting `client` (a
/// certificate and key file) when given: a streamed chat. Its exit code and its output (the
/// body, then the status).
async fn curl_chat(
    pki: &Pki,
    base: &str,
    client: Option<&(PathBuf, PathBuf)>,
) -> (Option<i32>, String) {
    let chat = [
        "-N",
        "-H",
        "content-type: application/json",
        "-d",
        CHAT_STREAM,
    ];
    curl(pki, &chat, format!("{base}/v1/chat/completions"), client).await
}

/// curl `extra` `url`, trusting `pki`'s CA, presenting `client` when given: its exit code and
/// its output (the body, then the status).
async fn curl(
    pki: &Pki,
    extra: &[&str],
    url: String,
    client: Option<&(PathBuf, PathBuf)>,
) -> (Option<i32>, String) {
    let mut args: Vec<String> = vec![
        "-sS".into(),
        "--max-time".into(),
        "20".into(),
        "--cacert".into(),
        pki.ca_file.display().to_string(),
    ];
    if let Some((cert, key)) = client {
        args.extend([
            "--cert".into(),
            cert.display().to_string(),
            "--key".into(),
            key.display().to_string(),
        ]);
    }
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    args.extend(["-w".into(), "\n%{http_code}".into(), url]);
    let out = tokio::task::spawn_blocking(move || run_blocking("curl", args))
        .await
        .unwrap();
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Whether curl's exit code says the TLS connection was refused. With TLS 1.3 curl's handshake
/// is over before the gateway has read its certificate, and the refusal (the gateway's alert,
/// then the closed connection) meets curl afterwards: curl 7.88.1 exits 55 here (`getpeername()
/// failed with errno 107`, every run seen); met while reading the answer it would be 56, and
/// during the handshake (TLS 1.2) 35.
fn refused(code: Option<i32>) -> bool {
    matches!(code, Some(35 | 55 | 56))
}

/// `tls.clientCaFile`: curl presenting a certificate of that CA (`--cert`, `--key`) streams a
/// chat; curl without one, or with one of another CA, gets no answer (curl fails, the gateway
/// counts `client_certificate`). A bundle replaced on disk is in force for the next
/// connections, without a restart; one that holds no certificate keeps the last good bundle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_ca_admits_only_curl_with_its_client_certificate() {
    let pki = pki();
    let (clients, others) = (TestCa::new("client ca"), TestCa::new("other client ca"));
    let client_ca = pki.dir.path().join("clients.pem");
    std::fs::write(&client_ca, clients.cert_pem()).unwrap();
    let write_client = |ca: &TestCa, name: &str| {
        let dir = pki.dir.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        ca.issue(&["router"]).write(&dir)
    };
    let (ours, theirs) = (
        write_client(&clients, "ours"),
        write_client(&others, "theirs"),
    );
    let a = Upstream::start(Behaviour::Ok).await;
    let mut config = tls_config(&pki, &[a.addr]);
    config.tls.as_mut().unwrap().client_ca_file = Some(client_ca.clone());
    let (gw, stop) = start(config).await;
    let base = format!("https://localhost:{}", gw.http_addr().port());
    let failures = || async {
        let page = infergate_testkit::get(gw.admin_addr().unwrap(), "/metrics")
            .await
            .text();
        let sample = |family, label, value| {
            infergate_testkit::metric(&page, family, &[(label, value)]).unwrap_or(-1.0)
        };
        (
            sample(
                "infergate_tls_handshake_failures_total",
                "reason",
                "client_certificate",
            ),
            sample("infergate_tls_certificate_reloads_total", "result", "ok"),
            sample("infergate_tls_certificate_reloads_total", "result", "error"),
        )
    };
    assert_eq!(failures().await, (0.0, 0.0, 0.0));

    let (code, out) = curl_chat(&pki, &base, Some(&ours)).await;
    assert_eq!(code, Some(0), "{out}");
    let (body, status) = out.rsplit_once('\n').unwrap();
    assert_eq!(status, "200", "{out}");
    assert_eq!(streamed_text(body.as_bytes()), "hello", "{body}");
    for client in [None, Some(&theirs)] {
        let (code, out) = curl_chat(&pki, &base, client).await;
        assert!(refused(code), "{code:?} {out}");
        assert!(!out.contains("hello"), "{out}");
    }
    assert_eq!(failures().await, (2.0, 0.0, 0.0));
    assert_eq!(a.requests(), 1);

    // The other CA's bundle, written over the file: its clients are served, ours no longer.
    std::fs::write(&client_ca, others.cert_pem()).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while curl_chat(&pki, &base, Some(&theirs)).await.0 != Some(0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the replaced client CA was not in force within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (code, out) = curl_chat(&pki, &base, Some(&ours)).await;
    assert!(refused(code), "{code:?} {out}");
    // No certificate in it: the last good bundle stays.
    std::fs::write(&client_ca, "not a certificate\n").unwrap();
    while failures().await.2 != 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the spoilt bundle was never read"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(curl_chat(&pki, &base, Some(&theirs)).await.0, Some(0));
    assert_eq!(failures().await.1, 1.0);
    stop.send(()).unwrap();
    gw.wait().await;
}

/// A `tls.clientCaFile` that cannot be used stops the gateway at start and fails `--check`
/// (`check_files`), naming the file; `clientCaFile` without a certificate is refused at load,
/// naming the missing field.
#[test]
fn an_unusable_client_ca_file_stops_the_gateway_at_start() {
    let pki = pki();
    let not_pem = pki.dir.path().join("not-pem.pem");
    std::fs::write(&not_pem, "not a certificate\n").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    for (file, why) in [
        (pki.dir.path().join("missing.pem"), "cannot read"),
        (not_pem, "holds no PEM certificate"),
    ] {
        let mut config = tls_config(&pki, &["127.0.0.1:1".parse().unwrap()]);
        config.tls.as_mut().unwrap().client_ca_file = Some(file.clone());
        let named = |text: &str| text.contains(&file.display().to_string()) && text.contains(why);
        let check = infergate_proxy::check_files(&config).expect_err("--check passed");
        let text = infergate_pool::ErrorChain(&check).to_string();
        assert!(named(&text), "{text}");
        let err = rt.block_on(async {
            let listeners = Listeners {
                http: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
                admin: None,
            };
            serve(config, listeners, std::future::pending::<()>())
                .await
                .err()
                .expect("started with an unusable client CA file")
        });
        let text = infergate_pool::ErrorChain(&err).to_string();
        assert!(named(&text), "{text}");
    }
    let err = GatewayConfig::from_yaml(&format!(
        "auth: none\ntls: {{ clientCaFile: {} }}\nmodels:\n  - name: m\n    endpoints: [127.0.0.1:1]\n",
        pki.ca_file.display()
    ))
    .unwrap_err();
    let text = infergate_pool::ErrorChain(&err).to_string();
    assert!(text.contains("missing field `certFile`"), "{text}");
}

/// `adminTls` with a `clientCaFile`: the admin port (`/heartbeat`, `/metrics`, the probes)
/// speaks HTTPS to curl presenting a certificate of that CA; curl without one, or over plain
/// HTTP, gets no answer, and the refusal is counted in the TLS families with `port="admin"`.
/// The front door, plain HTTP here, is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_tls_serves_the_heartbeat_to_clients_of_its_ca_only() {
    let pki = pki();
    let routers = TestCa::new("routers ca");
    let routers_ca = pki.dir.path().join("routers.pem");
    std::fs::write(&routers_ca, routers.cert_pem()).unwrap();
    let router_dir = pki.dir.path().join("router");
    std::fs::create_dir_all(&router_dir).unwrap();
    let router = routers.issue(&["router"]).write(&router_dir);
    let a = Upstream::start(Behaviour::Ok).await;
    let config = GatewayConfig::from_yaml(&format!(
        "auth: none\nadminTls: {{ certFile: {}, keyFile: {}, clientCaFile: {} }}\nmodels:\n  - name: m\n    scheduler: {{ preset: round-robin }}\n    endpoints: [{}]\n",
        pki.cert.display(),
        pki.key.display(),
        routers_ca.display(),
        a.addr
    ))
    .unwrap();
    let (gw, stop) = start(config).await;
    let admin = format!("https://localhost:{}", gw.admin_addr().unwrap().port());

    let (code, out) = curl(&pki, &[], format!("{admin}/heartbeat"), Some(&router)).await;
    assert_eq!(code, Some(0), "{out}");
    let (body, status) = out.rsplit_once('\n').unwrap();
    assert_eq!(status, "200", "{out}");
    let doc: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(doc["schema"], "infergate.heartbeat/v1", "{body}");
    assert_eq!(doc["models"][0]["name"], "m", "{body}");

    // No client certificate: no answer. Plain HTTP to the TLS port: none either.
    let (code, out) = curl(&pki, &[], format!("{admin}/heartbeat"), None).await;
    assert!(refused(code), "{code:?} {out}");
    assert!(!out.contains("infergate.heartbeat"), "{out}");
    let plain = format!(
        "http://127.0.0.1:{}/healthz",
        gw.admin_addr().unwrap().port()
    );
    let (code, out) = curl(&pki, &[], plain, None).await;
    assert_ne!(code, Some(0), "{out}");
    assert!(!out.contains("ok"), "{out}");

    let (code, out) = curl(&pki, &[], format!("{admin}/metrics"), Some(&router)).await;
    assert_eq!(code, Some(0), "{out}");
    let failures = |reason| {
        infergate_testkit::metric(
            &out,
            "infergate_tls_handshake_failures_total",
            &[("port", "admin"), ("reason", reason)],
        )
    };
    assert_eq!(failures("client_certificate"), Some(1.0), "{out}");
    assert!(failures("error").is_some_and(|n| n >= 1.0), "{out}");
    assert!(
        infergate_testkit::metric(
            &out,
            "infergate_tls_certificate_not_after_timestamp_seconds",
            &[("port", "admin")],
        )
        .is_some_and(|t| t > 1.0e9),
        "{out}"
    );

    // The front door still plain HTTP.
    let front = format!("http://127.0.0.1:{}/v1/models", gw.http_addr().port());
    let (code, out) = curl(&pki, &[], front, None).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.ends_with("\n200"), "{out}");
    stop.send(()).unwrap();
    gw.wait().await;
}

/// An `adminTls` whose files cannot be used stops the gateway at start and fails `--check`,
/// naming the section and the file.
#[test]
fn an_unusable_admin_tls_stops_the_gateway_at_start() {
    let pki = pki();
    let missing = pki.dir.path().join("missing.crt");
    let config = GatewayConfig::from_yaml(&format!(
        "auth: none\nadminTls: {{ certFile: {}, keyFile: {} }}\nmodels:\n  - name: m\n    endpoints: [127.0.0.1:1]\n",
        missing.display(),
        pki.key.display(),
    ))
    .unwrap();
    let named =
        |text: &str| text.contains("adminTls") && text.contains(&missing.display().to_string());
    let check = infergate_proxy::check_files(&config).expect_err("--check passed");
    let text = infergate_pool::ErrorChain(&check).to_string();
    assert!(named(&text), "{text}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let err = rt.block_on(async {
        let listeners = Listeners {
            http: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            admin: Some(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap()),
        };
        serve(config, listeners, std::future::pending::<()>())
            .await
            .err()
            .expect("started with an unusable adminTls")
    });
    let text = infergate_pool::ErrorChain(&err).to_string();
    assert!(named(&text), "{text}");
}
