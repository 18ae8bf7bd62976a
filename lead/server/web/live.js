// The live panel: lead's snapshot (GET /duo/live) as facts, tables of backs and slots and two
// charts.

import { barChart, replyChart } from "./charts.js";

const COLOURS = 4; // mark colours b0..b3, by the order backs are first met
const colourOf = new Map();

export function backClass(id) {
  if (!colourOf.has(id)) colourOf.set(id, colourOf.size % COLOURS);
  return `b${colourOf.get(id)}`;
}

const pct = (x) => (x == null ? "–" : `${(100 * x).toFixed(x > 0 && x < 0.1 ? 1 : 0)} %`);
const num = (x, digits = 1) => (x == null ? "–" : x.toFixed(digits));

function ago(seenAt) {
  const s = Math.max(0, Math.round((Date.now() - seenAt) / 1000));
  return s < 2 ? "just now" : `${s} s ago`;
}

// "last seen" cells count up between snapshots without asking lead anything.
setInterval(() => {
  for (const cell of document.querySelectorAll("[data-seen-at]")) {
    cell.textContent = ago(Number(cell.dataset.seenAt));
  }
}, 1000);

function facts(snap) {
  const d = snap.draft;
  const last = snap.replies[snap.replies.length - 1];
  let length = d.fixed ? `${d.length} (fixed)` : `${d.length} of at most ${d.max}`;
  if (d.hush) length += " · backs hushed";
  else if (d.probing) length += " · probing";
  return [
    ["draft length", length],
    ["acceptance estimate", pct(d.acceptance) + (d.acceptance_measured ? "" : " (prior)")],
    ["decode tok/s", `${num(snap.tok_s)} overall · ${num(last?.tok_s)} last reply`],
    ["replies", `${snap.totals.replies} · ${snap.totals.tokens} tokens · ` +
      `${pct(snap.totals.tokens ? snap.totals.accepted / snap.totals.tokens : null)} from drafts`],
  ];
}

function renderFacts(snap) {
  const dl = document.getElementById("lead-facts");
  dl.replaceChildren(...facts(snap).flatMap(([k, v]) => {
    const dt = document.createElement("dt");
    const dd = document.createElement("dd");
    dt.textContent = k;
    dd.textContent = v;
    return [dt, dd];
  }));
}

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function backCell(row, b) {
  const td = cell(row, "");
  const swatch = document.createElement("mark");
  swatch.className = `swatch ${backClass(b.id)}`;
  swatch.setAttribute("aria-hidden", "true");
  const where = document.createElement("small");
  where.className = "muted";
  where.textContent = [b.address, b.kind, b.sits_out && "sitting out"].filter(Boolean).join(" · ");
  td.append(swatch, b.id, document.createElement("br"), where);
}

function renderBacks(snap) {
  const body = document.querySelector("#backs tbody");
  body.replaceChildren();
  for (const b of snap.backs) {
    const row = body.insertRow();
    row.dataset.back = b.id;
    backCell(row, b);
    cell(row, "").dataset.seenAt = String(Date.now() - 1000 * b.seen_ago_s);
    cell(row, `${b.accepted} / ${b.drafted}`, "num");
    cell(row, pct(b.share), "num");
  }
  if (snap.backs.length === 0) {
    const td = cell(body.insertRow(), "No back connected: lead decodes alone.", "muted");
    td.colSpan = 4;
  }
  for (const c of body.querySelectorAll("[data-seen-at]")) c.textContent = ago(Number(c.dataset.seenAt));
}

function slotState(s) {
  if (s.state === "idle") return "idle";
  if (s.state === "prompt") return `prompt: ${s.prompt_left} tokens to go`;
  return "decoding";
}

function renderSlots(snap) {
  const body = document.querySelector("#slots tbody");
  body.replaceChildren();
  for (const s of snap.slots) {
    const row = body.insertRow();
    row.dataset.slot = String(s.slot);
    cell(row, String(s.slot), "num");
    cell(row, slotState(s), s.state === "idle" ? "muted" : "");
    cell(row, s.state === "idle" ? "" : String(s.tokens), "num");
    cell(row, s.state === "idle" ? "" : `${s.accepted} / ${s.drafted}`, "num");
    const from = cell(row, "");
    for (const id of s.backs || []) {
      const swatch = document.createElement("mark");
      swatch.className = `swatch ${backClass(id)}`;
      swatch.setAttribute("aria-hidden", "true");
      from.append(swatch, id, " ");
    }
    if (s.own_accepted) from.append(`lead (${s.own_accepted} accepted)`);
  }
  document.getElementById("waiting").textContent = snap.waiting ? `· ${snap.waiting} waiting` : "";
}

function renderCharts(snap) {
  const cost = snap.verify_cost;
  const ms = (x) => (cost.one_token_ms == null ? "" : ` (${(x * cost.one_token_ms).toFixed(1)} ms)`);
  barChart(document.getElementById("prices"), cost.sizes.map((s) => ({
    label: String(s.b), value: s.x, title: `b=${s.b}: ${s.x.toFixed(2)}x one token${ms(s.x)}`,
  })), "verify cost per batch size, over one token");
  replyChart(document.getElementById("replies"), snap.replies.map((r) => ({
    n: r.n, tps: r.tok_s, acc: r.acceptance,
    title: `reply ${r.n}: ${r.tokens} tokens, ${num(r.tok_s)} tok/s, ` +
      `${r.accepted}/${r.drafted} drafted accepted (${pct(r.acceptance)}), ${r.finish}`,
  })), "tok/s and acceptance per reply");
}

export function renderLive(snap) {
  document.getElementById("model").textContent = snap.model;
  renderFacts(snap);
  renderBacks(snap);
  renderSlots(snap);
  renderCharts(snap);
}
