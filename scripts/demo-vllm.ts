/**
 * `npm run demo:vllm`: the demo task on the real stack. Builds rlq's Python environment and the
 * fixture model when missing (minutes, once), starts a vLLM server on the CPU and the PyTorch
 * trainer on two ranks (FSDP2, gloo), runs examples/vllm-demo.yaml against them in this process,
 * and stops both servers at the end or on Ctrl-C. Extra `--set key=value` flags go to the run.
 */
import { parseArgs } from "node:util";
import { join } from "node:path";
import { runDemo } from "../src/cli/demo.ts";
import { fixtureModel, repoRoot, startTorchTrainer, startVllm, venvPython, type Server } from "./real-stack.ts";

const { values } = parseArgs({ options: { set: { type: "string", multiple: true } } });
const say = (s: string) => process.stderr.write(`demo:vllm: ${s}\n`);

say("rlq's Python environment (scripts/python-env.sh)");
const python = venvPython();
say("the fixture model (scripts/build-fixture-model.py)");
const model = await fixtureModel(python);
say(`starting vLLM on ${model} and the PyTorch trainer (2 ranks, FSDP2); vLLM takes 1-3 minutes on 2 cores`);
const servers: Server[] = [];
const stopAll = () => Promise.all(servers.map((s) => s.stop()));
let code: number;
try {
  const [vllm, trainer] = await Promise.all([
    startVllm({ python, model, servedModelName: "fixture" }).then((s) => (servers.push(s), s)),
    startTorchTrainer(python, ["--threads", "1", "--nproc", "2", "--sharding", "fsdp"]).then((s) => (servers.push(s), s)),
  ]);
  say(`vLLM at ${vllm.url}, trainer at ${trainer.url}`);
  code = await runDemo(
    [
      `hf_checkpoint=${model}`,
      `ref_load=${model}`,
      `engine={kind: openai, urls: ['${vllm.url}'], model: fixture}`,
      `trainer={kind: remote, url: '${trainer.url}'}`,
      ...(values.set ?? []),
    ],
    { configPath: join(repoRoot, "examples/vllm-demo.yaml"), name: "vllm-demo" },
  );
} finally {
  await stopAll();
}
process.exit(code);
