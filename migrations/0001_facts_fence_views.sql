-- Fact tables are insert-only. REVOKE covers ordinary roles; the trigger also
-- stops the table owner and superusers, which REVOKE cannot.
CREATE FUNCTION rlq_forbid_mutation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'rlq: % on fact table % is forbidden (facts are insert-only)', TG_OP, TG_TABLE_NAME
    USING ERRCODE = 'RLQ03';
END $$;
--> statement-breakpoint
DO $$
DECLARE t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['decisions','drawn_prompts','sample_segments','group_rounds','sample_rewards','train_steps','train_metrics'] LOOP
    EXECUTE format('REVOKE UPDATE, DELETE, TRUNCATE ON %I FROM PUBLIC', t);
    EXECUTE format('CREATE TRIGGER %I BEFORE UPDATE OR DELETE ON %I FOR EACH ROW EXECUTE FUNCTION rlq_forbid_mutation()', t || '_insert_only', t);
  END LOOP;
END $$;
--> statement-breakpoint
-- The decision fence: a decision must carry the run's current lease epoch and
-- the next gapless sequence number. The share lock on the lease row orders a
-- decision against a concurrent takeover (which updates that row).
CREATE FUNCTION rlq_check_decision() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  current_epoch integer;
  last_seq bigint;
BEGIN
  SELECT epoch INTO current_epoch FROM run_leases WHERE run_id = NEW.run_id FOR SHARE;
  IF current_epoch IS NULL OR NEW.lease_epoch <> current_epoch THEN
    RAISE EXCEPTION 'rlq: stale lease epoch % for run % (current epoch %)', NEW.lease_epoch, NEW.run_id, current_epoch
      USING ERRCODE = 'RLQ01';
  END IF;
  SELECT seq INTO last_seq FROM decisions WHERE run_id = NEW.run_id ORDER BY seq DESC LIMIT 1;
  IF NEW.seq <> coalesce(last_seq + 1, 0) THEN
    RAISE EXCEPTION 'rlq: decision seq % for run % is not the next one (last %)', NEW.seq, NEW.run_id, last_seq
      USING ERRCODE = 'RLQ02';
  END IF;
  RETURN NEW;
END $$;
--> statement-breakpoint
CREATE TRIGGER decisions_fence BEFORE INSERT ON decisions FOR EACH ROW EXECUTE FUNCTION rlq_check_decision();
--> statement-breakpoint
-- prompt_draws: every drawn prompt with its current outcome.
-- pending: drawn, not yet decided (or kept, not yet trained); trained: its
-- group was kept in a step that committed; filtered / buffered / discarded:
-- the latest outcome decision.
CREATE VIEW prompt_draws AS
SELECT d.run_id, d.draw_ordinal, d.draw_ordinal AS group_id, d.epoch, d.dataset_index, d.step,
  d.prompt, d.label,
  CASE
    WHEN o.outcome = 'kept' AND ts.step IS NOT NULL THEN 'trained'
    WHEN o.outcome IN ('filtered', 'buffered', 'discarded') THEN o.outcome
    ELSE 'pending'
  END AS outcome,
  o.step AS outcome_step,
  o.reason AS outcome_reason,
  ts.step AS trained_step
FROM drawn_prompts d
LEFT JOIN LATERAL (
  SELECT x.payload->>'outcome' AS outcome, x.payload->>'reason' AS reason, x.step
  FROM decisions x
  WHERE x.run_id = d.run_id AND x.group_id = d.draw_ordinal AND x.kind = 'group.outcome'
  ORDER BY x.seq DESC LIMIT 1
) o ON true
LEFT JOIN train_steps ts ON ts.run_id = d.run_id AND ts.step = o.step AND o.outcome = 'kept';
--> statement-breakpoint
-- Mean reward of finished samples by the weight version that finished them.
CREATE VIEW reward_by_version AS
SELECT run_id,
  weight_versions[array_length(weight_versions, 1)] AS weight_version,
  count(*) AS samples,
  avg(reward) AS mean_reward,
  count(*) FILTER (WHERE kept) AS kept_samples,
  avg(response_length) AS mean_response_length
FROM rollout_history
WHERE reward IS NOT NULL AND array_length(weight_versions, 1) > 0
GROUP BY 1, 2;
--> statement-breakpoint
-- Staleness of every trained sample: the train step's input version minus the
-- oldest version among its tokens with loss mask 1 (NULL when none is trained).
CREATE VIEW staleness AS
SELECT h.run_id, h.trained_step AS step, h.group_id, h.sample_index, ts.weight_version_in,
  ov.oldest_version,
  ts.weight_version_in - ov.oldest_version AS staleness
FROM rollout_history h
JOIN train_steps ts ON ts.run_id = h.run_id AND ts.step = h.trained_step
LEFT JOIN LATERAL (
  SELECT min(u.v) AS oldest_version FROM unnest(h.token_versions, h.loss_mask) AS u(v, m) WHERE u.m = 1 AND u.v >= 0
) ov ON true;
--> statement-breakpoint
-- Per dataset prompt: how often it was drawn, trained and rewarded.
CREATE VIEW prompt_stats AS
SELECT d.run_id, d.dataset_index,
  count(DISTINCT d.draw_ordinal) AS draws,
  count(h.sample_index) AS samples,
  count(h.sample_index) FILTER (WHERE h.trained_step IS NOT NULL) AS trained_samples,
  avg(h.reward) AS mean_reward,
  max(h.reward) AS max_reward
FROM drawn_prompts d
LEFT JOIN rollout_history h ON h.run_id = d.run_id AND h.group_id = d.draw_ordinal
GROUP BY 1, 2;
