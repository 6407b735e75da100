//! The tenant side of a client request: 401 without a valid key (auth on), 429 past a tenant
//! limit, and the tenant's usage once the request is answered.

use pingora::Result;
use pingora_proxy::Session;

use super::access_log::{AccessLog, Arrival};
use super::respond;
use crate::fleet::Fleet;
use crate::protocol::{self, ErrorCode, Family};
use crate::routing::RouteRequest;
use crate::services::now_ms;
use crate::tenant::{auth, Pass};

/// Tenant label for requests that presented no valid key.
pub const UNAUTHENTICATED: &str = "unauthenticated";

/// The request's tenant, or the 401 already answered (`None`), before any body is read.
pub async fn authenticate(
    fleet: &Fleet,
    session: &mut Session,
    log: &AccessLog,
    arrival: &mut Arrival,
    family: Family,
) -> Result<Option<String>> {
    let config = fleet.config();
    match auth::identify(&config.tenancy, session.req_header()) {
        Ok(t) => {
            if config.tenancy.auth_enabled() {
                // The access log names the tenant, never the key or its digest.
                arrival.tenant = t.to_string();
            }
            Ok(Some(t.to_string()))
        }
        Err(msg) => {
            arrival.tenant = UNAUTHENTICATED.into();
            let code = ErrorCode::Unauthorized;
            let body = protocol::error_body(family, code, &msg);
            super::handle::record_local(arrival.protocol, code);
            crate::tenant::record_refused(UNAUTHENTICATED, code.status(), code.as_str());
            log.write(|| arrival.local(code, body.len()));
            session.set_keepalive(None);
            respond::json(session, code.status(), body, None).await?;
            Ok(None)
        }
    }
}

/// Admit the request under its tenant's limits, or answer 429 (`None`).
pub async fn admit(
    fleet: &Fleet,
    session: &mut Session,
    log: &AccessLog,
    arrival: &Arrival,
    family: Family,
    tenant: &str,
    req: &RouteRequest,
) -> Result<Option<Pass>> {
    let config = fleet.config();
    let tokens = estimated_tokens(req, config.routing.default_output_reserve);
    match fleet
        .tenants
        .admit(&config.tenancy, tenant, tokens, now_ms())
    {
        Ok(pass) => Ok(Some(pass)),
        Err(r) => {
            let code = ErrorCode::QueueFull;
            let body = protocol::error_body(family, code, &r.message);
            super::handle::record_local(arrival.protocol, code);
            crate::tenant::record_refused(tenant, code.status(), code.as_str());
            log.write(|| arrival.local(code, body.len()));
            let retry = u32::try_from(r.retry_after_s).unwrap_or(u32::MAX);
            respond::json_with(session, code.status(), body, Some(retry), &r.headers).await?;
            Ok(None)
        }
    }
}

/// Prompt estimate plus the output the request may produce.
pub fn estimated_tokens(req: &RouteRequest, default_output: u32) -> u64 {
    u64::from(req.prompt_tokens) + u64::from(req.max_output_tokens.unwrap_or(default_output))
}

/// Count an answered request for its tenant: node-reported usage when present, else the
/// prompt estimate (and no completion tokens).
pub fn record(
    pass: &Pass,
    status: u16,
    code: Option<ErrorCode>,
    req: &RouteRequest,
    usage: Option<(Option<u32>, Option<u32>)>,
) {
    let (prompt, completion) = usage.unwrap_or((None, None));
    let prompt = prompt.unwrap_or(req.prompt_tokens);
    pass.record(
        status,
        code.map(ErrorCode::as_str),
        u64::from(prompt),
        u64::from(completion.unwrap_or(0)),
    );
}

/// Count a proxied request for its tenant once it is answered.
pub fn record_dispatch(pass: &Pass, d: &super::dispatch::Dispatch, req: &RouteRequest) {
    let (status, code, usage) = {
        let mut st = d.state.lock();
        let o = st.observer.finish();
        (
            st.status.unwrap_or(502),
            st.code,
            (o.prompt_tokens, o.output_tokens()),
        )
    };
    record(pass, status, code, req, Some(usage));
}

/// Record a request the gateway answered itself after admission (no node processed it).
pub fn record_local(pass: &Pass, code: ErrorCode, req: &RouteRequest) {
    record(
        pass,
        code.status(),
        Some(code),
        req,
        Some((Some(0), Some(0))),
    );
}
