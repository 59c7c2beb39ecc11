"""Settings resolved once at the edge: defaults < environment < flags, then passed explicitly."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DB = Path("tracecal.duckdb")
DB_ENV = "TRACECAL_DB"
CACHE_ENV = "TRACECAL_CACHE_DIR"


def resolve_db_path(flag: Path | None) -> Path:
    """The database path: ``--db`` if given, else ``$TRACECAL_DB``, else ``./tracecal.duckdb``."""
    if flag is not None:
        return flag
    env = os.environ.get(DB_ENV)
    return Path(env) if env else DEFAULT_DB


def resolve_cache_dir() -> Path | None:
    """Where tracecal keeps files it can always rebuild (the empty-database template that makes a new
    database a file copy): ``$TRACECAL_CACHE_DIR``, else ``$XDG_CACHE_HOME/tracecal``, else
    ``~/.cache/tracecal``. ``TRACECAL_CACHE_DIR=`` (empty) turns the cache off."""
    env = os.environ.get(CACHE_ENV)
    if env is not None:
        return Path(env) if env else None
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tracecal"


def model_store_dir(db_path: Path) -> Path:
    """Directory of calibrated model artifacts: ``<db stem>.models/`` next to the database."""
    return db_path.with_name(db_path.stem + ".models")


@dataclass(frozen=True)
class Settings:
    """What every command needs to know about where it works."""

    db_path: Path
    cache_dir: Path | None

    @classmethod
    def resolve(cls, db: Path | None = None) -> Settings:
        return cls(db_path=resolve_db_path(db), cache_dir=resolve_cache_dir())
