//! The docker CLI for the tests that run containers of the images `scripts/images build` makes
//! (shared by several test binaries).

// Each test binary uses some of these helpers.
#![allow(dead_code)]

use std::process::Command;

use anyhow::{bail, Context, Result};

pub(crate) const HOW_TO_BUILD: &str = "build the images and name them with\n\n    \
     scripts/images build && eval \"$(scripts/images env)\"\n\nor run the whole suite with `scripts/test`.";

/// The image named by the environment variable `var` (`EXACTLY_IMAGE_KAFKA`, ...).
pub(crate) fn image(var: &str) -> Result<String> {
    match std::env::var(var) {
        Ok(image) if !image.is_empty() => Ok(image),
        _ => bail!("{var} is not set: {HOW_TO_BUILD}"),
    }
}

/// Runs the docker CLI; its output, or the error with what it said.
pub(crate) fn docker(args: &[&str]) -> Result<String> {
    let out = Command::new("docker")
        .args(args)
        .output()
        .context("running docker (a Docker engine is needed: scripts/images engine)")?;
    if !out.status.success() {
        bail!(
            "docker {}: {}{}\n{HOW_TO_BUILD}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The label of this test run's containers and networks: `scripts/test` removes what carries it,
/// should a test process die before its own clean-up.
pub(crate) fn run_label() -> String {
    format!(
        "dev.exactly.test-run={}",
        std::env::var("TEST_RUN_LABEL").unwrap_or_else(|_| "none".into())
    )
}

/// The last lines a container logged (empty if it cannot be read).
pub(crate) fn logs(container: &str, lines: usize) -> String {
    let out = Command::new("docker")
        .args(["logs", "--tail", &lines.to_string(), container])
        .output();
    out.map(|o| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
    .unwrap_or_default()
}
