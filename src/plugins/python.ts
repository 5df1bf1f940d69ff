import { spawn, type ChildProcess } from "node:child_process";
import { isAbsolute, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { z } from "zod";
import { pluginPython } from "../config/env.ts";
import { RlqError } from "../lib/errors.ts";

/**
 * Python plugins, unmodified: `custom_rm_path: py:my_rewards.reward_func`
 * (a module on the host's path: the worker's directory, PYTHONPATH) or
 * `py:path/to/my_rewards.py:reward_func` runs a slime user's function, in
 * slime's signature, in a Python host process (python/rlq_plugin_host/host.py)
 * that this module starts and talks to in JSON lines over stdio. One host per
 * worker process and directory serves every plugin of every run there.
 *
 * The host turns rlq's sample records into slime's `Sample` (with a shim of
 * `slime.utils.types` and `slime.rollout.filter_hub.base_types` when slime is
 * not installed) and sends back what the function returned; that value goes
 * through the same validation as a JS module's return. A Python exception is
 * `plugin_threw` and a return that is not JSON (a Sample, an object) is
 * `plugin_bad_return`, both naming the plugin, the sample or group and what
 * was expected, as for JS plugins. A host that exits (a crash, a SIGKILL) is
 * started again; a call it took down is tried once more on the new host, and
 * if that fails too, a retriable `plugin_sidecar_failed` with the host's last
 * stderr lines lets the job be retried later.
 */
export const PY_PREFIX = "py:";

export function isPythonSidecarPath(path: string | null | undefined): boolean {
  return typeof path === "string" && path.trim().startsWith(PY_PREFIX);
}

/** The host's target: `pkg.module.fn`, or an absolute `file.py:fn` (relative files resolved against baseDir). */
export function pythonTarget(path: string, baseDir: string): string {
  const rest = path.trim().slice(PY_PREFIX.length);
  const m = /^(.*\.py):([A-Za-z_]\w*)$/.exec(rest);
  if (m) return `${isAbsolute(m[1] as string) ? m[1] : resolve(baseDir, m[1] as string)}:${m[2]}`;
  if (!/^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$/.test(rest)) {
    throw new RlqError(
      "config_invalid",
      `'${path}' is not a Python plugin path: write py:package.module.function (importable from the worker's directory or PYTHONPATH) or py:path/to/file.py:function`,
    );
  }
  return rest;
}

/** The file a `py:file.py:fn` path names (fingerprinted like a JS module), or null for a dotted module. */
export function pythonPluginFile(path: string, baseDir: string): string | null {
  const target = pythonTarget(path, baseDir);
  const m = /^(.*\.py):\w+$/.exec(target);
  return m ? (m[1] as string) : null;
}

const HOST_SCRIPT = join(fileURLToPath(new URL(".", import.meta.url)), "..", "..", "python", "rlq_plugin_host", "host.py");

const answerSchema = z.union([
  z.object({ id: z.number(), ok: z.literal(true), result: z.unknown() }),
  z.object({
    id: z.number(),
    ok: z.literal(false),
    error: z.object({ kind: z.enum(["threw", "bad_return", "load"]), type: z.string(), message: z.string(), traceback: z.string() }),
  }),
]);
type Answer = z.infer<typeof answerSchema>;
export type PythonFailure = Extract<Answer, { ok: false }>["error"];

/** A call the host answered with a failure: the caller words it (it knows the sample). */
export class PythonPluginFailure extends Error {
  constructor(readonly failure: PythonFailure) {
    super(`${failure.type}: ${failure.message}`);
    this.name = "PythonPluginFailure";
  }
}

interface Pending {
  resolve(a: Answer): void;
  reject(e: Error): void;
}

/**
 * One host process. Lifecycle: `starting` (spawned, waiting for its ready
 * line) → `ready` → `exited` (any exit: the next call starts a new Host).
 */
class Host {
  private readonly child: ChildProcess;
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  /** Calls waiting for the host (its start included): while any wait, the host keeps this process alive. */
  private busy = 0;
  private readonly stderrTail: string[] = [];
  readonly ready: Promise<void>;
  isExited = false;

  constructor(python: string, cwd: string) {
    this.child = spawn(python, ["-u", HOST_SCRIPT], { cwd, stdio: ["pipe", "pipe", "pipe"], env: process.env });
    const lines = createInterface({ input: this.child.stdout as NodeJS.ReadableStream });
    let markReady: () => void = () => undefined;
    let failStart: (e: Error) => void = () => undefined;
    this.ready = new Promise<void>((res, rej) => {
      markReady = res;
      failStart = rej;
    });
    // A plugin's own output and the host's tracebacks: kept for the crash message, passed to our stderr.
    createInterface({ input: this.child.stderr as NodeJS.ReadableStream }).on("line", (l) => {
      this.stderrTail.push(l);
      if (this.stderrTail.length > 20) this.stderrTail.shift();
      process.stderr.write(`[python plugin host] ${l}\n`);
    });
    lines.on("line", (line) => {
      let msg: unknown;
      try {
        msg = JSON.parse(line);
      } catch {
        this.stderrTail.push(`(not JSON on the protocol stream) ${line.slice(0, 200)}`);
        return;
      }
      if ((msg as { ready?: unknown }).ready === true) {
        markReady();
        return;
      }
      const parsed = answerSchema.safeParse(msg);
      if (!parsed.success) return;
      const p = this.pending.get(parsed.data.id);
      if (!p) return;
      this.pending.delete(parsed.data.id);
      p.resolve(parsed.data);
    });
    const onGone = (why: string) => {
      if (this.isExited) return;
      this.isExited = true;
      const e = new RlqError(
        "plugin_sidecar_failed",
        `the Python plugin host (${python} ${HOST_SCRIPT}) ${why}${this.stderrTail.length > 0 ? `; its last stderr lines: ${this.stderrTail.slice(-8).join(" | ")}` : ""}`,
      );
      failStart(e);
      for (const p of this.pending.values()) p.reject(e);
      this.pending.clear();
    };
    this.child.on("error", (e) => onGone(`could not start: ${e.message} (set RLQ_PLUGIN_PYTHON to a python 3.10+)`));
    this.child.on("exit", (code, signal) => onGone(`exited (${signal ?? `code ${code}`})`));
    this.child.stdin?.on("error", () => undefined); // EPIPE after an exit: reported by the exit handler above
    this.refIfBusy();
  }

  /** An idle host must not keep a worker process alive. */
  private refIfBusy(): void {
    const streams = [this.child.stdout, this.child.stderr, this.child.stdin] as Array<{ ref?(): void; unref?(): void } | null>;
    if (this.busy > 0) {
      this.child.ref();
      for (const s of streams) s?.ref?.();
    } else {
      this.child.unref();
      for (const s of streams) s?.unref?.();
    }
  }

  async request(body: Record<string, unknown>): Promise<Answer> {
    this.busy++;
    this.refIfBusy();
    try {
      await this.ready;
      if (this.isExited) throw new RlqError("plugin_sidecar_failed", "the Python plugin host exited");
      const id = this.nextId++;
      const answer = new Promise<Answer>((res, rej) => this.pending.set(id, { resolve: res, reject: rej }));
      this.child.stdin?.write(`${JSON.stringify({ id, ...body })}\n`);
      return await answer;
    } finally {
      this.busy--;
      this.refIfBusy();
    }
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  close(): void {
    this.child.stdin?.end();
  }
}

/** The live host per (python, directory) of this process. */
const hosts = new Map<string, Host>();

function hostFor(cwd: string): Host {
  const python = pluginPython();
  const key = `${python}\0${cwd}`;
  const live = hosts.get(key);
  if (live && !live.isExited) return live;
  const h = new Host(python, cwd);
  hosts.set(key, h);
  return h;
}

/** The pid of this process's host for `cwd`, if one runs (tests kill it to show a restart). */
export function pythonHostPid(cwd: string): number | undefined {
  const h = hosts.get(`${pluginPython()}\0${cwd}`);
  return h && !h.isExited ? h.pid : undefined;
}

/** Stop this process's hosts (they also exit on their own when this process dies: stdin closes). */
export function closePythonHosts(): void {
  for (const h of hosts.values()) h.close();
  hosts.clear();
}

/** One call, tried again once on a fresh host when the host died under it. */
async function callHost(cwd: string, body: Record<string, unknown>): Promise<unknown> {
  let answer: Answer;
  try {
    answer = await hostFor(cwd).request(body);
  } catch (e) {
    if (!(e instanceof RlqError && e.code === "plugin_sidecar_failed")) throw e;
    answer = await hostFor(cwd).request(body);
  }
  if (!answer.ok) throw new PythonPluginFailure(answer.error);
  return answer.result;
}

export type PythonPluginKind = "reward" | "reward_group" | "dynamic_filter" | "buffer_filter";

const EXPECTED: Record<PythonPluginKind, string> = {
  reward: "a number, a bool or a dict of named components (slime's custom_rm_path)",
  reward_group: "a list with one reward per sample (custom_rm_path with group_rm)",
  dynamic_filter: "a bool or slime's DynamicFilterOutput(keep=..., reason=...)",
  buffer_filter: "a list of groups (lists of Samples) taken from the buffer",
};

/** Where a call failed, for messages: "on sample 3", "on group 12". */
function callSite(kind: PythonPluginKind, body: Record<string, unknown>): string {
  if (kind === "reward") return ` on sample ${(body.sample as { sampleIndex?: number }).sampleIndex ?? "?"}`;
  if (kind === "dynamic_filter") return ` on group ${(body.group as { groupId?: number }).groupId ?? "?"}`;
  if (kind === "reward_group") return ` on a group of ${(body.samples as unknown[]).length} samples`;
  return "";
}

function wordFailure(option: string, path: string, kind: PythonPluginKind, body: Record<string, unknown>, e: unknown): Error {
  if (!(e instanceof PythonPluginFailure)) return e as Error;
  const f = e.failure;
  const site = callSite(kind, body);
  if (f.kind === "bad_return") {
    return new RlqError("plugin_bad_return", `${option} ${path} returned a value rlq cannot use${site}: ${f.message}; expected ${EXPECTED[kind]}`);
  }
  const lastFrames = f.traceback.trimEnd().split("\n").slice(-4).join("\n");
  return new RlqError("plugin_threw", `${option} ${path} threw${site}: ${f.type}: ${f.message}${lastFrames ? `\n${lastFrames}` : ""}`, { cause: e });
}

/**
 * `resolvePluginFunction` for `py:` paths: checks that the function imports
 * (a `plugin_load_failed` naming the path and Python's error otherwise) and
 * returns a caller with the JS module function's signature.
 */
export async function resolvePythonPlugin(
  path: string,
  baseDir: string,
  kind: PythonPluginKind,
  option: string,
): Promise<(...args: unknown[]) => Promise<unknown>> {
  const target = pythonTarget(path, baseDir);
  const cwd = resolve(baseDir);
  try {
    await callHost(cwd, { op: "load", target });
  } catch (e) {
    if (e instanceof PythonPluginFailure)
      throw new RlqError("plugin_load_failed", `${option} ${path}: cannot import ${target} in ${pluginPython()} (from ${cwd}): ${e.message}`, { cause: e });
    throw e;
  }
  const call = async (body: Record<string, unknown>) => {
    try {
      return await callHost(cwd, { op: "call", kind, target, ...body });
    } catch (e) {
      throw wordFailure(option, path, kind, body, e);
    }
  };
  switch (kind) {
    case "reward":
      return (args, sample) => call({ args, sample });
    case "reward_group":
      return (args, samples) => call({ args, samples });
    case "dynamic_filter":
      return (args, group) => call({ args, group });
    case "buffer_filter":
      return (args, rolloutId, buffer, n) => call({ args, rollout_id: rolloutId ?? null, buffer, n });
  }
}
