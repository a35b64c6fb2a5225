"""The engine (tritondtr.engine): the metadata table, neighbourhoods and the victim choice."""
