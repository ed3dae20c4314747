-- Settings and endpoint management: validated, logged, and callable from any client.
CREATE OR REPLACE FUNCTION courier.get_setting(p_name text) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_value text;
BEGIN
    SELECT value INTO v_value FROM courier.settings WHERE name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION '[courier] unknown setting "%"', p_name
            USING ERRCODE = '42704', HINT = 'List the settings with: SELECT name FROM courier.settings';
    END IF;
    RETURN v_value;
END
$$;

CREATE OR REPLACE FUNCTION courier.set_setting(p_name text, p_value text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_setting courier.settings;
    v_normalized text;
    v_number numeric;
BEGIN
    SELECT * INTO v_setting FROM courier.settings WHERE name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION '[courier] unknown setting "%"', p_name
            USING ERRCODE = '42704', HINT = 'List the settings with: SELECT name FROM courier.settings';
    END IF;
    v_normalized := courier._normalize_setting(v_setting, p_value);
    UPDATE courier.settings SET value = v_normalized, updated_at = now() WHERE name = p_name;
    PERFORM courier._log_event('config.changed', NULL,
        jsonb_build_object('setting', p_name, 'old_value', v_setting.value, 'new_value', v_normalized));
    RETURN v_normalized;
END
$$;

-- Whether p_schedule is a cron schedule of five fields (minute hour day-of-month month
-- day-of-week), each a list of *, n or a-b, optionally /step, in range. Numbers only: the
-- maintenance leader reads it with cronsim, which takes these (and refuses dates that never
-- come, such as 31 February, which it reports).
CREATE OR REPLACE FUNCTION courier._cron_schedule_is_valid(p_schedule text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_fields text[] := string_to_array(p_schedule, ' ');
    v_low integer[] := ARRAY[0, 0, 1, 1, 0];
    v_high integer[] := ARRAY[59, 23, 31, 12, 7];
    v_item text;
    v_part text[];
BEGIN
    IF cardinality(v_fields) IS DISTINCT FROM 5 THEN
        RETURN false;
    END IF;
    FOR i IN 1..5 LOOP
        FOREACH v_item IN ARRAY string_to_array(v_fields[i], ',') LOOP
            -- 1: the start (NULL for *), 3: the end of a range, 5: the step
            v_part := regexp_match(v_item, '^(?:\*|([0-9]{1,2})(-([0-9]{1,2}))?)(/([0-9]{1,2}))?$');
            IF v_part IS NULL
               OR v_part[1]::integer NOT BETWEEN v_low[i] AND v_high[i]
               OR v_part[3]::integer NOT BETWEEN v_part[1]::integer AND v_high[i]
               OR v_part[5]::integer < 1 THEN
                RETURN false;
            END IF;
        END LOOP;
    END LOOP;
    RETURN true;
END
$$;

-- The values one field of a valid cron schedule names: each item *, n or a-b, with an
-- optional /step (n/step runs from n to p_high, as cronsim reads it).
CREATE OR REPLACE FUNCTION courier._cron_field_values(p_field text, p_low integer, p_high integer)
RETURNS integer[]
LANGUAGE sql IMMUTABLE
AS $$
    SELECT array_agg(DISTINCT v ORDER BY v)
    FROM unnest(string_to_array(p_field, ',')) AS item,
         LATERAL regexp_match(item, '^(?:\*|([0-9]{1,2})(-([0-9]{1,2}))?)(/([0-9]{1,2}))?$') AS m,
         LATERAL generate_series(coalesce(m[1]::integer, p_low),
                                 CASE WHEN m[3] IS NOT NULL THEN m[3]::integer
                                      WHEN m[1] IS NULL OR m[5] IS NOT NULL THEN p_high
                                      ELSE m[1]::integer END,
                                 coalesce(m[5]::integer, 1)) AS v
$$;

-- Whether a valid cron schedule names a day that never comes (30 February, 31 April): the
-- leader's cronsim finds no time for it, and the reaper would never run. When the day of
-- month or of week starts with *, both must match (Debian cron, cronsim), so some month the
-- schedule names must have its first day of month; 29 February counts, leap years have it.
-- Otherwise either day matches, and the day of week always comes.
CREATE OR REPLACE FUNCTION courier._cron_day_never_comes(p_schedule text) RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$
    SELECT (left(f[3], 1) = '*' OR left(f[5], 1) = '*')
           AND (SELECT min(d) FROM unnest(courier._cron_field_values(f[3], 1, 31)) d)
               > (SELECT max(CASE WHEN m = 2 THEN 29 WHEN m IN (4, 6, 9, 11) THEN 30 ELSE 31 END)
                  FROM unnest(courier._cron_field_values(f[4], 1, 12)) m)
    FROM string_to_array(p_schedule, ' ') AS f
$$;

-- A cron schedule as stored (single spaces, an @macro spelled out; '' for none), or an error
-- naming p_what: a setting (delete_reaper_schedule) or a schedule's cron.
CREATE OR REPLACE FUNCTION courier._cron_normalize(p_what text, p_value text) RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_normalized text := regexp_replace(trim(coalesce(p_value, '')), '\s+', ' ', 'g');
BEGIN
    v_normalized := CASE lower(v_normalized)
        WHEN '@yearly' THEN '0 0 1 1 *' WHEN '@annually' THEN '0 0 1 1 *' WHEN '@monthly' THEN '0 0 1 * *'
        WHEN '@weekly' THEN '0 0 * * 0' WHEN '@daily' THEN '0 0 * * *' WHEN '@midnight' THEN '0 0 * * *'
        WHEN '@hourly' THEN '0 * * * *' ELSE v_normalized END;
    IF v_normalized <> '' AND NOT courier._cron_schedule_is_valid(v_normalized) THEN
        RAISE EXCEPTION '[courier] % must be a cron schedule, got "%"', p_what, p_value
            USING ERRCODE = '22023', COLUMN = CASE WHEN p_what LIKE 'setting %' THEN 'value' ELSE p_what END,
                  HINT = 'Five fields, minute hour day-of-month month day-of-week, each *, n, a-b or a list '
                         'of them, with an optional /step ("0 3 * * *": daily at 03:00); or @hourly, '
                         '@daily, @weekly, @monthly, @yearly';
    END IF;
    IF v_normalized <> '' AND courier._cron_day_never_comes(v_normalized) THEN
        RAISE EXCEPTION '[courier] % names a day that never comes: "%"', p_what, p_value
            USING ERRCODE = '22023', COLUMN = CASE WHEN p_what LIKE 'setting %' THEN 'value' ELSE p_what END,
                  HINT = 'No month it names has that day of the month (30 February, 31 April); '
                         'choose a day every such month has, or a day of the week';
    END IF;
    RETURN v_normalized;
END
$$;

-- A setting's value as stored ('true'/'false', a whole number in range, or a cron schedule
-- with single spaces and its @macro spelled out), or an error naming the setting: for
-- set_setting() and for plain UPDATEs of courier.settings alike.
CREATE OR REPLACE FUNCTION courier._normalize_setting(p_setting courier.settings, p_value text) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    p_name text := p_setting.name;
    v_setting courier.settings := p_setting;
    v_normalized text;
    v_number numeric;
BEGIN
    IF v_setting.value_type = 'cron' THEN
        v_normalized := courier._cron_normalize('setting ' || p_name, p_value);
    ELSIF v_setting.value_type = 'boolean' THEN
        IF lower(trim(p_value)) IN ('true', 'on', 'yes', '1') THEN
            v_normalized := 'true';
        ELSIF lower(trim(p_value)) IN ('false', 'off', 'no', '0') THEN
            v_normalized := 'false';
        ELSE
            RAISE EXCEPTION '[courier] setting % must be true or false, got "%"', p_name, p_value
                USING ERRCODE = '22023';
        END IF;
    ELSE
        IF p_value IS NULL OR trim(p_value) !~ '^-?[0-9]+$' THEN
            RAISE EXCEPTION '[courier] setting % must be a whole number, got "%"', p_name, p_value
                USING ERRCODE = '22023';
        END IF;
        v_number := trim(p_value)::numeric;
        IF v_number < v_setting.min_value OR v_number > v_setting.max_value THEN
            RAISE EXCEPTION '[courier] setting % = % is out of range', p_name, p_value
                USING ERRCODE = '22023',
                      HINT = format('Allowed range: %s to %s %s', v_setting.min_value, v_setting.max_value,
                                    coalesce(v_setting.unit, ''));
        END IF;
        v_normalized := v_number::bigint::text;
    END IF;
    RETURN v_normalized;
END
$$;

-- Settings changed with a plain UPDATE (or INSERT) get set_setting()'s checks: a value out of
-- range never gets in that way. Only a role that can act as courier_owner (migrations) may
-- change what a setting is: its type, range or default.
CREATE OR REPLACE FUNCTION courier._validate_setting_row() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    IF (TG_OP = 'INSERT' OR (OLD.value_type, OLD.min_value, OLD.max_value, OLD.default_value, OLD.name)
                            IS DISTINCT FROM (NEW.value_type, NEW.min_value, NEW.max_value, NEW.default_value, NEW.name))
       AND NOT pg_has_role(current_user, 'courier_owner', 'USAGE') THEN
        RAISE EXCEPTION '[courier] only migrations add settings or change their type, range or default'
            USING ERRCODE = '42501', HINT = 'Change a setting''s value with courier.set_setting()';
    END IF;
    NEW.value := courier._normalize_setting(NEW, NEW.value);
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER settings_validate BEFORE INSERT OR UPDATE ON courier.settings
    FOR EACH ROW EXECUTE FUNCTION courier._validate_setting_row();

CREATE OR REPLACE FUNCTION courier.validate_retry_policy(p_policy jsonb) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    IF p_policy IS NULL OR jsonb_typeof(p_policy) <> 'object' THEN
        PERFORM courier._raise_invalid('retry_policy must be a JSON object',
            '{"max_retries": 10, "backoff": "exponential"|"linear"|"fixed", "base_delay_seconds": 10, '
            '"max_delay_seconds": 300, "increment_seconds": 30}');
    END IF;
    PERFORM courier._require_keys_within('retry_policy', p_policy,
        ARRAY['max_retries', 'backoff', 'base_delay_seconds', 'max_delay_seconds', 'increment_seconds']);
    IF p_policy ? 'backoff' AND coalesce(p_policy ->> 'backoff', '') <> ALL (ARRAY['exponential', 'linear', 'fixed']) THEN
        PERFORM courier._raise_invalid(format('retry_policy.backoff must be exponential, linear or fixed, got %s',
                                              p_policy -> 'backoff'));
    END IF;
    PERFORM courier._require_integer('retry_policy', p_policy, 'max_retries', 0, 1000);
    PERFORM courier._require_integer('retry_policy', p_policy, 'base_delay_seconds', 1, 3600);
    PERFORM courier._require_integer('retry_policy', p_policy, 'max_delay_seconds', 1, 86400);
    PERFORM courier._require_integer('retry_policy', p_policy, 'increment_seconds', 1, 3600);
    RETURN true;
END
$$;

-- The internal-address policy, the same for every protocol with a URL: a URL whose host is
-- internal by itself (courier._is_internal_host) is refused unless the endpoint says
-- "allow_internal": true or the setting http_allow_internal_urls is on. Names are checked
-- again at delivery, on every address they resolve to.
CREATE OR REPLACE FUNCTION courier._require_external_url(p_what text, p_config jsonb) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    PERFORM courier._require_boolean(p_what, p_config, 'allow_internal');
    IF courier._is_internal_host(courier._url_host(p_config ->> 'url'))
       AND NOT coalesce((p_config -> 'allow_internal')::boolean, false)
       AND NOT courier._setting_bool('http_allow_internal_urls') THEN
        RAISE EXCEPTION '[courier] %.url points at an internal address: "%"', p_what, courier._redact_text(p_config ->> 'url')
            USING ERRCODE = '22023',
                  HINT = 'Loopback, private, link-local and metadata addresses are refused; set "allow_internal": '
                         'true on the endpoint (or the setting http_allow_internal_urls) for a trusted internal service';
    END IF;
END
$$;

-- A config value the HTTP dispatcher sends as a header's value (a bearer token, a CloudEvents
-- attribute): absent, or a non-empty string with no control character (but tab) and no DEL,
-- which its client would refuse for every message. p_field names it in the error's COLUMN.
CREATE OR REPLACE FUNCTION courier._require_header_value(p_field text, p_value jsonb) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    IF p_value IS NULL THEN
        RETURN;
    END IF;
    IF jsonb_typeof(p_value) <> 'string' OR p_value #>> '{}' = '' THEN
        RAISE EXCEPTION '[courier] http % must be a non-empty string', p_field
            USING ERRCODE = '22023', COLUMN = p_field;
    END IF;
    IF p_value #>> '{}' ~ '[\x01-\x08\x0a-\x1f\x7f]' THEN
        RAISE EXCEPTION '[courier] http % has a control character in its value (U+%)', p_field,
                lpad(upper(to_hex(ascii(substring(p_value #>> '{}' FROM '[\x01-\x08\x0a-\x1f\x7f]')))), 4, '0')
            USING ERRCODE = '22023', COLUMN = p_field,
                  HINT = 'It is sent as an HTTP header value, which cannot hold control characters but tab';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION courier.validate_endpoint_config(p_protocol text, p_config jsonb) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    -- Push endpoints also take a TTL and a depth limit (enforced at send); the pull-only keys
    -- are refused on them by name below, with what to use instead.
    v_common text[] := ARRAY['rate_limit', 'auto_disable_on_gone', 'concurrency', 'message_ttl_seconds', 'max_depth',
                             'delay_seconds'];
    v_what text := coalesce(p_protocol, '?') || ' config';
BEGIN
    IF p_config IS NULL OR jsonb_typeof(p_config) <> 'object' THEN
        PERFORM courier._raise_invalid('endpoint config must be a JSON object');
    END IF;
    IF p_protocol IS DISTINCT FROM 'pull' THEN
        IF p_config ? 'max_retries' THEN
            PERFORM courier._raise_invalid(format('%s: max_retries of a push endpoint is set in its retry policy', v_what),
                                           'Use retry_policy {"max_retries": N} (`courier endpoint create --retry-policy`)');
        END IF;
        IF p_config ? 'throughput_limit' THEN
            PERFORM courier._raise_invalid(format('%s: throughput_limit applies to pull topics; a push endpoint is limited by rate_limit', v_what),
                                           'Use "rate_limit": {"rate": per-second, "burst": tokens}');
        END IF;
        IF p_config ? 'visibility_timeout' THEN
            PERFORM courier._raise_invalid(format('%s: visibility_timeout applies to pull topics only', v_what));
        END IF;
    END IF;

    CASE p_protocol
    WHEN 'http' THEN
        PERFORM courier._require_keys_within(v_what, p_config, v_common || ARRAY[
            'url', 'method', 'headers', 'timeout', 'connect_timeout', 'auth', 'signing', 'cloudevents',
            'allow_internal', 'capture_response', 'snooze_statuses']);
        PERFORM courier._require_url(v_what, p_config, 'url', ARRAY['http', 'https']);
        -- Statuses that, with a Retry-After, snooze a message rather than fail it (issue 42).
        IF p_config ? 'snooze_statuses' AND (jsonb_typeof(p_config -> 'snooze_statuses') <> 'array'
           OR EXISTS (SELECT FROM jsonb_array_elements(p_config -> 'snooze_statuses') AS s(status)
                      WHERE jsonb_typeof(s.status) <> 'number' OR s.status::text !~ '^[0-9]+$'
                         OR s.status::text::integer NOT BETWEEN 200 AND 599)) THEN
            PERFORM courier._raise_invalid(format('http config.snooze_statuses must be an array of HTTP statuses '
                                                  '(200 to 599), got %s', p_config -> 'snooze_statuses'),
                                           'e.g. [202, 429]: with a Retry-After, the message is due again then, no attempt counted');
        END IF;
        IF p_config ? 'method' AND upper(p_config ->> 'method') <> ALL (ARRAY['POST', 'PUT', 'PATCH', 'GET', 'DELETE']) THEN
            PERFORM courier._raise_invalid(format('http config.method must be POST, PUT, PATCH, GET or DELETE, got %s',
                                                  p_config -> 'method'));
        END IF;
        IF p_config ? 'headers' AND jsonb_typeof(p_config -> 'headers') <> 'object' THEN
            PERFORM courier._raise_invalid('http config.headers must be a JSON object of strings');
        ELSIF p_config ? 'headers' THEN
            PERFORM courier._check_headers(p_config -> 'headers', 'config.headers');
        END IF;
        PERFORM courier._require_boolean(v_what, p_config, 'capture_response');
        IF p_config ? 'method' AND jsonb_typeof(p_config -> 'method') <> 'string' THEN
            PERFORM courier._raise_invalid(format('http config.method must be a string, got %s', p_config -> 'method'));
        END IF;
        PERFORM courier._require_positive_number(v_what, p_config, 'timeout', 0.001, 300);
        PERFORM courier._require_positive_number(v_what, p_config, 'connect_timeout', 0.001, 300);
        IF p_config ? 'auth' THEN
            IF jsonb_typeof(p_config -> 'auth') <> 'object'
               OR coalesce(p_config #>> '{auth,type}', '') <> ALL (ARRAY['basic', 'bearer']) THEN
                PERFORM courier._raise_invalid('http config.auth must be {"type": "basic", "username", "password"} '
                                               'or {"type": "bearer", "token"}');
            END IF;
            IF p_config #>> '{auth,type}' = 'basic' THEN
                PERFORM courier._require_string('http config.auth', p_config -> 'auth', 'username', true);
                PERFORM courier._require_string('http config.auth', p_config -> 'auth', 'password', true);
            ELSE
                PERFORM courier._require_string('http config.auth', p_config -> 'auth', 'token', true);
                -- Sent as the Authorization header's value.
                PERFORM courier._require_header_value('config.auth.token', p_config -> 'auth' -> 'token');
            END IF;
        END IF;
        -- One source of credentials: the HTTP client refuses a request that carries an
        -- Authorization header beside basic auth or a user and password in the URL, so every
        -- message of such an endpoint failed (issue 41), and a bearer token beside the header
        -- silently replaced one of them.
        IF (EXISTS (SELECT FROM jsonb_object_keys(coalesce(p_config -> 'headers', '{}')) h
                    WHERE lower(h) = 'authorization'))::integer
           + (p_config ? 'auth')::integer
           + (coalesce(p_config ->> 'url', '') ~* '^[a-z][a-z0-9+.-]*://[^/?#]*@')::integer > 1 THEN
            PERFORM courier._raise_invalid('http config gives credentials twice: use one of config.auth, an '
                                           'Authorization header in config.headers, or a user and password in '
                                           'config.url', 'With more than one, the HTTP client refuses the request '
                                           'or one silently replaces the other');
        END IF;
        IF p_config ? 'signing' THEN
            IF jsonb_typeof(p_config -> 'signing') <> 'object' THEN
                PERFORM courier._raise_invalid('http config.signing must be {"secret": "whsec_..."}');
            END IF;
            PERFORM courier._require_string('http config.signing', p_config -> 'signing', 'secret', true);
            -- Standard Webhooks: the key is the base64 after whsec_ (any other secret is the key
            -- as it is). The dispatcher decodes it for every message, and a secret it could not
            -- decode dead-lettered each one (issue 40); strict base64, so that no character is
            -- dropped silently from the key either (Python's lenient decoding skips "-" and "_").
            IF p_config #>> '{signing,secret}' LIKE 'whsec\_%'
               AND substr(p_config #>> '{signing,secret}', 7)
                   !~ '^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{4}|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{2}==)$' THEN
                RAISE EXCEPTION '[courier] http config.signing.secret is not valid base64 after "whsec_"'
                    USING ERRCODE = '22023', COLUMN = 'config.signing.secret',
                          HINT = 'A Standard Webhooks secret is "whsec_" and the key''s standard base64 '
                                 '(A-Z, a-z, 0-9, +, /, = padding), e.g. whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
            END IF;
        END IF;
        IF p_config ? 'cloudevents' THEN
            IF jsonb_typeof(p_config -> 'cloudevents') <> 'object'
               OR coalesce(p_config #>> '{cloudevents,mode}', '') <> ALL (ARRAY['binary', 'structured']) THEN
                PERFORM courier._raise_invalid('http config.cloudevents must be {"mode": "binary"|"structured", '
                                               '"type": "...", "source": "..."}');
            END IF;
            -- In binary mode each is sent as a ce-* header's value.
            PERFORM courier._require_header_value('config.cloudevents.type', p_config -> 'cloudevents' -> 'type');
            PERFORM courier._require_header_value('config.cloudevents.source', p_config -> 'cloudevents' -> 'source');
        END IF;
    WHEN 'redis' THEN
        PERFORM courier._require_keys_within(v_what, p_config, v_common || ARRAY[
            'url', 'stream', 'maxlen', 'timeout', 'allow_internal']);
        PERFORM courier._require_url(v_what, p_config, 'url', ARRAY['redis', 'rediss']);
        PERFORM courier._require_string(v_what, p_config, 'stream', true);
        PERFORM courier._require_integer(v_what, p_config, 'maxlen', 1, 9223372036854775807);
    WHEN 'amqp' THEN
        PERFORM courier._require_keys_within(v_what, p_config, v_common || ARRAY[
            'url', 'exchange', 'routing_key', 'persistent', 'timeout', 'allow_internal']);
        PERFORM courier._require_url(v_what, p_config, 'url', ARRAY['amqp', 'amqps']);
        PERFORM courier._require_string(v_what, p_config, 'routing_key', true);
        PERFORM courier._require_string(v_what, p_config, 'exchange', false);
        PERFORM courier._require_boolean(v_what, p_config, 'persistent');
    WHEN 'mqtt' THEN
        PERFORM courier._require_keys_within(v_what, p_config, v_common || ARRAY[
            'url', 'topic', 'qos', 'retain', 'timeout', 'allow_internal']);
        PERFORM courier._require_url(v_what, p_config, 'url', ARRAY['mqtt', 'mqtts']);
        PERFORM courier._require_string(v_what, p_config, 'topic', true);
        PERFORM courier._require_integer(v_what, p_config, 'qos', 0, 2);
        PERFORM courier._require_boolean(v_what, p_config, 'retain');
    WHEN 'nats' THEN
        PERFORM courier._require_keys_within(v_what, p_config, v_common || ARRAY[
            'url', 'subject', 'jetstream', 'timeout', 'allow_internal']);
        PERFORM courier._require_url(v_what, p_config, 'url', ARRAY['nats', 'tls']);
        PERFORM courier._require_string(v_what, p_config, 'subject', true);
        PERFORM courier._require_boolean(v_what, p_config, 'jetstream');
    WHEN 'kafka' THEN
        -- No worker can deliver to Kafka yet: refuse the endpoint rather than accept
        -- messages that would stay pending forever.
        RAISE EXCEPTION '[courier] kafka endpoints are not supported yet: no dispatcher delivers to Kafka'
            USING ERRCODE = '0A000',
                  HINT = 'Use redis, amqp, mqtt, nats or http; Kafka delivery is planned';
    WHEN 'noop' THEN
        PERFORM courier._require_keys_within(v_what, p_config, v_common);
    WHEN 'pull' THEN
        -- A JSON null means "the global default", as a missing key does (queue-ti).
        PERFORM courier._require_keys_within(v_what, p_config, ARRAY[
            'max_retries', 'message_ttl_seconds', 'max_depth', 'throughput_limit', 'visibility_timeout',
            'dlq_threshold', 'delay_seconds']);
        PERFORM courier._require_integer(v_what, jsonb_strip_nulls(p_config), 'max_retries', 0, 1000);
        PERFORM courier._require_integer(v_what, jsonb_strip_nulls(p_config), 'dlq_threshold', 0, 1000);
        PERFORM courier._require_positive_number(v_what, jsonb_strip_nulls(p_config), 'throughput_limit', 0, 1000000);
        PERFORM courier._require_integer(v_what, jsonb_strip_nulls(p_config), 'visibility_timeout', 1, 43200);
    ELSE
        PERFORM courier._raise_invalid(format('unknown protocol %L', p_protocol),
                                       'Protocols: http, redis, amqp, mqtt, nats, noop, pull');
    END CASE;
    PERFORM courier._require_integer(v_what, jsonb_strip_nulls(p_config), 'message_ttl_seconds', 0, 31536000);
    PERFORM courier._require_integer(v_what, jsonb_strip_nulls(p_config), 'max_depth', 0, 2147483647);
    -- SQS delay queues: every send, enqueue and publish to the endpoint that gives no time of
    -- its own is due this many seconds later (0 or absent: at once). SQS's bound, 15 minutes.
    IF p_config ? 'delay_seconds' AND jsonb_typeof(p_config -> 'delay_seconds') <> 'null'
       AND (jsonb_typeof(p_config -> 'delay_seconds') <> 'number' OR (p_config ->> 'delay_seconds') !~ '^[0-9]{1,4}$'
            OR (p_config ->> 'delay_seconds')::integer > 900) THEN
        RAISE EXCEPTION '[courier] %.delay_seconds must be a whole number from 0 to 900, got %', v_what,
                p_config -> 'delay_seconds'
            USING ERRCODE = '22023', COLUMN = 'delay_seconds',
                  HINT = 'Seconds each message waits before it is due (SQS delay queues allow up to 15 minutes)';
    END IF;
    IF p_protocol IN ('redis', 'amqp', 'mqtt', 'nats') THEN
        -- Seconds a broker dispatcher waits to connect and for a batch's acknowledgements.
        PERFORM courier._require_positive_number(v_what, p_config, 'timeout', 0.001, 300);
    END IF;
    IF p_protocol IN ('http', 'redis', 'amqp', 'mqtt', 'nats') THEN
        PERFORM courier._require_external_url(v_what, p_config);
    END IF;

    IF p_config ? 'rate_limit' THEN
        IF jsonb_typeof(p_config -> 'rate_limit') <> 'object' THEN
            PERFORM courier._raise_invalid('rate_limit must be {"rate": per-second, "burst": tokens}');
        END IF;
        PERFORM courier._require_keys_within('rate_limit', p_config -> 'rate_limit', ARRAY['rate', 'burst']);
        PERFORM courier._require_positive_number('rate_limit', p_config -> 'rate_limit', 'rate', 0.001, 1000000);
        PERFORM courier._require_positive_number('rate_limit', p_config -> 'rate_limit', 'burst', 1, 1000000);
    END IF;
    PERFORM courier._require_integer(v_what, p_config, 'concurrency', 1, 10000);
    PERFORM courier._require_boolean(v_what, p_config, 'auto_disable_on_gone');
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION courier._endpoint_by_name(p_name text) RETURNS courier.endpoints
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_endpoint courier.endpoints;
BEGIN
    SELECT * INTO v_endpoint FROM courier.endpoints WHERE name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION '[courier] endpoint "%" does not exist', p_name
            USING ERRCODE = 'P0002', HINT = 'List endpoints with `courier endpoint list` (SELECT name FROM courier.endpoints)';
    END IF;
    RETURN v_endpoint;
END
$$;

CREATE OR REPLACE FUNCTION courier.create_endpoint(p_name text, p_protocol text, p_config jsonb DEFAULT '{}',
                                        p_retry_policy jsonb DEFAULT '{}', p_description text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_id integer;
BEGIN
    PERFORM courier._validate_endpoint_name(p_name);
    PERFORM courier.validate_endpoint_config(p_protocol, p_config);
    PERFORM courier.validate_retry_policy(coalesce(p_retry_policy, '{}'));

    INSERT INTO courier.endpoints (name, protocol, config, retry_policy, description)
    VALUES (p_name, p_protocol, p_config, coalesce(p_retry_policy, '{}'), p_description)
    ON CONFLICT (name) DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        RAISE EXCEPTION '[courier] endpoint "%" already exists', p_name
            USING ERRCODE = '42710', HINT = 'Change it with alter_endpoint(), or drop it first';
    END IF;
    PERFORM courier._log_event('endpoint.created', v_id,
        jsonb_build_object('name', p_name, 'protocol', p_protocol, 'config', p_config,
                           'retry_policy', coalesce(p_retry_policy, '{}')));
    RETURN v_id;
END
$$;

CREATE OR REPLACE FUNCTION courier.alter_endpoint(p_name text, p_config jsonb DEFAULT NULL,
                                       p_retry_policy jsonb DEFAULT NULL, p_description text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_endpoint courier.endpoints := courier._endpoint_by_name(p_name);
BEGIN
    IF p_config IS NOT NULL THEN
        PERFORM courier.validate_endpoint_config(v_endpoint.protocol, p_config);
    END IF;
    IF p_retry_policy IS NOT NULL THEN
        PERFORM courier.validate_retry_policy(p_retry_policy);
    END IF;
    UPDATE courier.endpoints
    SET config = coalesce(p_config, config),
        retry_policy = coalesce(p_retry_policy, retry_policy),
        description = coalesce(p_description, description),
        updated_at = now()
    WHERE id = v_endpoint.id;
    PERFORM courier._log_event('endpoint.altered', v_endpoint.id,
        jsonb_strip_nulls(jsonb_build_object('name', p_name, 'config', p_config,
                                             'retry_policy', p_retry_policy, 'description', p_description)));
    RETURN true;
END
$$;

-- Changes some of a pull topic's limits (queue-ti's topic configs: max_retries,
-- message_ttl_seconds, max_depth, throughput_limit, dlq_threshold, visibility_timeout): each key
-- of p_changes is set, and a key whose value is JSON null reverts to the global default. The
-- rest of the config stays. Returns the topic's config as it is now (its overrides only).
CREATE OR REPLACE FUNCTION courier.alter_topic(p_topic text, p_changes jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_topic courier.endpoints := courier._pull_topic(p_topic);
    v_config jsonb;
BEGIN
    IF jsonb_typeof(p_changes) IS DISTINCT FROM 'object' THEN
        PERFORM courier._raise_invalid('the changes must be a JSON object of limits, e.g. {"max_depth": 1000}',
                                       'A null value reverts a limit to the global default');
    END IF;
    SELECT * INTO v_topic FROM courier.endpoints WHERE id = v_topic.id FOR UPDATE;
    v_config := jsonb_strip_nulls(v_topic.config || p_changes);
    PERFORM courier.validate_endpoint_config('pull', v_config);
    UPDATE courier.endpoints SET config = v_config, updated_at = now() WHERE id = v_topic.id;
    PERFORM courier._log_event('endpoint.altered', v_topic.id,
                               jsonb_build_object('name', p_topic, 'config', v_config, 'changes', p_changes));
    RETURN v_config;
END
$$;

CREATE OR REPLACE FUNCTION courier._set_endpoint_enabled(p_name text, p_enabled boolean) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_endpoint courier.endpoints := courier._endpoint_by_name(p_name);
BEGIN
    IF v_endpoint.enabled = p_enabled THEN
        RETURN false;
    END IF;
    UPDATE courier.endpoints SET enabled = p_enabled, updated_at = now() WHERE id = v_endpoint.id;
    PERFORM courier._log_event(CASE WHEN p_enabled THEN 'endpoint.enabled' ELSE 'endpoint.disabled' END,
                               v_endpoint.id, jsonb_build_object('name', p_name));
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION courier.enable_endpoint(p_name text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$ SELECT courier._set_endpoint_enabled(p_name, true) $$;

CREATE OR REPLACE FUNCTION courier.disable_endpoint(p_name text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$ SELECT courier._set_endpoint_enabled(p_name, false) $$;

-- Issue 42, item 6: a pause that keeps accepting (River's pause). A paused endpoint or pull
-- topic takes sends, batches, enqueues and publishes as ever (max_depth still refuses past
-- its limit), while no worker claims its messages and dequeue and receive hand out none; what
-- is already claimed or leased finishes normally. Disable, by contrast, also refuses sends.
-- Idempotent: true when the call changed the state.
CREATE OR REPLACE FUNCTION courier._set_endpoint_paused(p_name text, p_paused boolean) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_endpoint courier.endpoints := courier._endpoint_by_name(p_name);
BEGIN
    UPDATE courier.endpoints SET paused_at = CASE WHEN p_paused THEN now() END, updated_at = now()
    WHERE id = v_endpoint.id AND (paused_at IS NULL) = p_paused;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM courier._log_event(CASE WHEN p_paused THEN 'endpoint.paused' ELSE 'endpoint.resumed' END,
                               v_endpoint.id, jsonb_build_object('name', p_name));
    IF NOT p_paused THEN
        -- Wake the workers and consumers waiting on it, as a send would.
        PERFORM pg_notify('courier_new_msg', v_endpoint.id::text);
    END IF;
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION courier.pause_endpoint(p_name text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$ SELECT courier._set_endpoint_paused(p_name, true) $$;

CREATE OR REPLACE FUNCTION courier.resume_endpoint(p_name text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$ SELECT courier._set_endpoint_paused(p_name, false) $$;

-- Refuses while the endpoint has active messages, unless p_force, which deletes them too.
CREATE OR REPLACE FUNCTION courier.drop_endpoint(p_name text, p_force boolean DEFAULT false) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_endpoint courier.endpoints;
    v_active bigint;
    v_deleted bigint;
    v_lock_timeout text := current_setting('lock_timeout');
BEGIN
    -- Wait for sends under way to this endpoint to commit (see _hold_endpoint_for_send), so
    -- that their messages are counted and deleted here rather than orphaned. For a while
    -- only: any database user can take this advisory key, and a session holding it must not
    -- hang the drop for good (issue 23); the error names it.
    IF current_setting('lock_timeout') = '0' THEN
        PERFORM set_config('lock_timeout', '10s', true);
    END IF;
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtext('courier.endpoint'), hashtext(p_name));
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION '[courier] endpoint "%" is held by session(s) %, which have not committed', p_name,
            (SELECT string_agg(DISTINCT l.pid::text, ', ') FROM pg_locks l
             WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database
                                                                          WHERE datname = current_database())
               AND l.classid = hashtext('courier.endpoint')::oid AND l.objid = hashtext(p_name)::oid
               AND l.objsubid = 2)
            USING ERRCODE = '55P03',
                  HINT = 'A send holds it until its transaction ends; end a session that holds it longer '
                         '(pg_terminate_backend) and drop again';
    END;
    PERFORM set_config('lock_timeout', v_lock_timeout, true);
    v_endpoint := courier._endpoint_by_name(p_name);
    PERFORM 1 FROM courier.endpoints WHERE id = v_endpoint.id FOR UPDATE;
    PERFORM courier._unstage();  -- its staged sends (migration 0054) count as active
    SELECT coalesce(sum(messages), 0) INTO v_active FROM courier.queue_depth
    WHERE endpoint_id = v_endpoint.id AND status IN ('pending', 'processing');
    IF v_active > 0 AND NOT p_force THEN
        RAISE EXCEPTION '[courier] endpoint "%" still has % active message(s)', p_name, v_active
            USING ERRCODE = '55006',
                  HINT = 'Wait for them to drain, or force the drop to delete them (`courier endpoint drop --force`, p_force := true)';
    END IF;
    DELETE FROM courier.queue WHERE endpoint_id = v_endpoint.id;
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    DELETE FROM courier.endpoints WHERE id = v_endpoint.id;
    DELETE FROM courier.queue_depth WHERE endpoint_id = v_endpoint.id;
    PERFORM courier._log_event('endpoint.dropped', v_endpoint.id,
        jsonb_build_object('name', p_name, 'deleted_messages', v_deleted));
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION courier.reset_circuit_breaker(p_endpoint_name text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_endpoint courier.endpoints := courier._endpoint_by_name(p_endpoint_name);
BEGIN
    PERFORM 1 FROM courier.endpoints WHERE id = v_endpoint.id FOR NO KEY UPDATE;  -- as the breaker does
    UPDATE courier.endpoints
    SET circuit_state = 'closed', circuit_failure_count = 0, circuit_opened_at = NULL,
        circuit_half_open_at = NULL, updated_at = now()
    WHERE id = v_endpoint.id;
    PERFORM courier._log_event('circuit.reset', v_endpoint.id,
        jsonb_build_object('name', p_endpoint_name, 'previous_state', v_endpoint.circuit_state));
    RETURN true;
END
$$;

-- The endpoint, held (KEY SHARE) until the caller commits: callers enqueue for it (replays),
-- and a drop_endpoint, which locks the row FOR UPDATE, must wait and see those messages
-- rather than leave them behind without an endpoint.
CREATE OR REPLACE FUNCTION courier._require_endpoint(p_endpoint_id integer) RETURNS courier.endpoints
LANGUAGE plpgsql
AS $$
DECLARE
    v_endpoint courier.endpoints;
BEGIN
    SELECT * INTO v_endpoint FROM courier.endpoints WHERE id = p_endpoint_id FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION '[courier] endpoint id % does not exist', coalesce(p_endpoint_id::text, 'NULL')
            USING ERRCODE = 'P0002', HINT = 'Recreate the endpoint, or list them with `courier endpoint list`';
    END IF;
    RETURN v_endpoint;
END
$$;

-- Operators change endpoints with plain UPDATEs too (ulak's own retry-policy example does),
-- and a policy or config that the API would refuse must not get in that way: one bad
-- retry_policy would make every outcome report that touches the endpoint fail.
CREATE OR REPLACE FUNCTION courier._validate_endpoint_row() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    PERFORM courier._validate_endpoint_name(NEW.name);
    PERFORM courier.validate_endpoint_config(NEW.protocol, NEW.config);
    PERFORM courier.validate_retry_policy(NEW.retry_policy);
    RETURN NEW;
END
$$;

-- The name rules of create_endpoint(), for it and for plain INSERTs and UPDATEs alike.
CREATE OR REPLACE FUNCTION courier._validate_endpoint_name(p_name text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    IF p_name IS NULL OR p_name !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$' THEN
        PERFORM courier._raise_invalid(format('invalid endpoint name %L', p_name),
            'Use 1-128 letters, digits, "_", ".", ":" or "-", starting with a letter or digit');
    END IF;
    IF p_name LIKE '%.dlq' THEN
        PERFORM courier._raise_invalid(format('endpoint names ending in ".dlq" are reserved: %L', p_name));
    END IF;
END
$$;

CREATE OR REPLACE TRIGGER endpoints_validate_insert BEFORE INSERT ON courier.endpoints
    FOR EACH ROW EXECUTE FUNCTION courier._validate_endpoint_row();

CREATE OR REPLACE TRIGGER endpoints_validate_update BEFORE UPDATE OF name, protocol, config, retry_policy
    ON courier.endpoints
    FOR EACH ROW
    WHEN (OLD.name IS DISTINCT FROM NEW.name OR OLD.protocol IS DISTINCT FROM NEW.protocol
          OR OLD.config IS DISTINCT FROM NEW.config OR OLD.retry_policy IS DISTINCT FROM NEW.retry_policy)
    EXECUTE FUNCTION courier._validate_endpoint_row();
