use super::*;

const S: Duration = Duration::from_secs(1);

fn cfg() -> OutlierDetection {
    OutlierDetection {
        consecutive_5xx: 3,
        base_ejection_ms: 10_000,
        max_ejection_ms: 25_000,
        max_ejection_percent: 50,
        failure_percentage: None,
    }
}

fn at(secs: u64) -> Timestamp {
    Timestamp::from_millis(secs * 1000)
}

#[test]
fn statuses_that_count_against_a_pod() {
    for (status, want) in [
        (200, Answer::Success),
        (204, Answer::Success),
        (500, Answer::Failure),
        (502, Answer::Failure),
        (503, Answer::Failure),
        (504, Answer::Failure),
        (501, Answer::Neutral),
        (505, Answer::Neutral),
        (400, Answer::Neutral),
        (404, Answer::Neutral),
        (429, Answer::Neutral),
        (302, Answer::Neutral),
    ] {
        assert_eq!(Answer::of_status(status), want, "{status}");
    }
}

#[test]
fn a_run_ejects_a_success_starts_it_again_and_neutral_answers_change_nothing() {
    let c = cfg();
    let mut o = EndpointOutlier::default();
    let seen = |o: &mut EndpointOutlier, a| o.observe(a, at(1), &c, 0, 4);
    assert_eq!(seen(&mut o, Answer::Failure), None);
    assert_eq!(seen(&mut o, Answer::Failure), None);
    assert_eq!(seen(&mut o, Answer::Success), None);
    assert_eq!(seen(&mut o, Answer::Failure), None);
    assert_eq!(seen(&mut o, Answer::Neutral), None);
    assert_eq!(seen(&mut o, Answer::Failure), None);
    assert_eq!(
        seen(&mut o, Answer::Failure),
        Some(Ejection::Ejected {
            length: 10 * S,
            in_a_row: 1,
            cause: Cause::Consecutive5xx,
        })
    );
    assert!(o.is_ejected(at(1)));
    assert!(o.is_ejected(at(10)));
    assert!(!o.is_ejected(at(11)));
    assert_eq!(o.ejected_until(at(5)), Some(at(11)));
    assert_eq!(o.ejected_until(at(11)), None);
}

#[test]
fn failures_during_an_ejection_start_no_run() {
    let c = cfg();
    let mut o = EndpointOutlier::default();
    for _ in 0..3 {
        o.observe(Answer::Failure, at(0), &c, 0, 4);
    }
    assert!(o.is_ejected(at(1)));
    for _ in 0..10 {
        assert_eq!(o.observe(Answer::Failure, at(5), &c, 0, 4), None);
    }
    // Back at 10 s: a fresh run of three is needed.
    assert_eq!(o.observe(Answer::Failure, at(10), &c, 0, 4), None);
    assert_eq!(o.observe(Answer::Failure, at(10), &c, 0, 4), None);
    assert!(matches!(
        o.observe(Answer::Failure, at(10), &c, 0, 4),
        Some(Ejection::Ejected { .. })
    ));
}

#[test]
fn each_ejection_in_a_row_is_longer_up_to_the_cap_and_good_service_forgives() {
    let c = cfg();
    let mut o = EndpointOutlier::default();
    let eject_at = |o: &mut EndpointOutlier, t: u64| {
        let mut last = None;
        for _ in 0..3 {
            last = o.observe(Answer::Failure, at(t), &c, 0, 4);
        }
        last
    };
    let length = |e: Option<Ejection>| match e {
        Some(Ejection::Ejected { length, .. }) => length,
        other => panic!("{other:?}"),
    };
    assert_eq!(length(eject_at(&mut o, 0)), 10 * S);
    // Fails again as soon as it is back: twice as long, then capped at 25 s.
    assert_eq!(length(eject_at(&mut o, 10)), 20 * S);
    assert_eq!(length(eject_at(&mut o, 30)), 25 * S);
    // Served 20 s (two base lengths) after the last ejection ended at 55 s: two off the count
    // of three, so the next is the second in a row.
    assert_eq!(length(eject_at(&mut o, 75)), 20 * S);
}

#[test]
fn the_cap_rounds_down_and_holds_back() {
    let c = cfg();
    let mut o = EndpointOutlier::default();
    let run = |o: &mut EndpointOutlier, ejected, pool| {
        let mut last = None;
        for _ in 0..3 {
            last = o.observe(Answer::Failure, at(0), &c, ejected, pool);
        }
        last
    };
    // 50% of one pod is none, of three one.
    assert_eq!(run(&mut o, 0, 1), Some(Ejection::HeldBack));
    assert!(!o.is_ejected(at(0)));
    assert_eq!(run(&mut o, 1, 3), Some(Ejection::HeldBack));
    assert!(matches!(run(&mut o, 0, 3), Some(Ejection::Ejected { .. })));
    // 100% may take the last one.
    let all = OutlierDetection {
        max_ejection_percent: 100,
        ..cfg()
    };
    let mut o = EndpointOutlier::default();
    for _ in 0..2 {
        o.observe(Answer::Failure, at(0), &all, 0, 1);
    }
    assert!(matches!(
        o.observe(Answer::Failure, at(0), &all, 0, 1),
        Some(Ejection::Ejected { .. })
    ));
}

#[test]
fn settings_it_cannot_use_name_their_field() {
    assert_eq!(OutlierDetection::default().validate(), Ok(()));
    for (bad, want) in [
        (
            OutlierDetection {
                consecutive_5xx: 0,
                ..cfg()
            },
            "`outlierDetection.consecutive5xx` must be at least 1",
        ),
        (
            OutlierDetection {
                base_ejection_ms: 0,
                ..cfg()
            },
            "`outlierDetection.baseEjectionMs` must be from 1 to",
        ),
        (
            OutlierDetection {
                max_ejection_ms: WEEK_MS + 1,
                ..cfg()
            },
            "`outlierDetection.maxEjectionMs` must be from 1 to",
        ),
        (
            OutlierDetection {
                max_ejection_ms: 5_000,
                ..cfg()
            },
            "`outlierDetection.maxEjectionMs` 5000 is below baseEjectionMs (10000)",
        ),
        (
            OutlierDetection {
                max_ejection_percent: 101,
                ..cfg()
            },
            "`outlierDetection.maxEjectionPercent` 101 is over 100",
        ),
        (
            OutlierDetection {
                failure_percentage: Some(FailurePercentage {
                    threshold: 0,
                    ..FailurePercentage::default()
                }),
                ..cfg()
            },
            "`outlierDetection.failurePercentage.threshold` 0 is not a percentage from 1 to 100",
        ),
        (
            OutlierDetection {
                failure_percentage: Some(FailurePercentage {
                    threshold: 101,
                    ..FailurePercentage::default()
                }),
                ..cfg()
            },
            "`outlierDetection.failurePercentage.threshold` 101 is not a percentage",
        ),
        (
            OutlierDetection {
                failure_percentage: Some(FailurePercentage {
                    minimum_requests: 0,
                    ..FailurePercentage::default()
                }),
                ..cfg()
            },
            "`outlierDetection.failurePercentage.minimumRequests` must be at least 1",
        ),
        (
            OutlierDetection {
                failure_percentage: Some(FailurePercentage {
                    interval_ms: 0,
                    ..FailurePercentage::default()
                }),
                ..cfg()
            },
            "`outlierDetection.failurePercentage.intervalMs` must be from 1 to",
        ),
    ] {
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
    let parsed: OutlierDetection =
        serde_yaml::from_str("{ consecutive5xx: 2, maxEjectionPercent: 30 }").unwrap();
    assert_eq!(
        parsed,
        OutlierDetection {
            consecutive_5xx: 2,
            max_ejection_percent: 30,
            ..OutlierDetection::default()
        }
    );
    assert!(serde_yaml::from_str::<OutlierDetection>("{ consecutive_5xx: 2 }").is_err());
    // `failurePercentage: {}` turns it on with its defaults; unknown keys are refused.
    let parsed: OutlierDetection =
        serde_yaml::from_str("{ failurePercentage: {}, maxEjectionPercent: 30 }").unwrap();
    assert_eq!(
        parsed.failure_percentage,
        Some(FailurePercentage {
            threshold: 50,
            minimum_requests: 20,
            interval_ms: 10_000,
        })
    );
    assert!(
        serde_yaml::from_str::<OutlierDetection>("{ failurePercentage: { percent: 20 } }").is_err()
    );
}

fn by_share() -> OutlierDetection {
    OutlierDetection {
        consecutive_5xx: 3,
        failure_percentage: Some(FailurePercentage {
            threshold: 40,
            minimum_requests: 10,
            interval_ms: 5_000,
        }),
        ..cfg()
    }
}

/// A pod failing every other answer never fails `consecutive5xx` in a row; the share over an
/// interval ejects it, judged by the first answer after the interval ends.
#[test]
fn failure_percentage_ejects_a_pod_failing_every_other_answer() {
    let c = by_share();
    let mut o = EndpointOutlier::default();
    let ms = |t: u64| Timestamp::from_millis(t);
    // 20 answers in the first 4 s, every other one failed.
    for i in 0..20u64 {
        let a = if i % 2 == 0 {
            Answer::Failure
        } else {
            Answer::Success
        };
        assert_eq!(o.observe(a, ms(i * 200), &c, 0, 4), None, "answer {i}");
    }
    // Without failurePercentage the same answers never eject.
    let mut plain = EndpointOutlier::default();
    for i in 0..40u64 {
        let a = if i % 2 == 0 {
            Answer::Failure
        } else {
            Answer::Success
        };
        assert_eq!(plain.observe(a, ms(i * 200), &cfg(), 0, 4), None);
    }
    // The interval ends at 5 s: the next answer, a success, closes and judges it.
    assert_eq!(
        o.observe(Answer::Success, ms(5_000), &c, 0, 4),
        Some(Ejection::Ejected {
            length: 10 * S,
            in_a_row: 1,
            cause: Cause::FailurePercentage {
                failed: 10,
                answers: 20
            },
        })
    );
    assert!(o.is_ejected(ms(5_001)));
    // After the ejection a new interval starts from nothing; the one judged is kept for its
    // gauge.
    assert_eq!(o.interval, Interval::default());
    assert_eq!(
        o.judged(),
        Some(Judged {
            failed: 10,
            answers: 20
        })
    );
    assert_eq!(o.judged().map(|j| j.failure_percent()), Some(50.0));
    assert_eq!(plain.judged(), None, "no failurePercentage, nothing judged");
}

/// Every answer is counted by verdict, also those an ejection ignores and neutral ones; an
/// interval judged without ejecting is kept too.
#[test]
fn answers_are_counted_by_verdict_and_every_judged_interval_is_kept() {
    let c = by_share();
    let ms = |t: u64| Timestamp::from_millis(t);
    let mut o = EndpointOutlier::default();
    for (i, a) in [
        Answer::Success,
        Answer::Failure,
        Answer::Neutral,
        Answer::Success,
    ]
    .into_iter()
    .cycle()
    .take(12)
    .enumerate()
    {
        o.observe(a, ms(i as u64), &c, 0, 4);
    }
    assert_eq!(o.judged(), None, "the interval has not ended");
    // 9 answers counted in the interval, 3 failed: judged at 5 s, under the threshold.
    assert_eq!(o.observe(Answer::Success, ms(5_000), &c, 0, 4), None);
    assert_eq!(
        o.judged(),
        Some(Judged {
            failed: 3,
            answers: 9
        })
    );
    assert_eq!(
        o.counts(),
        AnswerCounts {
            success: 7,
            failure: 3,
            neutral: 3
        }
    );
    // Answers during an ejection are counted, though they judge nothing.
    let mut out = EndpointOutlier::default();
    for i in 0..3 {
        out.observe(Answer::Failure, at(i), &cfg(), 0, 4);
    }
    assert!(out.is_ejected(at(3)));
    out.observe(Answer::Failure, at(3), &cfg(), 0, 4);
    out.tally(Answer::Success);
    assert_eq!((out.counts().failure, out.counts().success), (4, 1));
    assert_eq!(
        Judged {
            failed: 0,
            answers: 0
        }
        .failure_percent(),
        0.0
    );
}

#[test]
fn failure_percentage_needs_enough_answers_and_the_threshold() {
    let c = by_share();
    let ms = |t: u64| Timestamp::from_millis(t);
    let judge = |answers: u64, failed: u64| {
        let mut o = EndpointOutlier::default();
        for i in 0..answers {
            // Failures spread so that no run of three forms.
            let a = if i < 2 * failed && i % 2 == 0 {
                Answer::Failure
            } else {
                Answer::Success
            };
            assert_eq!(o.observe(a, ms(i), &c, 0, 4), None);
        }
        o.observe(Answer::Success, ms(5_000), &c, 0, 4)
    };
    // 9 answers, all but the successes between them failed: too few to judge.
    assert_eq!(judge(9, 4), None);
    // 10 answers, 4 failed: 40%, at the threshold.
    assert!(matches!(judge(10, 4), Some(Ejection::Ejected { .. })));
    // 10 answers, 3 failed: 30%, under it.
    assert_eq!(judge(10, 3), None);
    // Neutral answers are not counted at all.
    let mut o = EndpointOutlier::default();
    for i in 0..30 {
        o.observe(Answer::Neutral, ms(i), &c, 0, 4);
    }
    assert_eq!(o.observe(Answer::Success, ms(5_000), &c, 0, 4), None);
    assert_eq!(o.interval.answers, 1);
}

/// The cap holds an interval's ejection back as it does a run's; the next interval is judged
/// again.
#[test]
fn failure_percentage_is_held_back_by_the_cap_and_judged_again() {
    let c = by_share();
    let ms = |t: u64| Timestamp::from_millis(t);
    let mut o = EndpointOutlier::default();
    let interval = |o: &mut EndpointOutlier, from: u64, ejected: usize| {
        for i in 0..10u64 {
            let a = if i % 2 == 0 {
                Answer::Failure
            } else {
                Answer::Success
            };
            if i == 0 {
                // The first answer closes the interval before.
                let got = o.observe(a, ms(from), &c, ejected, 4);
                if from > 0 {
                    return got;
                }
            } else {
                assert_eq!(o.observe(a, ms(from + i), &c, ejected, 4), None);
            }
        }
        None
    };
    interval(&mut o, 0, 0);
    // Two of four ejected at 50%: no room.
    assert_eq!(interval(&mut o, 5_000, 2), Some(Ejection::HeldBack));
    for i in 1..10u64 {
        let a = if i % 2 == 0 {
            Answer::Failure
        } else {
            Answer::Success
        };
        o.observe(a, ms(5_000 + i), &c, 0, 4);
    }
    assert!(matches!(
        interval(&mut o, 10_000, 1),
        Some(Ejection::Ejected {
            cause: Cause::FailurePercentage { .. },
            ..
        })
    ));
}

/// The scheduler's configuration reads it under `outlierDetection`, refuses what it cannot use
/// through its own validation, and writes it back out.
#[test]
fn the_scheduler_configuration_carries_it() {
    let c: crate::SchedulerConfig =
        serde_yaml::from_str("{ preset: round-robin, outlierDetection: { consecutive5xx: 2 } }")
            .unwrap();
    assert_eq!(
        c.outlier_detection,
        Some(OutlierDetection {
            consecutive_5xx: 2,
            ..OutlierDetection::default()
        })
    );
    let back: crate::SchedulerConfig =
        serde_yaml::from_str(&serde_yaml::to_string(&c).unwrap()).unwrap();
    assert_eq!(back, c);
    // On with its defaults in the `infergate` preset (the default), off in the baselines;
    // `null` turns it off, and that survives a round trip (the operator renders a complete
    // configuration: left out, it would read as the preset's).
    use crate::{Preset, SchedulerConfig};
    assert_eq!(
        SchedulerConfig::default().outlier_detection,
        Some(OutlierDetection::default())
    );
    for p in [
        Preset::GieDefault,
        Preset::RoundRobin,
        Preset::Random,
        Preset::LeastRequest,
    ] {
        assert_eq!(SchedulerConfig::preset(p).outlier_detection, None, "{p}");
    }
    let read = |y: &str| serde_yaml::from_str::<SchedulerConfig>(y).unwrap();
    assert_eq!(
        read("{ preset: infergate }").outlier_detection,
        Some(OutlierDetection::default())
    );
    let off = read("{ preset: infergate, outlierDetection: null }");
    assert_eq!(off.outlier_detection, None);
    let text = serde_yaml::to_string(&off).unwrap();
    assert!(text.contains("outlierDetection: null"), "{text}");
    assert_eq!(read(&text), off);
    let on = read("{ preset: round-robin, outlierDetection: {} }");
    assert_eq!(on.outlier_detection, Some(OutlierDetection::default()));
    assert_eq!(read(&serde_yaml::to_string(&on).unwrap()), on);
    let bad: crate::SchedulerConfig =
        serde_yaml::from_str("{ outlierDetection: { maxEjectionPercent: 200 } }").unwrap();
    let e = bad.validate().unwrap_err().to_string();
    assert!(
        e.contains("`outlierDetection.maxEjectionPercent` 200 is over 100"),
        "{e}"
    );
}
