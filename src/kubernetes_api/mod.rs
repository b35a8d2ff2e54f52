//! The edge of Kubernetes' own read API (discovery, and GET, LIST and
//! WATCH at the apiserver's paths): a request's path ([`path`]) and query
//! ([`options`]) read as the apiserver reads them, and refused in its
//! words, before they become the read core's typed queries; what each
//! resource is to that API ([`kinds`]); the discovery documents that
//! list them ([`discovery`]); and the JSON framing of objects, watch
//! events and lists ([`json`]).

pub mod discovery;
pub mod json;
pub mod kinds;
pub mod options;
pub mod path;
