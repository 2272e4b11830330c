//! Who owns a checkpoint location: claims taken over once they lapse, released or unreadable
//! claims, late claim writes, a run taken over.

use super::*;

/// The owner record of `dir`, as JSON.
fn owner_of(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&fs::read(dir.join("_owner")).unwrap()).unwrap()
}

/// Writes an owner record for a run on another machine (another boot) into `dir`.
fn foreign_owner(dir: &Path, beat: u64) {
    let record = serde_json::json!({
        "id": "elsewhere", "job": "j", "host": "other-host", "boot_id": "another-boot",
        "pid": 1, "pid_start": 7, "since_ms": 0, "beat": beat, "pid_ns": "pid:[1]", "lease_ms": 300,
    });
    fs::write(dir.join("_owner"), serde_json::to_vec(&record).unwrap()).unwrap();
}

#[test]
fn a_claim_from_another_machine_is_taken_over_only_once_it_lapses() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::new(dir.path()).unwrap();
    let lease = Duration::from_millis(600);
    // Renewed while watched: a live owner, refused, naming it — renewed by its heartbeat (this
    // build), or by writing its record again (builds before it).
    for heartbeat in [true, false] {
        foreign_owner(dir.path(), 1);
        let path = dir.path().to_path_buf();
        let renewer = std::thread::spawn(move || {
            for beat in 2..6 {
                std::thread::sleep(Duration::from_millis(100));
                if heartbeat {
                    fs::write(path.join("_owner-beat-elsewhere"), format!("{beat}\n")).unwrap();
                } else {
                    foreign_owner(&path, beat);
                }
            }
        });
        let err = storage.claim("j", lease).unwrap_err();
        renewer.join().unwrap();
        assert!(
            matches!(err, CoreError::LocationOwned { ref reason, .. } if reason.contains("other-host")),
            "{err}"
        );
    }
    // Not renewed for a lease: taken over.
    let started = std::time::Instant::now();
    storage.claim("j", lease).expect("lapsed");
    assert!(started.elapsed() >= lease, "watched for a lease first");
    assert_ne!(owner_of(dir.path())["id"], "elsewhere");
}

#[test]
fn a_released_or_unreadable_claim_is_taken_at_once_and_a_lost_one_stops_commits() {
    let dir = tempfile::tempdir().unwrap();
    let lease = Duration::from_secs(30);
    let storage = Storage::new(dir.path()).unwrap();
    storage.claim("j", lease).unwrap();
    checkpoint(&storage, 1, &[]);
    // A renewal writes the heartbeat, never the record: a run stalled between reading the record
    // (still its own) and writing it would write its claim back over another's that took over.
    let record = fs::read(dir.path().join("_owner")).unwrap();
    storage.renew_claim().unwrap();
    assert_eq!(fs::read(dir.path().join("_owner")).unwrap(), record);
    let id = owner_of(dir.path())["id"].as_str().unwrap().to_owned();
    assert_eq!(
        fs::read_to_string(dir.path().join(format!("_owner-beat-{id}"))).unwrap(),
        "1\n"
    );
    storage.release_claim().unwrap();
    assert_eq!(owner_of(dir.path())["released"], true);
    // Released on another machine: claimed at once.
    let next = Storage::new(dir.path()).unwrap();
    let started = std::time::Instant::now();
    next.claim("j", lease).unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    // A record cut short: watched for a lease, then claimed (never a location locked for good).
    let third = Storage::new(dir.path()).unwrap();
    fs::write(dir.path().join("_owner"), b"{\"id\": \"cut").unwrap();
    third.claim("j", Duration::from_millis(300)).unwrap();
    // `next` lost it: its commits stop, and a renewal does not take it back.
    let err = next.commit(&meta(2, Vec::new())).unwrap_err();
    assert!(matches!(err, CoreError::LocationOwned { .. }), "{err}");
    assert!(next.renew_claim().is_err());
    // Removed by hand while `third` runs: lost too, not silently claimed again.
    fs::remove_file(dir.path().join("_owner")).unwrap();
    let err = third.commit(&meta(2, Vec::new())).unwrap_err();
    assert!(
        matches!(err, CoreError::LocationOwned { ref reason, .. } if reason.contains("removed")),
        "{err}"
    );
    assert_eq!(
        storage.completed().unwrap(),
        vec![1],
        "no checkpoint made durable by a run that lost it"
    );
}

/// One run's attempts claim under one id: a claim write of an earlier attempt that lands late
/// (its answer was lost, the store applied it after the next attempt's) is still this run's, not
/// another run that took the location over (which stopped the job, seen against a restarting
/// S3 server).
#[test]
fn a_late_claim_write_of_an_earlier_attempt_is_still_this_runs() {
    let dir = tempfile::tempdir().unwrap();
    let lease = Duration::from_secs(30);
    let storage = Storage::new(dir.path()).unwrap();
    storage.claim("j", lease).unwrap();
    let first_attempt = fs::read(dir.path().join("_owner")).unwrap();
    // The attempt failed; the next one claims again.
    storage.claim("j", lease).unwrap();
    storage.renew_claim().unwrap();
    fs::write(dir.path().join("_owner"), &first_attempt).unwrap();
    checkpoint(&storage, 1, &[]);
    assert_eq!(storage.completed().unwrap(), vec![1]);
}

/// A run that stalled while another took its location over, and whose listing the new owner's
/// retention outdated (every checkpoint it saw is gone), is told that it lost the location — not
/// that its checkpoints vanished, which sends an operator looking for lost data.
#[test]
fn a_run_taken_over_is_told_so_not_that_its_checkpoints_vanished() {
    let dir = tempfile::tempdir().unwrap();
    let lease = Duration::from_secs(30);
    let stalled = Storage::new(dir.path()).unwrap();
    stalled.claim("j", lease).unwrap();
    checkpoint(&stalled, 1, &[]);
    // Another run takes over; its retention deletes checkpoint 1 (its own are newer, written
    // after the stalled run's listing: here, none).
    Storage::new(dir.path()).unwrap().claim("j", lease).unwrap();
    fs::remove_dir_all(dir.path().join("chk-1")).unwrap();
    let err = crate::runtime::RestorePlan::first(Some(&stalled), None, false).unwrap_err();
    assert!(matches!(err, CoreError::LocationOwned { .. }), "{err}");
    // The owner itself is told the truth.
    let owner = Storage::new(dir.path()).unwrap();
    owner.claim("j", lease).unwrap();
    let err = crate::runtime::RestorePlan::first(Some(&owner), None, false).unwrap_err();
    assert!(matches!(err, CoreError::CheckpointsVanished(_)), "{err}");
}

/// A claim write of an earlier attempt of this run (answered by an error) that lands while the
/// next attempt watches another machine's owner is this run's record, not a live owner's: the
/// claim goes on (before, the run stopped, naming itself as the live owner; found by the
/// simulation of two copies, seed 2555).
#[test]
fn a_late_claim_write_of_this_run_while_it_watches_is_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(Storage::new(dir.path()).unwrap());
    foreign_owner(dir.path(), 1);
    let claiming = {
        let storage = storage.clone();
        std::thread::spawn(move || storage.claim("j", Duration::from_secs(3)))
    };
    let mine = loop {
        if let Some(id) = storage.claim_id.get() {
            break id.clone();
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    std::thread::sleep(Duration::from_millis(200));
    let mut record = owner_of(dir.path());
    record["id"] = mine.clone().into();
    // Into place at once (a record read half-written would be an unknown owner's).
    let tmp = dir.path().join("_owner.test");
    fs::write(&tmp, serde_json::to_vec(&record).unwrap()).unwrap();
    fs::rename(&tmp, dir.path().join("_owner")).unwrap();
    claiming.join().unwrap().expect("its own record");
    assert_eq!(owner_of(dir.path())["id"], mine.as_str());
}
