// Two small SVG charts, drawn from scratch on each snapshot (a few dozen elements).

const NS = "http://www.w3.org/2000/svg";
const W = 320;
const H = 124;
const PAD = { left: 34, right: 34, top: 16, bottom: 22 };

function el(name, attrs, parent, text) {
  const node = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  if (parent) parent.append(node);
  return node;
}

function svg(container, label) {
  const root = el("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": label });
  container.replaceChildren(root);
  return root;
}

function empty(root, message) {
  el("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "axis" }, root, message);
}

// bars: [{label, value, title}], values over one (1.0 = a one-token step).
export function barChart(container, bars, label) {
  const root = svg(container, label);
  if (bars.length === 0) return empty(root, "not priced yet");
  const top = Math.max(1, ...bars.map((b) => b.value)) * 1.15;
  const plotW = W - PAD.left - 8;
  const plotH = H - PAD.top - PAD.bottom;
  const y = (v) => PAD.top + plotH * (1 - v / top);
  const step = plotW / bars.length;
  el("line", { x1: PAD.left, x2: W - 8, y1: y(1), y2: y(1), class: "ref" }, root);
  el("text", { x: PAD.left - 4, y: y(1) + 3, "text-anchor": "end", class: "axis" }, root, "1x");
  bars.forEach((b, i) => {
    const x = PAD.left + i * step + step * 0.15;
    const g = el("g", {}, root);
    el("title", {}, g, b.title);
    el("rect", { x, y: y(b.value), width: step * 0.7, height: y(0) - y(b.value), class: "bar" }, g);
    el("text", { x: x + step * 0.35, y: H - 8, "text-anchor": "middle", class: "axis" }, g, b.label);
    el("text", { x: x + step * 0.35, y: y(b.value) - 3, "text-anchor": "middle", class: "value" },
      g, b.value.toFixed(b.value < 10 ? 2 : 0));
  });
}

// points: [{n, tps, acc, title}]; tok/s on the left axis, acceptance (0-1) on the right.
export function replyChart(container, points, label) {
  const root = svg(container, label);
  if (points.length === 0) return empty(root, "no reply yet");
  const top = Math.max(1, ...points.map((p) => p.tps ?? 0)) * 1.1;
  const plotW = W - PAD.left - PAD.right;
  const plotH = H - PAD.top - PAD.bottom;
  const x = (i) => PAD.left + (points.length === 1 ? plotW / 2 : (plotW * i) / (points.length - 1));
  const yT = (v) => PAD.top + plotH * (1 - v / top);
  const yA = (v) => PAD.top + plotH * (1 - v);
  el("line", { x1: PAD.left, x2: W - PAD.right, y1: yA(0), y2: yA(0), class: "ref" }, root);
  el("text", { x: PAD.left - 4, y: PAD.top + 4, "text-anchor": "end", class: "axis tps" }, root,
    top >= 100 ? top.toFixed(0) : top.toFixed(1));
  el("text", { x: W - PAD.right + 4, y: PAD.top + 4, class: "axis acc" }, root, "100%");
  el("text", { x: W - PAD.right + 4, y: yA(0), class: "axis acc" }, root, "0%");
  el("text", { x: W / 2, y: H - 6, "text-anchor": "middle", class: "axis" }, root,
    `replies ${points[0].n}-${points[points.length - 1].n}`);
  series(root, points.map((p, i) => (p.tps == null ? null : [x(i), yT(p.tps)])), points, "tps");
  series(root, points.map((p, i) => (p.acc == null ? null : [x(i), yA(p.acc)])), points, "acc");
}

// A polyline broken where a value is missing, and a dot (with its tooltip) per value.
function series(root, xy, points, kind) {
  let run = [];
  const flush = () => {
    if (run.length > 1) el("polyline", { points: run.join(" "), class: `line ${kind}` }, root);
    run = [];
  };
  xy.forEach((p, i) => {
    if (p == null) return flush();
    run.push(p.join(","));
    const g = el("g", {}, root);
    el("title", {}, g, points[i].title);
    el("circle", { cx: p[0], cy: p[1], r: 2.5, class: `dot ${kind}` }, g);
  });
  flush();
}
