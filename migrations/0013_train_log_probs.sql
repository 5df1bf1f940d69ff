CREATE TABLE "train_log_probs" (
	"run_id" text NOT NULL,
	"step" integer NOT NULL,
	"group_id" bigint NOT NULL,
	"sample_index" integer NOT NULL,
	"log_probs" real[] NOT NULL,
	CONSTRAINT "train_log_probs_run_id_group_id_sample_index_step_pk" PRIMARY KEY("run_id","group_id","sample_index","step")
);
--> statement-breakpoint
-- train_log_probs is a fact table: 0006's list with it added, then its guards as 0001 and 0006
-- give every fact table (no UPDATE, DELETE or TRUNCATE; no DDL outside rlq migrate), and the
-- privileges re-applied (rlq_runtime inserts and reads it, rlq_reader reads it).
CREATE OR REPLACE FUNCTION rlq_guard.fact_names() RETURNS text[] LANGUAGE sql IMMUTABLE AS $$
  SELECT ARRAY['decisions','drawn_prompts','sample_segments','group_rounds','sample_rewards',
               'train_steps','train_metrics','eval_results','eval_samples','train_log_probs']
$$;
--> statement-breakpoint
INSERT INTO rlq_guard.fact_tables SELECT 'public.train_log_probs'::regclass::oid, 'train_log_probs' ON CONFLICT DO NOTHING;
--> statement-breakpoint
CREATE TRIGGER train_log_probs_insert_only BEFORE UPDATE OR DELETE ON train_log_probs FOR EACH ROW EXECUTE FUNCTION rlq_forbid_mutation();
--> statement-breakpoint
CREATE TRIGGER train_log_probs_no_truncate BEFORE TRUNCATE ON train_log_probs FOR EACH STATEMENT EXECUTE FUNCTION rlq_guard.forbid_truncate();
--> statement-breakpoint
SELECT rlq_apply_privileges();
