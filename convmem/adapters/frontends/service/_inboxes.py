"""Where the service may answer: every reply goes to an inbox its requester may listen on, nowhere else.

NATS checks a client's right to publish on a request's subject, not on its
reply subject, and the service answers with its own rights. So the service
decides where a reply may go, by one rule that holds for every request path
(session operations, operator requests, the NATS micro ``$SRV`` verbs and
each replica's status endpoint):

* a request on ``{api_prefix}.v1.{tenant token}.…`` is answered only on
  ``_INBOX_{tenant token}.…``, the inbox of the tenant whose subject it is
  (the subject is what the server let the requester publish on);
* an operator request (``{api_prefix}.ops.…``, ``$SRV.…``) is answered only
  on ``_OPS_INBOX.…`` (`OPERATOR_INBOX`), which no tenant token can name:
  every tenant inbox starts ``_INBOX_``;
* a reply subject that is not one plain token after such a prefix (letters,
  digits, ``_``, ``-``, ``=``; at most `MAX_REPLY` characters) is refused.

Anything else (convmem's own subjects, ``$JS.>``, ``$KV.>``, ``$SRV.>``,
``$SYS.>``, another tenant's inbox or namespace, a malformed subject) is
refused: the request is not run, not answered, counted and logged with its
tenant. convmem's clients pick these inboxes themselves (`reply_inbox`), so
one rule holds with or without credentials, the embedded server included.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from typing import Any

__all__ = [
    "MAX_NAMED_CHARS",
    "MAX_REPLY",
    "OPERATOR",
    "OPERATOR_INBOX",
    "TENANT_INBOX",
    "ReplyGuard",
    "reply_inbox",
    "reply_refusal",
    "requester",
    "tenant_inbox",
]

OPERATOR_INBOX = "_OPS_INBOX"
"""Where operator requests (health, metrics, status, ``$SRV`` discovery) are answered."""
TENANT_INBOX = "_INBOX_"
"""Tenant inboxes are ``_INBOX_{tenant token}``: the token `encode_token` makes of the tenant id."""
OPERATOR = "(operator)"
"""The requester of an operator request, as `requester` names it."""
MAX_REPLY = 256
"""The longest reply subject the service answers on."""
MAX_NAMED_CHARS = 16_384
"""The characters of the requesters `ReplyGuard` counts by name, together (each past them counts under
``"(others)"``): where a client may publish under any tenant token, 1,100 refusals naming made-up
tenants of 1,100 characters grew the names in metrics, status and ``$SRV.STATS`` past max_payload,
so every replica's status failed (a failed health check) and its metrics were too large to send."""

_log = logging.getLogger("convmem.service")

_TAIL = re.compile(r"(?:\.[A-Za-z0-9_=\-]+)+")
_TOKEN = re.compile(r"[A-Za-z0-9_=\-]+")


def tenant_inbox(tenant_token: str) -> str:
    """The inbox prefix of the tenant whose subject token is `tenant_token` (``_INBOX_acme``)."""
    return f"{TENANT_INBOX}{tenant_token}"


_REQUESTERS: dict[tuple[str, str], str | None] = {}
"""`requester` of subjects met already (each request's is asked twice: on receipt and at its answer)."""
_REQUESTERS_LIMIT = 4096


def requester(api_prefix: str, subject: str) -> str | None:
    """Whose request `subject` is: a tenant token, `OPERATOR`, or None (no request of this service).

    A session subject names its tenant as the token after ``v1``; the
    operator subjects are ``{api_prefix}.ops.…`` and the micro verbs ``$SRV.…``.
    """
    try:
        return _REQUESTERS[api_prefix, subject]
    except KeyError:
        pass
    who = _requester(api_prefix, subject)
    if len(_REQUESTERS) >= _REQUESTERS_LIMIT:
        _REQUESTERS.clear()
    _REQUESTERS[api_prefix, subject] = who
    return who


def _requester(api_prefix: str, subject: str) -> str | None:
    if subject.startswith("$SRV."):
        return OPERATOR
    if not subject.startswith(api_prefix + "."):
        return None
    rest = subject[len(api_prefix) + 1 :].split(".")
    if rest[0] == "ops":
        return OPERATOR
    if len(rest) >= 2 and rest[0] == "v1" and _TOKEN.fullmatch(rest[1]):
        return rest[1]
    return None


def reply_inbox(api_prefix: str, subject: str) -> str:
    """The inbox prefix a client must ask for the reply of a request on `subject` on."""
    who = requester(api_prefix, subject)
    if who is None or who == OPERATOR:
        return OPERATOR_INBOX
    return tenant_inbox(who)


def reply_refusal(api_prefix: str, subject: str, reply: str) -> str | None:
    """Why the request on `subject` may not be answered on `reply`; None when it may."""
    who = requester(api_prefix, subject)
    if who is None:
        return f"{subject!r} is no request of this service"
    inbox = OPERATOR_INBOX if who == OPERATOR else tenant_inbox(who)
    if len(reply) > MAX_REPLY:
        return f"the reply subject is {len(reply)} characters, over {MAX_REPLY}"
    if not reply.startswith(inbox) or not _TAIL.fullmatch(reply, len(inbox)):
        return f"the reply subject {reply[:80]!r} is not under {inbox}., the requester's own inbox"
    return None


class ReplyGuard:
    """Applies `reply_refusal` to every request a service receives; counts and logs what it refuses.

    The counts are kept per requester (a tenant token, or `OPERATOR`), for at
    most `max_requesters` of them (the rest add up under ``"(others)"``), so a
    flood of made-up tenant tokens cannot grow them without bound. Each
    requester's refusals are logged at the 1st, 2nd, 4th, 8th, … one: a flood
    leaves a few lines, each with the running count. The names kept are
    bounded in characters too (`MAX_NAMED_CHARS`), so the operator's replies
    that carry them stay far below any max_payload.
    """

    def __init__(
        self, api_prefix: str, *, max_requesters: int = 1024, on_refused: Callable[[], None] | None = None
    ) -> None:
        self.api_prefix = api_prefix
        self._on_refused = on_refused  # told after each refusal is counted (`MemoryService.wait_for`)
        self.max_requesters = max_requesters
        self.refused = 0
        """Requests refused for their reply subject, in all."""
        self._by_requester: dict[str, int] = {}
        self._named_chars = 0  # the characters of the names in `_by_requester`
        self._lock = threading.Lock()

    def allows(self, subject: str, reply: str) -> bool:
        """Whether the request on `subject` may be run and answered on `reply` (counted and logged if not)."""
        problem = reply_refusal(self.api_prefix, subject, reply)
        if problem is None:
            return True
        who = requester(self.api_prefix, subject) or "(unknown)"
        with self._lock:
            self.refused += 1
            if who not in self._by_requester:
                if (
                    len(self._by_requester) >= self.max_requesters
                    or self._named_chars + len(who) > MAX_NAMED_CHARS
                ):
                    who = "(others)"
                if who not in self._by_requester:
                    self._named_chars += len(who)
            count = self._by_requester[who] = self._by_requester.get(who, 0) + 1
        if self._on_refused is not None:
            self._on_refused()
        if count & (count - 1) == 0:
            _log.warning(
                "convmem service: refused a request of %s on %r, not answered (%s); %d refused from it",
                "the operator" if who == OPERATOR else f"tenant {who!r}",
                subject[:120],
                problem,
                count,
            )
        return False

    def snapshot(self) -> dict[str, Any]:
        """The refusals: in all, and by requester."""
        with self._lock:
            return {"refused": self.refused, "by_requester": dict(self._by_requester)}
