//! The fresh working directory of one run: created under `work_root` with mode 0700, filled with
//! the source and extra files, owned by the run's uid when there is one, and removed afterwards
//! (including whatever the program left there, even directories it made unreadable).
//!
//! Not here: confinement to the directory (Landlock, `filesystem_rules.rs`).

use std::fs;
use std::io;
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Path, PathBuf};

use crate::language::{Program, validate_file_name};

/// One entry of a work dir's initial contents: a directory (`contents: None`) or a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LayoutEntry {
    /// Relative to the work dir; parents come before their children.
    pub(crate) path: PathBuf,
    pub(crate) contents: Option<Vec<u8>>,
}

/// The initial contents of `program`'s work dir, directories first along each path. Fails on
/// an extra file name that is absolute, has `..`, or collides with the source file.
pub(crate) fn layout(program: &Program) -> Result<Vec<LayoutEntry>, String> {
    let mut files: Vec<(PathBuf, &[u8])> = vec![(
        PathBuf::from(program.language.source_file()),
        program.source.as_bytes(),
    )];
    for (name, contents) in &program.files {
        files.push((validate_file_name(name, program.language)?, contents));
    }
    let mut entries: Vec<LayoutEntry> = Vec::new();
    for (relative, contents) in files {
        if let Some(parent) = relative.parent() {
            let mut partial = PathBuf::new();
            for component in parent.components() {
                partial.push(component);
                if !entries.iter().any(|entry| entry.path == partial) {
                    entries.push(LayoutEntry {
                        path: partial.clone(),
                        contents: None,
                    });
                }
            }
        }
        if entries.iter().any(|entry| entry.path == relative) {
            return Err(format!(
                "extra file {} is given twice or is also a directory",
                relative.display()
            ));
        }
        entries.push(LayoutEntry {
            path: relative,
            contents: Some(contents.to_vec()),
        });
    }
    Ok(entries)
}

/// A run's directory; removed on drop.
#[derive(Debug)]
pub(crate) struct WorkDir {
    dir: Option<tempfile::TempDir>,
}

impl WorkDir {
    /// Creates the directory and writes the program's files. `owner` is the run's uid/gid.
    pub(crate) fn create(
        work_root: &Path,
        layout: &[LayoutEntry],
        owner: Option<(u32, u32)>,
    ) -> Result<WorkDir, String> {
        let dir = tempfile::Builder::new()
            .prefix("stoke-sandbox-")
            .tempdir_in(work_root)
            .map_err(|error| format!("creating a work dir in {}: {error}", work_root.display()))?;
        let work_dir = WorkDir { dir: Some(dir) };
        let root = work_dir.path().to_path_buf();
        let give = |path: &Path| -> Result<(), String> {
            if let Some((uid, gid)) = owner {
                chown(path, Some(uid), Some(gid))
                    .map_err(|error| format!("chown {}: {error}", path.display()))?;
            }
            Ok(())
        };
        fs::set_permissions(&root, fs::Permissions::from_mode(0o700))
            .map_err(|error| format!("chmod {}: {error}", root.display()))?;
        give(&root)?;

        for entry in layout {
            let path = root.join(&entry.path);
            match &entry.contents {
                None => fs::create_dir(&path)
                    .map_err(|error| format!("mkdir {}: {error}", path.display()))?,
                Some(contents) => fs::write(&path, contents)
                    .map_err(|error| format!("writing {}: {error}", path.display()))?,
            }
            give(&path)?;
        }
        Ok(work_dir)
    }

    pub(crate) fn path(&self) -> &Path {
        match &self.dir {
            Some(dir) => dir.path(),
            None => Path::new("/nonexistent"),
        }
    }
}

/// Makes every directory under `root` writable and searchable by its owner, so that a second
/// removal attempt can succeed (a program may `chmod 000` its own directories).
fn make_removable(root: &Path) -> io::Result<()> {
    fs::set_permissions(root, fs::Permissions::from_mode(0o700))?;
    for entry in fs::read_dir(root)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            make_removable(&entry.path())?;
        }
    }
    Ok(())
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let Some(dir) = self.dir.take() else { return };
        let path = dir.path().to_path_buf();
        if dir.close().is_err() {
            // Best effort; a directory that still cannot be removed is left for the OS's temp
            // cleaning rather than panicking in drop.
            let _ = make_removable(&path);
            let _ = fs::remove_dir_all(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_written_and_removed() {
        let root = tempfile::tempdir().unwrap();
        let program = Program {
            files: vec![("data/in.txt".to_string(), b"42".to_vec())],
            ..Program::python("print(1)")
        };
        let work_dir = WorkDir::create(root.path(), &layout(&program).unwrap(), None).unwrap();
        let path = work_dir.path().to_path_buf();
        assert_eq!(fs::read(path.join("main.py")).unwrap(), b"print(1)");
        assert_eq!(fs::read(path.join("data/in.txt")).unwrap(), b"42");
        drop(work_dir);
        assert!(!path.exists());
    }

    #[test]
    fn unreadable_directories_are_removed_too() {
        let root = tempfile::tempdir().unwrap();
        let work_dir =
            WorkDir::create(root.path(), &layout(&Program::python("")).unwrap(), None).unwrap();
        let locked = work_dir.path().join("locked");
        fs::create_dir(&locked).unwrap();
        fs::write(locked.join("f"), b"x").unwrap();
        fs::set_permissions(&locked, fs::Permissions::from_mode(0o000)).unwrap();
        let path = work_dir.path().to_path_buf();
        drop(work_dir);
        assert!(!path.exists());
    }

    #[test]
    fn escaping_file_names_are_refused() {
        let program = Program {
            files: vec![("../x".to_string(), Vec::new())],
            ..Program::python("")
        };
        assert!(layout(&program).is_err());
    }

    #[test]
    fn layout_lists_parent_directories_once_and_first() {
        let program = Program {
            files: vec![
                ("a/b/x".to_string(), b"1".to_vec()),
                ("a/y".to_string(), b"2".to_vec()),
            ],
            ..Program::python("")
        };
        let paths: Vec<String> = layout(&program)
            .unwrap()
            .iter()
            .map(|entry| entry.path.display().to_string())
            .collect();
        assert_eq!(paths, ["main.py", "a", "a/b", "a/b/x", "a/y"]);
    }
}
