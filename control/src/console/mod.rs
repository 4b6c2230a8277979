//! The admin console: a small browser UI served by the admin listener at `/console`, over
//! the documented admin API only (`/admin/v1/…`, the same bearer token).
//!
//! Three hand-written files, embedded in the binary with `include_str!`: no build step, no
//! framework, no CDN, so it works offline and the binary is the whole deployment. The page
//! keeps the token in `sessionStorage` (gone with the tab) and sends it as
//! `Authorization: Bearer`; it is never put in a URL or a cookie. Every response here carries
//! a strict Content-Security-Policy (no inline script or style, nothing from elsewhere, no
//! framing), `X-Content-Type-Options: nosniff` and `Referrer-Policy: no-referrer`.
//!
//! The assets are served without the token (they hold no data; the login form is one of
//! them); everything they show comes from the API, which requires it.

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{header, HeaderName, HeaderValue, Response};

/// Where the console is served.
pub(crate) const PATH: &str = "/console";

/// The policy of every console response: the page may load its own script, style and
/// `data:` images, and talk to its own origin; nothing else, never framed.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// The console's routes (GET and HEAD; axum answers HEAD from GET).
pub fn router() -> Router {
    Router::new()
        .route(
            PATH,
            get(|| async { asset(INDEX_HTML, "text/html; charset=utf-8") }),
        )
        .route(
            &format!("{PATH}/"),
            get(|| async { asset(INDEX_HTML, "text/html; charset=utf-8") }),
        )
        .route(
            &format!("{PATH}/app.js"),
            get(|| async { asset(APP_JS, "text/javascript; charset=utf-8") }),
        )
        .route(
            &format!("{PATH}/app.css"),
            get(|| async { asset(APP_CSS, "text/css; charset=utf-8") }),
        )
        .route(&format!("{PATH}/{{*rest}}"), get(not_found))
}

fn asset(body: &'static str, content_type: &'static str) -> Response<Body> {
    with_headers(
        Response::new(Body::from(body)),
        HeaderValue::from_static(content_type),
    )
}

/// An unknown path under `/console/`: the admin API's own 404 problem, with the console's
/// headers.
async fn not_found() -> Response<Body> {
    let response = crate::admin::not_found("no such console asset; the console is at /console");
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .cloned()
        .unwrap_or(HeaderValue::from_static("application/problem+json"));
    with_headers(response, content_type)
}

/// The security headers of every console response.
fn with_headers(mut response: Response<Body>, content_type: HeaderValue) -> Response<Body> {
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, content_type);
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        HeaderName::from_static("cross-origin-opener-policy"),
        HeaderValue::from_static("same-origin"),
    );
    // Assets change with the binary; a stale cached script against a newer API is worse
    // than re-fetching 30 kB from the admin listener.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn get(path: &str) -> Response<Body> {
        router()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn every_asset_carries_the_security_headers() {
        for (path, status, kind) in [
            ("/console", 200, "text/html"),
            ("/console/app.js", 200, "text/javascript"),
            ("/console/app.css", 200, "text/css"),
            ("/console/nope.js", 404, "application/problem+json"),
        ] {
            let response = get(path).await;
            assert_eq!(response.status(), status, "{path}");
            let h = response.headers();
            assert!(h[header::CONTENT_TYPE].to_str().unwrap().starts_with(kind));
            assert_eq!(h[header::CONTENT_SECURITY_POLICY], CONTENT_SECURITY_POLICY);
            assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
            assert_eq!(h[header::REFERRER_POLICY], "no-referrer");
        }
    }

    #[tokio::test]
    async fn the_page_has_no_inline_script_or_style_and_nothing_from_elsewhere() {
        let body = get("/console").await.into_body().collect().await.unwrap();
        let html = String::from_utf8(body.to_bytes().to_vec()).unwrap();
        // Every <script> has a src; no style attribute or element; no absolute URL.
        assert_eq!(html.matches("<script").count(), 1);
        assert!(html.contains(r#"<script type="module" src="/console/app.js"></script>"#));
        for forbidden in [
            "<style",
            "style=",
            "http://",
            "https://",
            "onclick=",
            "onload=",
            "onsubmit=",
            "onerror=",
            "javascript:",
        ] {
            assert!(
                !html.contains(forbidden),
                "index.html contains {forbidden:?}"
            );
        }
        // The SVG namespace is a name, not a fetch.
        let js = APP_JS.replace("\"http://www.w3.org/2000/svg\"", "");
        for text in [js.as_str(), APP_CSS] {
            assert!(!text.contains("http://") && !text.contains("https://"));
        }
        // The token never goes into a URL or a cookie.
        assert!(!APP_JS.contains("document.cookie"));
        assert!(!APP_JS.contains("localStorage"));
    }
}
