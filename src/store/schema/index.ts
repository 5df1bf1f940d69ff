export * from "./runs.ts";
export * from "./decisions.ts";
export * from "./drawn-prompts.ts";
export * from "./sample-segments.ts";
export * from "./sample-rewards.ts";
export * from "./train-steps.ts";
export * from "./rollout-history.ts";
export * from "./run-requests.ts";
