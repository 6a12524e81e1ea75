//! The console's pages and decisions. Each page answers one operator
//! question from what the stores record; every value written into a page
//! goes through [`escape`] (or [`encode`] then [`escape`] in a link).

use std::fmt::Write as _;
use std::str::FromStr as _;

use hyper::StatusCode;
use uuid::Uuid;

use super::html::{Frame, encode, escape, json_block, short_id};
use super::{Console, ConsoleError, Fields, auth, html};
use crate::domain::{
    ApprovalStatus, HealthWindow, InvocationStatus, ReviewResolution, valid_identifier,
    valid_tenant_id,
};
use crate::edge::Reply;
use crate::ports::{
    Cursor, InvocationRecord, OperatorFilter, PageRequest, ReviewRecord, Revoked, StoreError,
};

/// The longest note a reviewer may leave, as over the control API.
const MAXIMUM_NOTE_BYTES: usize = 4096;

/// The sign-in page, with `problem` when a sign-in was refused.
pub(super) fn sign_in_page(status: StatusCode, problem: Option<&str>, next: Option<&str>) -> Reply {
    let problem = problem
        .map(|text| format!("<p class=\"error\">{}</p>", escape(text)))
        .unwrap_or_default();
    let next = next
        .filter(|next| local_path(next))
        .map(|next| {
            format!(
                "<input type=\"hidden\" name=\"next\" value=\"{}\">",
                escape(next)
            )
        })
        .unwrap_or_default();
    let body = format!(
        "<div class=\"signin\">{problem}\
         <form method=\"post\" action=\"/sign-in\">{next}\
         <label for=\"token\">Operator token</label>\
         <input type=\"password\" id=\"token\" name=\"token\" autocomplete=\"current-password\" required>\
         <p><button type=\"submit\" id=\"sign-in\">Sign in</button></p></form></div>"
    );
    html::html(status, html::page("Sign in", None, &body))
}

/// Whether `path` is a path of this console a sign-in may lead back to:
/// absolute, never `//` (another host), plain characters only.
pub(super) fn local_path(path: &str) -> bool {
    path.starts_with('/')
        && !path.starts_with("//")
        && path.len() <= 512
        && path
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'_' | b'.'))
}

/// The filter a list page was asked for; `statuses` are the spellings its
/// `status` takes.
fn filter(query: &Fields, statuses: &[&str]) -> Result<OperatorFilter, ConsoleError> {
    let tenant_id = query.get("tenant_id").map(str::to_owned);
    if tenant_id.as_deref().is_some_and(|t| !valid_tenant_id(t)) {
        return Err(ConsoleError::Invalid(
            "tenant_id must be 1 to 128 letters, digits, '-' or '_'",
        ));
    }
    let tool_name = query.get("tool_name").map(str::to_owned);
    if tool_name.as_deref().is_some_and(|t| !valid_identifier(t)) {
        return Err(ConsoleError::Invalid(
            "tool_name must be 1 to 256 bytes without control characters",
        ));
    }
    let status = query.get("status").map(str::to_owned);
    if status.as_deref().is_some_and(|s| !statuses.contains(&s)) {
        return Err(ConsoleError::Invalid("status is not one this list takes"));
    }
    Ok(OperatorFilter {
        tenant_id,
        tool_name,
        status,
        ..OperatorFilter::default()
    })
}

/// The page a list was asked for.
fn page_request(query: &Fields) -> Result<PageRequest, ConsoleError> {
    let after = query
        .get("cursor")
        .map(Cursor::decode)
        .transpose()
        .map_err(|_| ConsoleError::Invalid("cursor is not one a list returned"))?;
    Ok(PageRequest {
        after,
        ..PageRequest::default()
    })
}

/// The filter form of a list page, `status` the one listed (a list's
/// default shows as chosen); no status choice where the list has none, and
/// "any" only where no status is a choice (not where one is the default).
fn filter_form(
    action: &str,
    query: &Fields,
    statuses: &[&str],
    status: Option<&str>,
    any: bool,
    tool_label: &str,
) -> String {
    let value = |key| escape(query.get(key).unwrap_or_default());
    let mut options = if any {
        String::from("<option value=\"\">any</option>")
    } else {
        String::new()
    };
    for listed in statuses {
        let selected = if status == Some(listed) {
            " selected"
        } else {
            ""
        };
        let _ = write!(
            options,
            "<option value=\"{s}\"{selected}>{s}</option>",
            s = escape(listed)
        );
    }
    let choice = if statuses.is_empty() {
        String::new()
    } else {
        format!("<label>Status <select name=\"status\">{options}</select></label>")
    };
    format!(
        "<form class=\"filters\" method=\"get\" action=\"{action}\">\
         <label>Tenant <input name=\"tenant_id\" value=\"{tenant}\"></label>\
         <label>{tool_label} <input name=\"tool_name\" value=\"{tool}\"></label>\
         {choice}<button type=\"submit\">Filter</button></form>",
        tenant = value("tenant_id"),
        tool = value("tool_name"),
    )
}

/// A "next page" link keeping the filters, when more rows follow.
fn next_link(action: &str, query: &Fields, next: Option<Cursor>) -> String {
    let Some(next) = next else {
        return String::new();
    };
    let mut href = format!("{action}?cursor={}", encode(&next.to_string()));
    for key in ["tenant_id", "tool_name", "status"] {
        if let Some(value) = query.get(key) {
            let _ = write!(href, "&{key}={}", encode(value));
        }
    }
    format!(
        "<p><a id=\"next\" href=\"{}\">Next page</a></p>",
        escape(&href)
    )
}

fn time(at: Option<chrono::DateTime<chrono::Utc>>) -> String {
    at.map(|at| escape(&at.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string()))
        .unwrap_or_else(|| "<span class=\"muted\">—</span>".to_owned())
}

fn status_cell(status: &str) -> String {
    format!("<span class=\"status-{s}\">{s}</span>", s = escape(status))
}

fn invocation_link(row: &InvocationRecord) -> String {
    call_link(row.identity.id)
}

/// A link to a call's story, its id short.
fn call_link(id: Uuid) -> String {
    format!("<a href=\"/invocations/{id}\">{}</a>", short_id(id))
}

/// What a decision just did, said on the page it led to; an id that does
/// not parse says nothing.
fn confirmation(query: &Fields, key: &str, say: impl FnOnce(Uuid) -> String) -> String {
    query
        .get(key)
        .and_then(|id| id.parse::<Uuid>().ok())
        .map(|id| format!("<p class=\"notice\" id=\"confirmation\">{}</p>", say(id)))
        .unwrap_or_default()
}

/// A hidden CSRF field.
fn csrf_field(frame: &Frame<'_>) -> String {
    format!(
        "<input type=\"hidden\" name=\"csrf\" value=\"{}\">",
        escape(frame.csrf)
    )
}

impl Console {
    /// `GET /review`: UNCERTAIN calls, each with what a reviewer needs to
    /// find out whether its effect happened, and the form to say so;
    /// resolved ones with their resolution.
    pub(super) async fn review_page(
        &self,
        frame: &Frame<'_>,
        query: &Fields,
    ) -> Result<String, ConsoleError> {
        let statuses = ["pending", "resolved"];
        let mut filter = filter(query, &statuses)?;
        if filter.status.is_none() {
            filter.status = Some("pending".into());
        }
        let page = self
            .parts
            .operator
            .list_review_items(&filter, page_request(query)?)
            .await?;
        let mut body = filter_form(
            "/review",
            query,
            &statuses,
            filter.status.as_deref(),
            false,
            "Tool",
        );
        body.push_str(&confirmation(query, "resolved", |id| {
            format!(
                "Resolved: {}. It stays listed under resolved, with your name and note.",
                call_link(id)
            )
        }));
        body.push_str(
            "<p class=\"muted\">Each row is a call whose effect may have happened: toolgate \
             sent it and never heard how it ended. Find out in the remote system, then say \
             what you found.</p>",
        );
        if page.items.is_empty() {
            body.push_str("<p id=\"empty\">Nothing here.</p>");
        } else {
            body.push_str(
                "<table id=\"review\"><tr><th>Call</th><th>Tool and classification</th>\
                 <th>Arguments</th><th>Sent (watermark)</th><th>Resolution</th></tr>",
            );
            for item in &page.items {
                let row = &item.invocation;
                let decision = match &item.resolution {
                    Some(resolution) => format!(
                        "<span class=\"resolution\">{}</span><br>by {}<br>{}<br>{}",
                        escape(resolution.resolution.as_str()),
                        escape(&resolution.resolver),
                        time(Some(resolution.resolved_at)),
                        resolution
                            .note
                            .as_deref()
                            .map(|note| format!("<q>{}</q>", escape(note)))
                            .unwrap_or_default(),
                    ),
                    None => format!(
                        "<form class=\"decide\" method=\"post\" action=\"/review/{tenant}/{id}\">{csrf}\
                         <label><input type=\"radio\" name=\"resolution\" value=\"effect_applied\" required> \
                         applied (the effect happened)</label>\
                         <label><input type=\"radio\" name=\"resolution\" value=\"effect_not_applied\"> \
                         not applied</label>\
                         <textarea name=\"note\" maxlength=\"4096\" placeholder=\"What you found\"></textarea>\
                         <button type=\"submit\">Resolve</button></form>",
                        tenant = encode(&row.identity.tenant_id),
                        id = row.identity.id,
                        csrf = csrf_field(frame),
                    ),
                };
                let _ = write!(
                    body,
                    "<tr class=\"review-item\" data-invocation=\"{id}\"><td>{link}<br>tenant {tenant}<br>\
                     run {run} step {step}<br>{reason}</td>\
                     <td><span class=\"tool\">{tool}</span><br>server {server}<br>{effect}, {class}</td>\
                     <td>{arguments}</td><td>{sent}<br>attempt {attempt}</td><td>{decision}</td></tr>",
                    id = row.identity.id,
                    link = invocation_link(row),
                    tenant = escape(&row.identity.tenant_id),
                    run = short_id(row.identity.run_id),
                    step = row.identity.step_number,
                    reason = row
                        .reason_code
                        .map(|code| escape(code.as_str()))
                        .unwrap_or_default(),
                    tool = escape(&row.identity.tool_name),
                    server = escape(row.identity.server_id.as_deref().unwrap_or("builtin")),
                    effect = escape(row.identity.side_effect.as_str()),
                    class = escape(row.identity.idempotency_class.as_str()),
                    arguments = json_block(&row.identity.arguments),
                    sent = time(row.effect_sent_at),
                    attempt = row.attempt_number,
                );
            }
            body.push_str("</table>");
        }
        body.push_str(&next_link("/review", query, page.next_cursor));
        Ok(body)
    }

    /// `POST /review/{tenant}/{id}`: the reviewer's verdict, recorded as
    /// the control API records it.
    pub(super) async fn resolve(
        &self,
        session: &auth::Session,
        tenant: &str,
        id: &str,
        form: &Fields,
    ) -> Result<Reply, ConsoleError> {
        let invocation_id: Uuid = id.parse().map_err(|_| ConsoleError::NotFound)?;
        if !valid_tenant_id(tenant) {
            return Err(ConsoleError::NotFound);
        }
        let resolution = form
            .get("resolution")
            .and_then(|text| ReviewResolution::from_str(text).ok())
            .ok_or(ConsoleError::Invalid(
                "resolution must be effect_applied or effect_not_applied",
            ))?;
        let note = form.get("note").map(str::to_owned);
        if note.as_ref().is_some_and(|n| n.len() > MAXIMUM_NOTE_BYTES) {
            return Err(ConsoleError::Invalid("a note is at most 4 KiB"));
        }
        let review = ReviewRecord {
            invocation_id,
            resolution,
            resolver: session.operator.clone(),
            note,
            resolved_at: self.parts.clock.now(),
        };
        if !self.parts.reviews.resolve_review(tenant, &review).await? {
            return Err(ConsoleError::Conflict(
                "no unresolved uncertain invocation has this id",
            ));
        }
        tracing::info!(
            operator = %session.operator,
            invocation_id = %invocation_id,
            resolution = resolution.as_str(),
            "review item resolved in the console"
        );
        Ok(html::see_other(&format!(
            "/review?status=resolved&resolved={invocation_id}"
        )))
    }

    /// `GET /approvals`: held calls with the arguments the approver is
    /// asked to allow, and the decided ones with who decided.
    pub(super) async fn approvals_page(
        &self,
        frame: &Frame<'_>,
        query: &Fields,
    ) -> Result<String, ConsoleError> {
        let statuses = ["pending", "approved", "denied", "expired"];
        let mut filter = filter(query, &statuses)?;
        if filter.status.is_none() {
            filter.status = Some("pending".into());
        }
        let page = self
            .parts
            .operator
            .list_approvals(&filter, page_request(query)?)
            .await?;
        let mut body = filter_form(
            "/approvals",
            query,
            &statuses,
            filter.status.as_deref(),
            false,
            "Tool",
        );
        if let Some(status) = filter.status.as_deref().filter(|s| *s != "pending") {
            body.push_str(&confirmation(query, "decided", |id| {
                format!(
                    "Approval {} {status}. A call held for it goes on at once; one no longer held goes on when its caller asks for it again.",
                    short_id(id)
                )
            }));
        }
        if page.items.is_empty() {
            body.push_str("<p id=\"empty\">Nothing here.</p>");
        } else {
            body.push_str(
                "<table id=\"approvals\"><tr><th>Call</th><th>Tool</th><th>Arguments</th>\
                 <th>Requested</th><th>Decision</th></tr>",
            );
            for item in &page.items {
                let decision = if item.status == ApprovalStatus::Pending {
                    format!(
                        "<form class=\"decide\" method=\"post\" action=\"/approvals/{tenant}/{id}\">{csrf}\
                         <button type=\"submit\" name=\"decision\" value=\"approve\">Approve</button>\
                         <button type=\"submit\" name=\"decision\" value=\"deny\">Deny</button></form>",
                        tenant = encode(&item.tenant_id),
                        id = item.approval_id,
                        csrf = csrf_field(frame),
                    )
                } else {
                    format!(
                        "{}<br>by {}<br>{}",
                        status_cell(item.status.as_str()),
                        escape(item.approver.as_deref().unwrap_or("—")),
                        time(item.decided_at),
                    )
                };
                let _ = write!(
                    body,
                    "<tr class=\"approval\" data-approval=\"{approval}\"><td>\
                     {invocation}<br>tenant {tenant}<br>\
                     principal {principal}<br>run {run} step {step}<br>{turn}</td>\
                     <td><span class=\"tool\">{tool}</span><br>{effect}, {class}<br>origin {trust}<br>\
                     why: {reason}</td><td>{arguments}</td>\
                     <td>{requested}<br>hold ends {hold}</td><td>{decision}</td></tr>",
                    approval = item.approval_id,
                    invocation = call_link(item.invocation_id),
                    tenant = escape(&item.tenant_id),
                    principal = escape(&item.principal.id),
                    run = short_id(item.run_id),
                    step = item.step_number,
                    turn = item
                        .turn_id
                        .map(|turn| format!("turn {}", short_id(turn)))
                        .unwrap_or_default(),
                    tool = escape(&item.tool_name),
                    effect = escape(item.side_effect.as_str()),
                    class = escape(item.idempotency_class.as_str()),
                    trust = escape(item.origin_trust.as_str()),
                    reason = escape(item.reason_code.as_str()),
                    arguments = json_block(&item.arguments),
                    requested = time(Some(item.requested_at)),
                    hold = time(item.hold_ends_at),
                );
            }
            body.push_str("</table>");
        }
        body.push_str(&next_link("/approvals", query, page.next_cursor));
        Ok(body)
    }

    /// `GET /approvals/{tenant}/{id}`: one approval, the page a held call's
    /// client sends its user to (URL-mode elicitation): the call it would
    /// allow, with its arguments, and while pending the decision.
    pub(super) async fn approval_page(
        &self,
        frame: &Frame<'_>,
        tenant: &str,
        id: &str,
    ) -> Result<String, ConsoleError> {
        let id: Uuid = id.parse().map_err(|_| ConsoleError::NotFound)?;
        if !valid_tenant_id(tenant) {
            return Err(ConsoleError::NotFound);
        }
        let approval = self
            .parts
            .approvals
            .approval(tenant, id)
            .await?
            .ok_or(ConsoleError::NotFound)?;
        let story = self
            .parts
            .operator
            .invocation_with_events(approval.invocation_id)
            .await?
            .filter(|story| story.invocation.identity.tenant_id == tenant)
            .ok_or(ConsoleError::NotFound)?;
        let row = &story.invocation;
        let decision = if approval.status == ApprovalStatus::Pending {
            format!(
                "<form class=\"decide\" method=\"post\" action=\"/approvals/{tenant}/{id}\">{csrf}\
                 <button type=\"submit\" name=\"decision\" value=\"approve\">Approve</button>\
                 <button type=\"submit\" name=\"decision\" value=\"deny\">Deny</button></form>",
                tenant = encode(tenant),
                csrf = csrf_field(frame),
            )
        } else {
            format!(
                "{} by {} {}",
                status_cell(approval.status.as_str()),
                escape(approval.approver.as_deref().unwrap_or("—")),
                time(approval.decided_at),
            )
        };
        let mut body = String::new();
        let _ = write!(
            body,
            "<table id=\"approval\" data-approval=\"{id}\">\
             <tr><th>Call</th><td><a href=\"/invocations/{invocation}\">{invocation}</a></td></tr>\
             <tr><th>Tenant</th><td>{tenant}</td></tr>\
             <tr><th>Principal</th><td>{principal}</td></tr>\
             <tr><th>Tool</th><td class=\"tool\">{tool}</td></tr>\
             <tr><th>Classification</th><td>{effect}, {class}</td></tr>\
             <tr><th>Origin</th><td>{trust}</td></tr>\
             <tr><th>Why</th><td>{reason}</td></tr>\
             <tr><th>Arguments</th><td>{arguments}</td></tr>\
             <tr><th>Requested</th><td>{requested}</td></tr>\
             <tr><th>Decision</th><td>{decision}</td></tr></table>",
            invocation = row.identity.id,
            tenant = escape(tenant),
            principal = escape(&row.identity.principal.id),
            tool = escape(&row.identity.tool_name),
            effect = escape(row.identity.side_effect.as_str()),
            class = escape(row.identity.idempotency_class.as_str()),
            trust = escape(row.identity.origin_trust.as_str()),
            reason = escape(approval.reason_code.as_str()),
            arguments = json_block(&row.identity.arguments),
            requested = time(Some(approval.requested_at)),
        );
        Ok(body)
    }

    /// `POST /approvals/{tenant}/{id}`: approve or deny, waking whoever
    /// holds the call, as the control API decides.
    pub(super) async fn decide(
        &self,
        session: &auth::Session,
        tenant: &str,
        id: &str,
        form: &Fields,
    ) -> Result<Reply, ConsoleError> {
        let id: Uuid = id.parse().map_err(|_| ConsoleError::NotFound)?;
        if !valid_tenant_id(tenant) {
            return Err(ConsoleError::NotFound);
        }
        let status = match form.get("decision") {
            Some("approve") => ApprovalStatus::Approved,
            Some("deny") => ApprovalStatus::Denied,
            _ => return Err(ConsoleError::Invalid("decision must be approve or deny")),
        };
        let decided = self
            .parts
            .approvals
            .decide(tenant, id, status, &session.operator)
            .await?;
        if decided.is_none() {
            return Err(ConsoleError::Conflict("no pending approval has this id"));
        }
        tracing::info!(
            operator = %session.operator,
            approval_id = %id,
            decision = status.as_str(),
            "approval decided in the console"
        );
        Ok(html::see_other(&format!(
            "/approvals?status={}&decided={id}",
            status.as_str()
        )))
    }

    /// `GET /grants?tenant_id=T`: the tenant's `oauth2_user` grants (who,
    /// which server, when; never a token), each with its End button.
    pub(super) async fn grants_page(
        &self,
        frame: &html::Frame<'_>,
        query: &Fields,
    ) -> Result<String, ConsoleError> {
        let mut body = String::from(
            "<form method=\"get\" action=\"/grants\" class=\"filters\">\
             <label for=\"tenant_id\">Tenant</label>",
        );
        let tenant = query.get("tenant_id");
        let _ = write!(
            body,
            "<input type=\"text\" id=\"tenant_id\" name=\"tenant_id\" value=\"{}\" required>\
             <button type=\"submit\">Show</button></form>",
            escape(tenant.unwrap_or_default())
        );
        let Some(tenant) = tenant else {
            body.push_str("<p class=\"muted\">Grants are a tenant's: name one.</p>");
            return Ok(body);
        };
        if !valid_tenant_id(tenant) {
            return Err(ConsoleError::Invalid(
                "tenant_id must be 1 to 128 letters, digits, '-' or '_'",
            ));
        }
        if let Some(ended) = query.get("ended") {
            let _ = write!(body, "<p id=\"ended\">Ended: {}.</p>", escape(ended));
        }
        let grants = self.parts.grants.grants(tenant).await?;
        body.push_str(
            "<table id=\"grants\"><tr><th>Principal</th><th>Server</th><th>Issuer</th>\
             <th>Scopes</th><th>Granted</th><th>Last used</th><th></th></tr>",
        );
        for grant in grants.iter().take(1_000) {
            let _ = write!(
                body,
                "<tr class=\"grant\" data-principal=\"{principal}\" data-server=\"{server}\">\
                 <td>{principal}</td><td>{server}</td><td>{issuer}</td><td>{scopes}</td>\
                 <td>{granted}</td><td>{used}</td><td>\
                 <form method=\"post\" action=\"/grants/{tenant_path}/{server}\">\
                 <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
                 <input type=\"hidden\" name=\"principal\" value=\"{principal}\">\
                 <button type=\"submit\">End</button></form></td></tr>",
                principal = escape(&grant.principal_id),
                server = escape(&grant.server_id),
                issuer = escape(&grant.issuer),
                scopes = escape(&grant.scopes.join(" ")),
                granted = time(Some(grant.granted_at)),
                used = time(grant.last_used_at),
                tenant_path = escape(tenant),
                csrf = escape(frame.csrf),
            );
        }
        body.push_str("</table>");
        if grants.is_empty() {
            body.push_str("<p class=\"muted\">No grants.</p>");
        }
        Ok(body)
    }

    /// `POST /grants/{tenant}/{server}`: ends the principal's grant; its
    /// next call asks for consent again.
    pub(super) async fn end_grant(
        &self,
        session: &auth::Session,
        tenant: &str,
        server: &str,
        form: &Fields,
    ) -> Result<Reply, ConsoleError> {
        if !valid_tenant_id(tenant) {
            return Err(ConsoleError::NotFound);
        }
        let principal = form
            .get("principal")
            .ok_or(ConsoleError::Invalid("principal is required"))?;
        let upstream = match self
            .parts
            .revocation
            .end_grant(tenant, principal, server)
            .await
        {
            Ok(Revoked::Ended { upstream }) => upstream,
            Ok(Revoked::NotHeld) => {
                return Err(ConsoleError::Conflict(
                    "no grant of that principal at that server",
                ));
            }
            Err(error) => return Err(StoreError::Unavailable(error.to_string()).into()),
        };
        tracing::info!(
            operator = %session.operator,
            tenant = %tenant,
            principal = %principal,
            server = %server,
            "grant ended in the console"
        );
        let ended = if upstream {
            format!("{principal} at {server}, revoked at its authorization server")
        } else {
            format!("{principal} at {server}")
        };
        Ok(html::see_other(&format!(
            "/grants?tenant_id={}&ended={}",
            html::encode(tenant),
            html::encode(&ended)
        )))
    }

    /// `GET /invocations`: every recorded call, newest first, filtered.
    pub(super) async fn invocations_page(&self, query: &Fields) -> Result<String, ConsoleError> {
        let statuses: Vec<&str> = [
            InvocationStatus::Authorized,
            InvocationStatus::WaitingForApproval,
            InvocationStatus::Running,
            InvocationStatus::Succeeded,
            InvocationStatus::Failed,
            InvocationStatus::Denied,
            InvocationStatus::Uncertain,
        ]
        .iter()
        .map(|status| status.as_str())
        .collect();
        let filter = filter(query, &statuses)?;
        let page = self
            .parts
            .operator
            .list_invocations(&filter, page_request(query)?)
            .await?;
        let mut body = filter_form(
            "/invocations",
            query,
            &statuses,
            filter.status.as_deref(),
            true,
            "Tool",
        );
        if page.items.is_empty() {
            body.push_str("<p id=\"empty\">Nothing here.</p>");
        } else {
            body.push_str(
                "<table id=\"invocations\"><tr><th>Invocation</th><th>Tenant</th><th>Tool</th>\
                 <th>Status</th><th>Reason</th><th>Created</th><th>Run / step</th></tr>",
            );
            for row in &page.items {
                let _ = write!(
                    body,
                    "<tr><td>{link}</td><td>{tenant}</td><td class=\"tool\">{tool}</td>\
                     <td>{status}</td><td>{reason}</td><td>{created}</td><td>{run} / {step}</td></tr>",
                    link = invocation_link(row),
                    tenant = escape(&row.identity.tenant_id),
                    tool = escape(&row.identity.tool_name),
                    status = status_cell(row.status().as_str()),
                    reason = row
                        .reason_code
                        .map(|code| escape(code.as_str()))
                        .unwrap_or_default(),
                    created = time(Some(row.created_at)),
                    run = short_id(row.identity.run_id),
                    step = row.identity.step_number,
                );
            }
            body.push_str("</table>");
        }
        body.push_str(&next_link("/invocations", query, page.next_cursor));
        Ok(body)
    }

    /// `GET /invocations/{id}`: one call's story — the row, its attempts,
    /// its outcome and artifact, and every event that names it.
    pub(super) async fn story_page(&self, id: &str) -> Result<String, ConsoleError> {
        let id: Uuid = id.parse().map_err(|_| ConsoleError::NotFound)?;
        let story = self
            .parts
            .operator
            .invocation_with_events(id)
            .await?
            .ok_or(ConsoleError::NotFound)?;
        let row = &story.invocation;
        let mut body = String::new();
        let _ = write!(
            body,
            "<table id=\"story\">\
             <tr><th>Invocation</th><td>{id}</td></tr>\
             <tr><th>Tenant</th><td>{tenant}</td></tr>\
             <tr><th>Tool</th><td class=\"tool\">{tool} {version} ({source}, server {server})</td></tr>\
             <tr><th>Classification</th><td>{effect}, {class}</td></tr>\
             <tr><th>Trust</th><td>origin {origin}, arguments {argument_trust}</td></tr>\
             <tr><th>Principal</th><td>{principal}</td></tr>\
             <tr><th>Run / step / call</th><td>{run} / {step} / {call}</td></tr>\
             <tr><th>Status</th><td>{status} {reason}</td></tr>\
             <tr><th>Arguments</th><td>{arguments}</td></tr>\
             <tr><th>Idempotency key</th><td>{key}</td></tr>\
             <tr><th>Created</th><td>{created}</td></tr>\
             <tr><th>Started</th><td>{started}</td></tr>\
             <tr><th>Effect sent (watermark)</th><td>{sent}</td></tr>\
             <tr><th>Attempts</th><td>attempt {attempt}, lease epoch {epoch}</td></tr>",
            id = row.identity.id,
            tenant = escape(&row.identity.tenant_id),
            tool = escape(&row.identity.tool_name),
            version = escape(&row.identity.tool_version),
            source = escape(row.identity.tool_source.as_str()),
            server = escape(row.identity.server_id.as_deref().unwrap_or("—")),
            effect = escape(row.identity.side_effect.as_str()),
            class = escape(row.identity.idempotency_class.as_str()),
            origin = escape(row.identity.origin_trust.as_str()),
            argument_trust =
                json_block(&serde_json::to_value(&row.identity.argument_trust).unwrap_or_default()),
            principal = escape(&row.identity.principal.id),
            run = row.identity.run_id,
            step = row.identity.step_number,
            call = escape(&row.identity.call_id),
            status = status_cell(row.status().as_str()),
            reason = row
                .reason_code
                .map(|code| escape(code.as_str()))
                .unwrap_or_default(),
            arguments = json_block(&row.identity.arguments),
            key = escape(&row.identity.idempotency_key),
            created = time(Some(row.created_at)),
            started = time(row.started_at),
            sent = time(row.effect_sent_at),
            attempt = row.attempt_number,
            epoch = row.lease_epoch,
        );
        if let Some(ended) = row.ended() {
            let _ = write!(
                body,
                "<tr><th>Outcome</th><td>{outcome}, completed {completed}</td></tr>\
                 <tr><th>Result</th><td>{result}</td></tr>\
                 <tr><th>Error</th><td>{error}</td></tr>\
                 <tr><th>Output</th><td>{bytes} bytes{truncated}</td></tr>\
                 <tr><th>Artifact</th><td>{artifact}</td></tr>",
                outcome = escape(ended.outcome_status.as_str()),
                completed = time(Some(ended.completed_at)),
                result = ended.result.as_ref().map(json_block).unwrap_or_default(),
                error = ended.error.as_ref().map(json_block).unwrap_or_default(),
                bytes = ended.output_bytes.unwrap_or(0),
                truncated = if ended.truncated { ", excerpted" } else { "" },
                artifact = ended
                    .artifact_id
                    .map(|artifact| artifact.to_string())
                    .unwrap_or_else(|| "none".into()),
            );
        }
        body.push_str("</table><h2>Events</h2>");
        if story.events.is_empty() {
            body.push_str("<p>No events.</p>");
        } else {
            body.push_str(
                "<table id=\"events\"><tr><th>#</th><th>Event</th><th>At</th><th>Payload</th></tr>",
            );
            for event in &story.events {
                let _ = write!(
                    body,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    event.id,
                    escape(&event.event_type),
                    time(Some(event.created_at)),
                    json_block(&event.payload),
                );
            }
            body.push_str("</table>");
        }
        Ok(body)
    }

    /// `GET /servers`: the operator's and tenants' servers with how their
    /// last connection went, and each catalog generation with what a later
    /// one withdrew.
    pub(super) async fn servers_page(&self, query: &Fields) -> Result<String, ConsoleError> {
        let filter = filter(query, &[])?;
        let servers = self
            .parts
            .operator
            .list_servers(&filter, page_request(query)?)
            .await?;
        let generations = self
            .parts
            .operator
            .list_catalog_generations(&filter, PageRequest::default())
            .await?;
        let mut body = filter_form("/servers", query, &[], None, false, "Server id");
        body.push_str(
            "<table id=\"servers\"><tr><th>Server</th><th>Tenant</th><th>Whose</th>\
             <th>Transport</th><th>Now (this node)</th><th>Last connection</th></tr>",
        );
        for item in &servers.items {
            let last = match &item.last_connection {
                Some(last) => format!(
                    "{} {}<br>{}",
                    escape(&last.event_type),
                    last.reason_code
                        .as_deref()
                        .map(|code| format!("<strong>{}</strong>", escape(code)))
                        .unwrap_or_default(),
                    time(Some(last.at)),
                ),
                None => "<span class=\"muted\">not connected yet</span>".into(),
            };
            let now = match self
                .parts
                .servers
                .connected_now(&item.tenant_id, &item.server.server_id)
                .await
            {
                Some(true) => "<span class=\"now up\" data-now=\"connected\">connected</span>",
                Some(false) => {
                    "<span class=\"now down\" data-now=\"not_connected\">not connected</span>"
                }
                None => {
                    "<span class=\"now muted\" data-now=\"not_open\">not open on this node</span>"
                }
            };
            let _ = write!(
                body,
                "<tr class=\"server\" data-server=\"{server}\"><td>{server}<br><span class=\"muted\">{endpoint}</span></td><td>{tenant}</td>\
                 <td>{whose}</td><td>{transport}</td><td>{now}</td><td>{last}</td></tr>",
                server = escape(&item.server.server_id),
                endpoint = escape(&item.server.endpoint),
                tenant = escape(&item.tenant_id),
                whose = if item.tenant_configured {
                    "tenant's"
                } else {
                    "operator's"
                },
                transport = escape(item.server.transport.as_str()),
            );
        }
        body.push_str("</table>");
        body.push_str(&next_link("/servers", query, servers.next_cursor));
        body.push_str(
            "<h2>Catalog generations</h2><table id=\"generations\"><tr><th>Server</th>\
             <th>Tenant</th><th>Discovered</th><th>Hash</th><th>Tools</th><th>Withdrawn later</th></tr>",
        );
        for generation in &generations.items {
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
                escape(&generation.server_id),
                escape(&generation.tenant_id),
                time(Some(generation.discovered_at)),
                escape(&generation.catalog_hash),
                escape(&generation.tools.join(", ")),
                escape(&generation.withdrawn.join(", ")),
            );
        }
        body.push_str("</table>");
        Ok(body)
    }

    /// `GET /health`: per tool over the last hour and day, from the rows
    /// (so every node's calls, across restarts).
    pub(super) async fn health_page(&self, query: &Fields) -> Result<String, ConsoleError> {
        let filter = filter(query, &[])?;
        let now = self.parts.clock.now();
        let since = |window: HealthWindow| now - chrono::Duration::seconds(window.seconds());
        let day = self
            .parts
            .operator
            .tool_health(&filter, since(HealthWindow::Day))
            .await?;
        let hour = self
            .parts
            .operator
            .tool_health(&filter, since(HealthWindow::Hour))
            .await?;
        let mut body = filter_form("/health", query, &[], None, false, "Tool");
        body.push_str(
            "<table id=\"health\"><tr><th>Tool</th><th>Calls (hour / day)</th>\
             <th>Failures by reason (day)</th><th>p50 / p99 (day)</th>\
             <th>Uncertain (hour / day)</th></tr>",
        );
        let milliseconds = |value: Option<f64>| {
            value
                .map(|ms| format!("{ms:.0} ms"))
                .unwrap_or_else(|| "—".into())
        };
        for tool in &day {
            let in_hour = hour.iter().find(|h| h.tool_name == tool.tool_name);
            let failures: Vec<String> = tool
                .failures
                .iter()
                .map(|(code, count)| format!("{} {count}", escape(code)))
                .collect();
            let _ = write!(
                body,
                "<tr><td class=\"tool\">{tool_name}</td><td>{hour_calls} / {calls}</td>\
                 <td>{failures}</td><td>{p50} / {p99}</td><td>{hour_uncertain} / {uncertain}</td></tr>",
                tool_name = escape(&tool.tool_name),
                hour_calls = in_hour.map_or(0, |h| h.calls),
                calls = tool.calls,
                failures = failures.join("<br>"),
                p50 = milliseconds(tool.p50_ms),
                p99 = milliseconds(tool.p99_ms),
                hour_uncertain = in_hour.map_or(0, |h| h.uncertain),
                uncertain = tool.uncertain,
            );
        }
        body.push_str("</table>");
        Ok(body)
    }
}
