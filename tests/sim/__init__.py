"""The simulator (tritondtr.sim): replays, the twin, generators, bounds and optima, and the
DTR paper's Figure 2."""
