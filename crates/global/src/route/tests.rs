use super::*;

fn c(index: usize, weight: f64, ttft_ms: f64, cost: f64, region_rank: usize) -> Candidate {
    Candidate {
        index,
        weight,
        ttft_ms,
        cost,
        region_rank,
    }
}

fn indices(cs: &[Candidate]) -> Vec<usize> {
    cs.iter().map(|c| c.index).collect()
}

#[test]
fn cost_aware_takes_the_cheapest_that_meets_the_objective() {
    let mut cs = [
        c(0, 1.0, 100.0, 3.0, 0),
        c(1, 1.0, 400.0, 1.0, 0),
        c(2, 1.0, 900.0, 0.5, 0),
    ];
    let r = order(Policy::CostAware, 500.0, &mut cs, || 0.0);
    assert_eq!(r, Some(Reason::CheapestWithinObjective));
    // 1 (cheapest within 500 ms), 0, then 2 (over the objective).
    assert_eq!(indices(&cs), [1, 0, 2]);
}

#[test]
fn when_none_meets_the_objective_the_fastest_comes_first() {
    let mut cs = [c(0, 1.0, 800.0, 1.0, 0), c(1, 1.0, 600.0, 3.0, 0)];
    let r = order(Policy::CostAware, 500.0, &mut cs, || 0.0);
    assert_eq!(r, Some(Reason::FastestOverObjective));
    assert_eq!(indices(&cs), [1, 0]);
}

#[test]
fn latency_policy_ignores_cost() {
    let mut cs = [c(0, 1.0, 300.0, 0.1, 0), c(1, 1.0, 100.0, 9.0, 1)];
    let r = order(Policy::Latency, 500.0, &mut cs, || 0.0);
    assert_eq!(r, Some(Reason::Fastest));
    assert_eq!(indices(&cs), [1, 0]);
}

#[test]
fn equal_prices_go_by_region_preference_then_speed() {
    let mut cs = [
        c(0, 1.0, 100.0, 1.0, 1),
        c(1, 1.0, 300.0, 1.0, 0),
        c(2, 1.0, 200.0, 1.0, 0),
    ];
    order(Policy::CostAware, 500.0, &mut cs, || 0.0);
    assert_eq!(indices(&cs), [2, 1, 0]);
}

#[test]
fn drained_clusters_are_a_last_resort_and_a_fully_drained_fleet_still_has_an_order() {
    let mut cs = [c(0, 0.0, 10.0, 0.1, 0), c(1, 1.0, 400.0, 5.0, 1)];
    assert_eq!(
        order(Policy::CostAware, 500.0, &mut cs, || 0.0),
        Some(Reason::CheapestWithinObjective)
    );
    assert_eq!(indices(&cs), [1, 0]);
    let mut cs = [c(0, 0.0, 10.0, 0.1, 0), c(1, 0.0, 400.0, 5.0, 1)];
    assert_eq!(
        order(Policy::CostAware, 500.0, &mut cs, || 0.0),
        Some(Reason::LastResort)
    );
    assert_eq!(indices(&cs), [0, 1]);
    assert_eq!(order(Policy::CostAware, 500.0, &mut [], || 0.0), None);
}

#[test]
fn a_ramping_cluster_is_first_only_when_its_draw_admits_it() {
    // Cluster 0 is the cheapest but ramping at 0.25.
    let base = [c(0, 0.25, 100.0, 0.1, 0), c(1, 1.0, 100.0, 1.0, 0)];
    let mut cs = base;
    order(Policy::CostAware, 500.0, &mut cs, || 0.2);
    assert_eq!(indices(&cs), [0, 1]);
    let mut cs = base;
    order(Policy::CostAware, 500.0, &mut cs, || 0.3);
    assert_eq!(indices(&cs), [1, 0]);
    // Over many evenly spread draws its share of first places is its weight.
    let mut first = 0;
    for i in 0..1000 {
        let mut cs = base;
        order(Policy::CostAware, 500.0, &mut cs, || f64::from(i) / 1000.0);
        first += usize::from(cs[0].index == 0);
    }
    assert_eq!(first, 250);
}
