/**
 * The V8 flags every rlq process starts with: `bin/rlq.js`'s shebang, the
 * `npm run demo` and `npm run rlq` scripts, and the processes the tests and
 * benches spawn (test/helpers/processes.ts) all pass these, and a test
 * (test/integration/node-flags.test.ts) keeps them equal.
 *
 * --max-semi-space-size=64 (MB; Node 20's default is 16): a rollout worker
 * parses every engine answer into per-token arrays ([log-prob, id, null] per
 * token from SGLang) that live until the round is written, so with 64 jobs in
 * flight the default young generation promotes most of them and the old
 * generation's collections took 20-30% of the worker's main thread. With 64 MB
 * the long-response control-plane bench ran ×1.18 faster (medians of three
 * interleaved runs, `BENCH_NODE_FLAGS` in bench/control-plane.ts). The young
 * generation grows to it only under that load. (The shebang needs `env -S`:
 * coreutils 8.30+, macOS; elsewhere NODE_OPTIONS=--max-semi-space-size=64.)
 */
export const rlqNodeFlags: readonly string[] = ["--max-semi-space-size=64"];
