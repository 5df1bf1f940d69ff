-- Least privilege (docs/security.md). Three roles, cluster-wide as every Postgres role is:
--   rlq_owner    owns the tables; used by `rlq migrate` only (NOLOGIN unless an admin says otherwise)
--   rlq_runtime  rlq's processes: INSERT and SELECT on facts, what projections need on projections
--   rlq_reader   `rlq sql` and the dashboard: SELECT on the documented tables and views, read-only
-- A migrating user that may not create roles (a managed Postgres) needs them made once by an admin:
-- `rlq db admin-sql` prints that script.
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rlq_owner') THEN CREATE ROLE rlq_owner NOLOGIN; END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rlq_runtime') THEN CREATE ROLE rlq_runtime LOGIN; END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rlq_reader') THEN CREATE ROLE rlq_reader LOGIN; END IF;
EXCEPTION WHEN insufficient_privilege THEN
  RAISE EXCEPTION 'rlq migrate: the roles rlq_owner, rlq_runtime and rlq_reader do not exist and % may not create them', current_user
    USING HINT = 'ask an admin to run the script printed by `rlq db admin-sql` once, then run rlq migrate again';
END $$;
--> statement-breakpoint
-- The reader's session defaults (role settings need CREATEROLE; the admin script sets them otherwise).
DO $$
BEGIN
  ALTER ROLE rlq_reader SET default_transaction_read_only = on;
  ALTER ROLE rlq_reader SET statement_timeout = '30s';
  ALTER ROLE rlq_reader SET idle_in_transaction_session_timeout = '60s';
  ALTER ROLE rlq_reader SET lock_timeout = '5s';
EXCEPTION WHEN insufficient_privilege THEN
  RAISE NOTICE 'rlq migrate: % may not set rlq_reader''s defaults; `rlq db admin-sql` prints them', current_user;
END $$;
--> statement-breakpoint
-- The guards live in a schema of their own, owned by the migrating user (a superuser where one
-- migrates), so that neither rlq_owner nor a DROP SCHEMA public CASCADE removes them with the tables.
CREATE SCHEMA rlq_guard;
--> statement-breakpoint
GRANT USAGE ON SCHEMA rlq_guard TO PUBLIC;
--> statement-breakpoint
-- Which tables are facts, by name and by oid (the oid survives a RENAME).
CREATE FUNCTION rlq_guard.fact_names() RETURNS text[] LANGUAGE sql IMMUTABLE AS $$
  SELECT ARRAY['decisions','drawn_prompts','sample_segments','group_rounds','sample_rewards',
               'train_steps','train_metrics','eval_results','eval_samples']
$$;
--> statement-breakpoint
CREATE TABLE rlq_guard.fact_tables (relid oid PRIMARY KEY, name text NOT NULL);
--> statement-breakpoint
REVOKE ALL ON rlq_guard.fact_tables FROM PUBLIC;
--> statement-breakpoint
GRANT SELECT ON rlq_guard.fact_tables TO PUBLIC;
--> statement-breakpoint
INSERT INTO rlq_guard.fact_tables
  SELECT c.oid, c.relname FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relname = ANY (rlq_guard.fact_names())
  ON CONFLICT DO NOTHING;
--> statement-breakpoint
-- `rlq migrate` connects with rlq.migrating=on (store/migrate.ts); nothing else in rlq sets it.
CREATE FUNCTION rlq_guard.is_migrating() RETURNS boolean LANGUAGE sql STABLE AS $$
  SELECT coalesce(current_setting('rlq.migrating', true), '') = 'on'
$$;
--> statement-breakpoint
-- Row triggers do not fire on TRUNCATE: a statement trigger does.
CREATE FUNCTION rlq_guard.forbid_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF rlq_guard.is_migrating() THEN RETURN NULL; END IF;
  RAISE EXCEPTION 'rlq: TRUNCATE of fact table % is forbidden (facts are insert-only; only rlq migrate may)', TG_TABLE_NAME
    USING ERRCODE = 'RLQ03';
END $$;
--> statement-breakpoint
DO $$
DECLARE t text;
BEGIN
  FOREACH t IN ARRAY rlq_guard.fact_names() LOOP
    EXECUTE format('CREATE TRIGGER %I BEFORE TRUNCATE ON %I FOR EACH STATEMENT EXECUTE FUNCTION rlq_guard.forbid_truncate()', t || '_no_truncate', t);
  END LOOP;
END $$;
--> statement-breakpoint
-- DROP, ALTER (which includes DISABLE TRIGGER, RENAME and OWNER TO) and trigger, rule or policy
-- changes on a fact table are refused outside migrations, for every role, owner and superusers too.
CREATE FUNCTION rlq_guard.guard_fact_ddl() RETURNS event_trigger LANGUAGE plpgsql AS $$
DECLARE r record; rel oid;
BEGIN
  IF rlq_guard.is_migrating() THEN RETURN; END IF;
  IF TG_EVENT = 'sql_drop' THEN
    FOR r IN SELECT * FROM pg_event_trigger_dropped_objects() LOOP
      -- objid is the table's for a table or column; address_names is {schema, table, name} for a
      -- table's triggers and constraints.
      IF (r.object_type IN ('table', 'table column') AND r.objid IN (SELECT relid FROM rlq_guard.fact_tables))
         OR (r.object_type IN ('trigger', 'table constraint', 'rule', 'policy') AND r.address_names[1] = 'public'
             AND r.address_names[2] IN (SELECT name FROM rlq_guard.fact_tables)) THEN
        RAISE EXCEPTION 'rlq: % of % (fact table) is forbidden outside rlq migrate', TG_TAG, r.object_identity
          USING ERRCODE = 'RLQ03';
      END IF;
    END LOOP;
  ELSE
    FOR r IN SELECT * FROM pg_event_trigger_ddl_commands() LOOP
      rel := NULL;
      IF r.classid = 'pg_class'::regclass THEN
        rel := r.objid;
      ELSIF r.classid = 'pg_trigger'::regclass THEN
        SELECT g.tgrelid INTO rel FROM pg_trigger g WHERE g.oid = r.objid;
      ELSIF r.classid = 'pg_rewrite'::regclass THEN
        SELECT w.ev_class INTO rel FROM pg_rewrite w WHERE w.oid = r.objid;
      ELSIF r.classid = 'pg_policy'::regclass THEN
        SELECT p.polrelid INTO rel FROM pg_policy p WHERE p.oid = r.objid;
      END IF;
      IF rel IN (SELECT relid FROM rlq_guard.fact_tables) THEN
        RAISE EXCEPTION 'rlq: % on fact table % is forbidden outside rlq migrate', r.command_tag, r.object_identity
          USING ERRCODE = 'RLQ03';
      END IF;
    END LOOP;
  END IF;
END $$;
--> statement-breakpoint
-- Event triggers need a superuser; a managed Postgres gets them from `rlq db admin-sql`.
DO $$
BEGIN
  CREATE EVENT TRIGGER rlq_guard_fact_drop ON sql_drop EXECUTE FUNCTION rlq_guard.guard_fact_ddl();
  CREATE EVENT TRIGGER rlq_guard_fact_alter ON ddl_command_end
    WHEN TAG IN ('ALTER TABLE', 'CREATE TRIGGER', 'ALTER TRIGGER', 'CREATE RULE', 'CREATE POLICY', 'ALTER POLICY')
    EXECUTE FUNCTION rlq_guard.guard_fact_ddl();
EXCEPTION WHEN insufficient_privilege THEN
  RAISE NOTICE 'rlq migrate: % may not create event triggers; `rlq db admin-sql` prints them for an admin', current_user;
END $$;
--> statement-breakpoint
-- Functions every role may call by default that reach past rlq's tables: large objects (server
-- files through lo_import/lo_export, objects created even in a read-only transaction), signalling
-- other sessions, and session advisory locks (a reader holding the lease's or the migration's lock
-- would stall rlq). Revoked from PUBLIC in this database, granted back to rlq_owner and rlq_runtime.
-- pg_catalog belongs to the bootstrap superuser: a managed Postgres gets this from the admin script.
CREATE FUNCTION rlq_guard.restrict_functions() RETURNS void LANGUAGE plpgsql AS $$
DECLARE f text;
BEGIN
  FOR f IN SELECT p.oid::regprocedure::text FROM pg_proc p
           WHERE p.pronamespace = 'pg_catalog'::regnamespace
             AND (p.proname LIKE 'lo\_%' OR p.proname IN ('lowrite', 'loread', 'pg_terminate_backend', 'pg_cancel_backend',
                  'pg_advisory_lock', 'pg_advisory_lock_shared', 'pg_try_advisory_lock', 'pg_try_advisory_lock_shared',
                  'pg_advisory_xact_lock', 'pg_advisory_xact_lock_shared', 'pg_try_advisory_xact_lock',
                  'pg_try_advisory_xact_lock_shared', 'pg_advisory_unlock', 'pg_advisory_unlock_shared', 'pg_advisory_unlock_all',
                  'pg_notify', 'pg_reload_conf', 'pg_rotate_logfile'))
  LOOP
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO rlq_owner, rlq_runtime', f);
  END LOOP;
END $$;
--> statement-breakpoint
DO $$
BEGIN
  PERFORM rlq_guard.restrict_functions();
EXCEPTION WHEN insufficient_privilege THEN
  RAISE NOTICE 'rlq migrate: % may not restrict large-object, signal and advisory-lock functions; `rlq db admin-sql` prints that for an admin', current_user;
END $$;
--> statement-breakpoint
-- Ownership and grants, for every table that exists now. A later migration that adds a table
-- replaces this function's lists and calls it again.
CREATE FUNCTION rlq_apply_privileges() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  t text;
  projections text[] := ARRAY['runs','run_leases','rollout_history','run_requests','engine_metrics'];
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
