// The console's only way to the broker: the public HTTP API (docs/http.md), with the
// token of the token field (sessionStorage) as `Authorization: Bearer`. Reads and writes
// go to the master found by asking every node for GET /v1/cluster (reads, with no master,
// to the node that served the page, else to any that answers).

const TOKEN_KEY = "ledgermq.token";
export const POLL_MS = 2000;
const READ_TIMEOUT_MS = 1500;
const WRITE_TIMEOUT_MS = 15000;

export class ApiError extends Error {
  constructor(status, code, message, fields = {}) {
    super(message);
    this.status = status;
    this.code = code;
    this.fields = fields;
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

export function originOf(url) {
  try {
    return new URL(url).origin;
  } catch {
    return null;
  }
}

/** Origins this page may not ask: its Content-Security-Policy (connect-src: the cluster's
 * nodes when the page was loaded) predates them, as for a member added since. */
export const blocked = new Set();
document.addEventListener("securitypolicyviolation", (e) => {
  const origin = originOf(e.blockedURI);
  if (origin && e.effectiveDirective === "connect-src") blocked.add(origin);
});

/** A write that reached a node no longer master: it answered 307 to the new one. */
class MasterMoved extends Error {}

/** One request to `base + path`; the parsed answer, or an ApiError. A write does not
 * follow a redirect: a browser drops the token on a redirect to another origin, so the
 * caller asks the cluster again and sends the write to the new master itself. */
export async function request(base, method, path, body, timeoutMs = READ_TIMEOUT_MS, asText = false) {
  const headers = { Accept: asText ? "text/plain" : "application/json" };
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), timeoutMs);
  let resp;
  try {
    resp = await fetch(base + path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: ctl.signal,
      cache: "no-store",
      redirect: method === "GET" ? "follow" : "manual",
    });
  } catch (e) {
    const why = e.name === "AbortError" ? `no answer in ${timeoutMs} ms` : "connection failed";
    throw new ApiError(0, "NODE_DOWN", `${base} is down or unreachable (${why})`);
  } finally {
    clearTimeout(timer);
  }
  if (resp.type === "opaqueredirect") throw new MasterMoved(`${base} is no longer the master`);
  if (resp.status === 204) return null;
  if (asText && resp.ok) return resp.text();
  let data = null;
  try {
    data = await resp.json();
  } catch {
    data = null;
  }
  if (!resp.ok) {
    const err = (data && data.error) || {};
    let message = err.message || `${resp.status} ${resp.statusText}`;
    if (resp.status === 401) message += " (enter a token in the Token field)";
    throw new ApiError(resp.status, err.code || `HTTP_${resp.status}`, message, err);
  }
  return data;
}

// ---- the cluster as seen from every node -------------------------------------------

export const cluster = {
  urls: [location.origin], // every node's origin learned so far, this one first
  views: new Map(), // origin -> {ok, view?, error?, at}
  nodes: [], // [{node_id, http_url, origin}]
  master: null, // {node_id, origin, term} or null
  polled: false,
  listeners: new Set(),
};

export function onCluster(fn) {
  cluster.listeners.add(fn);
  return () => cluster.listeners.delete(fn);
}

export async function pollCluster() {
  const answers = await Promise.all(
    cluster.urls.map((origin) =>
      request(origin, "GET", "/v1/cluster").then(
        (view) => ({ origin, ok: true, view }),
        (error) => ({ origin, ok: false, error }),
      ),
    ),
  );
  const nodes = new Map();
  for (const a of answers) {
    cluster.views.set(a.origin, { ...a, at: Date.now() });
    if (!a.ok) continue;
    for (const n of a.view.nodes) {
      // where this browser reaches it: --console-urls where the nodes' own URLs are not
      // reachable from here (compose: container names inside, published ports outside)
      const url = n.console_url || n.http_url;
      const origin = url ? originOf(url) : null;
      nodes.set(n.node_id, { node_id: n.node_id, http_url: url, origin, role: n.role });
      if (origin && !cluster.urls.includes(origin)) cluster.urls.push(origin);
    }
  }
  if (nodes.size) cluster.nodes = [...nodes.values()].sort((a, b) => (a.node_id < b.node_id ? -1 : 1));
  let master = null;
  for (const a of answers) {
    if (a.ok && a.view.broker_role === "MASTER" && (!master || a.view.term > master.term)) {
      master = { node_id: a.view.node_id, origin: a.origin, term: a.view.term };
    }
  }
  cluster.master = master;
  cluster.polled = true;
  for (const fn of cluster.listeners) fn(cluster);
  return cluster;
}

/** The view of the node at `origin` from the last poll, or null. */
export function viewOf(origin) {
  return origin ? cluster.views.get(origin) || null : null;
}

// Reads go to the master while one is known: a follower serves committed data too, but
// may not have applied the write this page just made (a created topic missing from the
// list). Without a master, to the node that served the page, else to any that answers.
function readBase() {
  if (cluster.master && (viewOf(cluster.master.origin) || {}).ok) return cluster.master.origin;
  for (const origin of cluster.urls) {
    const v = cluster.views.get(origin);
    if (!v || v.ok) return origin;
  }
  return location.origin;
}

/** A read (served by every node from committed data). */
export function read(path) {
  return request(readBase(), "GET", path, undefined, WRITE_TIMEOUT_MS);
}

/** A write: sent to the master; with none known, a NO_MASTER error without a request. */
export async function write(method, path, body) {
  if (!cluster.master) await pollCluster();
  if (!cluster.master) {
    throw new ApiError(503, "NO_MASTER", "no node is master now: writes wait for an election");
  }
  try {
    return await request(cluster.master.origin, method, path, body, WRITE_TIMEOUT_MS);
  } catch (e) {
    if (!(e instanceof MasterMoved)) throw e;
    await pollCluster();
    if (!cluster.master) throw new ApiError(503, "NO_MASTER", "the master moved and no new one is known yet");
    return request(cluster.master.origin, method, path, body, WRITE_TIMEOUT_MS);
  }
}

/** Every node's /metrics that answered: [{node_id, origin, text}] (Prometheus text). */
export async function metricsOfEveryNode() {
  const up = cluster.nodes.filter((n) => n.origin && (viewOf(n.origin) || {}).ok);
  const answers = await Promise.all(up.map((n) =>
    request(n.origin, "GET", "/metrics", undefined, READ_TIMEOUT_MS, true).then(
      (text) => ({ ...n, text }), (error) => ({ ...n, error }))));
  return answers;
}
