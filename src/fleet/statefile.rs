//! The learned-state files in `learning.state_dir` (`capacity.json`, `rates.json`): read at
//! start, written atomically. A file this version cannot read is moved aside (`<name>.unread`)
//! rather than overwritten by the next save, so what it held can still be looked at.

use std::io::Write;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not a state file this version reads ({source}); moved aside to {aside}")]
    Format {
        path: String,
        aside: String,
        source: serde_json::Error,
    },
}

/// Read `dir/name`; a missing file is `T::default()`.
pub fn read<T: DeserializeOwned + Default>(dir: &Path, name: &str) -> Result<T, StoreError> {
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).map_err(|source| {
            let aside = dir.join(format!("{name}.unread"));
            let aside = match std::fs::rename(&path, &aside) {
                Ok(()) => aside.display().to_string(),
                Err(e) => format!("nowhere ({e}): the next save replaces it"),
            };
            StoreError::Format {
                path: path.display().to_string(),
                aside,
                source,
            }
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(T::default()),
        Err(source) => Err(StoreError::Io {
            path: path.display().to_string(),
            source,
        }),
    }
}

/// Write `dir/name` atomically: a temporary file in the same directory, fsync, rename over
/// the old.
pub fn write<T: Serialize>(dir: &Path, name: &str, value: &T) -> Result<(), StoreError> {
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    let io = |source| StoreError::Io {
        path: path.display().to_string(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let text = serde_json::to_vec(value).map_err(|e| io(std::io::Error::other(e)))?;
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(&text).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, &path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file that does not read is moved aside, not left for the next save to replace.
    #[test]
    fn a_file_that_does_not_read_is_moved_aside() {
        let dir = std::env::temp_dir().join(format!("fleetgate-statefile-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("x.json"), "{not json").unwrap();
        let e = read::<Vec<u32>>(&dir, "x.json").unwrap_err();
        assert!(e.to_string().contains("x.json.unread"), "{e}");
        assert!(!dir.join("x.json").exists());
        assert_eq!(
            std::fs::read_to_string(dir.join("x.json.unread")).unwrap(),
            "{not json"
        );
        assert_eq!(read::<Vec<u32>>(&dir, "x.json").unwrap(), Vec::<u32>::new());
        write(&dir, "x.json", &vec![1u32, 2]).unwrap();
        assert_eq!(read::<Vec<u32>>(&dir, "x.json").unwrap(), vec![1, 2]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
