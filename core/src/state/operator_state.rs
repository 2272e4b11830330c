//! Redistribution of an operator's snapshot to the subtasks of a (possibly rescaled) job.

use std::collections::BTreeMap;

use crate::checkpoint::{KeyedStateHandle, OperatorSnapshot};
use crate::state::KeyGroupRange;

/// What one subtask restores of its operator's snapshot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RestoredState {
    /// List state: this subtask's share of every subtask's entries.
    pub list_state: BTreeMap<String, Vec<Vec<u8>>>,
    /// Union list state: every subtask's entries.
    pub union_state: BTreeMap<String, Vec<Vec<u8>>>,
    /// Keyed state handles that hold key groups of this subtask.
    pub keyed: Vec<KeyedStateHandle>,
}

/// The share of `snapshot` for subtask `index` of `parallelism`. With unchanged parallelism each
/// subtask gets back exactly its own list state; otherwise list entries are dealt round robin over
/// the concatenation of all subtasks' lists (nothing lost, nothing twice). Union state goes to all.
pub fn redistribute(snapshot: &OperatorSnapshot, parallelism: u32, index: u32) -> RestoredState {
    let mut out = RestoredState::default();
    let same = snapshot.parallelism == parallelism;
    let range = KeyGroupRange::for_subtask(snapshot.max_parallelism, parallelism, index);
    let mut position: BTreeMap<&str, usize> = BTreeMap::new();
    for (old_index, sub) in snapshot.subtasks.iter().enumerate() {
        for (name, entries) in &sub.list_state {
            let list = out.list_state.entry(name.clone()).or_default();
            if same {
                if old_index as u32 == index {
                    list.extend(entries.iter().cloned());
                }
                continue;
            }
            let pos = position.entry(name.as_str()).or_default();
            for e in entries {
                if *pos % parallelism as usize == index as usize {
                    list.push(e.clone());
                }
                *pos += 1;
            }
        }
        for (name, entries) in &sub.union_state {
            out.union_state
                .entry(name.clone())
                .or_default()
                .extend(entries.iter().cloned());
        }
        if let Some(k) = &sub.keyed {
            if k.key_groups.intersects(&range) {
                out.keyed.push(k.clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::SubtaskSnapshot;
    use proptest::prelude::*;

    fn snapshot(lists: &[Vec<u8>]) -> OperatorSnapshot {
        OperatorSnapshot {
            parallelism: lists.len() as u32,
            max_parallelism: 128,
            subtasks: lists
                .iter()
                .map(|l| {
                    let mut s = SubtaskSnapshot::default();
                    s.list_state.insert("l".into(), l.iter().map(|b| vec![*b]).collect());
                    s.union_state.insert("u".into(), l.iter().map(|b| vec![*b]).collect());
                    s
                })
                .collect(),
        }
    }

    proptest! {
        #[test]
        fn list_entries_are_dealt_exactly_once(lists in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..6), 1..5), p in 1u32..6) {
            let snap = snapshot(&lists);
            let mut all: Vec<Vec<u8>> = Vec::new();
            for i in 0..p {
                let r = redistribute(&snap, p, i);
                all.extend(r.list_state.get("l").cloned().unwrap_or_default());
                let union: usize = r.union_state.get("u").map_or(0, Vec::len);
                prop_assert_eq!(union, lists.iter().map(Vec::len).sum::<usize>());
            }
            let mut expected: Vec<Vec<u8>> = lists.iter().flatten().map(|b| vec![*b]).collect();
            all.sort();
            expected.sort();
            prop_assert_eq!(all, expected);
        }
    }

    #[test]
    fn unchanged_parallelism_keeps_each_subtasks_own_list() {
        let snap = snapshot(&[vec![1, 2], vec![3]]);
        assert_eq!(redistribute(&snap, 2, 0).list_state["l"], vec![vec![1], vec![2]]);
        assert_eq!(redistribute(&snap, 2, 1).list_state["l"], vec![vec![3]]);
    }
}
