"""Credentials given to the platform, masked wherever something is recorded or printed: the one place that
knows what a credential looks like (docs/security.md lists every place one could be written).

A credential reaches a command in the store's address (`postgresql://USER:PASSWORD@HOST/DB`, a storage
URI's `?secret_key=...`) or in the environment (MLFLOW_TRACKING_PASSWORD, PGPASSWORD, AWS_SECRET_ACCESS_KEY,
Ray's token, ...). `mask` replaces each with MASK in any text (a URI, a command line, a message), `masked`
does so in every value of a configuration. A masked address still opens its store: `unmasked` drops the
masked password, and the store's client takes the real one from the environment or a password file
(libpq's PGPASSWORD, PGPASSFILE or ~/.pgpass; MLflow's MLFLOW_TRACKING_USERNAME and _PASSWORD), so the
command a record holds runs again as it is. Here, at the bottom of the packages, so that the command line's
own error lines (cli.entry) mask too.
"""

from __future__ import annotations

import os
import re
from typing import Any

MASK = "***"
# scheme://USER:PASSWORD@HOST: the password is what lies between the first ':' after the user and the '@'
# ('/' and ':' included), unless it is a port and a path (http://HOST:5000/a@b).
_USERINFO = re.compile(r"(?i)([a-z][a-z0-9+.-]*://[^/\s:@'\"]*:)((?!\d+/)[^@\s'\"]+)(@)")
# ?password=..., &secret_access_key=..., &token=...: a query parameter whose name says it is a credential.
_QUERY = re.compile(r"(?i)([?&][\w.-]*(?:password|passwd|secret|token|credential)[\w.-]*=)([^&#\s'\"]+)")
# Environment variables whose value is a credential, by name (MLFLOW_TRACKING_PASSWORD, PGPASSWORD,
# AWS_SECRET_ACCESS_KEY, RAY_AUTH_TOKEN, ...); a value this short would mask ordinary words.
_SECRET_NAME = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|CREDENTIAL|API_KEY")
_NOT_SECRET = re.compile(r"_(PATH|FILE|MODE|DIR)$")  # RAY_AUTH_TOKEN_PATH names where a token is
_SHORTEST = 6
# Where a store's client takes the password of an address that has none (rerun's one line says so).
PASSWORD_SOURCES = {
    "postgresql": ("PGPASSWORD", "PGPASSFILE", "~/.pgpass"),
    "mysql": ("MYSQL_PWD", "~/.my.cnf"),
    "http": ("MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"),
}


def mask(text: str) -> str:
    """`text` with every credential in it masked: a URI's password, a query's secret parameters, and the
    value of every credential the environment holds wherever it appears."""
    text = _USERINFO.sub(rf"\g<1>{MASK}\g<3>", text)
    text = _QUERY.sub(rf"\g<1>{MASK}", text)
    for secret in _environment_secrets():
        text = text.replace(secret, MASK)
    return text


def in_address(text: str) -> bool:
    """Whether `text` (an address) holds a credential of its own: a password or a secret query parameter."""
    return bool(_USERINFO.search(text) or _QUERY.search(text))


def masked(cfg: Any) -> Any:
    """A copy of a configuration (a DictConfig, or plain dicts and lists) with every string value masked."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(cfg, (DictConfig, ListConfig)):
        return OmegaConf.create(masked(OmegaConf.to_container(cfg, resolve=True)))
    if isinstance(cfg, dict):
        return {key: masked(value) for key, value in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [masked(value) for value in cfg]
    return mask(cfg) if isinstance(cfg, str) else cfg


def unmasked(uri: str) -> str:
    """The address a store's client opens for `uri`: a masked password dropped (USER@HOST), so that the
    client takes the real one from the environment or a password file; any other address as it is."""
    return _USERINFO.sub(lambda m: m[0] if m[2] != MASK else m[1][:-1] + m[3], uri)


def missing_password(uri: str) -> str | None:
    """One line when `uri` logs in to a server with a user but neither it nor the environment gives that
    user's password (the server may still let it in: trust, a certificate); None otherwise."""
    from urllib.parse import urlsplit

    parts = urlsplit(unmasked(uri))
    scheme = parts.scheme.split("+")[0].removesuffix("s")
    sources = PASSWORD_SOURCES.get(scheme, ())
    if not parts.username or parts.password or not sources:
        return None
    if any(
        os.environ.get(s) or (s.startswith("~") and os.path.exists(os.path.expanduser(s))) for s in sources
    ):
        return None
    return (
        f"no password for {mask(uri)} in it or the environment ({', '.join(sources)}): connecting without one"
    )


def _environment_secrets() -> list[str]:
    """The values of the environment's credentials, longest first (one may hold another). Read name by name
    from a snapshot of the names: another thread (MLflow's telemetry) may remove a variable meanwhile, which
    os.environ.items() meets as a KeyError."""
    values = {os.environ.get(k, "") for k in list(os.environ) if _is_secret(k)}
    values = {v for v in values if len(v) >= _SHORTEST}
    return sorted(values, key=len, reverse=True)


def _is_secret(name: str) -> bool:
    name = name.upper()
    return bool(_SECRET_NAME.search(name)) and not _NOT_SECRET.search(name)
