//! What a watch of an etcd Watch stream showed, as etcd's client sees it.

use prost::Message;
use tonic::Status;

use super::super::batch::{compacted, Batch};
use super::super::merge::Seen;
use super::super::wire::{encoded_event, header, Encoded};
use super::EtcdStream;
use crate::api::error::{etcd_status, ApiError};
use crate::etcdpb::etcdserverpb::WatchResponse;
use crate::etcdpb::mvccpb;
use crate::object::EventType;

impl EtcdStream {
    /// What watch `id` showed, as etcd's client sees it; a failure that
    /// is not the watch's alone ends the stream with its status.
    pub(super) fn take(
        &mut self,
        id: i64,
        seen: Result<Seen, ApiError>,
        batch: &mut Batch,
    ) -> Result<(), Status> {
        let Some(opened) = self.open.get(&id) else {
            return Ok(());
        };
        let filtered = |put: bool| (put && opened.no_put) || (!put && opened.no_delete);
        match seen {
            Ok(Seen::Change(view)) if view.resync_from.is_some() => {
                // etcd's history was lost and the cache listed again at
                // the view's revision: etcd's clients know this as a
                // compaction, and read again.
                self.close(id);
                batch.push(compacted(id, view.revision, view.revision + 1));
            }
            Ok(Seen::Change(view)) => {
                let put = view.kind != EventType::Deleted;
                let key = view.object.key_bytes();
                if !filtered(put) && opened.range.as_ref().is_none_or(|r| r.contains(key)) {
                    batch.event(id, encoded_event(&view, opened.prev_kv));
                }
            }
            Ok(Seen::Forwarded(revision, e)) => {
                let put = e.r#type == mvccpb::event::EventType::Put as i32;
                if !filtered(put) {
                    let bytes = e.encode_to_vec().into();
                    let received = None;
                    batch.event(
                        id,
                        Encoded {
                            revision,
                            bytes,
                            received,
                        },
                    );
                }
            }
            Ok(Seen::Progress(revision, true)) if opened.progress_notify => {
                batch.push(WatchResponse {
                    header: header(revision),
                    watch_id: id,
                    ..Default::default()
                });
            }
            Ok(Seen::Progress(..)) => {}
            Ok(Seen::Canceled {
                current,
                compact_revision,
                reason,
            }) => {
                self.close(id);
                batch.push(WatchResponse {
                    header: header(current),
                    watch_id: id,
                    canceled: true,
                    compact_revision: compact_revision as i64,
                    cancel_reason: reason,
                    ..Default::default()
                });
            }
            Err(ApiError::FellBehind {
                oldest, current, ..
            }) => {
                self.close(id);
                batch.push(compacted(id, current, oldest + 1));
            }
            Err(e) => return Err(etcd_status(e)),
        }
        Ok(())
    }

    fn close(&mut self, id: i64) {
        self.open.remove(&id);
        self.streams.remove(&id);
    }
}
