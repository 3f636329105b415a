//! Reloading the router's file while it serves (`Handle::reload_file`, `Handle::watch_file`),
//! with scripted clusters behind good heartbeats on 127.0.0.1: clusters added and removed,
//! a stream through a removed cluster finishing, a bad file refused, and a cluster keeping its
//! state (its ejection) across a reload of prices.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "common/clusters.rs"]
mod clusters;
#[path = "common/scripted.rs"]
mod scripted;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use clusters::counter;
use infergate_global::{GlobalConfig, Router};
use infergate_testkit::Response;
use scripted::{HeldStream, Scripted, counted_heartbeat, finish_stream, heartbeat, open_stream};
use tokio::time::Instant;

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

/// The file's top (everything but `clusters:`): heartbeats every 50 ms, no slow start, the file
/// polled every 50 ms, ejection after 3 gateway failures for a minute.
const TOP: &str = "auth: none\nreloadIntervalMs: 50\nheartbeat: { intervalMs: 50, staleAfterMs: 2000, slowStartMs: 0 }\noutlierDetection: { consecutiveGatewayFailures: 3, baseEjectionMs: 60000, maxEjectionMs: 60000, maxEjectionPercent: 100 }\n";

/// A cluster entry serving `m` at `url`, its heartbeat on `beat`, priced `cost` per input token.
fn entry(name: &str, url: SocketAddr, beat: SocketAddr, cost: f64) -> String {
    format!(
        "  - {{ name: {name}, url: 'http://{url}', heartbeatUrl: 'http://{beat}/heartbeat', region: r, models: [m], cost: {{ inputPerMillion: {cost} }} }}\n"
    )
}

fn file(entries: &[String]) -> String {
    format!("{TOP}clusters:\n{}", entries.concat())
}

async fn chat(router: &Router) -> Response {
    infergate_testkit::post(
        router.http_addr(),
        "/v1/chat/completions",
        "application/json",
        CHAT,
    )
    .await
}

/// Which cluster answered a request (asserting a 200).
async fn answered_by(router: &Router) -> String {
    let r = chat(router).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("x-infergate-cluster").unwrap().to_owned()
}

async fn page(router: &Router) -> String {
    infergate_testkit::get(router.admin_addr().unwrap(), "/metrics")
        .await
        .text()
}

async fn reloads(router: &Router, result: &str) -> f64 {
    counter(
        &page(router).await,
        &format!("infergate_global_config_reloads_total{{result=\"{result}\"}}"),
    )
}

/// Waits until `cluster` is routed on at full weight.
async fn until_up(router: &Router, cluster: &str) {
    let weight = format!("infergate_global_cluster_weight{{cluster=\"{cluster}\"}}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter(&page(router).await, &weight) != 1.0 {
        assert!(Instant::now() < deadline, "{cluster} never up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends a request every 20 ms until `cluster` answers one.
async fn until_answered_by(router: &Router, cluster: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while answered_by(router).await != cluster {
        assert!(Instant::now() < deadline, "{cluster} never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The router serving the file `path` holds, with its file watched.
async fn start(path: &Path) -> (Router, tokio::sync::oneshot::Sender<()>) {
    let (router, stop) = clusters::router_with(&std::fs::read_to_string(path).unwrap()).await;
    router
        .handle()
        .watch_file(path.to_owned(), std::future::pending());
    (router, stop)
}

/// A cluster added to the file is routed to once the file is seen changed (the cheaper one
/// takes the requests); a cluster removed from it gets no request after, and its heartbeat is
/// no longer polled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_added_to_the_file_is_routed_to_and_a_removed_one_no_longer() {
    let (a, b) = (Scripted::start(200).await, Scripted::start(200).await);
    let (beat_a, polled_a) = counted_heartbeat().await;
    let beat_b = heartbeat().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("global.yaml");
    std::fs::write(&path, file(&[entry("a", a.addr, beat_a, 1.0)])).unwrap();
    let (router, _stop) = start(&path).await;
    until_answered_by(&router, "a").await;
    assert_eq!(reloads(&router, "ok").await, 0.0);
    assert_eq!(reloads(&router, "error").await, 0.0);

    std::fs::write(
        &path,
        file(&[
            entry("a", a.addr, beat_a, 1.0),
            entry("b", b.addr, beat_b, 0.1),
        ]),
    )
    .unwrap();
    until_answered_by(&router, "b").await;
    for _ in 0..5 {
        assert_eq!(answered_by(&router).await, "b");
    }
    assert_eq!(reloads(&router, "ok").await, 1.0);

    // `b` removed: `a` answers again, and nothing reaches `b` any more.
    std::fs::write(&path, file(&[entry("a", a.addr, beat_a, 1.0)])).unwrap();
    until_answered_by(&router, "a").await;
    let b_hits = b.hits();
    for _ in 0..5 {
        assert_eq!(answered_by(&router).await, "a");
    }
    assert_eq!(b.hits(), b_hits);
    assert_eq!(reloads(&router, "ok").await, 2.0);
    // `a` was kept through both reloads: its heartbeat is polled by one poller, not two.
    let before = polled_a.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let polls = polled_a.load(Ordering::Relaxed) - before;
    assert!(
        (1..=13).contains(&polls),
        "{polls} polls of a in 500 ms (two pollers: about 20)"
    );

    // `a` removed (replaced by `b`): its poller stops, and its gauges leave the page.
    std::fs::write(&path, file(&[entry("b", b.addr, beat_b, 0.1)])).unwrap();
    until_answered_by(&router, "b").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stopped_at = polled_a.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        polled_a.load(Ordering::Relaxed),
        stopped_at,
        "a removed cluster's heartbeat is still polled"
    );
    let text = page(&router).await;
    assert!(
        !text.contains("infergate_global_cluster_weight{cluster=\"a\"}"),
        "{text}"
    );
    assert!(
        text.contains("infergate_global_cluster_weight{cluster=\"b\"}"),
        "{text}"
    );
}

/// A stream running through a cluster when a reload removes it completes, whole; the requests
/// after the reload go to the cluster that replaced it and none reaches the removed one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_through_a_removed_cluster_completes() {
    let held = HeldStream::start().await;
    let (beat, _) = counted_heartbeat().await;
    let b = Scripted::start(200).await;
    let beat_b = heartbeat().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("global.yaml");
    // `held` is the cheaper: the stream goes there.
    let both = file(&[
        entry("held", held.addr, beat, 0.1),
        entry("b", b.addr, beat_b, 1.0),
    ]);
    std::fs::write(&path, &both).unwrap();
    let (router, _stop) = clusters::router_with(&both).await;
    until_up(&router, "held").await;
    let (mut client, got) = open_stream(router.http_addr()).await;
    assert_eq!(held.accepted.load(Ordering::Relaxed), 1);

    std::fs::write(&path, file(&[entry("b", b.addr, beat_b, 1.0)])).unwrap();
    router.handle().reload_file(&path).unwrap();
    for _ in 0..5 {
        assert_eq!(answered_by(&router).await, "b");
    }
    assert_eq!(
        held.accepted.load(Ordering::Relaxed),
        1,
        "a request reached the removed cluster"
    );
    let _ = held.release.send(());
    finish_stream(&mut client, got).await;
}

/// A file that does not validate, or names a CA bundle or a token file that cannot be read, is
/// refused with the error the start gives, counted, and the running configuration keeps
/// serving.
#[tokio::test]
async fn a_bad_file_is_refused_and_the_running_configuration_stays() {
    let OneCluster {
        router,
        _stop,
        dir,
        path,
        file: good,
        cluster: a,
        beat,
    } = OneCluster::start("").await;
    let handle = router.handle();
    let missing = dir.path().join("missing");
    let bad_entry = |extra: &str| {
        format!(
            "  - {{ name: c, url: 'http{}://127.0.0.1:9', region: r, models: [m], cost: {{ inputPerMillion: 1 }}, {extra} }}\n",
            if extra.starts_with("tls") { "s" } else { "" }
        )
    };
    let cases = [
        (
            format!(
                "{TOP}retries: {{ maxAttempts: 0 }}\nclusters:\n{}",
                entry("a", a.addr, beat, 1.0)
            ),
            "retries.maxAttempts",
        ),
        (
            file(&[
                entry("a", a.addr, beat, 1.0),
                bad_entry(&format!("tls: {{ caFile: '{}' }}", missing.display())),
            ]),
            "tls.caFile",
        ),
        (
            file(&[
                entry("a", a.addr, beat, 1.0),
                bad_entry(&format!(
                    "credentials: {{ bearerTokenFile: '{}' }}",
                    missing.display()
                )),
            ]),
            "credentials.bearerTokenFile",
        ),
    ];
    for (n, (yaml, field)) in cases.iter().enumerate() {
        std::fs::write(&path, yaml).unwrap();
        let refused = handle.reload_file(&path).unwrap_err();
        let said = infergate_pool::ErrorChain(&refused).to_string();
        assert!(said.contains(field), "{said}");
        // The start says the same.
        let at_start = match GlobalConfig::from_yaml(yaml) {
            Err(e) => infergate_pool::ErrorChain(&e).to_string(),
            Ok(config) => {
                let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let listeners = infergate_global::Listeners { http, admin: None };
                match infergate_global::serve(config, listeners, std::future::pending()).await {
                    Err(e) => infergate_pool::ErrorChain(&e).to_string(),
                    Ok(_) => panic!("the start accepted {yaml}"),
                }
            }
        };
        assert_eq!(said, at_start);
        assert_eq!(reloads(&router, "error").await, (n + 1) as f64);
        assert_eq!(reloads(&router, "ok").await, 0.0);
        for _ in 0..3 {
            assert_eq!(answered_by(&router).await, "a");
        }
    }
    // Still reloadable afterwards.
    std::fs::write(&path, &good).unwrap();
    handle.reload_file(&path).unwrap();
    assert_eq!(reloads(&router, "ok").await, 1.0);
}

/// A router over one scripted cluster `a` behind a good heartbeat, started on `extra` followed
/// by the usual file and answering, with a path in a folder of its own for the next files.
struct OneCluster {
    router: Router,
    _stop: tokio::sync::oneshot::Sender<()>,
    dir: tempfile::TempDir,
    path: std::path::PathBuf,
    /// The file it started on.
    file: String,
    cluster: Scripted,
    beat: SocketAddr,
}

impl OneCluster {
    async fn start(extra: &str) -> OneCluster {
        let cluster = Scripted::start(200).await;
        let beat = heartbeat().await;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("global.yaml");
        let file = format!("{extra}{}", file(&[entry("a", cluster.addr, beat, 1.0)]));
        let (router, stop) = clusters::router_with(&file).await;
        until_answered_by(&router, "a").await;
        OneCluster {
            router,
            _stop: stop,
            dir,
            path,
            file,
            cluster,
            beat,
        }
    }
}

/// `listen` changed in the file is warned of once, naming the new address and the one in force,
/// and the rest of the file applies; the file changed back to the address in force is no change,
/// so no warning (the comparison is with what runs, not with the last file read).
#[tokio::test]
async fn a_listen_change_is_warned_of_and_changing_it_back_is_not() {
    let out = infergate_testkit::CapturedLog::default();
    let _log = tracing::subscriber::set_default(out.subscriber(tracing::Level::INFO));
    let one = OneCluster::start("listen: 127.0.0.1:18480\n").await;
    let (router, path, good) = (&one.router, one.path.as_path(), one.file.as_str());
    let handle = router.handle();
    let warnings = || {
        out.text()
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("take effect only after a restart"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };

    let moved = good.replace("127.0.0.1:18480", "127.0.0.1:18481");
    std::fs::write(path, moved).unwrap();
    handle.reload_file(path).unwrap();
    let said = warnings();
    assert_eq!(said.len(), 1, "{said:#?}");
    assert!(
        said[0].contains("listen 127.0.0.1:18481 (in force: 127.0.0.1:18480)"),
        "{}",
        said[0]
    );

    std::fs::write(path, good).unwrap();
    handle.reload_file(path).unwrap();
    assert_eq!(warnings().len(), 1, "{:#?}", warnings());
    assert_eq!(reloads(router, "ok").await, 2.0);
    assert_eq!(answered_by(router).await, "a");
}

/// A reload that changes `heartbeat:` starts every cluster afresh and says why: the log named
/// it a change of the cluster ("cluster changed by the reload") when its entry was untouched.
/// A changed entry is still said to be one.
#[tokio::test]
async fn a_cluster_restarted_by_a_changed_heartbeat_section_says_why() {
    let out = infergate_testkit::CapturedLog::default();
    let _log = tracing::subscriber::set_default(out.subscriber(tracing::Level::INFO));
    let one = OneCluster::start("").await;
    let (router, path, good) = (&one.router, one.path.as_path(), one.file.as_str());
    let handle = router.handle();
    let said = |what: &str| out.text().lines().filter(|l| l.contains(what)).count();

    std::fs::write(path, good.replace("intervalMs: 50,", "intervalMs: 60,")).unwrap();
    handle.reload_file(path).unwrap();
    assert_eq!(
        said(
            "cluster started afresh by the reload: `heartbeat`, `outlierDetection` or `timeouts.connectMs` changed"
        ),
        1,
        "{}",
        out.text()
    );
    assert_eq!(said("cluster changed by the reload"), 0, "{}", out.text());

    let moved = good
        .replace("models: [m]", "models: [m, n]")
        .replace("intervalMs: 50,", "intervalMs: 60,");
    std::fs::write(path, moved).unwrap();
    handle.reload_file(path).unwrap();
    assert_eq!(said("cluster changed by the reload"), 1, "{}", out.text());
    until_answered_by(router, "a").await;
}

/// A cluster keeps its state across a reload that leaves its entry unchanged but for its price:
/// `bad`, ejected after three 503s, stays ejected (no request reaches it) when the reload
/// changes `good`'s price and its own, and `good`, repriced, is routed on at once (not drained
/// until a first heartbeat, as a new cluster is). A reload that changes anything else of `bad`'s
/// entry (its models) starts it afresh: tried again.
#[tokio::test]
async fn a_cluster_keeps_its_ejection_across_a_reload_of_prices() {
    let bad = Scripted::start(503).await;
    let good = Scripted::start(200).await;
    let beat = heartbeat().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("global.yaml");
    let with = |bad_cost: f64, good_cost: f64| {
        file(&[
            entry("bad", bad.addr, beat, bad_cost),
            entry("good", good.addr, beat, good_cost),
        ])
    };
    let (router, _stop) = clusters::router_with(&with(0.1, 1.0)).await;
    until_up(&router, "bad").await;
    until_up(&router, "good").await;
    // Each request tries the cheaper `bad` first until it is ejected.
    while bad.hits() < 3 {
        assert_eq!(answered_by(&router).await, "good");
    }
    let ejected = "infergate_global_cluster_ejected{cluster=\"bad\"}";
    assert_eq!(counter(&page(&router).await, ejected), 1.0);
    let handle = router.handle();

    std::fs::write(&path, with(0.05, 2.0)).unwrap();
    handle.reload_file(&path).unwrap();
    let good_weight = "infergate_global_cluster_weight{cluster=\"good\"}";
    assert_eq!(
        counter(&page(&router).await, good_weight),
        1.0,
        "good restarted"
    );
    for _ in 0..5 {
        assert_eq!(answered_by(&router).await, "good");
    }
    assert_eq!(bad.hits(), 3, "the repriced cluster lost its ejection");
    assert_eq!(counter(&page(&router).await, ejected), 1.0);

    // `bad`'s models changed: a fresh cluster, tried first again.
    let changed = with(0.05, 2.0).replace(
        &format!(
            "url: 'http://{}', heartbeatUrl: 'http://{beat}/heartbeat', region: r, models: [m]",
            bad.addr
        ),
        &format!(
            "url: 'http://{}', heartbeatUrl: 'http://{beat}/heartbeat', region: r, models: [m, m2]",
            bad.addr
        ),
    );
    assert_ne!(changed, with(0.05, 2.0));
    std::fs::write(&path, changed).unwrap();
    handle.reload_file(&path).unwrap();
    until_bad_tried(&router, &bad).await;
}

async fn until_bad_tried(router: &Router, bad: &Scripted) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while bad.hits() == 3 {
        assert!(
            Instant::now() < deadline,
            "the replaced cluster was never tried"
        );
        assert_eq!(answered_by(router).await, "good");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The file's top with ejections of `ms`, and `entries`.
fn file_ejecting_for(ms: u64, entries: &[String]) -> String {
    file(entries).replace(
        "baseEjectionMs: 60000, maxEjectionMs: 60000",
        &format!("baseEjectionMs: {ms}, maxEjectionMs: {ms}"),
    )
}

/// [`entry`] with `credentials.bearerTokenFile: token`.
fn entry_with_token(
    name: &str,
    url: SocketAddr,
    beat: SocketAddr,
    cost: f64,
    token: &Path,
) -> String {
    let e = entry(name, url, beat, cost);
    let credentials = format!(
        ", credentials: {{ bearerTokenFile: '{}' }} }}\n",
        token.display()
    );
    e.strip_suffix(" }\n").unwrap().to_owned() + &credentials
}

async fn credential_reloads(router: &Router, cluster: &str, file: &str, result: &str) -> f64 {
    counter(
        &page(router).await,
        &format!(
            "infergate_global_credential_reloads_total{{cluster=\"{cluster}\",file=\"{file}\",result=\"{result}\"}}"
        ),
    )
}

/// Waits until the router has counted `n` loads of `cluster`'s `file` with `result`.
async fn until_credential_reloads(
    router: &Router,
    cluster: &str,
    file: &str,
    result: &str,
    n: f64,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while credential_reloads(router, cluster, file, result).await != n {
        assert!(
            Instant::now() < deadline,
            "{cluster}'s {file} never counted {n} {result} (the file's change was not seen)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A cluster's token file rewritten in place, the configuration file unchanged: the router sends
/// the new token from then on, and the cluster is the same one — its ejection (three 503s,
/// five seconds) outlives the rotation, and once it ends the cluster, which now accepts only the
/// new token, answers. `models:` is configured, so no model discovery reads the file either.
#[tokio::test]
async fn a_rotated_token_is_sent_and_the_cluster_keeps_its_ejection() {
    let tok = Scripted::start(503).await;
    let spare = Scripted::start(200).await;
    let beat = heartbeat().await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "old-token\n").unwrap();
    tok.require_token("old-token");
    let yaml = file_ejecting_for(
        5000,
        &[
            entry_with_token("tok", tok.addr, beat, 0.1, &token),
            entry("spare", spare.addr, beat, 1.0),
        ],
    );
    let (router, _stop) = clusters::router_with(&yaml).await;
    until_up(&router, "tok").await;
    until_up(&router, "spare").await;
    assert_eq!(credential_reloads(&router, "tok", "token", "ok").await, 0.0);
    // The cheaper `tok` takes the old token and fails at its gateway until it is ejected.
    while tok.hits() < 3 {
        assert_eq!(answered_by(&router).await, "spare");
    }
    let ejected = "infergate_global_cluster_ejected{cluster=\"tok\"}";
    assert_eq!(counter(&page(&router).await, ejected), 1.0);

    tok.require_token("new-token");
    tok.set(200);
    std::fs::write(&token, "new-token\n").unwrap();
    until_credential_reloads(&router, "tok", "token", "ok", 1.0).await;
    // Still ejected: not a cluster started afresh.
    assert_eq!(counter(&page(&router).await, ejected), 1.0, "tok restarted");
    assert_eq!(answered_by(&router).await, "spare");
    assert_eq!(tok.hits(), 3, "an ejected cluster was tried");
    assert_eq!(reloads(&router, "ok").await, 0.0);

    // Readmitted after its ejection: only the new token gets through.
    let deadline = Instant::now() + Duration::from_secs(15);
    while answered_by(&router).await != "tok" {
        assert!(
            Instant::now() < deadline,
            "tok never answered (a 401 to the old token fails over)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let page = page(&router).await;
    assert_eq!(
        counter(
            &page,
            "infergate_global_failovers_total{cluster=\"tok\",reason=\"credentials\"}"
        ),
        0.0,
        "the old token was sent after the rotation: {page}"
    );
}

/// A token file that becomes unusable — empty, a character a header cannot carry, gone — keeps
/// the last good token in force: requests still reach the cluster with it. Each change is
/// warned of once, naming the cluster and the file, and counted; a good token then written is
/// in force at once.
#[tokio::test]
async fn an_unusable_token_file_keeps_the_last_good_token() {
    let out = infergate_testkit::CapturedLog::default();
    let _log = tracing::subscriber::set_default(out.subscriber(tracing::Level::INFO));
    let tok = Scripted::start(200).await;
    let beat = heartbeat().await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "good-token").unwrap();
    tok.require_token("good-token");
    let yaml = file(&[entry_with_token("tok", tok.addr, beat, 1.0, &token)]);
    let (router, _stop) = clusters::router_with(&yaml).await;
    until_answered_by(&router, "tok").await;
    assert_eq!(
        credential_reloads(&router, "tok", "token", "error").await,
        0.0
    );

    let warnings = || {
        out.text()
            .lines()
            .filter(|l| {
                l.contains("WARN") && l.contains("bearerTokenFile changed but cannot be used")
            })
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    // What the warning says, and how the file is spoilt.
    type Spoil = fn(&Path);
    let unusable: [(&str, Spoil); 3] = [
        ("empty", |p| std::fs::write(p, "\n").unwrap()),
        ("HTTP header cannot carry", |p| {
            std::fs::write(p, "bad\u{1}token").unwrap();
        }),
        ("cannot read it", |p| std::fs::remove_file(p).unwrap()),
    ];
    for (n, (why, spoil)) in unusable.iter().enumerate() {
        spoil(&token);
        until_credential_reloads(&router, "tok", "token", "error", (n + 1) as f64).await;
        // A few checks later: the same bad file is neither warned of nor counted again.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            credential_reloads(&router, "tok", "token", "error").await,
            (n + 1) as f64
        );
        for _ in 0..3 {
            assert_eq!(answered_by(&router).await, "tok");
        }
        let said = warnings();
        assert_eq!(said.len(), n + 1, "{said:#?}");
        let last = &said[n];
        assert!(
            last.contains("tok")
                && last.contains(&token.display().to_string())
                && last.contains(why),
            "{last}"
        );
    }
    assert_eq!(credential_reloads(&router, "tok", "token", "ok").await, 0.0);

    std::fs::write(&token, "next-token").unwrap();
    tok.require_token("next-token");
    until_credential_reloads(&router, "tok", "token", "ok", 1.0).await;
    for _ in 0..3 {
        assert_eq!(answered_by(&router).await, "tok");
    }
}
