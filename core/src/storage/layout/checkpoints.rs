//! The checkpoint storage a location gives the engine: checkpoints written, listed, read and
//! retired, and the files that stay while a checkpoint still shares them.

use super::*;

fn shared_names(meta: &CheckpointMetadata) -> impl Iterator<Item = &str> {
    meta.files()
        .filter(|f| f.scope == FileScope::Shared)
        .map(|f| f.name.as_str())
}

impl CheckpointStorage for Storage {
    fn writer(&self, id: CheckpointId) -> Result<Arc<dyn SnapshotWriter>> {
        Ok(Arc::new(Writer {
            blobs: self.blobs.clone(),
            dir: chk(id),
            tag: self.tag.clone(),
            written: AtomicU64::new(0),
        }))
    }

    fn commit(&self, meta: &CheckpointMetadata) -> Result<()> {
        // The bug the order below guards against, put back for the simulation to catch.
        #[cfg(test)]
        let checked_first = crate::sim::mutant() == crate::sim::Mutant::CheckBeforeBegun;
        #[cfg(not(test))]
        let checked_first = false;
        if checked_first {
            self.check_claim()?;
        }
        if !meta.files().any(|f| f.scope == FileScope::Private) {
            // No file of its own: its directory would appear only with its metadata — whose
            // write may land after its answer was lost, after a restart that, not seeing it,
            // could not make it void (`unfinished.rs`); or come from a run that stalled past
            // its lease after the owner check below, after another run that took the location
            // over listed it. A file of this process first, then the check: a run that claims
            // after the check sees the checkpoint when it lists, and makes it void.
            #[cfg(test)]
            let skip = crate::sim::mutant() == crate::sim::Mutant::NoBegunFile;
            #[cfg(not(test))]
            let skip = false;
            if !skip {
                let begun = join(&chk(meta.id), &format!("{}-begun", self.tag));
                self.blobs.put(&begun, b"begun\n", Put::InProgress)?;
            }
        }
        if !checked_first {
            self.check_claim()?;
        }
        let key = join(&chk(meta.id), METADATA_FILE);
        let bytes = encode_metadata(meta)?;
        let written = self.blobs.put(&key, &bytes, Put::Create);
        if !matches!(written, Ok(true)) {
            // An error may follow a write that landed (an answer lost, a timeout), and "already
            // there" may answer a retried create whose first try landed: what is there now
            // settles it.
            self.settle_commit(meta.id, &key, &bytes, written)?;
        }
        self.mark_has_checkpoints()
    }

    fn abort(&self, id: CheckpointId) -> Result<()> {
        if self.blobs.size(&join(&chk(id), METADATA_FILE))?.is_some() {
            return Ok(()); // completed meanwhile: never delete a durable checkpoint here
        }
        // Only the files this storage wrote (its tag): the delete may land late (an object
        // store's request held), when a later process has begun the same id again.
        #[cfg(test)]
        if crate::sim::mutant() == crate::sim::Mutant::AbortDeletesDir {
            return self.blobs.delete_dir(&chk(id));
        }
        self.blobs.delete_named(&chk(id), &format!("{}-", self.tag))
    }

    fn completed(&self) -> Result<Vec<CheckpointId>> {
        Ok(self.scan()?.completed)
    }

    fn open(&self, id: CheckpointId) -> Result<Snapshot> {
        open_in(self.blobs.clone(), chk(id))
    }

    fn latest(&self) -> Result<Option<Snapshot>> {
        let ids = self.completed()?;
        let Some(&newest) = ids.last() else {
            if self.blobs.size(MARKER_FILE)?.is_some() {
                return Err(CoreError::CheckpointsVanished(self.root.clone()));
            }
            return Ok(None);
        };
        match self.open(newest).and_then(|s| verify_files(&s).map(|()| s)) {
            Ok(s) => {
                // Locations written before the marker existed get it on their first restore.
                self.mark_has_checkpoints()?;
                Ok(Some(s))
            }
            Err(CoreError::Corrupt { path, reason }) => {
                let older: Vec<String> = ids[..ids.len() - 1].iter().rev().take(5).map(u64::to_string).collect();
                Err(CoreError::NewestCheckpointUnusable {
                    id: newest,
                    dir: self.root.clone(),
                    reason: format!("{}: {reason}", path.display()),
                    older: if older.is_empty() {
                        String::new()
                    } else {
                        format!(" (older checkpoints here: {})", older.join(", "))
                    },
                })
            }
            // I/O (EIO, ESTALE, permissions, an outage): the attempt fails and is retried.
            Err(e) => Err(e),
        }
    }

    fn retain(&self, keep: usize) -> Result<Vec<CheckpointId>> {
        let ids = self.completed()?;
        if ids.len() <= keep {
            return Ok(Vec::new());
        }
        let (drop_ids, keep_ids) = ids.split_at(ids.len() - keep);
        // Fails closed: a retained checkpoint whose metadata cannot be read (an outage, EMFILE, a
        // damaged file) may still reference any shared file, so nothing is deleted this time.
        let mut still_used = BTreeSet::new();
        for id in keep_ids {
            let s = match self.open(*id) {
                Ok(s) => s,
                // The bug this guards against, put back for the simulation to catch.
                #[cfg(test)]
                Err(_) if crate::sim::mutant() == crate::sim::Mutant::RetainPastReadError => continue,
                Err(e) => return Err(e),
            };
            still_used.extend(shared_names(&s.meta).map(str::to_owned));
        }
        // What each dropped checkpoint references is read before anything goes; an I/O error
        // stops the pass. Metadata that reads but does not decode never will: that checkpoint
        // goes, and the shared files only it used stay behind (unreferenced, never wrongly
        // deleted).
        let mut unused = Vec::new();
        for id in drop_ids {
            match self.open(*id) {
                Ok(s) => unused.extend(
                    shared_names(&s.meta)
                        .filter(|name| !still_used.contains(*name))
                        .map(str::to_owned),
                ),
                Err(CoreError::Corrupt { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        // Every dropped checkpoint's metadata first: a pass that stops midway leaves incomplete
        // checkpoints (and unreferenced shared files), never a listed checkpoint with missing
        // files — a shared file may be used by several dropped checkpoints.
        let mut dropped = Vec::new();
        for id in drop_ids {
            self.blobs.delete(&join(&chk(*id), METADATA_FILE))?;
            dropped.push(*id);
        }
        for id in drop_ids {
            self.blobs.delete_dir(&chk(*id))?;
        }
        unused.sort();
        unused.dedup();
        for name in unused {
            self.blobs.delete(&join(SHARED, &name))?;
        }
        Ok(dropped)
    }

    fn discard_all(&self) -> Result<()> {
        for id in self.completed()? {
            self.blobs.delete(&join(&chk(id), METADATA_FILE))?;
            self.blobs.delete_dir(&chk(id))?;
        }
        // Deleted on purpose (retention on cancel): the next start begins anew.
        self.blobs.delete(MARKER_FILE)?;
        self.blobs.delete(RESTORE_FILE)?;
        self.blobs.delete_dir(SHARED)?;
        if !is_url(&self.root) {
            let shared = self.root.join(SHARED);
            crate::private_fs::create_dir_all(&shared).map_err(|e| CoreError::io("creating", &shared, e))?;
        }
        Ok(())
    }

    fn check_owner(&self) -> Result<()> {
        self.check_claim()
    }

    fn export(&self, id: CheckpointId, dest: &Path) -> Result<()> {
        let source = self.open(id)?;
        let target = place(dest)?;
        let mut meta = source.meta.clone();
        // Each file passes through a temporary one, verified on the way in and streamed both
        // ways: memory does not grow with the state's largest file.
        let tmp = tempfile::tempdir()
            .map_err(|e| CoreError::io("creating a temporary directory in", std::env::temp_dir(), e))?;
        let local = tmp.path().join("file");
        for op in meta.operators.values_mut() {
            for sub in &mut op.subtasks {
                if let Some(keyed) = &mut sub.keyed {
                    for file in &mut keyed.files {
                        source.reader.download(file, &local)?;
                        if file.scope == FileScope::Shared {
                            file.name = format!("shared-{}", file.name);
                            file.scope = FileScope::Private;
                        }
                        target.put_file(&file.name, &local)?;
                    }
                }
            }
        }
        target.put(METADATA_FILE, &encode_metadata(&meta)?, Put::Replace)?;
        Ok(())
    }
}
