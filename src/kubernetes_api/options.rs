//! A list or watch request's query, read as the Kubernetes apiserver
//! reads it: the parameters of `metav1.ListOptions`, then the apiserver's
//! checks of their combinations, with its wording, so that a client sees
//! the refusals it would see from the apiserver.

use std::fmt;

use crate::api::error::{Cause, KubeStatus};

/// How `resourceVersion` applies to a list (`resourceVersionMatch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionMatch {
    /// A state not older than the version given.
    NotOlderThan,
    /// The state at exactly the version given.
    Exact,
}

impl VersionMatch {
    fn name(self) -> &'static str {
        match self {
            Self::NotOlderThan => "NotOlderThan",
            Self::Exact => "Exact",
        }
    }
}

/// The query of a list or watch, each parameter as sent (checked for
/// its type only); [`ListOptions::parse`] checks how they combine.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ListOptions {
    pub label_selector: String,
    pub field_selector: String,
    pub watch: bool,
    pub allow_watch_bookmarks: bool,
    /// Unset: empty.
    pub resource_version: String,
    /// The value as sent; an unknown one is refused by the checks.
    pub resource_version_match: String,
    /// Objects per page; zero or less: all of them.
    pub limit: i64,
    pub continue_token: String,
    pub send_initial_events: Option<bool>,
    pub timeout_seconds: Option<i64>,
}

/// Why a query was refused: the apiserver's status for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptionsError {
    /// A parameter of the wrong type: 400 BadRequest.
    BadRequest(String),
    /// Parameters that do not go together: 422 Invalid, with each reason.
    Invalid(Vec<FieldError>),
}

/// One reason a combination of parameters was refused, as the
/// apiserver's `field.Error` words it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldError {
    Forbidden {
        field: &'static str,
        detail: String,
    },
    NotSupported {
        field: &'static str,
        value: String,
        supported: &'static [&'static str],
    },
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Forbidden { field, detail } => write!(f, "{field}: Forbidden: {detail}"),
            Self::NotSupported {
                field,
                value,
                supported,
            } => {
                write!(
                    f,
                    "{field}: Unsupported value: {value:?}: supported values: "
                )?;
                let quoted: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
                f.write_str(&quoted.join(", "))
            }
        }
    }
}

impl fmt::Display for OptionsError {
    /// The message of the apiserver's Status: `ListOptions.meta.k8s.io ""
    /// is invalid: ...`, the reasons in brackets when there are several.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadRequest(message) => f.write_str(message),
            Self::Invalid(errors) => {
                f.write_str("ListOptions.meta.k8s.io \"\" is invalid: ")?;
                let reasons: Vec<String> = errors.iter().map(ToString::to_string).collect();
                match reasons.as_slice() {
                    [one] => f.write_str(one),
                    many => write!(f, "[{}]", many.join(", ")),
                }
            }
        }
    }
}

impl OptionsError {
    /// The Status the apiserver answers: 400 BadRequest, or 422 Invalid
    /// with a cause for each reason.
    pub fn status(&self) -> KubeStatus {
        match self {
            Self::BadRequest(message) => KubeStatus::bad_request(message.clone()),
            Self::Invalid(errors) => {
                let causes = errors.iter().map(FieldError::cause).collect();
                KubeStatus::invalid("ListOptions", self.to_string(), causes)
            }
        }
    }
}

impl FieldError {
    /// A `metav1.StatusCause`: the error's type, its text after the
    /// field, and the field.
    fn cause(&self) -> Cause {
        let (reason, field) = match self {
            Self::Forbidden { field, .. } => ("FieldValueForbidden", field),
            Self::NotSupported { field, .. } => ("FieldValueNotSupported", field),
        };
        let text = self.to_string();
        let message = text
            .strip_prefix(&format!("{field}: "))
            .unwrap_or(&text)
            .to_owned();
        Cause {
            reason,
            message,
            field: (*field).to_owned(),
        }
    }
}

const RV_MATCH: &str = "resourceVersionMatch";
const SEND_INITIAL: &str = "sendInitialEvents";

impl ListOptions {
    /// Reads a request's query (after the `?`, percent-encoded): unknown
    /// parameters are ignored, as the apiserver ignores them; a repeated
    /// one counts at its first value.
    pub fn parse(query: &str) -> Result<Self, OptionsError> {
        let mut options = Self::default();
        let mut seen = std::collections::HashSet::new();
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            if !seen.insert(name.clone()) {
                continue;
            }
            let value = value.into_owned();
            match &*name {
                "labelSelector" => options.label_selector = value,
                "fieldSelector" => options.field_selector = value,
                "watch" => options.watch = flag(&name, &value)?,
                "allowWatchBookmarks" => options.allow_watch_bookmarks = flag(&name, &value)?,
                "resourceVersion" => options.resource_version = value,
                "resourceVersionMatch" => options.resource_version_match = value,
                "limit" => options.limit = number(&name, &value)?,
                "continue" => options.continue_token = value,
                "sendInitialEvents" => options.send_initial_events = Some(flag(&name, &value)?),
                "timeoutSeconds" => options.timeout_seconds = Some(number(&name, &value)?),
                _ => {}
            }
        }
        let errors = match options.watch {
            true => options.watch_errors(),
            false => options.list_errors(),
        };
        if errors.is_empty() {
            Ok(options)
        } else {
            Err(OptionsError::Invalid(errors))
        }
    }

    /// `resourceVersionMatch` once the checks passed; none when unset.
    pub fn version_match(&self) -> Option<VersionMatch> {
        [VersionMatch::NotOlderThan, VersionMatch::Exact]
            .into_iter()
            .find(|m| m.name() == self.resource_version_match)
    }

    fn list_errors(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let matched = self.resource_version_match.as_str();
        if !matched.is_empty() {
            if self.resource_version.is_empty() {
                errors.push(forbidden(
                    RV_MATCH,
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                ));
            }
            if !self.continue_token.is_empty() {
                errors.push(forbidden(
                    RV_MATCH,
                    "resourceVersionMatch is forbidden when continue is provided",
                ));
            }
            if self.version_match().is_none() {
                errors.push(FieldError::NotSupported {
                    field: RV_MATCH,
                    value: matched.to_owned(),
                    supported: &["Exact", "NotOlderThan", ""],
                });
            }
            if self.version_match() == Some(VersionMatch::Exact) && self.resource_version == "0" {
                errors.push(forbidden(
                    RV_MATCH,
                    "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                ));
            }
        }
        if self.send_initial_events.is_some() {
            errors.push(forbidden(
                SEND_INITIAL,
                "sendInitialEvents is forbidden for list",
            ));
        }
        errors
    }

    fn watch_errors(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let not_older = self.version_match() == Some(VersionMatch::NotOlderThan);
        if self.send_initial_events.is_some() && !not_older {
            errors.push(forbidden(
                RV_MATCH,
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        if !self.resource_version_match.is_empty() {
            if self.send_initial_events.is_none() {
                errors.push(forbidden(
                    RV_MATCH,
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                ));
            }
            if !not_older {
                errors.push(FieldError::NotSupported {
                    field: RV_MATCH,
                    value: self.resource_version_match.clone(),
                    supported: &["NotOlderThan"],
                });
            }
            if !self.continue_token.is_empty() {
                errors.push(forbidden(
                    RV_MATCH,
                    "resourceVersionMatch is forbidden when continue is provided",
                ));
            }
        }
        errors
    }
}

fn forbidden(field: &'static str, detail: &str) -> FieldError {
    FieldError::Forbidden {
        field,
        detail: detail.to_owned(),
    }
}

/// A boolean as Go's `strconv.ParseBool` reads one, which the apiserver's
/// parameter decoding uses.
fn flag(name: &str, value: &str) -> Result<bool, OptionsError> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(OptionsError::BadRequest(format!(
            "{name}: invalid boolean {value:?}"
        ))),
    }
}

fn number(name: &str, value: &str) -> Result<i64, OptionsError> {
    value
        .parse()
        .map_err(|_| OptionsError::BadRequest(format!("{name}: invalid integer {value:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(query: &str) -> String {
        match ListOptions::parse(query) {
            Err(e @ OptionsError::Invalid(_)) => e.to_string(),
            other => panic!("{query}: {other:?}"),
        }
    }

    #[test]
    fn every_parameter_is_read_and_unknown_ones_ignored() {
        let o = ListOptions::parse(
            "labelSelector=app%3Dweb%2Ctier+in+(a)&fieldSelector=spec.nodeName%3Dn1\
             &watch=1&allowWatchBookmarks=true&resourceVersion=12&limit=5\
             &timeoutSeconds=30&pretty=true&resourceVersionMatch=NotOlderThan\
             &sendInitialEvents=true",
        )
        .unwrap();
        assert_eq!(o.label_selector, "app=web,tier in (a)");
        assert_eq!(o.field_selector, "spec.nodeName=n1");
        assert!(o.watch && o.allow_watch_bookmarks);
        assert_eq!(
            (o.resource_version.as_str(), o.limit, o.timeout_seconds),
            ("12", 5, Some(30))
        );
        assert_eq!(o.version_match(), Some(VersionMatch::NotOlderThan));
        assert_eq!(o.send_initial_events, Some(true));
        assert_eq!(ListOptions::parse("").unwrap(), ListOptions::default());
    }

    #[test]
    fn a_parameter_of_the_wrong_type_is_a_bad_request_naming_it() {
        for (query, name) in [
            ("limit=ten", "limit"),
            ("watch=yes", "watch"),
            ("timeoutSeconds=1.5", "timeoutSeconds"),
            ("sendInitialEvents=", "sendInitialEvents"),
        ] {
            match ListOptions::parse(query) {
                Err(OptionsError::BadRequest(m)) => assert!(m.starts_with(name), "{m}"),
                other => panic!("{query}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_list_refuses_what_the_apiserver_refuses_in_its_words() {
        assert_eq!(
            invalid("resourceVersionMatch=Exact"),
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: \
             resourceVersionMatch is forbidden unless resourceVersion is provided"
        );
        assert_eq!(
            invalid("resourceVersion=0&resourceVersionMatch=Exact"),
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: \
             resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\""
        );
        assert_eq!(
            invalid("resourceVersion=5&resourceVersionMatch=exact"),
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Unsupported \
             value: \"exact\": supported values: \"Exact\", \"NotOlderThan\", \"\""
        );
        assert_eq!(
            invalid("sendInitialEvents=false"),
            "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: \
             sendInitialEvents is forbidden for list"
        );
        assert_eq!(
            invalid("resourceVersionMatch=NotOlderThan&continue=abc"),
            "ListOptions.meta.k8s.io \"\" is invalid: [resourceVersionMatch: Forbidden: \
             resourceVersionMatch is forbidden unless resourceVersion is provided, \
             resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when \
             continue is provided]"
        );
        let exact = ListOptions::parse("resourceVersion=7&resourceVersionMatch=Exact").unwrap();
        assert_eq!(exact.version_match(), Some(VersionMatch::Exact));
    }

    #[test]
    fn a_watch_takes_a_version_match_only_with_initial_events() {
        assert_eq!(
            invalid("watch=true&sendInitialEvents=true"),
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: \
             sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
        );
        assert_eq!(
            invalid("watch=true&resourceVersionMatch=NotOlderThan"),
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: \
             resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"
        );
        assert!(
            invalid("watch=true&sendInitialEvents=true&resourceVersionMatch=Exact")
                .contains("supported values: \"NotOlderThan\"")
        );
        let watch_list = ListOptions::parse(
            "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
        )
        .unwrap();
        assert_eq!(watch_list.send_initial_events, Some(true));
        assert!(ListOptions::parse("watch=true&resourceVersion=0").is_ok());
    }

    #[test]
    fn a_refusal_is_the_apiservers_status() {
        let e = ListOptions::parse("sendInitialEvents=true").unwrap_err();
        let status: serde_json::Value = serde_json::from_slice(&e.status().to_json()).unwrap();
        assert_eq!(status["code"], 422);
        assert_eq!(status["reason"], "Invalid");
        assert_eq!(status["details"]["kind"], "ListOptions");
        assert_eq!(status["details"]["group"], "meta.k8s.io");
        assert_eq!(
            status["details"]["causes"][0],
            serde_json::json!({
                "reason": "FieldValueForbidden",
                "message": "Forbidden: sendInitialEvents is forbidden for list",
                "field": "sendInitialEvents"
            })
        );
        let e = ListOptions::parse("limit=x").unwrap_err();
        assert_eq!((e.status().code, e.status().reason), (400, "BadRequest"));
    }

    #[test]
    fn a_repeated_parameter_counts_at_its_first_value() {
        let o = ListOptions::parse("limit=2&limit=notanumber").unwrap();
        assert_eq!(o.limit, 2);
    }
}
