/**
 * Python plugins, unmodified (rewards, dynamic and buffer filters, generate
 * functions): `custom_rm_path: py:my_rewards.reward_func`
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

import { spawn, type ChildProcess } from "node:child_process";
import { isAbsolute, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { z } from "zod";
import { pluginPython } from "../config/env.ts";
import { RlqError } from "../lib/errors.ts";
import {
  countSequence,
  type CustomGenerateFunction,
  type CustomGenerateHelpers,
  type CustomGenerateSample,
  type EngineTurn,
  type ImageInput,
  type Turn,
} from "../rollout/custom-generate.ts";

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
/** The host asking, during call `id`, for an engine call (slime's `post` to /generate). */
const engineRequestSchema = z.object({ id: z.number(), engine: z.number(), payload: z.unknown() });
export type PythonFailure = Extract<Answer, { ok: false }>["error"];

/** A call the host answered with a failure: the caller words it (it knows the sample). */
export class PythonPluginFailure extends Error {
  constructor(readonly failure: PythonFailure) {
    super(`${failure.type}: ${failure.message}`);
    this.name = "PythonPluginFailure";
  }
}

/** Answers one engine request a generate function made through slime's `post` (the host waits for it). */
export type EngineRequestHandler = (payload: unknown) => Promise<unknown>;

interface Pending {
  resolve(a: Answer): void;
  reject(e: Error): void;
  onEngine?: EngineRequestHandler;
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
      const engine = engineRequestSchema.safeParse(msg);
      if (engine.success) {
        this.answerEngine(engine.data);
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

  /** A generate call's engine request: answered by the call's handler, its failure kept for the call to throw. */
  private answerEngine(req: z.infer<typeof engineRequestSchema>): void {
    const p = this.pending.get(req.id);
    const reply = (body: Record<string, unknown>) => this.child.stdin?.write(`${JSON.stringify({ engine_reply: req.engine, ...body })}\n`);
    if (!p?.onEngine) {
      reply({ ok: false, error: "this call cannot reach the engine" });
      return;
    }
    p.onEngine(req.payload).then(
      (result) => reply({ ok: true, result }),
      (e: unknown) => reply({ ok: false, error: (e as Error).message }),
    );
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

  async request(body: Record<string, unknown>, onEngine?: EngineRequestHandler): Promise<Answer> {
    this.busy++;
    this.refIfBusy();
    try {
      await this.ready;
      if (this.isExited) throw new RlqError("plugin_sidecar_failed", "the Python plugin host exited");
      const id = this.nextId++;
      const answer = new Promise<Answer>((res, rej) => this.pending.set(id, { resolve: res, reject: rej, ...(onEngine ? { onEngine } : {}) }));
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
  const h = hosts.get(`${pluginPython()}\0${resolve(cwd)}`);
  return h && !h.isExited ? h.pid : undefined;
}

/** Stop this process's hosts (they also exit on their own when this process dies: stdin closes). */
export function closePythonHosts(): void {
  for (const h of hosts.values()) h.close();
  hosts.clear();
}

/** One call, tried again once on a fresh host when the host died under it. */
async function callHost(cwd: string, body: Record<string, unknown>, onEngine?: EngineRequestHandler): Promise<unknown> {
  let answer: Answer;
  try {
    answer = await hostFor(cwd).request(body, onEngine);
  } catch (e) {
    // A generate call is not tried again: its engine turns so far belong to the failed attempt.
    if (!(e instanceof RlqError && e.code === "plugin_sidecar_failed") || onEngine) throw e;
    answer = await hostFor(cwd).request(body);
  }
  if (!answer.ok) throw new PythonPluginFailure(answer.error);
  return answer.result;
}

export type PythonPluginKind = "reward" | "reward_group" | "dynamic_filter" | "buffer_filter" | "generate";

const EXPECTED: Record<PythonPluginKind, string> = {
  reward: "a number, a bool or a dict of named components (slime's custom_rm_path)",
  reward_group: "a list with one reward per sample (custom_rm_path with group_rm)",
  dynamic_filter: "a bool or slime's DynamicFilterOutput(keep=..., reason=...)",
  buffer_filter: "a list of groups (lists of Samples) taken from the buffer",
  generate: "the Sample, its tokens the prompt's followed by the engine's and tool tokens (slime's custom_generate_function_path)",
};

/** Where a call failed, for messages: "on sample 3", "on group 12". */
function callSite(kind: PythonPluginKind, body: Record<string, unknown>): string {
  if (kind === "reward") return ` on sample ${(body.sample as { sampleIndex?: number }).sampleIndex ?? "?"}`;
  if (kind === "dynamic_filter") return ` on group ${(body.group as { groupId?: number }).groupId ?? "?"}`;
  if (kind === "reward_group") return ` on a group of ${(body.samples as unknown[]).length} samples`;
  if (kind === "generate")
    return ` on sample ${(body.sample as { sampleIndex?: number }).sampleIndex ?? "?"} of group ${(body.sample as { groupId?: number }).groupId ?? "?"}`;
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
  const call = async (body: Record<string, unknown>, onEngine?: EngineRequestHandler) => {
    try {
      return await callHost(cwd, { op: "call", kind, target, ...body }, onEngine);
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
    case "generate":
      return pythonGenerate(option, path, call) as (...args: unknown[]) => Promise<unknown>;
  }
}

const sglangPayloadSchema = z.looseObject({
  input_ids: z.array(z.number().int().nonnegative()).optional(),
  text: z.string().optional(),
  image_data: z.union([z.array(z.unknown()), z.string()]).nullish(),
  sampling_params: z
    .looseObject({
      max_new_tokens: z.number().int().nonnegative().optional(),
      temperature: z.number().optional(),
      stop_token_ids: z.array(z.number().int()).nullish(),
    })
    .optional(),
});

const generateReturnSchema = z.object({
  tokens: z.array(z.number().int().nonnegative()),
  response_length: z.number().int().nonnegative(),
  loss_mask: z.array(z.number()).nullable(),
  status: z.string(),
  /** sample.multimodal_inputs["images"] beyond the ones the host handed in, encoded as image_data entries (host.py). */
  images: z.array(z.string()).optional(),
});

/** How far `ids` extend `known`: the extra tokens, or null when `ids` do not start with `known`. */
function extension(known: readonly number[], ids: readonly number[]): number[] | null {
  if (ids.length < known.length) return null;
  for (let i = 0; i < known.length; i++) if (ids[i] !== known[i]) return null;
  return ids.slice(known.length);
}

/**
 * One image_data entry as SGLang's load_image reads it (python/sglang/srt/utils/common.py): a
 * name ending in png, jpg, jpeg, webp or gif is a file, a `data:` URI is decoded after its comma,
 * any other string is base64 (slime's encode_image_for_rollout_engine sends PNG base64 bare).
 * Returned as `tool(..., { images })` takes it; a URL or a non-string goes through as is, for
 * loadImage to refuse by name.
 */
function imageInputOf(entry: unknown): ImageInput {
  if (typeof entry !== "string" || entry.startsWith("data:") || /^[a-z][a-z0-9+.-]*:\/\//i.test(entry)) return entry as ImageInput;
  if (/(png|jpg|jpeg|webp|gif)$/i.test(entry)) return entry;
  return `data:;base64,${entry}`;
}

function imageDataList(v: unknown[] | string | null | undefined): unknown[] {
  return v === null || v === undefined ? [] : Array.isArray(v) ? v : [v];
}

/**
 * slime's `async generate(args, sample, sampling_params) -> Sample` run in
 * the host. Each \`post(url, payload)\` to /generate it makes comes here: the
 * payload's \`input_ids\` (or \`text\`) must extend the sample's tokens so far;
 * tokens beyond what rlq has recorded are a tool turn (loss mask 0), then
 * rlq's engine call runs as a turn (helpers.generate: rlq's request id, seed,
 * abort, budget), answered in SGLang's /generate shape. Tokens the returned
 * Sample holds after the last engine call are a final tool turn.
 *
 * Images, as slime's VLM multi-turn rollouts carry them: the host puts the
 * sample's images in `sample.multimodal_inputs["images"]`; a post's
 * `image_data` is the images so far (the sample's, then earlier observations')
 * followed by the new ones, which are the images of the tool turn before that
 * request (its tokens hold one placeholder each, as `tool(ids, { images })`
 * checks). The entries standing for images rlq holds are not read: rlq sends
 * its own copies. A final tool turn's images are read back from the returned
 * Sample's `multimodal_inputs["images"]` (slime's rollouts extend it with each
 * observation's images).
 */
function pythonGenerate(
  option: string,
  path: string,
  call: (body: Record<string, unknown>, onEngine?: EngineRequestHandler) => Promise<unknown>,
): CustomGenerateFunction {
  return async (args: unknown, sample: CustomGenerateSample, helpers: CustomGenerateHelpers) => {
    const turns: Turn[] = [];
    const known = [...sample.promptTokens, ...sample.responseTokens];
    const where = `${option} ${path} (sample ${sample.sampleIndex} of group ${sample.groupId})`;
    /** Images rlq holds for this sample so far: the round's own (observations) follow helpers.images. */
    let heldImages = helpers.images.length;
    const addTool = (extra: readonly number[], images: readonly unknown[], from: string) => {
      if (images.length > 0 && extra.length === 0) {
        throw new RlqError(
          "plugin_bad_call",
          `${where} ${from} ${images.length} new image(s) (beyond the ${heldImages} the sample holds) with no tokens appended since the last request to hold their placeholders: ` +
            "append the observation's tokens (one image placeholder per image) to sample.tokens before posting its images",
        );
      }
      if (extra.length === 0) return;
      const placeholder = helpers.imagePlaceholder;
      if (images.length === 0 && placeholder !== null) {
        const found = countSequence(extra, helpers.tokenizer.encode(placeholder));
        if (found > 0) {
          throw new RlqError(
            "plugin_bad_call",
            `${where} appended tokens holding ${found} image placeholder(s) ${JSON.stringify(placeholder)} but ${from} no new image for them: ` +
              "post the images so far followed by the observation's in image_data (or, after the last request, add them to sample.multimodal_inputs['images'])",
          );
        }
      }
      turns.push(helpers.tool(extra, images.length > 0 ? { images: images.map(imageInputOf) } : {}));
      known.push(...extra);
      heldImages += images.length;
    };
    const onEngine: EngineRequestHandler = async (raw) => {
      const parsed = sglangPayloadSchema.safeParse(raw);
      if (!parsed.success) throw new RlqError("plugin_bad_call", `${where} posted ${JSON.stringify(raw)?.slice(0, 200)}; expected SGLang's /generate body`);
      const p = parsed.data;
      const ids = p.input_ids ?? (p.text !== undefined ? helpers.tokenizer.encode(p.text) : null);
      const extra = ids === null ? null : extension(known, ids);
      if (extra === null) {
        throw new RlqError(
          "plugin_bad_call",
          `${where} posted ${p.input_ids ? "input_ids" : p.text !== undefined ? "text" : "neither input_ids nor text"} that do not continue the sample (prompt + response so far): post input_ids = sample.tokens (the prompt's, then every token appended since)`,
        );
      }
      // rlq sends the images it holds with every request; only the entries beyond them are new.
      addTool(extra, imageDataList(p.image_data).slice(heldImages), "posted");
      const sp = p.sampling_params ?? {};
      const turn: EngineTurn = await helpers.generate(turns, {
        ...(sp.max_new_tokens !== undefined ? { maxNewTokens: sp.max_new_tokens } : {}),
        ...(sp.stop_token_ids ? { extraStopTokenIds: sp.stop_token_ids } : {}),
        ...(sp.temperature !== undefined ? { temperature: sp.temperature } : {}),
      });
      turns.push(turn);
      known.push(...turn.tokens);
      return {
        text: turn.text,
        meta_info: {
          finish_reason: { type: turn.finishReason },
          output_token_logprobs: turn.tokens.map((t, i) => [turn.logProbs[i] ?? 0, t, null]),
          completion_tokens: turn.tokens.length,
          prompt_tokens: known.length - turn.tokens.length,
          weight_version: String(turn.weightVersion),
        },
      };
    };
    const raw = await call({ args, sample, images: helpers.images.map((i) => i.path) }, onEngine);
    const out = generateReturnSchema.safeParse(raw);
    if (!out.success) throw new RlqError("plugin_bad_return", `${where} returned ${JSON.stringify(raw)?.slice(0, 200)}; expected ${EXPECTED.generate}`);
    const tail = extension(known, out.data.tokens);
    if (tail === null) {
      throw new RlqError(
        "plugin_bad_return",
        `${where} returned sample.tokens (${out.data.tokens.length}) that do not continue the prompt and the engine's tokens (${known.length}); expected ${EXPECTED.generate}`,
      );
    }
    // multimodal_inputs["images"] beyond the sample's: the observations posted this round, then the final tool turn's.
    const observed = heldImages - helpers.images.length;
    addTool(tail, (out.data.images ?? []).slice(observed), "the returned sample.multimodal_inputs['images'] holds");
    const status = out.data.status;
    // aborted / pending: rlq's status follows the last engine turn (an abort resumes as a partial rollout).
    return status === "completed" || status === "truncated" || status === "failed" ? { turns, status } : { turns };
  };
}
