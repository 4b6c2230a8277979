//! CORS at the edge, for routes with `cors` (docs/routing.md, "CORS"), as Envoy's cors
//! filter and Kong's cors plugin do:
//!
//! - a **preflight** (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) to such a
//!   route is answered here, `204`, before the caller is resolved: it never reaches the
//!   upstream and is charged to no one. An allowed origin, method and header list get the
//!   `Access-Control-Allow-*` fields; anything else gets none, and the browser refuses;
//! - an **actual request** from an allowed origin gets `Access-Control-Allow-Origin` (and
//!   `-Credentials`, `-Expose-Headers`) on whatever answers it, the gateway's own 401, 429
//!   and 503 included, so a page can read its rate-limit guidance. Other origins get none.
//!
//! Every answer to a request with `Origin` on such a route carries `Vary: Origin`.

use std::sync::Arc;

use axum::body::Body;
use http::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE,
    ACCESS_CONTROL_REQUEST_HEADERS, ACCESS_CONTROL_REQUEST_METHOD, ORIGIN, VARY,
};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};

use crate::config::CorsSettings;
use crate::plumbing::step::Finish;

const VARY_PREFLIGHT: HeaderValue = HeaderValue::from_static(
    "Origin, Access-Control-Request-Method, Access-Control-Request-Headers",
);
const ANY: HeaderValue = HeaderValue::from_static("*");
const TRUE: HeaderValue = HeaderValue::from_static("true");

/// The method a preflight asks about, when `request` is one.
pub(crate) fn preflight_method<B>(request: &Request<B>) -> Option<Method> {
    if request.method() != Method::OPTIONS || !request.headers().contains_key(ORIGIN) {
        return None;
    }
    let requested = request.headers().get(ACCESS_CONTROL_REQUEST_METHOD)?;
    Method::from_bytes(requested.as_bytes()).ok()
}

/// The answer to a preflight for `method` on a route with `cors`.
pub(crate) fn answer_preflight(
    cors: &CorsSettings,
    headers: &HeaderMap,
    method: &Method,
) -> Response<Body> {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::NO_CONTENT;
    let fields = response.headers_mut();
    fields.insert(VARY, VARY_PREFLIGHT);
    let Some(origin) = headers
        .get(ORIGIN)
        .filter(|o| cors.allows_origin(o.as_bytes()))
    else {
        return response;
    };
    let method_ok = cors.methods.contains(method);
    let headers_ok = headers
        .get_all(ACCESS_CONTROL_REQUEST_HEADERS)
        .iter()
        .flat_map(|value| value.to_str().unwrap_or("\u{0}").split(','))
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .all(|name| {
            cors.headers
                .iter()
                .any(|allowed| allowed.as_str().eq_ignore_ascii_case(name))
        });
    if !(method_ok && headers_ok) {
        return response;
    }
    allow_origin(fields, cors, origin);
    fields.insert(ACCESS_CONTROL_ALLOW_METHODS, cors.methods_value.clone());
    if !cors.headers_value.is_empty() {
        fields.insert(ACCESS_CONTROL_ALLOW_HEADERS, cors.headers_value.clone());
    }
    fields.insert(ACCESS_CONTROL_MAX_AGE, cors.max_age.clone());
    response
}

/// What an actual request from a browser page adds to its answer.
#[derive(Debug, Default)]
pub(crate) struct CorsAnswer(Option<(Arc<CorsSettings>, HeaderValue)>);

impl CorsAnswer {
    /// For a request to a route with `cors` (`None` otherwise).
    pub(crate) fn of<B>(request: &Request<B>, cors: Option<&Arc<CorsSettings>>) -> Self {
        // Looked up only on routes with `cors`.
        Self(cors.and_then(|cors| {
            let origin = request.headers().get(ORIGIN)?;
            Some((cors.clone(), origin.clone()))
        }))
    }
}

impl Finish for CorsAnswer {
    fn finish(self, mut response: Response<Body>) -> Response<Body> {
        let Some((cors, origin)) = self.0 else {
            return response;
        };
        let fields = response.headers_mut();
        // The route's `cors` decides, not the upstream.
        for name in [
            ACCESS_CONTROL_ALLOW_ORIGIN,
            ACCESS_CONTROL_ALLOW_CREDENTIALS,
            ACCESS_CONTROL_EXPOSE_HEADERS,
        ] {
            fields.remove(name);
        }
        fields.append(VARY, HeaderValue::from_static("Origin"));
        if cors.allows_origin(origin.as_bytes()) {
            allow_origin(fields, &cors, &origin);
            if let Some(expose) = &cors.expose_value {
                fields.insert(ACCESS_CONTROL_EXPOSE_HEADERS, expose.clone());
            }
        }
        response
    }
}

fn allow_origin(fields: &mut HeaderMap, cors: &CorsSettings, origin: &HeaderValue) {
    if cors.any_origin() {
        fields.insert(ACCESS_CONTROL_ALLOW_ORIGIN, ANY);
    } else {
        fields.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    }
    if cors.credentials {
        fields.insert(ACCESS_CONTROL_ALLOW_CREDENTIALS, TRUE);
    }
}
