//! A connection's streams as its task keeps them: the protocol's side of
//! each ([`RecvSide`], the client's window for it) and what is served on
//! it: a watch's request arriving, its start, the live watch, or a call.

use bytes::{Bytes, BytesMut};
use futures::future::AbortHandle;
use tokio::sync::{mpsc, oneshot};

use super::bridge::Call;
use super::protocol::state::RecvSide;
use super::protocol::window::SendWindow;
use crate::dispatch::Place;

/// A Watch's request as it arrives; its start waits for it.
pub(super) struct Reading {
    /// What came so far. Its bytes hold their credit in the connection's
    /// window until the request is whole, so the window bounds what all
    /// the connection's unfinished requests hold.
    pub body: BytesMut,
    /// Where the whole body goes.
    pub whole: oneshot::Sender<BytesMut>,
    /// The start, which waits for the body.
    pub abort: AbortHandle,
}

/// A stream, as its connection keeps it.
pub(super) struct Entry {
    /// What is served on it.
    pub state: State,
    /// The client's side: open or half-closed (remote), and its window.
    pub recv: RecvSide,
    /// The client's window for it, until a watch or call takes it.
    pub send: SendWindow,
}

/// What is served on a stream.
pub(super) enum State {
    /// A Watch whose request is still arriving.
    Reading(Reading),
    /// A Watch waiting for its start.
    Starting(AbortHandle),
    Watch(Place),
    /// An etcd Watch stream, served by the connection as a watch is, its
    /// requests read as they come.
    Session {
        place: Place,
        /// Where its request's data goes; none once the request ended.
        requests: Option<mpsc::UnboundedSender<Bytes>>,
    },
    Call(Call),
}
