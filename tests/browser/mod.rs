//! A minimal W3C WebDriver client over HTTP for Debian's `chromedriver` driving headless
//! `chromium` (both installed by `scripts/bootstrap.sh --browser`). The driver runs in its own
//! process group, which is killed (browser included) when the `Browser` is dropped.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};

pub struct Browser {
    base: String,
    session: String,
    port: u16,
    driver: Child,
    http: reqwest::Client,
}

fn find(bin: &str) -> Option<String> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| format!("{d}/{bin}"))
        .find(|p| std::path::Path::new(p).exists())
}

impl Browser {
    /// Start chromedriver on a free port and open a headless chromium session.
    pub async fn start(width: u32, height: u32) -> Browser {
        let driver_bin = find("chromedriver").unwrap_or_else(|| {
            panic!("chromedriver not found: run scripts/test.sh (bootstrap --browser installs Debian's chromium and chromium-driver)")
        });
        let chromium = find("chromium").expect("chromium next to chromedriver");
        let port = crate::common::free_port();
        let driver = Command::new(driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("start chromedriver");
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("client");
        let mut b = Browser {
            base,
            session: String::new(),
            port,
            driver,
            http,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = b.http.get(format!("{}/status", b.base)).send().await;
            if let Ok(r) = ready {
                let v: Value = r.json().await.unwrap_or_default();
                if v["value"]["ready"] == true {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not become ready"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--no-first-run", "--hide-scrollbars", format!("--window-size={width},{height}")],
            }
        }}});
        let v = b.call("POST", "/session", Some(caps)).await;
        b.session = v["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("new session: {v}"))
            .to_string();
        b
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        match self.try_call(method, path, body).await {
            Ok(v) => v,
            Err(e) => panic!("webdriver {method} {path}: {e}"),
        }
    }

    /// One WebDriver command; `Err` carries the driver's error value.
    async fn try_call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, Value> {
        let url = format!("{}{path}", self.base);
        let req = match method {
            "GET" => self.http.get(url),
            "DELETE" => self.http.delete(url),
            _ => self.http.post(url).json(&body.unwrap_or(json!({}))),
        };
        let r = req.send().await.expect("webdriver request");
        let v: Value = r.json().await.expect("webdriver JSON");
        if v["value"]["error"].is_string() {
            return Err(v["value"].clone());
        }
        Ok(v["value"].clone())
    }

    /// Run `action` on the element matching `css`, finding it again when the page re-rendered
    /// it between the find and the action (WebDriver's "stale element reference").
    async fn on_element(&self, css: &str, action: &str, body: Option<Value>) {
        for _ in 0..10 {
            let id = self.find(css).await;
            let path = self.at(&format!("/element/{id}/{action}"));
            match self.try_call("POST", &path, body.clone()).await {
                Ok(_) => return,
                Err(e) if e["error"] == "stale element reference" => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("webdriver {action} on {css}: {e}"),
            }
        }
        panic!("webdriver {action} on {css}: the element went stale 10 times");
    }

    fn at(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    pub async fn goto(&self, url: &str) {
        self.call("POST", &self.at("/url"), Some(json!({ "url": url })))
            .await;
    }

    /// Run `script` (a function body; `arguments` available) in the page, returning its value.
    pub async fn eval(&self, script: &str) -> Value {
        let body = json!({ "script": script, "args": [] });
        self.call("POST", &self.at("/execute/sync"), Some(body))
            .await
    }

    /// Poll `script` until it returns a truthy value (within 15 s); returns that value.
    pub async fn wait_for(&self, what: &str, script: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let v = self.eval(script).await;
            if !(v.is_null() || v == false || v == 0 || v == "") {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "page: timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The element matching `css` (the first).
    pub async fn find(&self, css: &str) -> String {
        let body = json!({ "using": "css selector", "value": css });
        let v = self.call("POST", &self.at("/element"), Some(body)).await;
        v.as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no element {css}: {v}"))
            .to_string()
    }

    /// Click the element matching `css`, as a user would.
    pub async fn click(&self, css: &str) {
        self.on_element(css, "click", None).await;
    }

    /// Type `text` into the element matching `css`.
    pub async fn type_into(&self, css: &str, text: &str) {
        self.on_element(css, "value", Some(json!({ "text": text })))
            .await;
    }

    /// A PNG screenshot of the viewport, written to `path`.
    pub async fn screenshot(&self, path: &std::path::Path) {
        let v = self.call("GET", &self.at("/screenshot"), None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().expect("base64 screenshot"))
            .expect("screenshot base64");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("screenshot dir");
        }
        std::fs::write(path, png).expect("write screenshot");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // End the session (closes chromium) with a plain blocking request, then the driver's
        // whole process group, whatever is left of it.
        if !self.session.is_empty() {
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let req = format!(
                    "DELETE /session/{} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    self.session
                );
                let _ = s.write_all(req.as_bytes());
                let _ = s.read_to_end(&mut Vec::new());
            }
        }
        let pgid = format!("-{}", self.driver.id());
        let _ = Command::new("kill").args(["-TERM", "--", &pgid]).status();
        let _ = self.driver.wait();
    }
}
