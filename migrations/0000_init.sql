CREATE TABLE "run_leases" (
	"run_id" text PRIMARY KEY NOT NULL,
	"epoch" integer NOT NULL,
	"holder" text NOT NULL,
	"acquired_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
CREATE TABLE "runs" (
	"id" text PRIMARY KEY NOT NULL,
	"name" text NOT NULL,
	"config" jsonb NOT NULL,
	"dataset_fingerprint" text NOT NULL,
	"plugin_fingerprints" jsonb NOT NULL,
	"status" text NOT NULL,
	"step" integer DEFAULT 0 NOT NULL,
	"weight_version" integer DEFAULT 0 NOT NULL,
	"last_error" text,
	"last_seq" bigint DEFAULT 0 NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
CREATE TABLE "decisions" (
	"run_id" text NOT NULL,
	"seq" bigint NOT NULL,
	"lease_epoch" integer NOT NULL,
	"kind" text NOT NULL,
	"step" integer,
	"group_id" bigint,
	"payload" jsonb NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "decisions_run_id_seq_pk" PRIMARY KEY("run_id","seq")
);
--> statement-breakpoint
CREATE TABLE "drawn_prompts" (
	"run_id" text NOT NULL,
	"draw_ordinal" bigint NOT NULL,
	"epoch" integer NOT NULL,
	"dataset_index" integer NOT NULL,
	"step" integer NOT NULL,
	"prompt" text NOT NULL,
	"label" text,
	"metadata" jsonb NOT NULL,
	"prompt_tokens" integer[] NOT NULL,
	CONSTRAINT "drawn_prompts_run_id_draw_ordinal_pk" PRIMARY KEY("run_id","draw_ordinal")
);
--> statement-breakpoint
CREATE TABLE "group_rounds" (
	"run_id" text NOT NULL,
	"group_id" bigint NOT NULL,
	"round" integer NOT NULL,
	"step" integer NOT NULL,
	"job_id" text NOT NULL,
	"is_complete" boolean NOT NULL,
	"was_aborted" boolean NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "group_rounds_run_id_group_id_round_pk" PRIMARY KEY("run_id","group_id","round")
);
--> statement-breakpoint
CREATE TABLE "sample_segments" (
	"run_id" text NOT NULL,
	"group_id" bigint NOT NULL,
	"sample_index" integer NOT NULL,
	"segment_index" integer NOT NULL,
	"round" integer NOT NULL,
	"step" integer NOT NULL,
	"job_id" text NOT NULL,
	"weight_version" integer NOT NULL,
	"expected_weight_version" integer NOT NULL,
	"is_version_mismatch" boolean NOT NULL,
	"token_start" integer NOT NULL,
	"token_end" integer NOT NULL,
	"tokens" integer[] NOT NULL,
	"log_probs" real[] NOT NULL,
	"loss_mask" smallint[] NOT NULL,
	"engine" text NOT NULL,
	"finish_reason" text NOT NULL,
	"status" text NOT NULL,
	"error" text,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "sample_segments_run_id_group_id_sample_index_segment_index_pk" PRIMARY KEY("run_id","group_id","sample_index","segment_index")
);
--> statement-breakpoint
CREATE TABLE "sample_rewards" (
	"run_id" text NOT NULL,
	"group_id" bigint NOT NULL,
	"sample_index" integer NOT NULL,
	"round" integer NOT NULL,
	"step" integer NOT NULL,
	"job_id" text NOT NULL,
	"reward" double precision NOT NULL,
	"components" jsonb NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "sample_rewards_run_id_group_id_sample_index_round_pk" PRIMARY KEY("run_id","group_id","sample_index","round")
);
--> statement-breakpoint
CREATE TABLE "train_metrics" (
	"run_id" text NOT NULL,
	"step" integer NOT NULL,
	"key" text NOT NULL,
	"value" double precision NOT NULL,
	CONSTRAINT "train_metrics_run_id_step_key_pk" PRIMARY KEY("run_id","step","key")
);
--> statement-breakpoint
CREATE TABLE "train_steps" (
	"run_id" text NOT NULL,
	"step" integer NOT NULL,
	"attempt" text NOT NULL,
	"weight_version_in" integer NOT NULL,
	"weight_version_out" integer NOT NULL,
	"num_samples" integer NOT NULL,
	"num_tokens" integer NOT NULL,
	"checkpoint_uri" text NOT NULL,
	"checkpoint_sha256" text NOT NULL,
	"committed_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "train_steps_run_id_step_pk" PRIMARY KEY("run_id","step")
);
--> statement-breakpoint
CREATE TABLE "rollout_history" (
	"run_id" text NOT NULL,
	"step" integer NOT NULL,
	"group_id" bigint NOT NULL,
	"sample_index" integer NOT NULL,
	"draw_ordinal" bigint NOT NULL,
	"prompt" text NOT NULL,
	"response" text NOT NULL,
	"tokens" integer[] NOT NULL,
	"prompt_length" integer NOT NULL,
	"response_length" integer NOT NULL,
	"loss_mask" smallint[] NOT NULL,
	"rollout_log_probs" real[] NOT NULL,
	"token_versions" integer[] NOT NULL,
	"weight_versions" integer[] NOT NULL,
	"num_segments" integer NOT NULL,
	"status" text NOT NULL,
	"finish_reason" text NOT NULL,
	"reward" double precision,
	"reward_components" jsonb,
	"kept" boolean NOT NULL,
	"outcome" text NOT NULL,
	"outcome_reason" text,
	"trained_step" integer,
	CONSTRAINT "rollout_history_run_id_group_id_sample_index_pk" PRIMARY KEY("run_id","group_id","sample_index")
);
--> statement-breakpoint
CREATE INDEX "decisions_run_group_idx" ON "decisions" USING btree ("run_id","group_id");--> statement-breakpoint
CREATE INDEX "decisions_run_kind_step_idx" ON "decisions" USING btree ("run_id","kind","step");--> statement-breakpoint
CREATE INDEX "drawn_prompts_run_step_idx" ON "drawn_prompts" USING btree ("run_id","step");--> statement-breakpoint
CREATE INDEX "group_rounds_run_step_idx" ON "group_rounds" USING btree ("run_id","step");--> statement-breakpoint
CREATE INDEX "sample_segments_run_step_idx" ON "sample_segments" USING btree ("run_id","step");--> statement-breakpoint
CREATE INDEX "sample_rewards_run_step_idx" ON "sample_rewards" USING btree ("run_id","step");--> statement-breakpoint
CREATE INDEX "rollout_history_run_step_idx" ON "rollout_history" USING btree ("run_id","step");