"""Models of the lifecycle: the reference model the stateful tests run in lockstep with
the Bridge (`reference`), and (to come) the exhaustive bounded model checker."""
