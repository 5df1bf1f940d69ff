-- Eval results and samples are facts: insert-only, like the others (0001).
DO $$
DECLARE t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['eval_results','eval_samples'] LOOP
    EXECUTE format('REVOKE UPDATE, DELETE, TRUNCATE ON %I FROM PUBLIC', t);
    EXECUTE format('CREATE TRIGGER %I BEFORE UPDATE OR DELETE ON %I FOR EACH ROW EXECUTE FUNCTION rlq_forbid_mutation()', t || '_insert_only', t);
  END LOOP;
END $$;
