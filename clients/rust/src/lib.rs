//! A client for watchproxy.
//!
//! [`Client`] calls List, Get and Watch and decodes every failure into an
//! [`Error`] (its stable [`Reason`], versions and retry advice).
//! [`Informer`] mirrors a resource into an indexed [`Store`] and streams
//! its changes, surviving restarts, replica moves and expired versions:
//!
//! ```no_run
//! # async fn mirror() -> Result<(), watchproxy_client::Error> {
//! use watchproxy_client::{Client, Informer};
//! let client = Client::connect("http://127.0.0.1:50051").await?;
//! let informer = Informer::new(client, "pods")
//!     .field_selector("spec.nodeName=node-7")
//!     .index("app", |pod| pod.labels.get("app").cloned().into_iter().collect())
//!     .start();
//! informer.wait_until_synced().await?;
//! println!("{} web pods", informer.store().by_index("app", "web").len());
//! # Ok(()) }
//! ```

mod backoff;
mod client;
mod error;
mod informer;
mod store;

/// The generated messages and stub of `watchproxy.v1`.
pub mod pb {
    tonic::include_proto!("watchproxy.v1");

    impl Object {
        /// The value as JSON, when it is JSON.
        pub fn json(&self) -> Option<serde_json::Value> {
            serde_json::from_slice(&self.value).ok()
        }
    }
}

pub use client::{Client, ClientBuilder, Watch};
pub use error::{Error, FieldViolation, Reason, DOMAIN};
pub use informer::{Event, EventStream, Informer, Running, Stats};
pub use store::{IndexFn, ObjectKey, Store};
pub use tonic::transport::{Certificate, ClientTlsConfig, Identity};
pub use tonic::Code;
