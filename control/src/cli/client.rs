//! The admin API over HTTP: one authenticated JSON call, a refusal turned into an
//! [`AdminCliError`] with the problem's detail.

use std::time::Duration;

use serde_json::Value;

use super::output::text;
use super::AdminCliError;

/// Each request's time limit.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The admin API of one listener, with the token (and actor) every call sends.
pub(super) struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
    actor: Option<String>,
}

impl Client {
    /// A client for the admin listener at `url` (a trailing `/` is ignored; no proxy).
    pub(super) fn new(
        url: &str,
        token: String,
        actor: Option<String>,
    ) -> Result<Self, AdminCliError> {
        Ok(Self {
            http: reqwest::Client::builder()
                .no_proxy()
                .build()
                .map_err(|source| AdminCliError::Http {
                    url: url.to_owned(),
                    source,
                })?,
            base: url.trim_end_matches('/').to_owned(),
            token,
            actor,
        })
    }

    /// Sends `body` (if any) to `path` under the admin API's base: the JSON reply, or the
    /// transport failure or the API's refusal.
    pub(super) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, AdminCliError> {
        let url = format!("{}{}{path}", self.base, crate::admin::BASE);
        let mut request = self
            .http
            .request(method, &url)
            .bearer_auth(&self.token)
            .timeout(REQUEST_TIMEOUT);
        if let Some(actor) = &self.actor {
            request = request.header("x-admin-actor", actor);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let http_err = |source| AdminCliError::Http {
            url: self.base.clone(),
            source,
        };
        let response = request.send().await.map_err(http_err)?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(http_err)?;
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(value);
        }
        let mut detail = value["detail"]
            .as_str()
            .unwrap_or_else(|| status.canonical_reason().unwrap_or("error"))
            .to_owned();
        for error in value["errors"].as_array().into_iter().flatten() {
            detail.push_str(&format!(
                "\n  {}: {}",
                text(&error["field"]),
                text(&error["reason"])
            ));
        }
        Err(AdminCliError::Api {
            status: status.as_u16(),
            detail,
        })
    }
}

/// Percent-encodes a path segment or query value (ids are `[A-Za-z0-9._-]`, but a typo
/// must not turn into a different path).
pub(super) fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
