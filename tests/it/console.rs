//! The operators' console in a real browser: Debian's `chromium`, headless,
//! driven over WebDriver's HTTP protocol by `chromedriver`, against a real
//! `toolgate serve`. An operator signs in, resolves the UNCERTAIN row a
//! `kill -9` left, approves a held call and sees it complete; wrong tokens
//! and forged posts are refused with nothing changed; hostile strings stay
//! text. Each test leaves screenshots in a temporary folder it names on
//! stderr (`TOOLGATE_CONSOLE_SCREENSHOTS` keeps them in a folder of one's
//! choosing).

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

use crate::serve::{Served, StartNode, TENANT, http, json_of, sha256};
use crate::support::free_port;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// What WebDriver names an element reference by.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";
/// A string that would run script if it were markup.
const HOSTILE: &str = "\"><img src=x onerror=alert(1)><script>alert(2)</script>";

/// Whether the browser is installed. Missing, a test skips, except under
/// `CI=true`, where it fails: `.ci/run` installs both.
pub fn browser_installed() -> bool {
    let found =
        std::path::Path::new(CHROMIUM).is_file() && std::path::Path::new(CHROMEDRIVER).is_file();
    if !found {
        assert!(
            !std::env::var("CI").is_ok_and(|ci| ci == "true"),
            "chromium and chromium-driver are not installed: .ci/run installs them"
        );
        eprintln!("chromium or chromedriver is not installed: skipped here");
    }
    found
}

/// One HTTP/1.1 exchange on 127.0.0.1:`port`: (status, head, body).
pub fn exchange(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connects");
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    // chromedriver refuses a Host that is not loopback.
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let _ = stream.write_all(body);
    // chromedriver keeps the connection open whatever the request asks:
    // the body is read to its length, not to the connection's end.
    let mut response = Vec::new();
    let mut buffer = [0u8; 16 << 10];
    let split = loop {
        if let Some(split) = response.windows(4).position(|w| w == b"\r\n\r\n") {
            break split;
        }
        let read = stream.read(&mut buffer).unwrap();
        assert!(read > 0, "the response ended in its head");
        response.extend_from_slice(&buffer[..read]);
    };
    let head = String::from_utf8_lossy(&response[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("a status");
    let length = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())
            .flatten()
    });
    let mut body = response.split_off(split + 4);
    match length {
        Some(length) => {
            while body.len() < length {
                let read = stream.read(&mut buffer).unwrap();
                assert!(read > 0, "the response ended in its body");
                body.extend_from_slice(&buffer[..read]);
            }
        }
        None => {
            let _ = stream.read_to_end(&mut body);
        }
    }
    (status, head, body)
}

/// Decodes standard base64 (a screenshot's PNG).
fn base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let symbols: Vec<u8> = text.bytes().filter(|c| *c != b'=').map(value).collect();
    let mut out = Vec::with_capacity(symbols.len() * 3 / 4);
    for chunk in symbols.chunks(4) {
        let bits = chunk.iter().enumerate().fold(0u32, |acc, (index, symbol)| {
            acc | (u32::from(*symbol) << (18 - 6 * index))
        });
        out.extend_from_slice(&bits.to_be_bytes()[1..chunk.len()]);
    }
    out
}

/// A WebDriver session on a headless chromium.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    shots: PathBuf,
    /// Holds the screenshots' folder when none was named.
    _folder: Option<tempfile::TempDir>,
}

impl Browser {
    pub fn start() -> Browser {
        let port = free_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "no chromedriver"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1400,1000"]}}}});
        let (status, _, body) = exchange(
            port,
            "POST",
            "/session",
            &[("Content-Type", "application/json")],
            capabilities.to_string().as_bytes(),
        );
        let answer = json_of(&body);
        assert_eq!(status, 200, "{answer}");
        let (shots, folder) = match std::env::var_os("TOOLGATE_CONSOLE_SCREENSHOTS") {
            Some(folder) => {
                std::fs::create_dir_all(&folder).unwrap();
                (PathBuf::from(folder), None)
            }
            None => {
                let folder = tempfile::Builder::new()
                    .prefix("toolgate-console-")
                    .tempdir()
                    .unwrap();
                (folder.path().to_path_buf(), Some(folder))
            }
        };
        eprintln!("screenshots in {}", shots.display());
        Browser {
            driver,
            port,
            session: answer["value"]["sessionId"].as_str().unwrap().to_owned(),
            shots,
            _folder: folder,
        }
    }

    /// One WebDriver command: its `value`, or the error it answered.
    fn command(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, Value> {
        let body = body.map(|body| body.to_string()).unwrap_or_default();
        let (status, _, answer) = exchange(
            self.port,
            method,
            &format!("/session/{}{path}", self.session),
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        );
        let answer = json_of(&answer);
        if status == 200 {
            Ok(answer["value"].clone())
        } else {
            Err(answer["value"].clone())
        }
    }

    fn must(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.command(method, path, body)
            .unwrap_or_else(|error| panic!("{method} {path}: {error}"))
    }

    pub fn open(&self, url: &str) {
        self.must("POST", "/url", Some(json!({"url": url})));
    }

    fn url(&self) -> String {
        self.must("GET", "/url", None).as_str().unwrap().to_owned()
    }

    /// Waits until the page's URL ends with `suffix`: a click returns
    /// before the navigation it starts has finished.
    pub fn wait_for(&self, suffix: &str) {
        let started = Instant::now();
        while !self.url().ends_with(suffix) {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "still at {}, not …{suffix}",
                self.url()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn find(&self, css: &str) -> String {
        let element = self.must(
            "POST",
            "/element",
            Some(json!({"using": "css selector", "value": css})),
        );
        element[ELEMENT].as_str().unwrap().to_owned()
    }

    fn count(&self, css: &str) -> usize {
        self.must(
            "POST",
            "/elements",
            Some(json!({"using": "css selector", "value": css})),
        )
        .as_array()
        .unwrap()
        .len()
    }

    pub fn type_into(&self, css: &str, text: &str) {
        let element = self.find(css);
        self.must(
            "POST",
            &format!("/element/{element}/value"),
            Some(json!({"text": text})),
        );
    }

    pub fn click(&self, css: &str) {
        let element = self.find(css);
        self.must(
            "POST",
            &format!("/element/{element}/click"),
            Some(json!({})),
        );
    }

    /// Waits until the page's text holds `needle`.
    pub fn wait_for_text(&self, needle: &str) {
        let started = Instant::now();
        while !self.text().contains(needle) {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "no {needle:?} in {}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The page's visible text; asked again while a navigation replaces
    /// the page under the question (a stale element).
    pub fn text(&self) -> String {
        let started = Instant::now();
        loop {
            let text = self
                .command(
                    "POST",
                    "/element",
                    Some(json!({"using": "css selector", "value": "body"})),
                )
                .and_then(|body| {
                    let body = body[ELEMENT].as_str().unwrap_or_default().to_owned();
                    self.command("GET", &format!("/element/{body}/text"), None)
                });
            match text {
                Ok(text) => return text.as_str().unwrap_or_default().to_owned(),
                Err(error) => assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "no page text: {error}"
                ),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs `script` in the page (WebDriver's own evaluation, which the
    /// page's CSP does not govern), for what the test asserts.
    fn script(&self, script: &str) -> Value {
        self.must(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
    }

    /// The window's width, as an operator's laptop has it.
    fn resize(&self, width: u32) {
        self.must(
            "POST",
            "/window/rect",
            Some(json!({"width": width, "height": 900})),
        );
    }

    /// Whether the page fits the window's width: nothing scrolls sideways.
    fn fits(&self) -> bool {
        self.script("return document.documentElement.scrollWidth <= window.innerWidth")
            == json!(true)
    }

    /// An element's attribute (or text, for `textContent`).
    fn attribute(&self, css: &str, name: &str) -> Value {
        self.script(&format!(
            "const e = document.querySelector({css}); return e && (e.getAttribute({name}) ?? e[{name}]);",
            css = json!(css),
            name = json!(name),
        ))
    }

    /// Whether an alert is open (a script ran).
    fn alert_open(&self) -> bool {
        self.command("GET", "/alert/text", None).is_ok()
    }

    /// The console cookie the browser holds.
    fn cookie(&self) -> String {
        let cookie = self.must("GET", "/cookie/toolgate_console", None);
        assert_eq!(cookie["httpOnly"], true, "{cookie}");
        assert_eq!(cookie["sameSite"], "Strict", "{cookie}");
        cookie["value"].as_str().unwrap().to_owned()
    }

    pub fn screenshot(&self, name: &str) {
        let png = self.must("GET", "/screenshot", None);
        let bytes = base64(png.as_str().unwrap());
        assert!(bytes.starts_with(b"\x89PNG"), "a PNG");
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, bytes).unwrap();
        eprintln!("screenshot {}", path.display());
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.command("DELETE", "", None);
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// A sidecar with the console on loopback, its writes server as the
/// recovery tests have it, and an operator whose token is returned.
struct Console {
    served: Served,
    port: u16,
    token: String,
}

impl Console {
    fn start() -> Console {
        Console::start_with("")
    }

    /// With `extra` whole tables beside the console's.
    fn start_with(extra: &str) -> Console {
        Console::start_on(Served::here(), extra)
    }

    /// As [`Console::start`], its node a `toolgate serve` process.
    fn start_in_a_process() -> Console {
        Console::start_on(Served::process(), "")
    }

    fn start_on(start: StartNode, extra: &str) -> Console {
        let port = free_port();
        let token = format!("tgo_{}", Uuid::new_v4().simple());
        let console = format!(
            "\n[console]\nlisten = \"127.0.0.1:{port}\"\n\
             operators = [{{ name = \"ana\", sha256 = \"{}\" }}]\n",
            sha256(&token)
        );
        let served = start.start_configured(&format!("{console}\n{extra}"));
        Console {
            served,
            port,
            token,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn sign_in(&self, browser: &Browser) {
        browser.open(&self.url("/sign-in"));
        browser.type_into("#token", &self.token);
        browser.click("#sign-in");
        browser.wait_for("/review");
        assert!(browser.text().contains("ana"), "{}", browser.text());
    }

    /// The control API's JSON at `path`.
    fn control(&self, path: &str) -> Value {
        let (status, body) = self.served.get(path);
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        json_of(&body)
    }
}

/// Holds a `demo.external_write` of `line` for approval: its approval and
/// the call's batch, to submit again once decided.
fn held_call(served: &Served, line: &str) -> (String, Value) {
    let session = served.session();
    let batch = json!({"session_id": session, "run_id": Uuid::new_v4(), "step_number": 1,
                       "origin_trust": "user",
                       "calls": [{"call_id": "held", "name": "demo.external_write",
                                  "arguments": {"line": line}}]});
    let (status, body) = served.post("/v1/calls", &batch);
    assert_eq!(status, 200, "{body}");
    let approval = body["results"][0]["pending"]["approval_id"]
        .as_str()
        .unwrap_or_else(|| panic!("held: {body}"))
        .to_owned();
    (approval, batch)
}

/// A `kill -9` while an MCP write is in flight leaves an UNCERTAIN row; the
/// operator signs in, finds it in the review queue with its arguments and
/// watermark, resolves it as not applied with a note, and the resolution is
/// recorded (the control API lists it resolved, by the operator).
#[test]
fn an_operator_signs_in_and_resolves_the_uncertain_row_a_kill_left() {
    if !browser_installed() {
        return;
    }
    let mut console = Console::start_in_a_process();
    let served = &mut console.served;
    let session = served.session();
    let run = Uuid::new_v4();
    let socket = served.socket.clone();
    let body = json!({"session_id": session, "run_id": run, "step_number": 1,
                      "origin_trust": "user",
                      "calls": [{"call_id": "write", "name": "mcp.writes.sleep",
                                 "arguments": {"seconds": 30.0}}]});
    let caller = std::thread::spawn(move || {
        // The answer never comes: the process is killed under it.
        let body = body.to_string();
        let mut stream = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        let _ = write!(
            stream,
            "POST /v1/calls HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.read_to_end(&mut Vec::new());
    });
    let started = Instant::now();
    loop {
        let (_, rows) = served.get(&format!("/v1/runs/{run}/invocations?tenant_id={TENANT}"));
        if json_of(&rows)["invocations"][0]["status"] == "running" {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    served.kill();
    let _ = caller.join();
    served.start_again();
    // Recovery makes the watermarked write UNCERTAIN as the node starts.
    let started = Instant::now();
    let invocation = loop {
        let pending = console.control(&format!("/v1/review?status=pending&tenant_id={TENANT}"));
        if let Some(item) = pending["uncertain"]
            .as_array()
            .and_then(|items| items.first())
        {
            break item["invocation_id"]
                .as_str()
                .unwrap_or_else(|| panic!("{item}"))
                .to_owned();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no review item: {pending}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };

    let browser = Browser::start();
    console.sign_in(&browser);
    browser.screenshot("1-review-queue-uncertain-row");
    let row = format!("tr.review-item[data-invocation=\"{invocation}\"]");
    assert_eq!(browser.count(&row), 1, "{}", browser.text());
    let text = browser.text();
    assert!(text.contains("mcp.writes.sleep"), "{text}");
    assert!(text.contains("\"seconds\": 30"), "{text}");
    browser.click(&format!("{row} input[value=effect_not_applied]"));
    browser.type_into(
        &format!("{row} textarea[name=note]"),
        "checked the remote: no effect",
    );
    browser.click(&format!("{row} button[type=submit]"));
    browser.wait_for(&format!("/review?status=resolved&resolved={invocation}"));
    assert_eq!(
        browser.attribute(
            &format!("#confirmation span.id[title=\"{invocation}\"]"),
            "title"
        ),
        json!(invocation)
    );
    assert_eq!(
        browser.attribute("#review-count", "textContent"),
        json!("0")
    );
    let text = browser.text();
    assert!(text.contains("effect_not_applied"), "{text}");
    assert!(text.contains("checked the remote: no effect"), "{text}");
    browser.screenshot("2-review-resolved");

    let resolved = console.control(&format!("/v1/review?status=resolved&tenant_id={TENANT}"));
    let resolved = resolved.to_string();
    assert!(resolved.contains(&invocation), "{resolved}");
    assert!(resolved.contains("effect_not_applied"), "{resolved}");
    assert!(resolved.contains("\"ana\""), "{resolved}");
    let pending = console.control(&format!("/v1/review?status=pending&tenant_id={TENANT}"));
    assert!(!pending.to_string().contains(&invocation), "{pending}");

    // The row's story: its events include the resolution.
    browser.open(&console.url(&format!("/invocations/{invocation}")));
    let text = browser.text();
    assert!(text.contains("uncertain"), "{text}");
    browser.screenshot("3-invocation-story");
}

/// A held call's approval shows the arguments it would allow (hostile
/// ones as text: no element injected, no script run); the operator
/// approves it, and the call submitted again completes — the write is
/// made once, and the story shows it succeeded, approved by the operator.
#[test]
fn an_operator_approves_a_held_call_and_sees_it_complete() {
    if !browser_installed() {
        return;
    }
    let console = Console::start();
    let (approval, batch) = held_call(&console.served, HOSTILE);
    let browser = Browser::start();
    console.sign_in(&browser);
    browser.open(&console.url("/approvals"));
    let row = format!("tr.approval[data-approval=\"{approval}\"]");
    assert_eq!(browser.count(&row), 1, "{}", browser.text());
    // The hostile argument is on the page as text, and made no element.
    assert!(browser.text().contains(HOSTILE), "{}", browser.text());
    assert_eq!(browser.count("img"), 0);
    assert_eq!(browser.count("main script"), 0);
    assert_eq!(
        browser.script("return document.querySelectorAll('img[src=x]').length"),
        json!(0)
    );
    assert!(!browser.alert_open(), "a script ran");
    browser.screenshot("4-approval-pending-hostile-arguments");
    // The navigation counts what waits.
    assert_eq!(
        browser.attribute("#approvals-count", "textContent"),
        json!("1")
    );
    assert_eq!(
        browser.attribute("#approvals-count", "class"),
        json!("count waiting")
    );
    browser.click(&format!("{row} button[value=approve]"));
    browser.wait_for(&format!("/approvals?status=approved&decided={approval}"));
    assert!(browser.text().contains("approved"), "{}", browser.text());
    // The decision is confirmed on the page it led to, and nothing waits.
    let confirmed = browser.attribute("#confirmation", "textContent");
    assert!(
        confirmed
            .as_str()
            .is_some_and(|text| text.contains(&approval[..8]) && text.contains("approved")),
        "{confirmed}"
    );
    assert_eq!(
        browser.attribute(
            &format!("#confirmation span.id[title=\"{approval}\"]"),
            "title"
        ),
        json!(approval)
    );
    assert_eq!(
        browser.attribute("#approvals-count", "textContent"),
        json!("0")
    );

    // The runtime asks again, and the call completes.
    let (status, body) = console.served.post("/v1/calls", &batch);
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["results"][0]["outcome"]["status"], "succeeded",
        "{body}"
    );
    assert_eq!(console.served.external_writes(), 1);
    let invocation = body["results"][0]["invocation_id"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| {
            let approvals = console.control("/v1/approvals?status=approved");
            approvals["approvals"][0]["invocation_id"]
                .as_str()
                .unwrap()
                .to_owned()
        });
    browser.open(&console.url(&format!("/invocations/{invocation}")));
    let text = browser.text();
    assert!(text.contains("succeeded"), "{text}");
    assert!(text.contains(HOSTILE), "{text}");
    assert!(!browser.alert_open(), "a script ran");
    assert_eq!(browser.count("img"), 0);
    browser.screenshot("5-approved-call-succeeded-story");
    let decided = console.control("/v1/approvals?status=approved").to_string();
    assert!(decided.contains("\"ana\""), "{decided}");
}

/// A wrong token signs nobody in and a missing one is sent to the sign-in
/// page; a POST without the session's CSRF token, or naming another origin,
/// or that the browser says is cross-site, is refused and changes nothing;
/// every answer carries the CSP.
#[test]
fn wrong_tokens_and_forged_posts_are_refused_with_nothing_changed() {
    if !browser_installed() {
        return;
    }
    let console = Console::start();
    let (approval, _) = held_call(&console.served, "forged?");
    let browser = Browser::start();

    // A wrong token: the sign-in page again, and no cookie.
    browser.open(&console.url("/sign-in"));
    browser.type_into("#token", "tgo_wrong");
    browser.click("#sign-in");
    browser.wait_for_text("does not sign anyone in");
    assert!(
        browser
            .command("GET", "/cookie/toolgate_console", None)
            .is_err()
    );
    browser.screenshot("6-wrong-token-refused");
    // No token at all: every page leads to the sign-in page.
    browser.open(&console.url("/approvals"));
    assert!(browser.url().ends_with("/sign-in"), "{}", browser.url());
    let (status, head, _) = exchange(console.port, "GET", "/approvals", &[], b"");
    assert_eq!(status, 303, "{head}");
    assert!(head.to_lowercase().contains("location: /sign-in"), "{head}");
    let (status, _, _) = exchange(
        console.port,
        "POST",
        "/sign-in",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        b"token=",
    );
    assert_eq!(status, 401);

    console.sign_in(&browser);
    let cookie = format!("toolgate_console={}", browser.cookie());
    let csrf = browser.script("return document.querySelector('input[name=csrf]').value");
    let csrf = csrf.as_str().unwrap();
    let path = format!("/approvals/{TENANT}/{approval}");
    let form = "Content-Type";
    let urlencoded = "application/x-www-form-urlencoded";
    let with_csrf = format!("decision=approve&csrf={csrf}");
    for (headers, body, what) in [
        (vec![], "decision=approve".to_owned(), "no CSRF token"),
        (
            vec![],
            "decision=approve&csrf=forged".to_owned(),
            "a wrong CSRF token",
        ),
        (
            vec![("Origin", "http://evil.example")],
            with_csrf.clone(),
            "another origin",
        ),
        (
            vec![("Sec-Fetch-Site", "cross-site")],
            with_csrf.clone(),
            "a cross-site request",
        ),
    ] {
        let mut all = vec![(form, urlencoded), ("Cookie", cookie.as_str())];
        all.extend(headers);
        let (status, head, body) = exchange(console.port, "POST", &path, &all, body.as_bytes());
        assert_eq!(status, 403, "{what}: {head}");
        assert!(
            head.contains("default-src 'none'"),
            "{what}: the CSP: {head}"
        );
        assert!(String::from_utf8_lossy(&body).contains("did not come from"));
    }
    let pending = console.control("/v1/approvals?status=pending").to_string();
    assert!(pending.contains(&approval), "still pending: {pending}");
    assert_eq!(console.served.external_writes(), 0);

    // The same cookie, token and origin decide: the refusals were for what
    // they lacked.
    let (status, head, _) = exchange(
        console.port,
        "POST",
        &path,
        &[
            (form, urlencoded),
            ("Cookie", cookie.as_str()),
            ("Origin", &console.url("")),
            ("Sec-Fetch-Site", "same-origin"),
        ],
        format!("decision=deny&csrf={csrf}").as_bytes(),
    );
    assert_eq!(status, 303, "{head}");
    let denied = console.control("/v1/approvals?status=denied").to_string();
    assert!(denied.contains(&approval), "{denied}");

    // Every page carries the policy, the stylesheet included.
    for path in ["/sign-in", "/console.css"] {
        let (status, head, _) = exchange(console.port, "GET", path, &[], b"");
        assert_eq!(status, 200);
        assert!(
            head.contains(toolgate::console::CONTENT_SECURITY_POLICY),
            "{head}"
        );
    }
}

/// What a scripted MCP server answers and what a tenant passes it stay
/// text on every page: an echo of hostile markup through `mcp.reads.echo`
/// (the server's result, the tenant's argument) is listed, told in its
/// story, and counted on the servers and tool health pages, with no
/// element injected, no script run and the CSP on each page.
#[test]
fn what_servers_and_tenants_wrote_stays_text_on_every_page() {
    if !browser_installed() {
        return;
    }
    let console = Console::start();
    let session = console.served.session();
    let (status, body) = console.served.post(
        "/v1/calls",
        &json!({"session_id": session, "run_id": Uuid::new_v4(), "step_number": 1,
                "origin_trust": "user",
                "calls": [{"call_id": "echo", "name": "mcp.reads.echo",
                           "arguments": {"text": HOSTILE}}]}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["results"][0]["outcome"]["status"], "succeeded",
        "{body}"
    );
    let invocation = body["results"][0]["invocation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // A tenant's server whose address is one long word: the servers page
    // still fits an operator's 1280 px.
    let wide = format!("https://mcp.example.com/{}", "w".repeat(400));
    let (status, _, answer) = http(
        &console.served.socket,
        "PUT",
        &format!("/v1/tenants/{TENANT}/mcp-servers/wide"),
        &[],
        Some(
            json!({"endpoint": wide, "side_effect": "none", "risk": "low",
                   "idempotency": "read_only", "required_scopes": ["mcp.wide.use"]})
            .to_string()
            .as_bytes(),
        ),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
    let browser = Browser::start();
    console.sign_in(&browser);
    browser.resize(1280);
    let pages = [
        ("/invocations?tool_name=mcp.reads.echo", "invocation"),
        (&*format!("/invocations/{invocation}"), "story"),
        ("/servers", "servers"),
        ("/health", "tool-health"),
    ];
    for (index, (path, name)) in pages.iter().enumerate() {
        browser.open(&console.url(path));
        let text = browser.text();
        match *name {
            // The id short, the whole of it on hover.
            "invocation" => assert_eq!(
                browser.attribute(&format!("span.id[title=\"{invocation}\"]"), "title"),
                json!(invocation),
                "{text}"
            ),
            // The argument, and the server's echo of it in the result.
            "story" => assert!(text.matches(HOSTILE).count() >= 2, "{text}"),
            "servers" => {
                assert!(text.contains("reads") && text.contains("echo"), "{text}");
                // The server the call used is up on this node now.
                assert_eq!(
                    browser.attribute("tr.server[data-server=reads] .now", "data-now"),
                    json!("connected"),
                    "{text}"
                );
            }
            _ => assert!(text.contains("mcp.reads.echo"), "{text}"),
        }
        assert!(browser.fits(), "{path} is wider than 1280 px");
        assert_eq!(browser.count("img"), 0, "{path}");
        assert_eq!(browser.count("script"), 0, "{path}");
        assert!(!browser.alert_open(), "a script ran on {path}");
        browser.screenshot(&format!("{}-{name}", index + 7));
        let cookie = format!("toolgate_console={}", browser.cookie());
        let (status, head, _) = exchange(console.port, "GET", path, &[("Cookie", &cookie)], b"");
        assert_eq!(status, 200, "{path}: {head}");
        assert!(
            head.contains(toolgate::console::CONTENT_SECURITY_POLICY),
            "{path}: {head}"
        );
    }
}

/// Serves `page` as HTML to every request on a loopback port, until the
/// test ends: a site of its own (another port, and reached as `localhost`).
fn foreign_site(page: String) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut buffer = [0u8; 8192];
            let _ = stream.read(&mut buffer);
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{page}",
                page.len()
            );
        }
    });
    port
}

/// A signed-in operator's browser opens another site whose form posts an
/// approval to the console (with the session's real CSRF token, as if it
/// had leaked): the browser sends it cross-site, and the console refuses
/// it; the approval stays pending and nothing is written.
#[test]
fn a_cross_site_form_in_the_operators_browser_decides_nothing() {
    if !browser_installed() {
        return;
    }
    let console = Console::start();
    let (approval, _) = held_call(&console.served, "cross-site?");
    let browser = Browser::start();
    console.sign_in(&browser);
    browser.open(&console.url("/approvals"));
    let csrf = browser.script("return document.querySelector('input[name=csrf]').value");
    let page = format!(
        "<!doctype html><form method=\"post\" action=\"{}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <button id=\"forge\" name=\"decision\" value=\"approve\">Win a prize</button></form>",
        console.url(&format!("/approvals/{TENANT}/{approval}")),
        csrf.as_str().unwrap()
    );
    let site = foreign_site(page);
    browser.open(&format!("http://localhost:{site}/"));
    browser.click("#forge");
    // SameSite=Strict keeps the cookie off the cross-site post, so the
    // console sees no session and sends the browser to sign in (the
    // origin check, which would refuse it too, is the forged-posts test's).
    browser.wait_for("/sign-in");
    assert!(
        browser.text().contains("Operator token"),
        "{}",
        browser.text()
    );
    browser.screenshot("11-cross-site-form-refused");
    let pending = console.control("/v1/approvals?status=pending").to_string();
    assert!(pending.contains(&approval), "still pending: {pending}");
    assert_eq!(console.served.external_writes(), 0);
}

/// A 2026-07-28 client that opens URLs is sent, for a held call, to the
/// console's page for its approval: the operator signs in there (a real
/// browser), sees the call with its arguments and approves it, and the
/// client's retry with the state it was given runs the call, once; a retry
/// naming another call's state is refused.
#[test]
fn a_held_calls_client_is_sent_to_its_approval_page_and_its_retry_runs_it_once() {
    if !browser_installed() {
        return;
    }
    let front_port = free_port();
    let console = Console::start_with(&crate::front::front_table(front_port, ""));
    let door = crate::front::Client { port: front_port };
    let meta = crate::front::stateless::request_meta(json!({
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"url": {}}}}));
    let ask = |params: Value| {
        crate::front::stateless::send(&door, crate::front::KEY_A, "tools/call", params, &[])
    };
    let call = json!({"name": "demo-external_write", "arguments": {"line": "approve me"},
                      "_meta": meta.clone()});
    let asked = ask(call.clone());
    let result = asked.last()["result"].clone();
    assert_eq!(result["resultType"], "input_required", "{asked:?}");
    let request = &result["inputRequests"]["approval"];
    assert_eq!(request["method"], "elicitation/create", "{result}");
    assert_eq!(request["params"]["mode"], "url", "{result}");
    let url = request["params"]["url"].as_str().unwrap().to_owned();
    let state = result["requestState"].as_str().unwrap().to_owned();
    let approvals = console.control("/v1/approvals?status=pending");
    let approval = approvals["approvals"][0]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        url,
        console.url(&format!("/approvals/{}/{approval}", crate::serve::TENANT))
    );
    assert_eq!(approvals["approvals"][0]["invocation_id"], state);
    assert_eq!(console.served.external_writes(), 0, "nothing ran");

    // Not approved yet, the user comes back: still input required.
    let mut retry = call.clone();
    retry["requestState"] = json!(state);
    retry["inputResponses"] = json!({"approval": {"action": "decline"}});
    let early = ask(retry.clone());
    assert_eq!(
        early.last()["result"]["structuredContent"]["status"],
        "pending",
        "a declined page ends in the pending answer: {early:?}"
    );
    // Another call's state, or a forged one, is refused.
    let mut forged = retry.clone();
    forged["arguments"] = json!({"line": "something else"});
    forged["inputResponses"] = json!({"approval": {"action": "accept"}});
    let refused = ask(forged);
    assert_eq!(refused.last()["error"]["code"], -32602, "{refused:?}");

    // The user is not signed in: the link leads to sign in, and signing
    // in leads back to the approval.
    let browser = Browser::start();
    browser.open(&url);
    browser.wait_for(&format!(
        "/sign-in?next=%2Fapprovals%2F{}%2F{approval}",
        crate::serve::TENANT
    ));
    browser.type_into("#token", &console.token);
    browser.click("#sign-in");
    browser.wait_for(&format!("/approvals/{}/{approval}", crate::serve::TENANT));
    assert_eq!(
        browser.count(&format!("table#approval[data-approval=\"{approval}\"]")),
        1,
        "{}",
        browser.text()
    );
    assert!(browser.text().contains("approve me"), "{}", browser.text());
    browser.screenshot("6-approval-page-from-a-clients-url");
    browser.click("table#approval button[value=approve]");
    browser.wait_for(&format!("/approvals?status=approved&decided={approval}"));

    retry["inputResponses"] = json!({"approval": {"action": "accept"}});
    let done = ask(retry.clone());
    let result = &done.last()["result"];
    assert_eq!(result["isError"], false, "{done:?}");
    assert_eq!(result["_meta"]["toolgate/invocation_id"], state, "{result}");
    let again = ask(retry);
    assert_eq!(
        again.last()["result"]["_meta"]["toolgate/invocation_id"],
        state
    );
    assert_eq!(console.served.external_writes(), 1, "run once");
}

/// Waits until something listens on 127.0.0.1:`port`.
pub fn wait_listening(port: u16) {
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "nothing listens on {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Signs in with `token` over plain HTTP: the cookie header to present.
pub fn signed_in(port: u16, token: &str) -> String {
    let (status, head, _) = exchange(
        port,
        "POST",
        "/sign-in",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        format!("token={token}").as_bytes(),
    );
    assert_eq!(status, 303, "{head}");
    let value = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("set-cookie")
                .then(|| value.trim().split(';').next().unwrap_or("").to_owned())
        })
        .expect("a cookie");
    assert!(value.starts_with("toolgate_console="), "{value}");
    value
}

/// A page with `cookie`: (status, body).
pub fn page(port: u16, cookie: &str, path: &str) -> (u16, String) {
    let (status, _, body) = exchange(port, "GET", path, &[("Cookie", cookie)], b"");
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A sign-in is the store's, not a node's: it outlives a restart of the
/// node that made it, opens pages on another node of the same database, and
/// signing out on one node ends it on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sign_in_survives_a_restart_and_works_on_every_node() {
    let mut console = Console::start();
    wait_listening(console.port);
    let cookie = signed_in(console.port, &console.token);
    let (status, body) = page(console.port, &cookie, "/review");
    assert_eq!(status, 200, "{body}");
    console.served.restart();
    wait_listening(console.port);
    let (status, body) = page(console.port, &cookie, "/review");
    assert_eq!(status, 200, "signed in after a restart: {body}");

    let Some(schema) = crate::store::PgSchema::create().await else {
        eprintln!("DATABASE_URL unset: the two-node part runs on PostgreSQL only");
        return;
    };
    let token = format!("tgo_{}", Uuid::new_v4().simple());
    let node = |port: u16| {
        let table = format!(
            "\n[console]\nlisten = \"127.0.0.1:{port}\"\n\
             operators = [{{ name = \"ana\", sha256 = \"{}\" }}]\n",
            sha256(&token)
        );
        Served::here().start_edited_on(Some(&schema.url), move |_, config| {
            format!("{config}\n{table}")
        })
    };
    let (port_a, port_b) = (free_port(), free_port());
    let (_a, _b) = (node(port_a), node(port_b));
    wait_listening(port_a);
    wait_listening(port_b);
    let cookie = signed_in(port_a, &token);
    let (status, body) = page(port_b, &cookie, "/review");
    assert_eq!(status, 200, "signed in on the other node: {body}");
    let csrf = body
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the page's CSRF token")
        .to_owned();
    let (status, head, _) = exchange(
        port_b,
        "POST",
        "/sign-out",
        &[
            ("Cookie", &cookie),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        format!("csrf={csrf}").as_bytes(),
    );
    assert_eq!(status, 303, "{head}");
    let (status, _) = page(port_a, &cookie, "/review");
    assert_eq!(status, 303, "signed out on every node");
}
