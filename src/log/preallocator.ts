// SPDX-License-Identifier: Apache-2.0
/**
 * Preallocation of the active segment (LOG-8). On ext4 (and similar), an fdatasync after a
 * write that extends the file must also commit the journal (size, new extents), while one
 * after an overwrite of allocated, already-written blocks only writes the data. With
 * durability "always" every ack waits for an fdatasync, so appends go into space written with
 * zeros and synced beforehand, in the background (docs/ARCHITECTURE.md, "Preallocation").
 *
 * "auto" zero-fills ahead of the write position only while the partition appends at a steady,
 * moderate rate; "off" never; "always" whenever there is room, whatever the rate (tests).
 */
import type { FileHandle } from "./io.js";
import type { LogState } from "./log-state.js";
import type { Segment, ZeroFill } from "./segment.js";

export type PreallocateMode = "auto" | "always" | "off";

/**
 * Keep about PREALLOC_HORIZON_MS of appends zero-filled ahead, between PREALLOC_MIN_AHEAD and
 * PREALLOC_MAX_AHEAD, refilled when half is used. Below PREALLOC_MIN_RATE a partition is not
 * worth the disk space (10,000 idle partitions must not hold MiBs of zeros each); above
 * PREALLOC_MAX_RATE rounds are large, the saved journal commit is small next to the data, and
 * writing every byte twice (zeros, then data) would cost throughput. The rate is measured over
 * windows of at least RATE_WINDOW_MS.
 */
const PREALLOC_HORIZON_MS = 2000;
const PREALLOC_MIN_AHEAD = 64 * 1024;
const PREALLOC_MAX_AHEAD = 4 * 1024 * 1024;
const PREALLOC_MIN_RATE = 32 * 1024;
const PREALLOC_MAX_RATE = 64 * 1024 * 1024;
const RATE_WINDOW_MS = 500;
/** A new fill starting at the write position leaves this much room (at most) for appends. */
const PREALLOC_GAP = 64 * 1024;
/** After a failed zero write, appends extend the file for this long before the next try. */
const PREALLOC_RETRY_MS = 30_000;
const ZERO_CHUNK = Buffer.alloc(1024 * 1024);

export class Preallocator {
  /** Append rate (bytes/s) of the last complete window, and the window being counted. */
  private appendRate = 0;
  private rateBytes = 0;
  private rateSince: number;
  private retryAt = 0;
  /**
   * Zeros of the active segment known to be on disk: [zerosStart, zerosEnd) of `zerosSeg`,
   * written and fdatasync'ed by completed fills (contiguous ones merge). Appends inside it
   * change neither the size nor the allocation, so an O_DSYNC write makes them durable.
   */
  private zerosSeg: Segment | null = null;
  private zerosStart = 0;
  private zerosEnd = 0;

  constructor(
    private readonly st: LogState,
    private readonly mode: PreallocateMode,
  ) {
    this.rateSince = st.ctx.telemetry.clock.monotonicMs();
  }

  /**
   * Whether [pos, pos + bytes) of `seg` lies inside zeros a completed fill wrote and synced
   * (the writer then makes an append durable with one O_DSYNC write, see group-commit.ts).
   */
  inDurableZeros(seg: Segment, pos: number, bytes: number): boolean {
    return seg === this.zerosSeg && !seg.noFill && pos >= this.zerosStart && pos + bytes <= this.zerosEnd;
  }

  /** Counts appended bytes for the rate window. */
  noteAppended(bytes: number): void {
    this.rateBytes += bytes;
  }

  /**
   * Starts a zero fill of the active segment if it is worth it: zeros are written past
   * everything written or being written, then fdatasync'ed, in the background. Appends never
   * wait for it unless they reach the region being written (the writer's writeChunk).
   */
  maybeStart(): void {
    const st = this.st;
    const seg = st.active;
    if (this.mode === "off" || st.ctx.config.durability !== "always" || st.closed || st.faulted) return;
    if (seg.sealed || seg.noFill || seg.fill !== null) return;
    const now = st.ctx.telemetry.clock.monotonicMs(); // a wall clock step must not skew the rate
    if (now - this.rateSince >= RATE_WINDOW_MS) {
      this.appendRate = (this.rateBytes * 1000) / (now - this.rateSince);
      this.rateBytes = 0;
      this.rateSince = now;
    }
    if (now < this.retryAt) return;
    let ahead = PREALLOC_MAX_AHEAD;
    if (this.mode === "auto") {
      if (this.appendRate < PREALLOC_MIN_RATE || this.appendRate > PREALLOC_MAX_RATE) return;
      ahead = Math.min(PREALLOC_MAX_AHEAD, Math.max(PREALLOC_MIN_AHEAD, (this.appendRate * PREALLOC_HORIZON_MS) / 1000));
    }
    // Appends stay within segmentBytes (a roll comes first), so zeros past it would only be cut;
    // small segments get proportionally small fills.
    const cap = st.ctx.config.segmentBytes;
    ahead = Math.min(ahead, Math.max(4096, Math.floor(cap / 4)));
    if (seg.fileEnd - seg.size >= ahead / 2) return;
    const gap = Math.min(PREALLOC_GAP, Math.floor(ahead / 8));
    const start = Math.max(seg.fileEnd, seg.size + gap);
    const end = Math.min(cap, Math.ceil((start + ahead) / 4096) * 4096);
    if (end - start < 4096) return;
    let markWritten!: () => void;
    const fill: ZeroFill = { start, end, written: new Promise<void>((r) => (markWritten = r)), done: Promise.resolve() };
    seg.fill = fill;
    st.ctx.logger.debug({ file: seg.logPath, start, end, logicalSize: seg.size }, "preallocating segment space");
    fill.done = this.run(seg, fill, markWritten);
  }

  private async run(seg: Segment, fill: ZeroFill, markWritten: () => void): Promise<void> {
    const { fs, logger } = this.st.ctx;
    let fh: FileHandle | null = null;
    let written = false;
    try {
      // A handle of its own: on Linux an fsync error is reported once per open file, so a sync
      // here sharing the writer's handle could take an error that belongs to an append's
      // fdatasync, which would then succeed for data that never reached the disk (fsyncgate).
      fh = await fs.open(seg.logPath, "rw");
      const bufs: Buffer[] = [];
      for (let at = fill.start; at < fill.end; at += ZERO_CHUNK.length) bufs.push(ZERO_CHUNK.subarray(0, Math.min(ZERO_CHUNK.length, fill.end - at)));
      try {
        await fh.write(bufs, fill.start);
        written = true;
      } finally {
        // Even a failed write may have extended the file: fileEnd stays an upper bound.
        if (fill.end > seg.fileEnd) seg.fileEnd = fill.end;
        markWritten();
      }
      await fh.datasync();
      if (!seg.noFill) {
        if (this.zerosSeg === seg && fill.start <= this.zerosEnd && fill.start >= this.zerosStart) this.zerosEnd = Math.max(this.zerosEnd, fill.end);
        else {
          this.zerosSeg = seg;
          this.zerosStart = fill.start;
          this.zerosEnd = fill.end;
        }
      }
    } catch (e) {
      markWritten();
      if (written) {
        // The zeros' fdatasync failed: what is on disk is unknown. Same rule as for appends.
        this.st.fault(e, `fdatasync of preallocated space in ${seg.logPath} failed`);
      } else {
        this.retryAt = this.st.ctx.telemetry.clock.monotonicMs() + PREALLOC_RETRY_MS;
        logger.warn({ err: e, file: seg.logPath }, "could not preallocate segment space; appends extend the file");
      }
    } finally {
      await fh?.close().catch(() => {});
      seg.fill = null;
    }
    if (written) this.maybeStart();
  }

  /** Stops preallocation on `seg` and waits for a running fill (before truncating or sealing). */
  async stop(seg: Segment): Promise<void> {
    seg.noFill = true;
    // The caller truncates or seals: the zeros are going away.
    if (this.zerosSeg === seg) this.zerosSeg = null;
    while (seg.fill !== null) await seg.fill.done;
    if (this.zerosSeg === seg) this.zerosSeg = null;
  }
}
