// SPDX-License-Identifier: Apache-2.0
// Formatting and DOM helpers. Everything shown comes from the broker (names, payloads, error
// messages), so text goes in through textContent only, never as HTML.

/** Element builder: h("td", { class: "num" }, "12"). Children: strings, numbers, nodes, arrays, null. */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : String(c));
  }
}

/** Replaces an element's content. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export function num(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "—";
  return Number(n).toLocaleString("en-US", { maximumFractionDigits: 0 });
}

/** A rate with a sensible precision: 0.35, 12.4, 1,530. */
export function rate(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "—";
  const a = Math.abs(n);
  const digits = a === 0 ? 0 : a < 1 ? 2 : a < 100 ? 1 : 0;
  return Number(n).toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

export function bytes(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n;
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toLocaleString("en-US", { maximumFractionDigits: i === 0 ? 0 : 1 })} ${units[i]}`;
}

/** Seconds, as "42 s", "5 m 3 s", "2 h 10 m". */
export function seconds(s) {
  if (s === null || s === undefined || Number.isNaN(s)) return "—";
  if (s < 60) return `${s < 10 ? s.toFixed(1) : Math.round(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} m ${Math.round(s % 60)} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} m`;
  return `${Math.floor(s / 86400)} d ${Math.round((s % 86400) / 3600)} h`;
}

export function percent(x) {
  if (x === null || x === undefined || Number.isNaN(x)) return "—";
  return `${(x * 100).toFixed(0)} %`;
}

/** Wall-clock ms as local ISO-like time. */
export function time(ms) {
  if (ms === null || ms === undefined) return "—";
  const d = new Date(ms);
  const pad = (x, n = 2) => String(x).padStart(n, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** A table with a header row; rows are arrays of cells (string, node, or { v, class }). */
export function table(headers, rows, opts = {}) {
  const cell = (tag, c) => (c !== null && typeof c === "object" && !(c instanceof Node) && !Array.isArray(c) ? h(tag, { class: c.class, title: c.title }, c.v) : h(tag, null, c));
  return h(
    "table",
    { class: opts.class },
    h("thead", null, h("tr", null, headers.map((x) => cell("th", x)))),
    h("tbody", null, rows.map((r) => h("tr", r.attrs ?? null, (r.cells ?? r).map((c) => cell("td", c))))),
  );
}

/** A numeric cell. */
export const n = (v) => ({ v, class: "num" });

/** A message for an empty section: what it would show and how to get there. */
export function empty(text, hint) {
  return h("div", { class: "empty" }, h("p", null, text), hint ? h("p", { class: "hint" }, hint) : null);
}
