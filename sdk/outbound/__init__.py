"""`duetaspan.outbound`: calls the server places on its own. Campaigns: a contact list dialled at a pace
(`max_concurrent`, `calls_per_minute`, inbound slots reserved), in calling windows of the callee's local
time, with retries per outcome and the do-not-call list, on the durable store (`duetaspan.store`), so a
crash loses no attempt and dials no number twice. See docs/campaigns.md."""
