use super::*;
use crate::runtime::SourceStatus;

struct Nothing;

impl Source<Vec<u8>> for Nothing {
    async fn poll_next(&mut self, _out: &mut Vec<Vec<u8>>) -> Result<SourceStatus> {
        Ok(SourceStatus::End)
    }
}

#[test]
fn a_uid_that_is_not_a_file_name_is_refused() {
    for uid in ["a/b", "..", "", "x\\y"] {
        let mut job = JobBuilder::new(JobConfig::new("u"));
        job.source(uid, 1, |_: &SubtaskInfo| Nothing)
            .sink("out", |_: &SubtaskInfo| Discard);
        let err = job.build().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("usable as a file name"), "{uid:?}: {err}");
    }
}

struct Discard;

impl crate::runtime::Sink<Vec<u8>> for Discard {
    async fn write(&mut self, _records: Vec<Vec<u8>>) -> Result<()> {
        Ok(())
    }
}

/// A weigher the user gave wins over the sources' defaults, on whichever input of a union it
/// stands; through `filter` too.
#[test]
fn a_stage_weighs_its_input_as_the_user_said() {
    let mut job = JobBuilder::new(JobConfig::new("w"));
    let a = job.source("a", 1, |_: &SubtaskInfo| Nothing);
    let b = job
        .source("b", 1, |_: &SubtaskInfo| Nothing)
        .record_size(|r: &Vec<u8>| 1000 + r.len())
        .filter(|_| true);
    let merged = a.union(vec![b]);
    let weigh = merged.record_size.clone().expect("weighed");
    assert_eq!(weigh(&vec![0; 5]), 1005);
    let plain = job.source("c", 1, |_: &SubtaskInfo| Nothing).rebalance(1);
    assert_eq!(
        (plain.record_size.clone().expect("weighed"))(&vec![0; 5]),
        std::mem::size_of::<Vec<u8>>()
    );
}
