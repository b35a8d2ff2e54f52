//! What serves a call: any tower service that answers HTTP requests, as
//! the routes and each layer around them (admission, deadlines) do.

use std::convert::Infallible;

use tonic::body::Body;
use tower::Service;

/// A service that answers calls as HTTP requests: the routes, and each
/// layer of them.
pub trait Routes:
    Service<
        http::Request<Body>,
        Response = http::Response<Body>,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
{
}

impl<S> Routes for S
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
}
