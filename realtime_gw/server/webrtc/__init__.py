"""WebRTC calls: ``POST /v1/realtime/calls``, the data channel and media around the realtime session."""
