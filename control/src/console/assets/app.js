// Portcullis console: a client of the admin API (/admin/v1), nothing else.
// The token lives in sessionStorage (this tab only) and goes out as a bearer header; it is
// never written into a URL, a cookie or the DOM. All text from the API is set with
// textContent, never parsed as HTML.

const API = "/admin/v1";
const STORE = "portcullis.admin-token";
const POLL_MS = 2000;

let token = sessionStorage.getItem(STORE) || "";
let poller = null;

const $ = (id) => document.getElementById(id);

/** An element with text and attributes; children appended. */
function el(tag, text, attrs = {}, ...children) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  for (const c of children) node.append(c);
  return node;
}

function flash(message, kind = "info") {
  const box = $("flash");
  box.textContent = message;
  box.className = kind;
  box.hidden = false;
  clearTimeout(flash.timer);
  flash.timer = setTimeout(() => { box.hidden = true; }, 5000);
}

class ApiError extends Error {
  constructor(status, problem) {
    super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
    this.status = status;
    this.problem = problem || {};
  }
}

/** Calls the admin API; JSON in and out; problem+json becomes an ApiError. */
async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${token}`, "X-Admin-Actor": "console" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(API + path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "omit", cache: "no-store", referrerPolicy: "no-referrer",
  });
  if (response.status === 401) {
    signOut("The admin token was refused; sign in again.");
    throw new ApiError(401, null);
  }
  const text = await response.text();
  const data = text ? JSON.parse(text) : null;
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

const q = (params) => {
  const s = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") s.set(k, v);
  const text = s.toString();
  return text ? `?${text}` : "";
};
const enc = encodeURIComponent;

/** Shows a 422's field-by-field messages next to the inputs of `scope`; others in the flash. */
function showErrors(scope, err) {
  for (const span of scope.querySelectorAll(".field-error")) span.textContent = "";
  if (!(err instanceof ApiError)) { flash(String(err), "error"); return; }
  const unplaced = [];
  for (const { field, reason } of err.problem.errors || []) {
    const span = scope.querySelector(`[data-error="${CSS.escape(field)}"]`);
    if (span) span.textContent = `${field} ${reason}`; else unplaced.push(`${field} ${reason}`);
  }
  if (err.status !== 401) flash(unplaced.length ? `${err.message}: ${unplaced.join("; ")}` : err.message, "error");
}

function clearErrors(scope) {
  for (const span of scope.querySelectorAll(".field-error")) span.textContent = "";
}

/** The form's data-field inputs as an object: empty optional fields left out, numbers as numbers. */
function formValues(form, { nullable = [] } = {}) {
  const out = {};
  for (const input of form.querySelectorAll("[data-field]")) {
    const name = input.dataset.field;
    const raw = input.value.trim();
    if (raw === "") { if (nullable.includes(name)) out[name] = null; continue; }
    out[name] = input.inputMode === "numeric" && /^\d+$/.test(raw) ? Number(raw) : raw;
  }
  return out;
}

// ---- sign-in and navigation -------------------------------------------------------------

function signOut(message) {
  token = "";
  sessionStorage.removeItem(STORE);
  stopPolling();
  show();
  if (message) { $("login-error").textContent = message; $("login-error").hidden = false; }
}

$("login").addEventListener("submit", async (event) => {
  event.preventDefault();
  const candidate = $("token").value.trim();
  $("token").value = "";
  token = candidate;
  try {
    await api("GET", "/tenants?limit=1");
    sessionStorage.setItem(STORE, token);
    $("login-error").hidden = true;
    if (!location.hash) location.hash = "#tenants";
    show();
  } catch (err) {
    if (!(err instanceof ApiError && err.status === 401)) signOut(`Sign-in failed: ${err.message}`);
  }
});
$("logout").addEventListener("click", () => signOut());
window.addEventListener("hashchange", show);

const pages = { deliveries: loadDeliveries, tenants: loadTenantsPage, keys: loadKeys, usage: loadUsage, upstreams: loadUpstreams, audit: () => loadAudit(true), idempotency: () => {} };

function stopPolling() { if (poller) { clearInterval(poller); poller = null; } }

// Bumped by show(): a load that began on an earlier page must not start polling on this one.
let visit = 0;

/** Polls `task` every `ms` if the page that began the load at `since` is still shown. */
function startPolling(since, task, ms) {
  if (since !== visit) return;
  stopPolling();
  poller = setInterval(task, ms);
}

function show() {
  const signedIn = token !== "";
  $("login-page").hidden = signedIn;
  $("nav").hidden = !signedIn;
  $("logout").hidden = !signedIn;
  stopPolling();
  visit += 1;
  const name = signedIn ? (location.hash.slice(1).split("/")[0] || "tenants") : "";
  for (const page of document.querySelectorAll(".page")) page.hidden = page.id !== `page-${name}`;
  for (const link of document.querySelectorAll("#nav a")) link.classList.toggle("active", link.dataset.page === name);
  document.body.dataset.page = name || "login";
  if (signedIn && pages[name]) pages[name]().catch((err) => showErrors(document, err));
}

// ---- tenants ----------------------------------------------------------------------------

// The tenant's own WebSocket limits: an empty input clears one (null), as for the quotas.
const WEBSOCKET_LIMITS = ["max_websockets", "websocket_idle_timeout", "websocket_max_lifetime"];

const tenantPaging = { cursors: [null], index: 0, next: null };
let selected = null;

// Tenant id → 429s in the last 10 minutes (the top-throttled view's window and scope).
let throttling = new Map();

/** Refreshes `throttling` and the list's Throttled column in place (the rows stay). */
async function refreshThrottling() {
  const top = await api("GET", "/usage/throttled?limit=100");
  throttling = new Map(top.items.map((t) => [t.tenant, t.rejected]));
  for (const cell of document.querySelectorAll("#tenant-table td[data-throttled]")) {
    const count = throttling.get(cell.dataset.throttled) ?? 0;
    cell.textContent = String(count);
    cell.className = count ? "throttled" : "";
  }
}

/** The tenants page: the list, then its Throttled column kept current. */
async function loadTenantsPage() {
  const since = visit;
  await refreshThrottling().catch(() => {});
  await refreshTenants();
  startPolling(since, () => refreshThrottling().catch(() => stopPolling()), POLL_MS);
}

async function loadTenants() {
  const page = await api("GET", `/tenants${q({ q: $("tenant-search").value.trim(), limit: 20, cursor: tenantPaging.cursors[tenantPaging.index] })}`);
  tenantPaging.next = page.next_cursor;
  const body = $("tenant-table").tBodies[0];
  body.replaceChildren(...page.items.map((t) => {
    const row = el("tr", null, { "data-tenant": t.id },
      el("td", null, {}, el("a", t.id, { href: "#tenants", "data-open": t.id })),
      el("td", t.name), el("td", `${t.rate}/${t.per}`), el("td", t.burst),
      el("td", t.daily_quota ?? "–"), el("td", t.monthly_quota ?? "–"),
      el("td", websocketSummary(t), { "data-websockets": t.id }),
      el("td", throttling.get(t.id) ?? 0, { "data-throttled": t.id, class: throttling.get(t.id) ? "throttled" : "" }),
      el("td", null, {}, el("span", t.disabled ? "disabled" : "enabled", { class: `badge ${t.disabled ? "off" : "on"}` })));
    return row;
  }));
  if (!page.items.length) body.append(el("tr", null, {}, el("td", "No tenants match.", { colspan: "9", class: "empty" })));
  $("tenant-prev").disabled = tenantPaging.index === 0;
  $("tenant-next").disabled = !tenantPaging.next;
}

/** A tenant's own WebSocket limits in one cell: "50 · idle 5m · max 24h", or "–" with none. */
function websocketSummary(t) {
  const parts = [];
  if (t.max_websockets != null) parts.push(String(t.max_websockets));
  if (t.websocket_idle_timeout != null) parts.push(`idle ${t.websocket_idle_timeout}`);
  if (t.websocket_max_lifetime != null) parts.push(`max ${t.websocket_max_lifetime}`);
  return parts.length ? parts.join(" · ") : "–";
}

/** After a change: the list, and the open tenant's form (its values as stored now). */
async function refreshTenants() {
  await loadTenants();
  if (selected) await openTenant(selected).catch(() => { selected = null; $("tenant-detail").hidden = true; });
}

let searchTimer = null;
function searchSoon() {
  clearTimeout(searchTimer);
  searchTimer = setTimeout(() => { tenantPaging.cursors = [null]; tenantPaging.index = 0; loadTenants().catch((e) => showErrors(document, e)); }, 250);
}
// "change" too: clearing the field (its x button, or a script) may fire no "input".
for (const type of ["input", "change", "search"]) $("tenant-search").addEventListener(type, searchSoon);
$("tenant-next").addEventListener("click", () => {
  if (!tenantPaging.next) return;
  tenantPaging.cursors[++tenantPaging.index] = tenantPaging.next;
  loadTenants().catch((e) => showErrors(document, e));
});
$("tenant-prev").addEventListener("click", () => {
  if (tenantPaging.index === 0) return;
  tenantPaging.index--;
  loadTenants().catch((e) => showErrors(document, e));
});
$("tenant-table").addEventListener("click", (event) => {
  const link = event.target.closest("[data-open]");
  if (!link) return;
  event.preventDefault();
  openTenant(link.dataset.open).catch((e) => showErrors(document, e));
});

$("tenant-create").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = event.currentTarget;
  clearErrors(form);
  try {
    const tenant = await api("POST", "/tenants", formValues(form));
    flash(`Tenant ${tenant.id} created.`);
    form.querySelector('[data-field="id"]').value = "";
    form.querySelector('[data-field="name"]').value = "";
    selected = tenant.id;
    await refreshTenants();
  } catch (err) { showErrors(form, err); }
});

async function openTenant(id) {
  const t = await api("GET", `/tenants/${enc(id)}`);
  selected = t.id;
  $("tenant-detail").hidden = false;
  $("tenant-detail").dataset.tenant = t.id;
  $("detail-id").textContent = t.id;
  $("detail-state").textContent = t.disabled ? "disabled" : "enabled";
  $("detail-state").className = `badge ${t.disabled ? "off" : "on"}`;
  $("tenant-toggle").textContent = t.disabled ? "Enable" : "Disable";
  $("delete-confirm").hidden = true;
  const form = $("quota-form");
  clearErrors(form);
  for (const input of form.querySelectorAll("[data-field]")) input.value = t[input.dataset.field] ?? "";
  $("route-table").tBodies[0].replaceChildren(...(t.route_quotas || []).map((r) =>
    el("tr", null, {}, el("td", r.route), el("td", r.rate), el("td", r.per), el("td", r.burst),
      el("td", null, {}, el("button", "Remove", { type: "button", class: "secondary small", "data-remove-route": r.route })))));
}

$("quota-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = event.currentTarget;
  clearErrors(form);
  try {
    await api("PATCH", `/tenants/${enc(selected)}/quota`, formValues(form, { nullable: ["daily_quota", "monthly_quota", "max_in_flight", ...WEBSOCKET_LIMITS] }));
    flash(`Quota of ${selected} saved.`);
    await refreshTenants();
  } catch (err) { showErrors(form, err); }
});

$("route-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = event.currentTarget;
  clearErrors(form);
  try {
    await api("PUT", `/tenants/${enc(selected)}/route-quotas`, formValues(form));
    flash("Override set.");
    await openTenant(selected);
  } catch (err) { showErrors(form, err); }
});

$("route-table").addEventListener("click", async (event) => {
  const button = event.target.closest("[data-remove-route]");
  if (!button) return;
  try {
    await api("DELETE", `/tenants/${enc(selected)}/route-quotas${q({ route: button.dataset.removeRoute })}`);
    flash("Override removed.");
    await openTenant(selected);
  } catch (err) { showErrors(document, err); }
});

$("tenant-toggle").addEventListener("click", async () => {
  const action = $("tenant-toggle").textContent === "Enable" ? "enable" : "disable";
  try {
    await api("POST", `/tenants/${enc(selected)}/${action}`);
    flash(`Tenant ${selected} ${action}d.`);
    await refreshTenants();
  } catch (err) { showErrors(document, err); }
});

$("tenant-delete").addEventListener("click", () => {
  $("delete-id").textContent = selected;
  $("delete-confirm").hidden = false;
});
$("delete-no").addEventListener("click", () => { $("delete-confirm").hidden = true; });
$("delete-yes").addEventListener("click", async () => {
  try {
    await api("DELETE", `/tenants/${enc(selected)}`);
    flash(`Tenant ${selected} deleted.`);
    selected = null;
    $("tenant-detail").hidden = true;
    await loadTenants();
  } catch (err) { showErrors(document, err); }
});

// ---- keys -------------------------------------------------------------------------------

let keys = [];

async function loadKeys() {
  const tenant = $("keys-tenant").value.trim();
  if (!tenant) { $("key-table").tBodies[0].replaceChildren(); return; }
  keys = (await api("GET", `/tenants/${enc(tenant)}/keys`)).items;
  renderKeys();
}

function renderKeys() {
  const prefix = $("key-prefix").value.trim();
  $("key-table").tBodies[0].replaceChildren(...keys.filter((k) => k.prefix.startsWith(prefix)).map((k) =>
    el("tr", null, { "data-key": String(k.id) }, el("td", k.id), el("td", null, {}, el("code", k.prefix)), el("td", k.created_at),
      el("td", null, {}, el("span", k.revoked_at ? "revoked" : "active", { class: `badge ${k.revoked_at ? "off" : "on"}` })),
      el("td", null, {}, k.revoked_at ? "" : el("button", "Revoke", { type: "button", class: "danger small", "data-revoke": String(k.id) })))));
}

$("keys-form").addEventListener("submit", (event) => { event.preventDefault(); $("issued").hidden = true; loadKeys().catch((e) => showErrors(document, e)); });
$("key-prefix").addEventListener("input", renderKeys);
$("key-issue").addEventListener("click", async () => {
  const tenant = $("keys-tenant").value.trim();
  if (!tenant) { flash("Name the tenant first.", "error"); return; }
  try {
    const issued = await api("POST", `/tenants/${enc(tenant)}/keys`);
    $("issued-key").textContent = issued.api_key;
    $("issued").hidden = false;
    $("copied").hidden = true;
    await loadKeys();
  } catch (err) { showErrors(document, err); }
});
$("copy-key").addEventListener("click", async () => {
  const text = $("issued-key").textContent;
  try { await navigator.clipboard.writeText(text); } catch {
    // No clipboard permission (plain http off localhost): select it for Ctrl-C instead.
    getSelection().selectAllChildren($("issued-key"));
  }
  $("copied").hidden = false;
});
$("key-table").addEventListener("click", async (event) => {
  const button = event.target.closest("[data-revoke]");
  if (!button) return;
  try {
    await api("POST", `/tenants/${enc($("keys-tenant").value.trim())}/keys/${enc(button.dataset.revoke)}/revoke`);
    flash(`Key ${button.dataset.revoke} revoked.`);
    await loadKeys();
  } catch (err) { showErrors(document, err); }
});

// ---- usage ------------------------------------------------------------------------------

// The SVG namespace name (an identifier, never fetched).
const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

/**
 * A meter of `fraction` (0..1). `good` says which end is good: "high" for tokens left (a
 * full bucket is green, an empty one red), "low" for quota used (little used is green).
 */
function level(fraction, good) {
  const value = String(Math.max(0, Math.min(1, fraction)));
  const regions = good === "high"
    ? { low: "0.15", high: "0.5", optimum: "1" }
    : { low: "0.5", high: "0.85", optimum: "0" };
  return el("meter", null, { min: "0", max: "1", ...regions, value, "data-good": good });
}

/**
 * A bar chart of the history's points: bars, a y scale, and time labels; no library. The
 * scale is logarithmic (log(1 + n)), so one spike does not flatten the bars after it; the
 * peak bar carries its count.
 */
function drawChart(history) {
  const box = $("chart");
  const points = history.points;
  const width = 600, height = 200, left = 40, bottom = 22, top = 14;
  const max = Math.max(1, ...points.map((p) => p.rejected));
  const scale = (n) => Math.log1p(n) / Math.log1p(max);
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "429s per 10 seconds" });
  const plotW = width - left - 8, plotH = height - bottom - top;
  const barW = plotW / points.length;
  for (const fraction of [0, 0.5, 1]) {
    const y = top + plotH * (1 - fraction);
    chart.append(svg("line", { x1: left, x2: width - 8, y1: y, y2: y, class: "grid" }));
    const label = svg("text", { x: left - 6, y: y + 4, class: "axis", "text-anchor": "end" });
    label.textContent = String(Math.round(Math.expm1(Math.log1p(max) * fraction)));
    chart.append(label);
  }
  const peak = points.reduce((best, p, i) => (p.rejected > (points[best]?.rejected ?? 0) ? i : best), -1);
  points.forEach((p, i) => {
    const h = scale(p.rejected) * plotH;
    const bar = svg("rect", { x: left + i * barW + 1, y: top + plotH - h, width: Math.max(1, barW - 2), height: h, class: "bar", "data-count": p.rejected });
    const title = svg("title");
    title.textContent = `${new Date(p.start * 1000).toLocaleTimeString()}: ${p.rejected}`;
    bar.append(title);
    chart.append(bar);
    if (i === peak) {
      const label = svg("text", { x: left + i * barW + barW / 2, y: top + plotH - h - 3, class: "axis peak", "text-anchor": "middle" });
      label.textContent = String(p.rejected);
      chart.append(label);
    }
  });
  for (const [i, text] of [[0, "-10 min"], [points.length / 2, "-5 min"], [points.length - 1, "now"]]) {
    const label = svg("text", { x: left + i * barW + barW / 2, y: height - 6, class: "axis", "text-anchor": "middle" });
    label.textContent = text;
    chart.append(label);
  }
  const latest = points.length ? points[points.length - 1].rejected : 0;
  const windowTotal = points.reduce((sum, p) => sum + p.rejected, 0);
  box.replaceChildren(chart);
  // For people and for the browser test: the numbers the chart shows.
  box.dataset.latest = String(latest);
  box.dataset.window = String(windowTotal);
  box.dataset.total = String(history.rejected_total);
  box.dataset.scale = "log";
  $("rejected-total").textContent = String(history.rejected_total);
}

const secs = (s) => (s >= 3600 ? `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min` : s >= 60 ? `${Math.floor(s / 60)} min ${s % 60} s` : `${s} s`);

async function refreshUsage() {
  const tenant = $("usage-tenant").value.trim();
  const throttled = await api("GET", "/usage/throttled?limit=10");
  $("throttled-scope").textContent = throttled.scope === "fleet" ? `(fleet: ${throttled.replicas} replica(s))` : "(this replica)";
  $("throttled-table").tBodies[0].replaceChildren(...throttled.items.map((t) => el("tr", null, { "data-tenant": t.tenant }, el("td", t.tenant), el("td", t.rejected))));
  if (!throttled.items.length) $("throttled-table").tBodies[0].append(el("tr", null, {}, el("td", "Nobody was throttled in the last 10 minutes.", { colspan: "2", class: "empty" })));
  if (!tenant) return;
  const [usage, history] = await Promise.all([
    api("GET", `/tenants/${enc(tenant)}/usage`),
    api("GET", `/tenants/${enc(tenant)}/usage/history`),
  ]);
  $("bucket-table").tBodies[0].replaceChildren(...usage.buckets.map((b) => el("tr", null, {},
    el("td", b.policy), el("td", b.route ?? "all"), el("td", `${b.remaining} / ${b.limit}`),
    el("td", null, {}, level(b.limit ? b.remaining / b.limit : 0, "high")), el("td", secs(b.reset_after_secs)))));
  $("period-table").tBodies[0].replaceChildren(...usage.periods.map((p) => el("tr", null, {},
    el("td", p.period), el("td", p.used), el("td", p.limit),
    el("td", null, {}, level(p.limit ? p.used / p.limit : 1, "low")), el("td", secs(p.resets_in_secs)))));
  if (!usage.periods.length) $("period-table").tBodies[0].append(el("tr", null, {}, el("td", "No daily or monthly quota.", { colspan: "5", class: "empty" })));
  drawChart(history);
}

async function loadUsage() {
  const since = visit;
  await refreshUsage();
  startPolling(since, () => refreshUsage().catch((e) => { stopPolling(); showErrors(document, e); }), POLL_MS);
}

$("usage-form").addEventListener("submit", (event) => { event.preventDefault(); loadUsage().catch((e) => showErrors(document, e)); });
$("throttled-table").addEventListener("click", (event) => {
  const row = event.target.closest("[data-tenant]");
  if (!row) return;
  $("usage-tenant").value = row.dataset.tenant;
  loadUsage().catch((e) => showErrors(document, e));
});

// ---- upstreams --------------------------------------------------------------------------

async function loadUpstreams() {
  const render = (list) => $("upstream-table").tBodies[0].replaceChildren(...list.upstreams.map((u) => el("tr", null, { "data-upstream": u.name },
    el("td", u.name), el("td", `${u.healthy_endpoints} / ${u.endpoints.length}${u.panic ? " (panic)" : ""}`),
    el("td", null, {}, el("span", u.circuit_breaker, { class: `badge ${u.circuit_breaker === "closed" ? "on" : "off"}` })),
    el("td", u.retry_amplification == null ? "–" : `${u.retry_amplification.toFixed(2)}×`),
    el("td", u.latency ? `${u.latency.p99_ms.toFixed(1)} ms` : "– (under 100 attempts)"),
    el("td", `${u.attempt_timeout_ms} ms`),
    el("td", null, {}, ...u.endpoints.map((e) => el("div", `${e.url} ${e.state}${e.ejected_for_ms ? ` (${Math.ceil(e.ejected_for_ms / 1000)} s)` : ""}, ${e.in_flight} in flight`, { class: `endpoint ${e.state}` }))))));
  const since = visit;
  render(await api("GET", "/upstreams"));
  startPolling(since, () => api("GET", "/upstreams").then(render).catch(() => stopPolling()), POLL_MS * 2);
}

// ---- audit ------------------------------------------------------------------------------

let auditCursor = null;

async function loadAudit(fresh) {
  if (fresh) auditCursor = null;
  const page = await api("GET", `/audit${q({ tenant: $("audit-tenant").value.trim(), action: $("audit-action").value, actor: $("audit-actor").value.trim(), limit: 50, cursor: auditCursor })}`);
  const rows = page.items.map((e) => el("tr", null, {},
    el("td", e.at), el("td", e.actor), el("td", e.action), el("td", e.tenant ?? ""),
    el("td", null, {}, el("code", summarize(e.before, e.after), { class: "diff" }))));
  const body = $("audit-table").tBodies[0];
  if (fresh) body.replaceChildren(...rows); else body.append(...rows);
  if (fresh && !rows.length) body.append(el("tr", null, {}, el("td", "No entries match.", { colspan: "5", class: "empty" })));
  auditCursor = page.next_cursor;
  $("audit-more").hidden = !auditCursor;
}

/** The fields a change touched, as `field: before → after`. */
function summarize(before, after) {
  if (before == null) return after == null ? "" : `created ${JSON.stringify(after)}`;
  if (after == null) return `removed ${JSON.stringify(before)}`;
  const changed = Object.keys({ ...before, ...after }).filter((k) => JSON.stringify(before[k]) !== JSON.stringify(after[k]) && k !== "updated_at");
  return changed.map((k) => `${k}: ${JSON.stringify(before[k])} → ${JSON.stringify(after[k])}`).join("; ");
}

$("audit-form").addEventListener("submit", (event) => { event.preventDefault(); loadAudit(true).catch((e) => showErrors(document, e)); });
$("audit-more").addEventListener("click", () => loadAudit(false).catch((e) => showErrors(document, e)));

// ---- idempotency ------------------------------------------------------------------------

function idemPath() {
  return `/tenants/${enc($("idem-tenant").value.trim())}/idempotency${q({ route: $("idem-route").value.trim(), key: $("idem-key").value })}`;
}

$("idem-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const page = $("page-idempotency");
  clearErrors(page);
  $("idem-record").hidden = true;
  try {
    const record = await api("GET", idemPath());
    $("idem-fields").replaceChildren(...Object.entries(record).flatMap(([k, v]) => [el("dt", k), el("dd", v ?? "–")]));
    $("idem-record").hidden = false;
  } catch (err) { showErrors(page, err); }
});
$("idem-delete").addEventListener("click", async () => {
  try {
    await api("DELETE", idemPath());
    $("idem-record").hidden = true;
    flash("Record deleted: the key may be used again.");
  } catch (err) { showErrors($("page-idempotency"), err); }
});

// ---- deliveries -------------------------------------------------------------------------

// Payloads up to this many bytes (UTF-8 text) are shown in the detail at once; larger or
// binary ones only on a click, so a page of dead letters never puts bulk data on screen.
const INLINE_PAYLOAD = 2048;

const deliveryPaging = { cursors: [null], index: 0, next: null };
let openDelivery = null;
// The open delivery's payload was revealed by a click: a refresh keeps it shown.
let payloadShown = false;

const when = (ms) => (ms ? new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z") : "–");
const stateClass = (state) => (state === "dead" ? "off" : state === "delivered" ? "on" : "");

function deliveryFilter() {
  return { state: $("delivery-state").value, queue: $("delivery-queue").value.trim(), tenant: $("delivery-tenant").value.trim() };
}

/** The list; false when there is no queue (no asynchronous route: the API's 404 is shown). */
async function refreshDeliveries() {
  const body = $("delivery-table").tBodies[0];
  let page;
  try {
    page = await api("GET", `/deliveries${q({ ...deliveryFilter(), limit: 50, cursor: deliveryPaging.cursors[deliveryPaging.index] })}`);
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) {
      body.replaceChildren(el("tr", null, {}, el("td", err.message, { colspan: "7", class: "empty" })));
      return false;
    }
    throw err;
  }
  deliveryPaging.next = page.next;
  body.replaceChildren(...page.items.map((d) => el("tr", null, { "data-delivery": d.id, "data-state": d.state, class: d.id === openDelivery ? "open" : "" },
    el("td", null, {}, el("a", d.id, { href: "#deliveries", "data-open-delivery": d.id })),
    el("td", d.queue), el("td", d.tenant ?? "–"),
    el("td", null, {}, el("span", d.state, { class: `badge ${stateClass(d.state)}` })),
    el("td", when(d.enqueued_at_ms)), el("td", d.attempts), el("td", d.reason ?? ""))));
  if (!page.items.length) body.append(el("tr", null, {}, el("td", "No deliveries match.", { colspan: "7", class: "empty" })));
  $("delivery-prev").disabled = deliveryPaging.index === 0;
  $("delivery-next").disabled = !deliveryPaging.next;
  $("delivery-replay-all").disabled = deliveryFilter().state === "pending";
  return true;
}

/** The list, and the open delivery's detail (unless a confirmation is waiting on it). */
async function refreshDeliveryPage() {
  const queued = await refreshDeliveries();
  if (queued && openDelivery && $("delivery-confirm").hidden) {
    await showDelivery(openDelivery).catch((err) => {
      if (err instanceof ApiError && err.status === 404) closeDelivery(); else throw err;
    });
  }
  return queued;
}

async function loadDeliveries() {
  const since = visit;
  if (await refreshDeliveryPage()) {
    startPolling(since, () => refreshDeliveryPage().catch((e) => { stopPolling(); showErrors($("page-deliveries"), e); }), POLL_MS);
  }
}

function closeDelivery() {
  openDelivery = null;
  payloadShown = false;
  $("delivery-detail").hidden = true;
  $("delivery-confirm").hidden = true;
}

async function showDelivery(id) {
  const d = await api("GET", `/deliveries/${enc(id)}`);
  if (openDelivery !== d.id) payloadShown = false;
  openDelivery = d.id;
  for (const row of document.querySelectorAll("#delivery-table tr[data-delivery]")) row.classList.toggle("open", row.dataset.delivery === d.id);
  const detail = $("delivery-detail");
  detail.hidden = false;
  detail.dataset.delivery = d.id;
  detail.dataset.state = d.state;
  $("delivery-id").textContent = d.id;
  $("delivery-badge").textContent = d.state;
  $("delivery-badge").className = `badge ${stateClass(d.state)}`;
  const fields = [["queue", d.queue], ["tenant", d.tenant ?? "–"], ["client", d.client ?? "–"], ["request", `${d.method} ${d.path}`],
    ["accepted", when(d.enqueued_at_ms)], ["due", d.state === "pending" ? when(d.due_at_ms) : "–"], ["updated", when(d.updated_at_ms)],
    ["dedupe key", d.dedupe_key ?? "–"], ["final reason", d.reason ?? "–"]];
  $("delivery-fields").replaceChildren(...fields.flatMap(([k, v]) => [el("dt", k), el("dd", v, { "data-field": k })]));
  $("attempt-table").tBodies[0].replaceChildren(...d.attempts.map((a, i) => el("tr", null, { "data-attempt": String(i + 1) },
    el("td", i + 1), el("td", when(a.at_ms)),
    el("td", a.status != null ? `HTTP ${a.status}` : a.error, { class: a.status != null && a.status < 300 ? "" : "error" }),
    el("td", `${a.latency_ms} ms`))));
  if (!d.attempts.length) $("attempt-table").tBodies[0].append(el("tr", null, {}, el("td", "Not tried yet.", { colspan: "4", class: "empty" })));
  $("header-table").tBodies[0].replaceChildren(...d.headers.map(([name, value]) => el("tr", null, {}, el("td", name), el("td", null, {}, el("code", value)))));
  renderPayload(d);
  $("delivery-replay").disabled = d.state === "pending";
}

/** The payload: small UTF-8 text at once; anything else after "Show payload" (base64 if binary). */
function renderPayload(d) {
  const size = atob(d.body_base64).length;
  const text = d.body != null;
  const small = text && size <= INLINE_PAYLOAD;
  const visible = size > 0 && (small || payloadShown);
  $("payload-size").textContent = `(${size} bytes${text ? "" : ", binary: shown as base64"}${visible || size === 0 ? "" : "; not shown inline: over 2 KiB or binary"})`;
  $("payload").hidden = !visible;
  $("payload").textContent = visible ? (text ? d.body : d.body_base64) : "";
  $("payload-show").hidden = visible || size === 0;
}

$("payload-show").addEventListener("click", () => {
  payloadShown = true;
  if (openDelivery) showDelivery(openDelivery).catch((e) => showErrors($("page-deliveries"), e));
});

$("delivery-form").addEventListener("submit", (event) => {
  event.preventDefault();
  clearErrors($("page-deliveries"));
  deliveryPaging.cursors = [null];
  deliveryPaging.index = 0;
  $("bulk-confirm").hidden = true;
  loadDeliveries().catch((e) => showErrors($("page-deliveries"), e));
});
$("delivery-next").addEventListener("click", () => {
  if (!deliveryPaging.next) return;
  deliveryPaging.cursors[++deliveryPaging.index] = deliveryPaging.next;
  refreshDeliveries().catch((e) => showErrors($("page-deliveries"), e));
});
$("delivery-prev").addEventListener("click", () => {
  if (deliveryPaging.index === 0) return;
  deliveryPaging.index--;
  refreshDeliveries().catch((e) => showErrors($("page-deliveries"), e));
});
$("delivery-table").addEventListener("click", (event) => {
  const link = event.target.closest("[data-open-delivery]");
  if (!link) return;
  event.preventDefault();
  $("delivery-confirm").hidden = true;
  showDelivery(link.dataset.openDelivery).catch((e) => showErrors($("page-deliveries"), e));
});

// Replay and purge ask first; the confirmation names the delivery and what will happen.
function confirmDelivery(action) {
  const box = $("delivery-confirm");
  box.dataset.action = action;
  box.dataset.delivery = openDelivery;
  $("delivery-confirm-text").textContent = action === "replay"
    ? `Replay delivery ${openDelivery}? It becomes pending and is sent to its upstream again now, with the same Idempotency-Key.`
    : `Purge delivery ${openDelivery}? Its payload, headers and attempts are deleted for good (its dedupe record stays for its window).`;
  $("delivery-yes").textContent = action === "replay" ? "Replay now" : "Purge for good";
  box.hidden = false;
}
$("delivery-replay").addEventListener("click", () => confirmDelivery("replay"));
$("delivery-purge").addEventListener("click", () => confirmDelivery("purge"));
$("delivery-no").addEventListener("click", () => { $("delivery-confirm").hidden = true; });
$("delivery-yes").addEventListener("click", async () => {
  const box = $("delivery-confirm");
  // The delivery the confirmation named, whatever was opened since.
  const id = box.dataset.delivery;
  box.hidden = true;
  try {
    if (box.dataset.action === "replay") {
      await api("POST", `/deliveries/${enc(id)}/replay`);
      flash(`Delivery ${id} replayed: pending again.`);
    } else {
      await api("DELETE", `/deliveries/${enc(id)}`);
      flash(`Delivery ${id} purged.`);
      if (openDelivery === id) closeDelivery();
    }
    await refreshDeliveryPage();
  } catch (err) { showErrors($("page-deliveries"), err); }
});

// Bulk replay: one page of what the filter matches (dead by default), through the API's
// bulk endpoint, after a confirmation naming the filter.
$("delivery-replay-all").addEventListener("click", () => {
  const f = deliveryFilter();
  const scope = [`state ${f.state || "dead"}`, f.queue && `queue ${f.queue}`, f.tenant && `tenant ${f.tenant}`].filter(Boolean).join(", ");
  $("bulk-text").textContent = `Replay every delivery matching ${scope} (up to 1000)? Each is sent to its upstream again now.`;
  $("bulk-confirm").hidden = false;
});
$("bulk-no").addEventListener("click", () => { $("bulk-confirm").hidden = true; });
$("bulk-yes").addEventListener("click", async () => {
  $("bulk-confirm").hidden = true;
  const f = deliveryFilter();
  try {
    const done = await api("POST", "/deliveries/replay", { state: f.state || "dead", queue: f.queue || undefined, tenant: f.tenant || undefined, limit: 1000 });
    flash(`${done.replayed} deliveries replayed${done.more ? "; more match: replay again" : ""}.`);
    await refreshDeliveryPage();
  } catch (err) { showErrors($("page-deliveries"), err); }
});

show();
