//! One simulated world run by its seed, its paths told apart, and sweeps over seeds within a
//! budget.

use super::*;

/// Runs seed `seed`: the trace's hash and the paths taken, or the violation.
pub(crate) fn run_paths(seed: u64) -> std::result::Result<(u64, Paths), String> {
    let world = Arc::new(Mutex::new(World::new(seed)));
    let target = world.lock().expect("not poisoned").rng.random_range(6..20);
    let truth = Mutex::new(Truth::default());
    let proc_ = |me: u32| Proc {
        world: &world,
        truth: &truth,
        me,
        baton: None,
        host: "m0".into(),
        storage: None,
    };
    let mut me = world.lock().expect("not poisoned").spawn();
    for _ in 0..200 {
        match process(&proc_(me), target, false) {
            Err(v) => return Err(violation(&world, seed, v)),
            Ok(Outcome::Gone) => {
                // Crashed or stopped: a new process starts; else (an outage) the attempt
                // starts over in this one.
                let mut w = world.lock().expect("not poisoned");
                if !w.alive.contains(&me) {
                    me = w.spawn();
                }
            }
            Ok(Outcome::Finished) => {
                // The run is over: every held write lands, and a last process must restore well.
                let me = {
                    let mut w = world.lock().expect("not poisoned");
                    w.alive.clear();
                    let last = w.spawn();
                    w.land_all();
                    w.note("every held write landed; a last process starts".into());
                    last
                };
                return finish(&world, seed, process(&proc_(me), target, true));
            }
        }
    }
    Err(violation(&world, seed, "no progress: 200 processes".into()))
}

/// The end of a seed: the last process's verdict, then the trace's hash and the paths taken.
pub(super) fn finish(
    world: &Arc<Mutex<World>>,
    seed: u64,
    last: std::result::Result<Outcome, String>,
) -> std::result::Result<(u64, Paths), String> {
    match last {
        Err(v) => Err(violation(world, seed, v)),
        Ok(Outcome::Gone) => Err(violation(world, seed, "the last process crashed without faults".into())),
        Ok(Outcome::Finished) => {
            let w = world.lock().expect("not poisoned");
            Ok((
                w.trace.finish(),
                Paths {
                    steps: w.step,
                    ..w.paths
                },
            ))
        }
    }
}

/// The trace hash of `seed`, or its violation.
pub(crate) fn run(seed: u64) -> std::result::Result<u64, String> {
    run_paths(seed).map(|(h, _)| h)
}

/// Runs `seeds` seeds from `first` with `m` active on this thread: the first violation, and the
/// paths taken.
pub(crate) fn run_seeds(first: u64, seeds: u64, m: Mutant) -> (Option<String>, Coverage) {
    sweep(first, seeds, m, run_paths)
}

/// Runs `run` for `seeds` seeds from `first` with `m` active: the first violation, and the paths
/// taken.
pub(super) fn sweep(
    first: u64,
    seeds: u64,
    m: Mutant,
    run: impl Fn(u64) -> std::result::Result<(u64, Paths), String>,
) -> (Option<String>, Coverage) {
    with_mutant(m, || {
        let mut coverage = Coverage::default();
        let found = (first..first + seeds).find_map(|s| match run(s) {
            Err(v) => Some(v),
            Ok((_, paths)) => {
                coverage.add(paths);
                None
            }
        });
        (found, coverage)
    })
}

/// The seed budget of a test run: `default` seeds from 0, or EXACTLY_SIM_SEEDS from
/// EXACTLY_SIM_FIRST (e.g. a seed a failure printed).
#[cfg(test)]
pub(super) fn budget(default: u64) -> (u64, u64) {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok());
    (
        var("EXACTLY_SIM_FIRST").unwrap_or(0),
        var("EXACTLY_SIM_SEEDS").unwrap_or(default),
    )
}
