//! GET of one object and LIST of a collection: the core's Get and List,
//! written as the apiserver writes them.

use http::Response;

use super::json;
use super::options::VersionMatch;
use super::respond::{self, Body, Shape};
use super::{KubernetesApi, Request};
use crate::api::error::KubeStatus;
use crate::api::CallInfo;
use crate::pb;

impl KubernetesApi {
    pub(super) async fn get(&self, request: Request<'_>) -> Response<Body> {
        let req = pb::GetRequest {
            resource: request.entry.resource.clone(),
            namespace: request.namespace(),
            name: request.target.name.unwrap_or_default().to_owned(),
            resource_version: request.options.resource_version.clone(),
            metadata_only: request.shape == Shape::Metadata,
            ..Default::default()
        };
        let info = CallInfo {
            method: "kubernetes.Get",
            resource: &req.resource,
            label_selector: "",
            field_selector: "",
        };
        let call = self.core.get_for(&request.meta, &req);
        let found = (self.core)
            .answer_with(&request.meta.metadata, info, call, |e| {
                Self::failed(&request, "get", e)
            })
            .await;
        let object = match found {
            Ok(object) => object,
            Err(status) => return respond::status(&status),
        };
        let (api_version, kind) = request.type_meta();
        match shown(&object, api_version, kind) {
            Some(bytes) => respond::json(bytes),
            None => respond::status(&self.undecodable(&request, &object)),
        }
    }

    pub(super) async fn list(&self, request: Request<'_>) -> Response<Body> {
        let o = &request.options;
        let version_match = match o.version_match() {
            Some(VersionMatch::Exact) => pb::ResourceVersionMatch::Exact,
            Some(VersionMatch::NotOlderThan) => pb::ResourceVersionMatch::NotOlderThan,
            None => pb::ResourceVersionMatch::Unspecified,
        };
        let req = pb::ListRequest {
            resource: request.entry.resource.clone(),
            namespace: request.namespace(),
            label_selector: o.label_selector.clone(),
            field_selector: o.field_selector.clone(),
            resource_version: o.resource_version.clone(),
            resource_version_match: version_match as i32,
            limit: o.limit.max(0),
            continue_token: o.continue_token.clone(),
            metadata_only: request.shape == Shape::Metadata,
            ..Default::default()
        };
        let info = CallInfo {
            method: "kubernetes.List",
            resource: &req.resource,
            label_selector: &req.label_selector,
            field_selector: &req.field_selector,
        };
        let call = self.core.list_for(&request.meta, &req);
        let page = (self.core)
            .answer_with(&request.meta.metadata, info, call, |e| {
                Self::failed(&request, "list", e)
            })
            .await;
        let page = match page {
            Ok(page) => page,
            Err(status) => return respond::status(&status),
        };
        // A list's kind is its items' with `List` after it, whatever their
        // shape (`PodList`, `PartialObjectMetadataList`).
        let (api_version, kind) = request.type_meta();
        let revision = page.resource_version.parse().unwrap_or_default();
        let mut out = json::list_head(api_version, kind, revision, &page.continue_token);
        for (i, object) in page.items.iter().enumerate() {
            let Some(bytes) = shown(object, api_version, kind) else {
                return respond::status(&self.undecodable(&request, object));
            };
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(&bytes);
        }
        json::list_tail(&mut out);
        respond::json(out)
    }

    /// A stored value that is not a JSON object: counted and logged with
    /// its key, and the read refused rather than answered in part.
    fn undecodable(&self, request: &Request<'_>, object: &pb::Object) -> KubeStatus {
        if let Ok(s) = self.core.served(&request.entry.resource) {
            s.metrics.undecodable.inc();
        }
        tracing::warn!(key = %object.key, "a stored value is not a JSON object: Kubernetes' API cannot show it");
        KubeStatus::internal(format!(
            "{} {:?} is stored as a value that is not a JSON object",
            request.entry.kind.kind, object.name
        ))
    }
}

/// An object as the apiserver shows it: at its resource version, with its
/// type.
fn shown(object: &pb::Object, api_version: &str, kind: &str) -> Option<Vec<u8>> {
    let revision = object.resource_version.parse().ok()?;
    json::object(&object.value, revision, api_version, kind)
}
