use super::*;
use rand::SeedableRng;

#[test]
fn empty_pool_rejects_with_503() {
    let mut s = Scheduler::new(SchedulerConfig::default()).unwrap();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
    let err = s
        .pick(&RequestContext::new("m", 10), Timestamp::ZERO, &mut rng)
        .unwrap_err();
    assert_eq!(err, Rejection::NoEndpoints);
    assert_eq!(err.http_status(), 503);
}
