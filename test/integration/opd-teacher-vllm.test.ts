import { spawnSync } from "node:child_process";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { fixtureModel, startVllm, type Server } from "../../scripts/real-stack.ts";
import { createTeacher } from "../../src/engines/teacher.ts";
import { requirePythonModules } from "../helpers/python.ts";

/**
 * The OPD teacher (src/engines/teacher.ts) against a real vLLM server (vLLM's CPU build on the
 * fixture model): /v1/completions with prompt_logprobs 0 gives the log-prob of each given token,
 * equal to log_softmax of the same model's logits computed by transformers here, position by position.
 */
const python = requirePythonModules(["vllm", "transformers", "torch"]);
let model = "";
let vllm: Server | undefined;

beforeAll(async () => {
  model = await fixtureModel(python);
  vllm = await startVllm({ python, model, servedModelName: "teacher" });
}, 900_000);
afterAll(async () => {
  await vllm?.stop();
});

/** log_softmax(logits)[t] of tokens[p] given tokens[:p], for p >= promptLength, by transformers in float32. */
function transformersLogProbs(tokens: number[], promptLength: number): number[] {
  const script = [
    "import json, sys, torch",
    "from transformers import AutoModelForCausalLM",
    "m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()",
    "ids = json.loads(sys.argv[2]); p = int(sys.argv[3])",
    "with torch.no_grad(): lp = torch.log_softmax(m(torch.tensor([ids])).logits[0].float(), -1)",
    "print(json.dumps([lp[i - 1, ids[i]].item() for i in range(p, len(ids))]))",
  ].join("\n");
  const r = spawnSync(python, ["-c", script, model, JSON.stringify(tokens), String(promptLength)], { encoding: "utf8" });
  if (r.status !== 0) throw new Error(`transformers forward failed: ${r.stderr.slice(-3000)}`);
  return JSON.parse(r.stdout.trim().split("\n").pop() ?? "[]") as number[];
}

describe("OPD teacher on a real vLLM server", () => {
  it("returns each response token's log-prob under the teacher model", async () => {
    const teacher = createTeacher({ kind: "vllm", url: (vllm as Server).url, model: null, request_timeout_s: 120, wait_s: 600 });
    const tokens = Array.from({ length: 20 }, (_, i) => 3 + ((i * 11) % 240));
    const promptLength = 8;
    const got = await teacher.logProbs({ tokens, promptLength });
    const want = transformersLogProbs(tokens, promptLength);
    expect(got.length).toBe(tokens.length - promptLength);
    for (let t = 0; t < want.length; t++) expect(Math.abs((got[t] as number) - (want[t] as number)), `token ${t}`).toBeLessThan(2e-3);
    // A token id the server does not know is a clear 400, not retried.
    await expect(teacher.logProbs({ tokens: [...tokens, 10_000_000], promptLength })).rejects.toMatchObject({ code: "engine_http_error", isRetriable: false });
  }, 600_000);
});
