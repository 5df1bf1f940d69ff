ALTER TABLE "sample_rewards" ADD COLUMN "teacher_log_probs" real[];--> statement-breakpoint
ALTER TABLE "rollout_history" ADD COLUMN "teacher_log_probs" real[];