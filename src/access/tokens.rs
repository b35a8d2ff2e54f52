//! Bearer tokens from a YAML file (`auth.tokens_file`): a list of
//! `{token, user, groups}`, read again when it changes. A presented token
//! is compared by its SHA-256 digest with every entry's, in constant time,
//! so neither how close a guess came nor how long a token is shows.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use parking_lot::{Mutex, RwLock};
use serde::Deserialize;
use subtle::ConstantTimeEq;
use tracing::{info, warn};

use super::reload::{baseline, Baseline};
use super::Caller;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    token: String,
    user: String,
    #[serde(default)]
    groups: Vec<String>,
}

/// An entry as it is kept: the token only as its digest.
struct Known {
    digest: [u8; 32],
    user: String,
    groups: Vec<String>,
}

pub struct Tokens {
    path: PathBuf,
    entries: RwLock<Arc<Vec<Known>>>,
    /// What the file held before the tokens in use were read from it,
    /// for its reloader's first comparison.
    first_seen: Mutex<Option<Baseline>>,
}

fn digest(token: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    d.as_ref().try_into().expect("SHA-256 is 32 bytes")
}

impl Tokens {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let first_seen = baseline(&[path.to_owned()]);
        Ok(Self {
            path: path.to_owned(),
            entries: RwLock::new(Arc::new(read(path)?)),
            first_seen: Mutex::new(Some(first_seen)),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where a reloader of the file starts: what it held before it was
    /// read, the first time; what it holds now after that.
    pub fn baseline(&self) -> Baseline {
        (self.first_seen.lock().take())
            .unwrap_or_else(|| baseline(std::slice::from_ref(&self.path)))
    }

    /// Reads the file again. A file that cannot be used (gone, emptied
    /// of anything parseable, unreadable) ends every token it held: a
    /// revocation is often made that way. Logged with the file, never its
    /// contents; false then.
    pub fn reload(&self) -> bool {
        match read(&self.path) {
            Ok(entries) => {
                info!(tokens = entries.len(), "token file changed; using it");
                *self.entries.write() = Arc::new(entries);
                true
            }
            Err(e) => {
                *self.entries.write() = Arc::new(Vec::new());
                warn!(
                    file = %self.path.display(),
                    error = format!("{e:#}"),
                    "token file changed and cannot be used; every token it held has ended"
                );
                false
            }
        }
    }

    /// The caller a token names. Every entry is compared, digest to
    /// digest, so the time taken says neither how close a guess came nor
    /// how long the token is.
    pub fn caller(&self, token: &str) -> Option<Caller> {
        let entries = self.entries.read().clone();
        let presented = digest(token);
        let mut found = None;
        for e in entries.iter() {
            if bool::from(e.digest.ct_eq(&presented)) && found.is_none() {
                found = Some(Caller {
                    user: e.user.clone(),
                    groups: e.groups.clone(),
                });
            }
        }
        found
    }
}

fn read(path: &Path) -> anyhow::Result<Vec<Known>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the token file {}", path.display()))?;
    Ok(parse(path, &text)?
        .into_iter()
        .map(|e| Known {
            digest: digest(&e.token),
            user: e.user,
            groups: e.groups,
        })
        .collect())
}

fn parse(path: &Path, text: &str) -> anyhow::Result<Vec<Entry>> {
    // serde_yaml's messages can quote the document: say where, not what.
    let entries: Vec<Entry> = serde_yaml_ng::from_str(text).map_err(|e| {
        let at = e
            .location()
            .map(|l| format!(" at line {}", l.line()))
            .unwrap_or_default();
        anyhow::anyhow!(
            "{} is not a list of {{token, user, groups}}{at}",
            path.display()
        )
    })?;
    for (i, e) in entries.iter().enumerate() {
        anyhow::ensure!(
            !e.token.is_empty() && !e.user.is_empty(),
            "{}: entry {i} needs a token and a user",
            path.display()
        );
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_names_its_caller_and_a_file_that_cannot_be_used_ends_its_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.yaml");
        std::fs::write(
            &path,
            "- {token: s3cret, user: alice, groups: [tenant-a]}\n",
        )
        .unwrap();
        let tokens = Tokens::load(&path).unwrap();
        assert_eq!(
            tokens.caller("s3cret"),
            Some(Caller {
                user: "alice".into(),
                groups: vec!["tenant-a".into()]
            })
        );
        assert_eq!(tokens.caller("s3cre"), None);
        assert_eq!(tokens.caller(""), None);
        std::fs::write(&path, "token: [unclosed").unwrap();
        assert!(!tokens.reload());
        assert_eq!(tokens.caller("s3cret"), None, "a file that does not parse");
        std::fs::write(&path, "- {token: other, user: bob}\n").unwrap();
        assert!(tokens.reload());
        assert_eq!(tokens.caller("s3cret"), None);
        assert_eq!(tokens.caller("other").unwrap().user, "bob");
        std::fs::remove_file(&path).unwrap();
        assert!(!tokens.reload());
        assert_eq!(tokens.caller("other"), None, "a file removed");
    }

    proptest::proptest! {
        #[test]
        fn any_file_is_read_or_refused_without_a_panic(text in ".{0,200}") {
            let _ = parse(Path::new("tokens.yaml"), &text);
        }

        #[test]
        fn any_token_file_shaped_text_is_read_or_refused(
            token in "[ -~]{0,12}",
            user in "[ -~]{0,12}",
            groups in proptest::collection::vec("[ -~]{0,6}", 0..3),
        ) {
            let text = format!("- {{token: {token}, user: {user}, groups: {groups:?}}}");
            let _ = parse(Path::new("tokens.yaml"), &text);
        }
    }

    #[test]
    fn a_bad_file_is_refused_without_quoting_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.yaml");
        std::fs::write(&path, "- {token: hunter2, user: alice, extra: 1}\n").unwrap();
        let err = format!("{:#}", Tokens::load(&path).err().unwrap());
        assert!(!err.contains("hunter2"), "{err}");
    }
}
