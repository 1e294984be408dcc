"""On-disk formats shared by the rank side and the controller (the rank record)."""
