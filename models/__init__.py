"""Verification, not neural networks: the code that proves the bridge keeps its contract.

- `reference`: the reference model, a small, obviously right statement of the contract;
- `lockstep`: the harness that drives the real Bridge (over the fake backend) and the
  reference model side by side and compares everything observable after each step;
- `checker`: the exhaustive bounded model checker over that harness (`devbridge check`);
- `sansio`: the bounded model checker of the core and the ring with states as values (fast, wide);
- `explorer`: what both checkers' searches share (the processes a level is forked into);
- `coverage`: which spec transitions, rejections and ordering edges a run exercised.

Nothing here is needed to use the bridge; the stateful tests and the checker import it."""
