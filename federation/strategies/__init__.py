"""One file per federated algorithm; each holds only its cross-round state (DESIGN.md)."""
