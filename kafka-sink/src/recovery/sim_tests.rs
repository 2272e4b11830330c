use super::*;

/// The seed budget of a test run (more with EXACTLY_SIM_SEEDS; EXACTLY_SIM_FIRST to start
/// elsewhere, e.g. at a seed a failure printed).
fn budget() -> (u64, u64) {
    let n = std::env::var("EXACTLY_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000);
    let first = std::env::var("EXACTLY_SIM_FIRST")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (first, n)
}

#[test]
fn the_recovery_commit_holds_for_every_seed() {
    let (first, n) = budget();
    let started = std::time::Instant::now();
    let (found, known, coverage) = run_seeds(first, n, Mutant::None);
    if let Some(v) = found {
        panic!("{v}\n(replay: scripts/simulate --kafka --first <seed> --seeds 1)");
    }
    eprintln!(
        "{n} seeds in {:.2} s ({:.0} seeds/s), {:.1} requests per seed; {known} showed the known transaction-version-1 hazard; paths: {coverage:?}",
        started.elapsed().as_secs_f64(),
        n as f64 / started.elapsed().as_secs_f64(),
        coverage.requests as f64 / n as f64
    );
    if n >= 50_000 {
        // Every path the checks guard was taken, by more than a handful of seeds.
        let Coverage {
            held_landed,
            zombie_began,
            committed_described,
            committed_probed,
            lost,
            fatal,
            zombie_bumped,
            initialised_again,
            new_producer_id,
            requests: _,
        } = coverage;
        for (path, seeds) in [
            ("a held EndTxn landed", held_landed),
            ("the zombie began a transaction", zombie_began),
            ("committed, seen described", committed_described),
            ("committed, seen by the probe", committed_probed),
            ("lost (aborted by timeout)", lost),
            ("stopped: a zombie", fatal),
            ("the zombie bumped its own epoch", zombie_bumped),
            ("the id initialised again since an earlier recovery", initialised_again),
            ("a new producer id (epoch exhausted)", new_producer_id),
        ] {
            assert!(seeds >= 10, "only {seeds} seeds took the path {path:?}: {coverage:?}");
        }
        assert!(
            known > 0,
            "the known hazard never showed: is the model still able to hold an EndTxn?"
        );
    }
}

#[test]
fn a_seed_replays_the_same_trace() {
    for seed in [1, 77, 4_242] {
        assert_eq!(run(seed), run(seed), "seed {seed}");
    }
    assert_ne!(run(1), run(2), "different seeds, different worlds");
}

/// Seeds that found real bugs, kept: each passes, and fails again with its bug put back.
#[test]
fn the_seeds_that_found_bugs_pass_and_fail_with_the_bug_back() {
    // 829 583 found the gap in the model before the zombie could bump its own epoch; the
    // model's draws have changed since, and 56 597 is the first seed it now fails at.
    for (seed, m) in [
        (56_597, Mutant::InDoubtLaterSameEpochOnly),
        (56_597, Mutant::InDoubtLaterToProbe),
    ] {
        if let Err(v) = run(seed) {
            panic!("{v}");
        }
        let (found, _, _) = run_seeds(seed, 1, m);
        let found = found.unwrap_or_else(|| panic!("seed {seed} passes with {m:?} put back"));
        let first = found.lines().next().unwrap_or_default();
        assert!(first.contains("committed a zombie's transaction"), "{m:?}: {first}");
    }
}

/// Each known bug put back is caught, by the check that guards against it.
#[test]
fn each_known_bug_put_back_is_caught_within_the_budget() {
    for (m, by) in [
        (Mutant::ResendUnclearEndTxn, "without a description showing ours open"),
        (Mutant::TrustEndTxnSuccess, "committed a zombie's transaction"),
        (Mutant::ProbeSecondWatermark, "reported lost (DATA LOST)"),
        (Mutant::FatalOnUnclear, "no zombie used the id"),
        (Mutant::InDoubtLaterToProbe, "committed a zombie's transaction"),
        (Mutant::ForgetAcrossTries, "committed a zombie's transaction"),
    ] {
        let (found, _, _) = run_seeds(0, 50_000, m);
        let found = found.unwrap_or_else(|| panic!("{m:?} was not caught in 50 000 seeds"));
        let first = found.lines().next().unwrap_or_default();
        assert!(first.contains(by), "{m:?} caught by another check: {first}");
        eprintln!("{m:?} caught: {first}");
    }
}
