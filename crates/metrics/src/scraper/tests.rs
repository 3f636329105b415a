#![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

use std::time::Duration;

use infergate_scheduler::Timestamp;

use super::*;

#[test]
fn default_config_is_valid_and_bad_values_are_named() {
    assert_eq!(ScraperConfig::default().validate().ok(), Some(()));
    let bad = [
        ScraperConfig {
            interval: Duration::ZERO,
            ..ScraperConfig::default()
        },
        ScraperConfig {
            stale_after: Duration::from_millis(10),
            ..ScraperConfig::default()
        },
        ScraperConfig {
            timeout: Duration::ZERO,
            ..ScraperConfig::default()
        },
        ScraperConfig {
            max_body_bytes: 0,
            ..ScraperConfig::default()
        },
        ScraperConfig {
            max_concurrency: 0,
            ..ScraperConfig::default()
        },
    ];
    for config in bad {
        let err = config.validate().unwrap_err();
        assert!(matches!(err, Error::InvalidConfig(_)), "{config:?}");
    }
}

#[test]
fn phases_spread_over_the_interval() {
    let interval = Duration::from_millis(50);
    let mut phases: Vec<Duration> = (0..1000).map(|n| phase(n, interval)).collect();
    assert!(phases.iter().all(|p| *p < interval));
    phases.sort();
    // Golden-ratio spacing: no two of 1,000 targets closer than a small fraction of the even gap,
    // and no gap much larger than it.
    let even = interval / 1000;
    for w in phases.windows(2) {
        let gap = w[1] - w[0];
        assert!(gap > even / 4 && gap < even * 4, "gap {gap:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn clock_follows_tokio_time() {
    let clock = Clock::starting_now();
    assert_eq!(clock.now(), Timestamp::ZERO);
    tokio::time::advance(Duration::from_millis(1500)).await;
    assert_eq!(clock.now(), Timestamp::from_millis(1500));
    let before = clock.origin().checked_sub(Duration::from_secs(1));
    if let Some(before) = before {
        assert_eq!(clock.at(before), Timestamp::ZERO);
    }
}

#[test]
fn invalid_paths_are_rejected_before_anything_runs() {
    let target = Target {
        id: 1u32,
        addr: "127.0.0.1:1".parse().unwrap(),
        engine: EngineType::Vllm,
        path: "not a path".to_owned(),
    };
    assert!(matches!(
        endpoint(&target, None),
        Err(Error::InvalidPath { .. })
    ));
}
