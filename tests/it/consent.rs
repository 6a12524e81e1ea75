//! `oauth2_user`: a person proves which principal they are on the consent
//! page, consents at a real (scripted) authorization server, and toolgate
//! keeps the grant sealed, for that principal only; every forged, replayed
//! or misdirected answer grants nothing.

use std::path::Path;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::console::exchange;
use crate::front::{KEY_A, KEY_A2, KEY_B, front_table};
use crate::http::ScriptedHttp;
use crate::serve::Served;
use crate::store::PgSchema;
use crate::support::free_port;

/// The client toolgate is registered as at the scripted authorization server.
const CLIENT: &str = "toolgate:s3cr3t";

/// `crm`'s `auth` naming that registered client.
const REGISTERED: &str = "credential_ref = \"file:CLIENTFILE\", ";

/// A node with the front door (its principals), the console serving
/// consent, and the scripted server `crm` behind `oauth2_user`.
struct Delegating {
    served: Served,
    upstream: ScriptedHttp,
    console: u16,
    front: u16,
}

/// A node's folder made ready to reach the scripted server on `upstream`:
/// its client's file, a policy allowing the servers' tools, and egress to
/// that port on loopback. The configuration, so edited.
fn reaching(root: &Path, config: &str, upstream: u16) -> String {
    std::fs::write(root.join("client"), CLIENT).unwrap();
    let policy = std::fs::read_to_string(root.join("policy.toml")).unwrap();
    std::fs::write(
        root.join("policy.toml"),
        format!(
            "[[rules]]\ntools = [\"mcp.crm.*\", \"mcp.mine.*\"]\ndecision = \"allow\"\n{policy}"
        ),
    )
    .unwrap();
    config.replace(
        "allow = [\"mcp.example.com\", \"*.auth.example.com\"]",
        &format!("allow = [\"http://127.0.0.1:{upstream}\"]\nallow_cidrs = [\"127.0.0.1/32\"]"),
    )
}

/// A node serving `crm` at the scripted server on `upstream`, its console
/// (and so its consent pages) on `console`, on the store `store_url` (its
/// own SQLite file when `None`).
fn node(upstream: u16, console: u16, front: u16, store_url: Option<&str>) -> Served {
    node_with(upstream, console, front, store_url, "", REGISTERED, None)
}

/// As [`node`], with `more` tables in its configuration and `client` in
/// `crm`'s `auth` (empty: no registered client).
fn node_with(
    upstream: u16,
    console: u16,
    front: u16,
    store_url: Option<&str>,
    more: &str,
    client: &str,
    public: Option<u16>,
) -> Served {
    // Nodes behind one address say so: a consent's redirect comes back to
    // it, whichever node began the consent.
    let public = public.unwrap_or(console);
    let extra = format!(
        "{more}\n{front}\n[console]\nlisten = \"127.0.0.1:{console}\"\n\
         url = \"http://127.0.0.1:{public}\"\n\
         operators = [{{ name = \"ana\", sha256 = \"{operator}\" }}]\n\
         consent_key_ref = \"file:KEYFILE\"\n\n\
         [[mcp.http_servers]]\nserver_id = \"crm\"\nurl = \"http://127.0.0.1:{upstream}/mcp\"\n\
         side_effect = \"external_read\"\nrisk = \"low\"\nidempotency = \"read_only\"\n\
         auth = {{ scheme = \"oauth2_user\", {client}token_scopes = [\"mcp:read\"] }}\n",
        front = front_table(front, ""),
        operator = toolgate::domain::sha256_hex(b"operator-token"),
    );
    let served =
        Served::process().start_edited_on(store_url, move |root: &Path, config: String| {
            // Every node seals with the same key.
            std::fs::write(root.join("grant.key"), "7".repeat(64)).unwrap();
            let config = reaching(root, &config, upstream);
            format!("{config}\n{extra}")
                .replace("KEYFILE", &root.join("grant.key").display().to_string())
                .replace("CLIENTFILE", &root.join("client").display().to_string())
        });
    crate::console::wait_listening(console);
    served
}

impl Delegating {
    fn start(upstream_env: &[(&str, String)]) -> Delegating {
        Delegating::start_on(upstream_env, None)
    }

    fn start_on(upstream_env: &[(&str, String)], store_url: Option<&str>) -> Delegating {
        Delegating::start_with(upstream_env, store_url, "")
    }

    fn start_with(
        upstream_env: &[(&str, String)],
        store_url: Option<&str>,
        more: &str,
    ) -> Delegating {
        Delegating::start_as(upstream_env, store_url, more, REGISTERED)
    }

    /// As [`Delegating::start_with`], `client` in `crm`'s `auth`.
    fn start_as(
        upstream_env: &[(&str, String)],
        store_url: Option<&str>,
        more: &str,
        client: &str,
    ) -> Delegating {
        let console = free_port();
        let mut env = vec![
            ("SCRIPTED_OAUTH_CLIENT", CLIENT.to_owned()),
            (
                "SCRIPTED_OAUTH_REDIRECT",
                format!("http://127.0.0.1:{console}/consent/callback"),
            ),
        ];
        env.extend(upstream_env.iter().cloned());
        let upstream = ScriptedHttp::start(&env);
        let front = free_port();
        let served = node_with(upstream.port, console, front, store_url, more, client, None);
        Delegating {
            served,
            upstream,
            console,
            front,
        }
    }

    /// `POST /consent` as this console's own page sends it.
    fn submit(&self, credential: &str, server: &str, action: &str) -> (u16, String, String) {
        let origin = format!("http://127.0.0.1:{}", self.console);
        let form = format!(
            "server={server}&credential={}&action={action}",
            encode(credential)
        );
        let (status, head, body) = exchange(
            self.console,
            "POST",
            "/consent",
            &[
                ("Content-Type", "application/x-www-form-urlencoded"),
                ("Origin", &origin),
            ],
            form.as_bytes(),
        );
        (status, head, String::from_utf8_lossy(&body).into_owned())
    }

    /// Begins consent as `credential`: the authorization URL and the
    /// browser's cookie.
    fn begin(&self, credential: &str) -> (String, String) {
        self.begin_at(credential, "crm")
    }

    /// As [`Delegating::begin`], at `server`.
    fn begin_at(&self, credential: &str, server: &str) -> (String, String) {
        let (status, head, body) = self.submit(credential, server, "connect");
        assert_eq!(status, 200, "{body}");
        let cookie = set_cookie(&head).expect("the flow's cookie");
        assert!(cookie.starts_with("toolgate_consent_"), "{cookie}");
        assert!(head.contains("SameSite=Lax"), "{head}");
        let url = between(&body, "id=\"continue\" href=\"", "\"")
            .expect("the link to the authorization server")
            .replace("&amp;", "&");
        (url, cookie)
    }

    /// The person signs in at the authorization server as `user` and
    /// allows: where they are sent back to (path and query).
    fn consent_upstream(&self, url: &str, user: &str) -> String {
        let path = url
            .strip_prefix(&format!("http://127.0.0.1:{}", self.upstream.port))
            .expect("the authorization server is the scripted one");
        let (status, _, page) = exchange(self.upstream.port, "GET", path, &[], b"");
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&page));
        let query = path.split_once('?').expect("a query").1;
        let (status, head, _) = exchange(
            self.upstream.port,
            "POST",
            "/authorize",
            &[("Content-Type", "application/x-www-form-urlencoded")],
            format!("{query}&user={user}").as_bytes(),
        );
        assert_eq!(status, 302, "{head}");
        let location = header(&head, "location").expect("a redirect");
        location
            .strip_prefix(&format!("http://127.0.0.1:{}", self.console))
            .expect("back to the console")
            .to_owned()
    }

    /// The authorization server's answer arriving in a browser holding
    /// `cookie` (or none).
    fn callback(&self, path: &str, cookie: Option<&str>) -> (u16, String) {
        callback_at(self.console, path, cookie)
    }

    /// The grants as the store holds them: (tenant, principal, server,
    /// sealed tokens).
    fn grants(&self) -> Vec<(String, String, String, String)> {
        let db = rusqlite::Connection::open(self.served.folder.path().join("toolgate.db")).unwrap();
        let mut statement = db
            .prepare(
                "SELECT tenant_id, principal_id, server_id, sealed_tokens FROM upstream_grants \
                 ORDER BY tenant_id, principal_id",
            )
            .unwrap();
        statement
            .query_map([], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    fn session(&self, tenant: &str, principal: &str) -> (Uuid, Vec<String>) {
        session(&self.served, tenant, principal)
    }

    fn whoami(&self, session: Uuid) -> Value {
        whoami(&self.served, session)
    }

    /// Consents for `credential`'s principal as `user` upstream.
    fn consent(&self, credential: &str, user: &str) {
        let (url, cookie) = self.begin(credential);
        let back = self.consent_upstream(&url, user);
        let (status, body) = self.callback(&back, Some(&cookie));
        assert_eq!(status, 200, "{body}");
    }

    /// The token endpoint's redemptions, as the scripted server logged them.
    fn redemptions(&self) -> Vec<String> {
        self.logged("TOKEN ")
    }

    /// What the scripted server logged, of lines starting with `prefix`.
    fn logged(&self, prefix: &str) -> Vec<String> {
        std::fs::read_to_string(self.upstream.folder.path().join("requests"))
            .unwrap_or_default()
            .lines()
            .filter(|line| line.starts_with(prefix))
            .map(str::to_owned)
            .collect()
    }
}

/// Another principal of the tenant (`user-2`) consents and calls, so the
/// server's catalog is known to the tenant's principals without a grant.
fn catalog_known(node: &Delegating) {
    node.consent(KEY_A2, "dave");
    let (session, _) = node.session(crate::serve::TENANT, "user-2");
    let answer = node.whoami(session);
    assert!(answer["content"].to_string().contains("dave"), "{answer}");
}

/// The authorization server's answer arriving at the console on `port` in
/// a browser holding `cookie` (or none), confirmed when the page asks, as
/// its own form posts it: the last page's status and text.
fn callback_at(port: u16, path: &str, cookie: Option<&str>) -> (u16, String) {
    let mut headers: Vec<(&str, &str)> = cookie.map(|c| ("Cookie", c)).into_iter().collect();
    let (status, _, body) = exchange(port, "GET", path, &headers, b"");
    let page = String::from_utf8_lossy(&body).into_owned();
    if status != 200 || !page.contains("id=\"confirm\"") {
        return (status, page);
    }
    let field = |name: &str| {
        between(&page, &format!("name=\"{name}\" value=\""), "\"")
            .map(|value| format!("{name}={}", encode(&value.replace("&amp;", "&"))))
    };
    let form: Vec<String> = ["state", "code", "iss"]
        .iter()
        .filter_map(|name| field(name))
        .collect();
    let origin = format!("http://127.0.0.1:{port}");
    headers.push(("Content-Type", "application/x-www-form-urlencoded"));
    headers.push(("Origin", &origin));
    let (status, _, body) = exchange(
        port,
        "POST",
        "/consent/callback",
        &headers,
        form.join("&").as_bytes(),
    );
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Opens a session of `principal` in `tenant`: its id and pinned tools.
fn session(served: &Served, tenant: &str, principal: &str) -> (Uuid, Vec<String>) {
    let session_id = Uuid::new_v4();
    let (status, body) = served.post(
        "/v1/sessions",
        &json!({"session_id": session_id, "tenant_id": tenant,
                "principal": {"id": principal, "scopes": []},
                "agent": {"tools": ["mcp.*"]}}),
    );
    assert_eq!(status, 200, "{body}");
    let tools = body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].as_str().unwrap().to_owned())
        .collect();
    (session_id, tools)
}

/// `mcp.crm.whoami` in `session`: the result object.
fn whoami(served: &Served, session: Uuid) -> Value {
    whoami_in(served, session, Uuid::new_v4())
}

/// `mcp.crm.whoami` as call `who` of `run_id`'s first step, so asking it
/// again is the same call.
fn whoami_in(served: &Served, session: Uuid, run_id: Uuid) -> Value {
    let (status, body) = served.post(
        "/v1/calls",
        &json!({"session_id": session, "run_id": run_id, "step_number": 1,
                "origin_trust": "user",
                "calls": [{"call_id": "who", "name": "mcp.crm.whoami", "arguments": {}}]}),
    );
    assert_eq!(status, 200, "{body}");
    body["results"][0].clone()
}

fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn between<'a>(text: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let from = text.find(start)? + start.len();
    let to = text[from..].find(end)? + from;
    Some(&text[from..to])
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|line| {
        let (found, value) = line.split_once(':')?;
        found.eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

/// The `name=value` a `Set-Cookie` sets.
fn set_cookie(head: &str) -> Option<String> {
    header(head, "set-cookie").map(|value| value.split(';').next().unwrap_or("").to_owned())
}

/// The whole flow: a principal proves itself with its front-door key,
/// consents upstream, and the grant is kept for it alone, sealed (the
/// file holds no token in clear). The answer replayed, or arriving in
/// another browser, or with a forged state, grants nothing more.
#[test]
fn a_principal_consents_and_its_grant_is_kept_sealed_for_it_alone() {
    let node = Delegating::start(&[]);
    let (status, _, page) = exchange(node.console, "GET", "/consent?server=crm", &[], b"");
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&page).contains("value=\"crm\""));

    let (url, cookie) = node.begin(KEY_A);
    assert!(url.contains("code_challenge_method=S256"), "{url}");
    assert!(url.contains("resource=http%3A%2F%2F127.0.0.1"), "{url}");
    assert!(url.contains("scope=mcp%3Aread"), "{url}");
    // The person comes back to this console's callback and nowhere else:
    // the redirect URI is the one registered, exactly.
    let redirect = format!("http://127.0.0.1:{}/consent/callback", node.console);
    assert_eq!(url.matches("redirect_uri=").count(), 1, "{url}");
    assert!(
        url.contains(&format!("redirect_uri={}&", encode(&redirect))),
        "{url}"
    );
    let back = node.consent_upstream(&url, "alice");
    // In another browser (no cookie), the answer grants nothing, and the
    // state it carried is spent.
    let (status, body) = node.callback(&back, None);
    assert_eq!(status, 400, "{body}");
    assert_eq!(node.callback(&back, Some(&cookie)).0, 400, "spent");
    assert!(node.grants().is_empty());
    assert!(node.redemptions().is_empty(), "no code was redeemed");

    // Again, in the browser that began it, with a second flow begun in
    // another tab meanwhile: each flow has its own cookie, and the grant
    // is kept.
    let (url, cookie) = node.begin(KEY_A);
    let (_, other_tab) = node.begin(KEY_A);
    assert_ne!(cookie, other_tab);
    let back = node.consent_upstream(&url, "alice");
    // Arriving, the answer only asks the person to confirm, naming whom it
    // grants: nothing is redeemed until they do, on this origin.
    let (status, _, page) = exchange(node.console, "GET", &back, &[("Cookie", &cookie)], b"");
    let page = String::from_utf8_lossy(&page);
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("id=\"confirm\"") && page.contains("user-1"),
        "{page}"
    );
    assert!(node.grants().is_empty() && node.redemptions().is_empty());
    // A forged state, in the browser holding the live flow's cookie: refused,
    // and the live flow is not spent by it.
    let forged = back.replace("state=", "state=0");
    assert_ne!(forged, back);
    let (status, body) = node.callback(&forged, Some(&cookie));
    assert_eq!(status, 400, "{body}");
    assert!(node.grants().is_empty() && node.redemptions().is_empty());
    let (status, _, _) = exchange(
        node.console,
        "POST",
        "/consent/callback",
        &[
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Origin", "http://evil.example"),
            ("Cookie", &cookie),
        ],
        back.split_once('?').unwrap().1.as_bytes(),
    );
    assert_eq!(status, 403, "a confirmation from another site");
    assert!(node.grants().is_empty());
    let (status, body) = node.callback(&back, Some(&format!("{other_tab}; {cookie}")));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("Connected"), "{body}");
    let grants = node.grants();
    assert_eq!(grants.len(), 1, "{grants:?}");
    let (tenant, principal, server, sealed) = &grants[0];
    assert_eq!(
        (tenant.as_str(), principal.as_str(), server.as_str()),
        (crate::serve::TENANT, "user-1", "crm")
    );
    assert!(sealed.starts_with("v1."), "{sealed}");
    assert_eq!(node.redemptions(), ["TOKEN authorization_code 200"]);
    // The tokens the server issued look like `at-…` and `rt-…`: none is in
    // the database's files in clear.
    for file in ["toolgate.db", "toolgate.db-wal"] {
        let bytes = std::fs::read(node.served.folder.path().join(file)).unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            !holds_token(&text, "at-") && !holds_token(&text, "rt-"),
            "{file} holds a token"
        );
    }
    // Replayed: the flow is gone, and the code is not redeemed again.
    assert_eq!(node.callback(&back, Some(&cookie)).0, 400);
    // A state never issued.
    let forged = back.replace("state=", "state=0");
    assert_eq!(node.callback(&forged, Some(&cookie)).0, 400);
    assert_eq!(node.redemptions().len(), 1, "{:?}", node.redemptions());

    // Another principal of the tenant, and the same principal id in
    // another tenant, hold nothing from it; the first principal's
    // revocation ends only its own.
    let (url, cookie) = node.begin(KEY_B);
    let back = node.consent_upstream(&url, "bob");
    assert_eq!(node.callback(&back, Some(&cookie)).0, 200);
    let held: Vec<(String, String)> = node
        .grants()
        .into_iter()
        .map(|(tenant, principal, _, _)| (tenant, principal))
        .collect();
    assert_eq!(
        held,
        [
            (crate::serve::TENANT.to_owned(), "user-1".to_owned()),
            ("tenant-other".to_owned(), "user-1".to_owned())
        ]
    );
    let (status, _, body) = node.submit(KEY_A2, "crm", "revoke");
    assert_eq!(status, 200);
    assert!(body.contains("no grant"), "{body}");
    let (status, _, body) = node.submit(KEY_A, "crm", "revoke");
    assert_eq!(status, 200);
    assert!(body.contains("grant is ended"), "{body}");
    assert_eq!(node.grants().len(), 1);
    assert_eq!(node.grants()[0].0, "tenant-other");
}

/// What the consent page refuses: a credential that names no principal, a
/// server that takes no consent, a form posted from another site, and an
/// authorization server whose metadata names another issuer.
#[test]
fn the_consent_page_refuses_strangers_forgeries_and_impostor_issuers() {
    let node = Delegating::start(&[]);
    let (status, _, body) = node.submit("tgk_not_a_key", "crm", "connect");
    assert_eq!(status, 401, "{body}");
    assert!(
        !body.contains("tgk_not_a_key"),
        "the credential is not echoed"
    );
    let (status, _, _) = node.submit(KEY_A, "reads", "connect");
    assert_eq!(status, 404, "a stdio server takes no consent");
    let (status, _, _) = exchange(
        node.console,
        "POST",
        "/consent",
        &[
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Origin", "http://evil.example"),
        ],
        format!("server=crm&credential={KEY_A}&action=connect").as_bytes(),
    );
    assert_eq!(status, 403);
    // An answer naming another issuer than the one asked (RFC 9207): the
    // code is not redeemed.
    let (url, cookie) = node.begin(KEY_A);
    let back = node.consent_upstream(&url, "alice");
    let forged = match back.split_once("&iss=") {
        Some((before, _)) => format!("{before}&iss=https%3A%2F%2Fimpostor.example"),
        None => panic!("the answer names its issuer: {back}"),
    };
    let (status, body) = node.callback(&forged, Some(&cookie));
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("did not come from the authorization server asked"),
        "{body}"
    );
    assert!(node.redemptions().is_empty(), "{:?}", node.redemptions());
    drop(node);

    let impostor = Delegating::start(&[(
        "SCRIPTED_OAUTH_ISSUER",
        "http://impostor.example".to_owned(),
    )]);
    let (status, _, body) = impostor.submit(KEY_A, "crm", "connect");
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("names another issuer"), "{body}");
}

/// Each principal's calls carry its own grant and no other's: before
/// consent the server is not pinned (nothing has listed it); after, the
/// principal's session pins it and `whoami` answers its upstream user. A
/// principal of the same tenant without a grant pins the catalog and is
/// asked for consent; the same principal id in another tenant carries that
/// tenant's grant; a revocation holds from the next call.
#[test]
fn each_principals_calls_carry_its_own_grant_and_no_other() {
    let node = Delegating::start(&[]);
    let tenant = crate::serve::TENANT;
    let (_, tools) = node.session(tenant, "user-1");
    assert!(!tools.contains(&"mcp.crm.whoami".to_owned()), "{tools:?}");

    node.consent(KEY_A, "alice");
    let (session, tools) = node.session(tenant, "user-1");
    assert!(tools.contains(&"mcp.crm.whoami".to_owned()), "{tools:?}");
    let answer = node.whoami(session);
    assert_eq!(answer["outcome"]["status"], "succeeded", "{answer}");
    assert!(answer["content"].to_string().contains("alice"), "{answer}");
    // What this tenant's principal listed is not another tenant's catalog.
    let (_, elsewhere) = node.session("tenant-other", "user-1");
    assert!(
        !elsewhere.contains(&"mcp.crm.whoami".to_owned()),
        "{elsewhere:?}"
    );

    // Same tenant, another principal, no grant: the catalog is pinned, the
    // call asks for consent (the page to open, as platform text and as
    // data), records nothing, and nothing is sent with alice's grant.
    let (other, tools) = node.session(tenant, "user-2");
    assert!(tools.contains(&"mcp.crm.whoami".to_owned()), "{tools:?}");
    let refused = node.whoami(other);
    assert_eq!(
        refused["outcome"]["reason_code"], "tool.consent_required",
        "{refused}"
    );
    assert_eq!(refused["outcome"]["status"], "unavailable", "{refused}");
    assert_eq!(
        refused["invocation_id"],
        Value::Null,
        "nothing recorded: {refused}"
    );
    let page = format!("http://127.0.0.1:{}/consent?server=crm", node.console);
    assert_eq!(
        refused["pending"]["consent"]["url"],
        page.as_str(),
        "{refused}"
    );
    assert_eq!(refused["content"][0]["trust"], "platform", "{refused}");
    assert!(
        refused["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains(&page),
        "{refused}"
    );
    assert!(!refused.to_string().contains("alice"), "{refused}");

    // The same principal id in another tenant carries that tenant's grant.
    node.consent(KEY_B, "bob");
    let (elsewhere, _) = node.session("tenant-other", "user-1");
    let answer = node.whoami(elsewhere);
    assert!(answer["content"].to_string().contains("bob"), "{answer}");
    assert!(!answer.to_string().contains("alice"), "{answer}");

    // Revoked: the next call in the open session asks for consent again;
    // once consented, the same call asked again runs, as the same call.
    let (status, _, _) = node.submit(KEY_A, "crm", "revoke");
    assert_eq!(status, 200);
    let run = Uuid::new_v4();
    let after = whoami_in(&node.served, session, run);
    assert_eq!(
        after["outcome"]["reason_code"], "tool.consent_required",
        "{after}"
    );
    node.consent(KEY_A, "alice");
    let again = whoami_in(&node.served, session, run);
    assert_eq!(again["outcome"]["status"], "succeeded", "{again}");
    assert!(again["content"].to_string().contains("alice"), "{again}");
    assert_eq!(
        whoami_in(&node.served, session, run)["invocation_id"],
        again["invocation_id"],
        "asked a third time, it is the call that ran"
    );

    // A script in a turn of the principal without a grant: the bridge's
    // client raises `ConsentRequired` with the page, and the call's ordinal
    // is given back (its retry is the same call).
    let (_, socket, token) = node.served.turn(other, Uuid::new_v4(), "consent", None);
    let script = "from toolgate_bridge import call, ConsentRequired\n\
                  try:\n    call('mcp.crm.whoami')\n\
                  except ConsentRequired as needed:\n    print(needed.server_id, needed.url, needed.unsettled)\n";
    let output = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .env(
            "PYTHONPATH",
            Path::new(env!("CARGO_MANIFEST_DIR")).join("sandbox-bridge"),
        )
        .env("TOOLGATE_BRIDGE_SOCKET", &socket)
        .env("TOOLGATE_BRIDGE_TOKEN", &token)
        .output()
        .expect("python3 runs");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        format!("crm {page} True"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The TypeScript client, likewise.
    let folder = tempfile::tempdir().unwrap();
    let script = folder.path().join("consent.mjs");
    std::fs::write(
        &script,
        format!(
            "import {{ call, close, ConsentRequired }} from \"file://{}\";\n\
             try {{ await call(\"mcp.crm.whoami\", {{}}); }} catch (needed) {{\n\
             if (needed instanceof ConsentRequired) console.log(needed.serverId, needed.url, needed.unsettled); }}\n\
             close();\n",
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("sandbox-bridge/typescript/toolgate_bridge.mjs")
                .display()
        ),
    )
    .unwrap();
    let (_, socket, token) = node.served.turn(other, Uuid::new_v4(), "consent-ts", None);
    let output = std::process::Command::new("node")
        .arg(&script)
        .env("TOOLGATE_BRIDGE_SOCKET", &socket)
        .env("TOOLGATE_BRIDGE_TOKEN", &token)
        .output()
        .expect("node runs");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        format!("crm {page} true"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Two nodes never redeem one refresh token. Access tokens live a second,
/// inside the sixty-second skew, so every use refreshes; the authorization
/// server rotates refresh tokens, answers a refresh slowly, and revokes
/// the whole grant when one is presented twice. Calls on two nodes of one
/// PostgreSQL at once all succeed as the same upstream user, and no
/// refresh is refused.
#[test]
fn two_nodes_never_redeem_one_refresh_token() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let Some(schema) = runtime.block_on(PgSchema::create()) else {
        eprintln!("DATABASE_URL unset: the two-node refresh runs on PostgreSQL only");
        return;
    };
    let a = Delegating::start_on(
        &[
            ("SCRIPTED_OAUTH_EXPIRES", "1".to_owned()),
            ("SCRIPTED_OAUTH_DELAY_MS", "300".to_owned()),
        ],
        Some(&schema.url),
    );
    a.consent(KEY_A, "alice");
    let b = node(a.upstream.port, free_port(), free_port(), Some(&schema.url));
    let tenant = crate::serve::TENANT;
    let sessions = [
        session(&a.served, tenant, "user-1").0,
        session(&b, tenant, "user-1").0,
    ];
    for round in 0..3 {
        let answers: Vec<Value> = std::thread::scope(|scope| {
            let on_a = scope.spawn(|| whoami(&a.served, sessions[0]));
            let on_b = scope.spawn(|| whoami(&b, sessions[1]));
            vec![on_a.join().unwrap(), on_b.join().unwrap()]
        });
        for answer in answers {
            assert_eq!(
                answer["outcome"]["status"], "succeeded",
                "round {round}: {answer}"
            );
            assert!(answer["content"].to_string().contains("alice"), "{answer}");
        }
    }
    let redemptions = a.redemptions();
    assert!(
        redemptions.contains(&"TOKEN refresh_token 200".to_owned()),
        "{redemptions:?}"
    );
    assert!(
        !redemptions
            .iter()
            .any(|line| line.starts_with("TOKEN refresh_token 4")),
        "{redemptions:?}"
    );
}

/// As a person meets it: in headless Chromium, the consent page (the
/// front-door key typed in), the link to the authorization server, its
/// sign-in page, and back to toolgate's callback; then an MCP client's
/// `tools/call` through the front door with that key answers as the
/// person's upstream account.
#[test]
fn a_person_consents_in_a_browser_and_their_client_calls_as_them() {
    if !crate::console::browser_installed() {
        return;
    }
    let node = Delegating::start(&[]);
    let door = crate::front::Client { port: node.front };
    let call = || {
        crate::front::stateless::send(
            &door,
            KEY_A,
            "tools/call",
            json!({"name": "mcp-crm-whoami", "arguments": {}}),
            &[],
        )
    };
    // Another principal of the tenant consented and called first, so the
    // server's catalog is known to the tenant; this principal's client,
    // which opens URLs, is sent to the consent page, and nothing runs.
    catalog_known(&node);
    let meta = crate::front::stateless::request_meta(json!({
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"url": {}}}}));
    let asked = crate::front::stateless::send(
        &door,
        KEY_A,
        "tools/call",
        json!({"name": "mcp-crm-whoami", "arguments": {}, "_meta": meta.clone()}),
        &[],
    );
    let input = asked.last()["result"].clone();
    assert_eq!(input["resultType"], "input_required", "{asked:?}");
    let request = &input["inputRequests"]["consent"];
    assert_eq!(request["params"]["mode"], "url", "{input}");
    let page = request["params"]["url"].as_str().unwrap().to_owned();
    assert_eq!(
        page,
        format!("http://127.0.0.1:{}/consent?server=crm", node.console)
    );
    let state = input["requestState"].clone();
    // A client that does not open URLs reads the page as platform text.
    let plain = call();
    let result = &plain.last()["result"];
    assert_eq!(result["isError"], true, "{plain:?}");
    assert_eq!(
        result["structuredContent"]["reason_code"],
        "tool.consent_required"
    );
    assert_eq!(result["_meta"]["toolgate/consent"]["url"], page.as_str());

    let browser = crate::console::Browser::start();
    browser.open(&page);
    browser.type_into("#credential", KEY_A);
    browser.click("#connect");
    browser.wait_for_text("You will sign in at");
    assert!(browser.text().contains("user-1"), "{}", browser.text());
    browser.screenshot("consent-1-asked");
    browser.click("#continue");
    browser.wait_for_text("Allow");
    browser.type_into("#user", "carol");
    browser.click("#allow");
    browser.wait_for_text("act with the account you just signed in with");
    assert!(browser.text().contains("user-1"), "{}", browser.text());
    browser.click("#confirm");
    browser.wait_for_text("Connected");
    browser.screenshot("consent-2-connected");

    // Back from the page, the client asks again with the state it was
    // given: the call runs as the person.
    let retried = crate::front::stateless::send(
        &door,
        KEY_A,
        "tools/call",
        json!({"name": "mcp-crm-whoami", "arguments": {}, "_meta": meta,
               "requestState": state, "inputResponses": {"consent": {"action": "accept"}}}),
        &[],
    );
    let result = &retried.last()["result"];
    assert_eq!(result["isError"], false, "{retried:?}");
    assert!(result["content"].to_string().contains("carol"), "{result}");
    let answer = call();
    let result = &answer.last()["result"];
    assert_eq!(result["isError"], false, "{answer:?}");
    assert!(result["content"].to_string().contains("carol"), "{result}");
}

/// No token, code, state, client secret or key is anywhere it must not be:
/// the node's log at trace (the consent, calls with refreshes, a refused
/// answer), its events, its metrics, its spans over OTLP, the answers, and
/// the store's files.
#[test]
fn no_token_code_or_secret_is_in_a_log_an_event_a_metric_or_an_answer() {
    let (collector, spans) = crate::operations::collector();
    let mut node = Delegating::start_with(
        &[("SCRIPTED_OAUTH_EXPIRES", "1".to_owned())],
        None,
        &format!(
            "[log]\nlevel = \"trace\"\n\n[telemetry]\n\
             otlp_endpoint = \"http://{collector}/v1/traces\"\nservice_name = \"toolgate-test\"\n"
        ),
    );
    let (url, cookie) = node.begin(KEY_A);
    let back = node.consent_upstream(&url, "alice");
    let (status, _) = node.callback(&back, Some(&cookie));
    assert_eq!(status, 200);
    let query = |name: &str| {
        back.split(['?', '&'])
            .find_map(|pair| pair.strip_prefix(&format!("{name}=")))
            .unwrap()
            .to_owned()
    };
    let (code, state) = (query("code"), query("state"));
    let (session, _) = node.session(crate::serve::TENANT, "user-1");
    let mut answers = String::new();
    for _ in 0..2 {
        // Each use refreshes: the token lives a second.
        answers.push_str(&node.whoami(session).to_string());
    }
    let (other, _) = node.session(crate::serve::TENANT, "user-2");
    answers.push_str(&node.whoami(other).to_string());
    assert!(answers.contains("alice"), "{answers}");
    assert!(
        node.redemptions()
            .contains(&"TOKEN refresh_token 200".to_owned()),
        "{:?}",
        node.redemptions()
    );
    let (_, events) = node.served.get("/v1/events?after=0");
    let (_, metrics) = node.served.get("/metrics");
    assert!(node.served.stop(), "the drain exports what is buffered");
    let exported = crate::operations::exported_spans(&spans, "s3cr3t");
    assert!(!exported.is_empty(), "spans were exported");
    let logs = node.served.logs.lock().unwrap().clone();
    assert!(
        logs.contains("grant refreshed"),
        "the log is at trace: {logs}"
    );
    let mut places = vec![
        ("log", logs),
        ("events", String::from_utf8_lossy(&events).into_owned()),
        ("metrics", String::from_utf8_lossy(&metrics).into_owned()),
        ("spans", spans.lock().unwrap().join("\n")),
        ("answers", answers),
    ];
    for file in ["toolgate.db", "toolgate.db-wal"] {
        let bytes = std::fs::read(node.served.folder.path().join(file)).unwrap_or_default();
        places.push((file, String::from_utf8_lossy(&bytes).into_owned()));
    }
    let secrets = [
        "s3cr3t".to_owned(),
        "7".repeat(64),
        code,
        state,
        KEY_A.to_owned(),
    ];
    for (place, text) in &places {
        for secret in &secrets {
            assert!(!text.contains(secret.as_str()), "{place} holds {secret}");
        }
        for prefix in ["at-", "rt-"] {
            assert!(
                !holds_token(text, prefix),
                "{place} holds a token ({prefix}…)"
            );
        }
    }
}

/// Whether `text` holds a token the scripted server issues: `prefix` and a
/// v4 UUID's 32 hex digits.
fn holds_token(text: &str, prefix: &str) -> bool {
    text.match_indices(prefix).any(|(at, _)| {
        text[at + prefix.len()..]
            .get(..32)
            .is_some_and(|id| id.bytes().all(|b| b.is_ascii_hexdigit()))
    })
}

/// Operators list a tenant's grants (who, which server, when; never a
/// token) and end one, through the control API and the CLI; the principal's
/// next call asks for consent again. Another tenant's list holds nothing of
/// this one's.
#[test]
fn operators_list_grants_without_tokens_and_end_them() {
    let node = Delegating::start(&[]);
    let tenant = crate::serve::TENANT;
    node.consent(KEY_A, "alice");
    node.consent(KEY_B, "bob");
    let (session, _) = node.session(tenant, "user-1");
    assert!(
        node.whoami(session)["content"]
            .to_string()
            .contains("alice")
    );

    let (status, body) = node.served.get(&format!("/v1/grants?tenant_id={tenant}"));
    assert_eq!(status, 200);
    let listed: Value = serde_json::from_slice(&body).unwrap();
    let grants = listed["grants"].as_array().unwrap();
    assert_eq!(grants.len(), 1, "{listed}");
    assert_eq!(grants[0]["principal_id"], "user-1");
    assert_eq!(grants[0]["server_id"], "crm");
    assert_eq!(
        grants[0]["issuer"],
        format!("http://127.0.0.1:{}", node.upstream.port).as_str()
    );
    assert!(grants[0]["last_used_at"].is_string(), "{listed}");
    let text = listed.to_string();
    assert!(
        !text.contains("v1.") && !holds_token(&text, "at-"),
        "{text}"
    );
    let (status, _) = node.served.get("/v1/grants");
    assert_eq!(status, 400, "a tenant is named");

    let socket = node.served.socket.display().to_string();
    let cli = |args: &[&str]| {
        let mut all = vec!["grants"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--socket", &socket]);
        crate::serve::operator(&all)
    };
    let (ok, _, stderr) = cli(&["list"]);
    assert!(!ok && stderr.contains("--tenant"), "{stderr}");
    let (ok, stdout, stderr) = cli(&["revoke", "crm", "--principal", "user-1", "--tenant", tenant]);
    assert!(ok, "{stderr}");
    let revoked: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(revoked["revoked"], true, "{stdout}");
    // Ended here, and revoked at the authorization server (RFC 7009): the
    // refresh token, as the registered client.
    assert_eq!(revoked["revoked_upstream"], true, "{stdout}");
    assert_eq!(
        node.logged("REVOKE "),
        [
            "REVOKE refresh_token revoked",
            "REVOKE access_token revoked"
        ]
    );
    let (ok, _, _) = cli(&["revoke", "crm", "--principal", "user-1", "--tenant", tenant]);
    assert!(!ok, "there is none left to end");
    let (ok, stdout, _) = cli(&["list", "--tenant", tenant]);
    assert!(ok, "{stdout}");
    let left: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(left["grants"], json!([]), "{stdout}");
    let (_, stdout, _) = cli(&["list", "--tenant", "tenant-other"]);
    let others: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(others["grants"][0]["principal_id"], "user-1", "{stdout}");

    let after = node.whoami(session);
    assert_eq!(
        after["outcome"]["reason_code"], "tool.consent_required",
        "{after}"
    );

    // In the console, a signed-in operator sees the other tenant's grant
    // (never its tokens) and ends it with the page's own form.
    let cookie = crate::console::signed_in(node.console, "operator-token");
    let (status, grants) =
        crate::console::page(node.console, &cookie, "/grants?tenant_id=tenant-other");
    assert_eq!(status, 200, "{grants}");
    assert!(
        grants.contains("data-principal=\"user-1\" data-server=\"crm\""),
        "{grants}"
    );
    assert!(
        !grants.contains("v1.") && !holds_token(&grants, "at-"),
        "{grants}"
    );
    let csrf = between(&grants, "name=\"csrf\" value=\"", "\"")
        .unwrap()
        .to_owned();
    let origin = format!("http://127.0.0.1:{}", node.console);
    let (status, head, _) = exchange(
        node.console,
        "POST",
        "/grants/tenant-other/crm",
        &[
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Origin", &origin),
            ("Cookie", &cookie),
        ],
        format!("csrf={csrf}&principal=user-1").as_bytes(),
    );
    assert_eq!(status, 303, "{head}");
    let (_, stdout, _) = cli(&["list", "--tenant", "tenant-other"]);
    let left: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(left["grants"], json!([]), "{stdout}");
}

/// A consent outlives a restart of the node it began on: its flow is the
/// store's. The person who began it before the restart finishes it after.
#[test]
fn a_consent_begun_before_a_restart_finishes_after_it() {
    let mut node = Delegating::start(&[]);
    let (url, cookie) = node.begin(KEY_A);
    let back = node.consent_upstream(&url, "alice");
    node.served.restart();
    crate::console::wait_listening(node.console);
    let (status, body) = node.callback(&back, Some(&cookie));
    assert_eq!(status, 200, "{body}");
    let (session, _) = node.session(crate::serve::TENANT, "user-1");
    assert!(
        node.whoami(session)["content"]
            .to_string()
            .contains("alice")
    );
}

/// The official Python MCP SDK, through the front door as an application
/// uses it: before consent its call of the server's tool is an error whose
/// text and `_meta` give the consent page; after, it answers as the person.
#[test]
fn the_python_sdk_is_sent_to_consent_then_calls_as_the_person() {
    let node = Delegating::start(&[]);
    // Another principal of the tenant makes the catalog known to it.
    catalog_known(&node);
    let python = crate::front_clients::python("clients");
    let sdk = || {
        let mut command = std::process::Command::new(&python);
        command
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/front_python.py"))
            .args(["whoami", &format!("http://127.0.0.1:{}/mcp", node.front)])
            .env("TOOLGATE_FRONT_KEY", KEY_A)
            .env("TOOLGATE_RUN_ID", Uuid::new_v4().to_string());
        crate::front_clients::report(command)
    };
    let before = sdk();
    let page = format!("http://127.0.0.1:{}/consent?server=crm", node.console);
    assert_eq!(before["whoami"]["is_error"], true, "{before}");
    assert!(
        before["whoami"]["text"].as_str().unwrap().contains(&page),
        "{before}"
    );
    assert_eq!(before["consent"]["url"], page.as_str(), "{before}");
    node.consent(KEY_A, "alice");
    let after = sdk();
    assert_eq!(after["whoami"]["is_error"], false, "{after}");
    assert!(
        after["whoami"]["text"].as_str().unwrap().contains("alice"),
        "{after}"
    );
}

/// The exchange variant (RFC 8693): an operator's `oauth2_user` server with
/// a token endpoint mints each principal's upstream token from the
/// principal's own identity-provider token, as the front door verified it;
/// no browser. Two principals' calls answer as two users; a caller with an
/// API key has no such token and is refused, never given another's; the
/// token the front door took is never sent to the MCP server (which would
/// refuse it). A tenant may not configure an exchange.
#[test]
fn a_token_exchange_mints_each_principals_upstream_token_from_its_own() {
    let signer = crate::front::jwt::Signer::new("k1");
    let upstream = ScriptedHttp::start(&[
        ("SCRIPTED_OAUTH_CLIENT", CLIENT.to_owned()),
        (
            "SCRIPTED_OAUTH_REDIRECT",
            "http://127.0.0.1:9/consent/callback".to_owned(),
        ),
    ]);
    let port = upstream.port;
    let front = free_port();
    let jwks = json!({"keys": [signer.jwk()]});
    let served = Served::process().start_edited_on(None, move |root: &Path, config: String| {
        std::fs::write(root.join("jwks.json"), jwks.to_string()).unwrap();
        let config = reaching(root, &config, port);
        format!(
            "{config}\n{front}\n[front.jwt]\nissuer = \"https://login.example.com\"\n\
             audiences = [\"toolgate\"]\njwks_file = \"jwks.json\"\nalgorithms = [\"ES256\"]\n\
             tools = [\"mcp.*\"]\n\n\
             [[mcp.http_servers]]\nserver_id = \"crm\"\nurl = \"http://127.0.0.1:{port}/mcp\"\n\
             side_effect = \"external_read\"\nrisk = \"low\"\nidempotency = \"read_only\"\n\
             auth = {{ scheme = \"oauth2_user\", credential_ref = \"file:{client}\", \
             token_endpoint = \"http://127.0.0.1:{port}/token\", token_scopes = [\"mcp:read\"] }}\n",
            front = front_table(front, ""),
            client = root.join("client").display(),
        )
    });
    let door = crate::front::Client { port: front };
    let token = |subject: &str| {
        signer.token(
            &json!({"iss": "https://login.example.com", "aud": "toolgate",
            "sub": subject, "tenant_id": crate::serve::TENANT,
            "exp": crate::front::jwt::now() + 300, "iat": crate::front::jwt::now()}),
        )
    };
    let whoami = |credential: &str| {
        let answer = crate::front::stateless::send(
            &door,
            credential,
            "tools/call",
            json!({"name": "mcp-crm-whoami", "arguments": {}}),
            &[],
        );
        answer.last()["result"].clone()
    };
    let seven = whoami(&token("user-7"));
    assert_eq!(seven["isError"], false, "{seven}");
    assert!(seven["content"].to_string().contains("user-7"), "{seven}");
    let eight = whoami(&token("user-8"));
    assert!(eight["content"].to_string().contains("user-8"), "{eight}");
    assert!(!eight["content"].to_string().contains("user-7"), "{eight}");
    let requests = std::fs::read_to_string(upstream.folder.path().join("requests")).unwrap();
    let exchanges = requests
        .lines()
        .filter(|line| *line == "TOKEN urn:ietf:params:oauth:grant-type:token-exchange 200")
        .count();
    assert!(exchanges >= 2, "{requests}");
    // The MCP endpoint never refused a request: it was never sent the
    // front door's token.
    assert!(!requests.contains("POST /mcp 401"), "{requests}");

    // An API key names a principal but carries no identity-provider token.
    let keyed = whoami(KEY_A);
    assert_eq!(keyed["isError"], true, "{keyed}");
    assert_eq!(
        keyed["structuredContent"]["reason_code"], "tool.auth_failed",
        "{keyed}"
    );

    let row = json!({"endpoint": format!("http://127.0.0.1:{port}/mcp"),
        "auth": {"scheme": "oauth2_user",
                 "credential_ref": format!("secret:{}/client", crate::serve::TENANT),
                 "token_endpoint": format!("http://127.0.0.1:{port}/token")}});
    let (status, _, body) = crate::serve::http(
        &served.socket,
        "PUT",
        &format!("/v1/tenants/{}/mcp-servers/mine", crate::serve::TENANT),
        &[],
        Some(row.to_string().as_bytes()),
    );
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("auth.token_endpoint"), "{body}");
}

/// A grant is the server's at the URL it was given for: a tenant that
/// points its server's row elsewhere does not get its principals' tokens
/// sent there; they consent again.
#[test]
fn a_grant_is_never_sent_to_where_its_server_was_pointed_since() {
    let node = Delegating::start_with(
        &[],
        None,
        "[credentials]\ntenant_secrets_directory = \"secrets\"\n",
    );
    let tenant = crate::serve::TENANT;
    let secrets = node.served.folder.path().join("secrets").join(tenant);
    std::fs::create_dir_all(&secrets).unwrap();
    std::fs::write(secrets.join("client"), CLIENT).unwrap();
    let put = |path: &str| {
        let row = json!({"endpoint": format!("http://127.0.0.1:{}{path}", node.upstream.port),
            "auth": {"scheme": "oauth2_user", "credential_ref": format!("secret:{tenant}/client")},
            "side_effect": "external_read", "risk": "low", "idempotency": "read_only"});
        let (status, _, body) = crate::serve::http(
            &node.served.socket,
            "PUT",
            &format!("/v1/tenants/{tenant}/mcp-servers/mine"),
            &[],
            Some(row.to_string().as_bytes()),
        );
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    };
    put("/mcp");
    let (url, cookie) = node.begin_at(KEY_A, "mine");
    let back = node.consent_upstream(&url, "alice");
    assert_eq!(node.callback(&back, Some(&cookie)).0, 200);
    let call = |session| {
        let (status, body) = node.served.post(
            "/v1/calls",
            &json!({"session_id": session, "run_id": Uuid::new_v4(), "step_number": 1,
                    "origin_trust": "user",
                    "calls": [{"call_id": "who", "name": "mcp.mine.whoami", "arguments": {}}]}),
        );
        assert_eq!(status, 200, "{body}");
        body["results"][0].clone()
    };
    let (session, _) = node.session(tenant, "user-1");
    assert!(call(session)["content"].to_string().contains("alice"));

    // Pointed elsewhere, the server is a new one: the session's discovery
    // would need the principal's grant for the new URL, which it does not
    // hold, so the server's tools are not offered, and nothing is sent.
    put("/elsewhere");
    let (session, tools) = node.session(tenant, "user-1");
    assert!(!tools.contains(&"mcp.mine.whoami".to_owned()), "{tools:?}");
    let moved = call(session);
    assert_ne!(moved["outcome"]["status"], "succeeded", "{moved}");
    let requests = std::fs::read_to_string(node.upstream.folder.path().join("requests")).unwrap();
    assert!(!requests.contains("/elsewhere"), "{requests}");
    // Ended now, it is not revoked upstream: the client the row names now
    // is not sent to the authorization server of the URL the grant was for.
    let (status, _, body) = crate::serve::http(
        &node.served.socket,
        "DELETE",
        &format!("/v1/grants/mine?tenant_id={tenant}&principal_id=user-1"),
        &[],
        None,
    );
    let ended: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, 200, "{ended}");
    assert_eq!(ended["revoked_upstream"], false, "{ended}");
    assert!(node.logged("REVOKE ").is_empty());
}

/// A consent begun on one node finishes on another of the same database:
/// the flow is the store's. The grant then serves calls on both.
#[test]
fn a_consent_begun_on_one_node_finishes_on_another() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let Some(schema) = runtime.block_on(PgSchema::create()) else {
        eprintln!("DATABASE_URL unset: the two-node consent runs on PostgreSQL only");
        return;
    };
    let a = Delegating::start_on(&[], Some(&schema.url));
    let console_b = free_port();
    let b = node_with(
        a.upstream.port,
        console_b,
        free_port(),
        Some(&schema.url),
        "",
        REGISTERED,
        Some(a.console),
    );
    let (url, cookie) = a.begin(KEY_A);
    let back = a.consent_upstream(&url, "alice");
    let (status, body) = callback_at(console_b, &back, Some(&cookie));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("Connected"), "{body}");
    for served in [&a.served, &b] {
        let (session, _) = session(served, crate::serve::TENANT, "user-1");
        assert!(
            whoami(served, session)["content"]
                .to_string()
                .contains("alice")
        );
    }
}

/// A grant its authorization server revoked (here by a replayed code,
/// which revokes what the code gave) meets the 401 ladder: the refresh is
/// refused as `invalid_grant`, the grant ends, and the call answers
/// `tool.consent_required` rather than ending the session's use of the
/// server; after a new consent, the same session's next call is served.
#[test]
fn a_grant_revoked_upstream_asks_for_consent_again_in_the_same_session() {
    let node = Delegating::start(&[]);
    let (url, cookie) = node.begin(KEY_A);
    let back = node.consent_upstream(&url, "alice");
    assert_eq!(node.callback(&back, Some(&cookie)).0, 200);
    let (session, _) = node.session(crate::serve::TENANT, "user-1");
    assert!(
        node.whoami(session)["content"]
            .to_string()
            .contains("alice")
    );

    let code = back
        .split(['?', '&'])
        .find_map(|pair| pair.strip_prefix("code="))
        .unwrap()
        .to_owned();
    let basic = toolgate::domain::base64(CLIENT.as_bytes());
    let (status, _, _) = exchange(
        node.upstream.port,
        "POST",
        "/token",
        &[
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Authorization", &format!("Basic {basic}")),
        ],
        format!("grant_type=authorization_code&code={code}").as_bytes(),
    );
    assert_eq!(status, 400, "a replayed code, which revokes its grant");

    let revoked = node.whoami(session);
    assert_eq!(
        revoked["outcome"]["reason_code"], "tool.consent_required",
        "{revoked}"
    );
    assert!(node.grants().is_empty(), "the refused grant ended");
    assert!(
        node.redemptions()
            .contains(&"TOKEN refresh_token 400".to_owned()),
        "{:?}",
        node.redemptions()
    );
    node.consent(KEY_A, "alice");
    let again = node.whoami(session);
    assert!(again["content"].to_string().contains("alice"), "{again}");
}

/// Where a server names no registered client, toolgate is the client its
/// own Client ID Metadata Document describes (served at the consent pages'
/// `/consent/client.json`), at an authorization server that says it takes
/// one; it finds the server's resource metadata where the server's 401
/// says (not at a well-known URL); it refreshes and revokes the grant as
/// that same public client. An authorization server that takes no client
/// document is not asked at all: toolgate never registers itself.
#[test]
fn a_server_without_a_registered_client_is_asked_as_toolgates_client_document() {
    let node = Delegating::start_as(
        &[
            ("SCRIPTED_OAUTH_CIMD", "1".to_owned()),
            ("SCRIPTED_OAUTH_METADATA_PATH", "/meta/crm".to_owned()),
            // Every call refreshes (within the minute of its expiry).
            ("SCRIPTED_OAUTH_EXPIRES", "30".to_owned()),
        ],
        None,
        "",
        "",
    );
    let document_url = format!("http://127.0.0.1:{}/consent/client.json", node.console);
    let (status, head, body) = exchange(node.console, "GET", "/consent/client.json", &[], b"");
    assert_eq!(status, 200, "{head}");
    let document: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(document["client_id"], document_url.as_str(), "{document}");
    assert_eq!(
        document["redirect_uris"],
        json!([format!(
            "http://127.0.0.1:{}/consent/callback",
            node.console
        )])
    );
    assert_eq!(document["token_endpoint_auth_method"], "none");
    // A tenant's server may name no client either, where the document is
    // served where authorization servers fetch it (here, on loopback).
    let row = json!({"endpoint": format!("http://127.0.0.1:{}/mcp", node.upstream.port),
        "auth": {"scheme": "oauth2_user"},
        "side_effect": "external_read", "risk": "low", "idempotency": "read_only"});
    let (status, _, body) = crate::serve::http(
        &node.served.socket,
        "PUT",
        &format!("/v1/tenants/{}/mcp-servers/mine", crate::serve::TENANT),
        &[],
        Some(row.to_string().as_bytes()),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));

    let (url, cookie) = node.begin(KEY_A);
    assert!(
        url.contains(&format!("client_id={}", encode(&document_url))),
        "{url}"
    );
    let back = node.consent_upstream(&url, "alice");
    assert_eq!(
        node.logged("CIMD "),
        ["CIMD 200", "CIMD 200"],
        "fetched at the page and its post"
    );
    let (status, body) = node.callback(&back, Some(&cookie));
    assert_eq!(status, 200, "{body}");
    let (session, _) = node.session(crate::serve::TENANT, "user-1");
    for _ in 0..2 {
        let answer = node.whoami(session);
        assert!(answer["content"].to_string().contains("alice"), "{answer}");
    }
    // The code redeemed, then refreshed at every request, each as the
    // public client the grant was given to.
    let redemptions = node.redemptions();
    assert_eq!(redemptions[0], "TOKEN authorization_code 200");
    assert!(
        redemptions.len() >= 3
            && redemptions[1..]
                .iter()
                .all(|r| r == "TOKEN refresh_token 200"),
        "{redemptions:?}"
    );
    // The principal ends it on the consent page: revoked upstream too, as
    // the same public client.
    let (status, _, body) = node.submit(KEY_A, "crm", "revoke");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("revoked at the server"), "{body}");
    assert_eq!(
        node.logged("REVOKE "),
        [
            "REVOKE refresh_token revoked",
            "REVOKE access_token revoked"
        ]
    );
    let after = node.whoami(session);
    assert_eq!(
        after["outcome"]["reason_code"], "tool.consent_required",
        "{after}"
    );
    drop(node);

    // Without the document's support, nothing is asked of the server.
    let node = Delegating::start_as(&[], None, "", "");
    let (status, _, body) = node.submit(KEY_A, "crm", "connect");
    assert_eq!(status, 502, "{body}");
    assert!(
        body.contains("takes no client ID metadata document"),
        "{body}"
    );
    assert!(node.logged("CIMD ").is_empty() && node.redemptions().is_empty());
}
