// SPDX-License-Identifier: Apache-2.0
/**
 * The client's DirectFrameReader: the socket reads into the reader's own memory, small frames
 * are views of a slab, large ones get a buffer of their own that the socket fills in place.
 * Fed with every way a stream can be cut (reads of 1 byte, of random sizes, of whatever room
 * the reader offers), it must return exactly the frames sent, never overwrite a frame it
 * handed out, and refuse bad lengths before allocating.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { ProtocolError } from "../src/errors.js";
import { DirectFrameReader } from "../src/client/direct-reader.js";

function frame(body: Buffer): Buffer {
  const head = Buffer.alloc(4);
  head.writeUInt32BE(body.length);
  return Buffer.concat([head, body]);
}

/** Feeds `stream` as the socket would: each read copies min(room offered, cut()) bytes. */
function feed(r: DirectFrameReader, stream: Buffer, cut: () => number): Buffer[] {
  const out: Buffer[] = [];
  let at = 0;
  while (at < stream.length) {
    const dst = r.readBuffer();
    assert.ok(dst.length > 0, "the reader always offers room");
    const n = Math.min(dst.length, cut(), stream.length - at);
    stream.copy(dst, 0, at, at + n);
    at += n;
    r.wrote(n);
    for (let f = r.next(); f !== null; f = r.next()) out.push(f);
  }
  return out;
}

test("frames of every size come back intact however the stream is cut, and handed-out frames are never overwritten", () => {
  const sizes = [10, 11, 100, 4000, 16 * 1024, 40_000, 48 * 1024 - 4, 48 * 1024, 64 * 1024, 64 * 1024 + 1, 300_000, 1_100_000, 12, 70_000, 10];
  const bodies = sizes.map((n) => randomBytes(n));
  const stream = Buffer.concat(bodies.map(frame));
  const copies = bodies.map((b) => Buffer.from(b));
  let seed = 7;
  const rnd = (): number => {
    seed = (seed * 1103515245 + 12345) & 0x7fffffff;
    return seed;
  };
  const cuts: Record<string, () => number> = {
    "whole room": () => Infinity,
    "1 byte": () => 1,
    "random": () => 1 + (rnd() % 70_000),
    "prime": () => 4099,
  };
  for (const [name, cut] of Object.entries(cuts)) {
    if (name === "1 byte") {
      // Byte by byte over the small frames only (1.5 M single-byte reads would be slow).
      const small = Buffer.concat(bodies.slice(0, 6).map(frame));
      const got = feed(new DirectFrameReader(1 << 24), small, cut);
      assert.deepEqual(got, copies.slice(0, 6), name);
      continue;
    }
    const got = feed(new DirectFrameReader(1 << 24), stream, cut);
    assert.equal(got.length, bodies.length, name);
    // Compared after everything was read: later reads did not overwrite earlier frames.
    for (let i = 0; i < got.length; i++) assert.ok(got[i].equals(copies[i]), `${name}: frame ${i} (${sizes[i]} bytes)`);
  }
});

test("a length below the header size or above the limit is refused before any allocation", () => {
  const r = new DirectFrameReader(1000);
  const tooBig = Buffer.alloc(4);
  tooBig.writeUInt32BE(0xffffffff);
  const dst = r.readBuffer();
  tooBig.copy(dst);
  r.wrote(4);
  assert.throws(() => r.next(), (e: unknown) => e instanceof ProtocolError && /exceeds the limit/.test((e as Error).message));

  const r2 = new DirectFrameReader(1000);
  const d2 = r2.readBuffer();
  Buffer.from([0, 0, 0, 3]).copy(d2);
  r2.wrote(4);
  assert.throws(() => r2.next(), ProtocolError);
});
