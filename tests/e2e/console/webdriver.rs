//! A minimal W3C WebDriver client over `reqwest` (the protocol is JSON over HTTP), driving
//! Debian's headless Chromium through `chromedriver`: enough to fill forms, click, read the
//! DOM and take screenshots. No new dependency: the suite already links reqwest.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine;
use portcullis_testkit::ports::free_port;
use portcullis_testkit::process::{wait_for_tcp, ChildGuard, READY_ATTEMPTS};
use serde_json::{json, Value};

/// The W3C element reference key.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";
/// Polls of [`Browser::wait_until`] (every 100 ms, 15 s in all).
const WAIT_POLLS: u32 = 150;
const WAIT_EVERY: Duration = Duration::from_millis(100);

/// Debian's package paths (`apt-get install chromium chromium-driver`).
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A browser session; chromedriver (and with it Chromium) is killed by PID on drop.
pub struct Browser {
    http: reqwest::Client,
    base: String,
    /// chromedriver's address and the session path, for the blocking close in `drop`.
    driver_addr: std::net::SocketAddr,
    session_path: String,
    _driver: ChildGuard,
    _profile: tempfile::TempDir,
}

/// One element found in the page.
pub struct Element(String);

impl Browser {
    /// Starts chromedriver on a free loopback port and opens a headless session. Panics with
    /// a clear message when Chromium is not installed: `scripts/test.sh` installs it, and a
    /// missing browser must fail the suite, not skip the test.
    pub async fn start() -> Self {
        for path in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                Path::new(path).exists(),
                "{path} is missing: the console's browser test needs Debian's Chromium \
                 (`apt-get install -y chromium chromium-driver`; scripts/test.sh does this)"
            );
        }
        let port = free_port();
        let mut command = Command::new(CHROMEDRIVER);
        command
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let driver = ChildGuard::spawn("chromedriver", command).expect("start chromedriver");
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        assert!(
            wait_for_tcp(addr, READY_ATTEMPTS).await,
            "chromedriver did not listen on {addr}"
        );
        let profile = tempfile::tempdir().expect("browser profile dir");
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("webdriver client");
        let base = format!("http://{addr}");
        let args = [
            "--headless".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-quic".to_owned(),
            "--no-first-run".to_owned(),
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-sync".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            "--window-size=1280,900".to_owned(),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": CHROMIUM, "args": args },
        } } });
        let response: Value = http
            .post(format!("{base}/session"))
            .json(&capabilities)
            .send()
            .await
            .expect("new webdriver session")
            .json()
            .await
            .expect("session JSON");
        let session = response["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("chromedriver refused the session: {response}"))
            .to_owned();
        Self {
            http,
            base: format!("{base}/session/{session}"),
            driver_addr: addr,
            session_path: format!("/session/{session}"),
            _driver: driver,
            _profile: profile,
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response: Value = request
            .send()
            .await
            .expect("webdriver call")
            .json()
            .await
            .expect("webdriver JSON");
        if let Some(error) = response["value"].get("error") {
            panic!(
                "webdriver {path}: {error}: {}",
                response["value"]["message"]
            );
        }
        response["value"].clone()
    }

    /// Navigates to `url`.
    pub async fn goto(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    /// Runs `script` (a function body; `arguments` are `args`) and returns its value.
    pub async fn eval(&self, script: &str, args: Value) -> Value {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({ "script": script, "args": args })),
        )
        .await
    }

    /// The first element matching `css`, waiting for it to exist and be shown.
    pub async fn find(&self, css: &str) -> Element {
        let script = "const e = document.querySelector(arguments[0]); return !!e && e.offsetParent !== null;";
        self.wait_until(&format!("{css} shown"), script, json!([css]))
            .await;
        let value = self
            .call(
                reqwest::Method::POST,
                "/element",
                Some(json!({ "using": "css selector", "value": css })),
            )
            .await;
        match value[ELEMENT].as_str() {
            Some(id) => Element(id.to_owned()),
            None => panic!("no element reference for {css}: {value}"),
        }
    }

    /// Replaces the text of the input matching `css`.
    pub async fn fill(&self, css: &str, text: &str) {
        let element = self.find(css).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{}/clear", element.0),
            Some(json!({})),
        )
        .await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{}/value", element.0),
            Some(json!({ "text": text })),
        )
        .await;
    }

    /// Clicks the element matching `css`.
    pub async fn click(&self, css: &str) {
        let element = self.find(css).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{}/click", element.0),
            Some(json!({})),
        )
        .await;
    }

    /// The visible text of the element matching `css`.
    pub async fn text(&self, css: &str) -> String {
        let element = self.find(css).await;
        let value = self
            .call(
                reqwest::Method::GET,
                &format!("/element/{}/text", element.0),
                None,
            )
            .await;
        value.as_str().unwrap_or_default().to_owned()
    }

    /// Polls `script` (bounded) until it returns something truthy; returns that value.
    /// Panics naming `what` and the last value otherwise.
    pub async fn wait_until(&self, what: &str, script: &str, args: Value) -> Value {
        let mut last = Value::Null;
        for _ in 0..WAIT_POLLS {
            last = self.eval(script, args.clone()).await;
            let truthy = match &last {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return last;
            }
            tokio::time::sleep(WAIT_EVERY).await;
        }
        let page = self
            .eval("return document.body.innerText.slice(0, 2000);", json!([]))
            .await;
        panic!("waited in vain for {what} (last: {last}); page text:\n{page}");
    }

    /// A PNG of the viewport, written to `path`.
    pub async fn screenshot(&self, path: &Path) {
        let value = self.call(reqwest::Method::GET, "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(value.as_str().expect("base64 screenshot"))
            .expect("screenshot decodes");
        std::fs::write(path, png).expect("write screenshot");
    }
}

impl Drop for Browser {
    /// Ends the session (chromedriver then stops Chromium) before the guard kills
    /// chromedriver by PID, so no browser outlives the test, even one that panicked. Blocking
    /// and bounded: `drop` cannot await.
    fn drop(&mut self) {
        use std::io::{Read, Write};
        let Ok(mut stream) =
            std::net::TcpStream::connect_timeout(&self.driver_addr, Duration::from_secs(2))
        else {
            return;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        let request = format!(
            "DELETE {} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.session_path, self.driver_addr
        );
        if stream.write_all(request.as_bytes()).is_ok() {
            let mut answer = Vec::new();
            let _ = stream.take(1 << 16).read_to_end(&mut answer);
        }
    }
}
