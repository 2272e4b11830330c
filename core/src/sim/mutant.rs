//! Known bugs put back on purpose, one at a time per thread: the simulations must catch each.

use std::cell::Cell;

/// Known bugs, put back on purpose (one at a time, per thread): the simulation must catch each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mutant {
    /// None: the code as it is.
    None,
    /// Retention reads past a kept checkpoint whose metadata it cannot read (an outage) and
    /// deletes the shared files it did not see used.
    RetainPastReadError,
    /// A commit whose outcome is unknown (an answer lost) deletes the checkpoint's files like a
    /// plain failure: its metadata may land after.
    DiscardAfterUnknown,
    /// A restart leaves the unfinished checkpoints above the one it restored as they are: one
    /// whose metadata lands late becomes the newest, with its transactions aborted.
    NoVoid,
    /// Private files are named as the state backend names them, the same for every process: a
    /// checkpoint id begun again after a crash shares their names with the earlier attempt, whose
    /// write landing late replaces a file of the new one.
    UntaggedPrivateNames,
    /// An aborted checkpoint's files are deleted by deleting its directory: a delete held by the
    /// network lands after a later process began the same id again, and takes its files.
    AbortDeletesDir,
    /// A checkpoint without files of its own is committed without a file first: a restart cannot
    /// see it to make it void, and its metadata lands after.
    NoBegunFile,
    /// A commit does not check that this run still owns the location: a copy whose claim was
    /// taken over (it stalled past its lease) commits on top of what the other copy restored.
    NoClaimCheck,
    /// The sinks' recovery on restore does not check the owner first: a copy that stalled past
    /// its lease while it restored goes on from what it chose before, behind the new owner.
    NoOwnerCheckBeforeRecovery,
    /// A checkpoint without files of its own is checked for its owner before its first file is
    /// written: a run that stalls between the two, and is taken over meanwhile, commits one the
    /// new owner could not see (and make void) when it listed.
    CheckBeforeBegun,
    /// A renewal writes the owner record again (after reading it still this run's): a run that
    /// stalls between the two, past its lease, writes its claim back over the new owner's and
    /// goes on with checkpoint ids the other may have used and deleted.
    RenewRewritesRecord,
    /// A restart makes unfinished checkpoints void without checking its claim after listing them,
    /// and a commit that finds its checkpoint void takes that for another owner: a run that
    /// stalled while it restored makes the new owner's checkpoint in progress void, and the new
    /// owner stops as if it had lost the location.
    StaleVoidStopsOwner,
    /// Barrier alignment in exactly-once mode never holds an input back: records that follow the
    /// barrier on an input are processed before the snapshot (at-least-once).
    AlignerNeverBlocks,
    /// The coordinator takes a checkpoint as complete one acknowledgement short: a task's state
    /// (and its pre-committed transaction) is missing from the checkpoint.
    AckOneShort,
    /// An alignment given up (its buffer over the limit) drops what it held back instead of
    /// releasing it.
    DropHeldOnAbort,
}

thread_local! {
    static MUTANT: Cell<Mutant> = const { Cell::new(Mutant::None) };
}

/// The mutant active on this thread.
pub(crate) fn mutant() -> Mutant {
    MUTANT.with(Cell::get)
}

/// Runs `f` with `m` active on this thread (and on the threads it starts that ask for it).
pub(super) fn with_mutant<T>(m: Mutant, f: impl FnOnce() -> T) -> T {
    MUTANT.with(|c| c.set(m));
    let r = f();
    MUTANT.with(|c| c.set(Mutant::None));
    r
}
