// Talking to lead: the API key (this tab only), error bodies, and server-sent events read
// from fetch(), since EventSource cannot send the key and a key in a URL would be logged.

const KEY = "duo-api-key";

export const auth = {
  get key() { return sessionStorage.getItem(KEY) || ""; },
  set key(value) {
    if (value) sessionStorage.setItem(KEY, value);
    else sessionStorage.removeItem(KEY);
  },
  headers(json = false) {
    const h = json ? { "Content-Type": "application/json" } : {};
    if (this.key) h.Authorization = `Bearer ${this.key}`;
    return h;
  },
};

// Lead's {"error": {"message": ...}} or the status line.
export async function errorMessage(response) {
  try {
    const body = await response.json();
    return body?.error?.message || `${response.status} ${response.statusText}`;
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

// The data of each event of a text/event-stream response; comments are skipped.
export async function* sseData(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data: "))
        .map((l) => l.slice(6)).join("\n");
      if (data) yield data;
    }
  }
}

export const sleep = (ms, signal) => new Promise((resolve) => {
  const timer = setTimeout(resolve, ms);
  signal?.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
});
