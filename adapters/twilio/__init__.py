"""Twilio (`duetaspan.adapters.twilio`): signed voice webhook and TwiML, the signed single-use-token Media
Stream socket (mu-law 8 kHz, marks, clear, DTMF), REST call control (hang up, transfer, outbound calls), the
Pipecat transport over a call, and the `duetaspan call` command."""
