"""A native SIP endpoint: agents answer SIP trunks and PBX extensions directly (`duetaspan serve --sip`).

Built on `aiosipua` (SIP messages, transactions, dialogs, SDP offer/answer, digest math) and `aiortp` (RTP/RTCP,
jitter buffer with concealment, RFC 4733 DTMF, paced 20 ms sending), both asyncio-native, so SIP, RTP and the
agent's pipeline share the server's event loop. See docs/sip.md for the choice and the security model.
"""
