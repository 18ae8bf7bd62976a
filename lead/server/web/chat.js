// One streamed reply in the log: text as it comes, one <mark> per token lead took from a
// back's accepted draft (data-tokens, title: which back), a footer with the counts.

import { backClass } from "./live.js";

export class Reply {
  constructor(log) {
    this.node = document.createElement("article");
    this.node.className = "msg assistant";
    this.node.setAttribute("aria-busy", "true");
    this.body = document.createElement("div");
    this.body.className = "text";
    this.foot = document.createElement("p");
    this.foot.className = "foot muted";
    this.node.append(this.body, this.foot);
    log.append(this.node);
    Object.assign(this, { text: "", tokens: 0, accepted: 0, usage: null, finish: null });
    this.t0 = performance.now();
    this.tFirst = null;
    this.tLast = null;
  }

  // One event of lead's stream: {choices: [{delta, finish_reason}], duo, usage?}.
  add(event) {
    const choice = event.choices?.[0] ?? {};
    const text = choice.delta?.content ?? "";
    const duo = event.duo ?? { tokens: 0, accepted: 0 };
    if (duo.accepted > 0) this.mark(text, duo);
    else if (text) this.plain(text);
    if (duo.tokens > 0) {
      this.tLast = performance.now();
      this.tFirst ??= this.tLast;
    }
    this.text += text;
    this.tokens += duo.tokens;
    this.accepted += duo.accepted;
    if (event.usage) this.usage = event.usage;
    if (choice.finish_reason) this.finish = choice.finish_reason;
  }

  mark(text, duo) {
    const m = document.createElement("mark");
    m.className = `drafted ${backClass(duo.back ?? "")}`;
    m.dataset.tokens = String(duo.accepted);
    m.dataset.back = duo.back ?? "";
    m.title = `drafted by ${duo.back || "a back"}`;
    m.textContent = text;
    this.body.append(m);
  }

  plain(text) {
    const last = this.body.lastChild;
    if (last && last.nodeType === Node.TEXT_NODE) last.appendData(text);
    else this.body.append(text);
  }

  // The stream ended: with lead's usage, or cut short (`why`: "stopped", an error).
  end(why = null) {
    this.node.removeAttribute("aria-busy");
    const finish = why ? (why === "stopped" ? "stopped" : "error") : this.finish ?? "?";
    this.node.dataset.finish = finish;
    if (this.usage) {
      this.node.dataset.usagePrompt = String(this.usage.prompt_tokens);
      this.node.dataset.usageTokens = String(this.usage.completion_tokens);
      this.node.dataset.usageAccepted = String(this.usage.accepted_tokens);
    }
    const rate = this.tLast > this.tFirst ? (this.tokens - 1) / ((this.tLast - this.tFirst) / 1000) : null;
    const parts = [`${this.tokens} tokens`, `${this.accepted} from drafts` +
      (this.tokens ? ` (${Math.round((100 * this.accepted) / this.tokens)} %)` : "")];
    if (rate) parts.push(`${rate.toFixed(1)} tok/s here`);
    parts.push(why === "stopped" ? "stopped" : finish);
    this.foot.textContent = parts.join(" · ");
    if (why && why !== "stopped") this.error(why);
  }

  error(message) {
    const p = document.createElement("p");
    p.className = "error";
    p.setAttribute("role", "alert");
    p.textContent = message;
    this.node.append(p);
  }
}

export function userMessage(log, text) {
  const node = document.createElement("article");
  node.className = "msg user";
  node.textContent = text;
  log.append(node);
}
