"""WebRTC (`duetaspan.adapters.webrtc`): the browser page (microphone, agent voice, live transcript and span
cards), its token, and the Pipecat SmallWebRTC transport that runs an agent call per page connection."""
