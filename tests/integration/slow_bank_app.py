"""An application mounting the AG-UI endpoint on a bank agent whose approved ``transfer`` takes
1.5 s and writes ``start``/``done`` lines to a ledger file: ``python slow_bank_app.py DB LEDGER
PORT`` serves it on 127.0.0.1:PORT until stopped (the graceful-stop test)."""

from __future__ import annotations

import sys

import anyio
import uvicorn
from fastapi import FastAPI

from workflow_engine.executors import Agent, Rule, ScriptedChatClient, ToolCall, tool
from workflow_engine.storage import SqliteStore
from workflow_engine_agui import add_agui_endpoint


def build_app(db: str, ledger: str) -> FastAPI:
    @tool(approval_mode="always_require")
    async def transfer(amount: float, idempotency_key: str) -> str:
        """Move money."""
        with open(ledger, "a") as f:
            f.write("start\n")
        await anyio.sleep(1.5)
        with open(ledger, "a") as f:
            f.write("done\n")
        return f"moved {amount}"

    move = Rule(
        user=r"move (?P<n>\d+)", reply="Approve?", calls=[ToolCall("transfer", {"amount": "{n}"})]
    )
    client = ScriptedChatClient([move, Rule(after_tool="transfer", reply="Done: {result}")])
    app = FastAPI()
    bank = Agent("bank", "You move money.", client, [transfer])
    add_agui_endpoint(app, bank, "/bank", store=SqliteStore(db))
    return app


if __name__ == "__main__":
    db, ledger, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    uvicorn.run(build_app(db, ledger), host="127.0.0.1", port=port, log_level="warning")
