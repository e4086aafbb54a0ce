"""Run by ``test_packaging.py`` with the python of a fresh virtualenv holding only
the built wheel and its declared dependencies (no extras, no pytest): a run on the
memory store through a gate that takes a signed approval only."""

from __future__ import annotations

from pydantic import BaseModel, JsonValue

from es_agents import ApprovalPolicy, Client, KafkaSettings, Settings
from es_agents.agent import ToolAgent
from es_agents.app import build_worker
from es_agents.approvals import SigningKey, new_key
from es_agents.models import ScriptedModel, call, reply
from es_agents.tools import ToolContext, tool

SENT: list[int] = []


class Wire(BaseModel):
    amount: int


@tool(Wire, approval=ApprovalPolicy(approvers=frozenset({"alice"}), signed=True))
def wire(args: Wire, ctx: ToolContext) -> JsonValue:
    """Sends money."""
    SENT.append(args.amount)
    return {"sent": args.amount}


def main() -> None:
    agent = ToolAgent(
        name="payer",
        system_prompt="Pay.",
        model=ScriptedModel([call("wire", "c1", amount=5), reply("done")]),
        tool_list=[wire],
    )
    settings = Settings(
        kafka=KafkaSettings(topic_prefix="packaged"), store="memory", payloads="off"
    )
    client = Client(settings)
    pem, key = new_key("alice", frozenset())
    client.ports.keyring.add(key)
    run = client.start("payer", {}, wait=0)
    build_worker(settings, agent, until_idle=True, idle_seconds=0.2).run()
    assert client.status(run.run_id).status == "paused"
    unsigned = client.approve(run.run_id, by="alice", wait=0)
    signed = client.approve(run.run_id, by="alice", key=SigningKey.load(pem), wait=0)
    build_worker(settings, agent, until_idle=True, idle_seconds=0.2).run()
    view = client.status(run.run_id)
    assert view.status == "completed", view.status
    assert SENT == [5], SENT
    refused = [v for v in view.refused if v.command_id == unsigned.command.command_id]
    assert refused, "an unsigned approval of a signed gate was applied"
    import es_agents  # noqa: PLC0415

    print(f"completed; sent {SENT}; {signed.command.wire_name} signed")
    print(f"es_agents from {es_agents.__file__}")


if __name__ == "__main__":
    main()
