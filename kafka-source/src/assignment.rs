//! Which subtask reads which partition: a deterministic rule, so every subtask agrees without
//! talking, and a restore with another parallelism redistributes partitions from the union state.

use exactly_core::state::hash_key;

/// The subtask (of `parallelism`) that reads `partition` of `topic`: partitions of one topic are
/// spread round robin starting at a subtask chosen by the topic's hash (Flink's
/// `KafkaTopicPartitionAssigner`), so several topics do not all start at subtask 0.
pub fn subtask_for(topic: &str, partition: i32, parallelism: u32) -> u32 {
    let start = hash_key(topic.as_bytes()) % u64::from(parallelism);
    ((start + partition as u64) % u64::from(parallelism)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_partition_has_exactly_one_owner_and_load_is_even() {
        for p in 1..6u32 {
            let mut load = vec![0; p as usize];
            for part in 0..12 {
                let owner = subtask_for("orders", part, p);
                assert!(owner < p);
                load[owner as usize] += 1;
            }
            let (min, max) = (load.iter().min().unwrap(), load.iter().max().unwrap());
            assert!(max - min <= 1, "{load:?}");
        }
        assert_eq!(subtask_for("t", 3, 1), 0);
    }
}
