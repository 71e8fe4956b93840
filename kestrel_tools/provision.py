"""What existing Postgres and NATS servers need for Kestrel, with fresh passwords.

    python -m kestrel_tools.provision --postgres-host db.internal --nats-host nats.internal \\
        --redis-url redis://redis.internal:6379/0 --out ./kestrel-stores

Writes three files (owner-only) into --out:

- `postgres.sql`: for a superuser, in the `postgres` database: the login roles
  (kestrel_owner owns the tables and only runs migrations; one role per service;
  kestrel_reader), the database owned by kestrel_owner (kestrel.pgroles);
- `nats-users.conf`: an `authorization { users = [...] }` block for nats-server, one
  user per service with the subjects it may use, and `tap` and `admin`
  (kestrel.natsauth); JetStream must be enabled;
- `stores.env`: the KESTREL_* variables the Helm chart's stores Secret holds
  (`kubectl create secret generic kestrel-stores --from-env-file=stores.env`).

Nothing here connects anywhere: it only writes what an operator then applies.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from pathlib import Path
from urllib.parse import quote

from kestrel import natsauth
from kestrel.pgroles import LOGIN_ROLES, OWNER_ROLE, SERVICE_ROLES, provision_roles_sql


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def files(pg_host: str, pg_port: int, database: str, nats_host: str, nats_port: int,
          redis_url: str) -> dict[str, str]:
    """The three files' contents, with new random passwords."""
    pg = {role: secrets.token_hex(16) for role in LOGIN_ROLES}
    nats = {user: secrets.token_hex(16) for user in natsauth.GRANTS}

    def dsn(role: str) -> str:
        return (f"postgresql://{role}:{quote(pg[role], safe='')}@{pg_host}:{pg_port}/"
                f"{database}")

    sql = (provision_roles_sql(pg)
           + f"SELECT 'CREATE DATABASE {database} OWNER {OWNER_ROLE}'\n"
             f"  WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = "
             f"'{database}')\\gexec\n"
           + f"\\connect {database}\nREVOKE CREATE ON SCHEMA public FROM PUBLIC;\n"
             f"ALTER SCHEMA public OWNER TO {OWNER_ROLE};\n")
    config = json.loads(natsauth.server_config("0.0.0.0", nats_port, 8222, "/data", nats))
    users = json.dumps(config["authorization"], indent=2)
    env = {"KESTREL_POSTGRES_OWNER_DSN": dsn(OWNER_ROLE),
           **{f"KESTREL_{svc.upper()}_POSTGRES_DSN": dsn(role)
              for svc, role in SERVICE_ROLES.items()},
           **{f"KESTREL_{svc.upper()}_NATS_URL": natsauth.url(nats_host, nats_port, svc,
                                                              nats[svc])
              for svc in natsauth.SERVICES},
           "KESTREL_REDIS_URL": redis_url}
    return {"postgres.sql": sql,
            "nats-users.conf": f"# nats-server: include this file; JetStream must be on\n"
                               f"authorization {users}\n",
            "stores.env": "".join(f"{k}={v}\n" for k, v in env.items())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kestrel_tools.provision", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--postgres-host", required=True)
    ap.add_argument("--postgres-port", type=int, default=5432)
    ap.add_argument("--database", default="kestrel")
    ap.add_argument("--nats-host", required=True)
    ap.add_argument("--nats-port", type=int, default=4222)
    ap.add_argument("--redis-url", required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not args.database.isidentifier():
        ap.error(f"--database {args.database!r}: letters, digits and _ only")
    args.out.mkdir(parents=True, exist_ok=True)
    made = files(args.postgres_host, args.postgres_port, args.database, args.nats_host,
                 args.nats_port, args.redis_url)
    if taken := [str(args.out / n) for n in made if (args.out / n).exists()]:
        print(f"{', '.join(taken)} exist: nothing written (their passwords may be in use)",
              file=sys.stderr)
        return 1
    for name, text in made.items():
        _write(args.out / name, text)
        print(f"wrote {args.out / name}")
    print(f"then: psql -U postgres -d postgres -f {args.out / 'postgres.sql'}; include "
          f"{args.out / 'nats-users.conf'} in nats-server's configuration; kubectl create "
          f"secret generic kestrel-stores --from-env-file={args.out / 'stores.env'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
