// SPDX-License-Identifier: Apache-2.0
// Line charts over a History, drawn with uPlot (served by the broker from its uplot package as
// a classic script: window.uPlot).
import { h, fill } from "./format.js";

const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4d7c0f", "#9333ea", "#b45309"];
/** More lines than this make a chart unreadable: the rest are left out (and said so). */
const MAX_LINES = 10;

/**
 * A chart bound to a container: `update(history, keys, label)` draws the keys' series,
 * re-creating the uPlot instance only when the set of lines changes.
 */
export class Chart {
  constructor(title, unit) {
    this.title = title;
    this.unit = unit;
    this.el = h("figure", { class: "chart" });
    this.plot = null;
    this.sig = "";
  }

  update(history, keys, label = (k) => k) {
    const shown = keys.slice(0, MAX_LINES);
    const head = h("figcaption", null, `${this.title} `, h("span", { class: "unit" }, `(${this.unit})`), keys.length > shown.length ? h("span", { class: "hint" }, ` — first ${MAX_LINES} of ${keys.length} shown`) : null);
    if (typeof window.uPlot !== "function") {
      fill(this.el, head, h("p", { class: "hint" }, "Charts are unavailable: uPlot did not load."));
      return this.el;
    }
    if (shown.length === 0 || history.t.length < 2) {
      this.destroy();
      fill(this.el, head, h("p", { class: "hint chart-empty" }, "Collecting data: the chart starts after two polls."));
      return this.el;
    }
    const sig = shown.join("\u0000");
    const data = history.data(shown);
    // Sized to its own box (a grid cell or the page width, less its padding); a hidden tab has
    // no width: drawn when shown.
    if (this.el.clientWidth === 0) return this.el;
    const width = Math.max(280, this.el.clientWidth - 16);
    if (this.plot === null || sig !== this.sig) {
      this.destroy();
      fill(this.el, head);
      this.plot = new window.uPlot(
        {
          width,
          height: 180,
          cursor: { drag: { x: false, y: false } },
          scales: { x: { time: true } },
          axes: [{}, { label: this.unit, size: 60 }],
          series: [{}, ...shown.map((k, i) => ({ label: label(k), stroke: PALETTE[i % PALETTE.length], width: 1.5, spanGaps: false }))],
        },
        data,
        this.el,
      );
      this.sig = sig;
    } else {
      if (this.plot.width !== width) this.plot.setSize({ width, height: 180 });
      this.plot.setData(data);
    }
    return this.el;
  }

  destroy() {
    if (this.plot) this.plot.destroy();
    this.plot = null;
    this.sig = "";
  }
}
