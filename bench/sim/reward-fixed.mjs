// BENCH reward plugin (custom_rm_path) for bench/cluster-sim.ts: a fixed cost per sample
// (RLQ_SIM_REWARD_WALL_MS, the sim's rewardMs already divided by its time scale), then 1 if the
// response has an even number of tokens' bytes, else 0.
const ms = Number(process.env.RLQ_SIM_REWARD_WALL_MS ?? "0");
export async function reward(_args, sample) {
  if (ms > 0) await new Promise((r) => setTimeout(r, ms));
  return Buffer.byteLength(sample.response) % 2 === 0 ? 1 : 0;
}
