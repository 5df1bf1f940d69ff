/**
 * Progress of long CLI work (`npm run demo`, `rlq up`): per item, done/total,
 * the rate since it was first seen and an ETA. On a TTY one status line is
 * redrawn in place (carriage return + erase line); elsewhere (CI, a log file,
 * a pipe) a plain line is written each time an item's count moves, so logs
 * stay readable. The clock is passed in, so the arithmetic is testable.
 */
export interface ProgressItem {
  label: string;
  done: number;
  total: number;
}

export interface ProgressDisplay {
  /** Report an item's count (items appear on first report). */
  set(id: string, item: ProgressItem): void;
  remove(id: string): void;
  /** Erase the TTY line (before other output); the next `set` or `redraw` draws it again. */
  clear(): void;
  redraw(): void;
  close(): void;
}

interface Tracked extends ProgressItem {
  firstAtMs: number;
  firstDone: number;
  lastPrinted: number;
}

export function formatDuration(seconds: number): string {
  if (!Number.isFinite(seconds) || seconds < 0) return "?";
  const s = Math.round(seconds);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
}

/** "label 3/10 (30%) 0.50/s eta 14s" — the ETA from the rate since the item was first seen. */
export function describe(item: ProgressItem & { firstAtMs: number; firstDone: number }, nowMs: number): string {
  const pct = item.total > 0 ? Math.floor((100 * item.done) / item.total) : 0;
  const elapsedS = (nowMs - item.firstAtMs) / 1000;
  const moved = item.done - item.firstDone;
  const rate = elapsedS > 0 && moved > 0 ? moved / elapsedS : null;
  const left = Math.max(0, item.total - item.done);
  const eta = left === 0 ? "done" : rate === null ? "eta ?" : `eta ${formatDuration(left / rate)}`;
  return `${item.label} ${item.done}/${item.total} (${pct}%)${rate === null ? "" : ` ${rate.toFixed(2)}/s`} ${eta}`;
}

export function createProgressDisplay(options: {
  stream: { write(s: string): unknown };
  isTty: boolean;
  now?: () => number;
  columns?: number;
}): ProgressDisplay {
  const now = options.now ?? Date.now;
  const items = new Map<string, Tracked>();
  let drawn = false;
  const line = () => [...items.values()].map((i) => describe(i, now())).join(" | ");
  const draw = () => {
    if (!options.isTty || items.size === 0) return;
    const text = line();
    const cols = options.columns ?? 200;
    options.stream.write(`\r\x1b[K${text.length > cols - 1 ? text.slice(0, cols - 2) + "…" : text}`);
    drawn = true;
  };
  const clear = () => {
    if (options.isTty && drawn) options.stream.write("\r\x1b[K");
    drawn = false;
  };
  return {
    set(id, item) {
      let t = items.get(id);
      if (!t) items.set(id, (t = { ...item, firstAtMs: now(), firstDone: item.done, lastPrinted: -1 }));
      else Object.assign(t, item);
      if (options.isTty) draw();
      else if (t.done !== t.lastPrinted) {
        t.lastPrinted = t.done;
        options.stream.write(`progress: ${describe(t, now())}\n`);
      }
    },
    remove(id) {
      items.delete(id);
      if (options.isTty) {
        clear();
        draw();
      }
    },
    clear,
    redraw: draw,
    close() {
      clear();
      items.clear();
    },
  };
}
