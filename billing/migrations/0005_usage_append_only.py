from django.db import migrations

# Usage records are facts: the database refuses to change or delete one. (TRUNCATE stays
# possible for an operator resetting a development database.)
APPEND_ONLY_SQL = """
CREATE FUNCTION billing_usagerecord_guard() RETURNS trigger AS $$
BEGIN
  RAISE EXCEPTION 'usage records are append-only: % of request % refused', TG_OP, OLD.request_id;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER billing_usagerecord_guard BEFORE UPDATE OR DELETE ON billing_usagerecord
  FOR EACH ROW EXECUTE FUNCTION billing_usagerecord_guard();
"""

APPEND_ONLY_SQL_REVERSE = """
DROP TRIGGER billing_usagerecord_guard ON billing_usagerecord;
DROP FUNCTION billing_usagerecord_guard();
"""


class Migration(migrations.Migration):
    dependencies = [("billing", "0004_budget_alerts")]

    operations = [migrations.RunSQL(APPEND_ONLY_SQL, APPEND_ONLY_SQL_REVERSE)]
