//! Proves each recorded stream against etcd's history, segment by segment.

use std::fmt::Write as _;

use crate::history::{History, State};
use crate::informer::{Received, Segment, Start, Transcript};
use crate::model::{expected_after, Expected, Kind};

/// What the verifier found in one transcript.
#[derive(Debug, Default, Clone)]
pub struct Verdict {
    /// Events that matched etcd's history.
    pub checked: usize,
    /// Events of etcd's history the watcher should have had and did not.
    pub lost: usize,
    /// Events received again or out of order.
    pub duplicates: usize,
    /// Events for a key or an object the watcher did not ask for.
    pub cross: usize,
    /// Resyncs seen (marked differences) and proven against etcd's state.
    pub resyncs: usize,
    /// The first problem of each kind, in words.
    pub failures: Vec<String>,
}

impl Verdict {
    fn fail(&mut self, what: String) {
        if self.failures.len() < 5 {
            self.failures.push(what);
        }
    }
}

/// Verifies `t` against `history` up to its head; the last segment must
/// have received every event up to it (anything missing there is lost, or
/// a stall).
pub fn verify(t: &Transcript, history: &History, prefix: &str) -> Verdict {
    let mut v = Verdict::default();
    let head = history.head();
    let last = t.segments.len().saturating_sub(1);
    for (n, segment) in t.segments.iter().enumerate() {
        let mut run = Run {
            t,
            history,
            prefix,
            n,
            v: &mut v,
        };
        run.segment(segment, n == last, head);
    }
    let want = t.selection.filter(prefix, &history.state_at(head));
    if t.store != want {
        let first = first_difference(&t.store, &want);
        v.fail(format!(
            "watcher {} ({:?}, {:?}, bookmarks {}, initial events {}, {} runs, the last from {:?}, at version {}): its store differs from etcd's at {head} ({first})",
            t.id,
            t.selection,
            t.manner,
            t.bookmarks,
            t.initial_events,
            t.segments.len(),
            t.segments.last().map(|s| match &s.start {
                Start::Listed { revision, .. } => format!("a list at {revision}"),
                Start::Initial => "initial events".into(),
                Start::Resumed { from } => format!("a resume from {from}"),
            }),
            t.version,
        ));
    }
    v
}

struct Run<'a> {
    t: &'a Transcript,
    history: &'a History,
    prefix: &'a str,
    n: usize,
    v: &'a mut Verdict,
}

impl Run<'_> {
    fn here(&self) -> String {
        format!(
            "watcher {} ({:?}), segment {}",
            self.t.id, self.t.selection, self.n
        )
    }

    fn state(&self, revision: u64) -> State {
        self.t
            .selection
            .filter(self.prefix, &self.history.state_at(revision))
    }

    fn segment(&mut self, segment: &Segment, last: bool, head: u64) {
        let mut received = segment.received.as_slice();
        let base = match &segment.start {
            Start::Listed { revision, items } => {
                let want = self.state(*revision);
                if *items != want {
                    let d = first_difference(items, &want);
                    self.v.fail(format!(
                        "{}: list at {revision} differs from etcd's ({d})",
                        self.here()
                    ));
                }
                *revision
            }
            Start::Resumed { from } => *from,
            Start::Initial => {
                let Some(end) = received.iter().position(|r| {
                    matches!(
                        r,
                        Received::Bookmark {
                            initial_end: true,
                            ..
                        }
                    )
                }) else {
                    return;
                };
                let Received::Bookmark { revision, .. } = received[end] else {
                    unreachable!()
                };
                let mut got = State::new();
                for r in &received[..end] {
                    if let Received::Event {
                        kind: Kind::Added,
                        key,
                        value,
                        ..
                    } = r
                    {
                        got.insert(key.clone(), value.clone());
                    } else {
                        self.v.fail(format!(
                            "{}: not an ADDED among the initial events: {r:?}",
                            self.here()
                        ));
                    }
                }
                let want = self.state(revision);
                if got != want {
                    let d = first_difference(&got, &want);
                    self.v.fail(format!(
                        "{}: initial events at {revision} differ from etcd's ({d})",
                        self.here()
                    ));
                }
                received = &received[end + 1..];
                revision
            }
        };
        self.follow(base, received, last, head);
    }

    /// Checks the changes after `base` against the expected ones.
    fn follow(&mut self, base: u64, received: &[Received], last: bool, head: u64) {
        let mut expected = expected_after(self.history, self.prefix, &self.t.selection, base);
        let mut i = 0;
        // The state a resync started from, with its events applied so far,
        // and the versions its objects were shown at.
        let mut resync: Option<Resync> = None;
        let mut at = base;
        for r in received {
            match r {
                Received::Event {
                    resync: true,
                    kind,
                    key,
                    value,
                    revision,
                    ..
                } => {
                    let from = self.state(at);
                    let resync = resync.get_or_insert_with(|| Resync::from(from));
                    match kind {
                        Kind::Deleted => resync.state.remove(key),
                        _ => resync.state.insert(key.clone(), value.clone()),
                    };
                    resync.shown.push((*kind, key.clone(), *revision));
                }
                Received::Bookmark {
                    resync: true,
                    revision,
                    ..
                } => {
                    self.end_resync(&mut resync, at, *revision, true);
                    (expected, i, at) = (self.expected(*revision), 0, *revision);
                }
                Received::Bookmark { revision, .. } => {
                    if resync.is_some() {
                        continue;
                    }
                    if let Some(e) = expected.get(i).filter(|e| e.revision <= *revision) {
                        self.v.fail(format!(
                            "{}: BOOKMARK {revision} ahead of undelivered {e:?}",
                            self.here()
                        ));
                    }
                    if *revision > head {
                        self.v.fail(format!(
                            "{}: BOOKMARK {revision} beyond etcd's {head}",
                            self.here()
                        ));
                    }
                    at = at.max(*revision);
                }
                Received::Event {
                    kind,
                    key,
                    revision,
                    value,
                    ..
                } => {
                    if resync.is_some() {
                        let before = revision.saturating_sub(1);
                        self.end_resync(&mut resync, at, before, false);
                        (expected, i) = (self.expected(before), 0);
                    }
                    if !self.t.selection.scopes(self.prefix, key)
                        || (*kind != Kind::Deleted
                            && !self.t.selection.selects(self.prefix, key, value))
                    {
                        self.v.cross += 1;
                        self.v.fail(format!(
                            "{}: {kind:?} {key}@{revision} was not asked for",
                            self.here()
                        ));
                        continue;
                    }
                    let got = Expected {
                        kind: *kind,
                        key: key.clone(),
                        revision: *revision,
                        value: (*kind != Kind::Deleted).then(|| value.clone()),
                    };
                    if let Some(want) = expected.get(i).filter(|e| e.same_change(&got)) {
                        if want.value != got.value {
                            self.v.fail(format!(
                                "{}: {got:?} carries another value than etcd's",
                                self.here()
                            ));
                        }
                        self.v.checked += 1;
                        i += 1;
                        at = *revision;
                    } else if let Some(j) = expected[i.min(expected.len())..]
                        .iter()
                        .position(|e| e.same_change(&got))
                        .map(|j| j + i)
                    {
                        self.v.lost += j - i;
                        self.v.fail(format!(
                            "{}: lost {} event(s) before {got:?}, first {:?}",
                            self.here(),
                            j - i,
                            expected[i]
                        ));
                        self.v.checked += 1;
                        i = j + 1;
                        at = *revision;
                    } else if expected[..i].iter().any(|e| e.same_change(&got)) || *revision <= at {
                        self.v.duplicates += 1;
                        self.v
                            .fail(format!("{}: {got:?} again or out of order", self.here()));
                    } else {
                        self.v.fail(format!(
                            "{}: got {got:?}, expected {:?}",
                            self.here(),
                            expected.get(i)
                        ));
                    }
                }
            }
        }
        // A resync that no bookmark closed (bookmarks off) and no later event
        // followed: at the end of the stream, its state must be etcd's now.
        // One the stream broke off in is sent again whole after the resume.
        if resync.is_some() {
            if !last {
                return;
            }
            self.end_resync(&mut resync, at, head, false);
            (expected, i) = (self.expected(head), 0);
        }
        if last {
            let missing = expected[i.min(expected.len())..]
                .iter()
                .filter(|e| e.revision <= head)
                .count();
            if missing > 0 {
                self.v.lost += missing;
                self.v.fail(format!(
                    "{}: {missing} event(s) up to {head} never came, first {:?}",
                    self.here(),
                    expected[i]
                ));
            }
        }
    }

    fn expected(&self, after: u64) -> Vec<Expected> {
        expected_after(self.history, self.prefix, &self.t.selection, after)
    }

    /// A resync's state (the client's at `from` with its events applied)
    /// must be etcd's at the revision it ends at, and each object must be
    /// shown at its own version there; a deletion at the list's version,
    /// which is `revision` when a bookmark named it (`listed`), else
    /// after `from` and no later than `revision`.
    fn end_resync(&mut self, resync: &mut Option<Resync>, from: u64, revision: u64, listed: bool) {
        let Resync { state, shown } = resync
            .take()
            .unwrap_or_else(|| Resync::from(self.state(from)));
        let want = self.state(revision);
        self.v.resyncs += 1;
        if state != want {
            let d = first_difference(&state, &want);
            self.v.fail(format!(
                "{}: state after the resync to {revision} differs ({d})",
                self.here()
            ));
        }
        for (kind, key, version) in shown {
            let right = match kind {
                Kind::Deleted if listed => version == revision,
                Kind::Deleted => version > from && version <= revision,
                _ => Some(version) == self.history.version_at(&key, revision),
            };
            if !right {
                self.v.fail(format!(
                    "{}: {kind:?} {key} in the resync to {revision} shown at version {version}, etcd's is {:?}",
                    self.here(),
                    self.history.version_at(&key, revision)
                ));
            }
        }
    }
}

/// A resync as a client follows it.
struct Resync {
    /// The client's state when it began, with its events applied so far.
    state: State,
    /// Each event's type, key and the version its object was shown at.
    shown: Vec<(Kind, String, u64)>,
}

impl From<State> for Resync {
    fn from(state: State) -> Self {
        Self {
            state,
            shown: Vec::new(),
        }
    }
}

fn first_difference(got: &State, want: &State) -> String {
    let mut out = String::new();
    if let Some(k) = want.keys().find(|k| !got.contains_key(*k)) {
        let _ = write!(out, "missing {k}");
    } else if let Some(k) = got.keys().find(|k| !want.contains_key(*k)) {
        let _ = write!(out, "extra {k}");
    } else if let Some(k) = got.keys().find(|k| got.get(*k) != want.get(*k)) {
        let _ = write!(out, "other value of {k}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Change;
    use crate::model::{value, Selection};

    fn history() -> History {
        let put = |revision, key: &str, app| Change {
            revision,
            key: key.into(),
            value: Some(value(app, 0, revision)),
        };
        History {
            start: 1,
            initial: State::new(),
            initial_versions: Default::default(),
            changes: vec![
                put(2, "/p/ns-0/a", 1),
                put(3, "/p/ns-0/b", 1),
                put(4, "/p/ns-1/c", 1),
                put(5, "/p/ns-0/a", 2),
            ],
        }
    }

    fn event(kind: Kind, key: &str, revision: u64, app: usize) -> Received {
        Received::Event {
            kind,
            key: key.into(),
            revision,
            value: value(app, 0, revision),
            resync: false,
            resume: revision,
        }
    }

    fn bookmark(revision: u64) -> Received {
        Received::Bookmark {
            revision,
            resync: false,
            initial_end: false,
        }
    }

    /// A watcher of namespace ns-0 and app a-1 that received `received`
    /// after listing at 1, ending with `store`.
    fn transcript(received: Vec<Received>, store: &[(&str, usize, u64)]) -> Transcript {
        Transcript {
            id: 0,
            selection: Selection {
                namespace: Some("ns-0".into()),
                app: Some("a-1".into()),
                ..Selection::default()
            },
            manner: crate::informer::Manner::Prompt,
            token: None,
            bookmarks: true,
            initial_events: false,
            segments: vec![Segment {
                start: Start::Listed {
                    revision: 1,
                    items: State::new(),
                },
                received,
                ended: None,
            }],
            store: store
                .iter()
                .map(|(k, app, rev)| (k.to_string(), value(*app, 0, *rev)))
                .collect(),
            version: 0,
            complete: 0,
            relists: 1,
        }
    }

    fn check(received: Vec<Received>, store: &[(&str, usize, u64)]) -> Verdict {
        verify(&transcript(received, store), &history(), "/p")
    }

    #[test]
    fn the_right_stream_passes() {
        let v = check(
            vec![
                event(Kind::Added, "/p/ns-0/a", 2, 1),
                event(Kind::Added, "/p/ns-0/b", 3, 1),
                bookmark(4),
                event(Kind::Deleted, "/p/ns-0/a", 5, 1),
            ],
            &[("/p/ns-0/b", 1, 3)],
        );
        assert!(v.failures.is_empty(), "{:?}", v.failures);
        assert_eq!(v.checked, 3);
    }

    #[test]
    fn a_lost_event_a_duplicate_a_cross_delivery_and_an_early_bookmark_fail() {
        let lost = check(
            vec![
                event(Kind::Added, "/p/ns-0/b", 3, 1),
                event(Kind::Deleted, "/p/ns-0/a", 5, 1),
            ],
            &[("/p/ns-0/b", 1, 3)],
        );
        assert_eq!(lost.lost, 1, "{:?}", lost.failures);
        let twice = check(
            vec![
                event(Kind::Added, "/p/ns-0/a", 2, 1),
                event(Kind::Added, "/p/ns-0/a", 2, 1),
                event(Kind::Added, "/p/ns-0/b", 3, 1),
                event(Kind::Deleted, "/p/ns-0/a", 5, 1),
            ],
            &[("/p/ns-0/b", 1, 3)],
        );
        assert_eq!(twice.duplicates, 1, "{:?}", twice.failures);
        let cross = check(
            vec![
                event(Kind::Added, "/p/ns-0/a", 2, 1),
                event(Kind::Added, "/p/ns-0/b", 3, 1),
                event(Kind::Added, "/p/ns-1/c", 4, 1),
                event(Kind::Deleted, "/p/ns-0/a", 5, 1),
            ],
            &[("/p/ns-0/b", 1, 3)],
        );
        assert_eq!(cross.cross, 1, "{:?}", cross.failures);
        let early = check(
            vec![
                event(Kind::Added, "/p/ns-0/a", 2, 1),
                bookmark(3),
                event(Kind::Added, "/p/ns-0/b", 3, 1),
                event(Kind::Deleted, "/p/ns-0/a", 5, 1),
            ],
            &[("/p/ns-0/b", 1, 3)],
        );
        assert!(
            early
                .failures
                .iter()
                .any(|f| f.contains("BOOKMARK 3 ahead")),
            "{:?}",
            early.failures
        );
    }

    #[test]
    fn a_stall_and_a_wrong_store_fail() {
        let stalled = check(
            vec![event(Kind::Added, "/p/ns-0/a", 2, 1)],
            &[("/p/ns-0/a", 1, 2)],
        );
        assert_eq!(stalled.lost, 2, "{:?}", stalled.failures);
        assert!(stalled.failures.iter().any(|f| f.contains("store differs")));
    }

    #[test]
    fn a_marked_resync_must_end_in_etcds_state() {
        let resync_at = |kind, key: &str, app, revision| Received::Event {
            kind,
            key: key.to_owned(),
            revision,
            value: value(app, 0, 3),
            resync: true,
            resume: 2,
        };
        let resync = |kind, key: &str, app| resync_at(kind, key, app, 3);
        let end = Received::Bookmark {
            revision: 4,
            resync: true,
            initial_end: false,
        };
        let good = check(
            vec![
                event(Kind::Added, "/p/ns-0/a", 2, 1),
                resync(Kind::Added, "/p/ns-0/b", 1),
                end.clone(),
                event(Kind::Deleted, "/p/ns-0/a", 5, 1),
            ],
            &[("/p/ns-0/b", 1, 3)],
        );
        assert!(good.failures.is_empty(), "{:?}", good.failures);
        assert_eq!(good.resyncs, 1);
        // The object at the version the lost history starts from, not its
        // own.
        let shown_at_start = check(
            vec![
                event(Kind::Added, "/p/ns-0/a", 2, 1),
                resync_at(Kind::Added, "/p/ns-0/b", 1, 2),
                end.clone(),
                event(Kind::Deleted, "/p/ns-0/a", 5, 1),
            ],
            &[("/p/ns-0/b", 1, 3)],
        );
        assert!(
            (shown_at_start.failures.iter()).any(|f| f.contains("shown at version 2")),
            "{:?}",
            shown_at_start.failures
        );
        let short = check(
            vec![
                event(Kind::Added, "/p/ns-0/a", 2, 1),
                end,
                event(Kind::Deleted, "/p/ns-0/a", 5, 1),
            ],
            &[],
        );
        assert!(
            short
                .failures
                .iter()
                .any(|f| f.contains("after the resync")),
            "{:?}",
            short.failures
        );
    }
}
