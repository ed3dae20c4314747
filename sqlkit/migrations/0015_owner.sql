-- Courier's objects get an owner of their own: a NOLOGIN role with no superuser or other
-- special attributes. SECURITY DEFINER functions run with their owner's rights, and with
-- the superuser that ran the migrations as owner, a trigger courier_admin attached to a
-- Courier table ran as superuser inside them. functions/roles.sql hands every object in
-- schema courier to this role, in the same transaction that creates it. Roles belong to the
-- whole cluster, so another database may have made it already, possibly at this moment.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'courier_owner') THEN
        BEGIN
            CREATE ROLE courier_owner NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END IF;
END
$$;
