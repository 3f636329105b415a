//! Flow control explains the queue path at debug level. A binary of its own: tracing caches
//! whether a log line is wanted from the first thread to reach it, so a test that reads its own
//! log lines must not share them with tests running beside it.

#![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

use std::task::{Context, Poll, Waker};
use std::time::Duration;

use infergate_metrics::Clock;
use infergate_pool::flow::{FlowController, FlowMetrics, Queued, Turn};
use infergate_pool::tenant::Tenancy;
use infergate_scheduler::Priority;
use infergate_scheduler::flow::{FlowConfig, FlowRequest};

fn poll(q: &mut Queued) -> Option<Turn> {
    let mut cx = Context::from_waker(Waker::noop());
    match q.poll_turn(&mut cx) {
        Poll::Ready(t) => Some(t),
        Poll::Pending => None,
    }
}

/// Each request on the queue path is explained at debug level: when it is queued, and how it
/// left (here dispatched after 250 ms, and refused by a full band).
#[tokio::test(start_paused = true)]
async fn the_queue_path_is_explained_at_debug_level() {
    let out = infergate_testkit::CapturedLog::default();
    let _log = tracing::subscriber::set_default(out.subscriber(tracing::Level::DEBUG));
    let mut cfg = FlowConfig {
        enabled: true,
        ..FlowConfig::default()
    };
    cfg.bands.standard.max_requests = 1;
    let c = FlowController::new(
        "p",
        cfg,
        Tenancy::default(),
        Clock::starting_now(),
        &FlowMetrics::default(),
    );
    let req = |tenant| FlowRequest::new(tenant, Priority::Standard, 100);
    let mut a = c.enqueue(req("a"), None).unwrap();
    assert!(c.enqueue(req("b"), None).is_err());
    tokio::time::advance(Duration::from_millis(250)).await;
    assert_eq!(poll(&mut a), Some(Turn::Try));
    assert!(a.dispatched().is_some());
    let text = out.text();
    assert!(
        text.contains("flow control: queued") && text.contains("band_queued=1"),
        "{text}"
    );
    assert!(text.contains("outcome=\"rejected-saturated\""), "{text}");
    assert!(
        text.contains("outcome=\"dispatched\" waited_ms=250"),
        "{text}"
    );
}
