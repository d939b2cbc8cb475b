//! Routes: name a class of traffic (by path, `model` field or headers). The route name is the
//! `route` label of every metric, so its cardinality is the config's. A route may override the
//! quality sample rate.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Route {
    pub name: String,
    /// All given conditions must hold; an empty match takes everything.
    #[serde(default, rename = "match")]
    pub matches: RouteMatch,
    /// Overrides `quality.sample_rate` for this route.
    #[serde(default)]
    pub sample_rate: Option<f64>,
    /// The SLA class of this traffic (a key of `classes`); unset: `routing.default_class`.
    #[serde(default)]
    pub class: Option<String>,
    /// The backends this route may use, by name; empty: all of them.
    #[serde(default)]
    pub backends: Vec<String>,
    /// Replace the body's `model` with the chosen backend's served model (its first `models`
    /// entry) when that backend does not serve the requested name: one public model name
    /// over backends that serve different models.
    #[serde(default)]
    pub rewrite_model: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RouteMatch {
    pub path_prefix: Option<String>,
    /// The request body's `model` field, exactly.
    pub model: Option<String>,
    /// Header name → exact value.
    pub headers: BTreeMap<String, String>,
}

impl RouteMatch {
    pub fn matches(&self, path: &str, model: Option<&str>, headers: &http::HeaderMap) -> bool {
        self.path_prefix.as_deref().is_none_or(|p| path.starts_with(p))
            && self.model.as_deref().is_none_or(|m| model == Some(m))
            && self
                .headers
                .iter()
                .all(|(k, v)| headers.get(k.as_str()).is_some_and(|h| h.as_bytes() == v.as_bytes()))
    }
}

/// The index of the first route that matches, in config order.
pub fn select(routes: &[Route], path: &str, model: Option<&str>, headers: &http::HeaderMap) -> Option<usize> {
    routes.iter().position(|r| r.matches.matches(path, model, headers))
}

pub(super) fn validate(
    routes: &[Route],
    backends: &[&str],
    classes: &BTreeMap<String, super::SlaClass>,
    err: &mut dyn FnMut(String, String),
) {
    let mut names = std::collections::HashSet::new();
    for (i, r) in routes.iter().enumerate() {
        let p = format!("routes[{i}]");
        if r.name.is_empty() || !r.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            err(format!("{p}.name"), format!("`{}` must be non-empty [A-Za-z0-9._-]", r.name));
        }
        if !names.insert(r.name.as_str()) {
            err(format!("{p}.name"), format!("duplicate route name `{}`", r.name));
        }
        if let Some(s) = r.sample_rate
            && !(0.0..=1.0).contains(&s)
        {
            err(format!("{p}.sample_rate"), format!("must be between 0 and 1, got {s}"));
        }
        if let Some(c) = &r.class
            && !classes.contains_key(c)
        {
            err(format!("{p}.class"), format!("no class named `{c}`"));
        }
        for (j, b) in r.backends.iter().enumerate() {
            if !backends.contains(&b.as_str()) {
                err(format!("{p}.backends[{j}]"), format!("no backend named `{b}`"));
            }
        }
        for k in r.matches.headers.keys() {
            if http::HeaderName::from_bytes(k.as_bytes()).is_err() {
                err(format!("{p}.match.headers.{k}"), "not a valid header name".into());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(name: &str, m: RouteMatch) -> Route {
        Route {
            name: name.into(),
            matches: m,
            sample_rate: None,
            class: None,
            backends: vec![],
            rewrite_model: false,
        }
    }

    #[test]
    fn first_match_wins_and_all_conditions_must_hold() {
        let mut hm = http::HeaderMap::new();
        hm.insert("x-tenant", "batch".parse().unwrap());
        let routes = vec![
            route(
                "batch-chat",
                RouteMatch {
                    path_prefix: Some("/v1/chat".into()),
                    headers: [("x-tenant".to_string(), "batch".to_string())].into(),
                    ..Default::default()
                },
            ),
            route("small", RouteMatch { model: Some("smol".into()), ..Default::default() }),
            route("rest", RouteMatch::default()),
        ];
        let pick = |path, model, h: &http::HeaderMap| {
            select(&routes, path, model, h).map(|i| routes[i].name.as_str())
        };
        let none = http::HeaderMap::new();
        assert_eq!(pick("/v1/chat/completions", Some("smol"), &hm), Some("batch-chat"));
        assert_eq!(pick("/v1/chat/completions", Some("smol"), &none), Some("small"));
        assert_eq!(pick("/v1/completions", Some("big"), &hm), Some("rest"));
        assert_eq!(select(&routes[..2], "/v1/completions", None, &none), None);
    }
}
