-- queue-ti's queue.delete_reaper_schedule (issue 11): the delete reaper on a cron schedule.
-- delete_reaper_interval (seconds) stays for those who set it; a schedule, when set, wins.
-- Settings gain a third type, 'cron', normalised and checked by _normalize_setting
-- (functions/endpoints.sql), which the maintenance leader reads with cronsim.
ALTER TABLE courier.settings DROP CONSTRAINT settings_value_type_check;
ALTER TABLE courier.settings ADD CONSTRAINT settings_value_type_check
    CHECK (value_type IN ('integer', 'boolean', 'cron'));

-- On an upgrade, the settings trigger still runs the _normalize_setting of the previous
-- release, which knows no cron type: it is off for this INSERT (the function files replace
-- that function once the migrations are done).
DO $$
DECLARE
    v_validating boolean := EXISTS (SELECT 1 FROM pg_trigger
                                    WHERE tgname = 'settings_validate' AND tgrelid = 'courier.settings'::regclass);
BEGIN
    IF v_validating THEN
        ALTER TABLE courier.settings DISABLE TRIGGER settings_validate;
    END IF;
    INSERT INTO courier.settings (name, value, default_value, value_type, min_value, max_value, unit, description)
    VALUES ('delete_reaper_schedule', '', '', 'cron', NULL, NULL, NULL,
            'When the maintenance leader permanently deletes expired pull messages, as a cron schedule '
            '("0 3 * * *": daily at 03:00 UTC; @hourly, @daily, @weekly, @monthly, @yearly); empty: '
            'delete_reaper_interval decides');
    IF v_validating THEN
        ALTER TABLE courier.settings ENABLE TRIGGER settings_validate;
    END IF;
END
$$;
