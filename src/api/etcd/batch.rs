//! The responses of an etcd Watch stream: a watch's changes taken
//! together go in one response, cut (between revisions, or into fragments
//! where the watch allows) to the message limit.

use std::collections::HashMap;

use prost::Message;

use super::wire::header;
use crate::etcdpb::etcdserverpb::WatchResponse;
use crate::etcdpb::mvccpb;

/// The watch id of a response that belongs to no one watch (a progress
/// answer, a refused creation), as etcd sends it.
pub const NO_WATCH: i64 = -1;
use crate::object::Revision;

/// The responses one turn of the stream sends, in order: a watch's
/// changes taken together go in one response (split only between
/// revisions, or, for a watch that allows it, into fragments).
#[derive(Default)]
pub struct Batch {
    responses: Vec<WatchResponse>,
    /// Where each watch's changes are gathered, while nothing else for it
    /// has followed.
    gathering: HashMap<i64, usize>,
}

impl Batch {
    pub fn push(&mut self, response: WatchResponse) {
        self.gathering.remove(&response.watch_id);
        self.responses.push(response);
    }

    pub fn event(&mut self, id: i64, revision: Revision, event: mvccpb::Event) {
        let at = *self.gathering.entry(id).or_insert_with(|| {
            self.responses.push(WatchResponse {
                watch_id: id,
                ..Default::default()
            });
            self.responses.len() - 1
        });
        let response = &mut self.responses[at];
        response.header = header(revision);
        response.events.push(event);
    }

    pub fn into_responses(self, fragments: impl Fn(i64) -> bool, max: usize) -> Vec<WatchResponse> {
        let mut out = Vec::with_capacity(self.responses.len());
        for r in self.responses {
            if r.events.is_empty() || r.encoded_len() <= max {
                out.push(r);
                continue;
            }
            let fragment = fragments(r.watch_id);
            split(r, max, fragment, &mut out);
        }
        out
    }
}

/// `r` in responses of at most `max` bytes where it can be: cut between
/// revisions, and, with `fragment`, inside one too, each part but the last
/// of a cut revision marked `fragment` as etcd marks them.
fn split(r: WatchResponse, max: usize, fragment: bool, out: &mut Vec<WatchResponse>) {
    let part = |events: Vec<mvccpb::Event>, fragment: bool| WatchResponse {
        header: (events.last())
            .and_then(|e| e.kv.as_ref())
            .and_then(|kv| header(kv.mod_revision as Revision)),
        watch_id: r.watch_id,
        events,
        fragment,
        ..Default::default()
    };
    let revision = |e: &mvccpb::Event| e.kv.as_ref().map_or(0, |kv| kv.mod_revision);
    let mut current: Vec<mvccpb::Event> = Vec::new();
    let mut size = 0;
    let mut events = r.events.iter().peekable();
    while let Some(e) = events.next() {
        let len = e.encoded_len() + 8;
        let same_revision = current
            .last()
            .is_some_and(|last| revision(last) == revision(e));
        if size + len > max && !current.is_empty() && (fragment || !same_revision) {
            let cut_inside = same_revision;
            out.push(part(std::mem::take(&mut current), cut_inside));
            size = 0;
        }
        current.push(e.clone());
        size += len;
        if events.peek().is_none() {
            out.push(part(std::mem::take(&mut current), false));
        }
    }
}

/// A creation refused for `why`.
pub fn refused(why: String) -> WatchResponse {
    WatchResponse {
        watch_id: NO_WATCH,
        created: true,
        canceled: true,
        cancel_reason: why,
        ..Default::default()
    }
}

/// Watch `id` canceled because the changes it needs are gone: it may
/// start again from `compact_revision`, after reading the state again.
pub fn compacted(id: i64, current: Revision, compact_revision: Revision) -> WatchResponse {
    WatchResponse {
        header: header(current),
        watch_id: id,
        canceled: true,
        compact_revision: compact_revision as i64,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, revision: i64) -> mvccpb::Event {
        mvccpb::Event {
            r#type: mvccpb::event::EventType::Put as i32,
            kv: Some(mvccpb::KeyValue {
                key: key.as_bytes().to_vec().into(),
                mod_revision: revision,
                value: vec![b'v'; 100].into(),
                ..Default::default()
            }),
            prev_kv: None,
        }
    }

    fn parts(fragment: bool) -> Vec<(Vec<i64>, bool)> {
        let r = WatchResponse {
            watch_id: 3,
            events: vec![put("/a", 5), put("/b", 5), put("/c", 5), put("/d", 6)],
            ..Default::default()
        };
        let mut out = Vec::new();
        split(r, 250, fragment, &mut out);
        let revisions = |r: &WatchResponse| {
            r.events
                .iter()
                .map(|e| e.kv.as_ref().unwrap().mod_revision)
                .collect()
        };
        out.iter().map(|r| (revisions(r), r.fragment)).collect()
    }

    #[test]
    fn a_revision_is_cut_only_into_fragments_and_only_when_asked() {
        assert_eq!(parts(false), [(vec![5, 5, 5], false), (vec![6], false)]);
        assert_eq!(parts(true), [(vec![5, 5], true), (vec![5, 6], false)]);
    }

    #[test]
    fn a_watchs_changes_gather_until_something_else_for_it_follows() {
        let mut batch = Batch::default();
        batch.event(1, 5, put("/a", 5));
        batch.event(2, 5, put("/b", 5));
        batch.event(1, 6, put("/c", 6));
        batch.push(WatchResponse {
            watch_id: 1,
            canceled: true,
            ..Default::default()
        });
        batch.event(1, 7, put("/d", 7));
        let sent = batch.into_responses(|_| false, usize::MAX);
        let shape: Vec<(i64, usize, bool)> = sent
            .iter()
            .map(|r| (r.watch_id, r.events.len(), r.canceled))
            .collect();
        assert_eq!(
            shape,
            [(1, 2, false), (2, 1, false), (1, 0, true), (1, 1, false)]
        );
        assert_eq!(sent[0].header.unwrap().revision, 6);
    }
}
