import type { NodePgDatabase } from "drizzle-orm/node-postgres";
import type * as schema from "./schema/index.ts";

/** The drizzle database over rlq's schema: a pool's or a transaction's, as every store function takes it. */
export type Database = NodePgDatabase<typeof schema>;
