// The console's pages (docs/console.md): hash routes, each a function that draws into
// <main> and returns its cleanup. DOM is built with h(): text is never parsed as HTML.
import {
  ApiError, POLL_MS, blocked, cluster, metricsOfEveryNode, onCluster, pollCluster, read, request, setToken,
  token, viewOf, write,
} from "./api.js";

const enc = encodeURIComponent;

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function field(label, input) {
  return h("label", {}, label, input);
}

function table(caption, headers, rows, attrs = {}) {
  return h("table", attrs,
    caption ? h("caption", {}, caption) : null,
    h("thead", {}, h("tr", {}, headers.map((x) => h("th", { scope: "col", class: x.num ? "num" : null }, x.label ?? x)))),
    h("tbody", {}, rows));
}

function num(v) {
  return h("td", { class: "num" }, v === null || v === undefined ? "—" : String(v));
}

/** Bytes as a short human number (binary units). */
function bytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${v >= 100 || i === 0 ? v.toFixed(0) : v.toFixed(1)} ${units[i]}`;
}

/** Unix ms as a local date and time (seconds shown). */
function when(ms) {
  if (ms === null || ms === undefined) return "—";
  const d = new Date(ms);
  return `${d.toLocaleDateString()} ${d.toLocaleTimeString()}`;
}

/** A message line: an error (with its code) or a success. */
function say(box, what, kind = "ok") {
  box.replaceChildren();
  if (what instanceof ApiError) {
    box.append(h("div", { class: "msg error", role: "alert" }, `${what.code}: ${what.message}`));
  } else if (what instanceof Error) {
    box.append(h("div", { class: "msg error", role: "alert" }, what.message));
  } else if (what) {
    box.append(h("div", { class: `msg ${kind}`, role: "status" }, what));
  }
}

/** Run `fn` with `button` disabled; its error goes to `box`. */
async function busy(button, box, fn) {
  button.disabled = true;
  try {
    await fn();
  } catch (e) {
    say(box, e);
  } finally {
    button.disabled = false;
  }
}

/** A button that asks again before it acts: the first click arms it. */
function confirmButton(label, action) {
  const b = h("button", { type: "button", class: "danger" }, label);
  let armed = false;
  b.addEventListener("click", () => {
    if (!armed) {
      armed = true;
      b.classList.add("armed");
      b.textContent = `Confirm: ${label.toLowerCase()}`;
      return;
    }
    action(b);
  });
  b.addEventListener("blur", () => {
    armed = false;
    b.classList.remove("armed");
    b.textContent = label;
  });
  return b;
}

// ---- the banner: no master, nodes down ------------------------------------------------

function drawBanner(c) {
  const banner = document.getElementById("banner");
  if (!c.polled) return;
  const parts = [];
  const down = c.nodes.filter((n) => !(viewOf(n.origin) || { ok: true }).ok);
  const all = [...c.views.values()];
  const unauthorized = all.find((v) => !v.ok && v.error.status === 401);
  if (unauthorized) {
    parts.push(h("span", { class: "bad" }, "This cluster needs a token: enter it in the Token field."));
  } else if (all.length && all.every((v) => !v.ok)) {
    parts.push(h("span", { class: "bad" }, "No node answers: the cluster is down or unreachable."));
  } else if (!c.master) {
    parts.push(h("span", { class: "bad", "data-state": "no-master" },
      "No master: writes wait until the nodes elect one."));
  } else {
    parts.push(h("span", { "data-master": c.master.node_id },
      `Master: ${c.master.node_id} (term ${c.master.term})`));
  }
  if (down.length && !unauthorized) {
    parts.push(" · ", h("span", { class: "warn", "data-state": "node-down" },
      `Down: ${down.map((n) => n.node_id).join(", ")}`));
  }
  const unreachable = c.nodes.filter((n) => n.origin && blocked.has(n.origin));
  if (unreachable.length) {
    parts.push(" · ", h("span", { class: "warn", "data-state": "reload" },
      `Reload the page to reach ${unreachable.map((n) => n.node_id).join(", ")}: `
      + "it joined after this page was loaded."));
  }
  banner.replaceChildren(...parts);
}

// ---- Cluster -------------------------------------------------------------------------

function diskCell(d) {
  if (!d) return h("td", {}, "—");
  const pct = Math.round(d.used_ratio * 100);
  const near = d.full || d.used_ratio >= d.full_ratio - 0.05;
  return h("td", { class: d.full ? "disk bad" : near ? "disk warn" : "disk", "data-used": d.used_ratio,
    title: `${bytes(d.free_bytes)} free of ${bytes(d.total_bytes)}; the log refuses appends above `
      + `${Math.round(d.full_ratio * 100)} %, a master refuses writes under ${bytes(d.reserve_bytes)} free` },
  h("meter", { min: 0, max: 1, low: d.full_ratio - 0.05, high: d.full_ratio, optimum: 0, value: d.used_ratio,
    "aria-label": `disk ${pct} % used` }),
  ` ${pct} %`, d.full ? h("strong", {}, " FULL") : null, h("br"),
  h("span", { class: "muted" }, `of ${bytes(d.total_bytes)} · log ${bytes(d.log_bytes)}`));
}

/** Every node's role history → the master's history, newest term first:
 * [{term, leader, since, master_at, how, seen_by}]. A term's leader is what the nodes
 * that saw it say (its own LEADER event, a follower's leader_id); "since" the earliest
 * of their clocks; "how" transfer when the old master recorded a transfer to it. */
function masterHistory(histories) {
  const terms = new Map();
  const transfers = new Set();
  for (const hist of histories) {
    for (const e of hist.events) {
      if (e.event === "transfer") {
        transfers.add(`${e.term}|${e.leader_id}`);
        continue;
      }
      if (!e.leader_id) continue;
      let t = terms.get(e.term);
      if (!t) {
        t = { term: e.term, leader: e.leader_id, since: e.at_ms, master_at: null, seen_by: new Set() };
        terms.set(e.term, t);
      }
      t.since = Math.min(t.since, e.at_ms);
      t.seen_by.add(hist.node_id);
      if (e.event === "master") t.master_at = e.at_ms;
    }
  }
  return [...terms.values()].sort((a, b) => b.term - a.term).map((t) => ({
    ...t, seen_by: [...t.seen_by].sort(), how: transfers.has(`${t.term}|${t.leader}`) ? "transfer" : "election",
  }));
}

/** The Raft members (GET /v1/cluster/members, the master's view): add a learner, promote
 * it once it caught up, remove a member (the master itself hands leadership over first).
 * Each change is one configuration entry in the log (docs/operations.md "Changing the
 * members"); the page waits for it to commit. */
function membersBox(box) {
  const list = h("div", { class: "scroll" });
  const id = h("input", { name: "node_id", required: true, pattern: "[A-Za-z0-9_.\\-]{1,64}", size: 10 });
  const raft = h("input", { name: "raft_addr", required: true, placeholder: "host:port", size: 20 });
  const url = h("input", { name: "http_url", placeholder: "http://host:port", size: 24 });
  const add = h("form", { class: "inline", id: "add-member" },
    field("Node id", id), field("Raft address", raft), field("HTTP URL", url),
    h("button", { type: "submit" }, "Add learner"));
  add.addEventListener("submit", (e) => {
    e.preventDefault();
    busy(add.querySelector("button"), box, async () => {
      say(box, `Adding ${id.value} as a learner…`);
      const body = { node_id: id.value, raft_addr: raft.value };
      if (url.value) body.http_url = url.value;
      const r = await write("POST", "/v1/cluster/members", body);
      say(box, `${id.value} is a learner (configuration entry ${r.config_index}); promote it once it caught up.`);
      await load();
    });
  });

  async function change(label, method, path, done) {
    say(box, `${label}…`);
    const r = await write(method, `${path}?timeout_s=60`);
    say(box, `${done} (configuration entry ${r.config_index}).`);
    await pollCluster();
    await load();
  }

  let drawn = null;
  async function load() {
    const m = await read("/v1/cluster/members");
    // Drawn again only when the members change (an armed Remove keeps its state while
    // the log grows); how far each has the log is updated in place.
    const key = JSON.stringify([m.config_index, m.members.map(({ match_index, ...x }) => x)]);
    if (key === drawn) {
      for (const x of m.members) {
        const cell = list.querySelector(`tr[data-member="${CSS.escape(x.node_id)}"] td.match`);
        if (cell) cell.textContent = x.match_index ?? "—";
      }
      return;
    }
    drawn = key;
    const rows = m.members.map((x) => h("tr", { "data-member": x.node_id, "data-role": x.role },
      h("th", { scope: "row" }, x.node_id), h("td", {}, x.role), h("td", {}, x.raft_addr),
      h("td", {}, x.http_url || "—"), h("td", { class: "muted" }, x.incarnation || "—"),
      h("td", { class: "num match" }, x.match_index ?? "—"),
      h("td", {},
        x.role === "learner"
          ? h("button", { type: "button", class: "secondary", "aria-label": `Promote ${x.node_id} to voter`,
            onclick: (e) => busy(e.target, box, () => change(`Promoting ${x.node_id} (once it caught up)`,
              "POST", `/v1/cluster/members/${enc(x.node_id)}/promote`, `${x.node_id} is a voter`)) }, "Promote")
          : null, " ",
        confirmButton("Remove", (b) => busy(b, box, () => change(`Removing ${x.node_id}`,
          "DELETE", `/v1/cluster/members/${enc(x.node_id)}`, `${x.node_id} is removed`))))));
    list.replaceChildren(table(
      `${m.members.length} member(s), configuration entry ${m.config_index}; a learner receives the log and does not vote`,
      ["Node", "Role", "Raft address", "HTTP URL", "Incarnation", { label: "Has the log to", num: 1 }, ""],
      rows, { id: "members" }));
  }
  const refresh = () => load().catch((e) => say(box, e));
  refresh();
  const off = onCluster(() => { if (!list.isConnected) off(); else refresh(); });
  return h("div", {}, list, add,
    h("p", { class: "muted" }, "Start the new node with --join first; it learns the log from the master. "
      + "Removing the master hands leadership to another node first."));
}

function clusterPage(main) {
  const box = h("div");
  const tableBox = h("div", { class: "scroll" });
  const historyBox = h("div", { id: "history-box" });
  main.append(h("h2", {}, "Cluster"), box, tableBox,
    h("p", { class: "muted" }, "Each row is the node's own answer to GET /v1/cluster, asked every ",
      String(POLL_MS / 1000), " s. Replication lag: the master's last log index minus what the node holds.",
      " Disk: the data directory's file system (the nodes of one machine share it) and the Raft log the node keeps."),
    h("h3", {}, "Members"), membersBox(box),
    h("h3", {}, "Master history"), historyBox);

  let drawn = null; // what the table shows: drawn again only when it changes (keeps focus)
  function draw(c) {
    const shows = JSON.stringify([c.master, c.nodes.map((n) => {
      const v = viewOf(n.origin);
      return [n, v && v.ok, v && (v.ok ? v.view : v.error.message)];
    })]);
    if (shows === drawn) return;
    drawn = shows;
    const masterView = c.master ? viewOf(c.master.origin).view : null;
    const masterEnd = masterView ? masterView.ledger_end_index : null;
    const rows = c.nodes.map((n) => {
      const v = viewOf(n.origin);
      if (!n.origin) {
        return h("tr", { "data-node": n.node_id, "data-state": "unknown" },
          h("th", { scope: "row" }, n.node_id), h("td", {}, "—"), h("td", {}, "unknown"),
          h("td", { colspan: 9 }, "its HTTP URL is not known to the cluster (--peer-urls)"));
      }
      if (!v || !v.ok) {
        const why = v ? v.error.message : "not asked yet";
        return h("tr", { class: "down", "data-node": n.node_id, "data-state": "down" },
          h("th", { scope: "row" }, n.node_id), h("td", {}, n.http_url || "—"),
          h("td", { class: "state-down" }, "down"), h("td", { colspan: 9 }, why));
      }
      const s = v.view;
      const lag = masterEnd === null ? null : Math.max(0, masterEnd - s.ledger_end_index);
      const canLead = c.master && s.broker_role !== "MASTER" && s.raft_role === "FOLLOWER";
      const transfer = canLead
        ? h("button", { type: "button", class: "secondary", "aria-label": `Make ${s.node_id} the master`,
          onclick: (e) => busy(e.target, box, async () => {
            say(box, `Transferring leadership to ${s.node_id}…`);
            await write("POST", "/v1/cluster/leadership", { to: s.node_id });
            await pollCluster();
            say(box, `${s.node_id} is the master now.`);
          }) }, "Make master")
        : null;
      return h("tr", { "data-node": s.node_id, "data-role": s.broker_role, "data-state": "up" },
        h("th", { scope: "row" }, s.node_id), h("td", {}, n.http_url || "—"),
        h("td", { class: "state-up" }, "up"),
        h("td", { class: `role-${s.broker_role}` },
          `${s.broker_role} / ${s.raft_role}${n.role === "learner" ? " (learner)" : ""}`),
        num(s.term), num(s.ledger_end_index), num(s.committed_index), num(s.dispatched_index),
        num(lag), diskCell(s.disk), h("td", {}, s.leader_id || "—"), h("td", {}, transfer));
    });
    tableBox.replaceChildren(table(null,
      ["Node", "HTTP URL", "State", "Role", { label: "Term", num: 1 }, { label: "Log end", num: 1 },
        { label: "Committed", num: 1 }, { label: "Dispatched", num: 1 }, { label: "Lag", num: 1 },
        "Disk", "Leader", ""], rows, { id: "nodes" }));
  }

  // The master's history: every node that answers is asked for its role history, each
  // poll; the table is drawn again only when it changes.
  let stopped = false;
  let historyDrawn = null;
  async function drawHistory() {
    const up = cluster.nodes.filter((n) => n.origin && (viewOf(n.origin) || {}).ok);
    const answers = await Promise.all(up.map((n) => request(n.origin, "GET", "/v1/cluster/history")
      .then((r) => r, () => null)));
    if (stopped) return;
    const histories = answers.filter(Boolean);
    const terms = masterHistory(histories).slice(0, 20);
    const key = JSON.stringify([terms, histories.map((x) => x.node_id)]);
    if (key === historyDrawn) return;
    historyDrawn = key;
    if (!histories.length) {
      historyBox.replaceChildren(h("p", { class: "muted" }, "No node answers: no history to show."));
      return;
    }
    const rows = terms.map((t) => h("tr", { "data-term": t.term, "data-leader": t.leader, "data-how": t.how },
      num(t.term), h("th", { scope: "row" }, t.leader), h("td", {}, when(t.since)),
      h("td", {}, t.master_at === null ? "—" : `${Math.max(0, t.master_at - t.since)} ms`),
      h("td", { class: t.how === "transfer" ? "how-transfer" : "how-election" }, t.how),
      h("td", {}, t.seen_by.join(", "))));
    historyBox.replaceChildren(terms.length
      ? table(`The last ${terms.length} term(s) with a leader, newest first, from the role history of `
        + `${histories.map((x) => x.node_id).join(", ")} (GET /v1/cluster/history; kept in memory since each node's start)`,
      [{ label: "Term", num: 1 }, "Master", "Since", "Became MASTER after", "How", "Seen by"], rows, { id: "history" })
      : h("p", { class: "muted" }, "No leader seen yet."));
  }
  const tick = () => {
    if (stopped) return;
    drawHistory().catch((e) => say(box, e)).finally(() => { if (!stopped) setTimeout(tick, POLL_MS); });
  };

  if (cluster.polled) draw(cluster);
  const off = onCluster(draw);
  if (cluster.polled) tick();
  else pollCluster().finally(tick);
  return () => {
    stopped = true;
    off();
  };
}

// ---- Topics --------------------------------------------------------------------------

function topicsPage(main) {
  const box = h("div");
  const list = h("div");
  const detail = h("div", { id: "topic-detail" });
  const name = h("input", { name: "name", required: true, pattern: "[A-Za-z0-9_%\\|\\-]{1,127}", size: 24 });
  const queues = h("input", { name: "queues", type: "number", min: 1, max: 1024, value: 8, size: 4 });
  const create = h("form", { class: "inline", id: "create-topic" },
    field("Name", name), field("Queues", queues), h("button", { type: "submit" }, "Create topic"));
  create.addEventListener("submit", (e) => {
    e.preventDefault();
    busy(create.querySelector("button"), box, async () => {
      await write("POST", "/v1/topics", { name: name.value, queues: Number(queues.value) });
      say(box, `Topic ${name.value} created.`);
      await load();
    });
  });
  main.append(h("h2", {}, "Topics"), create, box, list, detail);

  async function describe(topic) {
    const t = await read(`/v1/topics/${enc(topic)}`);
    const rows = t.queues.map((q) => h("tr", {}, num(q.queue_id), num(q.min_offset), num(q.max_offset),
      num(q.max_offset - q.min_offset)));
    detail.replaceChildren(h("h3", {}, `Topic ${t.name}`),
      table("Offsets per queue (max = the next offset to be written)",
        [{ label: "Queue", num: 1 }, { label: "Min offset", num: 1 }, { label: "Max offset", num: 1 },
          { label: "Messages", num: 1 }], rows, { id: "queues" }));
  }

  async function load() {
    const { topics } = await read("/v1/topics");
    const rows = topics.map((t) => h("tr", { "data-topic": t.name },
      h("th", { scope: "row" }, t.name), num(t.queues),
      h("td", {},
        h("button", { type: "button", class: "secondary",
          onclick: (e) => busy(e.target, box, () => describe(t.name)) }, "Describe"), " ",
        confirmButton("Delete", (b) => busy(b, box, async () => {
          await write("DELETE", `/v1/topics/${enc(t.name)}`);
          say(box, `Topic ${t.name} deleted.`);
          detail.replaceChildren();
          await load();
        })))));
    list.replaceChildren(topics.length
      ? table(`${topics.length} topic(s)`, ["Name", { label: "Queues", num: 1 }, ""], rows, { id: "topics" })
      : h("p", { class: "muted" }, "No topics yet."));
  }
  load().catch((e) => say(box, e));
}

// ---- Messages ------------------------------------------------------------------------

function bytesOf(m) {
  if (m.encoding === "base64") {
    const bin = atob(m.body);
    return Uint8Array.from(bin, (ch) => ch.charCodeAt(0));
  }
  return new TextEncoder().encode(m.body);
}

function hexdump(bytes, limit = 4096) {
  const lines = [];
  for (let i = 0; i < Math.min(bytes.length, limit); i += 16) {
    const row = [...bytes.slice(i, i + 16)];
    const hex = row.map((b) => b.toString(16).padStart(2, "0")).join(" ");
    const text = row.map((b) => (b >= 32 && b < 127 ? String.fromCharCode(b) : ".")).join("");
    lines.push(`${i.toString(16).padStart(8, "0")}  ${hex.padEnd(47)}  ${text}`);
  }
  if (bytes.length > limit) lines.push(`… ${bytes.length - limit} more bytes`);
  return lines.join("\n");
}

function bodyViews(m) {
  const bytes = bytesOf(m);
  let text = null;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    text = null;
  }
  let json = null;
  if (text !== null) {
    try {
      json = JSON.stringify(JSON.parse(text), null, 2);
    } catch {
      json = null;
    }
  }
  const views = { Text: text ?? "(not UTF-8 text: see Hex)", JSON: json ?? "(not JSON)", Hex: hexdump(bytes) };
  const pre = h("pre", { class: "body" }, json ?? views.Text);
  const buttons = Object.keys(views).map((k) => h("button", { type: "button", class: "secondary",
    onclick: () => { pre.textContent = views[k]; } }, k));
  return [h("div", { class: "views", role: "group", "aria-label": "Show the body as" }, buttons), pre];
}

function messageList(messages) {
  if (!messages.length) return h("p", { class: "muted", "data-empty": "" }, "No messages.");
  return h("div", { class: "messages" }, messages.map((m) => {
    const props = Object.entries(m.properties || {});
    return h("details", { "data-msg-id": m.msg_id, "data-key": m.key || "", "data-queue": m.queue_id },
      h("summary", {}, `${m.topic} q${m.queue_id} @${m.queue_offset}  key=${m.key ?? "—"}  tags=${m.tags ?? "—"}  ${m.msg_id}`),
      h("p", { class: "muted" }, `Stored ${new Date(m.store_timestamp).toISOString()}, born ${new Date(m.born_timestamp).toISOString()}, ${bytesOf(m).length} bytes`),
      props.length ? table("Properties", ["Name", "Value"], props.map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", {}, v)))) : null,
      bodyViews(m));
  }));
}

function messagesPage(main) {
  const box = h("div");
  const out = h("div", { id: "results" });
  const topicOpts = h("datalist", { id: "topic-names" });
  read("/v1/topics").then(({ topics }) => topicOpts.replaceChildren(...topics.map((t) => h("option", { value: t.name }))), () => {});
  const topic = () => h("input", { name: "topic", required: true, list: "topic-names", size: 18 });

  const sTopic = topic();
  const sKey = h("input", { name: "key", size: 12 });
  const sTags = h("input", { name: "tags", size: 10 });
  const sShard = h("input", { name: "sharding_key", size: 10 });
  const sDelay = h("input", { name: "delay_s", type: "number", min: 0, step: "any", size: 6,
    placeholder: "none" });
  const sProps = h("textarea", { name: "properties", rows: 2, placeholder: "name=value, one a line" });
  const sBody = h("textarea", { name: "body", rows: 2 }, "hello from the console");
  const send = h("form", { class: "inline", id: "send" }, field("Topic", sTopic), field("Key", sKey),
    field("Tags", sTags), field("Sharding key (FIFO)", sShard), field("Delay (s)", sDelay),
    field("Properties", sProps), field("Body (UTF-8)", sBody), h("button", { type: "submit" }, "Send"));
  const sent = h("div", { id: "sent" });
  send.addEventListener("submit", (e) => {
    e.preventDefault();
    busy(send.querySelector("button"), box, async () => {
      const msg = { body: sBody.value };
      if (sKey.value) msg.key = sKey.value;
      if (sTags.value) msg.tags = sTags.value;
      if (sShard.value) msg.sharding_key = sShard.value;
      if (sDelay.value !== "") msg.delay_ms = Math.round(Number(sDelay.value) * 1000);
      const props = {};
      for (const [i, line] of sProps.value.split("\n").entries()) {
        if (!line.trim()) continue;
        const at = line.indexOf("=");
        if (at < 1) throw new Error(`Properties, line ${i + 1}: write name=value`);
        props[line.slice(0, at).trim()] = line.slice(at + 1);
      }
      if (Object.keys(props).length) msg.properties = props;
      const r = await write("POST", `/v1/topics/${enc(sTopic.value)}/messages`, { messages: [msg] });
      const x = r.results[0];
      sent.replaceChildren();
      sent.dataset.msgId = x.msg_id;
      sent.dataset.queue = x.queue_id ?? "";
      if (x.deliver_at_ms !== undefined && x.deliver_at_ms !== null) {
        say(box, `Sent: ${x.msg_id}, a delay message due at ${when(x.deliver_at_ms)} (recall handle ${x.recall_handle}).`);
        const topicName = sTopic.value;
        const cancel = confirmButton("Cancel it", (b) => busy(b, box, async () => {
          await write("DELETE", `/v1/delayed/${enc(x.recall_handle)}`);
          say(box, `Delay message ${x.recall_handle} of ${topicName} cancelled: it will not be delivered.`);
          sent.replaceChildren();
        }));
        sent.append(h("p", { "data-recall": x.recall_handle, "data-due": x.deliver_at_ms }, cancel));
      } else {
        say(box, `Sent: ${x.msg_id} to queue ${x.queue_id} at offset ${x.queue_offset}.`);
      }
    });
  });

  const fTopic = topic();
  const fKey = h("input", { name: "key", size: 14 });
  const fId = h("input", { name: "msg_id", size: 34 });
  const find = h("form", { class: "inline", id: "find" }, field("Topic", fTopic), field("Key", fKey),
    h("span", { class: "muted" }, "or"), field("Message id (no topic needed)", fId),
    h("button", { type: "submit" }, "Find"));
  fTopic.required = false;
  find.addEventListener("submit", (e) => {
    e.preventDefault();
    busy(find.querySelector("button"), box, async () => {
      say(box, null);
      if (fId.value) {
        const m = await read(`/v1/messages/${enc(fId.value.trim())}?encoding=base64`);
        out.replaceChildren(messageList([m]));
      } else if (fTopic.value && fKey.value) {
        const r = await read(`/v1/topics/${enc(fTopic.value)}/messages?key=${enc(fKey.value)}&max=64&encoding=base64`);
        out.replaceChildren(messageList(r.messages));
      } else {
        throw new Error("Give a topic and a key, or a message id.");
      }
    });
  });

  const bTopic = topic();
  const bQueue = h("input", { name: "queue_id", type: "number", min: 0, value: 0, size: 4 });
  const bOffset = h("input", { name: "offset", type: "number", min: 0, value: 0, size: 8 });
  const bMax = h("input", { name: "max_messages", type: "number", min: 1, max: 256, value: 32, size: 4 });
  const browse = h("form", { class: "inline", id: "browse" }, field("Topic", bTopic), field("Queue", bQueue),
    field("From offset", bOffset), field("At most", bMax), h("button", { type: "submit" }, "Browse"));
  browse.addEventListener("submit", (e) => {
    e.preventDefault();
    busy(browse.querySelector("button"), box, async () => {
      say(box, null);
      const r = await read(`/v1/topics/${enc(bTopic.value)}/queues/${enc(bQueue.value)}/messages?offset=${enc(bOffset.value)}&max_messages=${enc(bMax.value)}&encoding=base64`);
      out.replaceChildren(h("p", { class: "muted" },
        `${r.status}: queue offsets ${r.min_offset} to ${r.max_offset}; next offset ${r.next_offset}`),
      messageList(r.messages));
      if (r.messages.length) bOffset.value = r.next_offset;
    });
  });

  main.append(h("h2", {}, "Messages"), topicOpts,
    h("h3", {}, "Send a test message"), send, sent,
    h("h3", {}, "Find by key or message id"), find,
    h("h3", {}, "Browse a queue"), browse, box, out);
}

// ---- Groups --------------------------------------------------------------------------

/** A datetime-local input's value as Unix ms (the browser's time zone), or NaN. */
function localMs(value) {
  return value ? new Date(value).getTime() : NaN;
}

function groupsPage(main) {
  const box = h("div");
  const list = h("div");
  const detail = h("div", { id: "group-detail" });
  const actions = h("div", { id: "group-actions" });
  const popBox = h("div", { id: "pop-box" });
  let selected = null;
  let timer = null;
  main.append(h("h2", {}, "Consumer groups"), box, list, detail, actions, popBox);

  async function drawOffsets() {
    if (!selected) return;
    const group = selected;
    const { offsets } = await read(`/v1/groups/${enc(group)}/offsets`);
    if (group !== selected) return;
    const pop = offsets.some((o) => "in_flight" in o);
    const total = offsets.reduce((s, o) => s + (o.lag || 0), 0);
    const rows = offsets.map((o) => h("tr", { "data-topic": o.topic, "data-queue": o.queue_id },
      h("td", {}, o.topic), num(o.queue_id), num(pop ? o.next_offset : o.committed_offset),
      pop ? num(o.in_flight) : null, num(o.max_offset), num(o.lag)));
    const topics = [...new Set(offsets.map((o) => o.topic))];
    detail.replaceChildren(h("h3", {}, `Group ${group}${pop ? " (POP)" : ""}`),
      h("p", {}, "Total lag: ", h("strong", { id: "total-lag", "data-lag": total }, String(total)),
        h("span", { class: "muted" }, ` · refreshed every ${POLL_MS / 1000} s`)),
      table("Lag per queue", ["Topic", { label: "Queue", num: 1 },
        { label: pop ? "Next offset" : "Committed", num: 1 }, pop ? { label: "In flight", num: 1 } : null,
        { label: "Max offset", num: 1 }, { label: "Lag", num: 1 }].filter(Boolean), rows, { id: "lag" }));
    if (pop) {
      if (actions.firstChild) actions.replaceChildren();
      await drawPopStats(group);
      return;
    }
    // Drawn again only for another group or other topics: a refresh keeps its choices.
    const forms = offsetForms(group, topics);
    if (actions.firstChild !== forms) actions.replaceChildren(forms);
  }

  // Kept across the redraws of the table, so that a choice survives the refresh.
  const kept = { forms: null, group: null, topics: "" };
  function offsetForms(group, topics) {
    if (kept.forms && kept.group === group && kept.topics === JSON.stringify(topics)) return kept.forms;
    const options = () => topics.map((t) => h("option", { value: t }, t));

    // Commit one queue's offset (a commit moves a group forward only; a reset moves it anywhere).
    const cTopic = h("select", { name: "topic" }, options());
    const cQueue = h("input", { name: "queue_id", type: "number", min: 0, value: 0, size: 4 });
    const cOffset = h("input", { name: "offset", type: "number", min: 0, value: 0, size: 8 });
    const commit = h("form", { class: "inline", id: "commit" },
      field("Topic", cTopic), field("Queue", cQueue), field("Next offset", cOffset),
      h("button", { type: "submit" }, "Commit"));
    commit.addEventListener("submit", (e) => {
      e.preventDefault();
      busy(commit.querySelector("button"), box, async () => {
        const r = await write("PUT", `/v1/groups/${enc(group)}/offsets`,
          { topic: cTopic.value, offsets: { [String(cQueue.value)]: Number(cOffset.value) } });
        const now = r.offsets[String(cQueue.value)];
        say(box, now === Number(cOffset.value)
          ? `Group ${group} committed ${now} on ${cTopic.value} q${cQueue.value}.`
          : `Group ${group} stays at ${now} on ${cTopic.value} q${cQueue.value}: a commit only moves forward (reset to move back).`);
        await drawOffsets();
      });
    });

    const topic = h("select", { name: "topic" }, options());
    const at = h("input", { name: "at", type: "datetime-local", step: 1, "aria-label": "the time to reset to" });
    const to = h("select", { name: "to", onchange: () => { at.disabled = to.value !== "time"; } },
      h("option", { value: "earliest" }, "earliest"), h("option", { value: "latest" }, "latest"),
      h("option", { value: "time" }, "a time…"));
    at.disabled = true;
    const go = confirmButton("Reset offsets", (b) => busy(b, box, async () => {
      let target = to.value;
      if (target === "time") {
        target = localMs(at.value);
        if (Number.isNaN(target)) throw new Error("Choose the time to reset to.");
      }
      const r = await write("POST", `/v1/groups/${enc(group)}/offsets/reset`, { topic: topic.value, to: target });
      const said = typeof target === "number" ? `the first message stored at or after ${when(target)}` : target;
      say(box, `Group ${group} reset to ${said} on ${topic.value}: ${Object.entries(r.offsets).map(([q, o]) => `q${q}=${o}`).join(" ")}.`);
      await drawOffsets();
    }));
    go.type = "button";
    const reset = h("form", { class: "inline", id: "reset", onsubmit: (e) => e.preventDefault() },
      field("Topic", topic), field("To", to), field("Time (store time, local)", at), go);
    kept.forms = h("div", {}, h("h3", {}, "Commit a queue's offset"), commit,
      h("h3", {}, "Reset to earliest, latest or a time"), reset);
    kept.group = group;
    kept.topics = JSON.stringify(topics);
    return kept.forms;
  }

  // ---- a POP group: its configuration, counters, dead letters and redrive ----------
  const popKept = { group: null, stats: h("div"), config: h("div"), dlq: h("div") };

  async function drawPopStats(group) {
    const d = await read(`/v1/groups/${enc(group)}`);
    if (group !== selected) return;
    const rows = d.topics.map((t) => h("tr", { "data-topic": t.topic }, h("th", { scope: "row" }, t.topic),
      num(t.in_flight), num(t.delivered), num(t.redelivered), num(t.acked), num(t.nacked), num(t.expired),
      num(t.dead_lettered)));
    popKept.stats.replaceChildren(table("Since the group began (replicated: the same on every node)",
      ["Topic", { label: "In flight", num: 1 }, { label: "Delivered", num: 1 }, { label: "Redelivered", num: 1 },
        { label: "Acked", num: 1 }, { label: "Nacked", num: 1 }, { label: "Expired", num: 1 },
        { label: "Dead letters", num: 1 }], rows, { id: "pop-stats" }));
    if (popKept.group !== group) {
      popKept.group = group;
      popBox.replaceChildren(h("h3", {}, "Deliveries"), popKept.stats,
        h("h3", {}, "Configuration"), popKept.config, h("h3", {}, `Dead letters (%DLQ%${group})`), popKept.dlq);
      drawConfig(group, d);
      await drawDeadLetters(group, d.redrive_next_offset);
    }
  }

  function drawConfig(group, d) {
    const fifo = h("input", { name: "fifo", type: "checkbox", checked: d.fifo ? true : null });
    const attempts = h("input", { name: "max_delivery_attempts", type: "number", min: 1, max: 1000,
      value: d.max_delivery_attempts, size: 4 });
    const retryNow = d.retry ? JSON.stringify(d.retry) : "the default";
    // The retry policy: kept, a list of delays, or exponential (initial × multiplier^n,
    // capped): the fields of the other policy are hidden.
    const exp = d.retry && d.retry.policy === "exponential" ? d.retry : {};
    const policy = h("select", { name: "retry_policy" },
      h("option", { value: "keep" }, "keep the current"), h("option", { value: "list" }, "delays, one per attempt"),
      h("option", { value: "exponential" }, "exponential"));
    const delays = h("input", { name: "delays_ms", size: 24, placeholder: "1000, 5000, 30000" });
    const initial = h("input", { name: "initial_ms", type: "number", min: 0, max: 604800000, size: 8,
      value: exp.initial_ms ?? 1000 });
    const multiplier = h("input", { name: "multiplier", type: "number", min: 1, max: 10, step: "any", size: 4,
      value: exp.multiplier ?? 2 });
    const maxMs = h("input", { name: "max_ms", type: "number", min: 0, max: 604800000, size: 9,
      value: exp.max_ms ?? 7200000 });
    const listFields = h("span", { class: "policy-fields", hidden: true },
      field("Retry delays, ms (comma-separated)", delays));
    const expFields = h("span", { class: "policy-fields", hidden: true },
      field("First delay, ms", initial), field("Multiplier", multiplier), field("At most, ms", maxMs));
    policy.addEventListener("change", () => {
      listFields.hidden = policy.value !== "list";
      expFields.hidden = policy.value !== "exponential";
    });
    const form = h("form", { class: "inline", id: "pop-config" },
      field("FIFO (one message of a sharding key at a time)", fifo),
      field("Max delivery attempts", attempts), field("Retry", policy), listFields, expFields,
      h("button", { type: "submit" }, "Save"));
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      busy(form.querySelector("button"), box, async () => {
        const body = { mode: "pop", fifo: fifo.checked, max_delivery_attempts: Number(attempts.value), start: d.start };
        if (policy.value === "list") {
          body.retry = { policy: "list", delays_ms: delays.value.split(",").map((x) => Number(x.trim())) };
        } else if (policy.value === "exponential") {
          body.retry = { policy: "exponential", initial_ms: Number(initial.value),
            multiplier: Number(multiplier.value), max_ms: Number(maxMs.value) };
        } else if (d.retry) {
          body.retry = d.retry;
        }
        const saved = await write("PUT", `/v1/groups/${enc(group)}`, body);
        say(box, `Group ${group} saved: fifo ${saved.fifo}, ${saved.max_delivery_attempts} attempts, retry ${JSON.stringify(saved.retry)}.`);
        drawConfig(group, saved);
      });
    });
    popKept.config.replaceChildren(h("p", { class: "muted", id: "pop-config-now" },
      `Now: ${d.fifo ? "FIFO" : "not FIFO"}, at most ${d.max_delivery_attempts} delivery attempts, retry ${retryNow},`
      + ` started at ${d.start}.`), form);
  }

  async function drawDeadLetters(group, redriveNext) {
    const topic = `%DLQ%${group}`;
    const { topics } = await read("/v1/topics"); // asked first: a 404 would be an error in the page
    if (!topics.some((t) => t.name === topic)) {
      popKept.dlq.replaceChildren(h("p", { class: "muted", id: "dlq-none" }, "No dead letters: the group has never written one."));
      return;
    }
    const r = await read(`/v1/topics/${enc(topic)}/queues/0/messages?offset=0&max_messages=1&encoding=base64`);
    const from = Math.max(r.min_offset, r.max_offset - 20);
    const page = await read(`/v1/topics/${enc(topic)}/queues/0/messages?offset=${from}&max_messages=20&encoding=base64`);
    if (group !== selected) return;
    const waiting = Math.max(0, r.max_offset - Math.max(redriveNext ?? 0, r.min_offset));
    const redrive = confirmButton("Redrive", (b) => busy(b, box, async () => {
      const x = await write("POST", `/v1/groups/${enc(group)}/dlq/redrive`, {});
      say(box, `Redrive: ${x.redriven} dead letter(s) produced back to their topics, ${x.skipped} skipped (topic gone); next ${x.next_offset}.`);
      await drawDeadLetters(group, x.next_offset);
    }));
    popKept.dlq.replaceChildren(
      h("p", { id: "dlq-summary", "data-dead": r.max_offset - r.min_offset, "data-waiting": waiting },
        `${r.max_offset - r.min_offset} dead letter(s) kept (offsets ${r.min_offset} to ${r.max_offset}); `,
        h("strong", {}, `${waiting} not produced back yet`), ` (redrive position ${redriveNext ?? 0}). `, redrive,
        " ", h("button", { type: "button", class: "secondary",
          onclick: (e) => busy(e.target, box, async () => {
            const d = await read(`/v1/groups/${enc(group)}`);
            await drawDeadLetters(group, d.redrive_next_offset);
          }) }, "Refresh")),
      h("p", { class: "muted" }, `The last ${page.messages.length} (each with its origin in DLQ_ORIGIN_* and DELIVERY_ATTEMPTS):`),
      messageList(page.messages));
  }

  async function load() {
    const { groups } = await read("/v1/groups");
    list.replaceChildren(groups.length
      ? table(`${groups.length} group(s)`, ["Group", ""], groups.map((g) => h("tr", { "data-group": g },
        h("th", { scope: "row" }, g),
        h("td", {}, h("button", { type: "button", class: "secondary", onclick: (e) => busy(e.target, box, async () => {
          selected = g;
          popKept.group = null;
          popBox.replaceChildren();
          actions.replaceChildren();
          say(box, null);
          await drawOffsets();
        }) }, "Show")))), { id: "groups" })
      : h("p", { class: "muted" }, "No consumer groups yet."));
  }
  load().catch((e) => say(box, e));
  timer = setInterval(() => drawOffsets().catch((e) => say(box, e)), POLL_MS);
  return () => clearInterval(timer);
}

// ---- Rates ---------------------------------------------------------------------------

const SAMPLES = 60; // two minutes at POLL_MS
const SERIES = [
  // [metric, label, unit]: counters summed over every node, as a rate per second
  ["ledgermq_produced_messages_total", "Produced", "msg/s"],
  ["ledgermq_pulled_messages_total", "Served to consumers", "msg/s"],
  ["ledgermq_produced_bytes_total", "Produced bytes", "B/s"],
  ["ledgermq_http_errors_total", "HTTP error answers", "/s"],
];

/** Prometheus text → [{name, labels, value}] (comments and malformed lines left out). */
function parseMetrics(text) {
  const out = [];
  for (const line of text.split("\n")) {
    const m = line.match(/^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    for (const l of (m[2] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    out.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

function chart(label, unit, points, digits = 1) {
  const w = 480, hgt = 110, pad = 4;
  const known = points.filter((p) => p.v !== null);
  const max = Math.max(0, ...known.map((p) => p.v));
  const top = max || 1;
  const x = (i) => pad + (i * (w - 2 * pad)) / (SAMPLES - 1);
  const y = (v) => hgt - pad - (v * (hgt - 2 * pad)) / top;
  const start = SAMPLES - points.length;
  const line = points.map((p, i) => (p.v === null ? null : `${x(start + i).toFixed(1)},${y(p.v).toFixed(1)}`))
    .filter(Boolean).join(" ");
  const lastPoint = points.length ? points[points.length - 1].v : 0;
  const last = lastPoint ?? 0;
  const now = lastPoint === null ? "none now" : `${last.toFixed(digits)} ${unit}`;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${hgt}`);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `${label}: ${now}, at most ${max.toFixed(digits)}`);
  const poly = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  poly.setAttribute("points", line);
  poly.setAttribute("class", "series");
  svg.append(poly);
  return h("figure", { class: "chart", "data-series": label, "data-last": last.toFixed(3), "data-max": max.toFixed(3) },
    h("figcaption", {}, h("strong", {}, label), ` ${now}`,
      h("span", { class: "muted" }, ` (max ${max.toFixed(digits)})`)), svg);
}

/** The q-quantile (0..1) of a histogram's cumulative buckets [[le, count]] sorted by le,
 * as Prometheus's histogram_quantile: linear within the bucket; null with no count. */
function quantile(q, buckets) {
  if (!buckets.length) return null;
  const total = buckets[buckets.length - 1][1];
  if (total <= 0) return null;
  const rank = q * total;
  let prevLe = 0, prevCount = 0;
  for (const [le, count] of buckets) {
    if (count >= rank) {
      if (le === Infinity) return prevLe; // past the last bound: its lower edge
      const inBucket = count - prevCount;
      return prevLe + (le - prevLe) * (inBucket > 0 ? (rank - prevCount) / inBucket : 1);
    }
    prevLe = le;
    prevCount = count;
  }
  return prevLe;
}

const LATENCIES = [
  // [histogram buckets, label]: the p99 of each interval, the nodes' histograms summed
  ["ledgermq_produce_latency_seconds_bucket", "Produce p99"],
  ["ledgermq_raft_commit_latency_seconds_bucket", "Raft commit p99"],
];
const BACKLOGS = [
  // [gauge, label, counter of its events]: replicated state, the same on every node
  ["ledgermq_delay_pending", "Delay messages pending", "ledgermq_delay_messages_total"],
  ["ledgermq_transactions_pending", "Transactions pending", "ledgermq_transactions_total"],
];

function ratesPage(main) {
  const box = h("div");
  const charts = h("div", { id: "rates", class: "charts" });
  const perTopic = h("div");
  const latency = h("div", { id: "latency", class: "charts" });
  const backlogs = h("div", { id: "backlogs", class: "charts" });
  const backlogCounts = h("div");
  const txBox = h("div", { id: "transactions" });
  main.append(h("h2", {}, "Rates"), box, charts, perTopic,
    h("h3", {}, "Latency"), latency,
    h("h3", {}, "Delay and transaction backlogs"), backlogs, backlogCounts,
    h("h3", {}, "Transactions not resolved yet"), txBox,
    h("p", { class: "muted" }, `Every node's /metrics every ${POLL_MS / 1000} s; the counters`,
      " summed over the nodes that answer, as a rate per second over the last two minutes.",
      " Produce p99: from the nodes' produce latency histograms (received to committed and dispatched);",
      " Raft commit p99: proposal to quorum commit;",
      " over each interval, as Prometheus's histogram_quantile. Backlogs: what is pending now",
      " (replicated: every node says the same; the master's, or any node's with none)."));
  let previous = null; // {at, totals: Map(key -> value) per node, buckets: Map(le -> count)}
  const history = new Map(SERIES.map(([metric]) => [metric, []]));
  const p99 = new Map(LATENCIES.map(([metric]) => [metric, []]));
  const pending = new Map(BACKLOGS.map(([gauge]) => [gauge, []]));
  let stopped = false;

  function push(points, v) {
    points.push(v);
    if (points.length > SAMPLES) points.shift();
  }

  async function sample() {
    const answers = await metricsOfEveryNode();
    const at = Date.now();
    const totals = new Map(); // `${node}|${metric}|${topic}` -> value
    const buckets = new Map(); // `${metric}|${le}` -> count, summed over the nodes
    let state = null; // the backlog gauges and counters of the master (else any node)
    for (const a of answers) {
      if (a.error) {
        say(box, a.error);
        continue;
      }
      const parsed = parseMetrics(a.text);
      const mine = { gauges: new Map(), events: new Map() };
      for (const m of parsed) {
        if (history.has(m.name)) totals.set(`${a.node_id}|${m.name}|${m.labels.topic ?? m.labels.code ?? ""}`, m.value);
        else if (p99.has(m.name)) {
          const key = `${m.name}|${m.labels.le}`;
          buckets.set(key, (buckets.get(key) || 0) + m.value);
        } else if (pending.has(m.name)) mine.gauges.set(m.name, m.value);
        else if (m.labels.event !== undefined) mine.events.set(`${m.name}|${m.labels.event}`, m.value);
      }
      if (!state || (cluster.master && cluster.master.node_id === a.node_id)) state = mine;
    }
    for (const [gauge] of BACKLOGS) push(pending.get(gauge), { at, v: state ? (state.gauges.get(gauge) ?? null) : null });
    if (previous) {
      const dt = (at - previous.at) / 1000;
      const topicRates = new Map();
      const sums = new Map(SERIES.map(([metric]) => [metric, 0]));
      for (const [key, value] of totals) {
        const before = previous.totals.get(key);
        const delta = before === undefined || value < before ? 0 : value - before; // a restart resets
        const [, metric, topic] = key.split("|");
        sums.set(metric, sums.get(metric) + delta / dt);
        if (metric !== "ledgermq_http_errors_total") {
          const r = topicRates.get(topic) || {};
          r[metric] = (r[metric] || 0) + delta / dt;
          topicRates.set(topic, r);
        }
      }
      for (const [metric, v] of sums) push(history.get(metric), { at, v });
      // Each interval's histogram: this sample's buckets minus the last (a restart: none).
      for (const [metric, points] of p99) {
        const window = [...buckets].filter(([k]) => k.startsWith(`${metric}|`))
          .map(([k, count]) => {
            const le = k.slice(metric.length + 1);
            return [le === "+Inf" ? Infinity : Number(le), count - (previous.buckets.get(k) ?? count)];
          })
          .sort((x, y) => x[0] - y[0]);
        const q = window.some(([, c]) => c < 0) ? null : quantile(0.99, window);
        push(points, { at, v: q === null ? null : q * 1000 });
      }
      charts.replaceChildren(...SERIES.map(([metric, label, unit]) => chart(label, unit, history.get(metric))));
      latency.replaceChildren(...LATENCIES.map(([metric, label]) => chart(label, "ms", p99.get(metric))));
      const rows = [...topicRates].sort().map(([topic, r]) => h("tr", { "data-topic": topic },
        h("th", { scope: "row" }, topic), num((r.ledgermq_produced_messages_total || 0).toFixed(1)),
        num((r.ledgermq_pulled_messages_total || 0).toFixed(1))));
      perTopic.replaceChildren(rows.length
        ? table("Per topic, now", ["Topic", { label: "Produced msg/s", num: 1 }, { label: "Served msg/s", num: 1 }], rows)
        : null);
    } else {
      charts.replaceChildren(h("p", { class: "muted" }, "Measuring: the first rates come with the next sample."));
    }
    backlogs.replaceChildren(...BACKLOGS.map(([gauge, label]) => chart(label, "", pending.get(gauge), 0)));
    backlogCounts.replaceChildren(state
      ? table("Since the group's start (replicated counters)", ["Backlog", "Events"], BACKLOGS.map(([gauge, label, counter]) => {
        const events = [...state.events].filter(([k]) => k.startsWith(`${counter}|`))
          .map(([k, v]) => `${k.slice(counter.length + 1)} ${v}`);
        return h("tr", { "data-backlog": gauge, "data-pending": state.gauges.get(gauge) ?? "" },
          h("th", { scope: "row" }, `${label}: ${state.gauges.get(gauge) ?? "—"}`),
          h("td", {}, events.join(" · ") || "none yet"));
      }), { id: "backlog-counts" })
      : null);
    previous = { at, totals, buckets };
    await drawTransactions();
  }

  // The unresolved transactions, oldest first (GET /v1/transactions, an admin's read):
  // drawn again only when they change, so that an armed button stays armed.
  let txDrawn = null;
  let txForbidden = false; // a token without the admin scope: said once, not asked again
  async function drawTransactions() {
    if (txForbidden) return;
    let transactions;
    try {
      ({ transactions } = await read("/v1/transactions"));
    } catch (e) {
      if (!(e instanceof ApiError && e.status === 403)) throw e;
      txForbidden = true;
      txBox.replaceChildren(h("p", { class: "muted", id: "tx-forbidden" },
        `Listing transactions needs a token with the admin scope (${e.code}: ${e.message}).`));
      return;
    }
    const key = JSON.stringify(transactions);
    if (key === txDrawn || stopped) return;
    txDrawn = key;
    const end = (t, action, label) => confirmButton(label, (b) => busy(b, box, async () => {
      const r = await write("POST", `/v1/transactions/${enc(t.transaction_id)}`, { action });
      say(box, `Transaction ${t.transaction_id} of ${t.topic}: ${r.state}.`);
      txDrawn = null;
      await drawTransactions();
    }));
    const shown = transactions.slice(0, 50);
    txBox.replaceChildren(transactions.length
      ? table(`${transactions.length} unresolved, oldest first${transactions.length > shown.length ? " (the first 50)" : ""}:`
        + " commit delivers the half messages, roll back drops them",
      ["Transaction", "Topic", "Producer group", { label: "Messages", num: 1 }, "Stored", { label: "Checks", num: 1 },
        "Next check", ""],
      shown.map((t) => h("tr", { "data-tx": t.transaction_id }, h("th", { scope: "row" }, t.transaction_id),
        h("td", {}, t.topic), h("td", {}, t.producer_group), num(t.messages), h("td", {}, when(t.born)),
        num(t.check_count), h("td", {}, when(t.next_check)),
        h("td", {}, end(t, "commit", "Commit"), " ", end(t, "rollback", "Roll back")))), { id: "tx-list" })
      : h("p", { class: "muted", id: "tx-none" }, "None."));
  }

  const tick = () => {
    if (stopped) return;
    sample().catch((e) => say(box, e)).finally(() => { if (!stopped) setTimeout(tick, POLL_MS); });
  };
  if (cluster.polled) tick();
  else pollCluster().finally(tick);
  return () => { stopped = true; };
}

// ---- the router ----------------------------------------------------------------------

const PAGES = {
  cluster: clusterPage, topics: topicsPage, messages: messagesPage, groups: groupsPage, rates: ratesPage,
};
let cleanup = null;

function route(event) {
  const name = (location.hash.match(/^#\/(\w+)/) || [])[1];
  const page = PAGES[name] ? name : "cluster";
  if (cleanup) cleanup();
  cleanup = null;
  const main = document.getElementById("page");
  main.replaceChildren();
  main.dataset.page = page;
  for (const a of document.querySelectorAll("nav a")) {
    if (a.dataset.page === page) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  document.title = `${page[0].toUpperCase()}${page.slice(1)} · LedgerMQ console`;
  cleanup = PAGES[page](main) || null;
  if (event) main.focus(); // a screen reader starts at the new page, not the nav
}

function start() {
  const input = document.getElementById("token");
  input.value = token();
  document.getElementById("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    setToken(input.value.trim());
    pollCluster().then(() => route());
  });
  onCluster(drawBanner);
  onCluster((c) => {
    document.getElementById("footer").textContent =
      `Served by ${location.origin} · ${c.urls.length} node URL(s) known · last poll ${new Date().toLocaleTimeString()}`;
  });
  window.addEventListener("hashchange", route);
  route();
  const tick = () => pollCluster().finally(() => setTimeout(tick, POLL_MS));
  tick();
}

start();
