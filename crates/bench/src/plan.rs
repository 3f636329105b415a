//! The runs of a bench in the order they go, and where an interrupt stopped them: what the
//! report of an interrupted bench names as not run ([`Report::interrupted`]). The live and the
//! simulated runners both keep one, so that a stopped bench reads the same in either mode.

use crate::report::{Interrupted, NotRun, Report, RunResult};

/// How one run ended.
#[derive(Debug)]
pub(crate) enum Ran {
    /// The run completed (boxed: the other variant is empty).
    Done(Box<RunResult>),
    /// The interrupt came first: the run stopped part-way and its figures are dropped, since
    /// figures over part of its arrivals would read as a whole run's.
    Interrupted,
    /// The interrupt came while the run was getting ready (its fleet, gateway or front
    /// starting), before it sent any arrival: nothing of it ran (live runs only; a simulated
    /// run has nothing to start).
    Unsent,
}

/// Every seed of a bench makes the same runs, in one order.
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    seeds: &'a [u64],
    /// The name of each run of a seed (its policy or front, as the report names it).
    runs: Vec<String>,
    /// Where the bench stopped: seed index, run index, and whether that run had started.
    stopped: Option<(usize, usize, bool)>,
}

impl<'a> Plan<'a> {
    /// The plan of runs `runs` on every seed of `seeds`.
    pub(crate) fn new(seeds: &'a [u64], runs: Vec<String>) -> Self {
        Plan {
            seeds,
            runs,
            stopped: None,
        }
    }

    /// The name of run `run` of each seed.
    pub(crate) fn name(&self, run: usize) -> &str {
        self.runs.get(run).map_or("", String::as_str)
    }

    /// Records that the bench stopped at run `run` of the seed at index `seed`: part-way when
    /// `started`, else before it began.
    pub(crate) fn stop(&mut self, seed: usize, run: usize, started: bool) {
        self.stopped = Some((seed, run, started));
    }

    /// Marks `report` partial when the bench stopped: [`Report::interrupted`] names the runs
    /// that did not complete (the stopped one, then the rest of its seed, then every later
    /// seed's), and the floor is kept only for the seeds that have runs, since a seed none of
    /// whose runs completed has no figures to compare it with.
    pub(crate) fn mark(self, report: &mut Report) {
        let Some((si, ri, started)) = self.stopped else {
            return;
        };
        let runs = &self.runs;
        let not_run = self
            .seeds
            .get(si..)
            .unwrap_or_default()
            .iter()
            .enumerate()
            .flat_map(|(i, &seed)| {
                let from = if i == 0 { ri } else { 0 };
                runs.get(from..)
                    .unwrap_or_default()
                    .iter()
                    .enumerate()
                    .map(move |(j, name)| NotRun {
                        policy: name.clone(),
                        seed,
                        stopped: started && i == 0 && j == 0,
                    })
            })
            .collect();
        let ran = &report.runs;
        report
            .floors
            .retain(|f| ran.iter().any(|r| r.seed == f.seed));
        report.interrupted = Some(Interrupted { not_run });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

    use super::*;
    use crate::Scenario;
    use crate::report::FloorResult;

    /// A report of one completed run (`a` on seed 1), with floors for seeds 1, 2 and 3.
    fn report() -> Report {
        let scenario = Scenario::from_yaml(
            "name: p\nfleet: [{name: a, profile: llama-3.1-8b/h100}]\nworkload:\n  duration_s: 1\n  arrival: {kind: poisson, rate: 1}\n  prompt_tokens: {dist: fixed, value: 1}\n  output_tokens: {dist: fixed, value: 1}\nseeds: [1, 2, 3]\n",
            "t",
        )
        .unwrap();
        let runs = vec![RunResult::not_started("a", 1, 1, 1, String::new())];
        let floors = [1, 2, 3]
            .map(|seed| FloorResult {
                seed,
                ttft: Default::default(),
            })
            .to_vec();
        Report::new(scenario, "simulated", Vec::new(), runs, floors)
    }

    #[test]
    fn the_stopped_run_comes_first_then_the_rest_of_its_seed_then_later_seeds() {
        let mut report = report();
        let mut plan = Plan::new(&[1, 2, 3], vec!["a".into(), "b".into()]);
        plan.stop(1, 1, true);
        plan.mark(&mut report);
        let listed = report.interrupted.as_ref().map(Interrupted::list);
        assert_eq!(
            listed.as_deref(),
            Some("b seed 2 (stopped part-way), a seed 3, b seed 3")
        );
        // Seeds 2 and 3 have no completed run here: their floors would compare with nothing.
        let floors: Vec<u64> = report.floors.iter().map(|f| f.seed).collect();
        assert_eq!(floors, [1]);
    }

    #[test]
    fn a_run_stopped_before_it_began_is_not_said_stopped_part_way() {
        let mut report = report();
        let mut plan = Plan::new(&[1, 2, 3], vec!["a".into()]);
        plan.stop(2, 0, false);
        plan.mark(&mut report);
        let i = report.interrupted.as_ref().map(Interrupted::list);
        assert_eq!(i.as_deref(), Some("a seed 3"));
    }

    #[test]
    fn a_bench_that_did_not_stop_is_left_whole() {
        let mut report = report();
        Plan::new(&[1, 2, 3], vec!["a".into()]).mark(&mut report);
        assert!(report.interrupted.is_none());
        assert_eq!(report.floors.len(), 3);
    }
}
