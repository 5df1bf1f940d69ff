/**
 * W&B export of a run's metric points, through W&B's own HTTP API.
 *
 * Why not the JS SDK (@wandb/sdk 0.5.1, wandb/wandb-js): its FileStream
 * (dist/internal/filestream.js) starts every process at history offset 0 and
 * has no resume, so a restarted rlq process would overwrite the run's history
 * from line 0; and in offline mode it drops records (`bufferRecord` returns
 * when `settings.offline`). Both break "never drop, never duplicate". What the
 * SDK sends is small, so this module speaks the same two calls itself:
 *   1. POST {host}/graphql  `UpsertBucket` (dist/internal/api.js) — creates or
 *      resumes the run named by rlq's run id, with group and config;
 *   2. POST {host}/files/{entity}/{project}/{run}/file_stream with
 *      `{files: {"wandb-history.jsonl": {offset, content: [json lines]},
 *      "wandb-summary.json": {offset: 0, content: [json]}}}`, and at the end
 *      `{complete: true, exitcode: 0}` (filestream.js `sendRecords`, `sendFinish`).
 * Both carry `Authorization: Basic base64("api:" + key)`.
 *
 * Exactly once: history lines are addressed by offset, and W&B's file_stream
 * puts the content at that offset (the SDKs retry a chunk with its offset, so
 * the server must take a repeat as the same lines). The sink keeps, in
 * `state.json`, the offset and the points acknowledged; it saves that only
 * after the server (or, offline, the local file) took the lines. A crash in
 * between re-sends the same offset with at least the same points (committed
 * facts only grow), which replaces those lines rather than adding to them.
 *
 * `wandb_mode: offline`: nothing leaves the machine. The same lines go, by the
 * same offset rule, to `files/wandb-history.jsonl` and `files/wandb-summary.json`
 * under the run's directory (the layout W&B's run files have). Every point also
 * stays in Postgres, so switching the run's sink to online later uploads it all.
 * This is not the Python SDK's `.wandb` transaction log: `wandb sync` cannot read it.
 */

import { closeSync, existsSync, fsyncSync, mkdirSync, openSync, readFileSync, renameSync, writeFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { z } from "zod";
import { RlqError } from "../../lib/errors.ts";
import { pointKey, type MetricPoint } from "./points.ts";

export interface WandbSettings {
  mode: "online" | "offline";
  host: string;
  apiKey: string | null;
  project: string;
  entity: string | null;
  group: string | null;
  /** W&B run id: rlq's run id (so a restarted sink resumes the same run). */
  runName: string;
  displayName: string;
  config: Record<string, unknown>;
  /** Where state.json (and, offline, files/) live. */
  dir: string;
  fetchImpl?: typeof fetch;
}

const stateSchema = z.object({
  runName: z.string(),
  entity: z.string().nullable(),
  project: z.string(),
  offset: z.number().int().nonnegative(),
  written: z.array(z.string()),
  summary: z.record(z.string(), z.number()),
  finished: z.boolean(),
});
type State = z.infer<typeof stateSchema>;

export interface WandbSink {
  has(p: { stream: string; step: number }): boolean;
  /** Write points not yet acknowledged (in the given order), in chunks of at most 100 lines. */
  write(points: readonly MetricPoint[]): Promise<number>;
  /** Mark the W&B run finished (once). */
  finish(): Promise<void>;
  offset(): number;
  /** Last train step acknowledged (-1: none). */
  lastTrainStep(): number;
}

const upsertBucket = `mutation UpsertBucket($id: String, $name: String, $project: String, $entity: String, $groupName: String, $displayName: String, $config: JSONString) {
  upsertBucket(input: {id: $id, name: $name, groupName: $groupName, modelName: $project, entityName: $entity, displayName: $displayName, config: $config}) {
    bucket { id name displayName project { id name entity { id name } } }
    inserted
  }
}`;

const upsertAnswer = z.object({
  data: z.object({
    upsertBucket: z.object({ bucket: z.object({ name: z.string(), project: z.object({ name: z.string(), entity: z.object({ name: z.string() }) }) }) }),
  }),
});

function saveState(dir: string, s: State): void {
  const tmp = join(dir, "state.json.tmp");
  writeFileSync(tmp, JSON.stringify(s));
  const fd = openSync(tmp, "r");
  fsyncSync(fd);
  closeSync(fd);
  renameSync(tmp, join(dir, "state.json"));
}

/** A line of history: slime logs `rollout/step` / `eval/step` next to the values (logging_utils.log's step_key). */
function historyLine(p: MetricPoint, offset: number): Record<string, number> {
  const line: Record<string, number> = { _step: offset, _timestamp: p.wallTime };
  line[p.stream === "train" ? "rollout/step" : "eval/step"] = p.step;
  for (const s of p.scalars) line[s.tag] = s.value;
  return line;
}

/** The file_stream body's path for the run (filestream.js). */
function fileStreamPath(s: State): string {
  return `/files/${s.entity}/${s.project}/${s.runName}/file_stream`;
}

/**
 * Offline: the history lines from `offset` on replaced by `lines` in files/wandb-history.jsonl (the
 * same rule as the server's file_stream), and the summary rewritten.
 */
function putOffline(filesDir: string, offset: number, lines: string[], summary: string): void {
  mkdirSync(filesDir, { recursive: true });
  const path = join(filesDir, "wandb-history.jsonl");
  const existing = existsSync(path)
    ? readFileSync(path, "utf8")
        .split("\n")
        .filter((l) => l.length > 0)
    : [];
  const next = [...existing.slice(0, offset), ...lines];
  const tmp = `${path}.tmp`;
  const fd = openSync(tmp, "w");
  writeSync(fd, next.map((l) => l + "\n").join(""));
  fsyncSync(fd);
  closeSync(fd);
  renameSync(tmp, path);
  writeFileSync(join(filesDir, "wandb-summary.json"), summary + "\n");
}

/**
 * One W&B run's sink. Its state (offset, points acknowledged, summary, finished) is `state`, written
 * only by `write`, `finish` and `upsertRun`, and saved to state.json after each change the server
 * (or the offline file) took.
 */
class WandbRunSink implements WandbSink {
  private state: State;
  private readonly written: Set<string>;
  private readonly auth: string | null;
  private readonly doFetch: typeof fetch;

  constructor(
    private readonly settings: WandbSettings,
    state: State,
  ) {
    this.state = state;
    this.written = new Set(state.written);
    this.auth = settings.apiKey ? `Basic ${Buffer.from(`api:${settings.apiKey}`).toString("base64")}` : null;
    this.doFetch = settings.fetchImpl ?? fetch;
  }

  has(p: { stream: string; step: number }): boolean {
    return this.written.has(pointKey(p));
  }

  offset(): number {
    return this.state.offset;
  }

  lastTrainStep(): number {
    return Math.max(-1, ...[...this.written].filter((k) => k.startsWith("train@")).map((k) => Number(k.slice(6))));
  }

  /** Online: create or resume the W&B run (`UpsertBucket`) and take the names the server answers with. */
  async upsertRun(): Promise<void> {
    const s = this.settings;
    const answer = upsertAnswer.safeParse(
      await this.post("/graphql", {
        query: upsertBucket,
        variables: {
          name: s.runName,
          project: s.project,
          entity: s.entity,
          groupName: s.group,
          displayName: s.displayName,
          config: JSON.stringify(Object.fromEntries(Object.entries(s.config).map(([k, v]) => [k, { value: v }]))),
        },
      }),
    );
    if (!answer.success) throw new RlqError("wandb_bad_answer", `W&B upsertBucket answered an unexpected shape: ${answer.error.issues[0]?.message}`);
    const b = answer.data.data.upsertBucket.bucket;
    this.state = { ...this.state, runName: b.name, project: b.project.name, entity: b.project.entity.name };
  }

  async write(points: readonly MetricPoint[]): Promise<number> {
    const todo = points.filter((p) => !this.written.has(pointKey(p)) && p.scalars.length > 0);
    let n = 0;
    for (let i = 0; i < todo.length; i += 100) n += await this.writeChunk(todo.slice(i, i + 100));
    return n;
  }

  async finish(): Promise<void> {
    if (this.state.finished) return;
    if (this.settings.mode === "online") await this.post(fileStreamPath(this.state), { complete: true, exitcode: 0 });
    this.state = { ...this.state, finished: true };
    saveState(this.settings.dir, this.state);
  }

  /** One chunk of history lines at the current offset; the state is saved only after they were taken. */
  private async writeChunk(chunk: readonly MetricPoint[]): Promise<number> {
    const { state } = this;
    const lines = chunk.map((p, j) => JSON.stringify(historyLine(p, state.offset + j)));
    const summary = { ...state.summary };
    for (const p of chunk) for (const s of p.scalars) summary[s.tag] = s.value;
    const summaryText = JSON.stringify(summary);
    if (this.settings.mode === "online") {
      await this.post(fileStreamPath(state), {
        files: { "wandb-history.jsonl": { offset: state.offset, content: lines }, "wandb-summary.json": { offset: 0, content: [summaryText] } },
      });
    } else putOffline(join(this.settings.dir, "files"), state.offset, lines, summaryText);
    for (const p of chunk) this.written.add(pointKey(p));
    this.state = { ...this.state, offset: state.offset + lines.length, written: [...this.written], summary };
    saveState(this.settings.dir, this.state);
    return lines.length;
  }

  /** A POST to W&B with the API key; its errors say whether a retry can help. */
  private async post(path: string, body: unknown): Promise<unknown> {
    const { host } = this.settings;
    if (!this.auth) throw new RlqError("wandb_no_key", "use_wandb with wandb_mode online needs wandb_key: {env: WANDB_API_KEY} (or {file: PATH})");
    let res: Response;
    try {
      res = await this.doFetch(`${host.replace(/\/$/, "")}${path}`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: this.auth, "user-agent": "rlq metric sink" },
        body: JSON.stringify(body),
      });
    } catch (e) {
      throw new RlqError("wandb_unreachable", `W&B at ${host} did not answer ${path}: ${(e as Error).message}`, { cause: e, isRetriable: true });
    }
    const text = await res.text();
    if (!res.ok)
      throw new RlqError(res.status === 401 || res.status === 403 ? "wandb_auth" : "wandb_http", `W&B ${path} answered ${res.status}: ${text.slice(0, 200)}`, {
        isRetriable: res.status >= 500 || res.status === 429,
      });
    return text.length > 0 ? JSON.parse(text) : null;
  }
}

export async function openWandbSink(settings: WandbSettings): Promise<WandbSink> {
  mkdirSync(settings.dir, { recursive: true });
  const statePath = join(settings.dir, "state.json");
  const state: State = existsSync(statePath)
    ? stateSchema.parse(JSON.parse(readFileSync(statePath, "utf8")))
    : { runName: settings.runName, entity: settings.entity, project: settings.project, offset: 0, written: [], summary: {}, finished: false };
  const sink = new WandbRunSink(settings, state);
  if (settings.mode === "online") await sink.upsertRun();
  return sink;
}
