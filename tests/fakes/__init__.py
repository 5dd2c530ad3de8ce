"""Fake GPU clouds: HTTP servers that follow the documented RunPod, Vast.ai and Lambda APIs, renting out real sshd
machines on loopback (``../shared/reference/providers.md`` lists the shapes and their sources)."""
