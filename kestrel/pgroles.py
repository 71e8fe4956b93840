"""Postgres roles of Kestrel, and the SQL a superuser runs to provision them.

Who may do what (README, "The ledger and the runway"): the tables belong to
`kestrel_owner`, a login role that is not a superuser and is used only to run
migrations; each service connects as its own role (`kestrel_meter`,
`kestrel_admission`, `kestrel_gateway`, `kestrel_placer`), which is not a
superuser, not a member of the owner, and holds only the grants its component's
migrations give it (`*_roles.sql`): SELECT, INSERT on the tables it writes, UPDATE
only on mutable projections. Operators read through `kestrel_reader` (SELECT only).

No dependencies: kestrel_tools.devstack imports it without asyncpg or NATS.
"""

from __future__ import annotations

OWNER_ROLE = "kestrel_owner"
READER_ROLE = "kestrel_reader"
SERVICE_ROLES = {"meter": "kestrel_meter", "admission": "kestrel_admission",
                 "gateway": "kestrel_gateway", "placer": "kestrel_placer"}
LOGIN_ROLES = (OWNER_ROLE, *SERVICE_ROLES.values(), READER_ROLE)


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def provision_roles_sql(passwords: dict[str, str]) -> str:
    """SQL for a superuser: create or correct the login roles (idempotent).

    `passwords` maps role name to password (a role missing from it keeps its own).
    Every role is NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS, and
    no service role or the reader is a member of the owner. A role that is not a
    superuser can neither SET session_replication_role nor ALTER a table it does not
    own (DISABLE TRIGGER, DROP TRIGGER): those stay with the owner and superusers."""
    out = []
    for role in LOGIN_ROLES:
        out.append(f"""DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {_literal(role)}) THEN
    CREATE ROLE {role};
  END IF;
END $$;""")
        password = f" PASSWORD {_literal(passwords[role])}" if role in passwords else ""
        out.append(f"ALTER ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION "
                   f"NOBYPASSRLS INHERIT{password};")
    for role in (*SERVICE_ROLES.values(), READER_ROLE):
        out.append(f"""DO $$ BEGIN
  IF pg_has_role({_literal(role)}, {_literal(OWNER_ROLE)}, 'MEMBER') THEN
    REVOKE {OWNER_ROLE} FROM {role};
  END IF;
END $$;""")
    return "\n".join(out) + "\n"


def adopt_database_sql(database: str) -> str:
    """SQL for a superuser connected to `database`: make kestrel_owner own it, its
    public schema's tables (their sequences and indexes follow) and functions.

    A database migrated before the roles existed has everything owned by the
    superuser that ran the migrations; adopted, the next migrations (the grants)
    run as the owner. Idempotent."""
    return f"""ALTER DATABASE {database} OWNER TO {OWNER_ROLE};
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
DO $$
DECLARE r record;
BEGIN
  FOR r IN SELECT c.oid::regclass AS name FROM pg_class c
           JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
             AND c.relowner <> {_literal(OWNER_ROLE)}::regrole LOOP
    EXECUTE format('ALTER TABLE %s OWNER TO {OWNER_ROLE}', r.name);
  END LOOP;
  FOR r IN SELECT p.oid::regprocedure AS name FROM pg_proc p
           JOIN pg_namespace n ON n.oid = p.pronamespace
           WHERE n.nspname = 'public' AND p.proowner <> {_literal(OWNER_ROLE)}::regrole LOOP
    EXECUTE format('ALTER FUNCTION %s OWNER TO {OWNER_ROLE}', r.name);
  END LOOP;
END $$;
"""
