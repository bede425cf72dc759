// The dashboard: reads /v1/dashboard/* every few seconds and draws it. Plain DOM, no
// library, no build step (ADR 0032). Text goes in through textContent only: agent ids and
// prompts are the clients' words, never markup.

const REFRESH_MS = 3000;
const PAGE_SIZE = 50;
const KEY_SLOT = "semantic.dashboard.key";

const view = {
  sort: "last_used",
  order: "desc",
  offset: 0,
  search: "",
  anonymous: false,
  selected: null, // {namespace, id}
  total: 0,
};

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value);
  }
  for (const child of children) node.append(child);
  return node;
}

class KeyNeeded extends Error {}

async function api(path) {
  const key = sessionStorage.getItem(KEY_SLOT);
  const headers = key ? { Authorization: `Bearer ${key}` } : {};
  const response = await fetch(path, { headers, cache: "no-store" });
  if (response.status === 401) throw new KeyNeeded();
  const body = await response.json();
  if (!response.ok) throw new Error(body?.error?.message ?? `HTTP ${response.status}`);
  // Behind HAProxy, the router names the instance that answered (deploy/haproxy.cfg).
  const routed = response.headers.get("X-Semantic-Instance");
  if (routed) body.routed_to = routed;
  return body;
}

// Numbers as a person reads them.
function bytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}
const share = (x) => (x === null || x === undefined ? "—" : `${Math.round(x * 100)}%`);
const ms = (s) => (s === null || s === undefined ? "—" : `${Math.round(s * 1000)} ms`);
function ago(when) {
  const s = Math.max(0, Date.now() / 1000 - when);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return new Date(when * 1000).toLocaleDateString();
}
const clock = (when) => new Date(when * 1000).toLocaleTimeString();

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function drawServer(overview) {
  const instance = overview.routed_to ? `${overview.routed_to} (${overview.instance})` : overview.instance;
  $("server").textContent =
    `${overview.model} · ${instance ?? "this instance"} · ` +
    (overview.scope.namespaces ? `namespace ${overview.scope.namespaces.join(", ")}` : "all namespaces");
  const runtime = overview.runtime;
  const facts = [["device", runtime.device], ["BLAS", runtime.blas], ["kernels", runtime.kernels],
    ["KV memory", runtime.kv_memory]];
  for (const [name, state] of Object.entries(runtime.accelerations ?? {})) facts.push([name, state]);
  $("runtime-list").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v ?? "—" })]));
}

function meter(used, total) {
  const bar = el("div", { class: "meter" });
  const fillBar = el("div", { class: "meter-fill" });
  const fraction = total ? Math.min(1, used / total) : 0;
  fillBar.style.width = `${(fraction * 100).toFixed(1)}%`;
  bar.append(fillBar);
  return bar;
}

function card(title, lines, bar) {
  return el("div", { class: "card", "data-tier": title },
    el("h3", { text: title }), ...(bar ? [bar] : []), ...lines.map((l) => el("p", { text: l })));
}

const restored = (tiers, tier) =>
  (tiers.restored_tokens ? [`${tiers.restored_tokens[tier]} tokens restored from here`] : []);

function drawTiers(tiers) {
  const memory = tiers.memory;
  const disk = tiers.disk;
  const cards = [
    card("memory", [`${bytes(memory.used_bytes)} of ${bytes(memory.capacity_bytes)}`,
      ...(memory.blocks === null ? [] : [`${memory.blocks} cached blocks`]),
      ...restored(tiers, "memory")], meter(memory.used_bytes, memory.capacity_bytes)),
    card("disk", [`${bytes(disk.used_bytes)} of ${disk.quota_bytes ? bytes(disk.quota_bytes) : "no quota"}`,
      ...(disk.free_bytes === null ? [] : [`${bytes(disk.free_bytes)} free`]),
      disk.refused ? `refusing turns: ${disk.refused}` : "writable",
      ...(disk.database ? [`metadata: ${disk.database}`] : []),
      ...restored(tiers, "disk")], meter(disk.used_bytes, disk.quota_bytes)),
  ];
  const shared = tiers.shared;
  const totals = (s) => (s.used_bytes === undefined ? [] : s.used_bytes === null ? ["totals: unreachable"]
    : [`${s.blocks} keys, ${bytes(s.used_bytes)} of ${s.max_bytes ? bytes(s.max_bytes) : "no limit"} (all instances)`,
      `this instance: ${s.published} published, ${s.fetched} fetched, ${s.missed} missed`]);
  cards.push(shared
    ? card("shared", [`state: ${shared.state}`, ...totals(shared)],
      shared.max_bytes ? meter(shared.used_bytes, shared.max_bytes) : null)
    : card("shared", ["no shared tier (--shared-blocks)"]));
  $("tiers").replaceChildren(...cards);
}

function quota(limits) {
  const parts = [];
  if (limits.memory_bytes !== null) parts.push(`memory ${bytes(limits.memory_bytes)}`);
  if (limits.disk_bytes !== null) parts.push(`disk ${bytes(limits.disk_bytes)}`);
  return parts.join(", ") || "none";
}

function drawNamespaces(namespaces) {
  fill($("namespaces").tBodies[0], namespaces.map((ns) => el("tr", { "data-namespace": ns.namespace },
    el("td", { text: ns.namespace }), el("td", { text: ns.agents }), el("td", { text: ns.tokens }),
    el("td", { text: bytes(ns.memory_bytes) }), el("td", { text: bytes(ns.disk_bytes) }),
    el("td", { text: quota(ns.quota) }))));
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  return node;
}

// A line per series over the hour's minutes; gaps where a minute had no requests.
function chart(target, minutes, series, top, label) {
  const w = 600, h = 160, pad = 28;
  const x = (i) => pad + (i * (w - 2 * pad)) / Math.max(1, minutes.length - 1);
  const y = (v) => h - pad - (v / top) * (h - 2 * pad);
  const nodes = [svg("line", { x1: pad, y1: h - pad, x2: w - pad, y2: h - pad, class: "axis" })];
  const topText = svg("text", { x: 2, y: pad - 6, class: "tick" });
  topText.textContent = label(top);
  const left = svg("text", { x: pad, y: h - 8, class: "tick" });
  left.textContent = "60 min ago";
  const right = svg("text", { x: w - pad - 24, y: h - 8, class: "tick" });
  right.textContent = "now";
  nodes.push(topText, left, right);
  for (const [key, cls] of series) {
    let path = "";
    minutes.forEach((m, i) => {
      const v = m[key];
      if (v === null || v === undefined) { path += " "; return; }
      path += `${path.endsWith(" ") || path === "" ? "M" : "L"}${x(i).toFixed(1)},${y(Math.min(v, top)).toFixed(1)}`;
    });
    nodes.push(svg("path", { d: path.trim().replace(/ +/g, " "), class: `line ${cls}` }));
    minutes.forEach((m, i) => { // a minute alone between empty ones is a dot
      if (m[key] !== null && m[key] !== undefined) {
        nodes.push(svg("circle", { cx: x(i).toFixed(1), cy: y(Math.min(m[key], top)).toFixed(1), r: 2.5, class: `dot ${cls}` }));
      }
    });
  }
  target.replaceChildren(...nodes);
}

function drawHistory(minutes) {
  const slowest = Math.max(0.05, ...minutes.map((m) => m.ttft_p95_s ?? 0));
  chart($("ttft-chart"), minutes, [["ttft_p50_s", "p50"], ["ttft_p95_s", "p95"]], slowest, ms);
  chart($("hit-chart"), minutes, [["hit_rate", "hit"]], 1, share);
}

function retention(kept) {
  const parts = [];
  if (kept.pinned) parts.push("pinned");
  if (kept.ttl_seconds !== null) parts.push(`ttl ${kept.ttl_seconds} s`);
  if (kept.priority !== 50) parts.push(`priority ${kept.priority}`);
  return parts.join(" · ") || "default";
}

function agentRow(agent) {
  const key = `${agent.namespace}/${agent.id}`;
  const row = el("tr", { "data-agent": key, tabindex: "0", onclick: () => select(agent) },
    el("td", { class: "id", text: agent.id },
      ...(agent.forked_from ? [el("span", { class: "fork", text: ` · fork of ${agent.forked_from}` })] : [])),
    el("td", { text: agent.namespace }),
    el("td", { text: agent.tokens }),
    el("td", { text: agent.blocks }),
    el("td", { text: agent.memory_blocks }),
    el("td", { text: agent.disk_blocks }),
    el("td", { class: "cached-share", text: share(agent.cached_share) }),
    el("td", { text: ago(agent.last_used) }),
    el("td", { class: "retention", text: retention(agent.retention) }));
  if (view.selected && key === `${view.selected.namespace}/${view.selected.id}`) row.classList.add("selected");
  return row;
}

function drawAgents(page) {
  view.total = page.total;
  $("agent-count").textContent = `(${page.total})`;
  const first = page.total ? view.offset + 1 : 0;
  $("page-label").textContent = `${first}–${view.offset + page.data.length} of ${page.total}`;
  $("prev").disabled = view.offset === 0;
  $("next").disabled = view.offset + PAGE_SIZE >= page.total;
  for (const th of $("agents").tHead.rows[0].cells) {
    th.classList.toggle("sorted", th.dataset.sort === view.sort);
    th.classList.toggle("asc", th.dataset.sort === view.sort && view.order === "asc");
  }
  fill($("agents").tBodies[0], page.data.map(agentRow));
}

function blockSquare(block) {
  const kind = block.in_memory ? (block.on_disk ? "mem" : "hot") : "disk";
  const shared = block.holders > 1 ? " shared" : "";
  return el("span", { class: `block ${kind}${shared}`, title: `${block.tokens} tokens, ${block.holders} holder(s)` });
}

function drawDetail(agent) {
  $("detail").hidden = false;
  $("detail-name").textContent = `${agent.namespace}/${agent.id}`;
  const facts = [
    ["tokens", agent.tokens], ["blocks", agent.blocks],
    ["in memory", agent.memory_blocks], ["on disk", agent.disk_blocks],
    ["shared blocks", agent.shared_blocks], ["cached share", share(agent.cached_share)],
    ["retention", retention(agent.retention)],
    ["forked from", agent.forked_from ?? "—"], ["forks", agent.forks.join(", ") || "—"],
    ["shares blocks with", agent.sharing_with.join(", ") || "—"],
    ["system prompt", agent.system_prompt ? agent.system_prompt.slice(0, 200) : "—"],
  ];
  $("detail-facts").replaceChildren(...facts.flatMap(([k, v]) =>
    [el("dt", { text: k }), el("dd", { text: String(v), "data-field": k.replaceAll(" ", "_") })]));
  $("block-strip").replaceChildren(...agent.block_list.map(blockSquare));
  fill($("turns").tBodies[0], agent.recent_turns.map((t) => el("tr", {},
    el("td", { text: clock(t.ended_at) }), el("td", { text: t.prompt_tokens }),
    el("td", { text: t.cached_tokens }), el("td", { text: t.completion_tokens }),
    el("td", { text: ms(t.time_to_first_token_s) }), el("td", { text: ms(t.seconds) }))));
}

function select(agent) {
  view.selected = { namespace: agent.namespace, id: agent.id };
  refresh();
}

function agentsQuery() {
  const query = new URLSearchParams({ sort: view.sort, order: view.order, offset: view.offset,
    limit: PAGE_SIZE, search: view.search, anonymous: view.anonymous });
  return `/v1/dashboard/agents?${query}`;
}

let pending = null;
let again = false; // asked for while one was under way: run once more after it
async function refresh() {
  if (pending) { again = true; return pending; }
  pending = (async () => {
    try {
      const [overview, page, history] = await Promise.all([
        api("/v1/dashboard/overview"), api(agentsQuery()), api("/v1/dashboard/history")]);
      $("key-form").hidden = true;
      $("main").hidden = false;
      drawServer(overview);
      drawTiers(overview.tiers);
      drawNamespaces(overview.namespaces);
      drawHistory(history.data);
      drawAgents(page);
      if (view.selected) {
        const { namespace, id } = view.selected;
        drawDetail(await api(`/v1/dashboard/agents/${encodeURIComponent(namespace)}/${encodeURIComponent(id)}`));
      }
      $("status").textContent = `updated ${new Date().toLocaleTimeString()}`;
      document.body.dataset.loaded = "true";
    } catch (error) {
      if (error instanceof KeyNeeded) {
        $("main").hidden = true;
        $("key-form").hidden = false;
        if (sessionStorage.getItem(KEY_SLOT)) $("key-error").textContent = "that key was refused";
      } else {
        $("status").textContent = `could not update: ${error.message}`;
      }
    } finally {
      pending = null;
      if (again) { again = false; refresh(); }
    }
  })();
  return pending;
}

function wire() {
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY_SLOT, $("key").value.trim());
    $("key").value = "";
    refresh();
  });
  for (const th of $("agents").tHead.rows[0].cells) {
    if (!th.dataset.sort) continue;
    th.addEventListener("click", () => {
      const same = view.sort === th.dataset.sort;
      view.order = same && view.order === "desc" ? "asc" : "desc";
      view.sort = th.dataset.sort;
      view.offset = 0;
      refresh();
    });
  }
  $("search").addEventListener("input", () => { view.search = $("search").value; view.offset = 0; refresh(); });
  $("anonymous").addEventListener("change", () => { view.anonymous = $("anonymous").checked; view.offset = 0; refresh(); });
  $("prev").addEventListener("click", () => { view.offset = Math.max(0, view.offset - PAGE_SIZE); refresh(); });
  $("next").addEventListener("click", () => { view.offset += PAGE_SIZE; refresh(); });
  const tick = async () => {
    if (!document.hidden) await refresh();
    setTimeout(tick, REFRESH_MS);
  };
  tick();
}

wire();
