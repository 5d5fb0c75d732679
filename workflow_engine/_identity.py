"""Step identity: one deterministic name for every step a run takes.

Durable execution rests on naming work the same way every time it is re-executed (DBOS numbers a
workflow's steps, Temporal uses history event ids). Here a step is named by

    superstep / executor / delivery / name

(a ``/`` or ``%`` in the executor id or the delivery written ``%2F`` / ``%25``, so that no two
steps share a name)
* **delivery** -- the id of the message being handled. Every message gets one when it is created,
  derived from where it came from, never from timing or from what else is in flight:
  ``in.<superstep>.<k>`` (the k-th start message added at that superstep),
  ``<superstep>.<k>:<source>>target`` (the k-th send of ``source`` in that superstep's barrier,
  delivered to ``target``), ``r:<request id>`` / ``r:<request id>>target`` (an answer). So a
  superstep re-executed after a crash -- in any process, whatever answers arrived meanwhile --
  hands each executor the same deliveries, and different deliveries, loops and branches never
  share a name.
* **name** -- chosen by the handler (``ctx.run_once(key, ...)``) or numbered by kind in call order
  within one handler invocation (``model#0``, ``tool#1``, ``request#0``).

Journal keys are step keys. Ids that leave the engine (request ids, idempotency keys handed to
tools) are an HMAC of the step key under the run's random ``step_secret``: stable across
re-execution, unique, and not derivable by anyone who does not hold the run's checkpoint.
"""

from __future__ import annotations

import hmac
import os

INPUT_SOURCE = "__input__"


def new_step_secret() -> str:
    """A run's secret for deriving outward-facing ids (128 random bits)."""
    return os.urandom(16).hex()


def input_message_id(superstep: int, index: int) -> str:
    return f"in.{superstep}.{index}"


def is_input_delivery(delivery: str) -> bool:
    """Whether a delivery id names a run's input (sends start with a superstep number,
    answers with ``r:``)."""
    return delivery.startswith("in.")


def send_id(superstep: int, ordinal: int, source_id: str) -> str:
    """The id of the ``ordinal``-th message ``source_id`` sent in ``superstep``."""
    return f"{superstep}.{ordinal}:{source_id}"


def answer_send_id(request_id: str) -> str:
    return f"r:{request_id}"


def delivery_id(send: str, target_id: str) -> str:
    """A send delivered to one target (fan-out delivers one send to several)."""
    return f"{send}>{target_id}"


def step_key(superstep: int, executor_id: str, delivery: str, name: str) -> str:
    """``superstep/executor/delivery/name``, one name for one step: a ``/`` in the executor id
    or the delivery (a source's id) is written ``%2F`` and a ``%`` ``%25`` -- left as they
    were, an executor ``a`` with key ``X/.../K`` and an executor ``a/...`` with key ``K`` were
    one step, the second's effect never run and both handed one idempotency key (outside
    tester 166). Ids without either character read as before."""
    return f"{superstep}/{_part(executor_id)}/{_part(delivery)}/{name}"


def _part(text: str) -> str:
    if "/" in text or "%" in text:
        return text.replace("%", "%25").replace("/", "%2F")
    return text


def derive_id(secret: str, *parts: str) -> str:
    """128 bits of HMAC-SHA256 over ``parts``: deterministic for the run, opaque to others."""
    message = "\x1f".join(parts).encode("utf-8", "surrogatepass")
    return hmac.digest(secret.encode(), message, "sha256")[:16].hex()


def branch_secret(secret: str, given: list[tuple[str, str]]) -> str:
    """The step secret of a branch: a checkpoint continued without a store with what was
    ``given`` to it ((request id, answer digest) in the order the requests were made, then
    ("message", its digest) for a new message).

    Without a store a checkpoint may be continued more than once. Given the same, the
    continuations are one branch re-executed (a retry): the same secret, so the same request
    ids and idempotency keys. Given otherwise, they are different branches whose steps are
    different effects: they shared one key, and an outside service that books each key once
    dropped the second branch's charge (outside testers 178, 179). With a store, history is
    linear (a checkpoint continues once) and the secret is the run's own."""
    return derive_id(secret, "branch", *(f"{what}={digest}" for what, digest in given))


def idempotency_key(secret: str, run_id: str, step: str) -> str:
    """The key a step hands an outside service: ``<run id>:<opaque id of the step>``."""
    return f"{run_id}:{derive_id(secret, 'effect', run_id, step)}"


__all__ = [
    "INPUT_SOURCE",
    "answer_send_id",
    "branch_secret",
    "delivery_id",
    "derive_id",
    "idempotency_key",
    "input_message_id",
    "is_input_delivery",
    "new_step_secret",
    "send_id",
    "step_key",
]
