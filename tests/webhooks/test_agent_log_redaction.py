"""`[privacy] redact` covers the logs of an agent used outside `serve`: `async with Agent(...)` and the testing
harness's `scripted_call` install the same log-record factory `serve` does, for as long as the agent runs. A
tool that logs the card number it was given (tools get the real values) logs `[card]`; the process's logs are
as before once the agent stops; `serve` and its agent together install one factory, not two."""

from __future__ import annotations

import logging

from duetaspan import Agent, tool
from duetaspan.config import AgentConfig
from duetaspan.testing import scripted_call, tool_call
from duetaspan.webhooks.redact import RedactingLogRecords, Redactor
from tests.support import has_card

CARD = "4111 1111 1111 1111"
shop = logging.getLogger("shop.payments")
charged: list[str] = []


@tool(side_effect=True)
def take_payment(card: str) -> str:
    """Charge the caller's card. Only when the caller asks to pay.

    Args:
        card: the card number
    """
    charged.append(card)
    shop.info("charging card %s", card)
    return "Charged."


async def test_a_scripted_call_on_an_agent_from_python_logs_redacted(
    tiny_engine, scripted_llm, scripted_asr, tmp_path, caplog
):
    scripted_llm.on("please charge", tool_call("take_payment", card=CARD))
    agent = Agent(tools=[take_payment], engine=tiny_engine, seed=0, record_dir=tmp_path,
                  config=AgentConfig(privacy={"redact": ["card"]}))  # fmt: skip
    factory = logging.getLogRecordFactory()
    caplog.set_level(logging.INFO)
    async with scripted_call(agent, llm=scripted_llm, asr=scripted_asr) as call:
        await call.say(f"Please charge my card {CARD}.")
        await call.ask()
    assert charged == [CARD]  # the tool got the real number
    lines = [r.getMessage() for r in caplog.records if r.name == "shop.payments"]
    assert lines == ["charging card [card]"]
    assert not has_card(caplog.text), caplog.text  # (a timestamp or port may hold "4111" alone)
    assert logging.getLogRecordFactory() is factory  # the agent stopped: taken out again
    shop.info("after %s", CARD)
    assert caplog.records[-1].getMessage() == f"after {CARD}"


async def test_async_with_agent_redacts_the_process_logs_while_it_runs(tiny_engine, caplog):
    caplog.set_level(logging.INFO)
    mine = logging.getLogger("myapp")
    plain = Agent(engine=tiny_engine, seed=0, record_dir=None)
    async with plain:
        mine.info("no redaction configured: %s", CARD)
    async with Agent(engine=tiny_engine, seed=0, record_dir=None,
                     config=AgentConfig(privacy={"redact": ["card", "email"]})):  # fmt: skip
        mine.info("caller %s wrote from ann@example.com", CARD)
    mine.info("stopped: %s", CARD)
    got = [r.getMessage() for r in caplog.records if r.name == "myapp"]
    assert got == [f"no redaction configured: {CARD}", "caller [card] wrote from [email]", f"stopped: {CARD}"]


def test_serve_and_its_agent_install_one_factory_and_take_it_out_in_either_order():
    before = logging.getLogRecordFactory()
    try:
        _one_factory()
    finally:
        logging.setLogRecordFactory(before)


def _one_factory() -> None:
    served, agents = RedactingLogRecords(Redactor(["card", "ssn"])), RedactingLogRecords(Redactor(["card"]))
    served.install()
    agents.install()  # covered by serve's: nothing added
    assert served.installed and not agents.installed
    wider = RedactingLogRecords(Redactor(["card", "email"]))  # redacts a kind serve's does not: added on top
    wider.install()
    assert wider.installed
    served.uninstall()  # under another factory: stays in the chain, passes records through
    record = logging.getLogRecordFactory()("x", logging.INFO, __file__, 1, "ssn 123-45-6789, card %s", (CARD,), None)
    assert record.getMessage() == "ssn 123-45-6789, card [card]"  # serve's (ssn) is out
    wider.uninstall()
    agents.uninstall()
    record = logging.getLogRecordFactory()("x", logging.INFO, __file__, 1, "%s", (CARD,), None)
    assert record.getMessage() == CARD
