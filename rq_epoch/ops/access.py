"""Who may see the exporter's page: loopback addresses, and optional HTTP basic authentication.

The page shows job descriptions (which carry the call's arguments) and exception text, so
``rq-epoch exporter`` serves it by default only on a loopback address (:func:`is_loopback`),
and can ask for a user and password (:class:`BasicAuth`). The credentials come from the
environment (:data:`USER_VARIABLE`, :data:`PASSWORD_VARIABLE`) or from a file holding
``user:password`` (:func:`read_credentials_file`), never from the command line, where ``ps``
shows them to every user of the machine. ``/metrics`` never asks: Prometheus' own
``basic_auth`` or a reverse proxy protects it where needed.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigurationError

__all__ = [
    'PASSWORD_VARIABLE',
    'REALM',
    'USER_VARIABLE',
    'BasicAuth',
    'Credentials',
    'credentials_from_environment',
    'is_loopback',
    'read_credentials_file',
]

#: The environment variables that hold the page's user and password.
USER_VARIABLE = 'RQ_EPOCH_PAGE_USER'
PASSWORD_VARIABLE = 'RQ_EPOCH_PAGE_PASSWORD'
#: The realm a browser shows in its login prompt.
REALM = 'rq-epoch'


def is_loopback(host: str) -> bool:
    """True when ``host`` is a loopback address: ``127.0.0.0/8``, ``::1`` (or an IPv4-mapped
    ``::ffff:127.x.y.z``), or the name ``localhost``.

    Anything else is beyond loopback: a wildcard (``0.0.0.0``, ``::``, the empty string), an
    address of an interface, or any other host name (a name is not resolved: in doubt, it is
    treated as reachable from the network).
    """
    name = host.strip().strip('[]')
    if name.lower().rstrip('.') == 'localhost':
        return True
    try:
        address = ipaddress.ip_address(name.split('%', 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


@dataclass(frozen=True)
class Credentials:
    """The one user and password the page accepts."""

    user: str
    password: str = ''

    def __post_init__(self) -> None:
        if not self.user or not self.password:
            raise ConfigurationError('the page needs both a user and a password (neither may be empty)')
        if ':' in self.user:
            raise ConfigurationError('the page user may not contain ":" (HTTP basic authentication splits on it)')

    def __repr__(self) -> str:  # never print the password, in a log or a traceback
        return f'Credentials(user={self.user!r}, password=<hidden>)'


def credentials_from_environment(environ: Mapping[str, str]) -> Credentials | None:
    """The credentials in :data:`USER_VARIABLE` and :data:`PASSWORD_VARIABLE`; None when neither is set.

    Raises:
        ConfigurationError: only one of them is set, or one is empty.
    """
    user, password = environ.get(USER_VARIABLE), environ.get(PASSWORD_VARIABLE)
    if user is None and password is None:
        return None
    if user is None or password is None:
        raise ConfigurationError(f'{USER_VARIABLE} and {PASSWORD_VARIABLE} go together: set both, or neither')
    return Credentials(user, password)


def read_credentials_file(path: str | Path) -> Credentials:
    """The credentials in the file at ``path``: its first line, ``user:password`` (the password
    may contain ``:``; a trailing newline is not part of it).

    Raises:
        ConfigurationError: the file cannot be read, or its first line is not ``user:password``.
    """
    try:
        text = Path(path).read_text(encoding='utf-8')
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f'cannot read the page credentials from {path}: {exc}') from exc
    line = text.splitlines()[0] if text else ''
    user, colon, password = line.partition(':')
    if not colon:
        raise ConfigurationError(f'{path}: the first line must be user:password')
    return Credentials(user, password)


class BasicAuth:
    """HTTP basic authentication (RFC 7617) against one user and password, in constant time."""

    def __init__(self, credentials: Credentials, realm: str = REALM) -> None:
        self.user = credentials.user
        self._user = credentials.user.encode('utf-8')
        self._password = credentials.password.encode('utf-8')
        #: The value of ``WWW-Authenticate`` on a ``401``.
        self.challenge = f'Basic realm="{realm}", charset="UTF-8"'

    def allows(self, authorization: str | None) -> bool:
        """True when the ``Authorization`` header carries this user and password.

        Both the user and the password are compared with :func:`hmac.compare_digest`, and both
        always are, so the time taken says nothing about which part, or how much of it, was right.
        """
        scheme, _, token = (authorization or '').strip().partition(' ')
        if scheme.lower() != 'basic':
            return False
        try:
            decoded = base64.b64decode(token.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        user, colon, password = decoded.partition(b':')
        user_ok = hmac.compare_digest(user, self._user)
        password_ok = hmac.compare_digest(password, self._password)
        return bool(colon) and user_ok and password_ok
