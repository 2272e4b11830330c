//! Files and directories private to the job's user (0700 directories, 0600 files): checkpoint
//! directories and their files, the state backend's working copy. Checkpoints hold the job's
//! keyed state and its sinks' pending transactions; another local user must neither read them
//! nor plant files where the job will look.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::{CoreError, Result};

/// Creates `path` and its missing parents, each readable by this user only (directories that
/// exist keep their mode: the operator's choice).
pub(crate) fn create_dir_all(path: &Path) -> std::io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(path)
}

/// Creates (or truncates) `path`, readable and writable by this user only when created.
pub(crate) fn create_file(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

/// Creates `path`, which must not exist (nor be a link), readable and writable by this user only.
pub(crate) fn create_new_file(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)
}

/// The warning for a checkpoint directory that exists with access for other users (made by an
/// earlier version, or by the operator): the job's state and pending transactions are readable,
/// or writable, by them.
pub(crate) fn shared_access_warning(dir: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then(|| {
        format!(
            "{} has mode {mode:o}: other users may read (or change) the job's checkpoints; chmod 700 it unless that is meant",
            dir.display()
        )
    })
}

/// Writes `bytes` to a file [`create_file`] makes.
pub(crate) fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    create_file(path)?.write_all(bytes)
}

/// Where the state backend keeps its working copy when the job names no directory: a directory
/// of this process's own under the temporary directory, made with a random name and mode 0700
/// (a fixed name such as `/tmp/exactly-state` could be made first by another local user, who
/// would then read the job's state or plant links in it). The same for the life of the process.
pub fn default_state_root() -> Result<PathBuf> {
    static ROOT: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    ROOT.get_or_init(|| {
        tempfile::Builder::new()
            .prefix("exactly-state-")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir()
            .map(tempfile::TempDir::keep)
            .map_err(|e| e.to_string())
    })
    .clone()
    .map_err(|e| {
        CoreError::io(
            "creating",
            std::env::temp_dir().join("exactly-state-*"),
            std::io::Error::other(e),
        )
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn what_is_created_is_the_users_alone() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b/c");
        create_dir_all(&deep).unwrap();
        for d in ["a", "a/b", "a/b/c"] {
            assert_eq!(mode(&dir.path().join(d)) & 0o077, 0, "{d}");
        }
        let f = deep.join("f");
        write(&f, b"x").unwrap();
        assert_eq!(mode(&f) & 0o077, 0);
    }

    /// A checkpoint location made by the job, and the files put there, are the user's alone
    /// (0755 and 0644 under the usual umask before).
    #[test]
    fn checkpoint_directories_and_files_are_the_users_alone() {
        use crate::storage::blobs::{Blobs, Dir, Put};
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("checkpoints");
        crate::storage::Storage::new(&root).unwrap();
        assert_eq!(mode(&root) & 0o077, 0);
        assert_eq!(mode(&root.join("shared")) & 0o077, 0);
        let blobs = Dir { root: root.clone() };
        for (key, how) in [
            ("chk-1/a", Put::InProgress),
            ("chk-1/_metadata", Put::Create),
            ("_owner", Put::Replace),
        ] {
            assert!(blobs.put(key, b"x", how).unwrap());
            assert_eq!(mode(&root.join(key)) & 0o077, 0, "{key}");
        }
        assert_eq!(mode(&root.join("chk-1")) & 0o077, 0);
    }

    #[test]
    fn a_directory_others_may_enter_is_warned_about_and_new_files_are_never_links() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(shared_access_warning(dir.path()).is_some_and(|w| w.contains("755")));
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(shared_access_warning(dir.path()), None);
        let target = dir.path().join("target");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(create_new_file(&link).is_err(), "a planted link is not followed");
        assert!(!target.exists());
    }

    #[test]
    fn the_default_state_root_is_private_and_not_a_fixed_name() {
        let root = default_state_root().unwrap();
        assert_eq!(mode(&root), 0o700);
        assert_eq!(root, default_state_root().unwrap(), "one per process");
        let name = root.file_name().unwrap().to_str().unwrap();
        assert!(
            name.starts_with("exactly-state-") && name.len() > "exactly-state-".len(),
            "{name}"
        );
        assert_ne!(root, std::env::temp_dir().join("exactly-state"));
    }
}
