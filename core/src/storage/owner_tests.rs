use super::*;

fn me() -> OwnerRecord {
    OwnerRecord {
        id: "me".into(),
        job: "j".into(),
        host: "h".into(),
        boot_id: "b".into(),
        pid: 10,
        pid_start: Some(100),
        pid_ns: "pid:[4026531836]".into(),
        ..OwnerRecord::default()
    }
}

fn other(f: impl FnOnce(&mut OwnerRecord)) -> OwnerRecord {
    let mut o = me();
    o.id = "other".into();
    o.pid = 20;
    o.pid_start = Some(200);
    f(&mut o);
    o
}

#[test]
fn a_live_process_on_this_machine_is_refused_a_dead_one_taken_over() {
    let o = other(|_| {});
    let refused = judge(Some(&o), &me(), &|pid, start| {
        assert_eq!((pid, start), (20, Some(200)), "the owner's process is asked about");
        Some(true)
    });
    assert!(
        matches!(refused, Verdict::Refuse(ref why) if why.contains("process 20 on h")),
        "{refused:?}"
    );
    assert_eq!(judge(Some(&o), &me(), &|_, _| Some(false)), Verdict::Claim);
    assert_eq!(judge(Some(&o), &me(), &|_, _| None), Verdict::Watch);
    assert_eq!(judge(None, &me(), &|_, _| Some(true)), Verdict::Claim);
}

#[test]
fn the_same_process_id_and_start_is_an_earlier_run_another_machine_is_watched() {
    // A container restarted in place is process 1 again, with the same start time only if
    // it is the same process.
    let earlier = other(|o| {
        o.pid = 10;
        o.pid_start = Some(100);
    });
    assert_eq!(judge(Some(&earlier), &me(), &|_, _| Some(true)), Verdict::Claim);
    let elsewhere = other(|o| o.boot_id = "another boot".into());
    assert_eq!(judge(Some(&elsewhere), &me(), &|_, _| Some(true)), Verdict::Watch);
    let unknown_boot = other(|o| o.boot_id = String::new());
    assert_eq!(judge(Some(&unknown_boot), &me(), &|_, _| Some(true)), Verdict::Watch);
    // Another container on the same host: its process ids are not ours to look up.
    let container = other(|o| o.pid_ns = "pid:[4026532201]".into());
    assert_eq!(judge(Some(&container), &me(), &|_, _| Some(false)), Verdict::Watch);
    let container_one = other(|o| {
        o.pid_ns = "pid:[4026532201]".into();
        o.pid = 10;
        o.pid_start = Some(100);
    });
    assert_eq!(judge(Some(&container_one), &me(), &|_, _| Some(false)), Verdict::Watch);
    // A container restarted in place: process 1 again, started later.
    let restarted = other(|o| {
        o.pid = 10;
        o.pid_start = Some(50);
    });
    assert_eq!(judge(Some(&restarted), &me(), &|_, _| Some(false)), Verdict::Claim);
    // Released by a run that ended: at once, wherever it ran.
    let released = other(|o| {
        o.boot_id = "another boot".into();
        o.released = true;
    });
    assert_eq!(judge(Some(&released), &me(), &|_, _| Some(true)), Verdict::Claim);
}

#[test]
fn a_watched_record_that_moves_is_a_live_owner() {
    let first = other(|o| o.boot_id = "x".into());
    let lease = Duration::from_secs(30);
    assert_eq!(after_watch(&first, Some(&first), (0, 0), lease), Verdict::Claim);
    assert_eq!(after_watch(&first, None, (0, 0), lease), Verdict::Claim);
    // Renewed by its heartbeat (this build), or in the record (an older one).
    assert!(matches!(
        after_watch(&first, Some(&first), (3, 4), lease),
        Verdict::Refuse(_)
    ));
    let renewed = other(|o| o.beat = 1);
    assert!(matches!(
        after_watch(&first, Some(&renewed), (0, 0), lease),
        Verdict::Refuse(_)
    ));
    let replaced = other(|o| o.id = "third".into());
    assert!(matches!(
        after_watch(&first, Some(&replaced), (0, 0), lease),
        Verdict::Refuse(_)
    ));
}

#[test]
fn this_process_is_alive_and_a_wrong_start_time_is_not() {
    let me = OwnerRecord::this_process("j", Duration::from_secs(30));
    assert_eq!(alive_here(me.pid, me.pid_start), Some(true));
    assert_eq!(alive_here(me.pid, me.pid_start.map(|s| s + 1)), Some(false));
    assert!(!me.boot_id.is_empty() && me.pid_start.is_some(), "{me:?}");
}
