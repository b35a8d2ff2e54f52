//! The HTTP/2 protocol, apart from what is served on it: frames as they are
//! read ([`frame`], each type's `load` holding its rules) and written
//! ([`out`]), header blocks ([`hpack`]), the states of streams and of the
//! connection ([`state`]), flow-control windows ([`window`]), keepalive
//! pings ([`keepalive`]), and the socket ([`socket`]) and task
//! ([`repoll`]) a connection runs on. Nothing here knows gRPC, watches or
//! the cache: the connection above drives it.

pub mod frame;
pub mod hpack;
pub mod keepalive;
pub mod out;
pub mod repoll;
pub mod socket;
pub mod state;
pub mod window;
