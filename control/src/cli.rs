//! `portcullis admin …`: the common admin actions from a shell, through the admin API over
//! HTTP (so the CLI works against any replica and every change is validated and audited the
//! same way), with readable tables.
//!
//! ```text
//! export PORTCULLIS_ADMIN_TOKEN=…
//! portcullis admin tenant add acme --rate 100 --per 1s --burst 200 --daily 100000
//! portcullis admin tenant list
//! portcullis admin key issue acme
//! portcullis admin key revoke acme 7
//! portcullis admin quota set acme --burst 50 --daily none
//! portcullis admin quota set acme --route /orders --rate 5 --burst 5
//! portcullis admin usage acme
//! portcullis admin upstreams
//! ```

mod output;

use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::ENV_ADMIN_TOKEN;
use output::{print_keys, print_quota, print_tenants, print_upstreams, print_usage, text};

/// Default admin API address (the default `server.admin_listen`).
pub const DEFAULT_URL: &str = "http://127.0.0.1:8081";
/// Each request's time limit.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// `portcullis admin` arguments.
#[derive(Debug, clap::Args)]
pub struct AdminArgs {
    /// Base URL of the admin listener.
    #[arg(long, default_value = DEFAULT_URL)]
    pub url: String,
    /// Name recorded in the audit log next to `admin-token` (X-Admin-Actor).
    #[arg(long)]
    pub actor: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: AdminCommand,
}

/// Admin actions.
#[derive(Debug, clap::Subcommand)]
pub enum AdminCommand {
    /// Tenants.
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// API keys.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Quotas.
    #[command(subcommand)]
    Quota(QuotaCommand),
    /// A tenant's current usage (buckets, periods, 429s), read without consuming.
    Usage {
        /// Tenant id.
        tenant: String,
    },
    /// Upstreams and their endpoints' health (state, ejections, in-flight, breaker).
    Upstreams,
}

/// `portcullis admin tenant …`.
#[derive(Debug, clap::Subcommand)]
pub enum TenantCommand {
    /// Create a tenant.
    Add {
        /// Tenant id (1–64 of [A-Za-z0-9._-]).
        id: String,
        /// Display name.
        #[arg(long)]
        name: Option<String>,
        /// Tokens per period.
        #[arg(long)]
        rate: u64,
        /// Bucket period, e.g. 1s.
        #[arg(long, default_value = "1s")]
        per: String,
        /// Bucket capacity.
        #[arg(long)]
        burst: u64,
        /// Requests per UTC day.
        #[arg(long)]
        daily: Option<u64>,
        /// Requests per UTC month.
        #[arg(long)]
        monthly: Option<u64>,
        /// Requests in flight at once (per replica); over it → 429.
        #[arg(long)]
        max_in_flight: Option<u64>,
    },
    /// List all tenants.
    List,
}

/// `portcullis admin key …`.
#[derive(Debug, clap::Subcommand)]
pub enum KeyCommand {
    /// Issue a key; it is printed once and cannot be shown again.
    Issue {
        /// Tenant id.
        tenant: String,
    },
    /// List a tenant's keys (prefixes only).
    List {
        /// Tenant id.
        tenant: String,
    },
    /// Revoke a key (it stops working within a second).
    Revoke {
        /// Tenant id.
        tenant: String,
        /// Key id from `key list`.
        key_id: i64,
    },
}

/// `portcullis admin quota …`.
#[derive(Debug, clap::Subcommand)]
pub enum QuotaCommand {
    /// Change a tenant's limits; with --route, set that route's override instead.
    Set {
        /// Tenant id.
        tenant: String,
        /// Route prefix whose override to set (needs --rate and --burst).
        #[arg(long)]
        route: Option<String>,
        /// Tokens per period.
        #[arg(long)]
        rate: Option<u64>,
        /// Bucket period, e.g. 1s.
        #[arg(long)]
        per: Option<String>,
        /// Bucket capacity.
        #[arg(long)]
        burst: Option<u64>,
        /// Requests per UTC day, or "none".
        #[arg(long)]
        daily: Option<String>,
        /// Requests per UTC month, or "none".
        #[arg(long)]
        monthly: Option<String>,
        /// Requests in flight at once (per replica), or "none".
        #[arg(long)]
        max_in_flight: Option<String>,
    },
}

/// Why an admin command failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminCliError {
    /// No token in the environment.
    #[error("{ENV_ADMIN_TOKEN} is not set; export the admin token first")]
    NoToken,
    /// Bad command-line value.
    #[error("{0}")]
    Usage(String),
    /// The admin API could not be reached.
    #[error("cannot reach the admin API at {url}: {source}")]
    Http {
        /// Base URL.
        url: String,
        /// The transport error.
        source: reqwest::Error,
    },
    /// The admin API refused the request.
    #[error("{status}: {detail}")]
    Api {
        /// HTTP status.
        status: u16,
        /// The problem's detail and field errors.
        detail: String,
    },
    /// The async runtime could not start.
    #[error("cannot start the runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

/// Runs one admin command, reading the token from the process environment.
pub fn run(args: AdminArgs) -> Result<(), AdminCliError> {
    let token = std::env::var(ENV_ADMIN_TOKEN)
        .ok()
        .filter(|t| !t.is_empty())
        .ok_or(AdminCliError::NoToken)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(execute(args, token))
}

struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
    actor: Option<String>,
}

impl Client {
    async fn call(
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

async fn execute(args: AdminArgs, token: String) -> Result<(), AdminCliError> {
    let client = Client {
        http: reqwest::Client::builder()
            .no_proxy()
            .build()
            .map_err(|source| AdminCliError::Http {
                url: args.url.clone(),
                source,
            })?,
        base: args.url.trim_end_matches('/').to_owned(),
        token,
        actor: args.actor,
    };
    use reqwest::Method;
    match args.command {
        AdminCommand::Tenant(TenantCommand::Add {
            id,
            name,
            rate,
            per,
            burst,
            daily,
            monthly,
            max_in_flight,
        }) => {
            let mut body = json!({ "id": id, "rate": rate, "per": per, "burst": burst });
            for (field, value) in [
                ("name", name.map(Value::from)),
                ("daily_quota", daily.map(Value::from)),
                ("monthly_quota", monthly.map(Value::from)),
                ("max_in_flight", max_in_flight.map(Value::from)),
            ] {
                if let Some(value) = value {
                    body[field] = value;
                }
            }
            let tenant = client.call(Method::POST, "/tenants", Some(body)).await?;
            print_tenants(&[tenant]);
        }
        AdminCommand::Tenant(TenantCommand::List) => {
            let mut tenants = Vec::new();
            let mut cursor: Option<String> = None;
            loop {
                let path = match &cursor {
                    Some(c) => format!("/tenants?limit=500&cursor={}", url_encode(c)),
                    None => "/tenants?limit=500".to_owned(),
                };
                let page = client.call(Method::GET, &path, None).await?;
                tenants.extend(page["items"].as_array().cloned().unwrap_or_default());
                match page["next_cursor"].as_str() {
                    Some(next) => cursor = Some(next.to_owned()),
                    None => break,
                }
            }
            print_tenants(&tenants);
        }
        AdminCommand::Key(KeyCommand::Issue { tenant }) => {
            let key = client
                .call(
                    Method::POST,
                    &format!("/tenants/{}/keys", url_encode(&tenant)),
                    None,
                )
                .await?;
            println!(
                "Issued key {} for tenant {}:\n\n  {}\n",
                text(&key["id"]),
                text(&key["tenant"]),
                text(&key["api_key"])
            );
            println!("Store it now: it is not stored anywhere and cannot be shown again.");
        }
        AdminCommand::Key(KeyCommand::List { tenant }) => {
            let keys = client
                .call(
                    Method::GET,
                    &format!("/tenants/{}/keys", url_encode(&tenant)),
                    None,
                )
                .await?;
            print_keys(
                keys["items"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default(),
            );
        }
        AdminCommand::Key(KeyCommand::Revoke { tenant, key_id }) => {
            let path = format!("/tenants/{}/keys/{key_id}/revoke", url_encode(&tenant));
            let key = client.call(Method::POST, &path, None).await?;
            print_keys(&[key]);
        }
        AdminCommand::Quota(QuotaCommand::Set {
            tenant,
            route,
            rate,
            per,
            burst,
            daily,
            monthly,
            max_in_flight,
        }) => {
            let tenant = url_encode(&tenant);
            let mut body = Map::new();
            if let Some(rate) = rate {
                body.insert("rate".into(), rate.into());
            }
            if let Some(per) = per {
                body.insert("per".into(), per.into());
            }
            if let Some(burst) = burst {
                body.insert("burst".into(), burst.into());
            }
            let quota = if let Some(route) = route {
                if daily.is_some() || monthly.is_some() || max_in_flight.is_some() {
                    return Err(AdminCliError::Usage(
                        "--daily/--monthly/--max-in-flight apply to the tenant, not to a route override"
                            .into(),
                    ));
                }
                body.insert("route".into(), route.into());
                let path = format!("/tenants/{tenant}/route-quotas");
                client
                    .call(Method::PUT, &path, Some(Value::Object(body)))
                    .await?;
                client
                    .call(Method::GET, &format!("/tenants/{tenant}/quota"), None)
                    .await?
            } else {
                for (field, value) in [
                    ("daily_quota", daily),
                    ("monthly_quota", monthly),
                    ("max_in_flight", max_in_flight),
                ] {
                    if let Some(value) = value {
                        body.insert(field.into(), quota_value(field, &value)?);
                    }
                }
                if body.is_empty() {
                    return Err(AdminCliError::Usage(
                        "nothing to set: give --rate, --per, --burst, --daily, --monthly or --max-in-flight".into(),
                    ));
                }
                let path = format!("/tenants/{tenant}/quota");
                client
                    .call(Method::PATCH, &path, Some(Value::Object(body)))
                    .await?
            };
            print_quota(&quota);
        }
        AdminCommand::Usage { tenant } => {
            let path = format!("/tenants/{}/usage", url_encode(&tenant));
            let usage = client.call(Method::GET, &path, None).await?;
            print_usage(&usage);
        }
        AdminCommand::Upstreams => {
            let upstreams = client.call(Method::GET, "/upstreams", None).await?;
            print_upstreams(&upstreams);
        }
    }
    Ok(())
}

fn quota_value(field: &str, value: &str) -> Result<Value, AdminCliError> {
    if value.eq_ignore_ascii_case("none") {
        return Ok(Value::Null);
    }
    value.parse::<u64>().map(Value::from).map_err(|_| {
        AdminCliError::Usage(format!("{field}: {value:?} is not a number or \"none\""))
    })
}

/// Percent-encodes a path segment or query value (ids are `[A-Za-z0-9._-]`, but a typo
/// must not turn into a different path).
fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
