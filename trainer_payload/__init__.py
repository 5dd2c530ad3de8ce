"""The program that runs on the rented GPU machine.

It never imports ``desktop``; ``trainer_payload.protocol`` (stdlib only) is the one module both sides share.
"""

__version__ = "0.1.0"
