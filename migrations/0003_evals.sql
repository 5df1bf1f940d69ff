CREATE TABLE "eval_results" (
	"run_id" text NOT NULL,
	"step" integer NOT NULL,
	"dataset" text NOT NULL,
	"weight_version" integer NOT NULL,
	"num_prompts" integer NOT NULL,
	"num_samples" integer NOT NULL,
	"mean_reward" double precision NOT NULL,
	"pass_at_k" jsonb NOT NULL,
	"truncated_fraction" double precision NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "eval_results_run_id_step_dataset_pk" PRIMARY KEY("run_id","step","dataset")
);
--> statement-breakpoint
CREATE TABLE "eval_samples" (
	"run_id" text NOT NULL,
	"step" integer NOT NULL,
	"dataset" text NOT NULL,
	"prompt_index" integer NOT NULL,
	"sample_index" integer NOT NULL,
	"weight_version" integer NOT NULL,
	"prompt" text NOT NULL,
	"label" text,
	"response" text NOT NULL,
	"tokens" integer[] NOT NULL,
	"finish_reason" text NOT NULL,
	"reward" double precision NOT NULL,
	"reward_components" jsonb NOT NULL,
	CONSTRAINT "eval_samples_run_id_step_dataset_prompt_index_sample_index_pk" PRIMARY KEY("run_id","step","dataset","prompt_index","sample_index")
);
