use super::*;

#[test]
fn checkpoint_storage_holds_for_every_seed() {
    let (first, n) = budget(2_000);
    let started = std::time::Instant::now();
    let (found, coverage) = run_seeds(first, n, Mutant::None);
    if let Some(v) = found {
        panic!("{v}");
    }
    eprintln!(
        "{n} seeds in {:.2} s ({:.0} seeds/s), {:.0} store calls per seed; seeds per path: {:?}",
        started.elapsed().as_secs_f64(),
        n as f64 / started.elapsed().as_secs_f64(),
        coverage.0.steps as f64 / n as f64,
        coverage.0
    );
    if n >= 2_000 {
        let p = coverage.0;
        for (path, seeds) in [
            ("a crash", p.crashes),
            ("a restore of a checkpoint", p.restored_some),
            ("a commit of unknown outcome", p.outcome_unknown),
            ("a checkpoint's metadata landed late", p.late_metadata),
            ("an unfinished checkpoint made void", p.voided),
            ("a late metadata write refused by a void", p.late_refused),
            ("retention deleted a shared file", p.shared_deleted),
            ("retention stopped by an error", p.retention_stopped),
            ("a restart of the job within its process", p.restarted_in_process),
        ] {
            assert!(seeds >= 10, "only {seeds} seeds took the path {path:?}: {p:?}");
        }
    }
}

#[test]
fn a_seed_replays_the_same_trace() {
    for seed in [3, 99, 1_234] {
        assert_eq!(run(seed), run(seed), "seed {seed}");
    }
    assert_ne!(run(3), run(4), "different seeds, different worlds");
}

/// Seeds that found real bugs, kept: each passes, and fails again with its bug put back.
#[test]
fn the_seeds_that_found_bugs_pass_and_fail_with_the_bug_back() {
    let found: &[(u64, Mutant, &str)] = &[(37_222, Mutant::AbortDeletesDir, "UNRESTORABLE")];
    for &(seed, m, by) in found {
        if let Err(v) = run(seed) {
            panic!("{v}");
        }
        let (found, _) = run_seeds(seed, 1, m);
        let found = found.unwrap_or_else(|| panic!("seed {seed} passes with {m:?} put back"));
        let first = found.lines().next().unwrap_or_default();
        assert!(first.contains(by), "{m:?} caught by another check: {first}");
    }
}

/// Each known bug put back is caught, by the check that guards against it.
#[test]
fn each_known_bug_put_back_is_caught_within_the_budget() {
    for (m, by) in [
        (Mutant::RetainPastReadError, "UNRESTORABLE"),
        (Mutant::DiscardAfterUnknown, "UNRESTORABLE"),
        (Mutant::NoVoid, "a restart had aborted"),
        (Mutant::UntaggedPrivateNames, "corrupt checkpoint data"),
        (Mutant::NoBegunFile, "a restart had aborted"),
    ] {
        let (found, _) = run_seeds(0, 5_000, m);
        let found = found.unwrap_or_else(|| panic!("{m:?} was not caught in 5 000 seeds"));
        let first = found.lines().next().unwrap_or_default();
        assert!(first.contains(by), "{m:?} caught by another check: {first}");
        eprintln!("{m:?} caught: {first}");
    }
}
