// SPDX-License-Identifier: Apache-2.0
// Bounded in-browser history of polled values, aligned on one time axis per family (what uPlot
// draws). Nothing is stored server-side: the history starts when the page opens.

/** Samples kept per family: 10 minutes at one poll every 2 s. */
export const MAX_SAMPLES = 300;

export class History {
  constructor(max = MAX_SAMPLES) {
    this.max = max;
    /** Sample times, seconds since the epoch (uPlot's time unit). */
    this.t = [];
    /** key → values aligned with `t` (null where the key had no value). */
    this.series = new Map();
  }

  /** Appends one sample: every key of `values` (a Map or object) at time `t`. */
  push(t, values) {
    const entries = values instanceof Map ? [...values] : Object.entries(values);
    const seen = new Set();
    for (const [k, v] of entries) {
      let s = this.series.get(k);
      if (s === undefined) {
        s = new Array(this.t.length).fill(null);
        this.series.set(k, s);
      }
      s.push(v ?? null);
      seen.add(k);
    }
    for (const [k, s] of this.series) if (!seen.has(k)) s.push(null);
    this.t.push(t);
    if (this.t.length > this.max) {
      const drop = this.t.length - this.max;
      this.t.splice(0, drop);
      for (const s of this.series.values()) s.splice(0, drop);
    }
    // A key gone for the whole window (a deleted topic) leaves the charts.
    for (const [k, s] of this.series) if (s.every((v) => v === null)) this.series.delete(k);
  }

  keys() {
    return [...this.series.keys()].sort();
  }

  latest(key) {
    const s = this.series.get(key);
    return s === undefined ? null : s[s.length - 1] ?? null;
  }

  /**
   * Change per second of a counter-like value over the last `windowS` seconds (the oldest
   * sample inside the window against the newest). Null without two samples, or when the value
   * went down (a deleted and re-created topic, a restarted broker): no rate is better than a
   * wrong one.
   */
  rate(key, windowS = 10) {
    const s = this.series.get(key);
    if (s === undefined) return null;
    const last = s.length - 1;
    if (last < 1 || s[last] === null) return null;
    const tEnd = this.t[last];
    let first = -1;
    for (let i = last - 1; i >= 0 && tEnd - this.t[i] <= windowS; i--) {
      if (s[i] === null) break;
      first = i;
    }
    if (first < 0) return null;
    const dv = s[last] - s[first];
    const dt = tEnd - this.t[first];
    return dt > 0 && dv >= 0 ? dv / dt : null;
  }

  /** Did the value rise at any point within the last `windowS` seconds? */
  rose(key, windowS) {
    const s = this.series.get(key);
    if (s === undefined) return false;
    const tEnd = this.t[this.t.length - 1];
    for (let i = s.length - 1; i > 0 && tEnd - this.t[i] <= windowS; i--) {
      if (s[i] !== null && s[i - 1] !== null && tEnd - this.t[i - 1] <= windowS && s[i] > s[i - 1]) return true;
    }
    return false;
  }

  /** uPlot's data layout for these keys: [times, values of key 1, ...]. */
  data(keys) {
    return [this.t.slice(), ...keys.map((k) => (this.series.get(k) ?? []).slice())];
  }
}
