//! The deployment files are checked, without a cluster or a Docker engine: every Kubernetes
//! manifest in `deploy/kubernetes/` validates strictly (unknown fields are errors) against the
//! Kubernetes schemas with `kubernetes-validate`, the job file in the ConfigMap passes
//! `exactly check`, and every Dockerfile (`docker/Dockerfile`, `docker/images/*`) passes hadolint. The checkers are pinned and
//! installed by `EXACTLY_SETUP_TESTS=1 scripts/setup` (as `scripts/test` runs it) into
//! `~/.cache/exactly/tools`; the test fails, saying so, when they are missing. Each check is shown to reject a broken file, so it cannot pass by checking nothing.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use common::exactly;

/// The Kubernetes release the manifests are validated against.
const KUBERNETES: &str = "1.33.0";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn tool(name: &str) -> Result<PathBuf> {
    let dir = match std::env::var_os("EXACTLY_CACHE_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let base = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
                .context("no HOME")?;
            base.join("exactly")
        }
    };
    let path = dir.join("tools/bin").join(name);
    if !path.exists() {
        bail!(
            "{} is missing: run EXACTLY_SETUP_TESTS=1 scripts/setup (scripts/test does), which installs the deployment checkers (kubernetes-validate, hadolint)",
            path.display()
        );
    }
    Ok(path)
}

fn manifests() -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("deploy/kubernetes"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    Ok(files)
}

fn validate(file: &Path) -> Result<std::process::Output> {
    Ok(Command::new(tool("kubernetes-validate")?)
        .args(["--strict", "-k", KUBERNETES])
        .arg(file)
        .output()?)
}

#[test]
fn kubernetes_manifests_validate_against_the_schema() -> Result<()> {
    let files = manifests()?;
    let kinds: Vec<String> = files
        .iter()
        .filter_map(|f| f.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    for kind in ["configmap", "networkpolicy", "secret.example", "service", "statefulset"] {
        assert!(
            kinds.iter().any(|k| k == kind),
            "deploy/kubernetes/{kind}.yaml is missing"
        );
    }
    for f in &files {
        let out = validate(f)?;
        assert!(
            out.status.success(),
            "{} does not validate against Kubernetes {KUBERNETES}:\n{}{}",
            f.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The check sees a mistake: a misspelt field of the StatefulSet.
    let dir = tempfile::tempdir()?;
    let text = std::fs::read_to_string(repo().join("deploy/kubernetes/statefulset.yaml"))?;
    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, text.replace("serviceName:", "servicName:"))?;
    let out = validate(&broken)?;
    assert!(!out.status.success(), "a misspelt field passed the validator");
    assert!(String::from_utf8_lossy(&out.stdout).contains("servicName"));
    Ok(())
}

#[test]
fn the_configmaps_job_file_passes_exactly_check() -> Result<()> {
    let text = std::fs::read_to_string(repo().join("deploy/kubernetes/configmap.yaml"))?;
    let (_, body) = text
        .split_once("job.toml: |\n")
        .context("no job.toml in the ConfigMap")?;
    let job: String = body
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l.trim()))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        job.contains("dir = \"s3://"),
        "the manifests keep checkpoints in an object store"
    );
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("job.toml");
    std::fs::write(&file, job)?;
    let out = Command::new(exactly())
        .arg("check")
        .arg(&file)
        .env("EXACTLY_ADMIN_TOKEN", "a-token-of-at-least-16-bytes")
        .env("KAFKA_PASSWORD", "password")
        .output()?;
    assert!(
        out.status.success(),
        "exactly check:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[test]
fn the_dockerfiles_pass_hadolint() -> Result<()> {
    let hadolint = tool("hadolint")?;
    let mut dockerfiles = vec![repo().join("docker/Dockerfile")];
    for image in std::fs::read_dir(repo().join("docker/images"))? {
        dockerfiles.push(image?.path().join("Dockerfile"));
    }
    assert!(dockerfiles.len() >= 4, "{dockerfiles:?}");
    for dockerfile in &dockerfiles {
        let out = Command::new(&hadolint).arg(dockerfile).output()?;
        assert!(
            out.status.success() && out.stdout.is_empty(),
            "hadolint {}:\n{}{}",
            dockerfile.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The lint sees a mistake: an unpinned base image and `cd` in a RUN.
    let dir = tempfile::tempdir()?;
    let broken = dir.path().join("Dockerfile");
    std::fs::write(&broken, "FROM debian\nRUN cd /tmp && ls\n")?;
    let out = Command::new(&hadolint).arg(&broken).output()?;
    assert!(!out.status.success(), "hadolint passed a broken Dockerfile");
    Ok(())
}

/// The compose file publishes every port on 127.0.0.1 only: it runs Kafka without
/// authentication and MySQL with a fixed root password, for tests on one machine.
#[test]
fn the_compose_file_publishes_ports_on_loopback_only() -> Result<()> {
    let text = std::fs::read_to_string(repo().join("docker/compose.yaml"))?;
    let mut published = Vec::new();
    let mut in_ports = false;
    for line in text.lines() {
        let t = line.trim();
        if t == "ports:" {
            in_ports = true;
            continue;
        }
        match t.strip_prefix("- ") {
            Some(entry) if in_ports => published.push(entry.trim_matches('"').to_owned()),
            _ => in_ports = false,
        }
    }
    assert!(published.len() >= 3, "ports found: {published:?}");
    for p in &published {
        assert!(p.starts_with("127.0.0.1:"), "{p} is published on every interface");
    }
    Ok(())
}
