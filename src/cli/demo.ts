/** `npm run demo`: filled in by the embedded-model integration. */
export async function runDemo(_sets: readonly string[]): Promise<number> {
  process.stderr.write("rlq demo: the embedded model is not wired yet\n");
  return 1;
}
