CREATE TABLE "step_summaries" (
	"run_id" text NOT NULL,
	"step" integer NOT NULL,
	"samples" integer,
	"reward_trained" double precision,
	"reward_all" double precision,
	"reward_filtered" double precision,
	"groups_kept" integer,
	"groups_filtered" integer,
	"response_length_mean" double precision,
	"response_length_max" integer,
	"response_tokens" bigint,
	"trained_response_tokens" bigint,
	"staleness" jsonb,
	CONSTRAINT "step_summaries_run_id_step_pk" PRIMARY KEY("run_id","step")
);
--> statement-breakpoint
-- step_summaries is a projection that rlq_runtime writes and rlq_reader may read (the dashboard
-- draws from it). 0007's function with the table added to its lists.
CREATE OR REPLACE FUNCTION rlq_apply_privileges() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  t text;
  projections text[] := ARRAY['runs','run_leases','rollout_history','run_requests','engine_metrics','run_snapshots','step_summaries'];
  readable text[] := rlq_guard.fact_names() || ARRAY['runs','rollout_history','run_requests','engine_metrics','step_summaries',
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
--> statement-breakpoint
-- Runs recorded before this migration: their committed steps summarised from their history, as
-- store/projections.ts summarises a step when it commits (store/step-aggregates.ts), in one pass
-- over each side.
INSERT INTO step_summaries (run_id, step, samples, reward_trained, reward_all, reward_filtered, groups_kept, groups_filtered,
                            response_length_mean, response_length_max, response_tokens, trained_response_tokens, staleness)
WITH rollout AS (
  SELECT h.run_id, h.step, count(*) AS samples,
         avg(h.reward) FILTER (WHERE h.trained_step IS NOT NULL) AS reward_trained, avg(h.reward) AS reward_all,
         avg(h.reward) FILTER (WHERE h.outcome = 'filtered') AS reward_filtered,
         count(DISTINCT h.group_id) FILTER (WHERE h.outcome = 'kept') AS groups_kept,
         count(DISTINCT h.group_id) FILTER (WHERE h.outcome = 'filtered') AS groups_filtered,
         avg(h.response_length) FILTER (WHERE h.trained_step IS NOT NULL) AS response_length_mean,
         max(h.response_length) AS response_length_max, sum(h.response_length) AS response_tokens
  FROM rollout_history h GROUP BY 1, 2),
trained AS (SELECT run_id, trained_step AS step, sum(response_length) AS tokens FROM rollout_history WHERE trained_step IS NOT NULL GROUP BY 1, 2),
stale AS (
  SELECT run_id, step, jsonb_object_agg(staleness, n) AS counts
  FROM (SELECT run_id, step, staleness, count(*) AS n FROM staleness WHERE staleness IS NOT NULL GROUP BY 1, 2, 3) x GROUP BY 1, 2)
SELECT t.run_id, t.step, r.samples, r.reward_trained, r.reward_all, r.reward_filtered, r.groups_kept, r.groups_filtered,
       r.response_length_mean, r.response_length_max, r.response_tokens, tr.tokens, coalesce(st.counts, '{}'::jsonb)
FROM train_steps t
LEFT JOIN rollout r ON r.run_id = t.run_id AND r.step = t.step
LEFT JOIN trained tr ON tr.run_id = t.run_id AND tr.step = t.step
LEFT JOIN stale st ON st.run_id = t.run_id AND st.step = t.step
ON CONFLICT DO NOTHING;
