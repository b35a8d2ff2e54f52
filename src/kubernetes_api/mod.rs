//! Kubernetes' own read API, served from the caches: discovery, and GET,
//! LIST and WATCH at the apiserver's paths, so that kubectl, informers and
//! every Kubernetes client library read through watchproxy with only
//! their server changed. A request's path ([`path`]) and query
//! ([`options`]) are read as the apiserver reads them, and refused in its
//! words, then become the read core's typed queries: the same identities,
//! rules, limits, snapshots and watchers as `watchproxy.v1`. Only the
//! mapping of resources ([`catalog`], [`kinds`]), the discovery documents
//! ([`discovery`]) and the JSON framing ([`json`], [`respond`]) are
//! Kubernetes'. Writes are refused with 405.

pub mod catalog;
pub mod discovery;
pub mod json;
pub mod kinds;
pub mod options;
pub mod path;
mod read;
pub mod respond;
mod watch;

use std::sync::Arc;

use http::{Method, Response};
use tonic::metadata::MetadataMap;

use crate::api::error::{kubernetes_status, ApiError, KubeStatus, Subject};
use crate::api::{Api, CallMeta};
use catalog::{Catalog, Entry};
use options::ListOptions;
use path::{Path, Target};
use respond::{Body, Shape};

/// Kubernetes' face: the read core's handle and the resources it serves.
#[derive(Clone)]
pub struct KubernetesApi {
    core: Api,
    catalog: Arc<Catalog>,
}

/// One request for a resource, checked: what it names, what it asks and
/// who sends it.
struct Request<'a> {
    entry: &'a Entry,
    target: Target<'a>,
    options: ListOptions,
    shape: Shape,
    meta: CallMeta,
}

impl Request<'_> {
    fn subject(&self, verb: &'static str) -> Subject<'_> {
        Subject {
            group: &self.entry.kind.group,
            plural: &self.entry.kind.plural,
            name: self.target.name,
            verb,
        }
    }

    fn namespace(&self) -> String {
        self.target.namespace.unwrap_or_default().to_owned()
    }

    /// The `apiVersion` and `kind` its objects are shown with.
    fn type_meta(&self) -> (&str, &str) {
        match self.shape {
            Shape::Objects => (&self.entry.api_version, &self.entry.kind.kind),
            Shape::Metadata => ("meta.k8s.io/v1", "PartialObjectMetadata"),
        }
    }
}

impl KubernetesApi {
    pub fn new(core: Api, catalog: Catalog) -> Self {
        Self {
            core,
            catalog: Arc::new(catalog),
        }
    }

    /// Answers one request; its body is not read (every served verb is a
    /// GET).
    pub async fn answer<B>(&self, request: http::Request<B>) -> Response<Body> {
        let (parts, _) = request.into_parts();
        let Some(path) = Path::parse(parts.uri.path()) else {
            return respond::status(&KubeStatus::no_such_path());
        };
        let accept = (parts.headers.get(http::header::ACCEPT))
            .and_then(|a| a.to_str().ok())
            .map(str::to_owned);
        let meta = CallMeta::of(tonic::Request::from_parts(
            MetadataMap::from_headers(parts.headers),
            parts.extensions,
            (),
        ))
        .0;
        let target = match path {
            Path::Resource(target) => target,
            discovery => return self.discovery(&parts.method, &meta, discovery),
        };
        let Some(entry) = self.served(&target) else {
            let group = target.group_version.group;
            if kinds::is_built_in(group, target.plural)
                && self.catalog.plural(group, target.plural).is_none()
            {
                let subject = Subject {
                    group,
                    plural: target.plural,
                    name: target.name,
                    verb: "get",
                };
                return respond::status(&KubeStatus::not_served(&subject));
            }
            return respond::status(&KubeStatus::no_such_path());
        };
        if parts.method != Method::GET && parts.method != Method::HEAD {
            let subject = Subject {
                group: &entry.kind.group,
                plural: &entry.kind.plural,
                name: target.name,
                verb: "",
            };
            return respond::status(&KubeStatus::read_only(parts.method.as_str(), &subject));
        }
        let options = match ListOptions::parse(parts.uri.query().unwrap_or_default()) {
            Ok(options) => options,
            Err(e) => return respond::status(&e.status()),
        };
        let Some(shape) = respond::negotiate(accept.as_deref()) else {
            return respond::status(&KubeStatus::not_acceptable(&format!(
                "only {} is served, with or without as=PartialObjectMetadata or as=PartialObjectMetadataList",
                respond::JSON
            )));
        };
        if entry.format == crate::config::ValueFormat::Kubernetes {
            return respond::status(&KubeStatus::not_acceptable(&format!(
                "{} are stored as protobuf, which watchproxy does not yet write as JSON: ask for {}",
                entry.kind.plural,
                respond::PROTOBUF
            )));
        }
        let request = Request {
            entry,
            target,
            options,
            shape,
            meta,
        };
        match (request.target.name, request.options.watch) {
            (_, true) => self.watch(request).await,
            (Some(_), false) => self.get(request).await,
            (None, false) => self.list(request).await,
        }
    }

    /// The resource a path names, where it can be named: a namespace only
    /// for a namespaced resource, and one object of a namespaced resource
    /// only in its namespace.
    fn served(&self, target: &Target<'_>) -> Option<&Entry> {
        let gv = target.group_version;
        let entry = self.catalog.find(gv.group, gv.version, target.plural)?;
        let scoped = match entry.kind.namespaced {
            true => target.name.is_none() || target.namespace.is_some(),
            false => target.namespace.is_none(),
        };
        scoped.then_some(entry)
    }

    /// The discovery documents, to an identified caller.
    fn discovery(&self, method: &Method, meta: &CallMeta, path: Path<'_>) -> Response<Body> {
        if method != Method::GET && method != Method::HEAD {
            let subject = Subject::default();
            return respond::status(&KubeStatus::read_only(method.as_str(), &subject));
        }
        if let Err(e) = self.core.enter(meta) {
            return respond::status(&kubernetes_status(e, &Subject::default()));
        }
        let served = self.catalog.kinds();
        let document = match path {
            Path::Version => Some(discovery::version()),
            Path::LegacyVersions => Some(discovery::legacy_versions(served)),
            Path::Groups => Some(discovery::groups(served)),
            Path::GroupVersions(group) => discovery::group(served, group),
            Path::Resources(gv) => discovery::resources(served, gv.group, gv.version),
            Path::Resource(_) => None,
        };
        match document {
            Some(d) => respond::json(serde_json::to_vec(&d).expect("plain data")),
            None => respond::status(&KubeStatus::no_such_path()),
        }
    }

    /// A failure of a call on `request`, as the apiserver words it.
    fn failed(request: &Request<'_>, verb: &'static str, e: ApiError) -> KubeStatus {
        kubernetes_status(e, &request.subject(verb))
    }
}
