//! The generated messages and stub of `watchproxy.v1`, and what the
//! client adds to its `Object`.
#![allow(missing_docs)] // generated: the proto's comments are the docs it has

tonic::include_proto!("watchproxy.v1");

impl Object {
    /// The value as JSON, when it is JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.value).ok()
    }

    /// The string at a dotted path of the JSON value, such as
    /// `spec.nodeName`: what an index usually files an object under.
    pub fn field(&self, path: &str) -> Option<String> {
        let value = self.json()?;
        let found = path.split('.').try_fold(&value, |v, step| v.get(step))?;
        found.as_str().map(String::from)
    }
}
