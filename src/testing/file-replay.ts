// SPDX-License-Identifier: Apache-2.0
/**
 * What a power loss leaves of one file (crash model): rebuilt from the file's content at its
 * last fdatasync and the un-synced writes and truncates since, per PowerLossMode. Un-synced
 * writes reach the disk in sector pieces (512 B), so a kept subset can be torn and reordered.
 */
import type { PowerLossMode } from "./crash-model.js";

export const SECTOR = 512;

/** An un-synced change of a file: a write (durable: O_DSYNC) or a truncate. */
export type Pending = { kind: "write"; pos: number; data: Buffer; durable: boolean } | { kind: "truncate"; len: number };

/** An un-synced write's bytes within one sector: pending[op] covers [a, b). */
interface Piece {
  op: number;
  a: number;
  b: number;
}

/**
 * Rebuilds a file after a power loss from its content at the last fdatasync and the un-synced
 * changes since (see PowerLossMode). Returns the image and how many un-synced sector pieces survived.
 */
export function replay(durable: Buffer, pending: readonly Pending[], mode: Exclude<PowerLossMode, "mixed">, rnd: () => number): { image: Buffer; kept: number; sectors: number } {
  const { pieces, forced } = sectorPieces(pending);
  const { keep, meta } = chooseKept(pieces, pending.length, forced, mode, rnd);
  const { image, kept } = buildImage(durable, pending, pieces, keep, meta);
  return { image, kept, sectors: pieces.length };
}

/**
 * Sector pieces of the un-synced writes, in order, and `forced`: the changes before it are
 * durable in size (size changes up to the last durable write are durable: journal order).
 */
function sectorPieces(pending: readonly Pending[]): { pieces: Piece[]; forced: number } {
  const pieces: Piece[] = [];
  let forced = 0;
  for (let i = 0; i < pending.length; i++) {
    const p = pending[i];
    if (p.kind !== "write") continue;
    if (p.durable) {
      forced = i + 1;
      continue;
    }
    const end = p.pos + p.data.length;
    for (let a = p.pos; a < end; ) {
      const b = Math.min(end, (Math.floor(a / SECTOR) + 1) * SECTOR);
      pieces.push({ op: i, a, b });
      a = b;
    }
  }
  return { pieces, forced };
}

/**
 * Per the mode, `keep[i]`: bytes kept from the start of piece i, and `meta`: the size changes
 * of pending[0 .. meta) are durable.
 */
function chooseKept(pieces: Piece[], ops: number, forced: number, mode: Exclude<PowerLossMode, "mixed">, rnd: () => number): { keep: number[]; meta: number } {
  const keep = new Array<number>(pieces.length).fill(0);
  let meta = forced;
  if (mode === "keep") {
    for (let i = 0; i < pieces.length; i++) keep[i] = pieces[i].b - pieces[i].a;
    meta = ops;
  } else if (mode === "prefix") {
    // In order up to a point: pieces before `at` whole, the one at `at` torn (whole sectors or any byte).
    const at = Math.floor(rnd() * (pieces.length + 1));
    for (let i = 0; i < at; i++) keep[i] = pieces[i].b - pieces[i].a;
    if (at < pieces.length && rnd() < 0.5) keep[at] = Math.floor(rnd() * (pieces[at].b - pieces[at].a));
    const lastOp = at < pieces.length ? pieces[at].op + (keep[at] > 0 ? 1 : 0) : ops;
    meta = Math.max(forced, Math.min(ops, lastOp));
  } else if (mode === "random") {
    for (let i = 0; i < pieces.length; i++) if (rnd() < 0.5) keep[i] = pieces[i].b - pieces[i].a;
    meta = forced + Math.floor(rnd() * (ops - forced + 1));
  }
  return { keep, meta };
}

/** Applies the durable content, the kept pieces and the durable size changes; `kept`: pieces that kept any byte. */
function buildImage(durable: Buffer, pending: readonly Pending[], pieces: Piece[], keep: number[], meta: number): { image: Buffer; kept: number } {
  let img = Buffer.alloc(Math.max(durable.length, 4096));
  durable.copy(img);
  let len = durable.length;
  const resize = (n: number): void => {
    if (n < len) img.fill(0, n, len);
    else if (n > img.length) {
      const b = Buffer.alloc(Math.max(n, img.length * 2));
      img.copy(b, 0, 0, len);
      img = b;
    }
    len = n;
  };
  let pi = 0;
  let kept = 0;
  for (let i = 0; i < pending.length; i++) {
    const p = pending[i];
    if (p.kind === "truncate") {
      if (i < meta) resize(p.len);
      continue;
    }
    const end = p.pos + p.data.length;
    if (p.durable || i < meta) if (end > len) resize(end);
    if (p.durable) {
      p.data.copy(img, p.pos);
      continue;
    }
    for (; pi < pieces.length && pieces[pi].op === i; pi++) {
      const { a } = pieces[pi];
      const n = Math.min(keep[pi], Math.max(0, len - a)); // past the (durable) size a page is invisible
      if (keep[pi] > 0) kept++;
      if (n > 0) p.data.copy(img, a, a - p.pos, a - p.pos + n);
    }
  }
  return { image: Buffer.from(img.subarray(0, len)), kept };
}
