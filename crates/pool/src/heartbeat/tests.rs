use std::time::Duration;

use super::*;

fn pod(port: u16, stale: bool, waiting: u32, kv: f64, prefill: Option<f64>) -> PodSample {
    PodSample {
        addr: std::net::SocketAddr::from(([10, 0, 0, 1], port)),
        name: format!("ns/p{port}"),
        metrics_age: Some(Duration::from_millis(u64::from(port))),
        stale,
        scrape: infergate_metrics::ScrapeState::Ok,
        ejected: false,
        waiting: Some(waiting),
        running: Some(2),
        kv_cache_usage: Some(kv),
        lora_running: None,
        lora_waiting: None,
        lora_max: None,
        inflight: 0,
        awaiting_first_token: 0,
        awaiting_first_token_tokens: 0,
        prefill_tokens_per_sec: prefill,
        bulk_prefill_tokens_per_sec: prefill,
        fixed_cost_secs: None,
        decode_tokens_per_sec: Some(64.0),
        cold_prefill_tokens_per_sec: 4_000.0,
        cold_decode_tokens_per_sec: 40.0,
        answers: Default::default(),
        failure_percent: None,
    }
}

/// A model entry as a gateway that predates the optional fields (`fixedCostMs`, `waitMs`,
/// `adapters`) wrote it.
const OLDER_ENTRY: &str = r#"{"name":"m","pods":1,"readyPods":1,"saturation":0.0,"queue":0,
    "running":0,"inflight":0,"estimatedTtftMs":100.0,"prefillMs":100.0,"drainMs":0.0}"#;

const LIMITS: Limits = Limits {
    queue_depth: 4.0,
    kv_cache: 0.8,
    mean_prompt_tokens: 512.0,
};

#[test]
fn idle_ready_pods_give_one_prefill_and_no_drain() {
    let s = status(
        "llama",
        &[
            pod(1, false, 0, 0.0, Some(5_120.0)),
            pod(2, false, 0, 0.0, None),
        ],
        3,
        0,
        &LIMITS,
    );
    assert_eq!(s.pods, 2);
    assert_eq!(s.ready_pods, 2);
    assert_eq!(s.saturation, 0.0);
    assert_eq!(s.queue, 0);
    assert_eq!(s.running, 4);
    assert_eq!(s.inflight, 3);
    // 512 tokens at the learned 5,120 tokens/s: 100 ms (the other pod's prior gives 128 ms).
    assert_eq!(s.estimated_ttft_ms, Some(100.0));
    assert_eq!(s.prefill_ms, Some(100.0));
    assert_eq!(s.drain_ms, 0.0);
    assert_eq!(s.newest_metrics_age_ms, Some(1));
}

#[test]
fn queues_raise_ttft_saturation_and_drain() {
    // Queue of 6 at threshold 4: saturated (load 1), 3 requests over, each 512 tokens at 5,120/s.
    let s = status("m", &[pod(1, false, 6, 0.5, Some(5_120.0))], 0, 0, &LIMITS);
    assert_eq!(s.saturation, 1.0);
    assert_eq!(s.queue, 6);
    assert_eq!(s.estimated_ttft_ms, Some(700.0));
    assert_eq!(s.prefill_ms, Some(100.0));
    assert!((s.drain_ms - 300.0).abs() < 1e-9, "{}", s.drain_ms);
    // Half the queue threshold and 0.4 of 0.8 KV: load 0.5.
    let s = status("m", &[pod(1, false, 2, 0.4, Some(5_120.0))], 0, 0, &LIMITS);
    assert_eq!(s.saturation, 0.5);
    assert_eq!(s.drain_ms, 0.0);
}

#[test]
fn requests_held_in_flow_control_count_in_the_estimates() {
    // Two idle pods, 6 requests held by flow control: 3 ahead on each pod, so the typical
    // request waits for 4 prefills of 512 tokens at 5,120/s; before, the document said 100 ms.
    let pods = [
        pod(1, false, 0, 0.0, Some(5_120.0)),
        pod(2, false, 0, 0.0, Some(5_120.0)),
    ];
    let s = status("m", &pods, 0, 6, &LIMITS);
    assert_eq!(s.flow_queue, 6);
    assert_eq!(s.queue, 0, "the scraped queues are reported apart");
    assert_eq!(s.estimated_ttft_ms, Some(400.0));
    assert_eq!(s.saturation, 0.75);
    let none = status("m", &pods, 0, 0, &LIMITS);
    assert_eq!(none.estimated_ttft_ms, Some(100.0));
    // An older document without the field reads as none held.
    let mut json = serde_json::to_value(&none).unwrap();
    json.as_object_mut().unwrap().remove("flowQueue");
    let back: ModelStatus = serde_json::from_value(json).unwrap();
    assert_eq!(back.flow_queue, 0);
}

#[test]
fn a_full_kv_cache_adds_the_time_to_free_it() {
    // KV 0.9 over 0.8: half way to full, 128 output tokens at 64/s → 1 s.
    let s = status("m", &[pod(1, false, 0, 0.9, Some(5_120.0))], 0, 0, &LIMITS);
    assert_eq!(s.saturation, 1.0);
    let ttft = s.estimated_ttft_ms.unwrap();
    assert!((ttft - 1_100.0).abs() < 1e-6, "{ttft}");
}

#[test]
fn stale_pods_are_not_ready_and_a_pool_of_them_is_a_gray_failure() {
    let s = status(
        "m",
        &[pod(1, true, 0, 0.0, None), pod(2, true, 0, 0.0, None)],
        0,
        0,
        &LIMITS,
    );
    assert_eq!(s.pods, 2);
    assert_eq!(s.ready_pods, 0);
    assert_eq!(s.saturation, 1.0);
    assert_eq!(s.estimated_ttft_ms, None);
    // Stale pods' queues are not counted.
    let s = status(
        "m",
        &[pod(1, true, 9, 0.0, None), pod(2, false, 1, 0.0, None)],
        0,
        0,
        &LIMITS,
    );
    assert_eq!(s.ready_pods, 1);
    assert_eq!(s.queue, 1);
}

#[test]
fn documents_count_generations_and_round_trip_through_json() {
    let hb = Heartbeats::new();
    let a: Heartbeat = serde_json::from_str(&hb.render(std::iter::empty())).unwrap();
    let b: Heartbeat = serde_json::from_str(&hb.render(std::iter::empty())).unwrap();
    assert_eq!(a.schema, SCHEMA);
    assert_eq!((a.generation, b.generation), (1, 2));
    assert_eq!(a.instance, b.instance);
    assert!(b.timestamp_ms >= a.timestamp_ms);
    let s = status("m", &[pod(1, false, 0, 0.0, Some(5_120.0))], 0, 0, &LIMITS);
    let json = serde_json::to_string(&s).unwrap();
    assert!(json.contains(r#""readyPods":1"#), "{json}");
    assert!(json.contains(r#""estimatedTtftMs":100.0"#), "{json}");
    assert_eq!(serde_json::from_str::<ModelStatus>(&json).unwrap(), s);
}

/// A pod outlier detection ejected looks idle (its requests fail at once): it is not ready, and
/// its empty queue does not make the model's estimates look better than what a request routed
/// now finds.
#[test]
fn an_ejected_pod_is_not_ready_and_not_in_the_estimates() {
    let busy = pod(1, false, 8, 0.5, Some(5_120.0));
    let failing = PodSample {
        ejected: true,
        ..pod(2, false, 0, 0.0, Some(5_120.0))
    };
    let both = status("m", &[busy.clone(), failing.clone()], 0, 0, &LIMITS);
    let alone = status("m", &[busy], 0, 0, &LIMITS);
    assert_eq!((both.pods, both.ready_pods), (2, 1));
    assert_eq!(both.estimated_ttft_ms, alone.estimated_ttft_ms);
    assert_eq!(both.saturation, alone.saturation);
    let none = status("m", &[failing], 0, 0, &LIMITS);
    assert_eq!(none.ready_pods, 0);
}

#[test]
fn a_rate_learned_from_short_prompts_is_not_extrapolated_below_the_prior() {
    let estimate = |prefill: Option<f64>, bulk: Option<f64>| {
        let p = PodSample {
            prefill_tokens_per_sec: prefill,
            bulk_prefill_tokens_per_sec: bulk,
            ..pod(1, false, 0, 0.0, None)
        };
        status("m", &[p], 0, 0, &LIMITS).estimated_ttft_ms.unwrap()
    };
    // Seven-token prompts answered in 40 ms by an emulated A10G: 175 tokens/s, mostly the fixed
    // cost of a step. Extrapolated to 512 tokens that was 2.9 s; the prior gives 128 ms (the pod
    // takes 165 ms).
    assert!((estimate(Some(175.0), None) - 128.0).abs() < 1e-9);
    // Above the prior, it is a better guess than the prior (it can only be too slow).
    assert!((estimate(Some(5_120.0), None) - 100.0).abs() < 1e-9);
    // A rate learned on long prompts is used as it is, below the prior too.
    assert!((estimate(Some(175.0), Some(3_103.0)) - 512.0 / 3.103).abs() < 1e-6);
}

/// A pod that has learned nothing is estimated at its cold-start rates, which depend on its GPU
/// type: a cold A10G (125/989 of the 4,000 tokens/s an H100 is assumed at) is
/// the best pod of none, and its prefill of a typical request takes 1,013 ms, not 128 ms.
#[test]
fn a_cold_pod_is_estimated_at_its_own_prior() {
    let cold = |port: u16, prefill: f64, decode: f64| PodSample {
        cold_prefill_tokens_per_sec: prefill,
        cold_decode_tokens_per_sec: decode,
        ..pod(port, false, 0, 0.0, None)
    };
    let a10g = cold(1, 4_000.0 * 125.0 / 989.0, 40.0 * 0.6 / 3.35);
    let h100 = cold(2, 4_000.0, 40.0);
    let alone = status("m", std::slice::from_ref(&a10g), 0, 0, &LIMITS);
    assert!(
        close(alone.prefill_ms, 512.0 / 4.0 * 989.0 / 125.0),
        "{alone:?}"
    );
    let both = status("m", &[a10g.clone(), h100], 0, 0, &LIMITS);
    assert!(close(both.prefill_ms, 128.0), "{both:?}");
    // A rate learned from short prompts still counts only where it beats the pod's prior: 600
    // tokens/s beats the A10G's 506 (not the H100's 4,000).
    let short = PodSample {
        prefill_tokens_per_sec: Some(600.0),
        ..a10g.clone()
    };
    let s = status("m", &[short], 0, 0, &LIMITS);
    assert!(close(s.prefill_ms, 512.0 / 0.6), "{s:?}");
    // Its decode prior frees a full KV cache: 0.1 of 128 tokens at 40 × 0.6 / 3.35 tokens/s.
    let full = PodSample {
        kv_cache_usage: Some(0.8),
        decode_tokens_per_sec: None,
        ..a10g
    };
    let s = status("m", &[full], 0, 0, &LIMITS);
    assert!(
        close(s.wait_ms, 0.1 * 128.0 / (40.0 * 0.6 / 3.35) * 1e3),
        "{s:?}"
    );
}

/// The fixed cost per request is paid once by every request, queued or sent, and published for
/// the pod the estimate is for; left out (as an older gateway leaves it) until one is learned.
#[test]
fn the_fixed_cost_is_paid_per_request_and_published_for_the_best_pod() {
    let with = |port: u16, waiting: u32, fixed: Option<f64>| PodSample {
        fixed_cost_secs: fixed,
        ..pod(port, false, waiting, 0.0, Some(5_120.0))
    };
    // 512 tokens at 5,120 tokens/s: 100 ms, plus 35 ms fixed. The idle pod (135 ms) is the
    // best, not the busy one (four requests at 120 ms: 480 ms).
    let s = status(
        "m",
        &[with(1, 3, Some(0.020)), with(2, 0, Some(0.035))],
        0,
        0,
        &LIMITS,
    );
    assert!((s.estimated_ttft_ms.unwrap() - 135.0).abs() < 1e-9, "{s:?}");
    assert!((s.prefill_ms.unwrap() - 135.0).abs() < 1e-9, "{s:?}");
    assert!((s.fixed_cost_ms.unwrap() - 35.0).abs() < 1e-9, "{s:?}");
    let json = serde_json::to_string(&s).unwrap();
    assert!(json.contains(r#""fixedCostMs":35"#), "{json}");
    // A queue pays it per request: three waiting, four fixed costs.
    let busy = status("m", &[with(1, 3, Some(0.020))], 0, 0, &LIMITS);
    assert!(
        (busy.estimated_ttft_ms.unwrap() - 4.0 * 120.0).abs() < 1e-9,
        "{busy:?}"
    );
    // Not learned yet: absent from the document, and the estimates as before.
    let s = status("m", &[with(1, 0, None)], 0, 0, &LIMITS);
    assert_eq!(s.fixed_cost_ms, None);
    assert_eq!(s.estimated_ttft_ms, Some(100.0));
    let json = serde_json::to_string(&s).unwrap();
    assert!(!json.contains("fixedCostMs"), "{json}");
    // A document without the field (an older gateway) reads as not learned.
    let old = OLDER_ENTRY;
    assert_eq!(
        serde_json::from_str::<ModelStatus>(old)
            .unwrap()
            .fixed_cost_ms,
        None
    );
    // No ready pod: nothing to publish.
    let stale = PodSample {
        stale: true,
        ..with(1, 0, Some(0.035))
    };
    assert_eq!(status("m", &[stale], 0, 0, &LIMITS).fixed_cost_ms, None);
}

/// A pod at 5,120 tokens/s with a fixed cost of 20 ms, `waiting` requests in its scraped queue
/// and this process's `own` requests on it without a first token, of `tokens` prompt tokens in
/// all.
fn queued(port: u16, waiting: u32, own: u32, tokens: u64) -> PodSample {
    PodSample {
        awaiting_first_token: own,
        awaiting_first_token_tokens: tokens,
        fixed_cost_secs: Some(0.020),
        ..pod(port, false, waiting, 0.0, Some(5_120.0))
    }
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-6)
}

/// The queue in real terms: four requests of 50 prompt tokens ahead wait 4 × 20 ms of fixed cost
/// and 200 tokens at 5,120 tokens/s (119 ms); four of 4,000 tokens, 3.2 s. `estimatedTtftMs`
/// counts both queues as typical requests (600 ms, the 480 ms queue of which a poller scaled
/// whole by its prompt) and keeps that meaning.
#[test]
fn the_wait_counts_queued_requests_at_the_prompt_tokens_they_were_routed_with() {
    let short = status("m", &[queued(1, 4, 4, 4 * 50)], 0, 0, &LIMITS);
    assert!(close(short.wait_ms, 4.0 * 20.0 + 200.0 / 5.12), "{short:?}");
    let long = status("m", &[queued(1, 4, 4, 4 * 4_000)], 0, 0, &LIMITS);
    assert!(
        close(long.wait_ms, 4.0 * 20.0 + 16_000.0 / 5.12),
        "{long:?}"
    );
    for s in [&short, &long] {
        assert!(close(s.estimated_ttft_ms, 5.0 * 120.0), "{s:?}");
        assert!(close(s.prefill_ms, 120.0), "{s:?}");
        assert!(close(s.fixed_cost_ms, 20.0), "{s:?}");
    }
    // Own requests not yet in the scraped queue (picked since the page, or in their prefill
    // step) count too.
    let ahead = status("m", &[queued(1, 0, 2, 2 * 1_000)], 0, 0, &LIMITS);
    assert!(
        close(ahead.wait_ms, 2.0 * 20.0 + 2_000.0 / 5.12),
        "{ahead:?}"
    );
    // Idle: nothing to wait for, and the typical estimate is its own prefill.
    let idle = status("m", &[queued(1, 0, 0, 0)], 0, 0, &LIMITS);
    assert_eq!(idle.wait_ms, Some(0.0));
    // In the document, and read back.
    let json = serde_json::to_string(&long).unwrap();
    assert!(json.contains(r#""waitMs":3205"#), "{json}");
    let back: ModelStatus = serde_json::from_str(&json).unwrap();
    assert!(close(back.wait_ms, 3_205.0), "{json}");
}

/// Requests the process cannot see — a scraped queue longer than its own requests there, and
/// those held in flow control — count at the mean prompt of the requests it routed; with
/// nothing learned (512 tokens) the wait is the typical estimate less its own prefill.
#[test]
fn requests_it_cannot_see_count_at_the_mean_prompt() {
    let short_mean = Limits {
        mean_prompt_tokens: 64.0,
        ..LIMITS
    };
    // Six waiting, two of them its own (300 tokens): four others of 64 tokens.
    let s = status("m", &[queued(1, 6, 2, 300)], 0, 0, &short_mean);
    assert!(
        close(s.wait_ms, 6.0 * 20.0 + (300.0 + 4.0 * 64.0) / 5.12),
        "{s:?}"
    );
    // Four held in flow control over two idle pods: two ahead on each, at the mean.
    let pods = [queued(1, 0, 0, 0), queued(2, 0, 0, 0)];
    let s = status("m", &pods, 0, 4, &short_mean);
    assert!(close(s.wait_ms, 2.0 * 20.0 + 2.0 * 64.0 / 5.12), "{s:?}");
    // The mean still at its start: the same as the typical estimate.
    let s = status("m", &[queued(1, 3, 0, 0)], 0, 0, &LIMITS);
    let typical = s.estimated_ttft_ms.unwrap() - s.prefill_ms.unwrap();
    assert!(close(s.wait_ms, typical), "{s:?}");
}

/// The best pod is the one a typical request reaches first counting the queues in real terms:
/// two queued 50-token prompts beat one queued 4,000-token prompt, which counted as typical
/// requests looked shorter; every per-pod figure is that pod's.
#[test]
fn the_best_pod_is_chosen_on_the_queue_in_real_terms() {
    let long_ahead = queued(1, 1, 1, 4_000);
    let short_ahead = queued(2, 2, 2, 100);
    let s = status("m", &[long_ahead, short_ahead], 0, 0, &LIMITS);
    assert!(close(s.wait_ms, 2.0 * 20.0 + 100.0 / 5.12), "{s:?}");
    assert!(close(s.estimated_ttft_ms, 3.0 * 120.0), "{s:?}");
}

#[test]
fn with_no_ready_pod_there_is_no_wait() {
    let stale = PodSample {
        stale: true,
        ..queued(1, 3, 3, 900)
    };
    let ejected = PodSample {
        ejected: true,
        ..queued(2, 3, 3, 900)
    };
    let s = status("m", &[stale, ejected], 0, 5, &LIMITS);
    assert_eq!((s.ready_pods, s.wait_ms), (0, None));
    let json = serde_json::to_string(&s).unwrap();
    assert!(!json.contains("waitMs"), "{json}");
    assert_eq!(status("m", &[], 0, 0, &LIMITS).wait_ms, None);
    // A document from a gateway that predates the field reads as none.
    let old = OLDER_ENTRY;
    assert_eq!(
        serde_json::from_str::<ModelStatus>(old).unwrap().wait_ms,
        None
    );
}

/// Values no pool produces, from a broken scrape or settings: the wait stays a finite,
/// non-negative number of milliseconds.
#[test]
fn hostile_values_give_a_finite_wait() {
    for mean in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.0] {
        let limits = Limits {
            mean_prompt_tokens: mean,
            ..LIMITS
        };
        // Counted as the typical 512 tokens.
        let s = status("m", &[queued(1, 3, 0, 0)], 0, 0, &limits);
        assert!(close(s.wait_ms, 3.0 * 20.0 + 3.0 * 100.0), "{mean}: {s:?}");
    }
    let huge = PodSample {
        fixed_cost_secs: Some(f64::NAN),
        bulk_prefill_tokens_per_sec: Some(f64::INFINITY),
        kv_cache_usage: Some(1.0),
        decode_tokens_per_sec: Some(0.0),
        ..queued(1, u32::MAX, u32::MAX, u64::MAX)
    };
    let zero_rate = PodSample {
        bulk_prefill_tokens_per_sec: Some(0.0),
        prefill_tokens_per_sec: Some(f64::NAN),
        ..queued(2, u32::MAX, 0, u64::MAX)
    };
    for p in [huge, zero_rate] {
        let s = status("m", &[p], usize::MAX, usize::MAX, &LIMITS);
        let wait = s.wait_ms.unwrap();
        assert!(wait.is_finite() && wait >= 0.0, "{s:?}");
        let json = serde_json::to_string(&s).unwrap();
        let back: ModelStatus = serde_json::from_str(&json).unwrap();
        assert!(back.wait_ms.is_some_and(f64::is_finite), "{json}");
    }
}

/// `drainMs` counts the queue as `waitMs` does, in the tokens it holds: eight own requests of 20
/// tokens over a queue depth of 4 drain once five of them are through, each its 20 ms of fixed
/// cost and 20 tokens at 5,120 tokens/s (119.5 ms); eight of 4,000 tokens, 3.99 s. Before, each
/// counted as a typical request: 600 ms for both.
#[test]
fn the_drain_counts_the_queue_in_the_tokens_it_holds() {
    let short = status("m", &[queued(1, 8, 8, 8 * 20)], 0, 0, &LIMITS);
    assert!(
        (short.drain_ms - 5.0 * (20.0 + 20.0 / 5.12)).abs() < 1e-6,
        "{short:?}"
    );
    let long = status("m", &[queued(1, 8, 8, 8 * 4_000)], 0, 0, &LIMITS);
    assert!(
        (long.drain_ms - 5.0 * (20.0 + 4_000.0 / 5.12)).abs() < 1e-6,
        "{long:?}"
    );
    // Requests it cannot see count at the mean prompt there too: eight scraped, none its own.
    let short_mean = Limits {
        mean_prompt_tokens: 64.0,
        ..LIMITS
    };
    let unseen = status("m", &[queued(1, 8, 0, 0)], 0, 0, &short_mean);
    assert!(
        (unseen.drain_ms - 5.0 * (20.0 + 64.0 / 5.12)).abs() < 1e-6,
        "{unseen:?}"
    );
    // Under the queue depth: nothing to drain, whatever the tokens.
    let under = status("m", &[queued(1, 3, 3, 3 * 4_000)], 0, 0, &LIMITS);
    assert_eq!(under.drain_ms, 0.0);
}

/// `adapters` names the LoRA adapters an entry's pods serve, for a poller that counts its own
/// requests per name: present with some, left out with none, and read as none from a document
/// that predates it.
#[test]
fn adapters_are_published_when_there_are_some() {
    let s = ModelStatus {
        adapters: vec!["sql-lora".into()],
        ..status("m", &[pod(1, false, 0, 0.0, Some(5_120.0))], 0, 0, &LIMITS)
    };
    let json = serde_json::to_string(&s).unwrap();
    assert!(json.contains(r#""adapters":["sql-lora"]"#), "{json}");
    assert_eq!(serde_json::from_str::<ModelStatus>(&json).unwrap(), s);
    let none = status("m", &[pod(1, false, 0, 0.0, Some(5_120.0))], 0, 0, &LIMITS);
    let json = serde_json::to_string(&none).unwrap();
    assert!(!json.contains("adapters"), "{json}");
    let old = OLDER_ENTRY;
    assert!(
        serde_json::from_str::<ModelStatus>(old)
            .unwrap()
            .adapters
            .is_empty()
    );
    // A malformed list (a string, a number among the names) is refused, not read as some other
    // set of adapters: the poller then counts the heartbeat as failed and says why.
    for bad in [r#""sql""#, r#"["sql", 7]"#, "null"] {
        let doc = OLDER_ENTRY.replace("}", &format!(r#","adapters":{bad}}}"#));
        let err = serde_json::from_str::<ModelStatus>(&doc).unwrap_err();
        assert!(err.to_string().contains("invalid type"), "{bad}: {err}");
    }
}
