use super::*;

const FRESH: Duration = Duration::from_millis(300);

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn without_a_fresh_sample_the_estimate_is_left_as_it_is() {
    let at = Instant::now();
    let mut c = Correction::default();
    assert_eq!(c.apply(40.0, at, FRESH), 40.0);
    c.observe(340.0, 40.0, at, at, FRESH);
    assert!(close(c.apply(40.0, at + FRESH, FRESH), 340.0));
    assert_eq!(
        c.apply(40.0, at + FRESH + Duration::from_millis(1), FRESH),
        40.0
    );
}

/// What a slow WAN or a queue adds does not grow with the prompt: learned on short prompts, it
/// is added to a long one's estimate as it is, and the other way round.
#[test]
fn a_measurement_above_the_estimate_adds_its_excess_whatever_the_prompt() {
    let at = Instant::now();
    let mut short = Correction::default();
    for _ in 0..4 {
        short.observe(340.0, 40.0, at, at, FRESH);
    }
    assert!(close(short.apply(600.0, at, FRESH), 900.0));
    let mut long = Correction::default();
    for _ in 0..4 {
        long.observe(900.0, 600.0, at, at, FRESH);
    }
    assert!(close(long.apply(40.0, at, FRESH), 340.0));
    // Smoothed: one sample moves it a fifth of the way.
    long.observe(600.0, 600.0, at, at, FRESH);
    assert!(close(long.apply(40.0, at, FRESH), 40.0 + 240.0));
}

/// Below the estimate: the samples offset an excess, but never take time away from an
/// estimate.
#[test]
fn a_measurement_below_the_estimate_offsets_an_excess_and_takes_nothing_away() {
    let at = Instant::now();
    let mut cached = Correction::default();
    cached.observe(60.0, 600.0, at, at, FRESH);
    assert_eq!(cached.apply(40.0, at, FRESH), 40.0);
    assert_eq!(cached.apply(1000.0, at, FRESH), 1000.0);
    let mut wan = Correction::default();
    wan.observe(340.0, 40.0, at, at, FRESH);
    // A stale queue in one heartbeat: 400 ms over, a fifth of it off the 300 ms excess.
    wan.observe(640.0, 1040.0, at, at, FRESH);
    assert!(close(
        wan.apply(40.0, at, FRESH),
        40.0 + 300.0 - 0.2 * 700.0
    ));
}

/// Another process's figures and the clock's: nothing makes a corrected estimate negative or
/// NaN, and an absurd sample wears off like any other.
#[test]
fn hostile_figures_cannot_make_an_estimate_negative_nan_or_stuck() {
    let at = Instant::now();
    let mut c = Correction::default();
    c.observe(f64::NAN, 40.0, at, at, FRESH);
    c.observe(40.0, f64::NAN, at, at, FRESH);
    assert_eq!(c, Correction::default());
    c.observe(40.0, -500.0, at, at, FRESH);
    assert!(close(c.apply(40.0, at, FRESH), 80.0));
    // A heartbeat claiming forever, then a sane one: bounded, and worn off in a few dozen
    // samples (an hour the other way, then a 300 ms excess: back above zero at the 43rd).
    let mut c = Correction::default();
    c.observe(40.0, f64::INFINITY, at, at, FRESH);
    c.observe(40.0, 1e300, at, at, FRESH);
    assert_eq!(c.apply(40.0, at, FRESH), 40.0);
    for _ in 0..42 {
        c.observe(340.0, 40.0, at, at, FRESH);
    }
    assert_eq!(c.apply(40.0, at, FRESH), 40.0);
    c.observe(340.0, 40.0, at, at, FRESH);
    let worn = c.apply(40.0, at, FRESH);
    assert!(worn > 40.0 && worn < 340.0, "{worn}");
    // A measurement of forever (a first-byte timeout of `u64::MAX` ms) is bounded too.
    let mut c = Correction::default();
    c.observe(Duration::MAX.as_secs_f64() * 1e3, 40.0, at, at, FRESH);
    assert!(close(c.apply(40.0, at, FRESH), MAX_SAMPLE_MS));
    // An estimate that is not a non-negative number is left as it was.
    assert!(c.apply(f64::NAN, at, FRESH).is_nan());
    assert_eq!(c.apply(-1.0, at, FRESH), -1.0);
    for estimate in [0.0, 1.0, 40.0, 600.0, 1e12, f64::MAX] {
        for (measured, learned) in [(0.0, 1e300), (1e300, 0.0), (0.0, 0.0), (5.0, 7.0)] {
            let mut c = Correction::default();
            c.observe(measured, learned, at, at, FRESH);
            let v = c.apply(estimate, at, FRESH);
            assert!(
                v >= 0.0 && !v.is_nan(),
                "{measured} vs {learned}: {estimate} → {v}"
            );
        }
    }
}

/// A sample joins the correction its request was estimated with, however late its first token
/// comes; one sent after that correction aged out starts again.
#[test]
fn a_sample_joins_the_correction_in_force_when_its_request_was_sent() {
    let at = Instant::now();
    let mut c = Correction::default();
    c.observe(340.0, 40.0, at, at, FRESH);
    let sent = at + FRESH;
    let late = sent + Duration::from_secs(5);
    c.observe(5040.0, 40.0, sent, late, FRESH);
    assert!(close(
        c.apply(40.0, late, FRESH),
        40.0 + 300.0 + 0.2 * 4700.0
    ));
    let mut c = Correction::default();
    c.observe(340.0, 40.0, at, at, FRESH);
    let sent = at + FRESH + Duration::from_millis(1);
    c.observe(140.0, 40.0, sent, sent, FRESH);
    assert!(close(c.apply(40.0, sent, FRESH), 140.0));
}
