"""Interrupt ids an outsider cannot guess, stable for as long as the request exists.

A request id is derived from the run id and the step (so that re-executing a step finds the same
request), and a thread's run ids are predictable: ``<endpoint>:<thread>/<n>``. An interrupt id
that were the request id could be computed by any web page that knows the thread id. So the
server gives each run it admits a random 128-bit key, stored in the run's shared state (and so in
every checkpoint), and names a request to clients as::

    <request id>.<first 128 bits of HMAC-SHA256(run key, request id)>

The same request always gets the same id (after a restart, after re-execution, in another server
process on the same database), the server finds the request again from the part before the dot,
and only someone who saw the id can send it back.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from workflow_engine import Checkpoint, StoreCorruptError

INTERRUPT_KEY = "agui.interrupt_key"
"""Shared-state key of a run's random 128-bit key (hex), set when the server admits the run."""


def new_interrupt_key() -> str:
    """A run's random key: 128 bits from the OS's CSPRNG."""
    return secrets.token_hex(16)


def interrupt_id_for(request_id: str, key: str | None) -> str:
    """``<request id>.<MAC>``: the MAC (HMAC-SHA256 under the run's key, 128 bits) makes the
    id unguessable; the request id in front lets the server find the request again. A run
    admitted before runs had keys keeps its request ids as interrupt ids."""
    if key is None:
        return request_id
    mac = hmac.new(bytes.fromhex(key), request_id.encode(), hashlib.sha256).hexdigest()
    return f"{request_id}.{mac[:32]}"


def split_interrupt_id(interrupt_id: str) -> str:
    """The request id an interrupt id names (to be verified with :func:`interrupt_id_for`)."""
    request_id, dot, _ = interrupt_id.rpartition(".")
    return request_id if dot else interrupt_id


def run_key(run_id: str, checkpoint: Checkpoint | None) -> str | None:
    """The run's interrupt key from its checkpoint's shared state (None: admitted without)."""
    if checkpoint is None:
        return None
    key = checkpoint.shared_state.get(INTERRUPT_KEY)
    if key is None:
        return None
    if not isinstance(key, str) or len(key) != 32 or not _is_hex(key):
        raise StoreCorruptError(
            f"run {run_id!r}: checkpoint {checkpoint.checkpoint_id} holds a malformed "
            f"{INTERRUPT_KEY!r} (not 128 bits of hex)"
        )
    return key


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def ids_equal(a: str, b: str) -> bool:
    """Constant-time comparison of two ids (any text)."""
    return hmac.compare_digest(
        a.encode("utf-8", "surrogatepass"), b.encode("utf-8", "surrogatepass")
    )
