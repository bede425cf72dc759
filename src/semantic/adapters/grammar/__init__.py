"""The grammar port on llguidance (ADR 0017)."""
