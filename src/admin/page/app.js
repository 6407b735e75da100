// The fleet page: polls /fleet/live once a second and renders it. Everything shown comes from
// nodes and clients, so text goes in with textContent only, never as HTML.
"use strict";

const POLL_MS = 1000;
const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) {
    if (c == null) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

const fmt = {
  ms(v) {
    if (v == null) return "–";
    return v >= 1000 ? (v / 1000).toFixed(2) + " s" : v.toFixed(v < 10 ? 1 : 0) + " ms";
  },
  rate(v) { return v == null ? "–" : v.toFixed(v < 10 ? 2 : 1); },
  ctx(n) { return !n ? "?" : n >= 1024 ? Math.round(n / 1024) + "k" : String(n); },
  age(ms) {
    const s = Math.max(0, Math.round(ms / 1000));
    return s < 60 ? s + " s" : Math.floor(s / 60) + " min " + (s % 60) + " s";
  },
  time(ms) { return new Date(ms).toLocaleTimeString([], { hour12: false }); },
  pts(v) { return (v > 0 ? "+" : "") + v.toFixed(1); },
};

function badge(text, kind) {
  return el("span", { class: "badge " + (kind || text) }, text);
}

// A small inline SVG bar chart of `values` (nulls are gaps).
function spark(values, cls) {
  const w = 180, h = 26, n = values.length;
  const max = Math.max(1e-9, ...values.filter((v) => v != null));
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("class", "spark " + cls);
  const bw = w / n;
  values.forEach((v, i) => {
    if (!v) return;
    const r = document.createElementNS(ns, "rect");
    const bh = Math.max(1.5, (v / max) * (h - 2));
    r.setAttribute("x", (i * bw).toFixed(2));
    r.setAttribute("y", (h - bh).toFixed(2));
    r.setAttribute("width", Math.max(1, bw - 0.6).toFixed(2));
    r.setAttribute("height", bh.toFixed(2));
    svg.append(r);
  });
  const t = document.createElementNS(ns, "title");
  t.textContent = "peak " + (cls === "ttft" ? fmt.ms(max) : max + " per bucket");
  svg.append(t);
  return svg;
}

function replaceRows(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function renderNodes(nodes) {
  const rows = nodes.map((n) => {
    const models = el("div", { class: "models" }, ...n.models.map((m) => el("span", {
      class: "model " + m.warmth,
      title: `${m.name}: ${m.warmth}${m.on_disk ? "" : ", not on disk"}, ${m.size_gb} GB, p75 ${fmt.ms(m.p75_ms)}, TTFT ${fmt.ms(m.ttft_ms)}`,
    }, el("b", {}, m.name), " ", fmt.ctx(m.max_context), " · ", `${m.in_flight}/${m.pending}`,
    m.breaker.state !== "closed" ? badge(m.breaker.state.replace("_", "-"), "breaker") : null)));
    const seats = el("span", { class: "seats" }, `${n.in_flight} / ${n.seats}`,
      el("span", { class: "muted" }, ` (cap ${n.hard_cap})`));
    const actions = el("td", { class: "actions" },
      el("button", { class: "pause", onclick: () => control(n.id, "pause") }, "Pause"),
      el("button", { class: "drain", onclick: () => control(n.id, "drain") }, "Drain"),
      (n.control.paused || n.control.draining)
        ? el("button", { class: "resume", onclick: () => control(n.id, "resume") }, "Resume") : null);
    return el("tr", { class: "node", "data-node": n.id },
      el("td", { class: "id", title: n.url }, n.id, n.dynamic ? el("span", { class: "muted" }, " (registered)") : null),
      el("td", { class: "state" }, badge(n.health), n.last_error && n.health === "offline"
        ? el("div", { class: "muted small" }, n.last_error) : null),
      el("td", { class: "tier" }, n.tier),
      el("td", {}, seats),
      el("td", { class: "breaker" }, badge(n.breaker.state.replace("_", "-"), "breaker-" + n.breaker.state)),
      el("td", {}, models),
      actions);
  });
  replaceRows($("nodes").tBodies[0], rows);
  const online = nodes.filter((n) => n.health === "online").length;
  $("nodes-online").textContent = `${online} / ${nodes.length}`;
  $("in-flight").textContent = nodes.reduce((a, n) => a + n.in_flight, 0);
}

function renderTraffic(traffic) {
  const live = traffic.filter((t) => t.total > 0);
  const rows = live.map((t) => el("tr", { class: "traffic", "data-node": t.node, "data-model": t.model },
    el("td", {}, t.node), el("td", {}, t.model),
    el("td", { class: "num rate" }, fmt.rate(t.rate_1m)),
    el("td", { class: "num" }, fmt.ms(t.ttft_1m_ms)),
    el("td", { class: "num served" }, t.total),
    el("td", { class: "num" }, t.errors.reduce((a, b) => a + b, 0)),
    el("td", {}, spark(t.requests, "req")),
    el("td", {}, spark(t.ttft_ms, "ttft"))));
  replaceRows($("traffic").tBodies[0], rows);
  $("traffic-empty").hidden = live.length > 0;
  $("served-total").textContent = traffic.reduce((a, t) => a + t.total, 0);
  $("rate-total").textContent = fmt.rate(traffic.reduce((a, t) => a + t.rate_1m, 0));
}

function renderQueue(holding, waiting) {
  const rows = waiting.map((w) => el("tr", {},
    el("td", {}, "#" + w.id), el("td", {}, w.protocol), el("td", {}, w.model),
    el("td", {}, w.node == null ? badge("holding", "holding") : w.node),
    el("td", { class: "num" }, fmt.age(w.waited_ms))));
  replaceRows($("queue").tBodies[0], rows);
  $("queue-empty").hidden = waiting.length > 0;
  $("holding").textContent = holding;
  $("waiting-total").textContent = waiting.length;
}

const SIGNALS = [["warmth", "warm"], ["memory_fit", "fit"], ["queue_depth", "queue"], ["wait_time", "wait"],
  ["role_affinity", "role"], ["availability", "avail"], ["context_fit", "ctx"], ["session_affinity", "sess"],
  ["tier", "tier"], ["load", "load"]];
// Completion mode's terms: [field, header, format].
const secs = (v) => fmt.ms((v || 0) * 1000);
const TERMS = [["wait_s", "wait", secs], ["load_s", "load", secs], ["prefill_s", "prefill", secs],
  ["decode_s", "decode", secs], ["risk_s", "risk", secs], ["ahead", "ahead", String], ["seats", "seats", String], ["cached_tokens", "cached", String],
  ["prefill_queue_tokens", "prefill queue", String], ["observed", "learned from", String]];
const openDecisions = new Set();

function renderDecisions(decisions) {
  const items = decisions.map((d) => {
    const r = d.report;
    const key = d.at_ms + ":" + r.models.join(",") + ":" + r.table.length;
    const w = r.winner;
    const outcome = w
      ? el("span", { class: "winner" }, "→ ", el("b", {}, w.node_id), " ", w.model,
        el("span", { class: "muted" }, ` score ${w.score.toFixed(1)}`),
        w.fallback ? badge("fallback") : null, w.cold ? badge("cold load", "cold") : null)
      : badge(r.no_route || "no route", "noroute");
    const cols = r.mode === "completion" ? TERMS : SIGNALS;
    const head = el("tr", {}, el("th", {}, "node"), el("th", {}, "model"), el("th", {}, "verdict"),
      el("th", { class: "num" }, r.mode === "completion" ? "finish" : "total"),
      ...cols.map(([, s]) => el("th", { class: "num" }, s)));
    const rows = r.table.map((row) => {
      const won = w && row.node === w.node_id && row.model === w.model;
      if (row.verdict === "eliminated") {
        return el("tr", { class: "eliminated" }, el("td", {}, row.node), el("td", {}, row.model),
          el("td", { colSpan: 2 + cols.length }, badge(row.reason, "reason")));
      }
      if (row.verdict === "predicted") {
        return el("tr", { class: won ? "won" : "" }, el("td", {}, row.node), el("td", {}, row.model),
          el("td", {}, won ? "winner" : "predicted"), el("td", { class: "num" }, fmt.ms(row.total_s * 1000)),
          ...TERMS.map(([k, , f]) => el("td", { class: "num" + (!row[k] ? " zero" : "") }, f(row[k]))));
      }
      if (!row.signals) {
        return el("tr", {}, el("td", {}, row.node), el("td", {}, row.model), el("td", { colSpan: 2 + cols.length }, row.verdict));
      }
      return el("tr", { class: won ? "won" : "" }, el("td", {}, row.node), el("td", {}, row.model),
        el("td", {}, won ? "winner" : "scored"), el("td", { class: "num" }, row.total.toFixed(1)),
        ...SIGNALS.map(([k]) => el("td", { class: "num" + (row.signals[k] === 0 ? " zero" : "") },
          fmt.pts(row.signals[k]))));
    });
    const details = el("details", { class: "decision" },
      el("summary", {}, el("span", { class: "muted" }, fmt.time(d.at_ms)), " ", el("code", {}, r.endpoint), " ",
        el("b", {}, r.models[0]), r.models.length > 1 ? el("span", { class: "muted" }, ` (+${r.models.length - 1} fallback)`) : null,
        el("span", { class: "muted" }, ` ~${r.prompt_tokens} tok`), " ", outcome,
        r.affinity !== "none" ? badge("affinity " + r.affinity, "affinity") : null),
      el("table", { class: "explain" }, el("thead", {}, head), el("tbody", {}, ...rows)));
    details.open = openDecisions.has(key);
    details.addEventListener("toggle", () => details.open ? openDecisions.add(key) : openDecisions.delete(key));
    return details;
  });
  $("decisions").replaceChildren(...items);
  $("decisions-empty").hidden = decisions.length > 0;
}

function render(live) {
  $("version").textContent = "v" + live.version;
  renderNodes(live.nodes);
  renderTraffic(live.traffic);
  renderQueue(live.holding, live.waiting);
  renderDecisions(live.decisions);
  const conn = $("conn");
  conn.textContent = "live · updated " + fmt.time(live.now_ms);
  conn.className = "conn ok";
}

async function poll() {
  try {
    const r = await fetch("/fleet/live", { cache: "no-store" });
    if (!r.ok) throw new Error("HTTP " + r.status);
    render(await r.json());
  } catch (e) {
    const conn = $("conn");
    conn.textContent = "gateway not answering (" + e.message + "), retrying";
    conn.className = "conn down";
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

function toast(text, ok) {
  const t = $("toast");
  t.textContent = text;
  t.className = "toast " + (ok ? "ok" : "bad");
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, 4000);
}

// Ask for the admin token (kept for this tab only), resolving to it or null.
function askToken(what) {
  const saved = sessionStorage.getItem("fleetgate-admin-token");
  if (saved) return Promise.resolve(saved);
  const dlg = $("token-dialog");
  $("token-action").textContent = `Admin token to ${what}`;
  $("token-input").value = "";
  return new Promise((resolve) => {
    dlg.addEventListener("close", () => {
      const token = $("token-input").value;
      resolve(dlg.returnValue === "ok" && token ? token : null);
    }, { once: true });
    dlg.showModal();
  });
}

async function control(node, action) {
  const token = await askToken(`${action} ${node}`);
  if (!token) return;
  try {
    const r = await fetch(`/fleet/nodes/${encodeURIComponent(node)}/${action}`, {
      method: "POST", headers: { Authorization: "Bearer " + token },
    });
    const body = await r.json().catch(() => ({}));
    if (r.ok) {
      sessionStorage.setItem("fleetgate-admin-token", token);
      toast(`${node}: ${action} done`, true);
    } else {
      if (r.status === 401 || r.status === 403) sessionStorage.removeItem("fleetgate-admin-token");
      const msg = (body.error && (body.error.message || body.error)) || ("HTTP " + r.status);
      toast(`${node}: ${action} refused: ${msg}`, false);
    }
  } catch (e) {
    toast(`${node}: ${action} failed: ${e.message}`, false);
  }
}

poll();
