"""GPU machines seen from the app: the Machine protocol, SSH, probing a host, run keys, failures."""
