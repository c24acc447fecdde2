"""What runs at the server: the round loop and what it believes of the hospitals' replies.

- ``loop``: the only round loop (``Server``, FedSAF paper 001, Algorithm 1); ``roster``: who takes part (the
  Hello replies; on resume, the same hospitals and classes); ``guard`` and ``checks``: a reply
  that would break the round is named and left out, nothing is believed blindly; ``dp_watch``: the privacy figures
  the hospitals report must grow; ``audit``: the boundary log and the anchors of each hospital's outbound log.
- ``rounds``, ``resume`` and ``summary``: a round's record, continuing a run, and what the server says while it
  runs.
- ``pool``: what the loop sends through (``Pool``); the transports that carry it live outside this folder.

Nothing here imports ``federation.hospital`` (tests/test_dependencies.py holds it, through every import). The
server reaches hospitals only through a pool (``federation.engine.pools`` on one machine, ``federation.flower``
across machines) and the wire contract (``federation.wire``).
"""
