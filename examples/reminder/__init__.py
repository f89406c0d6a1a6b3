"""Outbound appointment reminder: `duetaspan call` dials, the agent confirms or reschedules the appointment."""
