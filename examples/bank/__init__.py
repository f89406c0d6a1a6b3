"""Bank line: caller ID + DTMF PIN verification, balances, transactions, card lock (redacted), transfer to a human."""
