//! The edge of Kubernetes' own read API (discovery, and GET, LIST and
//! WATCH at the apiserver's paths): a request's path ([`path`]) and query
//! ([`options`]) read as the apiserver reads them, and refused in its
//! words, before they become the read core's typed queries; what each
//! resource is to that API ([`kinds`]); and the discovery documents that
//! list them ([`discovery`]).

pub mod discovery;
pub mod kinds;
pub mod options;
pub mod path;
