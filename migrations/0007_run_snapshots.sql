CREATE TABLE "run_snapshots" (
	"run_id" text NOT NULL,
	"seq" bigint NOT NULL,
	"format" integer NOT NULL,
	"state" text NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "run_snapshots_run_id_seq_pk" PRIMARY KEY("run_id","seq")
);
--> statement-breakpoint
-- run_snapshots is a projection (rlq_runtime writes and prunes it), not readable by rlq_reader:
-- it is the controller's internal state. 0006's function with the table added to its lists.
CREATE OR REPLACE FUNCTION rlq_apply_privileges() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  t text;
  projections text[] := ARRAY['runs','run_leases','rollout_history','run_requests','engine_metrics','run_snapshots'];
  readable text[] := rlq_guard.fact_names() || ARRAY['runs','rollout_history','run_requests','engine_metrics',
                     'prompt_draws','reward_by_version','staleness','prompt_stats'];
BEGIN
  -- The owner: every rlq object in public, and drizzle's journal, belong to rlq_owner.
  BEGIN
    EXECUTE 'GRANT CREATE, USAGE ON SCHEMA public TO rlq_owner';
    FOR t IN SELECT format('%I', c.relname) || ':' || c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'public' AND c.relkind IN ('r', 'v', 'S', 'p') AND pg_get_userbyid(c.relowner) <> 'rlq_owner'
               AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = c.oid AND d.deptype IN ('a', 'i') AND c.relkind = 'S') LOOP
      EXECUTE format('ALTER %s %s OWNER TO rlq_owner',
        CASE split_part(t, ':', 2) WHEN 'v' THEN 'VIEW' WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END, split_part(t, ':', 1));
    END LOOP;
    FOR t IN SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'public' AND p.proname LIKE 'rlq\_%' AND pg_get_userbyid(p.proowner) <> 'rlq_owner' LOOP
      EXECUTE format('ALTER FUNCTION %s OWNER TO rlq_owner', t);
    END LOOP;
    IF EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'drizzle') THEN
      EXECUTE 'ALTER SCHEMA drizzle OWNER TO rlq_owner';
      EXECUTE 'ALTER TABLE drizzle.__drizzle_migrations OWNER TO rlq_owner';
    END IF;
  EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'rlq migrate: % may not give rlq''s tables to rlq_owner (run migrations as rlq_owner, or as a superuser)', current_user;
  END;
  -- Nobody but the owner, unless granted below.
  FOREACH t IN ARRAY rlq_guard.fact_names() || projections LOOP
    EXECUTE format('REVOKE ALL ON %I FROM PUBLIC', t);
  END LOOP;
  EXECUTE format('GRANT CONNECT ON DATABASE %I TO rlq_runtime, rlq_reader', current_database());
  -- BullMQ's Postgres backend keeps each queue prefix in a schema of its own, made on first use.
  EXECUTE format('GRANT CREATE ON DATABASE %I TO rlq_runtime', current_database());
  EXECUTE 'GRANT USAGE ON SCHEMA public TO rlq_runtime, rlq_reader';
  FOREACH t IN ARRAY rlq_guard.fact_names() LOOP
    EXECUTE format('GRANT SELECT, INSERT ON %I TO rlq_runtime', t);
  END LOOP;
  FOREACH t IN ARRAY projections LOOP
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I TO rlq_runtime', t);
  END LOOP;
  FOREACH t IN ARRAY ARRAY['prompt_draws','reward_by_version','staleness','prompt_stats'] LOOP
    EXECUTE format('GRANT SELECT ON %I TO rlq_runtime', t);
  END LOOP;
  EXECUTE 'GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO rlq_runtime';
  FOREACH t IN ARRAY readable LOOP
    EXECUTE format('GRANT SELECT ON %I TO rlq_reader', t);
  END LOOP;
  -- rlq's processes check that the database is migrated before they start.
  IF EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'drizzle') THEN
    EXECUTE 'GRANT USAGE ON SCHEMA drizzle TO rlq_runtime';
    EXECUTE 'GRANT SELECT ON drizzle.__drizzle_migrations TO rlq_runtime';
  END IF;
END $$;
--> statement-breakpoint
SELECT rlq_apply_privileges();
