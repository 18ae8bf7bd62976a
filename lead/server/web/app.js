// duo's page: the chat, the live panel's stream and the API key, wired together.

import { Reply, userMessage } from "./chat.js";
import { renderLive } from "./live.js";
import { auth, errorMessage, sleep, sseData } from "./net.js";

const $ = (id) => document.getElementById(id);
const chat = { messages: [], controller: null };
let live = null; // the AbortController of the live stream

function setState(text) { $("state").textContent = text; }

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
}

// --- the key ---

function askKey(message = "") {
  live?.abort();
  $("key-form").hidden = false;
  $("key-error").textContent = message;
  $("composer").inert = true;
  setState(message ? "key refused" : "key needed");
  $("key-input").focus();
}

function keyRefused(message) {
  auth.key = "";
  askKey(`Lead refused the key: ${message}`);
}

$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  auth.key = $("key-input").value.trim();
  $("key-input").value = "";
  connect();
});

$("change-key").addEventListener("click", () => askKey());

function connect() {
  $("key-form").hidden = true;
  $("composer").inert = false;
  startLive();
}

// --- the live panel: one stream, reopened with backoff when it ends ---

async function startLive() {
  live?.abort();
  const ctl = (live = new AbortController());
  let delay = 1000;
  while (!ctl.signal.aborted) {
    try {
      const r = await fetch("/duo/live", { headers: auth.headers(), signal: ctl.signal });
      if (r.status === 401) return keyRefused(await errorMessage(r));
      if (!r.ok) throw new Error(await errorMessage(r));
      delay = 1000;
      for await (const data of sseData(r)) {
        const snap = JSON.parse(data);
        renderLive(snap);
        if (!chat.controller) setState(snap.busy ? "generating" : "idle");
      }
    } catch (err) {
      if (ctl.signal.aborted) return;
    }
    setState("lead unreachable: retrying");
    await sleep(delay, ctl.signal);
    delay = Math.min(2 * delay, 15000);
  }
}

// --- the chat ---

function number(id, parse = Number.parseFloat) {
  const raw = $(id).value.trim();
  const value = parse(raw);
  return raw === "" || Number.isNaN(value) ? undefined : value;
}

function request() {
  const system = $("system").value.trim();
  const body = {
    messages: [...(system ? [{ role: "system", content: system }] : []), ...chat.messages],
    stream: true,
    temperature: number("temperature"), top_p: number("top_p"),
    top_k: number("top_k", Number.parseInt), min_p: number("min_p"),
    max_tokens: number("max_tokens", Number.parseInt), seed: number("seed", Number.parseInt),
  };
  return JSON.stringify(body); // undefined fields are left out: lead's defaults
}

async function stream(reply, signal) {
  const r = await fetch("/v1/chat/completions", {
    method: "POST", headers: auth.headers(true), body: request(), signal,
  });
  if (!r.ok) {
    const message = await errorMessage(r);
    if (r.status === 401) keyRefused(message);
    return `lead answered ${r.status}: ${message}`;
  }
  const log = $("log");
  for await (const data of sseData(r)) {
    if (data === "[DONE]") return null;
    const following = log.scrollHeight - log.scrollTop - log.clientHeight < 40;
    reply.add(JSON.parse(data));
    if (following) log.scrollTop = log.scrollHeight; // unless the reader scrolled up
  }
  return "the stream ended early (lead went away?)";
}

async function send() {
  const text = $("prompt").value.trim();
  if (!text || chat.controller) return;
  $("prompt").value = "";
  const history = chat.messages; // "New chat" mid-reply starts another one
  history.push({ role: "user", content: text });
  const reply = begin(text);
  reply.end(await run(reply));
  if (reply.text) history.push({ role: "assistant", content: reply.text });
  else history.pop(); // no answer: the question leaves the history too
  setBusy(false);
  setState("idle");
  if (reply.node.isConnected) reply.node.scrollIntoView({ block: "end" });
}

function begin(text) {
  $("log").querySelector(".hint")?.remove();
  userMessage($("log"), text);
  setBusy(true);
  setState("generating");
  return new Reply($("log"));
}

// Why the reply ended early (null: it did not).
async function run(reply) {
  const ctl = (chat.controller = new AbortController());
  try {
    return await stream(reply, ctl.signal);
  } catch (err) {
    return ctl.signal.aborted ? "stopped" : `connection lost: ${err.message}`;
  } finally {
    chat.controller = null;
  }
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  send();
});

$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    send();
  }
});

$("stop").addEventListener("click", () => chat.controller?.abort());

$("new-chat").addEventListener("click", () => {
  chat.controller?.abort();
  chat.messages = [];
  $("log").replaceChildren();
  $("prompt").focus();
});

// --- start: /health is open and says whether a key is needed ---

async function start() {
  try {
    const health = await (await fetch("/health")).json();
    $("model").textContent = health.model;
    $("change-key").hidden = !health.api_key;
    if (health.api_key && !auth.key) return askKey();
    connect();
  } catch (err) {
    setState("lead unreachable");
  }
}

start();
