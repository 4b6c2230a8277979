//! What each admin command sends to the admin API, and what it prints.

use reqwest::Method;
use serde_json::{json, Map, Value};

use super::client::{url_encode, Client};
use super::output::{print_keys, print_quota, print_tenants, print_upstreams, print_usage, text};
use super::{
    AdminArgs, AdminCliError, AdminCommand, DeliveriesCommand, KeyCommand, QuotaCommand,
    TenantCommand,
};

/// Runs one command against the admin API at `args.url`.
pub(super) async fn execute(args: AdminArgs, token: String) -> Result<(), AdminCliError> {
    let client = Client::new(&args.url, token, args.actor)?;
    match args.command {
        AdminCommand::Tenant(command) => tenant(&client, command).await?,
        AdminCommand::Key(command) => key(&client, command).await?,
        AdminCommand::Quota(command) => quota(&client, command).await?,
        AdminCommand::Usage { tenant } => {
            let path = format!("/tenants/{}/usage", url_encode(&tenant));
            let usage = client.call(Method::GET, &path, None).await?;
            print_usage(&usage);
        }
        AdminCommand::Upstreams => {
            let upstreams = client.call(Method::GET, "/upstreams", None).await?;
            print_upstreams(&upstreams);
        }
        AdminCommand::Deliveries(command) => deliveries(&client, command).await?,
    }
    Ok(())
}

/// `deliveries …`: the admin API's answer, as indented JSON.
async fn deliveries(client: &Client, command: DeliveriesCommand) -> Result<(), AdminCliError> {
    let answer = match command {
        DeliveriesCommand::List {
            state,
            queue,
            tenant,
            limit,
        } => {
            let mut path = format!("/deliveries?limit={limit}");
            for (name, value) in [("state", state), ("queue", queue), ("tenant", tenant)] {
                if let Some(value) = value {
                    path.push_str(&format!("&{name}={}", url_encode(&value)));
                }
            }
            client.call(Method::GET, &path, None).await?
        }
        DeliveriesCommand::Show { id } => {
            let path = format!("/deliveries/{}", url_encode(&id));
            client.call(Method::GET, &path, None).await?
        }
        DeliveriesCommand::Replay { id } => {
            let path = format!("/deliveries/{}/replay", url_encode(&id));
            client.call(Method::POST, &path, None).await?
        }
        DeliveriesCommand::ReplayAll {
            queue,
            tenant,
            limit,
        } => {
            let body = json!({ "state": "dead", "queue": queue, "tenant": tenant, "limit": limit });
            client
                .call(Method::POST, "/deliveries/replay", Some(body))
                .await?
        }
        DeliveriesCommand::Purge { id } => {
            let path = format!("/deliveries/{}", url_encode(&id));
            client.call(Method::DELETE, &path, None).await?;
            json!({ "purged": id })
        }
    };
    println!(
        "{}",
        serde_json::to_string_pretty(&answer).unwrap_or_default()
    );
    Ok(())
}

/// `tenant add` and `tenant list`.
async fn tenant(client: &Client, command: TenantCommand) -> Result<(), AdminCliError> {
    match command {
        TenantCommand::Add {
            id,
            name,
            rate,
            per,
            burst,
            daily,
            monthly,
            max_in_flight,
            max_websockets,
            websocket_idle_timeout,
            websocket_max_lifetime,
        } => {
            let mut body = json!({ "id": id, "rate": rate, "per": per, "burst": burst });
            for (field, value) in [
                ("name", name.map(Value::from)),
                ("daily_quota", daily.map(Value::from)),
                ("monthly_quota", monthly.map(Value::from)),
                ("max_in_flight", max_in_flight.map(Value::from)),
                ("max_websockets", max_websockets.map(Value::from)),
                (
                    "websocket_idle_timeout",
                    websocket_idle_timeout.map(Value::from),
                ),
                (
                    "websocket_max_lifetime",
                    websocket_max_lifetime.map(Value::from),
                ),
            ] {
                if let Some(value) = value {
                    body[field] = value;
                }
            }
            let tenant = client.call(Method::POST, "/tenants", Some(body)).await?;
            print_tenants(&[tenant]);
        }
        TenantCommand::List => print_tenants(&all_tenants(client).await?),
    }
    Ok(())
}

/// Every tenant, page after page.
async fn all_tenants(client: &Client) -> Result<Vec<Value>, AdminCliError> {
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
    Ok(tenants)
}

/// `key issue`, `key list` and `key revoke`.
async fn key(client: &Client, command: KeyCommand) -> Result<(), AdminCliError> {
    match command {
        KeyCommand::Issue { tenant } => {
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
        KeyCommand::List { tenant } => {
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
        KeyCommand::Revoke { tenant, key_id } => {
            let path = format!("/tenants/{}/keys/{key_id}/revoke", url_encode(&tenant));
            let key = client.call(Method::POST, &path, None).await?;
            print_keys(&[key]);
        }
    }
    Ok(())
}

/// `quota set`: the tenant's limits, or with `--route` that route's override.
async fn quota(client: &Client, command: QuotaCommand) -> Result<(), AdminCliError> {
    let QuotaCommand::Set {
        tenant,
        route,
        rate,
        per,
        burst,
        daily,
        monthly,
        max_in_flight,
        max_websockets,
        websocket_idle_timeout,
        websocket_max_lifetime,
    } = command;
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
        if daily.is_some()
            || monthly.is_some()
            || max_in_flight.is_some()
            || max_websockets.is_some()
            || websocket_idle_timeout.is_some()
            || websocket_max_lifetime.is_some()
        {
            return Err(AdminCliError::Usage(
                "--daily/--monthly/--max-in-flight/--max-websockets/--websocket-* apply to the tenant, not to a route override"
                    .into(),
            ));
        }
        route_quota(client, &tenant, route, body).await?
    } else {
        for (field, value) in [
            ("daily_quota", daily),
            ("monthly_quota", monthly),
            ("max_in_flight", max_in_flight),
            ("max_websockets", max_websockets),
        ] {
            if let Some(value) = value {
                body.insert(field.into(), quota_value(field, &value)?);
            }
        }
        for (field, value) in [
            ("websocket_idle_timeout", websocket_idle_timeout),
            ("websocket_max_lifetime", websocket_max_lifetime),
        ] {
            if let Some(value) = value {
                // The admin API checks the duration and names the field if it is wrong.
                let value = if value.eq_ignore_ascii_case("none") {
                    Value::Null
                } else {
                    Value::from(value)
                };
                body.insert(field.into(), value);
            }
        }
        if body.is_empty() {
            return Err(AdminCliError::Usage(
                "nothing to set: give --rate, --per, --burst, --daily, --monthly, --max-in-flight, --max-websockets, --websocket-idle-timeout or --websocket-max-lifetime".into(),
            ));
        }
        let path = format!("/tenants/{tenant}/quota");
        client
            .call(Method::PATCH, &path, Some(Value::Object(body)))
            .await?
    };
    print_quota(&quota);
    Ok(())
}

/// `quota set --route`: sets the route's override, then reads the tenant's quota back.
async fn route_quota(
    client: &Client,
    tenant: &str,
    route: String,
    mut body: Map<String, Value>,
) -> Result<Value, AdminCliError> {
    body.insert("route".into(), route.into());
    let path = format!("/tenants/{tenant}/route-quotas");
    client
        .call(Method::PUT, &path, Some(Value::Object(body)))
        .await?;
    client
        .call(Method::GET, &format!("/tenants/{tenant}/quota"), None)
        .await
}

/// A `--daily`, `--monthly` or `--max-in-flight` value: a number, or `none` (JSON `null`) to
/// remove the limit.
fn quota_value(field: &str, value: &str) -> Result<Value, AdminCliError> {
    if value.eq_ignore_ascii_case("none") {
        return Ok(Value::Null);
    }
    value.parse::<u64>().map(Value::from).map_err(|_| {
        AdminCliError::Usage(format!("{field}: {value:?} is not a number or \"none\""))
    })
}
