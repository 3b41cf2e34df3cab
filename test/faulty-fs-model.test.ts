// SPDX-License-Identifier: Apache-2.0
/**
 * The crash model of FaultyFileSystem (used by the crash-point enumeration) must itself be
 * trustworthy: operations are counted and the file system freezes at a crash point; a power
 * loss keeps fdatasync'ed bytes and O_DSYNC writes, keeps or drops un-synced sectors (torn,
 * reordered) and undoes directory operations not made durable by an fsync of their directory.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { writeFileAtomic } from "../src/log/io.js";
import { FaultyFileSystem, type IoOp, type PowerLossMode } from "../src/testing/faulty-fs.js";
import { replay } from "../src/testing/faulty-fs.js";
import { prng } from "../src/testing/faulty-fs.js";
import { tempDir } from "../src/testing/helpers.js";

function modelFs(root: string, durableMkdir = true): FaultyFileSystem {
  return new FaultyFileSystem({ crashModel: { scratchDir: join(root, "scratch"), durableMkdir } });
}

function setup(): { root: string; data: string; cleanup(): void } {
  const t = tempDir("sluice-ffs-");
  const data = join(t.dir, "data");
  mkdirSync(data);
  return { root: t.dir, data, cleanup: t.cleanup };
}

test("operations that change or sync state are counted; at the crash point it and every later call throw", async () => {
  const t = setup();
  try {
    const fs = modelFs(t.root);
    const seen: IoOp[] = [];
    fs.onOp = (op) => seen.push(op);
    const f = join(t.data, "a.log");
    const h = await fs.open(f, "create");
    await h.write([Buffer.from("hello")], 0);
    await h.datasync();
    await fs.mkdir(join(t.data, "d"));
    await fs.mkdir(join(t.data, "d")); // exists: changes nothing, not counted
    const h2 = await fs.open(f, "create"); // exists: not counted
    await h2.close();
    await fs.rename(f, join(t.data, "b.log"));
    await fs.fsyncDir(t.data);
    assert.deepEqual(
      seen.map((o) => [o.index, o.kind]),
      [
        [0, "create"],
        [1, "write"],
        [2, "datasync"],
        [3, "mkdir"],
        [4, "rename"],
        [5, "fsyncDir"],
      ],
    );
    fs.crashAtOp(7);
    await h.write([Buffer.from("x")], 5); // op 6: still runs
    const crashed = fs.whenCrashed();
    await assert.rejects(h.datasync(), /power lost \(crash point 7\)/); // op 7: the crash point
    assert.equal((await crashed)?.index, 7);
    assert.equal(fs.crashedAt?.kind, "datasync");
    await assert.rejects(h.write([Buffer.from("y")], 6), /did not happen/);
    await assert.rejects(fs.readFile(join(t.data, "b.log")), /did not happen/);
    await assert.rejects(fs.mkdir(join(t.data, "e")), /did not happen/);
    assert.equal(readFileSync(join(t.data, "b.log"), "utf8"), "hellox", "nothing reached the file after the crash point");
    await h.close(); // closing an abandoned handle is harmless
    fs.dispose();
  } finally {
    t.cleanup();
  }
});

test("power loss: fdatasync'ed and O_DSYNC bytes always survive; 'keep' is the page cache, 'drop' the last sync", async () => {
  const t = setup();
  try {
    for (const mode of ["drop", "keep", "prefix", "random", "mixed"] as PowerLossMode[]) {
      for (let seed = 0; seed < 20; seed++) {
        const fs = modelFs(t.root);
        const f = join(t.data, `f-${mode}-${seed}`);
        writeFileSync(f, "");
        const h = await fs.open(f, "rw");
        await h.write([Buffer.alloc(1500, 0x61)], 0);
        await h.datasync(); // 1500 x 'a' durable
        await h.write([Buffer.alloc(700, 0x62)], 1000); // overwrite + extend, un-synced
        await h.truncate(1900); // un-synced
        const g = join(t.data, `g-${mode}-${seed}`);
        writeFileSync(g, "");
        const hg = await fs.open(g, "rw");
        await hg.writeDurable([Buffer.from("0123456789")], 0);
        await hg.write([Buffer.from("tail")], 10); // un-synced
        await hg.writeDurable([Buffer.from("ABC")], 2); // O_DSYNC: durable whatever happens
        const current = readFileSync(f);
        await fs.powerLoss({ mode, seed });
        const after = readFileSync(f);
        const gAfter = readFileSync(g, "latin1");
        assert.ok(gAfter.startsWith("01ABC56789"), `${mode}/${seed}: O_DSYNC writes survive (${gAfter})`);
        if (mode === "keep") assert.deepEqual(after, current);
        if (mode === "drop") assert.deepEqual(after, Buffer.alloc(1500, 0x61));
        // Every byte is the durable one, the un-synced one, or a zero of a size change that survived.
        assert.ok([1500, 1700, 1900].includes(after.length), `${mode}/${seed}: size ${after.length} is one of the sizes of the history`);
        for (let i = 0; i < after.length; i++) {
          const ok = after[i] === 0x61 || (i >= 1000 && after[i] === 0x62) || (i >= 1500 && after[i] === 0);
          assert.ok(ok, `${mode}/${seed}: byte ${i} = ${after[i]}`);
        }
        for (let i = 0; i < Math.min(1000, after.length); i++) assert.equal(after[i], 0x61, "synced bytes not overwritten stay");
        fs.dispose();
      }
    }
  } finally {
    t.cleanup();
  }
});

test("power loss keeps arbitrary subsets of un-synced sectors (reordered), torn last writes, and is reproducible from its seed", () => {
  const durable = Buffer.alloc(0);
  const pending = [
    { kind: "write" as const, pos: 0, data: Buffer.alloc(512, 1), durable: false },
    { kind: "write" as const, pos: 512, data: Buffer.alloc(512, 2), durable: false },
    { kind: "write" as const, pos: 1024, data: Buffer.alloc(512, 3), durable: false },
  ];
  const shapes = new Set<string>();
  let reordered = 0;
  let torn = 0;
  for (let seed = 0; seed < 400; seed++) {
    for (const mode of ["prefix", "random"] as const) {
      const a = replay(durable, pending, mode, prng(seed)).image;
      const b = replay(durable, pending, mode, prng(seed)).image;
      assert.deepEqual(a, b, "same seed, same result");
      const sectors = [0, 1, 2].map((s) => (a.length > s * 512 ? a.subarray(s * 512, Math.min(a.length, s * 512 + 512)) : null));
      const shape = sectors.map((x, s) => (x === null ? "-" : x.every((v) => v === s + 1) && x.length === 512 ? "N" : x.every((v) => v === 0) ? "0" : "T")).join("");
      shapes.add(`${mode}:${shape}`);
      if (mode === "random" && /0N/.test(shape)) reordered++; // a later sector reached the disk, an earlier one did not
      if (mode === "prefix") {
        assert.ok(!/0N|-N/.test(shape), `prefix mode keeps a prefix: ${shape}`);
        if (shape.includes("T")) torn++; // a sector holding a prefix of its write, zeros after
      }
    }
  }
  assert.ok(reordered > 10, `reordered writes happen (${reordered})`);
  assert.ok(torn > 10, `torn last writes happen (${torn})`);
  assert.ok(shapes.size >= 8, `many outcomes: ${[...shapes].join(" ")}`);
});

test("directory entries: a create, unlink or rename not followed by an fsync of its directory may be undone", async () => {
  const t = setup();
  try {
    const run = async (mode: PowerLossMode, seed: number, sync: boolean) => {
      const d = join(t.data, `${mode}-${seed}-${sync}`);
      mkdirSync(d);
      writeFileSync(join(d, "old"), "old-content");
      writeFileSync(join(d, "victim"), "victim-content");
      const fs = modelFs(t.root);
      const h = await fs.open(join(d, "new"), "create");
      await h.write([Buffer.from("new-content")], 0);
      await h.datasync(); // the data is durable, its directory entry is not
      await h.close();
      await fs.unlink(join(d, "victim"));
      await writeFileAtomic(fs, join(d, "meta"), "meta-1"); // temp + fdatasync + rename + fsync dir
      const h2 = await fs.open(join(d, "tmp2"), "create");
      await h2.write([Buffer.from("replacement")], 0);
      await h2.datasync();
      await h2.close();
      await fs.rename(join(d, "tmp2"), join(d, "old"));
      if (sync) await fs.fsyncDir(d);
      const report = await fs.powerLoss({ mode, seed });
      fs.dispose();
      const state = {
        new: existsSync(join(d, "new")) ? readFileSync(join(d, "new"), "utf8") : null,
        victim: existsSync(join(d, "victim")) ? readFileSync(join(d, "victim"), "utf8") : null,
        meta: existsSync(join(d, "meta")) ? readFileSync(join(d, "meta"), "utf8") : null,
        old: readFileSync(join(d, "old"), "utf8"),
        tmp2: existsSync(join(d, "tmp2")),
      };
      return { state, report: report! };
    };
    // Everything made durable by the directory fsync survives any power loss.
    for (const mode of ["drop", "random", "mixed"] as PowerLossMode[]) {
      const { state } = await run(mode, 1, true);
      assert.deepEqual(state, { new: "new-content", victim: null, meta: "meta-1", old: "replacement", tmp2: false }, mode);
    }
    // "drop": the operations after the last fsync of the directory are undone, in reverse.
    {
      const { state, report } = await run("drop", 1, false);
      assert.deepEqual(state, { new: "new-content", victim: null, meta: "meta-1", old: "old-content", tmp2: false });
      assert.deepEqual(report.undone.map((u) => u.kind), ["rename", "create"]);
    }
    // "keep": nothing is undone.
    assert.deepEqual((await run("keep", 1, false)).state, { new: "new-content", victim: null, meta: "meta-1", old: "replacement", tmp2: false });
    // Random: a suffix of the directory's un-synced operations (here: create tmp2, rename) is undone.
    const seen = new Set<string>();
    for (let seed = 0; seed < 30; seed++) {
      const { state } = await run("random", seed, false);
      seen.add(JSON.stringify(state));
      if (state.old === "replacement") assert.equal(state.tmp2, false, "a kept rename keeps the create before it");
    }
    assert.equal(seen.size, 3, `outcomes: ${[...seen].join(" ")}`);
  } finally {
    t.cleanup();
  }
});

test("directory entries: an un-synced create and unlink in a fresh directory vanish or come back with their content", async () => {
  const t = setup();
  try {
    const d = join(t.data, "p");
    mkdirSync(d);
    writeFileSync(join(d, "seg0"), "durable segment");
    const fs = modelFs(t.root);
    const h = await fs.open(join(d, "seg1"), "create");
    await h.write([Buffer.from("acknowledged?")], 0);
    await h.datasync();
    await fs.unlink(join(d, "seg0"));
    await fs.powerLoss({ mode: "drop", seed: 0 });
    fs.dispose();
    assert.equal(existsSync(join(d, "seg1")), false, "the create was never made durable");
    assert.equal(readFileSync(join(d, "seg0"), "utf8"), "durable segment", "the unlink is undone with the content");
  } finally {
    t.cleanup();
  }
});

test("mkdir: durable in its parent (FS-2) by default; without it a new directory and everything in it may vanish", async () => {
  const t = setup();
  try {
    for (const durableMkdir of [true, false]) {
      const base = join(t.data, `m-${durableMkdir}`);
      mkdirSync(base);
      const fs = modelFs(t.root, durableMkdir);
      await fs.mkdir(join(base, "q", "msgs"));
      const h = await fs.open(join(base, "q", "msgs", "0.log"), "create");
      await h.write([Buffer.from("job")], 0);
      await h.datasync();
      await fs.fsyncDir(join(base, "q", "msgs")); // the file's entry is durable in msgs/
      await fs.powerLoss({ mode: "drop", seed: 0 });
      fs.dispose();
      assert.equal(existsSync(join(base, "q", "msgs", "0.log")), durableMkdir, `durableMkdir ${durableMkdir}`);
    }
  } finally {
    t.cleanup();
  }
});

test("a rename across directories (topic creation) is undone only if neither directory was synced after it", async () => {
  const t = setup();
  try {
    for (const syncTarget of [true, false]) {
      const base = join(t.data, `x-${syncTarget}`);
      mkdirSync(join(base, "tmp"), { recursive: true });
      mkdirSync(join(base, "topics"));
      const fs = modelFs(t.root);
      await fs.mkdir(join(base, "tmp", "id1", "0"));
      await writeFileAtomic(fs, join(base, "tmp", "id1", "topic.json"), "{}");
      await fs.rename(join(base, "tmp", "id1"), join(base, "topics", "t"));
      if (syncTarget) await fs.fsyncDir(join(base, "topics"));
      await fs.powerLoss({ mode: "drop", seed: 0 });
      fs.dispose();
      assert.equal(existsSync(join(base, "topics", "t", "topic.json")), syncTarget);
      assert.equal(existsSync(join(base, "topics", "t", "0")), syncTarget);
      assert.equal(existsSync(join(base, "tmp", "id1", "topic.json")), !syncTarget);
    }
  } finally {
    t.cleanup();
  }
});

test("injected faults still apply in the crash model (ENOSPC torn write, failed O_DSYNC write is not durable)", async () => {
  const t = setup();
  try {
    const fs = modelFs(t.root);
    const f = join(t.data, "g.log");
    const h = await fs.open(f, "create");
    await fs.fsyncDir(t.data);
    fs.failNext("write", "ENOSPC", { tornBytes: 3 });
    await assert.rejects(h.write([Buffer.from("abcdef")], 0), (e: NodeJS.ErrnoException) => e.code === "ENOSPC");
    assert.equal(readFileSync(f, "utf8"), "abc");
    fs.failNext("datasync", "EIO");
    await assert.rejects(h.writeDurable([Buffer.from("XYZ")], 0), (e: NodeJS.ErrnoException) => e.code === "EIO");
    await h.writeDurable([Buffer.from("12")], 3);
    await fs.powerLoss({ mode: "drop", seed: 0 });
    fs.dispose();
    // "abc" and "XYZ" never became durable; "12" at 3 did (the size change before it with it).
    assert.equal(readFileSync(f, "latin1"), "\0\0\x0012");
  } finally {
    t.cleanup();
  }
});
