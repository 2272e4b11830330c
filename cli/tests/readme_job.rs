//! The job file the README shows is one `exactly check` accepts: every key exists, with the
//! meaning shown, and the settings agree with each other (the sink's transaction timeout against
//! the checkpoints' longest wait).

use std::path::Path;

use exactly_cli::jobfile::Job;

#[test]
fn the_readmes_job_file_passes_the_checks_of_exactly_check() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).expect("README.md");
    let block: String = readme
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a ```toml block in README.md")
        .to_owned();
    assert!(block.contains("[sink.kafka]"), "the README's job file: {block}");
    if let Err(e) = Job::parse(Path::new("README.md"), &block) {
        panic!("the README's job file is refused: {e}\n{block}");
    }
    // And the check sees a mistake: the same file with a transaction timeout too short for its
    // checkpoints.
    let broken = block.replace("transaction_timeout = \"2m\"", "transaction_timeout = \"20s\"");
    assert_ne!(broken, block, "the README's job file sets transaction_timeout = \"2m\"");
    assert!(
        Job::parse(Path::new("README.md"), &broken).is_err(),
        "a 20 s transaction timeout passed"
    );
}
