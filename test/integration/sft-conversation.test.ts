import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { fixtureModel, startTorchTrainer, type Server } from "../../scripts/real-stack.ts";
import { repoRoot, spawnRlq } from "../helpers/processes.ts";
import { requirePythonModules } from "../helpers/python.ts";
import { createWorld, type World } from "../helpers/run-fixture.ts";

/**
 * An SFT run over chat message lists (docs/sft.md "Conversations"; src/data/sft-conversation.ts) on the
 * fixture HF model (scripts/build-fixture-model.py, a ChatML template) and the PyTorch trainer: each row
 * is a conversation of two demo questions, each answered by an assistant turn.
 *
 * The tokens and loss masks the run trains on (rollout_history) are checked against transformers'
 * own `apply_chat_template(..., return_assistant_tokens_mask=True)`, given the fixture's template with
 * `{% generation %}` around what slime's MultiTurnLossMaskGenerator trains of an assistant turn (its
 * content, `<|im_end|>` and the newline after: slime/utils/mask_utils.py, gen_multi_turn_loss_mask_qwen).
 * transformers finds the mask from the rendered text's character offsets, an independent computation
 * from rlq's prefix rendering. And the run learns: its loss falls.
 */
const python = requirePythonModules(["torch", "transformers"]);
const STEPS = 8;
const BATCH = 8;

/** The fixture model's chat_template.jinja with the trained span of an assistant turn marked for transformers. */
const TAGGED_TEMPLATE =
  "{% for message in messages %}{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>' + '\\n' }}{% endgeneration %}" +
  "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endif %}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const REFERENCE = `
import json, sys
from transformers import AutoTokenizer
model, template, path = sys.argv[1], sys.argv[2], sys.argv[3]
tok = AutoTokenizer.from_pretrained(model)
# The template must render exactly what the model's own does, so that only the mask differs.
for line in open(path):
    messages = json.loads(line)["messages"]
    assert tok.apply_chat_template(messages, tokenize=False) == tok.apply_chat_template(messages, tokenize=False, chat_template=template)
    out = tok.apply_chat_template(messages, chat_template=template, return_dict=True, return_assistant_tokens_mask=True)
    print(json.dumps({"input_ids": list(out["input_ids"]), "assistant_masks": list(out["assistant_masks"])}))
`;

describe("an SFT run over chat message lists", () => {
  let w: World;
  let model = "";
  let trainer: Server | undefined;
  let dataPath = "";
  beforeAll(async () => {
    [w, model] = await Promise.all([createWorld("sftconv"), fixtureModel(python)]);
    trainer = await startTorchTrainer(python, ["--threads", "1"]);
    const rows = readFileSync(join(repoRoot, "examples/demo/train.jsonl"), "utf8")
      .split("\n")
      .filter((l) => l.trim() !== "")
      .slice(0, 2 * STEPS * BATCH)
      .map((l) => JSON.parse(l) as { input: string; label: string });
    const conversations = [];
    for (let i = 0; i + 1 < rows.length; i += 2) {
      const [a, b] = [rows[i], rows[i + 1]] as [{ input: string; label: string }, { input: string; label: string }];
      conversations.push({
        messages: [
          { role: "user", content: a.input },
          { role: "assistant", content: `\\boxed{${a.label}}` },
          { role: "user", content: b.input },
          { role: "assistant", content: `\\boxed{${b.label}}` },
        ],
      });
    }
    dataPath = join(mkdtempSync(join(tmpdir(), "rlq-sftconv-")), "conversations.jsonl");
    writeFileSync(dataPath, conversations.map((c) => JSON.stringify(c)).join("\n") + "\n");
  }, 300_000);
  afterAll(async () => {
    await trainer?.stop(2_000);
    await w?.close();
  });

  it("trains on the assistant turns' tokens, as transformers' assistant mask marks them, and its loss falls", async () => {
    const runId = await w.start({
      prompt_data: dataPath,
      input_key: "messages",
      loss_type: "sft_loss",
      apply_chat_template: true,
      hf_checkpoint: model,
      tokenizer: "hf",
      n_samples_per_prompt: 1,
      over_sampling_batch_size: BATCH,
      rollout_batch_size: BATCH,
      num_rollout: STEPS,
      rollout_max_response_len: 48,
      rollout_shuffle: false,
      dynamic_sampling_filter_path: null,
      custom_rm_path: null,
      rm_type: "math",
      lr: 1e-3,
      weight_sync: "none",
      trainer: { kind: "remote", url: (trainer as Server).url },
      train_stall_timeout_s: 120,
    });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    let timer: NodeJS.Timeout | undefined;
    const code = await Promise.race([up.exited, new Promise<string>((r) => (timer = setTimeout(() => r("still running after 300 s"), 300_000)))]);
    clearTimeout(timer);
    up.kill("SIGTERM");
    expect(code, `${up.output()}\n--- trainer ---\n${trainer?.log().slice(-4000)}`).toBe(0);

    const history = (
      await w.db.pool.query(
        `SELECT d.dataset_index, h.tokens, h.prompt_length, h.loss_mask FROM rollout_history h
           JOIN drawn_prompts d ON d.run_id = h.run_id AND d.draw_ordinal = h.draw_ordinal
          WHERE h.run_id = $1 AND h.trained_step IS NOT NULL ORDER BY h.draw_ordinal`,
        [runId],
      )
    ).rows as Array<{ dataset_index: number; tokens: number[]; prompt_length: number; loss_mask: number[] }>;
    expect(history).toHaveLength(STEPS * BATCH);

    const ref = spawnSync(python, ["-c", REFERENCE, model, TAGGED_TEMPLATE, dataPath], { encoding: "utf8", timeout: 120_000 });
    expect(ref.status, ref.stderr).toBe(0);
    const expected = ref.stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { input_ids: number[]; assistant_masks: number[] });
    for (const h of history) {
      const e = expected[h.dataset_index] as { input_ids: number[]; assistant_masks: number[] };
      expect(h.tokens).toEqual(e.input_ids);
      // The prompt (the first user turn and the generation prompt) trains nothing; the response is masked as transformers masks it.
      expect(e.assistant_masks.slice(0, h.prompt_length).every((m) => m === 0)).toBe(true);
      expect(h.loss_mask).toEqual(e.assistant_masks.slice(h.prompt_length));
      // Both answers train and the second question does not: the mask has 0s inside the response.
      expect(h.loss_mask[0]).toBe(1);
      expect(h.loss_mask).toContain(0);
    }

    const loss = (await w.db.pool.query("SELECT value FROM train_metrics WHERE run_id = $1 AND key = 'loss' ORDER BY step", [runId])).rows.map((r) =>
      Number(r.value),
    );
    expect(loss).toHaveLength(STEPS);
    const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
    const [first, last] = [mean(loss.slice(0, 2)), mean(loss.slice(-2))];
    console.log(`SFT over conversations: loss ${loss.map((l) => l.toFixed(3)).join(" ")}`);
    expect(last).toBeLessThan(0.8 * first);
  }, 600_000);
});
