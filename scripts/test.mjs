// `npm test`: the unit project, then the integration and python projects at once, as two vitest
// processes. The python project runs one file at a time (vitest.config.ts), the integration project
// two (below); the python project's
// files spend their time in Python processes (the trainer's suite, a vLLM server, the real-stack
// run) and the integration project's mostly wait on processes and databases, so running the two
// side by side takes the python project's minutes off the wall clock. Both global setups build the
// shared pieces under locks (the template database, .venv). The python project's output is held
// and printed after the integration project's, so neither interleaves with the other.
// With arguments (`npm test -- test/integration/x.test.ts`), vitest runs them as given.
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";

const vitest = fileURLToPath(new URL("../node_modules/vitest/vitest.mjs", import.meta.url));
const run = (args, capture) =>
  new Promise((resolve) => {
    const child = spawn(process.execPath, [vitest, "run", ...args], { stdio: capture ? ["ignore", "pipe", "pipe"] : "inherit" });
    let out = "";
    if (capture) {
      child.stdout.on("data", (d) => (out += d));
      child.stderr.on("data", (d) => (out += d));
    }
    child.on("exit", (code, signal) => resolve({ code: code ?? (signal ? 1 : 0), out }));
  });

/**
 * The integration project's files two at a time: each file has its own database, queue prefix,
 * RLQ_HOME and ports (and the fault tests their own Postgres and Redis), and most of a file's time
 * is spent waiting on processes, outages and timeouts, so two at once fill the cores' idle time.
 */
const integrationWorkers = ["--fileParallelism", "--maxWorkers=2"];

const extra = process.argv.slice(2);
if (extra.length > 0) process.exit((await run(extra, false)).code);

const unit = await run(["--project", "unit"], false);
if (unit.code !== 0) process.exit(unit.code);
const [integration, python] = await Promise.all([run(["--project", "integration", ...integrationWorkers], false), run(["--project", "python"], true)]);
process.stdout.write(`\n--- the python project (ran beside the integration project) ---\n${python.out}`);
const failed = [integration.code !== 0 && "integration", python.code !== 0 && "python"].filter(Boolean);
process.stdout.write(failed.length ? `\nnpm test: the ${failed.join(" and ")} project failed\n` : "\nnpm test: unit, integration and python passed\n");
process.exit(failed.length ? 1 : 0);
