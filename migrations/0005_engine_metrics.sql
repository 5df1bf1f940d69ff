CREATE TABLE "engine_metrics" (
	"run_id" text NOT NULL,
	"worker" text NOT NULL,
	"snapshot" jsonb NOT NULL,
	"at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "engine_metrics_run_id_worker_pk" PRIMARY KEY("run_id","worker")
);
