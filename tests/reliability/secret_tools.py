"""A tool with a secret argument, loaded by the served agent of the secrets test (`[tools] modules`)."""

from __future__ import annotations

from duetaspan import tool

PIN = "7294-0613-PIN"  # what the LLM passes as the caller's PIN: must never reach a log or an artifact


@tool(redact=["pin"])
def account_balance(account: str, pin: str) -> str:
    """The balance of the caller's account.

    Args:
        account: account number
        pin: the caller's PIN (kept out of logs and transcripts)
    """
    ok = pin == PIN
    return f"Account {account} has a balance of 42 dollars and 10 cents." if ok else "The PIN is wrong."
